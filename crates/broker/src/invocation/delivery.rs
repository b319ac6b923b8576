//! Delivering a stored result in pieces a caller can resume.
//!
//! A result larger than [`PIECE_CAP`] bytes (over all its streams) is never sent as one
//! message: the caller gets the first piece and a cursor, and reads the rest with
//! `fetch_result {invocation_id, cursor}`. A piece never crosses a stream boundary. Each
//! piece carries its offset in its stream, the stream's length, its own digest
//! (`blake3:` + hex of the piece's bytes) and the result's digest as RESULT_COMMITTED
//! recorded it; the last piece alone says `complete: true`, and only after the broker
//! has checked the whole stored result against that digest.
//!
//! A cursor is an opaque token naming a position (stream index, offset) and
//! authenticated with a key derived from the journal's signing key over the invocation,
//! the result id and the result's digest: it cannot be moved to another invocation or
//! edited, and it stays valid across broker restarts, so a caller whose connection
//! dropped resumes from the cursor of the last piece it verified.

use base64::Engine as _;
use serde::Serialize;

use crate::contract::{Code, Envelope, ErrorBody, Phase, Retry};
use crate::invocation::Recorder;
use crate::journal::projection::Projection;
use crate::journal::{Journal, JournalError, ResultLayout};

/// The most result bytes one answer carries (1 MiB; base64 makes the message about a
/// third larger). Results up to this size are returned whole.
pub const PIECE_CAP: u64 = 1024 * 1024;

const CURSOR_VERSION: u8 = 1;
const CURSOR_MAC_BYTES: usize = 16;
const CURSOR_BYTES: usize = 1 + 4 + 8 + CURSOR_MAC_BYTES;

/// Why a piece could not be handed out. Cursor and size problems are the caller's to
/// correct (INVALID_REQUEST); the others say what the record holds.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error(
        "`cursor` is not a fetch_result cursor: pass the `cursor` string of an earlier answer unchanged"
    )]
    MalformedCursor,
    #[error("`cursor` was not issued for this invocation's stored result, or it was altered")]
    ForeignCursor,
    #[error("`cursor` points outside the stored result: {detail}")]
    OutOfRange { detail: String },
    #[error("`max_bytes` must be between 1 and {PIECE_CAP}")]
    BadMaxBytes,
    #[error("the invocation has no stored result to read")]
    NoResult,
    #[error("the stored result was removed by the retention policy")]
    Expired,
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl DeliveryError {
    /// The field a correctable error is about, for the envelope's evidence.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            DeliveryError::MalformedCursor
            | DeliveryError::ForeignCursor
            | DeliveryError::OutOfRange { .. } => Some("cursor"),
            DeliveryError::BadMaxBytes => Some("max_bytes"),
            _ => None,
        }
    }
}

/// One stream of a result, as a piece lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamLength {
    pub name: String,
    pub length: u64,
}

/// One piece of a stored result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Piece {
    pub result_id: String,
    /// The digest of the whole result, as RESULT_COMMITTED recorded it.
    pub digest: String,
    /// Every stream of the result with its length, in order.
    pub streams: Vec<StreamLength>,
    pub total_bytes: u64,
    /// The stream this piece is from, its offset there and its length.
    pub stream: String,
    pub offset: u64,
    pub length: u64,
    pub stream_length: u64,
    /// `blake3:` + hex of this piece's bytes.
    pub piece_digest: String,
    /// The piece's bytes, base64 (standard alphabet, padded).
    pub data_base64: String,
    /// Pass this to fetch_result for the next piece; absent on the last one.
    pub cursor: Option<String>,
    /// True only on the last piece, after the whole stored result matched `digest`.
    pub complete: bool,
}

/// A position in a stored result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    stream: u32,
    offset: u64,
}

fn cursor_mac(
    key: &[u8; 32],
    invocation_id: &str,
    layout: &ResultLayout,
    at: Position,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    for part in [
        invocation_id.as_bytes(),
        layout.result_id.as_bytes(),
        layout.digest.as_bytes(),
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(&at.stream.to_le_bytes());
    h.update(&at.offset.to_le_bytes());
    *h.finalize().as_bytes()
}

fn encode_cursor(
    key: &[u8; 32],
    invocation_id: &str,
    layout: &ResultLayout,
    at: Position,
) -> String {
    let mut bytes = Vec::with_capacity(CURSOR_BYTES);
    bytes.push(CURSOR_VERSION);
    bytes.extend_from_slice(&at.stream.to_le_bytes());
    bytes.extend_from_slice(&at.offset.to_le_bytes());
    bytes.extend_from_slice(&cursor_mac(key, invocation_id, layout, at)[..CURSOR_MAC_BYTES]);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn decode_cursor(
    key: &[u8; 32],
    invocation_id: &str,
    layout: &ResultLayout,
    cursor: &str,
) -> Result<Position, DeliveryError> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor.trim().as_bytes())
        .map_err(|_| DeliveryError::MalformedCursor)?;
    if bytes.len() != CURSOR_BYTES || bytes[0] != CURSOR_VERSION {
        return Err(DeliveryError::MalformedCursor);
    }
    let stream = u32::from_le_bytes(
        bytes[1..5]
            .try_into()
            .map_err(|_| DeliveryError::MalformedCursor)?,
    );
    let offset = u64::from_le_bytes(
        bytes[5..13]
            .try_into()
            .map_err(|_| DeliveryError::MalformedCursor)?,
    );
    let at = Position { stream, offset };
    let expected = cursor_mac(key, invocation_id, layout, at);
    // Not secret-dependent timing worth guarding: the MAC only authenticates a position.
    if bytes[13..] != expected[..CURSOR_MAC_BYTES] {
        return Err(DeliveryError::ForeignCursor);
    }
    Ok(at)
}

/// Whether a result of `bytes` bytes (over all streams) is delivered in pieces.
pub fn needs_pieces(bytes: u64) -> bool {
    bytes > PIECE_CAP
}

/// The piece of `p`'s stored result at `cursor` (the first piece without one), at most
/// `max_bytes` long ([`PIECE_CAP`] without it).
pub fn piece(
    journal: &Journal,
    p: &Projection,
    cursor: Option<&str>,
    max_bytes: Option<u64>,
) -> Result<Piece, DeliveryError> {
    if p.result_expired.is_some() {
        return Err(DeliveryError::Expired);
    }
    let max = match max_bytes {
        None => PIECE_CAP,
        Some(n) if (1..=PIECE_CAP).contains(&n) => n,
        Some(_) => return Err(DeliveryError::BadMaxBytes),
    };
    let result_id = p.result_id.as_deref().ok_or(DeliveryError::NoResult)?;
    let layout = journal.result_layout(result_id)?;
    let key = journal.cursor_key();
    let at = match cursor {
        None => Position {
            stream: 0,
            offset: 0,
        },
        Some(c) => decode_cursor(key, &p.invocation_id, &layout, c)?,
    };
    let streams: Vec<StreamLength> = layout
        .streams
        .iter()
        .map(|(name, length)| StreamLength {
            name: name.clone(),
            length: *length,
        })
        .collect();
    let index = usize::try_from(at.stream).unwrap_or(usize::MAX);
    let Some((name, stream_length)) = layout.streams.get(index).cloned() else {
        if layout.streams.is_empty() && at.offset == 0 {
            // A result without streams: one empty, final piece.
            journal.read_result(result_id)?;
            return Ok(Piece {
                result_id: result_id.to_string(),
                digest: layout.digest.clone(),
                streams,
                total_bytes: 0,
                stream: String::new(),
                offset: 0,
                length: 0,
                stream_length: 0,
                piece_digest: format!("blake3:{}", blake3::hash(&[]).to_hex()),
                data_base64: String::new(),
                cursor: None,
                complete: true,
            });
        }
        return Err(DeliveryError::OutOfRange {
            detail: format!(
                "stream {} does not exist (the result has {})",
                at.stream,
                layout.streams.len()
            ),
        });
    };
    if at.offset > stream_length || (at.offset == stream_length && stream_length > 0) {
        return Err(DeliveryError::OutOfRange {
            detail: format!(
                "offset {} is past the end of stream `{name}` ({stream_length} bytes)",
                at.offset
            ),
        });
    }
    let length = max.min(stream_length - at.offset);
    let data = journal.read_result_range(result_id, &name, at.offset, length)?;
    let next = if at.offset + length < stream_length {
        Some(Position {
            stream: at.stream,
            offset: at.offset + length,
        })
    } else if index + 1 < layout.streams.len() {
        Some(Position {
            stream: at.stream + 1,
            offset: 0,
        })
    } else {
        None
    };
    if next.is_none() {
        // Complete only if the whole stored result still matches its digest.
        journal.read_result(result_id)?;
    }
    Ok(Piece {
        result_id: result_id.to_string(),
        digest: layout.digest.clone(),
        total_bytes: layout.total_bytes(),
        streams,
        stream: name,
        offset: at.offset,
        length,
        stream_length,
        piece_digest: format!("blake3:{}", blake3::hash(&data).to_hex()),
        data_base64: base64::engine::general_purpose::STANDARD.encode(&data),
        cursor: next.map(|n| encode_cursor(key, &p.invocation_id, &layout, n)),
        complete: next.is_none(),
    })
}

/// The envelope for a fetch that cannot be served: a bad cursor or size
/// (INVALID_REQUEST, after correction) or an expired result (RESULT_EXPIRED, never).
/// The outcome is always the invocation's, as recorded: a read changes nothing.
pub fn refusal(journal: &Journal, p: &Projection, error: &DeliveryError) -> Envelope {
    let mut evidence = p.evidence();
    let (code, phase, retry, message) = match error {
        DeliveryError::Expired => {
            let (seq, reason, bytes) =
                p.result_expired
                    .unwrap_or((0, crate::journal::events::ExpiryReason::Age, 0));
            let at_ms = journal
                .events(&p.invocation_id)
                .ok()
                .and_then(|events| events.into_iter().find(|e| e.seq == seq))
                .map(|e| e.recorded_at_ms);
            let when = at_ms.map_or_else(String::new, |ms| format!(" at {ms} (unix ms)"));
            let why = match reason {
                crate::journal::events::ExpiryReason::Age => {
                    "it was older than `[results] max_age`"
                }
                crate::journal::events::ExpiryReason::Size => {
                    "stored results exceeded `[results] max_bytes` and it was among the oldest"
                }
            };
            (
                Code::ResultExpired,
                Phase::ResultDelivery,
                Retry::Never,
                format!(
                    "The stored result ({bytes} bytes) was removed by the retention policy{when}: {why} (event {seq}). The outcome stays {} as recorded; the action is never re-run to rebuild it.",
                    p.outcome
                ),
            )
        }
        other => {
            evidence.field = other.field().map(str::to_string);
            (
                Code::InvalidRequest,
                Phase::Validation,
                Retry::AfterCorrection,
                format!(
                    "fetch_result: {other}. Nothing changed; the invocation's outcome stays as recorded."
                ),
            )
        }
    };
    Envelope {
        invocation_id: p.invocation_id.clone(),
        error: ErrorBody {
            code,
            phase,
            outcome: p.outcome,
            retry,
            message,
        },
        evidence,
    }
}

/// RESULT_DELIVERED: the caller-facing protocol confirmed that `invocation_id`'s answer
/// reached the caller. Recorded once, and only for an invocation that has ended.
pub fn confirm_delivery(journal: &Journal, invocation_id: &str) -> Result<(), JournalError> {
    journal.delivered(invocation_id)
}

/// [`confirm_delivery`] without waiting for the commit: for the caller-facing protocol's
/// acknowledgement handler, which has nothing to wait for (the handoff it records has
/// already happened).
pub fn confirm_delivery_queued(journal: &Journal, invocation_id: &str) -> Result<(), JournalError> {
    journal.delivered_pipelined(invocation_id)
}

/// The handoff of a stored result failed (the caller's connection closed first):
/// DELIVERY_FAILED. The remote outcome stands, and the result stays retrievable with
/// `fetch_result`.
pub fn delivery_failed(
    journal: &Journal,
    invocation_id: &str,
    message: &str,
) -> Result<(), JournalError> {
    let rec = Recorder::resume(journal, invocation_id)?;
    let p = rec.projection()?;
    if p.result_id.is_some() && !p.delivered {
        rec.delivery_failed(message)?;
    }
    Ok(())
}

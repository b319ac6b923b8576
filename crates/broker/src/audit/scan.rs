//! The verifier's two passes over the events after a verified prefix, run at once:
//! [`scan`] reads the rows in order and checks sequence numbers, the heads checkpoints
//! sign and the signing policy, handing each row through a [`RowFeed`] to
//! [`check_links`], which on a second thread checks every chain link against the stored
//! value before it and builds the Merkle tree over the same values. Both only read.

use rusqlite::Connection;
use serde::Deserialize;

use super::merkle::{self, Frontier};
use super::{
    AuditError, ChainHasher, ChainedRow, Checkpoint, GENESIS, SIGN_INTERVAL_MS, SIGN_SLACK_MS,
    SIGNING_RESUMED, SignedLate, Tamper, TreeHead, broken,
};

/// The events since the last checkpoint that the signing policy holds to its interval.
#[derive(Clone, Copy)]
struct Segment {
    first_seq: u64,
    earliest_ms: i64,
}

/// Rows handed to the link thread per message.
const ROW_BATCH: usize = 4096;

/// Rows as the chain hashes them, packed into one buffer.
#[derive(Default)]
pub(super) struct RowBatch {
    bytes: Vec<u8>,
    /// seq, invocation_id end, kind end, body end (offsets into `bytes`), recorded_at,
    /// stored hash.
    rows: Vec<(u64, usize, usize, usize, i64, [u8; 32])>,
}

/// Rows on their way to the link thread.
pub(super) struct RowFeed {
    pub(super) tx: std::sync::mpsc::SyncSender<RowBatch>,
    pub(super) batch: RowBatch,
}

impl RowFeed {
    fn push(&mut self, row: &ChainedRow<'_>, stored: [u8; 32]) {
        let b = &mut self.batch;
        b.bytes.extend_from_slice(row.invocation_id.as_bytes());
        let id_end = b.bytes.len();
        b.bytes.extend_from_slice(row.kind.as_bytes());
        let kind_end = b.bytes.len();
        b.bytes.extend_from_slice(row.body.as_bytes());
        let body_end = b.bytes.len();
        b.rows.push((
            row.seq,
            id_end,
            kind_end,
            body_end,
            row.recorded_at_ms,
            stored,
        ));
        if b.rows.len() == ROW_BATCH {
            self.flush();
        }
    }

    pub(super) fn flush(&mut self) {
        if !self.batch.rows.is_empty() {
            // A closed channel means the link thread is gone; its join reports that.
            let _ = self.tx.send(std::mem::take(&mut self.batch));
        }
    }
}

/// What the link thread established.
pub(super) struct Linked {
    pub(super) frontier: Frontier,
    /// The root at each wanted size reached.
    pub(super) roots: Vec<(u64, [u8; 32])>,
    /// The first row whose stored hash is not the link from the one before.
    pub(super) first_bad_link: Option<u64>,
}

/// Checks each row's stored hash against the link from the previous stored hash
/// (starting from `head`), extends `frontier` with the leaves, and records the root at
/// each size in `wanted` (sorted). Stops hashing at the first bad link.
pub(super) fn check_links(
    rx: std::sync::mpsc::Receiver<RowBatch>,
    mut head: [u8; 32],
    mut frontier: Frontier,
    wanted: &[u64],
) -> Linked {
    let mut hasher = ChainHasher::new();
    let mut roots = Vec::new();
    let mut next = wanted.iter().peekable();
    let mut first_bad_link = None;
    for batch in rx {
        if first_bad_link.is_some() {
            continue;
        }
        let mut start = 0;
        for &(seq, id_end, kind_end, body_end, recorded_at_ms, stored) in &batch.rows {
            let text = |from: usize, to: usize| std::str::from_utf8(&batch.bytes[from..to]);
            let (Ok(invocation_id), Ok(kind), Ok(body)) = (
                text(start, id_end),
                text(id_end, kind_end),
                text(kind_end, body_end),
            ) else {
                first_bad_link = Some(seq);
                break;
            };
            start = body_end;
            let computed = hasher.link(
                &head,
                &ChainedRow {
                    seq,
                    invocation_id,
                    kind,
                    body,
                    recorded_at_ms,
                },
            );
            if computed != stored {
                first_bad_link = Some(seq);
                break;
            }
            head = stored;
            frontier.push_leaf(merkle::leaf_hash(seq, &stored));
            while next.next_if(|&&s| s == frontier.size()).is_some() {
                roots.push((frontier.size(), frontier.root()));
            }
        }
    }
    Linked {
        frontier,
        roots,
        first_bad_link,
    }
}

/// What the pass over the rows established.
pub(super) struct Scanned {
    pub(super) last: u64,
    pub(super) head: [u8; 32],
    /// The first checkpoint past the end (the tail was cut).
    pub(super) next_checkpoint: Option<u64>,
    /// The index (in the sorted heads) of the first outside head past the end.
    pub(super) next_head: Option<usize>,
    pub(super) last_checkpoint_seq: Option<u64>,
    pub(super) checkpoint_count: u64,
    pub(super) signed_late: Vec<SignedLate>,
}

/// One pass over the events after the verified prefix: sequence numbers, the heads
/// checkpoints sign (against the stored hashes, which the link thread checks), and the
/// signing policy. Each row goes to `links`.
pub(super) fn scan(
    conn: &Connection,
    checkpoints: &[Checkpoint],
    heads: &[&TreeHead],
    from: Option<&VerifiedPrefix>,
    policy_from: u64,
    links: &mut RowFeed,
) -> Result<Scanned, VerifyFailure> {
    let start = from.map_or(0, |p| p.seq);
    let mut head = from.map_or(GENESIS, |p| p.head);
    let mut pending = checkpoints.iter().filter(|c| c.seq > start).peekable();
    let mut pending_heads = heads
        .iter()
        .enumerate()
        .filter(|(_, h)| h.size > start)
        .peekable();
    let mut expected_seq = start + 1;
    let mut segment: Option<Segment> = None;
    let mut signed_late = Vec::new();
    let mut last_checkpoint_seq = from.and_then(|p| p.last_checkpoint_seq);
    let mut checkpoint_count = from.map_or(0, |p| p.checkpoints);
    let mut stmt = conn.prepare(
        "SELECT seq, invocation_id, kind, body, recorded_at_ms, hash FROM events
         WHERE seq > ?1 ORDER BY seq",
    )?;
    let mut rows = stmt.query([start as i64])?;
    while let Some(row) = rows.next()? {
        let seq = u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0);
        if seq != expected_seq {
            return Err(broken(
                expected_seq,
                Tamper::SequenceGap,
                format!("expected sequence {expected_seq}, found {seq}"),
            )
            .into());
        }
        let invocation_id = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
        let kind = row.get_ref(2)?.as_str().map_err(rusqlite::Error::from)?;
        let body = row.get_ref(3)?.as_str().map_err(rusqlite::Error::from)?;
        let recorded_at_ms = row.get::<_, i64>(4)?;
        let Ok(stored) =
            <[u8; 32]>::try_from(row.get_ref(5)?.as_blob().map_err(rusqlite::Error::from)?)
        else {
            return Err(
                broken(seq, Tamper::HashMismatch, "the stored hash is not 32 bytes").into(),
            );
        };
        links.push(
            &ChainedRow {
                seq,
                invocation_id,
                kind,
                body,
                recorded_at_ms,
            },
            stored,
        );
        head = stored;
        if kind == SIGNING_RESUMED
            && let Some(late) = signed_late_range(body, seq)
        {
            // The chain itself says these were signed only at this start.
            if segment.is_some_and(|s| s.first_seq >= late.first) {
                segment = None;
            }
            signed_late.push(late);
        }
        if seq > policy_from {
            segment = Some(match segment {
                None => Segment {
                    first_seq: seq,
                    earliest_ms: recorded_at_ms,
                },
                Some(s) => Segment {
                    earliest_ms: s.earliest_ms.min(recorded_at_ms),
                    ..s
                },
            });
        }
        while let Some(c) = pending.next_if(|c| c.seq == seq) {
            if c.head != head {
                return Err(broken(
                    seq,
                    Tamper::CheckpointMismatch,
                    "signed checkpoint head differs from the chain",
                )
                .into());
            }
            if c.root.is_some()
                && let Some(s) = segment
                && c.made_at_ms > s.earliest_ms + SIGN_INTERVAL_MS + SIGN_SLACK_MS
            {
                return Err(broken(
                    s.first_seq,
                    Tamper::LateSignature,
                    format!(
                        "events {}..={seq} were first signed {} ms after they were recorded \
                         (the policy keeps a checkpoint within {SIGN_INTERVAL_MS} ms): the \
                         checkpoints between them were removed",
                        s.first_seq,
                        c.made_at_ms - s.earliest_ms
                    ),
                )
                .into());
            }
            segment = None;
            last_checkpoint_seq = Some(seq);
            checkpoint_count += 1;
        }
        while pending_heads.next_if(|(_, h)| h.size == seq).is_some() {}
        expected_seq += 1;
    }
    Ok(Scanned {
        last: expected_seq - 1,
        head,
        next_checkpoint: pending.next().map(|c| c.seq),
        next_head: pending_heads.next().map(|(i, _)| i),
        last_checkpoint_seq,
        checkpoint_count,
        signed_late,
    })
}

/// The range a `SIGNING_RESUMED` event at `seq` names, if it is well formed and lies
/// before it.
fn signed_late_range(body: &str, seq: u64) -> Option<SignedLate> {
    #[derive(Deserialize)]
    struct Body {
        first_unsigned: u64,
        last_unsigned: u64,
    }
    let b: Body = serde_json::from_str(body).ok()?;
    (b.first_unsigned <= b.last_unsigned && b.last_unsigned < seq).then_some(SignedLate {
        first: b.first_unsigned,
        last: b.last_unsigned,
        at: seq,
    })
}

/// Where an incremental verification stopped: enough to go on from there without
/// reading the events before it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPrefix {
    pub(super) seq: u64,
    pub(super) head: [u8; 32],
    pub(super) frontier: Frontier,
    pub(super) checkpoints: u64,
    pub(super) last_checkpoint_seq: Option<u64>,
}

impl VerifiedPrefix {
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

#[derive(Debug)]
pub(super) enum VerifyFailure {
    Audit(AuditError),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for VerifyFailure {
    fn from(e: rusqlite::Error) -> Self {
        VerifyFailure::Sql(e)
    }
}

impl From<AuditError> for VerifyFailure {
    fn from(e: AuditError) -> Self {
        VerifyFailure::Audit(e)
    }
}

//! What a log calls to get its checkpoints cosigned (c2sp.org/tlog-witness), and what an
//! auditor calls to read what a witness last cosigned.
//!
//! The returned cosignature lines are parsed but not verified: the caller holds the
//! witness keys it trusts and checks each line with [`super::note::verify_cosignature`]
//! (lines by unknown keys are to be ignored, per the specification).

use signed_note::Signature;

use super::note::parse_signature_line;
use super::server::{ADD_CHECKPOINT_PATH, LATEST_PATH, TLOG_SIZE_CONTENT_TYPE};
use super::witness::encode_add_checkpoint;

/// Largest response read from a witness: cosignature lines and one note are small.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// How much of a refusal's body is kept for the error message.
const REFUSAL_BODY_CHARS: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    /// 409 `text/x.tlog.size`: the witness's latest size for this log is not the `old`
    /// that was sent. Resubmit with a proof from `witness_size`.
    #[error("the witness holds size {witness_size} for this log; resubmit from that size")]
    Conflict { witness_size: u64 },
    /// Any other non-200 answer (403 bad signature, 404 unknown log, 409 equivocation,
    /// 422 inconsistent, 400 malformed, 5xx), with the start of its body.
    #[error("the witness refused: HTTP {status}: {body}")]
    Refused { status: u16, body: String },
    /// The witness could not be reached or the exchange broke off.
    #[error("cannot reach the witness: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("invalid witness URL `{url}`: {detail}")]
    InvalidUrl { url: String, detail: String },
    /// A 200 whose body is not what the specification says it is.
    #[error("the witness sent a malformed response: {0}")]
    MalformedResponse(&'static str),
}

fn endpoint(witness_url: &str, path: &str) -> Result<url::Url, WitnessError> {
    let joined = format!("{}{path}", witness_url.trim_end_matches('/'));
    let url = url::Url::parse(&joined).map_err(|e| WitnessError::InvalidUrl {
        url: witness_url.to_string(),
        detail: e.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(WitnessError::InvalidUrl {
            url: witness_url.to_string(),
            detail: "the scheme must be http or https".into(),
        });
    }
    Ok(url)
}

async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, WitnessError> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if out.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(WitnessError::MalformedResponse(
                "the response is larger than 64 KiB",
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn refused(status: u16, body: &[u8]) -> WitnessError {
    let body: String = String::from_utf8_lossy(body)
        .trim()
        .chars()
        .take(REFUSAL_BODY_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    WitnessError::Refused { status, body }
}

/// Submits a signed checkpoint `note` to the witness whose submission prefix is
/// `witness_url`, with the consistency proof from `old_size` (empty when `old_size` is
/// 0). Returns the cosignature lines of a 200, unverified.
pub async fn submit(
    client: &reqwest::Client,
    witness_url: &str,
    old_size: u64,
    proof: &[[u8; 32]],
    note: &[u8],
) -> Result<Vec<Signature>, WitnessError> {
    let url = endpoint(witness_url, ADD_CHECKPOINT_PATH)?;
    let response = client
        .post(url)
        .body(encode_add_checkpoint(old_size, proof, note))
        .send()
        .await?;
    let status = response.status().as_u16();
    let is_size = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().starts_with(TLOG_SIZE_CONTENT_TYPE));
    let body = read_capped(response).await?;
    match status {
        200 => parse_cosignature_lines(&body),
        409 if is_size => Err(WitnessError::Conflict {
            witness_size: parse_size_body(&body)?,
        }),
        _ => Err(refused(status, &body)),
    }
}

/// The body of a 409 `text/x.tlog.size`: a decimal size and a newline.
fn parse_size_body(body: &[u8]) -> Result<u64, WitnessError> {
    let bad = || WitnessError::MalformedResponse("a 409 size body is not `<decimal>\\n`");
    let digits = body.strip_suffix(b"\n").ok_or_else(bad)?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)
}

/// The body of a 200: one or more note signature lines, each newline-terminated.
pub fn parse_cosignature_lines(body: &[u8]) -> Result<Vec<Signature>, WitnessError> {
    let Some(body) = body.strip_suffix(b"\n") else {
        return Err(WitnessError::MalformedResponse(
            "the cosignature lines do not end with a newline",
        ));
    };
    let lines = body
        .split(|&b| b == b'\n')
        .map(|line| {
            parse_signature_line(line)
                .map_err(|_| WitnessError::MalformedResponse("a line is not a note signature"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if lines.is_empty() {
        return Err(WitnessError::MalformedResponse("no cosignature line"));
    }
    Ok(lines)
}

/// Reads `GET /postern/latest?origin=…`: the latest checkpoint the witness cosigned for
/// `origin`, as a signed note carrying the log's signature and the witness's
/// cosignature (check it with [`super::note::open_cosigned`]). `None` when the witness
/// has cosigned nothing for that origin (or does not know it).
pub async fn fetch_latest(
    client: &reqwest::Client,
    witness_url: &str,
    origin: &str,
) -> Result<Option<Vec<u8>>, WitnessError> {
    let mut url = endpoint(witness_url, LATEST_PATH)?;
    url.query_pairs_mut().append_pair("origin", origin);
    let response = client.get(url).send().await?;
    let status = response.status().as_u16();
    let body = read_capped(response).await?;
    match status {
        200 => Ok(Some(body)),
        404 => Ok(None),
        _ => Err(refused(status, &body)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosignature_bodies_parse_or_are_refused() {
        let line = "\u{2014} witness.test/w1 rRlZ8gAAAABlU/EATm455KYOSbik4tdB2PT0v4wyLtZM2uFZCl6enT28/a6NkOlbFhQObAqpwV1nOSY+B4IaL2aYHQ63jB4Y8EOWAQ==\n";
        assert_eq!(parse_cosignature_lines(line.as_bytes()).unwrap().len(), 1);
        let two = format!("{line}{line}");
        assert_eq!(parse_cosignature_lines(two.as_bytes()).unwrap().len(), 2);
        for bad in [
            "",
            "\n",
            line.trim_end(),
            "— witness.test/w1 !!!\n",
            "hello\n",
            &format!("{line}\n"),
        ] {
            assert!(parse_cosignature_lines(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn size_bodies_parse_or_are_refused() {
        assert_eq!(parse_size_body(b"9\n").unwrap(), 9);
        for bad in [
            &b""[..],
            b"9",
            b"\n",
            b"-1\n",
            b"x\n",
            b"99999999999999999999999\n",
        ] {
            assert!(parse_size_body(bad).is_err());
        }
    }

    #[test]
    fn endpoints_join_and_refuse_non_http() {
        assert_eq!(
            endpoint("http://127.0.0.1:1/w/", ADD_CHECKPOINT_PATH)
                .unwrap()
                .as_str(),
            "http://127.0.0.1:1/w/add-checkpoint"
        );
        assert!(endpoint("ftp://x", ADD_CHECKPOINT_PATH).is_err());
        assert!(endpoint("not a url", ADD_CHECKPOINT_PATH).is_err());
    }
}

//! `[results]`: how long, and how many bytes of, stored results are kept
//! ([`RetentionPolicy`]), with defaults for what the file leaves out.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::field::parse_duration;
use super::{ConfigError, Ctx, Problem, Section, TargetRef};

/// `[results] max_age = "7d", max_bytes = "1GiB"`; both optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResults {
    max_age: Option<String>,
    max_bytes: Option<String>,
}

/// Stored results older than this are removed (`[results] max_age`).
pub const DEFAULT_RESULT_MAX_AGE: Duration = Duration::from_secs(7 * 86_400);
/// Stored result bytes above this are removed, oldest first (`[results] max_bytes`).
pub const DEFAULT_RESULT_MAX_BYTES: u64 = 1024 * 1024 * 1024;

/// The retention policy of stored results (`[results]` in the targets file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Results stored longer ago than this are removed.
    pub max_age_ms: i64,
    /// When stored result bytes exceed this, the oldest results are removed until they
    /// fit.
    pub max_bytes: u64,
}

/// The retention policy of `[results]`, with defaults for what is left out.
pub(super) fn validate_results(
    path: &Path,
    raw: Option<RawResults>,
) -> Result<RetentionPolicy, ConfigError> {
    let ctx = Ctx {
        file: path,
        target: TargetRef {
            section: Section::Results,
            index: 0,
            name: None,
        },
    };
    let raw = raw.unwrap_or(RawResults {
        max_age: None,
        max_bytes: None,
    });
    let max_age = match raw.max_age {
        None => DEFAULT_RESULT_MAX_AGE,
        Some(value) => parse_duration(&value)
            .ok_or_else(|| ctx.err("max_age", Problem::InvalidDuration { value }))?,
    };
    let max_bytes = match raw.max_bytes {
        None => DEFAULT_RESULT_MAX_BYTES,
        Some(value) => parse_size(&value)
            .ok_or_else(|| ctx.err("max_bytes", Problem::InvalidSize { value }))?,
    };
    Ok(RetentionPolicy {
        max_age_ms: i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX),
        max_bytes,
    })
}

/// `<digits>[unit]` with unit B, KiB, MiB or GiB (also KB/MB/GB, taken as powers of
/// 1024); zero is rejected: it would delete every result as soon as it is stored.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let unit: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "KB" | "K" => 1024,
        "MiB" | "MB" | "M" => 1024 * 1024,
        "GiB" | "GB" | "G" => 1024 * 1024 * 1024,
        _ => return None,
    };
    let n: u64 = digits.parse().ok()?;
    n.checked_mul(unit).filter(|&b| b > 0)
}

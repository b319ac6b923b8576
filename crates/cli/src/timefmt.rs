//! Times as operators type and read them: RFC 3339 in UTC, or a span back from now.
//!
//! Hand-rolled (proleptic Gregorian, days-from-civil) to keep the binary's dependency
//! set small; the journal stores unix milliseconds and this is display and filtering only.

const MS_PER_DAY: i64 = 86_400_000;

/// Days since 1970-01-01 of a civil date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// `2026-11-29T10:00:00Z` (seconds precision, UTC).
pub fn format_secs(ms: i64) -> String {
    let (date, rest) = (ms.div_euclid(MS_PER_DAY), ms.rem_euclid(MS_PER_DAY));
    let (y, m, d) = civil_from_days(date);
    let secs = rest / 1000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// `2026-11-29T10:00:00.123Z` (milliseconds precision, UTC).
pub fn format_ms(ms: i64) -> String {
    let base = format_secs(ms);
    let trimmed = base.trim_end_matches('Z');
    format!("{trimmed}.{:03}Z", ms.rem_euclid(1000))
}

fn digits(s: &str, n: usize) -> Option<i64> {
    (s.len() == n && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// Parses an RFC 3339 timestamp (`2026-11-29T10:00:00Z`, `…T10:00:00.5+01:00`) or a
/// plain date (`2026-11-29`, midnight UTC) into unix milliseconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let text = text.trim();
    if text.len() == 10 {
        return date_ms(text);
    }
    if text.len() < 20 {
        return None;
    }
    let (date, rest) = text.split_at(10);
    let day_ms = date_ms(date)?;
    let rest = rest.strip_prefix(['T', 't', ' '])?;
    let hh = digits(rest.get(0..2)?, 2)?;
    let mm = digits(rest.get(3..5)?, 2)?;
    let ss = digits(rest.get(6..8)?, 2)?;
    if rest.get(2..3)? != ":" || rest.get(5..6)? != ":" || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let mut rest = rest.get(8..)?;
    let mut frac_ms = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        let mut padded: String = frac[..n].chars().take(3).collect();
        while padded.len() < 3 {
            padded.push('0');
        }
        frac_ms = padded.parse::<i64>().ok()?;
        rest = &frac[n..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.get(0..1)? {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let oh = digits(rest.get(1..3)?, 2)?;
            let om = digits(rest.get(4..6)?, 2)?;
            if rest.len() != 6 || rest.get(3..4)? != ":" || oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 60 + om)
        }
    };
    // A leap second is read as the last second of its minute.
    let secs = hh * 3600 + mm * 60 + ss.min(59);
    Some(day_ms + secs * 1000 + frac_ms - offset_min * 60_000)
}

fn date_ms(date: &str) -> Option<i64> {
    let y = digits(date.get(0..4)?, 4)?;
    let m = digits(date.get(5..7)?, 2)?;
    let d = digits(date.get(8..10)?, 2)?;
    if date.len() != 10 || date.get(4..5)? != "-" || date.get(7..8)? != "-" {
        return None;
    }
    if !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
        return None;
    }
    Some(days_from_civil(y, m, d) * MS_PER_DAY)
}

/// Parses a span like `90s`, `15m`, `2h`, `3d` or `1w` into milliseconds.
pub fn parse_span(text: &str) -> Option<i64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = text.split_at(split);
    let n: i64 = n.parse().ok()?;
    let unit_ms: i64 = match unit {
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => MS_PER_DAY,
        "w" => 7 * MS_PER_DAY,
        _ => return None,
    };
    n.checked_mul(unit_ms)
}

/// `--since`: an absolute RFC 3339 time, or a span back from `now_ms`.
pub fn parse_since(text: &str, now_ms: i64) -> Result<i64, String> {
    if let Some(span) = parse_span(text) {
        return Ok(now_ms.saturating_sub(span));
    }
    parse_rfc3339(text).ok_or_else(|| {
        format!(
            "`{text}` is neither an RFC 3339 time (like 2026-11-29T10:00:00Z) \
             nor a span back from now (like 15m, 2h, 3d)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_known_values() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(format_secs(0), "1970-01-01T00:00:00Z");
        let t = parse_rfc3339("2026-11-29T10:00:00Z").unwrap();
        assert_eq!(t, 1_795_946_400_000);
        assert_eq!(format_secs(t), "2026-11-29T10:00:00Z");
        assert_eq!(format_ms(t + 5), "2026-11-29T10:00:00.005Z");
        assert_eq!(parse_rfc3339("2026-11-29T11:00:00+01:00"), Some(t));
        assert_eq!(parse_rfc3339("2026-11-29t10:00:00.5z"), Some(t + 500));
        assert_eq!(parse_rfc3339("2026-11-29"), Some(t - 10 * 3_600_000));
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z")
                .map(format_secs)
                .unwrap(),
            "2024-02-29T00:00:00Z"
        );
        for bad in [
            "2026-02-30",
            "2026-11-29T25:00:00Z",
            "yesterday",
            "2026-11-29T10:00:00",
            "",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn spans() {
        assert_eq!(parse_since("15m", 1_000_000), Ok(100_000));
        assert_eq!(parse_span("2h"), Some(7_200_000));
        assert_eq!(parse_span("3d"), Some(259_200_000));
        assert_eq!(parse_span("3"), None);
        assert_eq!(parse_span("m"), None);
        assert!(parse_since("soon", 0).is_err());
    }
}

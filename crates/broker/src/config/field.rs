//! Rules a field follows wherever it appears: target names, plain text, credential ids,
//! numeric ranges, method lists, loopback hosts and durations. Each check either
//! returns the normalized value or a [`ConfigError`] built by the target's [`Ctx`].

use std::time::Duration;

use super::{ConfigError, Ctx, Problem};
use crate::canonical::is_token;
use crate::vault::CredentialId;

pub(super) fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    let ok_first = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=64).contains(&b.len())
        && ok_first(b[0])
        && b[1..]
            .iter()
            .all(|&c| ok_first(c) || c == b'_' || c == b'-')
}

/// Free text that ends up in a header, URL or command line: no whitespace, no controls.
pub(super) fn plain_text(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| !c.is_whitespace() && !c.is_control())
}

pub(super) fn check_credential(
    ctx: &Ctx<'_>,
    credential: String,
) -> Result<CredentialId, ConfigError> {
    if credential.is_empty() {
        return Err(ctx.err("credential", Problem::Empty));
    }
    // The id is a keychain lookup key; the message never echoes it (an id is not a
    // secret, but a confused caller may have put one there).
    CredentialId::new(credential).map_err(|_| ctx.err("credential", Problem::InvalidCharacters))
}

pub(super) fn check_range(
    ctx: &Ctx<'_>,
    field: &str,
    v: u64,
    min: u64,
    max: u64,
) -> Result<(), ConfigError> {
    if (min..=max).contains(&v) {
        Ok(())
    } else {
        Err(ctx.err(field, Problem::OutOfRange { min, max }))
    }
}

/// Methods are case-sensitive tokens (RFC 9110 §9.1); requiring uppercase keeps `get`
/// from silently never matching a request for `GET`.
pub(super) fn is_uppercase_token(m: &str) -> bool {
    is_token(m) && !m.bytes().any(|b| b.is_ascii_lowercase())
}

pub(super) fn check_methods(
    ctx: &Ctx<'_>,
    field: &str,
    methods: Vec<String>,
) -> Result<Vec<String>, ConfigError> {
    for (i, m) in methods.iter().enumerate() {
        if !is_uppercase_token(m) {
            let problem = Problem::InvalidMethod { value: m.clone() };
            return Err(ctx.err(format!("{field}[{i}]"), problem));
        }
    }
    let mut methods = methods;
    methods.sort();
    methods.dedup();
    Ok(methods)
}

pub(super) fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// `<digits><unit>` with unit s, m, h or d; zero is no retention at all and is rejected.
pub(super) fn parse_duration(s: &str) -> Option<Duration> {
    let unit = match s.as_bytes().last()? {
        b's' => 1,
        b'm' => 60,
        b'h' => 3600,
        b'd' => 86_400,
        _ => return None,
    };
    let digits = &s[..s.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let secs = n.checked_mul(unit)?;
    (secs > 0).then(|| Duration::from_secs(secs))
}

//! The channels: what is particular to talking HTTP or SSH to a remote system. Each is a
//! [`Channel`](crate::invocation::Channel) — validation of its request and one attempt
//! (connection setup, dispatch, exchange, settled result) — run by the one
//! [`invocation pipeline`](crate::invocation::pipeline).
//!
//! - [`http`]: HTTP requests against configured base URLs (reqwest, rustls).
//! - [`ssh`]: one command on a configured host (russh), against a pinned host key.
//! - [`peer`]: a capability another broker exports (`peer://<peer>/<capability>/...`),
//!   with no credential of this broker's; its answers classified by seed 002.
//! - [`guard`]: the resolved-address guard (no credential to metadata or internal
//!   addresses) and the resolver both channels connect through.
//! - [`redact`]: scrubbing the injected secret, in its encoded forms, from results.

pub mod guard;
pub mod http;
pub mod peer;
pub mod redact;
pub mod ssh;

/// 16 fresh random bytes (an idempotency key, a peer auth's nonce). Without randomness
/// they fall back to the time in nanoseconds, still unique within this process (a peer
/// refuses a repeated nonce), rather than failing the request.
pub(crate) fn random_16() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes.copy_from_slice(&nanos.to_le_bytes());
    }
    bytes
}

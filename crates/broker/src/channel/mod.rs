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

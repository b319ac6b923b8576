//! Postern's engine: everything between an agent's request and the remote system,
//! without any GUI. The desktop app, the MCP server and the CLI all drive this crate.
//!
//! # Layout
//! - [`contract`]: the public error contract (phase, outcome, retry, code) and the
//!   evidence envelope. Closed enums; callers never parse messages.
//! - [`action`]: normalized HTTP/SSH actions, the bound configuration snapshot and the
//!   request fingerprint.
//! - [`config`]: the targets file; [`config_edit`]: edits the broker makes to it.
//! - [`journal`]: the append-only evidence journal in SQLite (group-committed, durable
//!   where the contract needs it), its projection, the result store and attempt leases.
//! - [`channel`]: the HTTP channel (SSH later): injection, connection setup,
//!   dispatch and settlement, each recorded through [`invocation`].
//! - [`approvals`]: the queue a person answers; approvals bind one fingerprint.
//! - [`invocation`]: the lifecycle API the channels drive, one durable transition at a
//!   time.
//! - [`retry`]: `decide()` and the retry manifest.
//! - [`audit`]: the hash chain over the journal, signed checkpoints and the verifier.
//! - [`vault`]: credentials in the OS keychain; the `Secret` type.
//! - [`clock`]: time passed in, so expiry and leases are deterministic in tests.

pub mod action;
pub mod approvals;
pub mod audit;
pub mod broker;
pub mod channel;
pub mod clock;
pub mod config;
pub mod config_edit;
pub mod contract;
pub mod display;
pub mod evidence;
pub mod invocation;
pub mod journal;
pub mod retry;
pub mod vault;

/// The whole of `docs/errors.md`: every code, then the HTTP status mapping. Generated so
/// the documentation cannot drift from the code (a test compares them).
pub fn errors_document() -> String {
    let mut doc = contract::errors_table_markdown();
    doc.push_str(&channel::http::status::mapping_table_markdown());
    doc
}

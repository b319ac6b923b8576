//! Postern's engine: everything between an agent's request and the remote system,
//! without any GUI. The desktop app, the MCP server and the CLI all drive this crate.
//!
//! # Layout
//!
//! One action, in the order it meets these modules: [`Broker::open`] opens everything
//! and hands out the two [`api`] handles;
//! [`invocation`] runs the request through one pipeline for every [`channel`]; the
//! [`journal`] records each step, [`audit`] chains the records; [`evidence`] and
//! [`retry`] read what the records prove.
//!
//! - [`Broker`]: the engine assembled ([`Broker::open`]): journal, vault, targets file
//!   and channels; the daemon and the desktop console both open it. Its parts are
//!   private: the operator side holds an [`OperatorApi`], the agent side an
//!   [`AgentApi`] that can submit, retry, poll and read its own invocations and nothing
//!   else ([`api`]; compile-fail tests in `crates/mcp/tests/agent_boundary.rs`).
//! - [`invocation`]: one invocation from request to delivered result:
//!   [`invocation::pipeline`] (accept, validate, bind, approve, credential and lease,
//!   attempt, delivery, and the [`invocation::Channel`] trait a channel implements),
//!   [`invocation::attempt`] (what an attempt records through, the dispatch gate),
//!   [`invocation::outcome`] (the one `Outcome` and the envelopes for a failing
//!   journal), [`invocation::recorder`] (one method per durable transition).
//! - [`channel`]: what is particular to a protocol: [`channel::http`] (validate,
//!   inject, exchange, transport, status) and [`channel::ssh`] (validation, key,
//!   exec), [`channel::redact`] (scrubbing the secret from results).
//! - [`operations`]: what runs around the pipeline for the HTTP-request channels, out
//!   of the channel's hooks: a call and its same-target redirects, retries, a 202's job
//!   and `poll_job`, the reconcile query.
//! - [`ssh_keys`]: OpenSSH key formats: key import, host-key pinning, fingerprints (below
//!   the configuration edits and the SSH channel that both use them).
//! - [`contract`]: the public error contract (phase, outcome, retry, code) and the
//!   evidence envelope. Closed enums; callers never parse messages.
//! - [`record`]: the ground floor of record types: small values the journal's events,
//!   the configuration and the evidence envelope all name (invocation links, job state).
//! - [`action`]: normalized HTTP/SSH actions, the bound configuration snapshot and the
//!   request fingerprint.
//! - [`config`]: the targets file and the live [`config::ConfigHandle`], with the
//!   batch and job contracts a target declares ([`config::batch`], [`config::job`]);
//!   [`config_edit`]: edits the broker makes to the file (pins, target edits, history).
//! - [`approvals`]: the approval request and answer types, the [`approvals::Approver`]
//!   trait and the queue a person answers; approvals bind one fingerprint.
//! - [`vault`]: the credential store (secrets in the OS keychain, metadata in the
//!   journal database); [`secret`]: the `Secret` type (zeroized, never printed,
//!   serialized or cloned), below the vault and the sealed store.
//! - [`sealed_store`]: the `file` keychain: secrets sealed (AES-256-GCM) in the data dir
//!   under a key from outside it, for a broker running as its own system user.
//! - [`journal`]: the append-only evidence journal in SQLite (group-committed, durable
//!   where the contract needs it): [`journal::events`], [`journal::projection`],
//!   [`journal::results`] (the result store), [`journal::query`] (activity, sessions,
//!   stats), [`journal::schema`] (migrations, damage checks), [`journal::space`] (disk
//!   space reserve and low-space mode).
//! - [`evidence`]: what a record proves and does not prove, the unsettled rule, the
//!   status `get_invocation` and the console show, operator attestations.
//! - [`provenance`]: who acted and what was approved: the SESSION_OPENED record of an
//!   agent process (executable digest, pid, start time, uid, cwd, parents) and the
//!   approval card whose digest the request and the answer record.
//! - [`retry`]: `decide()` and the retry manifest.
//! - [`audit`]: the hash chain over the journal, signed checkpoints and the verifier.
//! - [`transparency`]: witness cosigning (C2SP tlog-witness): checkpoint notes and
//!   cosignatures ([`transparency::note`]), the witness and its store
//!   ([`transparency::witness`], [`transparency::store`], [`transparency::server`]) and
//!   the client a log submits through ([`transparency::client`]).
//! - [`federation`]: brokers that peer (seed 002): the signed attestation, how the asking
//!   broker classifies an answer, the wire ([`federation::wire`]) and the answering
//!   broker's side ([`federation::serve`]).
//! - [`pause`]: the operator's pause of agent calls (refused with AGENTS_PAUSED).
//! - [`display`]: agent-written text made safe to show (escaping, body previews).
//! - [`clock`]: time passed in, so expiry and leases are deterministic in tests.
//! - [`budget`]: bytes many holders share, bounding what untrusted peers make us hold.
//! - `migrations`: what a SQLite file is, and its numbered migrations (one IMMEDIATE
//!   transaction each), for the journal and a witness's store.
//! - [`platform`]: what differs between Linux, macOS and Windows (the local socket or
//!   pipe and its peer's identity, process facts, owner-only files, directory fsync,
//!   default directories), behind one interface the other crates call too.

pub mod action;
pub mod api;
pub mod approvals;
pub mod audit;
mod broker;
pub mod budget;
pub mod canonical;
pub mod channel;
pub mod clock;
pub mod config;
pub mod config_edit;
pub mod contract;
pub mod display;
pub mod evidence;
pub mod federation;
pub mod invocation;
pub mod journal;
mod migrations;
pub mod operations;
pub mod pause;
pub mod platform;
pub mod provenance;
pub mod record;
pub mod retry;
pub mod sealed_store;
pub mod secret;
pub mod ssh_keys;
pub mod transparency;
pub mod vault;

pub use api::{AgentApi, OperatorApi};
pub use broker::{Broker, BrokerOptions, JOURNAL_FILE, OpenError, OpenWarning, Opened};
/// Handing a result over lives with the invocation ([`invocation::delivery`]).
pub use invocation::delivery;

/// The whole of `docs/errors.md`: every code, then the HTTP status mapping. Generated so
/// the documentation cannot drift from the code (a test compares them).
pub fn errors_document() -> String {
    let mut doc = contract::errors_table_markdown();
    doc.push_str(&channel::http::status::mapping_table_markdown());
    doc
}

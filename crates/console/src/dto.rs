//! What crosses the IPC boundary between the console's webview and the broker. Each type
//! derives [`TS`], and `ui/src/lib/bindings.ts` is generated from them (a test fails when
//! the committed file drifts). No type here can carry secret bytes: credential values
//! travel only inward, in [`SetCredential`], and are never returned.
//!
//! Where the broker's own record type is what the webview shows (a body or header
//! preview, an ancestor, a job's facts, a link between invocations, a batch member, a
//! reconciliation), it crosses as it is and is re-exported here. The types defined here
//! are the console's views: joins (an approval card with its times and live session),
//! judgements made once for every reader (whether a recorded executable is verified),
//! display escaping, and the console's own inputs, errors and events.
//!
//! Why this file is long: it is the whole IPC boundary in one place, a list of plain
//! types and their conversions from the engine's records, which the bindings generator
//! walks and a reviewer checks for anything secret in one read; split by screen, the
//! boundary would no longer be visible as a whole.

use postern_broker::contract::Code;
use serde::{Deserialize, Serialize};
use ts_rs::TS;

// The broker's own record types that cross as they are (their TypeScript is derived with
// the broker's `ts` feature): nothing secret, and the console adds nothing to them.
pub use postern_broker::contract::{ConfidenceSource, MemberState};
pub use postern_broker::display::{BodyPreview, HeaderPreview};
pub use postern_broker::evidence::Reconciliation;
pub use postern_broker::journal::events::Settlement;
pub use postern_broker::record::job::{JobFacts, JobState, ParentLink, Relation};
pub use postern_broker::record::session::Ancestor;

/// What the console shows first: whether to onboard, and the counts the navigation
/// badges carry.
#[derive(Debug, Clone, Serialize, TS)]
pub struct Overview {
    /// No credential stored yet: the console opens to onboarding.
    pub vault_empty: bool,
    pub credentials: u32,
    pub targets: u32,
    pub pending_approvals: u32,
    pub needs_reconciliation: u32,
    pub data_dir: String,
    pub config_path: String,
    /// The socket agents reach through `postern mcp --socket`.
    pub socket: String,
    /// The `postern` binary agents launch as their MCP server: the one beside this
    /// console when it is there, else `postern` from PATH.
    pub bridge_command: String,
    /// `secret-service`, `keyutils` or `file`.
    pub keychain: String,
    /// `single_user`: the broker runs as the person's own user, so an agent running as
    /// that user can read the journal and the keychain; `privilege_separated`: the
    /// broker runs as its own system user and this console reaches it over the operator
    /// socket.
    pub mode: String,
    /// Peers the operator socket refused since the broker started (0 without one).
    pub operator_refusals: u32,
    /// Agent sessions connected now whose agent is not confined (not started with
    /// `postern shield`), and those that are.
    pub unconfined_sessions: u32,
    pub confined_sessions: u32,
    /// The newest journal sequence: an attached console polls it to refresh its views.
    #[ts(type = "number")]
    pub last_seq: u64,
    /// Complete responses whose results could not be stored (RESULT_STORE_FAILED, a
    /// full disk say): the operator alert. The count, and the newest one's invocation.
    pub result_store_failures: u32,
    pub result_store_failure_latest: Option<String>,
    /// The operator paused agent calls: new ones are refused with AGENTS_PAUSED.
    pub agents_paused: bool,
}

/// One process in an agent's ancestry.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ProcessCard {
    pub pid: u32,
    pub executable: Option<String>,
    /// Escaped command line (control and bidi characters made visible). The process
    /// chose it (`exec -a` sets any argv): a claim, never an identity.
    pub claimed_command: String,
    pub cwd: Option<String>,
}

/// The agent session behind a request.
#[derive(Debug, Clone, Serialize, TS)]
pub struct AgentCard {
    pub session: String,
    pub agent: ProcessCard,
    /// Parents of the agent, nearest first.
    pub parent_chain: Vec<ProcessCard>,
    /// When the broker first saw this session (unix ms).
    #[ts(type = "number")]
    pub first_seen_ms: i64,
    #[ts(type = "number | null")]
    pub ended_at_ms: Option<i64>,
    pub connections: u32,
    /// `none`, or `shield shd_… (network …, profile …)`: how the agent is confined, as
    /// the broker established it.
    pub confinement: String,
}

/// An agent as the journal recorded it when its bridge connected (SESSION_OPENED): what
/// the log proves about who acted, also after a restart. Paths are escaped.
/// A view of the broker's [`postern_broker::provenance::CardAgent`]: the executable's
/// digest is split into its hex and its unreadable reason, and whether the executable is
/// verified is judged here once, for the webview, the CLI and the tests alike.
///
/// The pid, uid, user name and start time are known for certain (the kernel's). The
/// executable is only when `executable_verified`; `reported_by_bridge` is a claim.
#[derive(Debug, Clone, Serialize, TS)]
pub struct RecordedAgent {
    pub session: String,
    pub pid: u32,
    pub uid: Option<u32>,
    /// The uid's account name, when it has one.
    pub user_name: Option<String>,
    pub executable: Option<String>,
    /// blake3 (hex) of the executable's bytes when the agent connected.
    pub executable_blake3: Option<String>,
    /// The broker read the executable and its bytes itself (through the process, not a
    /// path the agent named).
    pub executable_verified: bool,
    /// Why the executable could not be hashed, when it could not.
    pub executable_unreadable: Option<String>,
    /// What the bridge said about the process that started it: not verified.
    pub reported_by_bridge: Option<BridgeClaim>,
    /// When the agent process started (unix ms).
    #[ts(type = "number | null")]
    pub started_at_ms: Option<i64>,
    pub cwd: Option<String>,
    /// Parents of the agent, nearest first.
    pub parent_chain: Vec<Ancestor>,
    /// `none`, or `shield shd_… (network …, profile …)`, as SESSION_OPENED recorded it.
    pub confinement: String,
}

/// What a bridge claimed about the process that started it (the agent, unless the
/// bridge stands for it), escaped. The broker did not verify any of it.
#[derive(Debug, Clone, Serialize, TS)]
pub struct BridgeClaim {
    pub parent_pid: u32,
    pub parent_executable: Option<String>,
    pub parent_executable_blake3: Option<String>,
    pub parent_executable_unreadable: Option<String>,
    pub bridge_executable: Option<String>,
}

/// The digest's hex, or why there is none.
fn digest_parts(
    digest: &postern_broker::provenance::ExecutableDigest,
) -> (Option<String>, Option<String>) {
    use postern_broker::provenance::ExecutableDigest;
    match digest {
        ExecutableDigest::Blake3 { hex } => (Some(hex.clone()), None),
        ExecutableDigest::Unreadable { reason } => (None, Some(reason.clone())),
    }
}

impl From<&postern_broker::provenance::CardAgent> for RecordedAgent {
    fn from(a: &postern_broker::provenance::CardAgent) -> Self {
        let (executable_blake3, executable_unreadable) = digest_parts(&a.executable_digest);
        RecordedAgent {
            session: a.session.clone(),
            pid: a.pid,
            uid: a.uid,
            user_name: a.user_name.clone(),
            executable: a.executable.clone(),
            executable_verified: a.executable.is_some() && executable_blake3.is_some(),
            executable_blake3,
            executable_unreadable,
            reported_by_bridge: a.bridge_report.as_ref().map(|r| {
                let (blake3, unreadable) = digest_parts(&r.parent_executable_digest);
                BridgeClaim {
                    parent_pid: r.parent_pid,
                    parent_executable: r.parent_executable.clone(),
                    parent_executable_blake3: blake3,
                    parent_executable_unreadable: unreadable,
                    bridge_executable: r.bridge_executable.clone(),
                }
            }),
            started_at_ms: a.started_at_ms,
            cwd: a.cwd.clone(),
            parent_chain: a.parent_chain.clone(),
            confinement: a.confinement.describe(),
        }
    }
}

impl From<&postern_broker::provenance::RecordedSession> for RecordedAgent {
    fn from(r: &postern_broker::provenance::RecordedSession) -> Self {
        RecordedAgent::from(&postern_broker::provenance::CardAgent::of(&r.opened))
    }
}

/// What an invocation's record says about its approval: the card shown, and whether the
/// answer named that card.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ApprovalProof {
    pub mode: String,
    /// The digest of the card APPROVAL_REQUESTED recorded (absent in older records).
    pub card_digest: Option<String>,
    /// The recorded card hashes to the recorded digest.
    pub card_intact: bool,
    /// `granted`, `denied`, or absent while unanswered (or timed out).
    pub answer: Option<String>,
    pub answered_by: Option<String>,
    /// The digest of the card the answer was given on.
    pub answered_card_digest: Option<String>,
    /// The answer named the recorded card; absent when it named none (a remembered
    /// session approval, an older record) or there is no answer.
    pub matched: Option<bool>,
}

impl From<&postern_broker::provenance::ApprovalRecord> for ApprovalProof {
    fn from(r: &postern_broker::provenance::ApprovalRecord) -> Self {
        ApprovalProof {
            mode: r.mode.clone(),
            card_digest: r.card_digest.clone(),
            card_intact: r.card_intact,
            answer: r
                .answer
                .as_ref()
                .map(|a| if a.granted { "granted" } else { "denied" }.to_string()),
            answered_by: r.answer.as_ref().map(|a| a.by.clone()),
            answered_card_digest: r.answer.as_ref().and_then(|a| a.card_digest.clone()),
            matched: r.answer_matches_card(),
        }
    }
}

/// One pending approval. A view of the broker's [`postern_broker::provenance::ApprovalCard`],
/// not that type: every field is always present (the record omits empty ones so older
/// cards keep their digests), `agent` is the live session while the recorded agent is
/// `recorded_agent` in its display form, and the times and the card's digest are added.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ApprovalCard {
    pub invocation_id: String,
    /// `per_call`, `session` (approving covers this agent session) or `host_key` (first
    /// connection to an SSH host: approving pins the key).
    pub mode: String,
    pub target: String,
    pub summary: String,
    pub method: Option<String>,
    pub url: Option<String>,
    pub body: Option<BodyPreview>,
    pub ssh_destination: Option<String>,
    pub command: Option<String>,
    pub host_key: Option<String>,
    /// The addresses the host resolved to when the card was built (a refused one is
    /// marked; the broker checks again at connect time).
    pub resolved: Option<String>,
    /// The HTTP proxy (`host:port`) the request goes through; the proxy, not the
    /// broker, resolves the host then.
    pub proxy: Option<String>,
    /// What to look at first: flagged headers, a script fed to an interpreter on stdin.
    pub cautions: Vec<String>,
    /// What approving covers: one send and its safe resends, a session, a host key.
    pub covers: String,
    /// HTTP: every header the agent supplied, in the order sent.
    pub headers: Vec<HeaderPreview>,
    /// HTTP: what the broker adds (host, framing, coding, the credential by id, the
    /// idempotency key).
    pub added: Vec<String>,
    /// SSH: the command's standard input.
    pub stdin: Option<BodyPreview>,
    pub credential_id: String,
    pub credential_version: String,
    pub injection_mode: String,
    pub idempotency_key: Option<String>,
    /// The full fingerprint the approval binds; Approve sends it back.
    pub fingerprint: String,
    #[ts(type = "number")]
    pub requested_at_ms: i64,
    #[ts(type = "number")]
    pub expires_at_ms: i64,
    /// The live session (how long it has run, open connections); not part of the card's
    /// digest. Unknown when the session has no live registry entry.
    pub agent: Option<AgentCard>,
    /// The agent as its SESSION_OPENED record describes it: the identity this card shows
    /// and its digest binds. Absent when the journal has no record of the session.
    pub recorded_agent: Option<RecordedAgent>,
    /// The digest of exactly what this card shows; Approve and Deny send it back, and the
    /// journal records it with the request and the answer.
    pub card_digest: String,
}

impl ApprovalCard {
    /// The card the console shows for a pending request: every request field is the
    /// broker's [`postern_broker::provenance::ApprovalCard`], whose digest the journal
    /// records; the times and the live session are the console's own.
    pub fn shown(
        card: &postern_broker::provenance::ApprovalCard,
        requested_at_ms: i64,
        expires_at_ms: i64,
        agent: Option<AgentCard>,
    ) -> Self {
        ApprovalCard {
            invocation_id: card.invocation_id.clone(),
            mode: card.mode.clone(),
            target: card.target.clone(),
            summary: card.summary.clone(),
            method: card.method.clone(),
            url: card.url.clone(),
            body: card.body.clone(),
            ssh_destination: card.ssh_destination.clone(),
            command: card.command.clone(),
            host_key: card.host_key.clone(),
            resolved: card.resolved.clone(),
            proxy: card.proxy.clone(),
            cautions: card.cautions.clone(),
            covers: card.covers.clone(),
            headers: card.headers.clone(),
            added: card.added.clone(),
            stdin: card.stdin.clone(),
            credential_id: card.credential_id.clone(),
            credential_version: card.credential_version.clone(),
            injection_mode: card.injection_mode.clone(),
            idempotency_key: card.idempotency_key.clone(),
            fingerprint: card.fingerprint.clone(),
            requested_at_ms,
            expires_at_ms,
            agent,
            recorded_agent: card.agent.as_ref().map(RecordedAgent::from),
            card_digest: card.digest(),
        }
    }
}

/// A person's answer to one card.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Deny,
}

/// One invocation as lists show it.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ActivityRow {
    pub id: String,
    #[ts(type = "number")]
    pub accepted_seq: i64,
    #[ts(type = "number")]
    pub accepted_at_ms: i64,
    pub session: Option<String>,
    pub target: String,
    pub summary: String,
    #[ts(type = "Phase")]
    pub phase: String,
    #[ts(type = "Outcome")]
    pub outcome: String,
    #[ts(type = "Retry")]
    pub retry: String,
    #[ts(type = "Code | null")]
    pub code: Option<String>,
}

/// Which invocations the activity screen shows. Empty fields match everything.
#[derive(Debug, Clone, Default, Serialize, Deserialize, TS)]
#[serde(default, deny_unknown_fields)]
pub struct ActivityFilter {
    pub session: Option<String>,
    pub target: Option<String>,
    #[ts(type = "Phase | null")]
    pub phase: Option<String>,
    #[ts(type = "Outcome | null")]
    pub outcome: Option<String>,
    #[ts(type = "Code | null")]
    pub code: Option<String>,
    #[ts(type = "number | null")]
    pub since_ms: Option<i64>,
    #[ts(type = "number | null")]
    pub until_ms: Option<i64>,
    /// Searched in target and URL (or SSH host and command digest).
    pub text: Option<String>,
}

/// One page of activity, newest first.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ActivityPage {
    pub rows: Vec<ActivityRow>,
    /// Pass as `before_seq` for the next page; `null` when this was the last.
    #[ts(type = "number | null")]
    pub next_before_seq: Option<i64>,
    /// Server-side time of this query, in microseconds.
    #[ts(type = "number")]
    pub took_us: u64,
}

/// The export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "snake_case")]
pub enum ExportFormat {
    Jsonl,
    Csv,
}

/// Where an export was written.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ExportResult {
    pub path: String,
    #[ts(type = "number")]
    pub rows: u64,
}

/// One agent session, live or from the journal.
#[derive(Debug, Clone, Serialize, TS)]
pub struct SessionSummary {
    pub session: String,
    #[ts(type = "number")]
    pub invocations: u64,
    #[ts(type = "number")]
    pub first_at_ms: i64,
    #[ts(type = "number")]
    pub last_at_ms: i64,
    /// Present while this broker has seen the session (this run).
    pub agent: Option<AgentCard>,
    /// The agent as the journal recorded it (kept across restarts).
    pub recorded: Option<RecordedAgent>,
}

/// One durable transition of an invocation.
#[derive(Debug, Clone, Serialize, TS)]
pub struct TimelineEvent {
    #[ts(type = "number")]
    pub seq: u64,
    #[ts(type = "number")]
    pub at_ms: i64,
    /// The journal's event kind, e.g. `DISPATCH_STARTED`.
    pub kind: String,
    /// The step of the lifecycle this belongs to: accepted, validated, approval,
    /// authorized, dispatched, response, committed, delivered, failed, retry,
    /// reconciled.
    pub step: String,
    /// A short secret-free description of the event's facts.
    pub detail: String,
}

/// Everything the console shows about one invocation.
#[derive(Debug, Clone, Serialize, TS)]
pub struct InvocationDetail {
    pub row: ActivityRow,
    pub events: Vec<TimelineEvent>,
    /// The envelope an agent gets from `get_invocation` (status, error, evidence), as
    /// JSON.
    #[ts(type = "Record<string, unknown>")]
    pub envelope: serde_json::Value,
    /// What the durable record proves, in plain sentences.
    pub proves: Vec<String>,
    /// What it does not prove.
    pub does_not_prove: Vec<String>,
    /// The verdict of the newest retry manifest, if a retry was planned.
    pub manifest_verdict: Option<String>,
    /// The target has a `[http.reconcile]` query the console can run.
    pub can_query: bool,
    /// The outcome is unknown and nothing has settled it yet.
    pub unsettled: bool,
    /// How it was settled, if it was: `remote_query` or `operator_attested`, with the
    /// settlement, who and when.
    pub settlement: Option<Reconciliation>,
    /// The agent of the invocation's session, from the journal.
    pub agent: Option<RecordedAgent>,
    /// The approval card recorded for it and whether the answer matched it.
    pub approval: Option<ApprovalProof>,
    /// The invocation it was started for and the ones started for it (followed
    /// redirects, a 202's job, job polls, reconcile queries), parent first.
    pub related: Vec<RelatedInvocation>,
    /// For a job invocation: the job and its last reported state.
    pub job: Option<JobFacts>,
    /// For a batch: each member's outcome, in request order.
    pub members: Vec<MemberState>,
}

/// A call through a peer broker that stopped with an incident (seed 002), routed to
/// whoever must act on it.
#[derive(Debug, Clone, Serialize, TS)]
pub struct PeerIncidentRow {
    pub invocation_id: String,
    /// The PEER_INCIDENT record's journal sequence and time (unix ms).
    #[ts(type = "number")]
    pub seq: u64,
    #[ts(type = "number")]
    pub at_ms: i64,
    /// `policy` (a signed denial), `contract_violation` (answers without a verifiable
    /// attestation) or `transient_exhaustion` (the peer stayed unavailable).
    pub kind: String,
    /// `peering_owner`, `peer_operator` or `local_operator`.
    pub owner: String,
    /// The peer's name in `[[peer]]`, and the capability called.
    pub peer: String,
    pub capability: String,
    /// The code the invocation stopped with.
    #[ts(type = "Code")]
    pub code: Code,
    /// What checking the last attestation against the peer's pinned key found:
    /// `verified`, `absent`, `failed` or `not_applicable` (a transport error).
    pub signature: String,
    pub attestation_digest: Option<String>,
    /// The last attestation as received (verified or not), as JSON.
    #[ts(type = "Record<string, unknown> | null")]
    pub attestation: Option<serde_json::Value>,
    /// Answers the call received, and the budgets they spent.
    pub answers: u32,
    pub transient_used: u32,
    pub unknown_used: u32,
    /// The invocation's envelope as an agent reads it (seed 000: `invocation_id`,
    /// `error`, `evidence` with what the peer proved).
    #[ts(type = "Record<string, unknown>")]
    pub envelope: serde_json::Value,
}

/// An invocation linked to the one shown.
#[derive(Debug, Clone, Serialize, TS)]
pub struct RelatedInvocation {
    /// The linked invocation and why it was started (flattened: `invocation_id`,
    /// `relation`).
    #[serde(flatten)]
    pub link: ParentLink,
    /// `parent` (the shown one was started for it) or `child`.
    pub role: String,
}

/// An operator's attestation of an unknown outcome.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct Attestation {
    pub invocation_id: String,
    /// `committed` or `not_applied`.
    pub settlement: String,
    /// Required: what the operator checked.
    pub note: String,
}

/// A stored credential (metadata only; the value never leaves the keychain).
#[derive(Debug, Clone, Serialize, TS)]
pub struct CredentialCard {
    pub id: String,
    pub kind: String,
    pub version: String,
    #[ts(type = "number")]
    pub created_at_ms: i64,
    #[ts(type = "number | null")]
    pub rotated_at_ms: Option<i64>,
    #[ts(type = "number | null")]
    pub last_used_ms: Option<i64>,
    /// Targets that name this credential.
    pub used_by: Vec<String>,
}

/// A credential to add or rotate. The value goes one way, into the keychain: a client
/// serializes it to send it to the broker (the CLI over the operator socket), and nothing
/// the broker answers carries one.
#[derive(Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct SetCredential {
    pub id: String,
    /// `token`, `password`, `basic` or `ssh_key`.
    pub kind: String,
    pub secret: String,
    /// For an encrypted SSH private key: used once to decrypt it, never stored.
    pub passphrase: Option<String>,
}

impl std::fmt::Debug for SetCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetCredential")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("secret", &"<redacted>")
            .field(
                "passphrase",
                &self.passphrase.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// One configured target.
#[derive(Debug, Clone, Serialize, TS)]
pub struct TargetCard {
    pub name: String,
    /// `http` or `ssh`.
    pub channel: String,
    /// Base URL, or `user@host:port`.
    pub location: String,
    pub credential: String,
    /// `none`, `session` or `per_call`.
    pub approval: String,
    /// Only confined sessions (agents started with `postern shield`) may call it.
    pub require_confined: bool,
    /// The normalized-config digest bound into fingerprints: changes with every edit.
    pub version: String,
    /// The target's table as written in the config file, for editing.
    pub toml: String,
}

/// The configured targets and the file they come from.
#[derive(Debug, Clone, Serialize, TS)]
pub struct TargetList {
    pub config_path: String,
    pub targets: Vec<TargetCard>,
}

/// An edit of one target's table.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct TargetEdit {
    pub name: String,
    /// The new text of the target's table (the `[[http]]` or `[[ssh]]` block).
    pub toml: String,
}

/// The audit chain's state, for the integrity banner.
#[derive(Debug, Clone, Serialize, TS)]
pub struct IntegrityState {
    /// `verified` (every event signed and checked), `unsigned` (events past the last
    /// checkpoint: never shown as verified), `empty`, `failed` or `checking`.
    pub state: String,
    /// Verified through this sequence.
    #[ts(type = "number | null")]
    pub through_seq: Option<u64>,
    #[ts(type = "number | null")]
    pub checked_at_ms: Option<i64>,
    #[ts(type = "number")]
    pub events: u64,
    #[ts(type = "number")]
    pub checkpoints: u64,
    /// The exact failure, when the chain does not verify.
    pub failure: Option<String>,
    #[ts(type = "number | null")]
    pub first_bad_seq: Option<u64>,
    /// Events after the last signed checkpoint.
    #[ts(type = "number")]
    pub unsigned_events: u64,
    /// Ranges a previous run ended without signing, signed at the next start.
    pub notes: Vec<String>,
    /// `full` (the whole file, with the anchor outside the data dir) or `incremental`
    /// (only what came since the last full check).
    pub scope: String,
    /// Witnesses whose cosigned tree heads the last full check held the journal to.
    pub witnesses: u32,
    /// What a verified journal proves and against whom (who could have signed it, how
    /// many witnesses hold it); absent until it verifies.
    pub assurance: Option<String>,
}

impl IntegrityState {
    pub fn checking() -> IntegrityState {
        IntegrityState {
            state: "checking".into(),
            through_seq: None,
            checked_at_ms: None,
            events: 0,
            checkpoints: 0,
            failure: None,
            first_bad_seq: None,
            unsigned_events: 0,
            notes: Vec::new(),
            scope: "full".into(),
            witnesses: 0,
            assurance: None,
        }
    }
}

/// The stable code of a [`CommandError`]: one of the console's own, or a code of the
/// broker's contract passed through unchanged (a vault error carries one). Either way it
/// crosses the IPC boundary as the bare string, e.g. `"NOT_PENDING"` or
/// `"VAULT_LOCKED"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, TS)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// A command argument is malformed or out of range; `field` names it.
    InvalidInput,
    /// The journal could not be read.
    JournalUnreadable,
    /// The journal refused to record an attestation or a pause of agents.
    JournalRefused,
    /// The approval was already answered, timed out or was cancelled.
    NotPending,
    /// The answer names a card other than the one pending; redraw and answer again.
    CardChanged,
    /// No invocation with that id is in the journal.
    UnknownInvocation,
    /// The invocation's outcome is not an unsettled unknown.
    NotUnknown,
    /// The target has no reconcile query configured.
    NoReconcileQuery,
    /// The reconcile query ran but did not settle the outcome.
    ReconcileInconclusive,
    /// The activity export could not be written.
    ExportFailed,
    /// The targets file could not be read.
    ConfigUnreadable,
    /// A target edit does not validate; nothing was changed.
    ConfigInvalid,
    /// Something in the console itself failed (a poisoned lock, a task that died).
    Internal,
    /// The operator socket was sent a command it does not know.
    UnknownCommand,
    /// The operator socket refused this peer: not the broker's user, root, or a member of
    /// the operator group.
    OperatorRefused,
    /// The operator socket could not be reached, or broke off mid-answer.
    OperatorUnreachable,
    /// A code of the broker's contract, e.g. `VAULT_LOCKED`.
    #[serde(untagged)]
    #[ts(type = "Code")]
    Broker(Code),
}

impl ErrorCode {
    /// The console's own codes (every variant but [`ErrorCode::Broker`]).
    pub const CONSOLE: &'static [ErrorCode] = &[
        ErrorCode::InvalidInput,
        ErrorCode::JournalUnreadable,
        ErrorCode::JournalRefused,
        ErrorCode::NotPending,
        ErrorCode::CardChanged,
        ErrorCode::UnknownInvocation,
        ErrorCode::NotUnknown,
        ErrorCode::NoReconcileQuery,
        ErrorCode::ReconcileInconclusive,
        ErrorCode::ExportFailed,
        ErrorCode::ConfigUnreadable,
        ErrorCode::ConfigInvalid,
        ErrorCode::Internal,
        ErrorCode::UnknownCommand,
        ErrorCode::OperatorRefused,
        ErrorCode::OperatorUnreachable,
    ];

    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidInput => "INVALID_INPUT",
            ErrorCode::JournalUnreadable => "JOURNAL_UNREADABLE",
            ErrorCode::JournalRefused => "JOURNAL_REFUSED",
            ErrorCode::NotPending => "NOT_PENDING",
            ErrorCode::CardChanged => "CARD_CHANGED",
            ErrorCode::UnknownInvocation => "UNKNOWN_INVOCATION",
            ErrorCode::NotUnknown => "NOT_UNKNOWN",
            ErrorCode::NoReconcileQuery => "NO_RECONCILE_QUERY",
            ErrorCode::ReconcileInconclusive => "RECONCILE_INCONCLUSIVE",
            ErrorCode::ExportFailed => "EXPORT_FAILED",
            ErrorCode::ConfigUnreadable => "CONFIG_UNREADABLE",
            ErrorCode::ConfigInvalid => "CONFIG_INVALID",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::UnknownCommand => "UNKNOWN_COMMAND",
            ErrorCode::OperatorRefused => "OPERATOR_REFUSED",
            ErrorCode::OperatorUnreachable => "OPERATOR_UNREACHABLE",
            ErrorCode::Broker(code) => code.as_str(),
        }
    }
}

impl std::str::FromStr for ErrorCode {
    type Err = ();

    /// The code whose wire string is `s`, console codes first.
    fn from_str(s: &str) -> Result<Self, ()> {
        ErrorCode::CONSOLE
            .iter()
            .copied()
            .find(|c| c.as_str() == s)
            .or_else(|| {
                Code::ALL
                    .iter()
                    .find(|c| c.as_str() == s)
                    .map(|c| ErrorCode::Broker(*c))
            })
            .ok_or(())
    }
}

/// Read back from the wire by the operator client; an unknown code is an error.
impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|()| serde::de::Error::custom(format!("unknown error code `{s}`")))
    }
}

impl From<Code> for ErrorCode {
    fn from(code: Code) -> Self {
        ErrorCode::Broker(code)
    }
}

/// An error a command returns to the webview: a stable code and a message meant for a
/// person.
#[derive(Debug, Clone, Serialize, Deserialize, TS, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    pub code: ErrorCode,
    pub message: String,
    /// The input field the error is about, when there is one.
    pub field: Option<String>,
}

impl CommandError {
    pub fn new(code: impl Into<ErrorCode>, message: impl Into<String>) -> Self {
        CommandError {
            code: code.into(),
            message: message.into(),
            field: None,
        }
    }

    pub fn field(code: impl Into<ErrorCode>, field: &str, message: impl Into<String>) -> Self {
        CommandError {
            code: code.into(),
            message: message.into(),
            field: Some(field.to_string()),
        }
    }
}

/// Event names: emitted by `app`, listened to through the generated bindings.
pub const APPROVALS_CHANGED: &str = "approvals-changed";
pub const JOURNAL_CHANGED: &str = "journal-changed";
pub const INTEGRITY_CHANGED: &str = "integrity-changed";
pub const PAUSE_CHANGED: &str = "pause-changed";

/// Whether agent calls are paused: the answer of `pause_agents` and `resume_agents`,
/// and the payload of the `pause-changed` event.
#[derive(Debug, Clone, Serialize, Deserialize, TS)]
pub struct AgentPauseState {
    pub paused: bool,
}

/// Payload of the `approvals-changed` event: the full pending list.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ApprovalsChanged {
    pub pending: Vec<ApprovalCard>,
}

/// Payload of the `journal-changed` event: the newest sequence, so views refresh.
#[derive(Debug, Clone, Serialize, TS)]
pub struct JournalChanged {
    #[ts(type = "number")]
    pub last_seq: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn error_codes_serialize_as_their_bare_wire_strings() {
        for code in ErrorCode::CONSOLE {
            assert_eq!(
                serde_json::to_value(code).unwrap(),
                serde_json::json!(code.as_str())
            );
        }
        for code in Code::ALL {
            let wrapped = ErrorCode::from(*code);
            assert_eq!(wrapped.as_str(), code.as_str());
            assert_eq!(
                serde_json::to_value(wrapped).unwrap(),
                serde_json::json!(code.as_str())
            );
        }
        let error = CommandError::field(ErrorCode::InvalidInput, "note", "Say what you checked.");
        assert_eq!(
            serde_json::to_value(&error).unwrap(),
            serde_json::json!({"code": "INVALID_INPUT", "message": "Say what you checked.", "field": "note"})
        );
    }

    #[test]
    fn console_codes_are_distinct_from_the_broker_codes() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::CONSOLE
            .iter()
            .map(|c| c.as_str())
            .chain(Code::ALL.iter().map(|c| c.as_str()))
        {
            assert!(seen.insert(code), "{code} is listed twice");
        }
    }
}

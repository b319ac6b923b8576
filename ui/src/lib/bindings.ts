// Generated from the Rust types by `src-tauri/src/bindings.rs`. Do not edit:
// `POSTERN_UPDATE_BINDINGS=1 cargo test -p postern-desktop bindings` rewrites it.
import { invoke } from "@tauri-apps/api/core";
import { listen, type UnlistenFn } from "@tauri-apps/api/event";

export type Phase = "validation" | "credential_injection" | "connection_setup" | "remote_execution" | "result_delivery";
export const PHASE_VALUES: Phase[] = ["validation", "credential_injection", "connection_setup", "remote_execution", "result_delivery"];
export type Outcome = "not_attempted" | "rejected" | "committed" | "unknown";
export const OUTCOME_VALUES: Outcome[] = ["not_attempted", "rejected", "committed", "unknown"];
export type Retry = "never" | "after_correction" | "backoff" | "same_idempotency_key" | "reconcile" | "fetch_result";
export const RETRY_VALUES: Retry[] = ["never", "after_correction", "backoff", "same_idempotency_key", "reconcile", "fetch_result"];
export type Code = "INVALID_TARGET" | "INVALID_REQUEST" | "UNSUPPORTED_ACTION" | "CONFINEMENT_REQUIRED" | "PAYLOAD_LIMIT" | "FORBIDDEN_HEADER" | "IDEMPOTENCY_MISMATCH" | "FINGERPRINT_MISMATCH" | "LEASE_LOST" | "BROKER_UNAVAILABLE" | "VAULT_LOCKED" | "CREDENTIAL_MISSING" | "UNSUPPORTED_INJECTION" | "KEY_DECRYPTION_FAILED" | "APPROVAL_DENIED" | "APPROVAL_TIMEOUT" | "NO_APPROVER" | "DNS_FAILED" | "ADDRESS_REFUSED" | "CONNECTION_REFUSED" | "CONNECT_TIMEOUT" | "PROXY_UNREACHABLE" | "PROXY_REFUSED" | "PROXY_TUNNEL_FAILED" | "TLS_REJECTED" | "HOST_KEY_MISMATCH" | "HOST_KEY_UNKNOWN" | "SSH_HANDSHAKE_FAILED" | "SSH_AUTH_FAILED" | "CHANNEL_OPEN_FAILED" | "REMOTE_OUTCOME_UNKNOWN" | "REMOTE_RESULT_INCOMPLETE" | "REMOTE_TIMEOUT" | "CALLER_CANCELLED" | "EXEC_REFUSED" | "REMOTE_REJECTED" | "REMOTE_UNAUTHORIZED" | "REMOTE_RATE_LIMITED" | "REMOTE_SERVER_ERROR" | "JOB_PENDING" | "JOB_FAILED" | "BATCH_PARTIAL" | "RESULT_DELIVERY_FAILED" | "RESULT_STORE_FAILED" | "RESULT_EXPIRED" | "RECONCILED_COMMITTED" | "BROKER_INTERRUPTED" | "RECONCILED_NOT_APPLIED" | "PEER_DENIED" | "PEER_UNAVAILABLE" | "PEER_CONTRACT_VIOLATION" | "PEER_POLICY_CHANGED" | "PEER_OUTCOME_UNKNOWN" | "AGENTS_PAUSED";
export const CODE_VALUES: Code[] = ["INVALID_TARGET", "INVALID_REQUEST", "UNSUPPORTED_ACTION", "CONFINEMENT_REQUIRED", "PAYLOAD_LIMIT", "FORBIDDEN_HEADER", "IDEMPOTENCY_MISMATCH", "FINGERPRINT_MISMATCH", "LEASE_LOST", "BROKER_UNAVAILABLE", "VAULT_LOCKED", "CREDENTIAL_MISSING", "UNSUPPORTED_INJECTION", "KEY_DECRYPTION_FAILED", "APPROVAL_DENIED", "APPROVAL_TIMEOUT", "NO_APPROVER", "DNS_FAILED", "ADDRESS_REFUSED", "CONNECTION_REFUSED", "CONNECT_TIMEOUT", "PROXY_UNREACHABLE", "PROXY_REFUSED", "PROXY_TUNNEL_FAILED", "TLS_REJECTED", "HOST_KEY_MISMATCH", "HOST_KEY_UNKNOWN", "SSH_HANDSHAKE_FAILED", "SSH_AUTH_FAILED", "CHANNEL_OPEN_FAILED", "REMOTE_OUTCOME_UNKNOWN", "REMOTE_RESULT_INCOMPLETE", "REMOTE_TIMEOUT", "CALLER_CANCELLED", "EXEC_REFUSED", "REMOTE_REJECTED", "REMOTE_UNAUTHORIZED", "REMOTE_RATE_LIMITED", "REMOTE_SERVER_ERROR", "JOB_PENDING", "JOB_FAILED", "BATCH_PARTIAL", "RESULT_DELIVERY_FAILED", "RESULT_STORE_FAILED", "RESULT_EXPIRED", "RECONCILED_COMMITTED", "BROKER_INTERRUPTED", "RECONCILED_NOT_APPLIED", "PEER_DENIED", "PEER_UNAVAILABLE", "PEER_CONTRACT_VIOLATION", "PEER_POLICY_CHANGED", "PEER_OUTCOME_UNKNOWN", "AGENTS_PAUSED"];

export type Overview = { 
/**
 * No credential stored yet: the console opens to onboarding.
 */
vault_empty: boolean, credentials: number, targets: number, pending_approvals: number, needs_reconciliation: number, data_dir: string, config_path: string, 
/**
 * The socket agents reach through `postern mcp --socket`.
 */
socket: string, 
/**
 * The `postern` binary agents launch as their MCP server: the one beside this
 * console when it is there, else `postern` from PATH.
 */
bridge_command: string, 
/**
 * `secret-service`, `keyutils` or `file`.
 */
keychain: string, 
/**
 * `single_user`: the broker runs as the person's own user, so an agent running as
 * that user can read the journal and the keychain; `privilege_separated`: the
 * broker runs as its own system user and this console reaches it over the operator
 * socket.
 */
mode: string, 
/**
 * Peers the operator socket refused since the broker started (0 without one).
 */
operator_refusals: number, 
/**
 * Agent sessions connected now whose agent is not confined (not started with
 * `postern shield`), and those that are.
 */
unconfined_sessions: number, confined_sessions: number, 
/**
 * The newest journal sequence: an attached console polls it to refresh its views.
 */
last_seq: number, 
/**
 * Complete responses whose results could not be stored (RESULT_STORE_FAILED, a
 * full disk say): the operator alert. The count, and the newest one's invocation.
 */
result_store_failures: number, result_store_failure_latest: string | null, 
/**
 * The operator paused agent calls: new ones are refused with AGENTS_PAUSED.
 */
agents_paused: boolean, };

export type ProcessCard = { pid: number, executable: string | null, 
/**
 * Escaped command line (control and bidi characters made visible). The process
 * chose it (`exec -a` sets any argv): a claim, never an identity.
 */
claimed_command: string, cwd: string | null, };

export type AgentCard = { session: string, agent: ProcessCard, 
/**
 * Parents of the agent, nearest first.
 */
parent_chain: Array<ProcessCard>, 
/**
 * When the broker first saw this session (unix ms).
 */
first_seen_ms: number, ended_at_ms: number | null, connections: number, 
/**
 * `none`, or `shield shd_… (network …, profile …)`: how the agent is confined, as
 * the broker established it.
 */
confinement: string, };

export type Ancestor = { pid: number, executable: string | null, };

export type RecordedAgent = { session: string, pid: number, uid: number | null, 
/**
 * The uid's account name, when it has one.
 */
user_name: string | null, executable: string | null, 
/**
 * blake3 (hex) of the executable's bytes when the agent connected.
 */
executable_blake3: string | null, 
/**
 * The broker read the executable and its bytes itself (through the process, not a
 * path the agent named).
 */
executable_verified: boolean, 
/**
 * Why the executable could not be hashed, when it could not.
 */
executable_unreadable: string | null, 
/**
 * What the bridge said about the process that started it: not verified.
 */
reported_by_bridge: BridgeClaim | null, 
/**
 * When the agent process started (unix ms).
 */
started_at_ms: number | null, cwd: string | null, 
/**
 * Parents of the agent, nearest first.
 */
parent_chain: Array<Ancestor>, 
/**
 * `none`, or `shield shd_… (network …, profile …)`, as SESSION_OPENED recorded it.
 */
confinement: string, };

export type BridgeClaim = { parent_pid: number, parent_executable: string | null, parent_executable_blake3: string | null, parent_executable_unreadable: string | null, bridge_executable: string | null, };

export type ApprovalProof = { mode: string, 
/**
 * The digest of the card APPROVAL_REQUESTED recorded (absent in older records).
 */
card_digest: string | null, 
/**
 * The recorded card hashes to the recorded digest.
 */
card_intact: boolean, 
/**
 * `granted`, `denied`, or absent while unanswered (or timed out).
 */
answer: string | null, answered_by: string | null, 
/**
 * The digest of the card the answer was given on.
 */
answered_card_digest: string | null, 
/**
 * The answer named the recorded card; absent when it named none (a remembered
 * session approval, an older record) or there is no answer.
 */
matched: boolean | null, };

export type BodyPreview = { size: number, 
/**
 * blake3 of the exact body bytes, lowercase hex (the value bound in the fingerprint).
 */
digest: string, 
/**
 * The first [`PREVIEW_CHARS`] characters, escaped.
 */
text: string, truncated: boolean, };

export type HeaderPreview = { name: string, 
/**
 * The first [`HEADER_PREVIEW_CHARS`] characters of the value, escaped.
 */
value: string, 
/**
 * The value's length in bytes.
 */
size: number, 
/**
 * blake3 of the exact value bytes, lowercase hex.
 */
digest: string, truncated: boolean, 
/**
 * Why this header changes what the request means (a method override, forwarding or
 * identity, a cookie); the card lists these first.
 */
flag?: string | null, };

export type ApprovalCard = { invocation_id: string, 
/**
 * `per_call`, `session` (approving covers this agent session) or `host_key` (first
 * connection to an SSH host: approving pins the key).
 */
mode: string, target: string, summary: string, method: string | null, url: string | null, body: BodyPreview | null, ssh_destination: string | null, command: string | null, host_key: string | null, 
/**
 * The addresses the host resolved to when the card was built (a refused one is
 * marked; the broker checks again at connect time).
 */
resolved: string | null, 
/**
 * The HTTP proxy (`host:port`) the request goes through; the proxy, not the
 * broker, resolves the host then.
 */
proxy: string | null, 
/**
 * What to look at first: flagged headers, a script fed to an interpreter on stdin.
 */
cautions: Array<string>, 
/**
 * What approving covers: one send and its safe resends, a session, a host key.
 */
covers: string, 
/**
 * HTTP: every header the agent supplied, in the order sent.
 */
headers: Array<HeaderPreview>, 
/**
 * HTTP: what the broker adds (host, framing, coding, the credential by id, the
 * idempotency key).
 */
added: Array<string>, 
/**
 * SSH: the command's standard input.
 */
stdin: BodyPreview | null, credential_id: string, credential_version: string, injection_mode: string, idempotency_key: string | null, 
/**
 * The full fingerprint the approval binds; Approve sends it back.
 */
fingerprint: string, requested_at_ms: number, expires_at_ms: number, 
/**
 * The live session (how long it has run, open connections); not part of the card's
 * digest. Unknown when the session has no live registry entry.
 */
agent: AgentCard | null, 
/**
 * The agent as its SESSION_OPENED record describes it: the identity this card shows
 * and its digest binds. Absent when the journal has no record of the session.
 */
recorded_agent: RecordedAgent | null, 
/**
 * The digest of exactly what this card shows; Approve and Deny send it back, and the
 * journal records it with the request and the answer.
 */
card_digest: string, };

export type Decision = "approve" | "deny";

export type ActivityRow = { id: string, accepted_seq: number, accepted_at_ms: number, session: string | null, target: string, summary: string, phase: Phase, outcome: Outcome, retry: Retry, code: Code | null, };

export type ActivityFilter = { session: string | null, target: string | null, phase: Phase | null, outcome: Outcome | null, code: Code | null, since_ms: number | null, until_ms: number | null, 
/**
 * Searched in target and URL (or SSH host and command digest).
 */
text: string | null, };

export type ActivityPage = { rows: Array<ActivityRow>, 
/**
 * Pass as `before_seq` for the next page; `null` when this was the last.
 */
next_before_seq: number | null, 
/**
 * Server-side time of this query, in microseconds.
 */
took_us: number, };

export type ExportFormat = "jsonl" | "csv";

export type ExportResult = { path: string, rows: number, };

export type SessionSummary = { session: string, invocations: number, first_at_ms: number, last_at_ms: number, 
/**
 * Present while this broker has seen the session (this run).
 */
agent: AgentCard | null, 
/**
 * The agent as the journal recorded it (kept across restarts).
 */
recorded: RecordedAgent | null, };

export type TimelineEvent = { seq: number, at_ms: number, 
/**
 * The journal's event kind, e.g. `DISPATCH_STARTED`.
 */
kind: string, 
/**
 * The step of the lifecycle this belongs to: accepted, validated, approval,
 * authorized, dispatched, response, committed, delivered, failed, retry,
 * reconciled.
 */
step: string, 
/**
 * A short secret-free description of the event's facts.
 */
detail: string, };

export type InvocationDetail = { row: ActivityRow, events: Array<TimelineEvent>, 
/**
 * The envelope an agent gets from `get_invocation` (status, error, evidence), as
 * JSON.
 */
envelope: Record<string, unknown>, 
/**
 * What the durable record proves, in plain sentences.
 */
proves: Array<string>, 
/**
 * What it does not prove.
 */
does_not_prove: Array<string>, 
/**
 * The verdict of the newest retry manifest, if a retry was planned.
 */
manifest_verdict: string | null, 
/**
 * The target has a `[http.reconcile]` query the console can run.
 */
can_query: boolean, 
/**
 * The outcome is unknown and nothing has settled it yet.
 */
unsettled: boolean, 
/**
 * How it was settled, if it was: `remote_query` or `operator_attested`, with the
 * settlement, who and when.
 */
settlement: Reconciliation | null, 
/**
 * The agent of the invocation's session, from the journal.
 */
agent: RecordedAgent | null, 
/**
 * The approval card recorded for it and whether the answer matched it.
 */
approval: ApprovalProof | null, 
/**
 * The invocation it was started for and the ones started for it (followed
 * redirects, a 202's job, job polls, reconcile queries), parent first.
 */
related: Array<RelatedInvocation>, 
/**
 * For a job invocation: the job and its last reported state.
 */
job: JobFacts | null, 
/**
 * For a batch: each member's outcome, in request order.
 */
members: Array<MemberState>, };

export type Relation = "redirect" | "job" | "job_poll" | "reconcile_query";

export type RelatedInvocation = { 
/**
 * `parent` (the shown one was started for it) or `child`.
 */
role: string, invocation_id: string, relation: Relation, };

export type JobState = "pending" | "succeeded" | "failed" | "unreported";

export type JobFacts = { 
/**
 * The submission whose 202 queued it.
 */
submission: string, 
/**
 * The job's id in the remote system, when the contract says where to find it.
 */
job_id: string | null, 
/**
 * Where its status is read.
 */
status_resource: string, 
/**
 * The status resource lies under the submission's target, so the broker may read
 * it with that target's credential; otherwise it is recorded and never read.
 */
pollable: boolean, state: JobState, polls: number, 
/**
 * The job_poll invocation that last read the status.
 */
last_poll: string | null, };

export type ConfidenceSource = "transport_observed" | "remote_response" | "remote_query" | "operator_attested";

export type MemberState = { id: string, outcome: Outcome, 
/**
 * The per-member status a response reported, as text.
 */
status?: string | null, 
/**
 * How the member's outcome became known (absent while it is unknown).
 */
settled_by?: ConfidenceSource | null, };

export type Settlement = "committed" | "not_applied";

export type Reconciliation = { 
/**
 * `remote_query` or `operator_attested`.
 */
source: ConfidenceSource, settlement: Settlement, by: string, note: string, 
/**
 * When it was recorded (unix ms).
 */
at_ms: number, };

export type Attestation = { invocation_id: string, 
/**
 * `committed` or `not_applied`.
 */
settlement: string, 
/**
 * Required: what the operator checked.
 */
note: string, };

export type PeerIncidentRow = { invocation_id: string, 
/**
 * The PEER_INCIDENT record's journal sequence and time (unix ms).
 */
seq: number, at_ms: number, 
/**
 * `policy` (a signed denial), `contract_violation` (answers without a verifiable
 * attestation) or `transient_exhaustion` (the peer stayed unavailable).
 */
kind: string, 
/**
 * `peering_owner`, `peer_operator` or `local_operator`.
 */
owner: string, 
/**
 * The peer's name in `[[peer]]`, and the capability called.
 */
peer: string, capability: string, 
/**
 * The code the invocation stopped with.
 */
code: Code, 
/**
 * What checking the last attestation against the peer's pinned key found:
 * `verified`, `absent`, `failed` or `not_applicable` (a transport error).
 */
signature: string, attestation_digest: string | null, 
/**
 * The last attestation as received (verified or not), as JSON.
 */
attestation: Record<string, unknown> | null, 
/**
 * Answers the call received, and the budgets they spent.
 */
answers: number, transient_used: number, unknown_used: number, 
/**
 * The invocation's envelope as an agent reads it (seed 000: `invocation_id`,
 * `error`, `evidence` with what the peer proved).
 */
envelope: Record<string, unknown>, };

export type CredentialCard = { id: string, kind: string, version: string, created_at_ms: number, rotated_at_ms: number | null, last_used_ms: number | null, 
/**
 * Targets that name this credential.
 */
used_by: Array<string>, };

export type SetCredential = { id: string, 
/**
 * `token`, `password`, `basic` or `ssh_key`.
 */
kind: string, secret: string, 
/**
 * For an encrypted SSH private key: used once to decrypt it, never stored.
 */
passphrase: string | null, };

export type TargetCard = { name: string, 
/**
 * `http` or `ssh`.
 */
channel: string, 
/**
 * Base URL, or `user@host:port`.
 */
location: string, credential: string, 
/**
 * `none`, `session` or `per_call`.
 */
approval: string, 
/**
 * Only confined sessions (agents started with `postern shield`) may call it.
 */
require_confined: boolean, 
/**
 * The normalized-config digest bound into fingerprints: changes with every edit.
 */
version: string, 
/**
 * The target's table as written in the config file, for editing.
 */
toml: string, };

export type TargetList = { config_path: string, targets: Array<TargetCard>, };

export type TargetEdit = { name: string, 
/**
 * The new text of the target's table (the `[[http]]` or `[[ssh]]` block).
 */
toml: string, };

export type IntegrityState = { 
/**
 * `verified` (every event signed and checked), `unsigned` (events past the last
 * checkpoint: never shown as verified), `empty`, `failed` or `checking`.
 */
state: string, 
/**
 * Verified through this sequence.
 */
through_seq: number | null, checked_at_ms: number | null, events: number, checkpoints: number, 
/**
 * The exact failure, when the chain does not verify.
 */
failure: string | null, first_bad_seq: number | null, 
/**
 * Events after the last signed checkpoint.
 */
unsigned_events: number, 
/**
 * Ranges a previous run ended without signing, signed at the next start.
 */
notes: Array<string>, 
/**
 * `full` (the whole file, with the anchor outside the data dir) or `incremental`
 * (only what came since the last full check).
 */
scope: string, 
/**
 * Witnesses whose cosigned tree heads the last full check held the journal to.
 */
witnesses: number, 
/**
 * What a verified journal proves and against whom (who could have signed it, how
 * many witnesses hold it); absent until it verifies.
 */
assurance: string | null, };

export type ErrorCode = "INVALID_INPUT" | "JOURNAL_UNREADABLE" | "JOURNAL_REFUSED" | "NOT_PENDING" | "CARD_CHANGED" | "UNKNOWN_INVOCATION" | "NOT_UNKNOWN" | "NO_RECONCILE_QUERY" | "RECONCILE_INCONCLUSIVE" | "EXPORT_FAILED" | "CONFIG_UNREADABLE" | "CONFIG_INVALID" | "INTERNAL" | "UNKNOWN_COMMAND" | "OPERATOR_REFUSED" | "OPERATOR_UNREACHABLE" | Code;

export type CommandError = { code: ErrorCode, message: string, 
/**
 * The input field the error is about, when there is one.
 */
field: string | null, };

export type ApprovalsChanged = { pending: Array<ApprovalCard>, };

export type JournalChanged = { last_seq: number, };

export type AgentPauseState = { paused: boolean, };

/** Sends one operator command through the app's one command, `operator`. */
function operator<T>(command: string, args: Record<string, unknown>): Promise<T> {
  return invoke<T>("operator", { request: { command, args } });
}

/** Every console command, typed. Errors reject with a `CommandError`. */
export const commands = {
  overview: (): Promise<Overview> => operator<Overview>("overview", {}),
  listApprovals: (): Promise<Array<ApprovalCard>> => operator<Array<ApprovalCard>>("list_approvals", {}),
  answerApproval: (invocationId: string, fingerprint: string, cardDigest: string, decision: Decision): Promise<null> => operator<null>("answer_approval", { invocationId, fingerprint, cardDigest, decision }),
  listSessions: (): Promise<Array<SessionSummary>> => operator<Array<SessionSummary>>("list_sessions", {}),
  sessionTimeline: (session: string): Promise<Array<InvocationDetail>> => operator<Array<InvocationDetail>>("session_timeline", { session }),
  queryActivity: (filter: ActivityFilter, beforeSeq: number | null, limit: number): Promise<ActivityPage> => operator<ActivityPage>("query_activity", { filter, beforeSeq, limit }),
  exportActivity: (filter: ActivityFilter, format: ExportFormat): Promise<ExportResult> => operator<ExportResult>("export_activity", { filter, format }),
  invocationDetail: (invocationId: string): Promise<InvocationDetail> => operator<InvocationDetail>("invocation_detail", { invocationId }),
  needsReconciliation: (): Promise<Array<InvocationDetail>> => operator<Array<InvocationDetail>>("needs_reconciliation", {}),
  runReconcileQuery: (invocationId: string): Promise<InvocationDetail> => operator<InvocationDetail>("run_reconcile_query", { invocationId }),
  attestOutcome: (attestation: Attestation): Promise<InvocationDetail> => operator<InvocationDetail>("attest_outcome", { attestation }),
  peerIncidents: (): Promise<Array<PeerIncidentRow>> => operator<Array<PeerIncidentRow>>("peer_incidents", {}),
  listCredentials: (): Promise<Array<CredentialCard>> => operator<Array<CredentialCard>>("list_credentials", {}),
  setCredential: (credential: SetCredential): Promise<CredentialCard> => operator<CredentialCard>("set_credential", { credential }),
  removeCredential: (id: string): Promise<null> => operator<null>("remove_credential", { id }),
  listTargets: (): Promise<TargetList> => operator<TargetList>("list_targets", {}),
  updateTarget: (edit: TargetEdit): Promise<TargetCard> => operator<TargetCard>("update_target", { edit }),
  integrity: (recheck: boolean): Promise<IntegrityState> => operator<IntegrityState>("integrity", { recheck }),
  pauseAgents: (): Promise<AgentPauseState> => operator<AgentPauseState>("pause_agents", {}),
  resumeAgents: (): Promise<AgentPauseState> => operator<AgentPauseState>("resume_agents", {}),
};

/** Backend events and their payloads. */
export const events = {
  approvalsChanged: (handler: (payload: ApprovalsChanged) => void): Promise<UnlistenFn> =>
    listen<ApprovalsChanged>("approvals-changed", (e) => handler(e.payload)),
  journalChanged: (handler: (payload: JournalChanged) => void): Promise<UnlistenFn> =>
    listen<JournalChanged>("journal-changed", (e) => handler(e.payload)),
  integrityChanged: (handler: (payload: IntegrityState) => void): Promise<UnlistenFn> =>
    listen<IntegrityState>("integrity-changed", (e) => handler(e.payload)),
  pauseChanged: (handler: (payload: AgentPauseState) => void): Promise<UnlistenFn> =>
    listen<AgentPauseState>("pause-changed", (e) => handler(e.payload)),
};

//! The contract's closed vocabulary: `Phase`, `Outcome`, `Retry`, `Code` (with each code's
//! spec), the `error` member of an envelope, and a batch member's state. Callers branch
//! on these and never parse `message`.

use serde::{Deserialize, Serialize};

/// Where the broker stopped. Diagnostic, not a retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Rejected before the broker selected or used a secret.
    Validation,
    /// The credential could not be obtained, authorized or attached.
    CredentialInjection,
    /// DNS, TCP, TLS, SSH transport, host verification or remote authentication failed.
    ConnectionSetup,
    /// The operation was dispatched; the broker is waiting for or received its result.
    RemoteExecution,
    /// The remote result is recorded but could not be returned intact to the caller.
    ResultDelivery,
}

/// What the broker knows about remote execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Durable evidence shows the operation did not cross the dispatch boundary.
    NotAttempted,
    /// The remote returned a complete, authoritative refusal and did not claim success.
    Rejected,
    /// The broker has a complete, authoritative result (which need not be a success).
    Committed,
    /// Dispatch may have happened and no complete result settles the operation.
    Unknown,
}

/// What the caller may safely do next, computed by the broker from evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retry {
    Never,
    AfterCorrection,
    Backoff,
    SameIdempotencyKey,
    Reconcile,
    FetchResult,
}

/// Why an outcome is what it is: how the broker came to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum ConfidenceSource {
    /// The broker's own transport saw it (a refused connect, a closed socket).
    TransportObserved,
    /// A complete, authenticated response from the intended remote.
    RemoteResponse,
    /// A later, separate query of remote state (reconciliation).
    RemoteQuery,
    /// A person checked the remote system and said so.
    OperatorAttested,
}

/// A connection-setup stage, recorded per attempt so a caller can tell a bad hostname
/// from rejected credentials without seeing a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Dns,
    /// The resolved-address guard, between DNS and TCP connect.
    AddressGuard,
    TcpConnect,
    TlsHandshake,
    /// The CONNECT tunnel through an HTTP proxy: TCP to the proxy and its answer.
    ProxyTunnel,
    SshKex,
    HostKey,
    UserAuth,
    ChannelOpen,
}

macro_rules! codes {
    ($( $(#[$doc:meta])* $name:ident = $wire:literal, $phase:expr, $outcome:expr, $retry:ident, $meaning:literal; )*) => {
        /// A stable machine code. The wire form is SCREAMING_SNAKE; `docs/errors.md` is
        /// generated from [`Code::ALL`] and a test fails if the two drift apart.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum Code {
            $( $(#[$doc])* #[serde(rename = $wire)] $name, )*
        }

        impl Code {
            /// Every code, in table order.
            pub const ALL: &'static [Code] = &[$(Code::$name),*];

            /// The wire form, e.g. `"REMOTE_OUTCOME_UNKNOWN"`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$name => $wire,)* }
            }

            /// The phase, outcome and retry this code carries by default, and what it
            /// means. The envelope's outcome always comes from the journal projection;
            /// these defaults are what the table documents.
            pub fn spec(self) -> CodeSpec {
                match self {
                    $(Code::$name => CodeSpec {
                        phase: $phase,
                        outcome: $outcome,
                        retry: Retry::$retry,
                        meaning: $meaning,
                    },)*
                }
            }
        }
    };
}

/// The documented defaults of one [`Code`]. `None` means "as the record shows": a
/// cancellation or an interrupted broker carries the phase reached and the outcome the
/// evidence supports (not_attempted before dispatch, unknown after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeSpec {
    pub phase: Option<Phase>,
    pub outcome: Option<Outcome>,
    pub retry: Retry,
    pub meaning: &'static str,
}

// Shorthands for the table below.
const V: Option<Phase> = Some(Phase::Validation);
const CI: Option<Phase> = Some(Phase::CredentialInjection);
const CS: Option<Phase> = Some(Phase::ConnectionSetup);
const RE: Option<Phase> = Some(Phase::RemoteExecution);
const RD: Option<Phase> = Some(Phase::ResultDelivery);
const REACHED: Option<Phase> = None;
const NA: Option<Outcome> = Some(Outcome::NotAttempted);
const REJ: Option<Outcome> = Some(Outcome::Rejected);
const COM: Option<Outcome> = Some(Outcome::Committed);
const UNK: Option<Outcome> = Some(Outcome::Unknown);
const FROM_EVIDENCE: Option<Outcome> = None;

codes! {
    InvalidTarget = "INVALID_TARGET", V, NA, AfterCorrection,
        "The URL or host does not fall under exactly one configured target.";
    InvalidRequest = "INVALID_REQUEST", V, NA, AfterCorrection,
        "A required action field is missing or malformed; the field path says which.";
    UnsupportedAction = "UNSUPPORTED_ACTION", V, NA, AfterCorrection,
        "The method or action is not allowed for this target.";
    ConfinementRequired = "CONFINEMENT_REQUIRED", V, NA, AfterCorrection,
        "The target takes calls only from confined sessions (an agent started with `postern shield`) and this session is not confined; nothing was read or sent.";
    PayloadLimit = "PAYLOAD_LIMIT", V, NA, AfterCorrection,
        "A body, header or command exceeds the configured size limit.";
    ForbiddenHeader = "FORBIDDEN_HEADER", V, NA, AfterCorrection,
        "The agent tried to set a header the broker owns (authorization, host, framing, the injection header).";
    IdempotencyMismatch = "IDEMPOTENCY_MISMATCH", V, NA, AfterCorrection,
        "An idempotency key was reused with a different request fingerprint; nothing was sent.";
    FingerprintMismatch = "FINGERPRINT_MISMATCH", V, NA, AfterCorrection,
        "The request or its bound configuration changed after approval; nothing was sent.";
    LeaseLost = "LEASE_LOST", V, NA, Never,
        "This attempt's lease expired and another attempt holds the invocation; this one stopped before dispatch.";
    BrokerUnavailable = "BROKER_UNAVAILABLE", V, NA, Backoff,
        "The broker is not running or its journal cannot be written; nothing was sent.";
    VaultLocked = "VAULT_LOCKED", CI, NA, AfterCorrection,
        "The OS keychain is locked or unreachable; unlock it and retry.";
    CredentialMissing = "CREDENTIAL_MISSING", CI, NA, AfterCorrection,
        "The target's credential is not in the keychain; add it with `postern vault set`.";
    UnsupportedInjection = "UNSUPPORTED_INJECTION", CI, NA, AfterCorrection,
        "The credential cannot be attached in the configured injection mode.";
    KeyDecryptionFailed = "KEY_DECRYPTION_FAILED", CI, NA, AfterCorrection,
        "The stored credential could not be decoded into a usable key.";
    ApprovalDenied = "APPROVAL_DENIED", CI, NA, Never,
        "A person denied this invocation; do not repeat it.";
    ApprovalTimeout = "APPROVAL_TIMEOUT", CI, NA, AfterCorrection,
        "Nobody answered the approval request in time; nothing was sent.";
    NoApprover = "NO_APPROVER", CI, NA, AfterCorrection,
        "The target needs approval and no approval console is attached; nothing was sent.";
    DnsFailed = "DNS_FAILED", CS, NA, Backoff,
        "The host name did not resolve; nothing was sent.";
    AddressRefused = "ADDRESS_REFUSED", CS, NA, AfterCorrection,
        "The host resolved to an address Postern refuses (cloud metadata, link-local, or an internal address the target does not allow); no connection was made.";
    ConnectionRefused = "CONNECTION_REFUSED", CS, NA, Backoff,
        "The TCP connection was refused or unreachable; nothing was sent.";
    ConnectTimeout = "CONNECT_TIMEOUT", CS, NA, Backoff,
        "Connection setup did not finish in time; nothing was sent.";
    ProxyUnreachable = "PROXY_UNREACHABLE", CS, NA, Backoff,
        "No connection to the target's HTTP proxy (its name did not resolve, or TCP to it was refused or unreachable); nothing was sent.";
    ProxyRefused = "PROXY_REFUSED", CS, NA, AfterCorrection,
        "The HTTP proxy answered CONNECT with a non-2xx status: the proxy's answer, not the origin's, and nothing was sent to the origin. Retry is after_correction for 407 (proxy credentials), 403 and other 4xx (proxy policy); backoff for 408, 429 and 5xx (502/503/504: the proxy could not reach the origin or is overloaded).";
    ProxyTunnelFailed = "PROXY_TUNNEL_FAILED", CS, NA, Backoff,
        "The HTTP proxy closed or broke the CONNECT exchange before a complete answer (or answered with something that is not HTTP); nothing was sent to the origin.";
    TlsRejected = "TLS_REJECTED", CS, NA, AfterCorrection,
        "The server's TLS certificate failed verification (untrusted, expired or wrong name); nothing was sent.";
    HostKeyMismatch = "HOST_KEY_MISMATCH", CS, NA, AfterCorrection,
        "The SSH host key does not match the pinned key; nothing was sent.";
    HostKeyUnknown = "HOST_KEY_UNKNOWN", CS, NA, AfterCorrection,
        "The SSH host key is not pinned and needs a first-seen approval; nothing was sent.";
    SshHandshakeFailed = "SSH_HANDSHAKE_FAILED", CS, NA, Backoff,
        "SSH key exchange failed; nothing was sent.";
    SshAuthFailed = "SSH_AUTH_FAILED", CS, NA, AfterCorrection,
        "The SSH server refused the user key; nothing was sent.";
    ChannelOpenFailed = "CHANNEL_OPEN_FAILED", CS, NA, Backoff,
        "The SSH session channel could not be opened; no command was requested.";
    RemoteOutcomeUnknown = "REMOTE_OUTCOME_UNKNOWN", RE, UNK, Reconcile,
        "The request was dispatched and no complete response settles it; the remote may have acted.";
    RemoteResultIncomplete = "REMOTE_RESULT_INCOMPLETE", RE, UNK, Reconcile,
        "A response started but did not complete (short body, broken framing, no exit status); it is not a result.";
    RemoteTimeout = "REMOTE_TIMEOUT", RE, UNK, Reconcile,
        "No complete response arrived in time after dispatch; the remote may still be running.";
    CallerCancelled = "CALLER_CANCELLED", REACHED, FROM_EVIDENCE, Reconcile,
        "The caller cancelled. After dispatch the remote may still be running; before dispatch the record says not_attempted.";
    ExecRefused = "EXEC_REFUSED", RE, REJ, AfterCorrection,
        "The SSH server refused the exec request (channel failure); the command did not start.";
    RemoteRejected = "REMOTE_REJECTED", RE, REJ, AfterCorrection,
        "A complete response refused the request (for example HTTP 4xx).";
    RemoteUnauthorized = "REMOTE_UNAUTHORIZED", RE, REJ, AfterCorrection,
        "A complete response refused the credentials (HTTP 401/403); repeating with the same credential is pointless.";
    RemoteRateLimited = "REMOTE_RATE_LIMITED", RE, REJ, Backoff,
        "A complete response asked the caller to slow down (HTTP 429/503 with Retry-After).";
    RemoteServerError = "REMOTE_SERVER_ERROR", RE, COM, Reconcile,
        "A complete server-error response (HTTP 5xx): the application answered and may have changed state first.";
    JobPending = "JOB_PENDING", RE, UNK, Reconcile,
        "The job an HTTP 202 queued has not reported completion; read its status with poll_job, never by submitting again.";
    JobFailed = "JOB_FAILED", RE, COM, Reconcile,
        "The job's status resource reported failure; the job ran and may have partly acted, so check remote state before submitting again.";
    BatchPartial = "BATCH_PARTIAL", RE, COM, Never,
        "A complete batch response settled only some members; each member carries its own outcome and retry. Never resend the whole batch.";
    ResultDeliveryFailed = "RESULT_DELIVERY_FAILED", RD, COM, FetchResult,
        "The settled result is stored but could not be returned; read it with fetch_result, never by re-running.";
    ResultStoreFailed = "RESULT_STORE_FAILED", RD, FROM_EVIDENCE, Never,
        "A complete response arrived but its result could not be stored (a full disk, say); the operator console raises an alert. With the completion recorded the outcome is what the response settled (committed or rejected) and the result is lost, never re-run; if even that record failed the outcome is unknown and retry comes from the record.";
    ResultExpired = "RESULT_EXPIRED", RD, FROM_EVIDENCE, Never,
        "The stored result was removed by the retention policy (`[results] max_age` or `max_bytes`); the outcome stays as recorded and the action is never re-run to rebuild it.";
    ReconciledCommitted = "RECONCILED_COMMITTED", RE, COM, Never,
        "Reconciliation (remote query or operator attestation) settled an unknown outcome as applied.";
    BrokerInterrupted = "BROKER_INTERRUPTED", REACHED, FROM_EVIDENCE, Reconcile,
        "The broker stopped before this invocation finished. Before dispatch it is not_attempted (retry backoff); after dispatch the outcome is unknown.";
    ReconciledNotApplied = "RECONCILED_NOT_APPLIED", RE, REJ, Backoff,
        "Reconciliation settled an unknown outcome as not applied; a new attempt is allowed.";
    PeerDenied = "PEER_DENIED", RE, NA, Never,
        "The peer broker's policy refused the call with a signed, verified denial: it attests it did not run it. Terminal: never retried, no failover; a policy incident goes to the peering owner.";
    PeerUnavailable = "PEER_UNAVAILABLE", REACHED, FROM_EVIDENCE, Backoff,
        "The peer broker stayed unavailable (signed `unavailable` answers, or transport errors such as HTTP 429, a timeout or a reset) through the retry budget; a transient-exhaustion incident goes to the local operator. not_attempted when nothing was dispatched or the peer's last signed answer attests it did not run; unknown when the last answer was a transport error after dispatch (a retry reuses the invocation, which the peer runs at most once).";
    PeerContractViolation = "PEER_CONTRACT_VIOLATION", RE, FROM_EVIDENCE, Reconcile,
        "The peer broker answered without a verifiable attestation (no envelope, a bad or foreign signature, or one about another request) through the limited retries. Never read as a denial; a contract-violation incident goes to the peer's operator. Unknown once dispatched: reconcile.";
    PeerPolicyChanged = "PEER_POLICY_CHANGED", RE, FROM_EVIDENCE, AfterCorrection,
        "The peer's export policy version changed during the attempt, which was abandoned. The outcome is what the peer's signed answer says it did; list the targets again before a new request.";
    PeerOutcomeUnknown = "PEER_OUTCOME_UNKNOWN", RE, UNK, Reconcile,
        "The peer broker ran the call and its own record says the outcome is unknown; it is reconciled on the peer, and the settlement comes back signed.";
    AgentsPaused = "AGENTS_PAUSED", V, NA, Backoff,
        "The operator paused agent calls (from the console's tray or `postern operator pause`); nothing was recorded or sent. Retry later: calls run again once the operator resumes agents. Reading results and invocations still works while paused.";
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the target publishes an idempotency contract the broker may rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteContract {
    /// The operator configured the API's documented de-duplication contract.
    Configured,
    /// No contract: a key alone proves nothing.
    None,
}

/// One member of a batch: its outcome and what settled it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS))]
pub struct MemberState {
    pub id: String,
    #[cfg_attr(feature = "ts", ts(type = "Outcome"))]
    pub outcome: Outcome,
    /// The per-member status a response reported, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// How the member's outcome became known (absent while it is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_by: Option<ConfidenceSource>,
}

/// Why a step before dispatch could not go on; nothing was sent.
#[derive(Debug, Clone)]
pub struct Failure {
    pub phase: Phase,
    pub code: Code,
    pub retry: Retry,
    pub message: String,
}

/// The `error` member of the envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: Code,
    pub phase: Phase,
    pub outcome: Outcome,
    pub retry: Retry,
    /// A short sentence for a person. Never parse it.
    pub message: String,
}

macro_rules! wire_names {
    ($ty:ident { $($variant:ident => $wire:literal),* $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),*];

            /// The wire form used in JSON and in the journal.
            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $wire,)* }
            }

            /// Parses the wire form; `None` for anything else.
            pub fn parse(s: &str) -> Option<$ty> {
                match s { $($wire => Some($ty::$variant),)* _ => None }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
// The record types' enums name themselves the same way.
pub(crate) use wire_names;

wire_names!(Phase {
    Validation => "validation",
    CredentialInjection => "credential_injection",
    ConnectionSetup => "connection_setup",
    RemoteExecution => "remote_execution",
    ResultDelivery => "result_delivery",
});
wire_names!(Outcome {
    NotAttempted => "not_attempted",
    Rejected => "rejected",
    Committed => "committed",
    Unknown => "unknown",
});
wire_names!(Retry {
    Never => "never",
    AfterCorrection => "after_correction",
    Backoff => "backoff",
    SameIdempotencyKey => "same_idempotency_key",
    Reconcile => "reconcile",
    FetchResult => "fetch_result",
});
wire_names!(ConfidenceSource {
    TransportObserved => "transport_observed",
    RemoteResponse => "remote_response",
    RemoteQuery => "remote_query",
    OperatorAttested => "operator_attested",
});

/// Renders `docs/errors.md` from [`Code::ALL`]; a test keeps the committed file equal.
pub fn errors_table_markdown() -> String {
    let mut out = String::from(
        "# Error codes\n\n\
         Generated from `Code::ALL` in `crates/broker/src/contract/codes.rs`; the test \
         `errors_table_matches_the_code_enum` fails when this file drifts. Regenerate with \
         `POSTERN_BLESS=1 cargo test -p postern-broker --test broker errors_table`.\n\n\
         Phase, outcome and retry are the defaults a code carries. The envelope's outcome \
         always comes from the journal's evidence, and for an unknown outcome the retry \
         comes from `decide()` (idempotent target: `backoff`; configured idempotency \
         contract: `same_idempotency_key`; otherwise `reconcile`). \"as recorded\" means the \
         code carries the phase reached and the outcome the evidence proves.\n\n\
         | code | phase | outcome | default retry | meaning |\n\
         |---|---|---|---|---|\n",
    );
    for code in Code::ALL {
        let spec = code.spec();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            code.as_str(),
            spec.phase.map_or("as recorded", Phase::as_str),
            spec.outcome.map_or("as recorded", Outcome::as_str),
            spec.retry.as_str(),
            spec.meaning,
        ));
    }
    out
}

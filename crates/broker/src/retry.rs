//! The retry decision (a pure function of recorded facts, so it is boring and testable)
//! and the retry manifest: what a caller may do with a recorded invocation, and a
//! digest that binds the evidence the decision used.
//!
//! `decide` consumes the disposition already derived from evidence. It never upgrades an
//! unsafe disposition because a failure looks temporary; it only narrows (a spent budget
//! or an expired idempotency key turns a retry into reconciliation).

use serde::{Deserialize, Serialize};

use crate::canonical::signed_message;
use crate::contract::{Code, Outcome, RemoteContract, Retry};

/// The placeholder a member query's path carries.
pub const MEMBER_ID_PLACEHOLDER: &str = "{member_id}";

/// What to do next with a recorded invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Read the stored result; never re-run.
    Fetch,
    /// Start a new attempt (never dispatched, or known idempotent).
    RetryNewAttempt,
    /// Start a new attempt reusing the same idempotency key and fingerprint.
    RetrySameKey,
    /// Query remote state (or ask an operator) before anything else.
    Reconcile,
    /// The request needs correcting; repeating it unchanged is pointless.
    StopForCorrection,
    /// The remote refused for now; a new attempt is allowed after its delay.
    RetryWhenAllowed,
    /// The result is recorded; return it.
    ReturnRecordedResult,
    /// The retry's fingerprint differs from the recorded one under the same key.
    IdempotencyMismatch,
}

/// The manifest's verdict: why a retry is or is not safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The operation is configured idempotent for this target.
    IdempotentSafe,
    /// Remote state must be (or was) queried before any new attempt.
    QueryFirstRequired,
    /// The remote's configured de-duplication contract covers a same-key retry.
    IdempotencyKeySafe,
    /// The records prove the operation was not applied: never dispatched, or refused by
    /// a complete authoritative response. (The other verdicts are about failures whose
    /// effect was not observed; a broker must still say why a retry of a never-sent
    /// request is safe.)
    NotApplied,
    /// No safe basis: do not repeat.
    Unsafe,
}

impl Verdict {
    /// Every verdict.
    pub const ALL: &'static [Verdict] = &[
        Verdict::IdempotentSafe,
        Verdict::QueryFirstRequired,
        Verdict::IdempotencyKeySafe,
        Verdict::NotApplied,
        Verdict::Unsafe,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::IdempotentSafe => "idempotent_safe",
            Verdict::QueryFirstRequired => "query_first_required",
            Verdict::IdempotencyKeySafe => "idempotency_key_safe",
            Verdict::NotApplied => "not_applied",
            Verdict::Unsafe => "unsafe",
        }
    }
}

impl Decision {
    /// Every decision `decide` can return.
    pub const ALL: &'static [Decision] = &[
        Decision::Fetch,
        Decision::RetryNewAttempt,
        Decision::RetrySameKey,
        Decision::Reconcile,
        Decision::StopForCorrection,
        Decision::RetryWhenAllowed,
        Decision::ReturnRecordedResult,
        Decision::IdempotencyMismatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Fetch => "fetch",
            Decision::RetryNewAttempt => "retry_new_attempt",
            Decision::RetrySameKey => "retry_same_key",
            Decision::Reconcile => "reconcile",
            Decision::StopForCorrection => "stop_for_correction",
            Decision::RetryWhenAllowed => "retry_when_allowed",
            Decision::ReturnRecordedResult => "return_recorded_result",
            Decision::IdempotencyMismatch => "idempotency_mismatch",
        }
    }

    /// Whether this decision starts a new attempt.
    pub fn starts_attempt(self) -> bool {
        matches!(
            self,
            Decision::RetryNewAttempt | Decision::RetrySameKey | Decision::RetryWhenAllowed
        )
    }
}

/// The query that settles an unknown outcome, bound at preflight from the target's
/// `[http.reconcile]` with the invocation's key filled in (seed 003's
/// `source_query_predicate`): what a person or a program runs, and how to read its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceQueryPredicate {
    pub method: String,
    /// Relative to the target's base URL, placeholders filled in.
    pub path: String,
    /// Statuses that prove the operation was applied.
    pub committed_status: Vec<u16>,
    /// Statuses that prove it was not.
    pub not_applied_status: Vec<u16>,
}

impl SourceQueryPredicate {
    /// A batch's member query for one member: `{member_id}` filled in, percent-encoded.
    pub fn for_member(&self, id: &str) -> SourceQueryPredicate {
        SourceQueryPredicate {
            path: self.path.replace(
                MEMBER_ID_PLACEHOLDER,
                &crate::canonical::percent_encode(id.as_bytes()),
            ),
            ..self.clone()
        }
    }

    /// One line for people: `GET /v1/payments/k1 (200 = applied; 404 = not applied)`.
    pub fn describe(&self) -> String {
        let list = |s: &[u16]| s.iter().map(u16::to_string).collect::<Vec<_>>().join("/");
        format!(
            "{} {} ({} = applied; {} = not applied)",
            self.method,
            self.path,
            list(&self.committed_status),
            list(&self.not_applied_status)
        )
    }
}

/// The recorded facts `decide` reads, taken from the journal projection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordFacts {
    pub invocation_id: String,
    /// Sequence of the last event the facts reflect; binds the manifest to a state.
    pub last_seq: u64,
    pub outcome: Outcome,
    pub retry: Retry,
    pub code: Option<Code>,
    pub fingerprint: String,
    pub idempotent: bool,
    pub remote_contract: RemoteContract,
    pub idempotency_key: Option<String>,
    pub idempotency_expires_at_ms: Option<i64>,
    pub reconcile_configured: bool,
    pub attempts_used: u32,
    pub retry_budget: u32,
    /// Earliest time a new attempt is allowed (Retry-After), unix ms.
    pub not_before_ms: Option<i64>,
    /// The bound query that settles an unknown outcome, if the target has one.
    pub source_query: Option<SourceQueryPredicate>,
    /// For a batch: every member, settled or not, in request order.
    pub members: Vec<MemberDisposition>,
}

/// One batch member in a retry manifest: what is settled about it, and for a member
/// whose outcome is unknown the query that settles it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberDisposition {
    pub id: String,
    pub outcome: Outcome,
    /// Present for an unknown member when the target has a member query (and does not
    /// apply batches atomically).
    pub query: Option<SourceQueryPredicate>,
}

/// The operation a caller wants to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryRequest {
    /// The fingerprint of the request as it would be sent now.
    pub fingerprint: String,
}

/// The disposition of an unknown outcome (issue: "idempotent for this target → new
/// attempt allowed; configured idempotency contract → same_idempotency_key; otherwise
/// reconcile"). A key past its retention window only supports reconciliation.
pub fn disposition_for_unknown(
    idempotent: bool,
    remote_contract: RemoteContract,
    idempotency_expires_at_ms: Option<i64>,
    has_key: bool,
    now_ms: i64,
) -> Retry {
    if idempotent {
        return Retry::Backoff;
    }
    let key_alive = idempotency_expires_at_ms.is_none_or(|expiry| now_ms < expiry);
    if remote_contract == RemoteContract::Configured && has_key && key_alive {
        return Retry::SameIdempotencyKey;
    }
    Retry::Reconcile
}

/// `decide(record, operation)`: repeat only on a recorded safe basis (never dispatched,
/// idempotent by configuration, or the same key under a configured de-duplication
/// contract that has not expired), within the retry budget.
pub fn decide(record: &RecordFacts, request: &RetryRequest, now_ms: i64) -> Decision {
    if record.retry == Retry::FetchResult {
        return Decision::Fetch;
    }
    let budget_left = record.attempts_used < record.retry_budget;
    match record.outcome {
        Outcome::NotAttempted => {
            if record.retry == Retry::Backoff && budget_left {
                Decision::RetryNewAttempt
            } else {
                Decision::StopForCorrection
            }
        }
        Outcome::Unknown => {
            if !budget_left {
                return Decision::Reconcile;
            }
            if record.idempotent {
                return Decision::RetryNewAttempt;
            }
            if record.retry == Retry::SameIdempotencyKey {
                if request.fingerprint != record.fingerprint {
                    return Decision::IdempotencyMismatch;
                }
                let alive = record
                    .idempotency_expires_at_ms
                    .is_none_or(|expiry| now_ms < expiry);
                if alive && record.remote_contract == RemoteContract::Configured {
                    return Decision::RetrySameKey;
                }
            }
            Decision::Reconcile
        }
        Outcome::Rejected if record.retry == Retry::Backoff && budget_left => {
            Decision::RetryWhenAllowed
        }
        Outcome::Rejected | Outcome::Committed => Decision::ReturnRecordedResult,
    }
}

/// The retry manifest: the verdict, a directive for people, the facts the decision
/// read (including the bound source query), a digest binding them (the retry safety
/// proof) and the broker's signature over that digest, so a party holding only the
/// broker's public key (`postern audit key`) can check it. Appended to the journal
/// before any retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryManifest {
    pub invocation_id: String,
    pub for_generation: u32,
    pub decision: Decision,
    pub verdict: Verdict,
    pub directive: String,
    /// The query to run before any retry (seed 003's `source_query_predicate`), when
    /// the target configures one.
    pub source_query_predicate: Option<SourceQueryPredicate>,
    /// The facts the decision was taken on; the digest covers every one of them.
    pub facts: RecordFacts,
    /// When the decision was taken (unix ms); covered by the digest.
    pub made_at_ms: i64,
    /// `blake3:` + hex over the canonical encoding of the facts and the decision
    /// ([`manifest_digest`]).
    pub digest: String,
    /// The signing broker's ed25519 public key, hex.
    pub public_key: String,
    /// ed25519 signature, hex, over [`MANIFEST_SIGNING_CONTEXT`] followed by `digest`.
    pub signature: String,
}

/// What the broker's signature on a manifest covers, before the digest.
pub const MANIFEST_SIGNING_CONTEXT: &[u8] = b"postern retry-manifest signature v2\n";

/// Builds and signs the manifest for a decision taken on `record`.
pub fn manifest(
    record: &RecordFacts,
    decision: Decision,
    for_generation: u32,
    now_ms: i64,
    key: &ed25519_dalek::SigningKey,
) -> RetryManifest {
    use ed25519_dalek::Signer;
    let (verdict, directive) = verdict_for(record, decision);
    let mut directive = match (&record.source_query, verdict) {
        (Some(q), Verdict::QueryFirstRequired) if decision == Decision::Reconcile => {
            format!("{directive} Query: {}.", q.describe())
        }
        _ => directive.to_string(),
    };
    if !record.members.is_empty() {
        directive.push(' ');
        directive.push_str(&members_line(&record.members));
    }
    let digest = manifest_digest(
        record,
        decision,
        verdict,
        &directive,
        for_generation,
        now_ms,
    );
    let signature = key.sign(&signed_message(MANIFEST_SIGNING_CONTEXT, &digest));
    RetryManifest {
        invocation_id: record.invocation_id.clone(),
        for_generation,
        decision,
        verdict,
        directive,
        source_query_predicate: record.source_query.clone(),
        facts: record.clone(),
        made_at_ms: now_ms,
        digest,
        public_key: hex::encode(key.verifying_key().to_bytes()),
        signature: hex::encode(signature.to_bytes()),
    }
}

/// `Batch members: 3 applied, 1 not applied, 1 unknown (query each before resending
/// it; resend only members not applied).`
fn members_line(members: &[MemberDisposition]) -> String {
    let count = |o: Outcome| members.iter().filter(|m| m.outcome == o).count();
    let unknown = count(Outcome::Unknown);
    let advice = if unknown == 0 {
        "resend only members not applied, as a new request"
    } else if members.iter().any(|m| m.query.is_some()) {
        "query each unknown member before resending it; resend only members not applied"
    } else {
        "an operator must check the unknown members; resend only members not applied"
    };
    format!(
        "Batch members: {} applied, {} not applied, {unknown} unknown ({advice}).",
        count(Outcome::Committed),
        count(Outcome::Rejected) + count(Outcome::NotAttempted),
    )
}

/// Why a manifest does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error(
        "the manifest's digest does not match its facts and decision: it was changed after it was made"
    )]
    DigestMismatch,
    #[error("the manifest was signed by {found}, not by the expected broker key {expected}")]
    WrongKey { expected: String, found: String },
    #[error("the manifest's public key or signature is not valid hex of the right length")]
    Malformed,
    #[error("the broker's signature on the manifest does not verify")]
    BadSignature,
    #[error("the manifest's invocation or generation differs from its facts")]
    Inconsistent,
}

/// Checks a manifest as another party would: recomputes the digest from the facts and
/// decision it carries, and verifies the signature with `expected` (the broker's public
/// key), or with the key the manifest names when `expected` is `None`.
pub fn verify_manifest(
    m: &RetryManifest,
    expected: Option<&ed25519_dalek::VerifyingKey>,
) -> Result<(), ManifestError> {
    if m.facts.invocation_id != m.invocation_id || m.source_query_predicate != m.facts.source_query
    {
        return Err(ManifestError::Inconsistent);
    }
    let digest = manifest_digest(
        &m.facts,
        m.decision,
        m.verdict,
        &m.directive,
        m.for_generation,
        m.made_at_ms,
    );
    if digest != m.digest {
        return Err(ManifestError::DigestMismatch);
    }
    let key_bytes: [u8; 32] = hex::decode(&m.public_key)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(ManifestError::Malformed)?;
    let sig_bytes: [u8; 64] = hex::decode(&m.signature)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(ManifestError::Malformed)?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&key_bytes)
        .map_err(|_| ManifestError::Malformed)?;
    if let Some(expected) = expected
        && expected.to_bytes() != key_bytes
    {
        return Err(ManifestError::WrongKey {
            expected: hex::encode(expected.to_bytes()),
            found: m.public_key.clone(),
        });
    }
    let signature = ed25519_dalek::Signature::from_bytes(&sig_bytes);
    key.verify_strict(
        &signed_message(MANIFEST_SIGNING_CONTEXT, &m.digest),
        &signature,
    )
    .map_err(|_| ManifestError::BadSignature)
}

fn verdict_for(record: &RecordFacts, decision: Decision) -> (Verdict, &'static str) {
    match decision {
        Decision::RetryNewAttempt if record.outcome == Outcome::NotAttempted => (
            Verdict::NotApplied,
            "PROCEED: the records prove the request never crossed dispatch.",
        ),
        Decision::RetryNewAttempt => (
            Verdict::IdempotentSafe,
            "PROCEED: the target declares this operation idempotent.",
        ),
        Decision::RetrySameKey => (
            Verdict::IdempotencyKeySafe,
            "PROCEED: retry with the same idempotency key; the remote de-duplicates it.",
        ),
        Decision::RetryWhenAllowed if record.code == Some(Code::ReconciledNotApplied) => (
            Verdict::QueryFirstRequired,
            "PROCEED: reconciliation confirmed the operation was not applied.",
        ),
        Decision::RetryWhenAllowed => (
            Verdict::NotApplied,
            "PROCEED AFTER DELAY: the remote refused this request and asked for a later retry.",
        ),
        Decision::Reconcile if record.reconcile_configured => (
            Verdict::QueryFirstRequired,
            "HALT: query the remote state before any retry; the outcome is unknown.",
        ),
        Decision::Reconcile => (
            Verdict::Unsafe,
            "HALT: the outcome is unknown and no safe retry basis exists; an operator must check the remote system.",
        ),
        Decision::Fetch => (
            Verdict::Unsafe,
            "HALT: the result is recorded; read it with fetch_result, never by re-running.",
        ),
        Decision::StopForCorrection => (
            Verdict::Unsafe,
            "HALT: the request needs correcting; repeating it unchanged would fail again.",
        ),
        Decision::ReturnRecordedResult => (
            Verdict::Unsafe,
            "HALT: the remote outcome is settled; use the recorded result.",
        ),
        Decision::IdempotencyMismatch => (
            Verdict::Unsafe,
            "HALT: the idempotency key was recorded with a different request.",
        ),
    }
}

const MANIFEST_CONTEXT: &str = "postern 2026 retry-manifest v2";

/// The manifest digest: blake3 in derive-key mode (context `postern 2026 retry-manifest
/// v2`) over each field in order, each prefixed by its length as u64 little-endian;
/// optional fields carry a presence byte. `docs/errors.md` lists the order.
pub fn manifest_digest(
    record: &RecordFacts,
    decision: Decision,
    verdict: Verdict,
    directive: &str,
    for_generation: u32,
    now_ms: i64,
) -> String {
    let mut h = blake3::Hasher::new_derive_key(MANIFEST_CONTEXT);
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(record.invocation_id.as_bytes());
    field(&record.last_seq.to_le_bytes());
    field(record.outcome.as_str().as_bytes());
    field(record.retry.as_str().as_bytes());
    field(&optional(record.code.map(|c| c.as_str().as_bytes())));
    field(record.fingerprint.as_bytes());
    field(&[u8::from(record.idempotent)]);
    field(match record.remote_contract {
        RemoteContract::Configured => b"configured",
        RemoteContract::None => b"none",
    });
    // Optional facts carry a presence byte, so "absent" never digests like a value.
    field(&optional(
        record.idempotency_key.as_deref().map(str::as_bytes),
    ));
    field(&optional_i64(record.idempotency_expires_at_ms));
    field(&[u8::from(record.reconcile_configured)]);
    field(&record.attempts_used.to_le_bytes());
    field(&record.retry_budget.to_le_bytes());
    field(&optional_i64(record.not_before_ms));
    query_fields(record.source_query.as_ref(), &mut field);
    field(&(record.members.len() as u64).to_le_bytes());
    for m in &record.members {
        field(m.id.as_bytes());
        field(m.outcome.as_str().as_bytes());
        query_fields(m.query.as_ref(), &mut field);
    }
    field(&now_ms.to_le_bytes());
    field(decision.as_str().as_bytes());
    field(verdict.as_str().as_bytes());
    field(directive.as_bytes());
    field(&for_generation.to_le_bytes());
    format!("blake3:{}", h.finalize().to_hex())
}

/// A query's fields in the digest: a presence byte, then method, path and both lists.
fn query_fields(q: Option<&SourceQueryPredicate>, field: &mut impl FnMut(&[u8])) {
    match q {
        None => field(&[0]),
        Some(q) => {
            field(&[1]);
            field(q.method.as_bytes());
            field(q.path.as_bytes());
            field(&statuses(&q.committed_status));
            field(&statuses(&q.not_applied_status));
        }
    }
}

fn statuses(list: &[u16]) -> Vec<u8> {
    list.iter().flat_map(|s| s.to_le_bytes()).collect()
}

fn optional(value: Option<&[u8]>) -> Vec<u8> {
    match value {
        None => vec![0],
        Some(bytes) => {
            let mut out = Vec::with_capacity(bytes.len() + 1);
            out.push(1);
            out.extend_from_slice(bytes);
            out
        }
    }
}

fn optional_i64(value: Option<i64>) -> Vec<u8> {
    optional(value.map(i64::to_le_bytes).as_ref().map(|b| &b[..]))
}

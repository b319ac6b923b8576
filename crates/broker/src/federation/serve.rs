//! The answering broker's side of federation (broker B): what it answers the three
//! peering tools, independent of the transport that carries them (the MCP server in
//! `postern-mcp` is a thin layer over [`PeerService`]).
//!
//! Why this file is long: about a fifth of it is this documentation, which states the
//! answering broker's promises in one place. The rest is [`PeerService`]'s three tools,
//! which share one authentication, one signing path (`attest`, `denial`,
//! `unavailable`), one refusal log and the at-most-once record of a call; `call` and
//! `reconcile` read the same record the same way. Kept together, each promise below
//! can be checked against the one code path that keeps it.
//!
//! Every answer that is a verdict is signed with B's broker key ([`Journal::sign_attestation`]):
//!
//! - `denial` when the asker is not a pinned peer, its signature does not verify, or the
//!   capability is not exported to it. The answer is the same whether or not a target
//!   of that name exists here: B never discloses what it does not export.
//! - `unavailable` when B cannot serve for now: it is shutting down, its journal is in
//!   low-space mode or refuses the acceptance, the keychain is locked or unreachable, or a
//!   repeated call finds its invocation still running.
//! - `outcome` otherwise: the call ran as an invocation of B's own HTTP pipeline (session
//!   `peer:<asker key name>`, B's approver) and the attestation binds
//!   [`PeerOutcome::digest`].
//!
//! What is *not* a verdict is refused without a signature ([`NotAnswered`]): malformed
//! arguments, an auth outside the time window, a nonce already used. A replayed request
//! gets no signed statement an on-path party could hand to the real asker.
//!
//! # At most once per caller invocation
//!
//! A call is accepted together with its `peer_calls` row (asker, caller invocation →
//! B's invocation) in one journal transaction, before anything is validated or sent.
//! Asking again answers from that invocation's record and never runs it again, across
//! restarts and `kill -9` of B (recovery closes an interrupted invocation as `unknown`
//! after dispatch). One exception, provably unsent: an invocation that ended
//! `not_attempted` because B was transiently unable (VAULT_LOCKED, BROKER_UNAVAILABLE,
//! BROKER_INTERRUPTED) is replaced by a fresh one. A repeat that finds the invocation
//! still running waits up to [`REPEAT_WAIT`] for it, then answers a signed outcome of
//! `unknown` (never `unavailable`, which would attest that it did not run); asking
//! again later, with the same caller invocation, answers its record.
//!
//! # Refusals are logged, not journaled
//!
//! A refused call is written to B's log (the `log` callback; the daemon's stderr) with
//! the asker's key name, the tool, the capability and the reason, escaped: never the
//! request. They are kept out of the journal on purpose: a refusal is answered before
//! anything is accepted, and any party that can reach the port could otherwise grow B's
//! hash-chained journal with unauthenticated requests until it fills the disk and sends
//! B into low-space mode, refusing B's own agents.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine;

use super::wire::{
    self, AUTH_WINDOW_MS, AuthRefused, CallAnswer, CallArgs, CapabilitiesAnswer, CapabilitiesArgs,
    Capability, PeerAuth, PeerOutcome, PeerResponse, ReconcileArgs,
};
use super::{Attestation, AttestationKind, CallBinding, Statement};
pub use super::{NO_POLICY, PEER_SESSION_PREFIX, peer_session, session_peer};
use crate::action::NormalizedHttp;
use crate::approvals::Approver;
use crate::channel::http::HttpChannel;
use crate::channel::http::{HttpOutcome, HttpRequest};
use crate::config::Config;
use crate::config::ConfigHandle;
use crate::config::peer::PeerConfig;
use crate::contract::{Code, Outcome};
use crate::invocation::{CallContext, CallerKind, Channel, Recorder, new_invocation_id};
use crate::journal::events;
use crate::journal::peer_calls::{PeerAccept, PeerCall};
use crate::journal::projection::Projection;
use crate::journal::{Journal, NewInvocation};
use crate::pause::AgentPause;

/// How long a repeated call waits for its invocation, still running, to end.
pub const REPEAT_WAIT: Duration = Duration::from_secs(20);
/// How often a waiting repeat reads the record.
const REPEAT_POLL: Duration = Duration::from_millis(50);
/// The longest caller invocation id accepted.
const MAX_CALLER_INVOCATION: usize = 128;
/// How much of a peer-supplied name B's log shows.
const LOG_CHARS: usize = 160;
/// The capability a `peer_capabilities` attestation is about.
pub const ALL_CAPABILITIES: &str = "*";

/// Why a call gets no signed answer: it is not a verdict about policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAnswered {
    /// The arguments cannot be read as the wire contract says.
    #[error("{0}")]
    Malformed(String),
    /// The auth is outside the time window (a replay after it, or a clock off by more).
    #[error("{0}")]
    Stale(AuthRefused),
    /// The auth's nonce was already used within the window.
    #[error("the request's nonce was already used: a replay is not answered")]
    Replayed,
    /// The request authenticated, but its nonce could not be recorded (the journal
    /// refuses writes): answering would let a captured copy be answered again after a
    /// restart, and a signed `unavailable` would attest that the call never ran here.
    #[error("the broker cannot record the request now ({0}); ask again later")]
    Unrecorded(String),
    /// The caller invocation already names another request here.
    #[error(
        "caller invocation {0} was already used for another request; a new request needs a new caller invocation"
    )]
    CallerInvocationReused(String),
}

impl NotAnswered {
    /// Whether the arguments themselves are wrong (as opposed to the auth's freshness).
    pub fn is_invalid_params(&self) -> bool {
        matches!(
            self,
            NotAnswered::Malformed(_) | NotAnswered::CallerInvocationReused(_)
        )
    }
}

/// Why an auth did not make the asker a pinned peer.
enum AuthFailure {
    /// A denial: unknown asker or a signature that does not verify.
    Denied(String),
    /// Not a verdict (stale, replayed).
    NotAnswered(NotAnswered),
}

/// What an answer is about: the capability, the request's fingerprint and the call.
struct About<'a> {
    capability: &'a str,
    fingerprint: &'a str,
    call: CallBinding,
}

/// Where a refusal is logged.
pub type RefusalLog = Arc<dyn Fn(&str) + Send + Sync>;

/// What [`PeerService`] works with: the parts of a broker a federated caller's requests
/// reach (never the vault: the HTTP channel reads the credential itself).
pub struct Parts {
    pub journal: Journal,
    pub config: ConfigHandle,
    pub pause: Arc<AgentPause>,
    pub approver: Option<Arc<dyn Approver>>,
    pub http: HttpChannel,
}

/// Broker B's answers to its peers.
pub struct PeerService {
    broker: Parts,
    /// Set when the daemon is stopping: new calls are answered `unavailable`.
    stopping: AtomicBool,
    log: RefusalLog,
}

/// One exported target and the request to run against it.
struct Prepared {
    /// `None` when the request is not one of an exported target's.
    request: Option<HttpRequest>,
    capability: String,
    fingerprint: String,
}

impl PeerService {
    /// The service over a broker's `parts`, logging refusals to `log`.
    pub fn new(broker: Parts, log: RefusalLog) -> PeerService {
        PeerService {
            broker,
            stopping: AtomicBool::new(false),
            log,
        }
    }

    /// From now on, answer `unavailable` to new calls.
    pub fn stop_accepting(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    fn journal(&self) -> &Journal {
        &self.broker.journal
    }

    /// Whether `key_name` is the key name of a pinned `[[peer]]`: a cheap check the
    /// transport can make before it buffers a large request (it proves nothing: the
    /// name is not secret, only the signature over the request authenticates).
    pub fn is_pinned_peer(&self, key_name: &str) -> bool {
        self.broker
            .config
            .current()
            .peer_by_key_name(key_name)
            .is_some()
    }

    /// B's key name: its audit log origin, what its peers pin it as.
    pub fn key_name(&self) -> String {
        self.journal().peer_name()
    }

    /// Signs a statement answering exactly `call` (issue 27: every answer is bound to
    /// the asker's key name, nonce, invocation and attempt as the call's auth named them).
    fn attest(
        &self,
        kind: AttestationKind,
        about: &About<'_>,
        policy_version: &str,
        outcome_digest: Option<String>,
    ) -> Attestation {
        self.journal().sign_attestation(Statement {
            kind,
            peer: self.key_name(),
            capability: about.capability.to_string(),
            request_fingerprint: about.fingerprint.to_string(),
            policy_version: policy_version.to_string(),
            issued_at_ms: self.journal().now_ms(),
            outcome_digest,
            call: about.call.clone(),
        })
    }

    fn denial(&self, about: &About<'_>, policy: &str) -> CallAnswer {
        CallAnswer {
            attestation: self.attest(AttestationKind::Denial, about, policy, None),
            outcome: None,
        }
    }

    fn unavailable(&self, about: &About<'_>, policy: &str) -> CallAnswer {
        CallAnswer {
            attestation: self.attest(AttestationKind::Unavailable, about, policy, None),
            outcome: None,
        }
    }

    fn refused(&self, tool: &str, asker: &str, capability: &str, reason: &str) {
        let esc = |s: &str| crate::display::escape_bytes(s.as_bytes(), LOG_CHARS).0;
        (self.log)(&format!(
            "{tool} refused: asker {}, capability {}: {reason}",
            esc(asker),
            esc(capability)
        ));
    }

    /// The pinned peer `auth` is from, its signature over `subject` for `tool` checked
    /// and its nonce remembered, durably (a captured call is not answered twice, even
    /// after a restart: issue 27).
    ///
    /// An auth outside the time window is refused unsigned before the asker's key name
    /// is looked up, so the answer is the same for a pinned name and an unknown one and
    /// nobody learns which names are pinned (issue 27, item 5).
    fn authenticate<'c>(
        &self,
        config: &'c Config,
        tool: &str,
        auth: &PeerAuth,
        subject: &str,
        now_ms: i64,
    ) -> Result<&'c PeerConfig, AuthFailure> {
        if (now_ms - auth.issued_at_ms).abs() > AUTH_WINDOW_MS {
            return Err(AuthFailure::NotAnswered(NotAnswered::Stale(
                AuthRefused::Stale {
                    issued_at_ms: auth.issued_at_ms,
                    now_ms,
                },
            )));
        }
        let Some(peer) = config.peer_by_key_name(&auth.peer) else {
            return Err(AuthFailure::Denied("the asker is not a pinned peer".into()));
        };
        match auth.verify(&peer.key.key, tool, subject, now_ms) {
            Ok(()) => {}
            Err(stale @ AuthRefused::Stale { .. }) => {
                return Err(AuthFailure::NotAnswered(NotAnswered::Stale(stale)));
            }
            Err(e) => return Err(AuthFailure::Denied(e.to_string())),
        }
        // The journal keeps the nonces (one write decides, also between concurrent
        // requests) and outlives a restart; a request whose nonce it cannot record is
        // not answered at all (unsigned: the asker asks again). Verification refuses an
        // auth outside the window, so older nonces are forgotten.
        match self.journal().remember_peer_nonce(
            &auth.peer,
            &auth.nonce.to_ascii_lowercase(),
            auth.issued_at_ms,
            now_ms - 2 * AUTH_WINDOW_MS,
        ) {
            Ok(true) => Ok(peer),
            Ok(false) => Err(AuthFailure::NotAnswered(NotAnswered::Replayed)),
            Err(e) => Err(AuthFailure::NotAnswered(NotAnswered::Unrecorded(
                e.to_string(),
            ))),
        }
    }

    /// `peer_capabilities`: what this broker exports to the asker, attested as an
    /// outcome about capability `*` whose fingerprint is
    /// [`wire::capabilities_digest`]; a denial listing nothing for anyone else.
    pub fn capabilities(&self, args: CapabilitiesArgs) -> Result<CapabilitiesAnswer, NotAnswered> {
        let config = self.broker.config.current();
        let now = self.journal().now_ms();
        let tool = wire::TOOL_CAPABILITIES;
        let nothing = wire::capabilities_digest(&[]);
        let call = CallBinding::of(&args.auth, None, None);
        let empty = |kind, policy: &str| CapabilitiesAnswer {
            attestation: self.attest(
                kind,
                &About {
                    capability: ALL_CAPABILITIES,
                    fingerprint: &nothing,
                    call: call.clone(),
                },
                policy,
                None,
            ),
            capabilities: Vec::new(),
        };
        let peer = match self.authenticate(&config, tool, &args.auth, "", now) {
            Ok(peer) => peer,
            Err(AuthFailure::Denied(reason)) => {
                self.refused(tool, &args.auth.peer, ALL_CAPABILITIES, &reason);
                return Ok(empty(AttestationKind::Denial, NO_POLICY));
            }
            Err(AuthFailure::NotAnswered(e)) => {
                self.refused(tool, &args.auth.peer, ALL_CAPABILITIES, &e.to_string());
                return Err(e);
            }
        };
        let capabilities: Vec<Capability> = peer
            .exports
            .iter()
            .filter_map(|name| config.http_target(name))
            .map(|t| Capability {
                name: t.name.clone(),
                methods: t.methods.clone(),
                idempotent_methods: t.idempotent_methods.clone(),
                approval: t.approval.as_str().to_string(),
            })
            .collect();
        let fingerprint = wire::capabilities_digest(&capabilities);
        let policy = config.export_policy_version(&peer.name).unwrap_or_default();
        Ok(CapabilitiesAnswer {
            attestation: self.attest(
                AttestationKind::Outcome,
                &About {
                    capability: ALL_CAPABILITIES,
                    fingerprint: &fingerprint,
                    call,
                },
                &policy,
                Some(fingerprint.clone()),
            ),
            capabilities,
        })
    }

    /// `peer_call`: runs the request against an exported capability at most once per
    /// (asker, caller invocation) and attests what B's record says.
    pub async fn call(&self, args: CallArgs) -> Result<CallAnswer, NotAnswered> {
        let tool = wire::TOOL_CALL;
        let body = base64::engine::general_purpose::STANDARD
            .decode(args.request.body_base64.as_bytes())
            .map_err(|e| NotAnswered::Malformed(format!("request.body_base64: {e}")))?;
        check_caller_invocation(&args.caller_invocation)?;
        if !args.request.path.starts_with('/') {
            return Err(NotAnswered::Malformed(
                "request.path must start with `/` (it is relative to the capability's base URL)"
                    .into(),
            ));
        }
        // Computed from what arrived, never taken from the asker.
        let fingerprint = args.request.fingerprint(&body);
        let capability = args.request.capability.clone();
        let config = self.broker.config.current();
        let now = self.journal().now_ms();
        let subject = wire::call_subject(
            &fingerprint,
            &args.caller_invocation,
            args.caller_attempt,
            args.policy_version.as_deref(),
        );
        let about = About {
            capability: &capability,
            fingerprint: &fingerprint,
            call: CallBinding::of(
                &args.auth,
                Some(&args.caller_invocation),
                Some(args.caller_attempt),
            ),
        };
        let peer = match self.authenticate(&config, tool, &args.auth, &subject, now) {
            Ok(peer) => peer,
            Err(AuthFailure::Denied(reason)) => {
                self.refused(tool, &args.auth.peer, &capability, &reason);
                return Ok(self.denial(&about, NO_POLICY));
            }
            Err(AuthFailure::NotAnswered(e)) => {
                self.refused(tool, &args.auth.peer, &capability, &e.to_string());
                return Err(e);
            }
        };
        let policy = config.export_policy_version(&peer.name).unwrap_or_default();
        // Not exported, no such target, or a path that leaves the target: denied, unless
        // the call is already recorded here (`run_once`).
        let prepared = Prepared {
            request: exported_request(&config, peer, &args, body),
            capability: capability.clone(),
            fingerprint: fingerprint.clone(),
        };
        let Some((answer, decided_under)) = self.run_once(peer, &args, &policy, &prepared).await?
        else {
            // One answer for all of them.
            self.refused(
                tool,
                &args.auth.peer,
                &capability,
                "the capability is not exported to this peer",
            );
            return Ok(self.denial(&about, &policy));
        };
        Ok(self.answer(&about, &decided_under, answer))
    }

    /// Why B cannot take a new call now, if it cannot. A journal in low-space mode is
    /// not asked here: it refuses the call's record itself, and only an attempt to
    /// write lets it see that space came back.
    fn unable(&self) -> Option<String> {
        if self.stopping.load(Ordering::SeqCst) {
            return Some("the broker is shutting down".to_string());
        }
        // The operator's pause holds a peer's calls as it holds this broker's agents':
        // signed `unavailable`, so the asker backs off and escalates, never a denial.
        self.broker
            .pause
            .is_paused()
            .then(|| "the operator paused agent calls".to_string())
    }

    /// Runs `prepared` for (asker, caller invocation) unless its record already answers;
    /// the answer and the policy version it was decided under (the recorded one for a
    /// call already accepted, `policy` for a new one).
    async fn run_once(
        &self,
        peer: &PeerConfig,
        args: &CallArgs,
        policy: &str,
        prepared: &Prepared,
    ) -> Result<Option<(Answer, String)>, NotAnswered> {
        let asker = peer.key.name.as_str();
        let caller_invocation = args.caller_invocation.as_str();
        let journal = self.journal();
        let unavailable = || Ok(Some((Answer::Unavailable, policy.to_string())));
        let mut replacing = None;
        // A concurrent first call may win the row between the read and the write; the
        // loop then reads its record (a bounded number of times).
        for _ in 0..3 {
            let existing = match journal.peer_call(asker, caller_invocation) {
                Ok(existing) => existing,
                // Whether it ran here cannot be read: nothing may be signed about it
                // (`unavailable` would attest that it never ran).
                Err(e) => return Err(NotAnswered::Unrecorded(e.to_string())),
            };
            if let Some(row) = existing.filter(|r| Some(&r.invocation_id) != replacing.as_ref()) {
                if row.request_fingerprint != prepared.fingerprint
                    || row.capability != prepared.capability
                {
                    return Err(NotAnswered::CallerInvocationReused(
                        caller_invocation.to_string(),
                    ));
                }
                // Answered from its record whatever the export policy says now, so a
                // denial or `unavailable` always means that this caller invocation
                // never ran here: what lets the asker end it not_attempted (issue 27).
                match self.recorded(&row.invocation_id).await {
                    Recorded::Answer(answer) => return Ok(Some((answer, row.policy_version))),
                    Recorded::Rerun => replacing = Some(row.invocation_id),
                }
                continue;
            }
            // Only something new to run meets these; a recorded call is answered above.
            let Some(request) = &prepared.request else {
                return Ok(None);
            };
            if let Some(reason) = self.unable() {
                self.refused(wire::TOOL_CALL, asker, &prepared.capability, &reason);
                return unavailable();
            }
            if let Some(seen) = args.policy_version.as_deref()
                && seen != policy
            {
                // Seed 002: the asker abandons an attempt whose peer policy moved, so
                // nothing may run for it; the signed answer carries the current version.
                self.refused(
                    wire::TOOL_CALL,
                    asker,
                    &prepared.capability,
                    "the export policy changed since the asker's attempt began",
                );
                return unavailable();
            }
            let Ok(id) = new_invocation_id() else {
                return unavailable();
            };
            let session = peer_session(asker);
            let accepted = self
                .broker
                .http
                .channel()
                .accepted(request, &self.broker.config.current());
            let new = NewInvocation {
                invocation_id: id.clone(),
                channel: events::Channel::Http,
                target: prepared.capability.clone(),
                summary: format!(
                    "peer {} call {}: {}",
                    peer.name,
                    crate::display::escape_text(caller_invocation),
                    accepted.summary
                ),
                session: Some(session.clone()),
                idempotency_key: accepted.idempotency_key,
                parent: None,
            };
            let call = PeerCall {
                asker: asker.to_string(),
                caller_invocation: caller_invocation.to_string(),
                invocation_id: id.clone(),
                capability: prepared.capability.clone(),
                request_fingerprint: prepared.fingerprint.clone(),
                policy_version: policy.to_string(),
                accepted_at_ms: journal.now_ms(),
            };
            match journal.accept_peer_call(call, replacing.clone(), new) {
                Err(e) => {
                    self.refused(
                        wire::TOOL_CALL,
                        asker,
                        &prepared.capability,
                        &format!("the journal cannot record the call: {e}"),
                    );
                    return unavailable();
                }
                Ok(PeerAccept::Existing(_)) => continue,
                Ok(PeerAccept::Accepted { .. }) => {}
            }
            let answer = self.run_accepted(&id, session, asker, request).await;
            return Ok(Some((answer, policy.to_string())));
        }
        unavailable()
    }

    /// Runs an accepted invocation to its end on its own task: the asker going away
    /// (a timeout, a reset) never cuts B's invocation short, and a repeat finds its
    /// record.
    async fn run_accepted(
        &self,
        id: &str,
        session: String,
        asker: &str,
        request: &HttpRequest,
    ) -> Answer {
        let rec = match Recorder::resume(self.journal(), id) {
            Ok(rec) => rec,
            Err(_) => return Answer::Unavailable,
        };
        let ctx = CallContext {
            session: Some(session),
            caller: CallerKind::Peer {
                key_name: asker.to_string(),
            },
            approver: self.broker.approver.clone(),
            cancel: tokio_util::sync::CancellationToken::new(),
            parent: None,
            // How the asking broker's agent runs is not this broker's to know.
            confinement: Default::default(),
        };
        let http = self.broker.http.clone();
        let request = request.clone();
        let task = tokio::spawn(async move { http.run_accepted(rec, &request, &ctx).await });
        match task.await {
            Ok(outcome) => Answer::of_outcome(outcome),
            // The task panicked or was aborted: the record says what happened.
            Err(_) => match self.recorded(id).await {
                Recorded::Answer(answer) => answer,
                Recorded::Rerun => Answer::Unavailable,
            },
        }
    }

    /// What the record of `id` answers a repeat with; waits for it to end first.
    async fn recorded(&self, id: &str) -> Recorded {
        let journal = self.journal();
        let deadline = tokio::time::Instant::now() + REPEAT_WAIT;
        let p = loop {
            match journal.projection(id) {
                Ok(p) if p.terminal => break p,
                Ok(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(REPEAT_POLL).await;
                }
                // Accepted and not ended (or unreadable): it may still run, or have run,
                // so this is never `unavailable`, which attests that it did not.
                _ => return Recorded::Answer(Answer::in_progress(id)),
            }
        };
        if unsent_for_now(p.outcome, p.code, p.ever_dispatched) {
            return Recorded::Rerun;
        }
        Recorded::Answer(Answer::of_outcome(self.outcome_of(&p)))
    }

    /// The record `p` with its stored result (without it if it cannot be read back).
    fn outcome_of(&self, p: &Projection) -> HttpOutcome {
        self.broker
            .http
            .recorded_projection(p)
            .unwrap_or_else(|_| HttpOutcome::of_projection(p, self.journal().now_ms()))
    }

    /// The signed answer for `answer`.
    fn answer(&self, about: &About<'_>, policy: &str, answer: Answer) -> CallAnswer {
        match answer {
            Answer::Unavailable => self.unavailable(about, policy),
            Answer::Outcome(outcome) => {
                let digest = outcome.digest();
                CallAnswer {
                    attestation: self.attest(AttestationKind::Outcome, about, policy, Some(digest)),
                    outcome: Some(*outcome),
                }
            }
        }
    }

    /// `peer_reconcile`: runs B's reconcile query for one of the asker's invocations
    /// that ended unknown, and attests the record afterwards.
    pub async fn reconcile(&self, args: ReconcileArgs) -> Result<CallAnswer, NotAnswered> {
        let tool = wire::TOOL_RECONCILE;
        let config = self.broker.config.current();
        let now = self.journal().now_ms();
        let (capability, fingerprint) = (&args.capability, &args.request_fingerprint);
        let subject = wire::reconcile_subject(&args.invocation_id, capability, fingerprint);
        let about = About {
            capability,
            fingerprint,
            call: CallBinding::of(&args.auth, None, None),
        };
        let peer = match self.authenticate(&config, tool, &args.auth, &subject, now) {
            Ok(peer) => peer,
            Err(AuthFailure::Denied(reason)) => {
                self.refused(tool, &args.auth.peer, capability, &reason);
                return Ok(self.denial(&about, NO_POLICY));
            }
            Err(AuthFailure::NotAnswered(e)) => {
                self.refused(tool, &args.auth.peer, capability, &e.to_string());
                return Err(e);
            }
        };
        let policy = config.export_policy_version(&peer.name).unwrap_or_default();
        let asker = peer.key.name.as_str();
        let session = peer_session(asker);
        // The invocation must run this asker's call of this request, on a capability
        // still exported to it; anything else gets the one denial (B does not say
        // whether another peer's invocation of that id exists).
        let row = self.journal().peer_call_of(&args.invocation_id);
        let owned = match &row {
            Ok(Some(row)) => {
                row.asker == asker
                    && &row.capability == capability
                    && &row.request_fingerprint == fingerprint
                    && peer.exports.contains(capability)
                    && config.http_target(capability).is_some()
            }
            _ => false,
        };
        let projection = self.journal().projection(&args.invocation_id);
        let owned = owned
            && projection
                .as_ref()
                .is_ok_and(|p| p.session.as_deref() == Some(session.as_str()));
        if !owned {
            if row.is_err() {
                return Ok(self.unavailable(&about, &policy));
            }
            self.refused(
                tool,
                &args.auth.peer,
                capability,
                "the invocation is not this peer's call of this request",
            );
            return Ok(self.denial(&about, &policy));
        }
        if let Some(reason) = self.unable() {
            self.refused(tool, &args.auth.peer, capability, &reason);
            return Ok(self.unavailable(&about, &policy));
        }
        if projection.is_ok_and(|p| !p.terminal) {
            return Ok(self.unavailable(&about, &policy));
        }
        let _ = self
            .broker
            .http
            .reconcile(&args.invocation_id, &session)
            .await;
        let answer = match self.journal().projection(&args.invocation_id) {
            Ok(p) => Answer::of_outcome(self.outcome_of(&p)),
            Err(_) => Answer::Unavailable,
        };
        Ok(self.answer(&about, &policy, answer))
    }
}

/// What a call's record answers.
enum Answer {
    Unavailable,
    Outcome(Box<PeerOutcome>),
}

impl Answer {
    /// A call accepted here whose record has not ended: its outcome is unknown.
    fn in_progress(id: &str) -> Answer {
        Answer::Outcome(Box::new(PeerOutcome {
            invocation_id: id.to_string(),
            outcome: Outcome::Unknown,
            error: None,
            response: None,
        }))
    }

    /// An outcome, or `unavailable` when B was transiently unable and sent nothing.
    fn of_outcome(outcome: HttpOutcome) -> Answer {
        let code = outcome.error.as_ref().map(|e| e.error.code);
        let dispatched = outcome
            .error
            .as_ref()
            .is_some_and(|e| e.evidence.dispatch_started);
        if unsent_for_now(outcome.outcome, code, dispatched) {
            return Answer::Unavailable;
        }
        Answer::Outcome(Box::new(PeerOutcome {
            invocation_id: outcome.invocation_id,
            outcome: outcome.outcome,
            error: outcome.error,
            response: outcome.result.map(|r| PeerResponse {
                status: r.status,
                headers: r.headers,
                body_base64: base64::engine::general_purpose::STANDARD.encode(&r.body),
            }),
        }))
    }
}

/// What a repeat finds in the record.
enum Recorded {
    Answer(Answer),
    /// Ended unsent because B was transiently unable: run it anew.
    Rerun,
}

/// Whether an ending proves nothing was sent and B was only transiently unable.
fn unsent_for_now(outcome: Outcome, code: Option<Code>, dispatched: bool) -> bool {
    outcome == Outcome::NotAttempted
        && !dispatched
        && matches!(
            code,
            Some(Code::VaultLocked | Code::BrokerUnavailable | Code::BrokerInterrupted)
        )
}

/// A caller invocation id: 1 to 128 printable ASCII characters (it keys a row and
/// appears in B's records).
fn check_caller_invocation(id: &str) -> Result<(), NotAnswered> {
    if id.is_empty()
        || id.len() > MAX_CALLER_INVOCATION
        || !id.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(NotAnswered::Malformed(format!(
            "caller_invocation must be 1 to {MAX_CALLER_INVOCATION} printable ASCII characters"
        )));
    }
    Ok(())
}

/// The HTTP request for `args` against the capability it names, when that capability
/// is an HTTP target exported to `peer` and the URL (its base URL plus the request's
/// path) stays under that target. A request that does not normalize is let through:
/// the pipeline records it as a validation failure of that target, and sends nothing.
/// (The pipeline resolves the URL again under the configuration it binds; only an
/// operator's edit between the two could move it, and the edit is the operator's.)
fn exported_request(
    config: &Config,
    peer: &PeerConfig,
    args: &CallArgs,
    body: Vec<u8>,
) -> Option<HttpRequest> {
    let r = &args.request;
    if !peer.exports.contains(&r.capability) {
        return None;
    }
    let target = config.http_target(&r.capability)?;
    let url = format!(
        "{}{}",
        target.base_url.as_str().trim_end_matches('/'),
        r.path
    );
    if let Ok(action) = NormalizedHttp::new(&r.method, &url, &r.headers, &r.query, &body) {
        let resolved = config.resolve_normalized_http(&action).ok()?;
        if resolved.name != target.name {
            return None;
        }
    }
    Some(HttpRequest {
        url,
        method: r.method.clone(),
        headers: r.headers.clone(),
        query: r.query.clone(),
        body,
        idempotency_key: r.idempotency_key.clone(),
        timeout_ms: r.timeout_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER_KEY: &str = "postern.local/audit/0011223344556677";

    fn config() -> Config {
        let key = crate::transparency::note::VerifierKey::new(
            PEER_KEY,
            crate::transparency::note::KeyAlg::Ed25519,
            ed25519_dalek::SigningKey::from_bytes(&[7; 32]).verifying_key(),
        )
        .unwrap()
        .encode();
        let text = format!(
            r#"
[[http]]
name = "payments"
base_url = "http://127.0.0.1:9/v1"
methods = ["GET", "POST"]
credential = "k"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
idempotent_methods = ["GET"]

[[http]]
name = "internal"
base_url = "http://127.0.0.1:9/v1/internal"
methods = ["GET", "POST"]
credential = "k"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
idempotent_methods = ["GET"]

[[peer]]
name = "org-a"
key = "{key}"
exports = ["payments"]
"#
        );
        Config::parse(&text, std::path::Path::new("/nonexistent/postern.toml")).unwrap()
    }

    fn args(capability: &str, path: &str) -> CallArgs {
        CallArgs {
            auth: PeerAuth {
                peer: PEER_KEY.into(),
                issued_at_ms: 0,
                nonce: String::new(),
                signature: String::new(),
            },
            request: wire::PeerRequest {
                capability: capability.into(),
                method: "GET".into(),
                path: path.into(),
                ..Default::default()
            },
            caller_invocation: "inv_1".into(),
            caller_attempt: 1,
            policy_version: None,
        }
    }

    #[test]
    fn only_a_path_that_stays_under_the_exported_target_runs() {
        let config = config();
        let peer = config.peer_by_key_name(PEER_KEY).unwrap();
        let run = |capability: &str, path: &str| {
            exported_request(&config, peer, &args(capability, path), Vec::new()).map(|r| r.url)
        };
        assert_eq!(
            run("payments", "/charges?x=1").as_deref(),
            Some("http://127.0.0.1:9/v1/charges?x=1")
        );
        assert_eq!(run("internal", "/x"), None, "not exported");
        assert_eq!(run("nope", "/x"), None, "no such target");
        // Under payments' prefix, but the longer prefix of a target not exported.
        assert_eq!(run("payments", "/internal/x"), None);
        assert_eq!(
            run("payments", "/../admin"),
            None,
            "climbs out of the target"
        );
        assert_eq!(run("payments", "/%2e%2e/admin"), None, "encoded climb");
    }

    #[test]
    fn only_an_unsent_ending_for_a_transient_reason_is_run_again() {
        let na = Outcome::NotAttempted;
        for code in [
            Code::VaultLocked,
            Code::BrokerUnavailable,
            Code::BrokerInterrupted,
        ] {
            assert!(unsent_for_now(na, Some(code), false), "{code}");
            assert!(
                !unsent_for_now(na, Some(code), true),
                "{code} after dispatch"
            );
            assert!(!unsent_for_now(Outcome::Unknown, Some(code), true));
        }
        for code in [
            Code::ApprovalDenied,
            Code::ApprovalTimeout,
            Code::CredentialMissing,
            Code::InvalidRequest,
            Code::ConnectionRefused,
        ] {
            assert!(
                !unsent_for_now(na, Some(code), false),
                "{code} is an outcome"
            );
        }
        assert!(!unsent_for_now(na, None, false));
    }

    #[test]
    fn a_caller_invocation_is_short_printable_ascii() {
        assert!(check_caller_invocation("inv_0123").is_ok());
        for bad in ["", "inv 1", "inv\n1", "inv_é", &"x".repeat(129)] {
            assert!(
                matches!(check_caller_invocation(bad), Err(NotAnswered::Malformed(_))),
                "{bad:?}"
            );
        }
    }
}

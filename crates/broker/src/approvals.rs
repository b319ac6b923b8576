//! Approvals: the queue a person answers from the desktop console.
//!
//! An approval is bound to one fingerprint. The console lists pending requests and
//! answers with the fingerprint it showed; the channel then records the grant, and the
//! journal refuses a grant for any other fingerprint (FINGERPRINT_MISMATCH, nothing
//! sent). Session-mode approvals are remembered per (agent session, target) so the
//! same agent process is asked once.
//!
//! The agent side never holds this type: only the operator side (console, tests acting
//! as the console) can answer.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::action::ConfigSnapshot;
use crate::record::approval::{ApprovalCard, CardAgent};

/// A request for a person's approval, bound to one fingerprint.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    pub invocation_id: String,
    pub session: Option<String>,
    pub target: String,
    pub summary: String,
    pub fingerprint: String,
    pub credential_id: String,
    pub credential_version: String,
    pub injection_mode: String,
    pub idempotency_key: Option<String>,
    /// `session` or `per_call` (an [`ApprovalMode`](crate::config::ApprovalMode) name),
    /// or `host_key` for an SSH first connection.
    pub mode: &'static str,
    /// What the card shows of the action itself.
    pub detail: ApprovalDetail,
    /// The agent as its SESSION_OPENED record describes it (`None` without one).
    pub agent: Option<CardAgent>,
    /// What approving covers, in words (see [`covers`]).
    pub covers: String,
}

/// What one approval covers, as the card says it (issue 26): a per-call approval covers
/// the invocation's sends up to its retry budget, each of exactly the approved bytes and
/// only when the record shows a resend is safe; a session approval covers the session's
/// calls to the target, each still bound to its own fingerprint.
pub fn covers(mode: &str, target: &str, retry_budget: u32) -> String {
    match mode {
        "session" => format!(
            "every call this agent session makes to {target} until the session ends; each is still recorded with its own fingerprint"
        ),
        "host_key" => format!(
            "pinning this host key for {target}; the command is not run by this approval and must be sent again"
        ),
        _ if retry_budget <= 1 => "this request, sent once; it is never resent".to_string(),
        _ => format!(
            "this request: one send, and at most {} resends of exactly these bytes, made only when the record shows a resend is safe (an idempotent method, the same idempotency key, or a refusal that asks to retry); a changed request needs a new approval",
            retry_budget - 1
        ),
    }
}

impl ApprovalRequest {
    /// A card for `invocation_id` of agent `session`, binding `fingerprint` under
    /// `snapshot` (target, credential and idempotency key as bound). The caller sets the
    /// mode.
    pub fn bound(
        invocation_id: &str,
        session: Option<String>,
        summary: String,
        fingerprint: String,
        snapshot: &ConfigSnapshot,
        detail: ApprovalDetail,
    ) -> Self {
        ApprovalRequest {
            invocation_id: invocation_id.to_string(),
            session,
            target: snapshot.target_id.clone(),
            summary,
            fingerprint,
            credential_id: snapshot.credential_id.clone(),
            credential_version: snapshot.credential_version.clone(),
            injection_mode: snapshot.injection_mode.clone(),
            idempotency_key: snapshot.idempotency_key.clone(),
            mode: "",
            detail,
            agent: None,
            covers: String::new(),
        }
    }

    /// Exactly what the approval card for this request displays; its digest is what
    /// APPROVAL_REQUESTED records and what an answer must name.
    pub fn card(&self) -> ApprovalCard {
        ApprovalCard::of(self)
    }
}

/// The action behind an approval card, as the fingerprint binds it. Agent-written text
/// (commands, bodies) is escaped so it cannot hide or reorder what a person reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ApprovalDetail {
    /// HTTP: the method.
    pub method: Option<String>,
    /// HTTP: the normalized URL.
    pub url: Option<String>,
    /// HTTP: the request body, previewed.
    pub body: Option<crate::display::BodyPreview>,
    /// SSH: `user@host:port`.
    pub ssh_destination: Option<String>,
    /// SSH: the command, escaped.
    pub command: Option<String>,
    /// SSH first connection: the host key fingerprint that approving pins.
    pub host_key: Option<String>,
    /// The addresses the host resolved to when the card was built, with the address
    /// guard's refusal beside any it refuses (checked again at connect time). Absent
    /// for a request through a proxy: the proxy resolves the host.
    pub resolved: Option<String>,
    /// HTTP: the proxy (`host:port`, never its credentials) the request goes through.
    pub proxy: Option<String>,
    /// HTTP: every header the agent supplied, in the order sent, each previewed and
    /// flagged when it changes what the request means.
    pub headers: Vec<crate::display::HeaderPreview>,
    /// HTTP: what the broker adds to the request beside the agent's headers (the
    /// credential named by id, never its value).
    pub added: Vec<String>,
    /// SSH: the command's standard input, previewed like a body.
    pub stdin: Option<crate::display::BodyPreview>,
    /// What the person should look at first: flagged headers, a script fed to an
    /// interpreter on stdin.
    pub cautions: Vec<String>,
}

/// A person's answer. An approval names the fingerprint it approves; an answer from the
/// console also names the digest of the card it was given on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalAnswer {
    Approved {
        fingerprint: String,
        by: String,
        card_digest: Option<String>,
    },
    Denied {
        by: String,
        card_digest: Option<String>,
    },
    TimedOut,
}

/// Whoever can approve (the desktop console). Headless brokers have none.
pub trait Approver: Send + Sync {
    fn approve(
        &self,
        request: ApprovalRequest,
    ) -> Pin<Box<dyn Future<Output = ApprovalAnswer> + Send + '_>>;
}

/// A request waiting for a person.
#[derive(Debug, Clone)]
pub struct Pending {
    pub request: ApprovalRequest,
    pub requested_at_ms: i64,
    pub expires_at_ms: i64,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("no pending approval for invocation {0}")]
    NotPending(String),
    /// The answer names a card other than the one pending: the person saw something
    /// else. Nothing is recorded and the request keeps waiting.
    #[error(
        "invocation {invocation_id}: the answer names card {answered}, but the pending card is {pending}"
    )]
    CardChanged {
        invocation_id: String,
        answered: String,
        pending: String,
    },
}

struct Waiting {
    pending: Pending,
    answer: oneshot::Sender<ApprovalAnswer>,
}

/// The approval queue.
pub struct Approvals {
    waiting: Mutex<HashMap<String, Waiting>>,
    /// (session, target) pairs a person approved for the whole session.
    sessions: Mutex<HashSet<(String, String)>>,
    timeout: Duration,
    clock: std::sync::Arc<dyn crate::clock::Clock>,
    /// Bumped whenever the pending set changes, so a console can redraw and notify.
    changes: tokio::sync::watch::Sender<u64>,
}

impl Approvals {
    pub fn new(timeout: Duration, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        Approvals {
            waiting: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashSet::new()),
            timeout,
            clock,
            changes: tokio::sync::watch::channel(0).0,
        }
    }

    /// A receiver that sees a new value each time a request starts or stops waiting.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Everything waiting for an answer, oldest first.
    pub fn pending(&self) -> Vec<Pending> {
        let mut out: Vec<Pending> = match self.waiting.lock() {
            Ok(w) => w.values().map(|w| w.pending.clone()).collect(),
            Err(_) => Vec::new(),
        };
        out.sort_by_key(|p| p.requested_at_ms);
        out
    }

    fn take(&self, invocation_id: &str) -> Result<Waiting, AnswerError> {
        let taken = self
            .waiting
            .lock()
            .ok()
            .and_then(|mut w| w.remove(invocation_id))
            .ok_or_else(|| AnswerError::NotPending(invocation_id.to_string()))?;
        self.changed();
        Ok(taken)
    }

    /// Approves exactly `fingerprint` for `invocation_id`. A fingerprint other than the
    /// bound one is passed on and refused by the journal (FINGERPRINT_MISMATCH). The
    /// grant names no card; the console answers with [`Approvals::approve_card`].
    pub fn approve(
        &self,
        invocation_id: &str,
        fingerprint: &str,
        by: &str,
    ) -> Result<(), AnswerError> {
        self.grant(invocation_id, fingerprint, None, by)
    }

    /// Approves `fingerprint` on the card whose digest is `card_digest`, the card the
    /// person was shown. A digest other than the pending card's is refused
    /// ([`AnswerError::CardChanged`]) and the request keeps waiting.
    pub fn approve_card(
        &self,
        invocation_id: &str,
        fingerprint: &str,
        card_digest: &str,
        by: &str,
    ) -> Result<(), AnswerError> {
        self.check_card(invocation_id, card_digest)?;
        self.grant(
            invocation_id,
            fingerprint,
            Some(card_digest.to_string()),
            by,
        )
    }

    /// Denies `invocation_id` on the card whose digest is `card_digest`. A denial always
    /// stops the request; the digest it names is recorded as given.
    pub fn deny_card(
        &self,
        invocation_id: &str,
        card_digest: &str,
        by: &str,
    ) -> Result<(), AnswerError> {
        self.refuse(invocation_id, Some(card_digest.to_string()), by)
    }

    /// The pending card of `invocation_id` must be the one with `card_digest`.
    fn check_card(&self, invocation_id: &str, card_digest: &str) -> Result<(), AnswerError> {
        let pending = self
            .waiting
            .lock()
            .ok()
            .and_then(|w| {
                w.get(invocation_id)
                    .map(|w| w.pending.request.card().digest())
            })
            .ok_or_else(|| AnswerError::NotPending(invocation_id.to_string()))?;
        if pending != card_digest {
            return Err(AnswerError::CardChanged {
                invocation_id: invocation_id.to_string(),
                answered: card_digest.to_string(),
                pending,
            });
        }
        Ok(())
    }

    fn grant(
        &self,
        invocation_id: &str,
        fingerprint: &str,
        card_digest: Option<String>,
        by: &str,
    ) -> Result<(), AnswerError> {
        let waiting = self.take(invocation_id)?;
        let request = &waiting.pending.request;
        if request.mode == "session"
            && request.fingerprint == fingerprint
            && let (Some(session), Ok(mut sessions)) = (&request.session, self.sessions.lock())
        {
            sessions.insert((session.clone(), request.target.clone()));
        }
        let _ = waiting.answer.send(ApprovalAnswer::Approved {
            fingerprint: fingerprint.to_string(),
            by: by.to_string(),
            card_digest,
        });
        Ok(())
    }

    /// Denies `invocation_id`: APPROVAL_DENIED, retry never. The denial names no card;
    /// the console answers with [`Approvals::deny_card`].
    pub fn deny(&self, invocation_id: &str, by: &str) -> Result<(), AnswerError> {
        self.refuse(invocation_id, None, by)
    }

    fn refuse(
        &self,
        invocation_id: &str,
        card_digest: Option<String>,
        by: &str,
    ) -> Result<(), AnswerError> {
        let waiting = self.take(invocation_id)?;
        let _ = waiting.answer.send(ApprovalAnswer::Denied {
            by: by.to_string(),
            card_digest,
        });
        Ok(())
    }

    /// Forgets session approvals of an agent session that ended.
    pub fn end_session(&self, session: &str) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.retain(|(s, _)| s != session);
        }
    }
}

impl Approver for Approvals {
    fn approve(
        &self,
        request: ApprovalRequest,
    ) -> Pin<Box<dyn Future<Output = ApprovalAnswer> + Send + '_>> {
        Box::pin(async move {
            if request.mode == "session"
                && let Some(session) = &request.session
                && self
                    .sessions
                    .lock()
                    .is_ok_and(|s| s.contains(&(session.clone(), request.target.clone())))
            {
                // No card was shown for this request: the grant names none.
                return ApprovalAnswer::Approved {
                    fingerprint: request.fingerprint.clone(),
                    by: format!("session approval ({session})"),
                    card_digest: None,
                };
            }
            let (tx, rx) = oneshot::channel();
            let id = request.invocation_id.clone();
            let now = self.clock.now_ms();
            let expires =
                now.saturating_add(i64::try_from(self.timeout.as_millis()).unwrap_or(i64::MAX));
            if let Ok(mut waiting) = self.waiting.lock() {
                waiting.insert(
                    id.clone(),
                    Waiting {
                        pending: Pending {
                            request,
                            requested_at_ms: now,
                            expires_at_ms: expires,
                        },
                        answer: tx,
                    },
                );
            }
            self.changed();
            // Whatever happens (answer, timeout, the caller going away), the request is
            // no longer pending afterwards.
            let _pending = RemoveOnDrop {
                approvals: self,
                id,
            };
            let answer = tokio::time::timeout(self.timeout, rx).await;
            match answer {
                Ok(Ok(answer)) => answer,
                _ => ApprovalAnswer::TimedOut,
            }
        })
    }
}

struct RemoveOnDrop<'a> {
    approvals: &'a Approvals,
    id: String,
}

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let removed = self
            .approvals
            .waiting
            .lock()
            .is_ok_and(|mut waiting| waiting.remove(&self.id).is_some());
        if removed {
            self.approvals.changed();
        }
    }
}

//! What the agent side holds: the MCP server, the daemon's agent socket and the bridge's
//! sessions receive an [`AgentApi`], never the [`Broker`].
//!
//! An agent may submit calls (HTTP, SSH, a federated peer's capability), retry and poll
//! what it submitted, read the record and stored result of its own invocations, list the
//! targets it may name, and have its session and deliveries recorded. Nothing else is
//! reachable from here: there is no method that answers an approval, reads or writes a
//! credential, reads the audit log or another session's record, or changes the
//! configuration or the pause. That is checked by the compiler: `crates/mcp/tests/
//! agent_boundary.rs` compiles code that tries each of those through an `AgentApi` and
//! expects the errors it gets.
//!
//! Never: hand out the journal, the vault, the configuration handle, the approval queue
//! or the `Broker` itself; read an invocation without checking that the asking session
//! started it.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::channel::http::{HttpOutcome, HttpRequest};
use crate::channel::peer::listing::{Listed, ListingError};
use crate::channel::ssh::{SshOutcome, SshRequest};
use crate::config::Config;
use crate::contract::Envelope;
use crate::invocation::delivery::{self, DeliveryError, Piece};
use crate::invocation::{self, CallContext};
use crate::journal::JournalError;
use crate::journal::events::{Event, ParentLink};
use crate::journal::projection::Projection;
use crate::operations::{JobPoll, PollRefused};
use crate::provenance::{self, ProvenanceError, SessionOpened};

/// The agent side's handle on a running broker. Clones share it.
#[derive(Clone)]
pub struct AgentApi {
    broker: Arc<Broker>,
}

/// An invocation the asking session started, with its projection: the only way the
/// agent side reads a record. Made only by [`AgentApi::owned`].
#[derive(Debug, Clone)]
pub struct Owned {
    projection: Projection,
}

impl Owned {
    /// The invocation's projection.
    pub fn projection(&self) -> &Projection {
        &self.projection
    }

    /// A receipt for its delivery.
    pub fn receipt(&self) -> Receipt {
        Receipt(self.projection.invocation_id.clone())
    }
}

/// An invocation whose result the agent side was handed: its own, either read through
/// [`AgentApi::owned`] or just run for it. Delivery is recorded against a receipt only.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Receipt(String);

impl Receipt {
    /// The invocation.
    pub fn invocation_id(&self) -> &str {
        &self.0
    }
}

/// A call's outcome, with the receipt for delivering it.
#[derive(Debug)]
pub struct Ran<O> {
    pub outcome: O,
    pub receipt: Receipt,
}

impl Ran<HttpOutcome> {
    fn http(outcome: HttpOutcome) -> Self {
        let receipt = Receipt(outcome.invocation_id.clone());
        Ran { outcome, receipt }
    }
}

/// Why an invocation cannot be read by this session: it does not exist, or another
/// session started it. The two are not told apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no invocation {0} in this session")]
pub struct NotOwned(pub String);

impl AgentApi {
    pub(crate) fn new(broker: Arc<Broker>) -> Self {
        AgentApi { broker }
    }

    /// The broker's clock (unix ms).
    pub fn now_ms(&self) -> i64 {
        self.broker.journal.now_ms()
    }

    /// Whether the operator paused agent calls.
    pub fn agents_paused(&self) -> bool {
        self.broker.pause.is_paused()
    }

    /// The targets an agent may name, as configured now (names, URLs and policy; the
    /// configuration holds no secret).
    pub fn targets(&self) -> Arc<Config> {
        self.broker.config.current()
    }

    /// What each federated peer lists for this broker now.
    pub async fn peer_listings(&self) -> Vec<(String, Result<Listed, ListingError>)> {
        self.broker.peer.listings().all().await
    }

    /// The context a call of `session` runs in: the broker's approver (which can only
    /// ask a person), and `cancel`.
    pub fn context(&self, session: Option<String>, cancel: CancellationToken) -> CallContext {
        CallContext {
            session,
            caller: crate::invocation::CallerKind::Local,
            approver: self.broker.approver.clone(),
            cancel,
            parent: None,
            confinement: Default::default(),
        }
    }

    /// Runs an `http_request` on a target of this broker.
    pub async fn http(&self, request: HttpRequest, ctx: &CallContext) -> Ran<HttpOutcome> {
        Ran::http(self.broker.http.execute(request, ctx).await)
    }

    /// Runs an `http_request` on a capability a federated peer exports.
    pub async fn peer(&self, request: HttpRequest, ctx: &CallContext) -> Ran<HttpOutcome> {
        Ran::http(self.broker.peer.execute(request, ctx).await)
    }

    /// Runs an `ssh_exec`.
    pub async fn ssh(&self, request: SshRequest, ctx: &CallContext) -> Ran<SshOutcome> {
        let outcome = self.broker.ssh.execute(request, ctx).await;
        let receipt = Receipt(outcome.invocation_id.clone());
        Ran { outcome, receipt }
    }

    /// `retry_invocation` of an HTTP or peer invocation this session owns.
    pub async fn retry(&self, owned: &Owned, ctx: &CallContext) -> Ran<HttpOutcome> {
        let id = &owned.projection.invocation_id;
        let outcome = if owned.projection.channel == Some(crate::journal::events::Channel::Peer) {
            self.broker.peer.retry(id, ctx).await
        } else {
            self.broker.http.retry(id, ctx).await
        };
        Ran::http(outcome)
    }

    /// `poll_job` on a job (or the submission that queued it) this session owns; the
    /// receipt is the poll's, when one was made.
    pub async fn poll_job(
        &self,
        owned: &Owned,
        ctx: &CallContext,
    ) -> Result<(JobPoll, Option<Receipt>), PollRefused> {
        let polled = self
            .broker
            .http
            .poll_job(&owned.projection.invocation_id, ctx)
            .await?;
        let receipt = polled
            .poll
            .as_ref()
            .map(|p| Receipt(p.invocation_id.clone()));
        Ok((polled, receipt))
    }

    /// `invocation_id` when `session` started it.
    ///
    /// # Errors
    ///
    /// [`NotOwned`] when there is no such invocation or another session started it.
    pub fn owned(&self, session: &str, invocation_id: &str) -> Result<Owned, NotOwned> {
        match self.broker.journal.projection(invocation_id) {
            Ok(p) if p.session.as_deref() == Some(session) => Ok(Owned { projection: p }),
            _ => Err(NotOwned(invocation_id.to_string())),
        }
    }

    /// What was answered for an invocation of `session` that the journal could not
    /// record (a full disk, say).
    pub fn unrecorded(&self, session: &str, invocation_id: &str) -> Option<Envelope> {
        self.broker
            .journal
            .unrecorded(invocation_id)
            .filter(|u| u.session.as_deref() == Some(session))
            .map(|u| u.envelope)
    }

    /// The events of an owned invocation.
    pub fn events(&self, owned: &Owned) -> Result<Vec<Event>, JournalError> {
        self.broker.journal.events(&owned.projection.invocation_id)
    }

    /// The invocations an owned one started (a followed redirect, a job and its polls).
    pub fn children(&self, owned: &Owned) -> Result<Vec<ParentLink>, JournalError> {
        self.broker
            .journal
            .children(&owned.projection.invocation_id)
    }

    /// The piece of an owned invocation's stored result at `cursor`.
    pub fn piece(
        &self,
        owned: &Owned,
        cursor: Option<&str>,
        max_bytes: Option<u64>,
    ) -> Result<Piece, DeliveryError> {
        delivery::piece(&self.broker.journal, &owned.projection, cursor, max_bytes)
    }

    /// The envelope that refuses a delivery of an owned invocation's result.
    pub fn refusal(&self, owned: &Owned, error: &DeliveryError) -> Envelope {
        delivery::refusal(&self.broker.journal, &owned.projection, error)
    }

    /// An owned HTTP or peer invocation's answer, from its record.
    pub fn recorded_http(&self, owned: &Owned) -> Result<HttpOutcome, JournalError> {
        if owned.projection.channel == Some(crate::journal::events::Channel::Peer) {
            self.broker.peer.recorded_projection(&owned.projection)
        } else {
            self.broker.http.recorded_projection(&owned.projection)
        }
    }

    /// An owned SSH invocation's answer, from its record.
    pub fn recorded_ssh(&self, owned: &Owned) -> Result<SshOutcome, JournalError> {
        self.broker.ssh.recorded_projection(&owned.projection)
    }

    /// Appends SESSION_OPENED, durably (see [`provenance::record_session`]).
    pub fn record_session(&self, opened: SessionOpened) -> Result<u64, ProvenanceError> {
        provenance::record_session(&self.broker.journal, opened)
    }

    /// The bridge queued the answer for `receipt` to the agent: delivered.
    pub fn delivered(&self, receipt: &Receipt) -> Result<(), JournalError> {
        invocation::confirm_delivery_queued(&self.broker.journal, &receipt.0)
    }

    /// The answer for `receipt` never reached the agent.
    pub fn delivery_failed(&self, receipt: &Receipt, message: &str) -> Result<(), JournalError> {
        invocation::delivery_failed(&self.broker.journal, &receipt.0, message)
    }
}

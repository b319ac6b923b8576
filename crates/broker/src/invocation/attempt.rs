//! One attempt in progress, as a channel sees it: the [`Attempt`] it records through
//! and the [`Gate`] that records DISPATCH_STARTED immediately before the first byte.

use super::outcome::Outcome;
// The attempt is the pipeline's own step, in a file of its own for size: the two name
// each other (ARCHITECTURE.md, Layers).
use super::pipeline::{Bound, Channel, Pipeline};
use super::recorder::{Exchange, Recorder, StepError};
use crate::action::{ConfigSnapshot, NormalizedAction};
use crate::config::{Config, ConfigHandle};
use crate::contract::{Code, Phase, Retry, Stage};
use crate::journal::{ResultToStore, Settle};

/// One attempt in progress: what a channel's [`Channel::attempt`] records through.
pub struct Attempt<'a, T: Channel> {
    pipeline: &'a Pipeline<T>,
    rec: &'a Recorder,
    bound: &'a Bound<T::Plan>,
}

impl<'a, T: Channel> Attempt<'a, T> {
    pub(super) fn new(
        pipeline: &'a Pipeline<T>,
        rec: &'a Recorder,
        bound: &'a Bound<T::Plan>,
    ) -> Self {
        Attempt {
            pipeline,
            rec,
            bound,
        }
    }

    pub fn bound(&self) -> &'a Bound<T::Plan> {
        self.bound
    }

    pub fn invocation_id(&self) -> &str {
        self.rec.id()
    }

    /// The invocation's recorder, for what an attempt asks a person (an SSH first-seen
    /// host key).
    pub fn recorder(&self) -> &'a Recorder {
        self.rec
    }

    /// The live configuration (an SSH first-seen approval pins a host key in it).
    pub fn config(&self) -> &ConfigHandle {
        self.pipeline.config()
    }

    pub fn now_ms(&self) -> i64 {
        self.pipeline.now()
    }

    /// The journal the attempt records in (an SSH first-seen approval reads the agent's
    /// session record from it for the card).
    pub fn journal(&self) -> &crate::journal::Journal {
        self.pipeline.journal()
    }

    /// The id of this attempt's `n`th connection: `<invocation>/g<generation>/c<n>`.
    pub fn connection_id(&self, n: u32) -> String {
        format!("{}/g{}/c{n}", self.rec.id(), self.rec.generation())
    }

    /// The gate that records DISPATCH_STARTED for connection `connection_id`.
    pub fn gate(&self, connection_id: String) -> Gate {
        Gate {
            rec: self.rec.clone(),
            config: self.pipeline.config().clone(),
            target: self.bound.target.clone(),
            action: self.bound.action.clone(),
            bound: self.bound.snapshot.clone(),
            connection_id,
            recompute: T::fingerprint_now,
        }
    }

    /// A connection-setup stage failed (it proves not_attempted for this attempt).
    pub fn setup_stage_failed(
        &self,
        n: u32,
        stage: Stage,
        code: Code,
    ) -> Result<(), Box<Outcome<T::Result>>> {
        self.setup_stage_failed_via(n, stage, code, None)
    }

    /// [`Attempt::setup_stage_failed`] of a connection through the proxy `via`
    /// (`host:port`, never its credentials).
    pub fn setup_stage_failed_via(
        &self,
        n: u32,
        stage: Stage,
        code: Code,
        via: Option<String>,
    ) -> Result<(), Box<Outcome<T::Result>>> {
        self.settle_deferred()?;
        self.rec
            .connection_attempt_via(n, stage, code, via)
            .map(|_| ())
            .map_err(|e| Box::new(self.pipeline.journal_failed(self.rec, &e)))
    }

    /// Ends the attempt with a failure; after a recorded dispatch the record makes it
    /// `unknown` whatever is passed here.
    pub fn fail(
        &self,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
    ) -> Outcome<T::Result> {
        if let Err(stopped) = self.settle_deferred() {
            return *stopped;
        }
        self.pipeline
            .fail(self.rec, phase, code, retry, message, None)
    }

    /// [`Attempt::fail`] naming the request field to correct.
    pub fn fail_field(
        &self,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
        field: &str,
    ) -> Outcome<T::Result> {
        if let Err(stopped) = self.settle_deferred() {
            return *stopped;
        }
        self.pipeline
            .fail(self.rec, phase, code, retry, message, Some(field))
    }

    /// A step the journal refused or stopped.
    pub fn stopped(&self, e: StepError) -> Outcome<T::Result> {
        self.pipeline.stopped(self.rec, e)
    }

    /// What the record says now.
    pub fn recorded(&self) -> Outcome<T::Result> {
        if let Err(stopped) = self.settle_deferred() {
            return *stopped;
        }
        self.pipeline.outcome_of(self.rec)
    }

    /// Records the credential authorization and lease this attempt deferred to its
    /// dispatch gate ([`Recorder::defer_authorization`]) before anything else of the
    /// attempt is recorded, when the attempt ends before the gate opened. The outcome
    /// it ends with instead when that cannot be recorded (the credential was removed
    /// since it was read, or the journal refused).
    fn settle_deferred(&self) -> Result<(), Box<Outcome<T::Result>>> {
        self.rec
            .settle_deferred()
            .map_err(|e| Box::new(self.pipeline.stopped(self.rec, e)))
    }

    /// Records one answer from a peer broker (PEER_ANSWER).
    pub fn peer_answer(
        &self,
        answer: crate::federation::record::PeerAnswer,
    ) -> Result<crate::journal::Appended, crate::journal::JournalError> {
        self.rec.peer_answer(answer)
    }

    /// Ends the attempt not_attempted on the peer's verified "did not run"
    /// (PEER_NOT_RUN); the record refuses it without that attestation.
    pub fn peer_not_run(
        &self,
        code: Code,
        retry: Retry,
        message: &str,
        attestation_digest: &str,
    ) -> Result<crate::journal::projection::Projection, crate::journal::JournalError> {
        self.rec
            .peer_not_run(code, retry, message, attestation_digest)
            .map(|a| a.projection)
    }

    /// Records the incident a call through a peer stopped with (PEER_INCIDENT).
    pub fn peer_incident(
        &self,
        incident: crate::federation::record::PeerIncident,
    ) -> Result<crate::journal::Appended, crate::journal::JournalError> {
        self.rec.peer_incident(incident)
    }

    /// Markers of how far the request got and whether the remote began answering,
    /// recorded before a failure is. Markers are diagnosis, not proof: a failure to
    /// record them must not hide the failure being reported.
    pub fn mark(&self, request_started: bool, request_complete: bool, response: Option<Response>) {
        let response = response.map(|r| (r.status, r.remote_request_id));
        let _ = self.rec.mark(request_started, request_complete, response);
    }

    /// RESULT_COMMITTED with the stored result, fsynced, in one transaction with the
    /// exchange's markers, before anything is returned. `result` is what the caller
    /// gets back when the commit lands.
    pub async fn commit(
        &self,
        exchange: Exchange,
        stored: ResultToStore,
        settle: Settle,
        result: Option<T::Result>,
    ) -> Outcome<T::Result> {
        let (outcome, retry) = (settle.outcome, settle.retry);
        // A result comes only after the gate opened, which recorded any deferred start.
        if let Err(stopped) = self.settle_deferred() {
            return *stopped;
        }
        match self
            .rec
            .commit_exchange_async(exchange.clone(), stored, settle)
            .await
        {
            Ok(appended) => Outcome {
                result,
                ..Outcome::of_projection(&appended.projection, self.now_ms())
            },
            Err(e) => {
                // The remote answered completely and the result could not be stored (a
                // full disk, say): record that in a smaller transaction, so the record
                // still proves the outcome, and alert the operator. The caller gets the
                // copy in memory, the only one left.
                let recorded = self
                    .rec
                    .result_store_failed(exchange, outcome, retry, &e)
                    .map(|appended| appended.projection);
                self.journal()
                    .note_store_failure(self.rec.id(), recorded.is_ok(), &e);
                let mut answer = match recorded {
                    Ok(p) => Outcome::of_projection(&p, self.now_ms()),
                    Err(_) => {
                        let mut answer = self.pipeline.journal_failed(self.rec, &e);
                        if let Some(env) = answer.error.as_mut()
                            && env.error.code == Code::ResultStoreFailed
                        {
                            env.error.phase = Phase::ResultDelivery;
                        }
                        answer
                    }
                };
                answer.result = result;
                answer
            }
        }
    }
}

/// How the remote began answering, for a marker.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub status: Option<u16>,
    pub remote_request_id: Option<String>,
}

/// The dispatch boundary of one connection. [`Gate::open`] records DISPATCH_STARTED,
/// fsynced, immediately before the first byte of the request goes to the transport,
/// after re-verifying the fingerprint against the live configuration: a reload that
/// changed the target changes the fingerprint, and nothing is sent.
#[derive(Clone)]
pub struct Gate {
    rec: Recorder,
    config: ConfigHandle,
    target: String,
    action: NormalizedAction,
    bound: ConfigSnapshot,
    connection_id: String,
    /// The channel's [`Channel::fingerprint_now`].
    recompute: fn(&Config, &str, &NormalizedAction, &ConfigSnapshot) -> String,
}

/// Why a gate stayed shut; nothing was sent.
#[derive(Debug)]
pub enum GateShut {
    /// The journal refused or failed the record.
    Refused(StepError),
    /// The record did not finish (its task was lost).
    Interrupted,
}

impl Gate {
    /// The fingerprint of what is about to be sent, under the live configuration.
    fn fingerprint_now(&self) -> String {
        (self.recompute)(
            &self.config.current(),
            &self.target,
            &self.action,
            &self.bound,
        )
    }

    /// Records DISPATCH_STARTED naming the verified peer. The wait for its fsync parks
    /// no runtime thread ([`crate::journal::Journal::write_async`]).
    ///
    /// A caller that drops this future before it resolves has not opened the gate: it
    /// must not send. The record may still land (the job is not withdrawn), which only
    /// makes the invocation's outcome `unknown` rather than `not_attempted`, the safe
    /// side.
    pub async fn open(&self, peer: Option<String>) -> Result<(), GateShut> {
        let fingerprint_now = self.fingerprint_now();
        let connection_id = self.connection_id.clone();
        match self
            .rec
            .dispatch_started_async(&fingerprint_now, Some(connection_id), peer)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(GateShut::Refused(e)),
        }
    }
}

//! One invocation, from the agent's request to the delivered result.
//!
//! - [`pipeline`]: the sequence every channel runs through — accept, validate, bind,
//!   approve, credential and lease, attempt, delivery — and the [`Channel`] trait, the
//!   part a channel writes (validation and one attempt).
//! - [`hooks`]: the [`Channel`] trait a channel implements, and the values the pipeline
//!   passes its hooks (re-exported by [`pipeline`]).
//! - [`attempt`]: what a channel's attempt records through, and the dispatch [`Gate`].
//! - [`credential`]: the injection step's read of the bound credential.
//! - [`delivery`]: handing the result over: a stored result in resumable pieces (cursor,
//!   digests, size cap), and RESULT_DELIVERED / DELIVERY_FAILED.
//! - [`outcome`]: the one [`Outcome`] every call returns, and the envelopes for a
//!   journal that fails part-way.
//! - [`recorder`]: the record of one invocation, one method per durable transition.
//!   It, not the channel, decides what a failure proves.
//! - [`recovery`]: at startup, closing what a crash interrupted
//!   ([`Journal::recover_interrupted`](crate::journal::Journal::recover_interrupted)).

pub mod attempt;
pub mod credential;
pub mod delivery;
pub mod hooks;
pub mod outcome;
pub mod pipeline;
pub mod recorder;
pub mod recovery;

pub use crate::contract::Failure;
pub use attempt::{Attempt, Gate, GateShut, Response};
pub use delivery::{confirm_delivery, confirm_delivery_queued, delivery_failed};
pub use outcome::Outcome;
pub use pipeline::{
    Accepted, Bound, CallContext, CallerKind, Channel, Invalid, Pipeline, Validated,
};
pub use recorder::{Exchange, Recorder, RetryPlan, StepError, new_invocation_id};

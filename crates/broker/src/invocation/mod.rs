//! One invocation, from the agent's request to the delivered result.
//!
//! - [`pipeline`]: the sequence every channel runs through — accept, validate, bind,
//!   approve, credential and lease, attempt, commit — and the one [`Outcome`] it
//!   returns, with the failure envelopes for a journal that fails part-way.
//! - [`recorder`]: the record of one invocation, one method per durable transition.
//!   It, not the channel, decides what a failure proves.

pub mod pipeline;
pub mod recorder;

pub use pipeline::{
    Accepted, Attempt, Bound, CallContext, Channel, Failure, Gate, GateShut, Invalid, Outcome,
    Pipeline, Response, Validated,
};
pub use recorder::{Exchange, Recorder, RetryPlan, StepError, new_invocation_id};

//! The ground floor of record types: small values that the durable record, the
//! configuration and the evidence envelope all name, kept here so that each of those
//! can import them without importing one another.
//!
//! - [`job`]: how an invocation relates to the one it was started for, and a tracked
//!   job's state.
//! - [`session`]: who an agent session is (SESSION_OPENED).
//! - [`approval`]: the approval card and the agent as it names it.
//! - [`peer`]: what federated brokers attest and record about each other's answers.

pub mod approval;
pub mod job;
pub mod peer;
pub mod session;

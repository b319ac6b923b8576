//! The public error and evidence contract: a cause (the code) is not an outcome, and
//! every error envelope carries the evidence that supports its outcome.
//!
//! - [`codes`]: the closed vocabulary (`Phase`, `Outcome`, `Retry`, `Code` and its
//!   spec, the `error` member), on the ground floor.
//! - [`envelope`]: the envelope and its evidence, which names what a peer broker proved
//!   ([`crate::record::peer::PeerEvidence`]).

pub mod codes;
pub mod envelope;

pub use codes::*;
pub use envelope::{AttemptEvidence, Envelope, Evidence, IdempotencyEvidence};

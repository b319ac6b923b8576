//! What the front ends ask of the HTTP-request channels besides one run of the
//! pipeline. A channel holds only its hooks ([`channel::http`](crate::channel::http):
//! validate, the card, arm, attempt, the result type); the operations that run the
//! pipeline more than once, or read and extend a record after its run, are here, each in
//! a file named for what it does:
//!
//! - [`execute`]: a new call (`HttpChannel::execute`): the pipeline's run, a same-target
//!   redirect for a target that opted in, and the job a 202 queued noted.
//! - [`jobs`]: a 202's job, tracked as a linked invocation (`ensure_job`) and its status
//!   resource read (`poll_job`).
//! - [`reconcile`]: an unknown outcome settled by the target's reconcile query, and a
//!   batch's unknown members by its member query (`HttpChannel::reconcile`).
//! - [`retry`]: `retry_invocation` for every channel whose requests are HTTP requests
//!   (HTTP, and calls through a peer).
//!
//! They are methods on [`HttpChannel`](crate::channel::http::HttpChannel) (or on any
//! pipeline over HTTP requests), so callers reach them as before. This module stands on
//! the channels' floor, above `invocation`: it names `channel::http`'s request and result
//! types, which the pipeline must not.

pub mod execute;
pub mod jobs;
pub mod reconcile;
pub mod retry;

pub use jobs::{JobPoll, PollRefused};

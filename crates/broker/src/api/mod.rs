//! The two handles on a running broker, one per side of the boundary the product rests
//! on: [`AgentApi`] for whatever an agent drives (it can submit calls and read its own
//! invocations, nothing else), [`OperatorApi`] for the person's console. The
//! [`Broker`](crate::Broker) itself is never handed out: its parts are private to this
//! crate.

mod agent;
mod operator;

pub use agent::{AgentApi, NotOwned, Owned, Ran, Receipt};
pub use operator::OperatorApi;

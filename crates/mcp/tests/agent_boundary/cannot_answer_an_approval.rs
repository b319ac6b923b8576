//! The approver an agent's call carries can only ask a person: it is not the queue
//! that takes answers.

use std::sync::Arc;

use postern_broker::AgentApi;
use postern_broker::approvals::Approvals;
use tokio_util::sync::CancellationToken;

fn agent(api: AgentApi) {
    let ctx = api.context(None, CancellationToken::new());
    let queue: Arc<Approvals> = ctx.approver.unwrap();
    let _ = queue.approve("inv_1", "fingerprint", "agent");
}

fn main() {}

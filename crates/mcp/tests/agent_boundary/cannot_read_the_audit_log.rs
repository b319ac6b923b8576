//! No journal through the agent's handle: the record is read one owned invocation at a
//! time (see `cannot_forge_ownership.rs`).

use postern_broker::AgentApi;

fn agent(api: AgentApi) {
    let _ = api.journal();
}

fn main() {}

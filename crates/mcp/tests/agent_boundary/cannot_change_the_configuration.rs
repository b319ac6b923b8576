//! No configuration handle, no pause, no operator handle from the agent's.

use postern_broker::AgentApi;

fn agent(api: AgentApi) {
    let _ = api.config();
    let _ = api.set_agents_paused(false, "agent");
    let _ = api.operator();
}

fn main() {}

//! No vault through the agent's handle, and no way around it to the broker's parts.

use postern_broker::AgentApi;

fn agent(api: AgentApi) {
    let _ = api.vault();
}

fn broker(broker: &postern_broker::Broker) {
    let _ = &broker.vault;
}

fn main() {}

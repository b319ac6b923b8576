//! Another session's invocation cannot be passed off as one's own: an `Owned` is made
//! only by `AgentApi::owned`, which checks the session.

use postern_broker::AgentApi;
use postern_broker::api::Owned;
use postern_broker::journal::projection::Projection;

fn agent(api: AgentApi, theirs: Projection) {
    let stolen = Owned { projection: theirs };
    let _ = api.events(&stolen);
}

fn main() {}

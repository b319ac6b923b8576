//! What the agent side may do with its handle: submit, read its own invocations, list
//! targets, record its session and deliveries.

use postern_broker::AgentApi;
use postern_broker::channel::http::HttpRequest;
use tokio_util::sync::CancellationToken;

#[allow(dead_code)]
async fn agent(api: AgentApi, session: &str) {
    let ctx = api.context(Some(session.to_string()), CancellationToken::new());
    let ran = api.http(HttpRequest::default(), &ctx).await;
    let owned = api.owned(session, ran.outcome.invocation_id.as_str()).unwrap();
    let _ = api.events(&owned);
    let _ = api.children(&owned);
    let _ = api.piece(&owned, None, None);
    let _ = api.recorded_http(&owned);
    let _ = api.retry(&owned, &ctx).await;
    let _ = api.delivered(&owned.receipt());
    let _ = api.targets().http.len();
    let _ = api.agents_paused();
}

fn main() {}

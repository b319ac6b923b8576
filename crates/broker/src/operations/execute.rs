//! A new HTTP call: one run of the pipeline, then a same-target redirect for a target
//! that opted in (each hop its own invocation, linked `redirect`), and, for a 202, the
//! job it queued noted for `poll_job`.

use crate::channel::http::{Http, HttpOutcome, HttpRequest, target_of};
use crate::invocation::{CallContext, Pipeline};
use crate::journal::events::{ParentLink, Relation};

/// How long a redirect chain the channel follows for a target that opted in.
const MAX_REDIRECTS: u32 = 5;

impl Pipeline<Http> {
    /// Runs one agent request as a new invocation, and follows a same-target redirect
    /// when the target opted in.
    pub async fn execute(&self, request: HttpRequest, ctx: &CallContext) -> HttpOutcome {
        let outcome = self.execute_following(&request, ctx, 0).await;
        if outcome.result.as_ref().is_some_and(|r| r.status == 202) {
            // A failure here loses nothing: the submission's record names the status
            // resource, and poll_job tracks the job when it is first asked.
            let _ = self.ensure_job(&outcome.invocation_id);
        }
        outcome
    }

    async fn execute_following(
        &self,
        request: &HttpRequest,
        ctx: &CallContext,
        redirects: u32,
    ) -> HttpOutcome {
        let outcome = self.run(request, ctx).await;
        self.follow_redirect(outcome, request, ctx, redirects).await
    }

    /// Follows a redirect only for a target that opted in, and only to a URL under the
    /// same target (same origin, same credential): a credential never crosses origins.
    /// The child exchange is its own invocation with its own dispatch record.
    async fn follow_redirect(
        &self,
        outcome: HttpOutcome,
        request: &HttpRequest,
        ctx: &CallContext,
        redirects: u32,
    ) -> HttpOutcome {
        let config = self.config().current();
        let Some(response) = &outcome.result else {
            return outcome;
        };
        let Some(target) = target_of(&config, &request.method, &request.url) else {
            return outcome;
        };
        if !target.follow_redirects || redirects >= MAX_REDIRECTS {
            return outcome;
        }
        let status = response.status;
        if !matches!(status, 301 | 302 | 303 | 307 | 308) {
            return outcome;
        }
        let Some(location) = response
            .headers
            .iter()
            .find(|(k, _)| k == "location")
            .map(|(_, v)| v.clone())
        else {
            return outcome;
        };
        let Ok(base) = url::Url::parse(&request.url) else {
            return outcome;
        };
        let Ok(next) = base.join(&location) else {
            return outcome;
        };
        let same_target = target_of(&config, &request.method, next.as_str())
            .is_some_and(|t| t.name == target.name);
        if !same_target {
            return outcome;
        }
        // RFC 9110 §15.4: 307/308 keep method and body; 301/302/303 become GET.
        let (method, body) = if matches!(status, 307 | 308) {
            (request.method.clone(), request.body.clone())
        } else {
            ("GET".to_string(), Vec::new())
        };
        let child_ctx = CallContext {
            parent: Some(ParentLink {
                invocation_id: outcome.invocation_id.clone(),
                relation: Relation::Redirect,
            }),
            ..ctx.clone()
        };
        let child = HttpRequest {
            url: next.to_string(),
            method,
            headers: request.headers.clone(),
            query: Vec::new(),
            body,
            idempotency_key: None,
            timeout_ms: request.timeout_ms,
        };
        Box::pin(self.execute_following(&child, &child_ctx, redirects + 1)).await
    }
}

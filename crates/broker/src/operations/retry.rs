//! `retry_invocation` for the channels whose requests are HTTP requests: the request the
//! journal kept, sent again only if the record's decision allows
//! ([`Pipeline::retry_request`]).

use crate::channel::http::{HttpOutcome, HttpRequest, HttpResponse, stored_request};
use crate::invocation::outcome::unrecorded;
use crate::invocation::{CallContext, Channel, Pipeline, Recorder};

/// What the channels whose requests are HTTP requests (this one, and calls through a
/// peer) share.
impl<T> Pipeline<T>
where
    T: Channel<Request = HttpRequest, Result = HttpResponse>,
{
    /// `retry_invocation`: the stored request, retried if the record's decision allows
    /// (through a peer, the peer answers a repeat of this invocation from its record).
    pub async fn retry(&self, invocation_id: &str, ctx: &CallContext) -> HttpOutcome {
        let stored = match self.journal().load_request(invocation_id) {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                return match Recorder::resume(self.journal(), invocation_id) {
                    Ok(rec) => self.outcome_of(&rec),
                    Err(e) => unrecorded(invocation_id, &e),
                };
            }
            Err(e) => return unrecorded(invocation_id, &e),
        };
        let request = stored_request(stored);
        self.retry_request(invocation_id, &request, ctx).await
    }
}

//! One invocation as the console shows it: its transitions, what the record proves,
//! its envelope, its approval, the invocations linked to it, its job and batch members.

use serde_json::json;

use postern_broker::evidence;
use postern_broker::journal::events::{Channel, Event};
use postern_broker::journal::projection::Projection;
use postern_broker::journal::query::{self, InvocationRow};
use postern_broker::provenance::ApprovalRecord;

use super::activity::activity_row;
use super::{Console, journal_error};
use crate::dto::{
    ApprovalProof, CommandError, ErrorCode, InvocationDetail, RelatedInvocation, TimelineEvent,
};

impl Console {
    pub fn detail(&self, invocation_id: &str) -> Result<InvocationDetail, CommandError> {
        let row = self.read(|conn| query::row_by_id(conn, invocation_id, self.now()))?;
        let Some(row) = row else {
            return Err(CommandError::field(
                ErrorCode::UnknownInvocation,
                "invocation_id",
                format!("No invocation {invocation_id} in this journal."),
            ));
        };
        self.detail_of(row)
    }

    pub(super) fn detail_of(&self, row: InvocationRow) -> Result<InvocationDetail, CommandError> {
        let events = self
            .engine
            .journal()
            .events(&row.id)
            .map_err(|e| journal_error(&e))?;
        let p = Projection::fold(&row.id, &events).map_err(|e| journal_error(&e.into()))?;
        let now = self.now();
        let config = self.engine.config().current();
        let bound_query = p.operation.as_ref().is_some_and(|o| {
            o.source_query.is_some()
                || o.batch
                    .as_ref()
                    .is_some_and(|b| !b.atomic && b.member_query.is_some())
        });
        // A call through a peer is reconciled on the peer, which answers its record.
        let can_query = p.channel == Some(Channel::Peer)
            || (p.channel == Some(Channel::Http)
                && p.job.is_none()
                && (bound_query
                    || p.target
                        .as_deref()
                        .and_then(|t| config.http_target(t))
                        .is_some_and(|t| t.reconcile.is_some())));
        let children = self
            .engine
            .journal()
            .children(&row.id)
            .map_err(|e| journal_error(&e))?;
        // The invocation it was started for, then the ones started for it.
        let related: Vec<RelatedInvocation> = (p.parent.iter().cloned())
            .map(|link| (link, "parent"))
            .chain(children.into_iter().map(|link| (link, "child")))
            .map(|(link, role)| RelatedInvocation {
                link,
                role: role.to_string(),
            })
            .collect();
        let job = p.job.clone();
        let members = p.members.clone();
        let settlement = evidence::latest_reconciliation(&events);
        let manifest_verdict =
            evidence::latest_retry_verdict(&events).map(|v| v.as_str().to_string());
        let proof = evidence::what_the_record_proves(&p, &events);
        let agent = self.recorded_agent(row.session.as_deref());
        let approval = ApprovalRecord::of(&events)
            .as_ref()
            .map(ApprovalProof::from);
        let mut envelope = evidence::invocation_status(&p, now);
        envelope["message"] = json!(p.message);
        Ok(InvocationDetail {
            unsettled: evidence::is_unsettled(&p),
            row: activity_row(row),
            events: events.iter().map(timeline_event).collect(),
            envelope,
            proves: proof.proves_sentences(),
            does_not_prove: proof.does_not_prove_sentences(),
            manifest_verdict,
            can_query,
            settlement,
            agent,
            approval,
            related,
            job,
            members,
        })
    }
}

fn timeline_event(e: &Event) -> TimelineEvent {
    TimelineEvent {
        seq: e.seq,
        at_ms: e.recorded_at_ms,
        kind: e.body.kind().to_string(),
        step: evidence::step_of(&e.body).as_str().to_string(),
        detail: evidence::describe(&e.body),
    }
}

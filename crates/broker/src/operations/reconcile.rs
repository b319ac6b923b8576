//! Settling an unknown outcome from the remote's own word: the target's configured
//! reconcile query (run with the credential, as its own invocation linked
//! `reconcile_query`), and for a non-atomic batch its member query, member by member.
//! What a query proves is recorded as `remote_query` evidence on the original; nothing
//! is rewritten.

use crate::channel::http::{Http, HttpOutcome, HttpRequest, source_query, validate};
use crate::config::HttpTarget;
use crate::contract::{ConfidenceSource, Outcome};
use crate::invocation::outcome::unrecorded;
use crate::invocation::{CallContext, Pipeline, Recorder, new_invocation_id};
use crate::journal::NewInvocation;
use crate::journal::events::{self, ParentLink, Relation, Settlement as Reconciled};
use crate::retry::SourceQueryPredicate;

impl Pipeline<Http> {
    /// Runs the target's configured reconcile query for an unknown outcome (with the
    /// credential, as its own invocation) and records what it proves as `remote_query`
    /// evidence on the original. Returns the original's outcome afterwards.
    pub async fn reconcile(&self, invocation_id: &str, by: &str) -> HttpOutcome {
        let rec = match Recorder::resume(self.journal(), invocation_id) {
            Ok(r) => r,
            Err(e) => return unrecorded(invocation_id, &e),
        };
        let p = match rec.projection() {
            Ok(p) => p,
            Err(e) => return unrecorded(invocation_id, &e),
        };
        let member_query = p
            .operation
            .as_ref()
            .and_then(|o| o.batch.as_ref())
            .filter(|b| !b.atomic)
            .and_then(|b| b.member_query.clone());
        let unknown_members = p.members.iter().any(|m| m.outcome == Outcome::Unknown);
        if let Some(query) = member_query
            && unknown_members
            && p.terminal
        {
            return self.reconcile_members(&rec, &p, &query, by).await;
        }
        // A job settles through its status resource (poll_job) or an operator's
        // attestation, never through the target's query about a submission.
        if p.outcome != Outcome::Unknown || !p.terminal || p.job.is_some() {
            return self.recorded_outcome(&rec);
        }
        let config = self.config().current();
        let Some(target) = p.target.as_deref().and_then(|t| config.http_target(t)) else {
            return self.outcome_of(&rec);
        };
        // The query bound at preflight (what the retry manifest named); a record from
        // before binding reads the configuration.
        let key = p
            .operation
            .as_ref()
            .and_then(|o| o.idempotency.as_ref())
            .map(|i| i.key.clone());
        let bound_query = p
            .operation
            .as_ref()
            .and_then(|o| o.source_query.as_deref().cloned());
        let Some(query) = bound_query.or_else(|| {
            target
                .reconcile
                .as_ref()
                .and_then(|q| source_query(q, key.as_deref()))
        }) else {
            return self.outcome_of(&rec);
        };
        let probe = self.run_source_query(invocation_id, target, &query).await;
        let Some(response) = &probe.result else {
            let mut outcome = self.outcome_of(&rec);
            outcome.error = outcome.error.map(|mut env| {
                env.error.message = format!(
                    "The reconcile query did not complete ({}); the outcome stays unknown.",
                    probe.invocation_id
                );
                env
            });
            return outcome;
        };
        let settlement = if query.committed_status.contains(&response.status) {
            Reconciled::Committed
        } else if query.not_applied_status.contains(&response.status) {
            Reconciled::NotApplied
        } else {
            return self.outcome_of(&rec);
        };
        let note = format!(
            "reconcile query {} answered {}",
            probe.invocation_id, response.status
        );
        if let Err(e) = rec.reconcile(
            ConfidenceSource::RemoteQuery,
            settlement,
            by,
            &note,
            Some(response.status),
        ) {
            return self.journal_failed(&rec, &e);
        }
        self.outcome_of(&rec)
    }

    /// Settles a batch's unknown members one by one with the bound member query (each
    /// query its own invocation), then, once none is unknown, an unknown batch as a whole:
    /// committed if any member was applied, not applied if none was.
    async fn reconcile_members(
        &self,
        rec: &Recorder,
        p: &crate::journal::projection::Projection,
        query: &SourceQueryPredicate,
        by: &str,
    ) -> HttpOutcome {
        let config = self.config().current();
        let Some(target) = p.target.as_deref().and_then(|t| config.http_target(t)) else {
            return self.outcome_of(rec);
        };
        for member in p.members.iter().filter(|m| m.outcome == Outcome::Unknown) {
            let member_query = query.for_member(&member.id);
            let probe = self
                .run_source_query(&p.invocation_id, target, &member_query)
                .await;
            let Some(response) = &probe.result else {
                continue;
            };
            let settlement = if member_query.committed_status.contains(&response.status) {
                Reconciled::Committed
            } else if member_query.not_applied_status.contains(&response.status) {
                Reconciled::NotApplied
            } else {
                continue;
            };
            let note = format!(
                "member query {} answered {}",
                probe.invocation_id, response.status
            );
            if let Err(e) = rec.reconcile_member(
                &member.id,
                ConfidenceSource::RemoteQuery,
                settlement,
                by,
                &note,
                Some(response.status),
            ) {
                return self.journal_failed(rec, &e);
            }
        }
        let after = match rec.projection() {
            Ok(p) => p,
            Err(e) => return self.journal_failed(rec, &e),
        };
        let settled = after.members.iter().all(|m| m.outcome != Outcome::Unknown);
        if after.outcome == Outcome::Unknown && settled {
            let applied = after
                .members
                .iter()
                .filter(|m| m.outcome == Outcome::Committed)
                .count();
            let settlement = if applied > 0 {
                Reconciled::Committed
            } else {
                Reconciled::NotApplied
            };
            let note = format!(
                "member queries: {applied} of {} members applied",
                after.members.len()
            );
            if let Err(e) =
                rec.reconcile(ConfidenceSource::RemoteQuery, settlement, by, &note, None)
            {
                return self.journal_failed(rec, &e);
            }
        }
        self.outcome_of(rec)
    }

    /// Runs one source query on the target with its credential, as its own invocation
    /// linked to `for_invocation` (relation `reconcile_query`).
    async fn run_source_query(
        &self,
        for_invocation: &str,
        target: &HttpTarget,
        query: &SourceQueryPredicate,
    ) -> HttpOutcome {
        let base = target.base_url.as_str().trim_end_matches('/');
        let request = HttpRequest {
            url: format!("{base}/{}", query.path.trim_start_matches('/')),
            method: query.method.clone(),
            ..Default::default()
        };
        let ctx = CallContext {
            session: Some(format!("reconcile:{for_invocation}")),
            parent: Some(ParentLink {
                invocation_id: for_invocation.to_string(),
                relation: Relation::ReconcileQuery,
            }),
            ..Default::default()
        };
        match new_invocation_id() {
            Ok(id) => self.execute_query(id, &request, &ctx).await,
            Err(e) => unrecorded(for_invocation, &e),
        }
    }

    /// A broker-initiated query: validated and journaled like any request, but it is the
    /// operator's action, so agent approval policy does not apply.
    async fn execute_query(
        &self,
        id: String,
        request: &HttpRequest,
        ctx: &CallContext,
    ) -> HttpOutcome {
        let rec = match Recorder::accept(
            self.journal(),
            NewInvocation {
                invocation_id: id.clone(),
                channel: events::Channel::Http,
                target: String::new(),
                summary: validate::summary(request),
                session: ctx.session.clone(),
                idempotency_key: None,
                parent: ctx.parent.clone(),
            },
        ) {
            Ok(rec) => rec,
            Err(e) => return unrecorded(&id, &e),
        };
        let config = self.config().current();
        let validated = match validate::validate_query(request, &config) {
            Ok(v) => v,
            Err(v) => return self.reject(&rec, &v),
        };
        let bound = match self.bind(&rec, validated).await {
            Ok(b) => b,
            Err(outcome) => return *outcome,
        };
        let mut rec = rec;
        self.attempt(&mut rec, &bound, ctx).await
    }
}

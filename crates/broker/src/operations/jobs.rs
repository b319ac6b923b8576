//! A job an HTTP 202 queued: tracked as its own invocation (relation `job`, linked to the
//! submission) the first time it is seen, and its status resource read once per
//! `poll_job` (each read its own `job_poll` invocation), until the record says it ended.
//! A settled job is answered from its record; its status resource is never read again.

use crate::channel::http::{Http, HttpOutcome, HttpRequest, stored_response, target_of};
use crate::contract::Outcome;
use crate::invocation::{CallContext, Pipeline, new_invocation_id};
use crate::journal::NewInvocation;
use crate::journal::events::{self, ParentLink, Relation};

/// What `poll_job` answers: the job's record after the read, and the read itself.
#[derive(Debug, Clone)]
pub struct JobPoll {
    /// The job invocation's outcome: unknown while it is pending, committed once its
    /// status resource said it finished.
    pub job: HttpOutcome,
    /// The read of the status resource, when one was made (not for a settled job or
    /// a status resource outside the target).
    pub poll: Option<HttpOutcome>,
}

/// Why `poll_job` read nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PollRefused {
    #[error(
        "{0} is not a job and queued none: only an HTTP 202 Accepted that names a status resource (Location) starts a job"
    )]
    NotAJob(String),
    #[error("the journal could not be read or written: {0}")]
    Journal(String),
}

impl From<crate::journal::JournalError> for PollRefused {
    fn from(e: crate::journal::JournalError) -> Self {
        PollRefused::Journal(e.to_string())
    }
}

impl Pipeline<Http> {
    /// The job invocation a submission's 202 queued: the one already tracked, or a new
    /// one (relation `job`, same session and target) when the submission's result names
    /// a status resource. `None` when it names none.
    pub fn ensure_job(&self, submission: &str) -> Result<Option<String>, PollRefused> {
        let _held = self.channel().jobs.lock().map_err(|_| {
            PollRefused::Journal("a job lookup panicked earlier in this process".into())
        })?;
        let journal = self.journal();
        if let Some(job) = journal
            .children(submission)?
            .into_iter()
            .find(|c| c.relation == Relation::Job)
        {
            return Ok(Some(job.invocation_id));
        }
        let p = journal.projection(submission)?;
        let facts = p.result_facts.clone().unwrap_or_default();
        if p.outcome != Outcome::Committed || facts.http_status != Some(202) {
            return Ok(None);
        }
        let config = self.config().current();
        let target = p.target.as_deref().and_then(|t| config.http_target(t));
        let contract = target.and_then(|t| t.job.clone()).unwrap_or_default();
        let body = match &p.result_id {
            Some(id) => journal
                .read_result(id)
                .ok()
                .and_then(|r| stored_response(&r))
                .map(|r| r.body)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let Some(resource) = facts
            .status_resource
            .clone()
            .or_else(|| contract.status_in_body(&body))
        else {
            return Ok(None);
        };
        // Relative references resolve against the submission's own URL.
        let submitted = journal
            .load_request(submission)?
            .and_then(|(meta, _)| meta["url"].as_str().map(str::to_string));
        let url = submitted
            .as_deref()
            .and_then(|u| url::Url::parse(u).ok())
            .and_then(|base| base.join(&resource).ok())
            .map_or(resource, |u| u.to_string());
        let target_name = p.target.clone().unwrap_or_default();
        // The credential goes only where the submission's target covers.
        let pollable = target_of(&config, "GET", &url).is_some_and(|t| t.name == target_name);
        let job_id = contract.job_id(&body);
        let id = new_invocation_id()?;
        journal.accept(NewInvocation {
            invocation_id: id.clone(),
            channel: events::Channel::Http,
            target: target_name,
            summary: match &job_id {
                Some(job) => format!("job {job} at {url}"),
                None => format!("job at {url}"),
            },
            session: p.session.clone(),
            idempotency_key: None,
            parent: Some(ParentLink {
                invocation_id: submission.to_string(),
                relation: Relation::Job,
            }),
        })?;
        journal.append(
            &id,
            events::EventBody::JobTracked {
                submission: submission.to_string(),
                job_id,
                status_resource: url,
                pollable,
            },
        )?;
        Ok(Some(id))
    }

    /// `poll_job`: reads a job's status resource once (as its own `job_poll`
    /// invocation) and records what it said on the job. `invocation_id` names the job
    /// or the submission that queued it. A settled job is answered from its record; the
    /// status resource is never read again.
    pub async fn poll_job(
        &self,
        invocation_id: &str,
        ctx: &CallContext,
    ) -> Result<JobPoll, PollRefused> {
        let journal = self.journal();
        let first = journal.projection(invocation_id)?;
        let job_id = if first.job.is_some() {
            invocation_id.to_string()
        } else {
            self.ensure_job(invocation_id)?
                .ok_or_else(|| PollRefused::NotAJob(invocation_id.to_string()))?
        };
        let job = journal.projection(&job_id)?;
        let Some(facts) = job.job.clone() else {
            return Err(PollRefused::NotAJob(invocation_id.to_string()));
        };
        let answer = |poll| -> Result<JobPoll, PollRefused> {
            let p = journal.projection(&job_id)?;
            Ok(JobPoll {
                job: crate::invocation::Outcome::of_projection(&p, journal.now_ms()),
                poll,
            })
        };
        if job.outcome != Outcome::Unknown || !facts.pollable {
            return answer(None);
        }
        let request = HttpRequest {
            url: facts.status_resource.clone(),
            method: "GET".into(),
            ..Default::default()
        };
        let poll_ctx = CallContext {
            parent: Some(ParentLink {
                invocation_id: job_id.clone(),
                relation: Relation::JobPoll,
            }),
            session: job.session.clone(),
            ..ctx.clone()
        };
        let poll = self.run(&request, &poll_ctx).await;
        if let Some(response) = &poll.result {
            let config = self.config().current();
            let contract = job
                .target
                .as_deref()
                .and_then(|t| config.http_target(t))
                .and_then(|t| t.job.clone())
                .unwrap_or_default();
            let state = contract.state_of(response.status, &response.body);
            journal.append(
                &job_id,
                events::EventBody::JobStatus {
                    poll: poll.invocation_id.clone(),
                    http_status: response.status,
                    state,
                },
            )?;
        }
        answer(Some(poll))
    }
}

//! The console's side of the broker: everything a command does, written against the
//! broker types so it can be tested without a window. Commands in the desktop crate
//! are thin wrappers over these methods.
//!
//! This is the operator side. It may answer approvals, read the journal, attest
//! outcomes, store credentials and edit targets; none of it is reachable from the MCP
//! socket. Secret values only ever travel inward (into the keychain).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rusqlite::{Connection, OpenFlags};
use serde_json::json;

use postern_broker::OperatorApi;
use postern_broker::approvals::{AnswerError, Approvals, Pending};
use postern_broker::audit;
use postern_broker::config_edit::{self, TargetEditError};
use postern_broker::contract::Outcome;
use postern_broker::display::escape_text;
use postern_broker::evidence::{self, AttestError};
use postern_broker::journal::JournalError;
use postern_broker::journal::events::{Channel, Event};
use postern_broker::journal::projection::Projection;
use postern_broker::journal::query::{self, Filter, InvocationRow};
use postern_broker::provenance::{self, ApprovalRecord};
use postern_broker::ssh_keys::{KeyImportError, import_private_key};
use postern_broker::vault::{CredentialKind, Secret};
use postern_mcp::caller::ProcessInfo;
use postern_mcp::server::{SessionRecord, Sessions};

use crate::dto::*;

/// How many peer incidents the console lists.
pub const INCIDENT_LIST: usize = 200;

/// The most rows one activity page returns.
pub const MAX_PAGE: usize = 500;
/// How many unknown outcomes the reconciliation screen lists.
const RECONCILE_LIST: usize = 200;
/// How many invocations of one session the timeline shows (the newest).
const TIMELINE_LIMIT: usize = 500;

/// Where the console's broker lives and what it is called.
#[derive(Debug, Clone)]
pub struct Paths {
    pub data_dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub keychain: String,
}

/// The operator's view of one running broker.
pub struct Console {
    pub engine: OperatorApi,
    /// The agent sessions the broker's socket has seen (this run).
    pub sessions: Arc<Sessions>,
    pub approvals: Arc<Approvals>,
    pub paths: Paths,
    /// Who answers from this console, as recorded in the journal.
    pub operator: String,
    reader: Mutex<Option<Connection>>,
    integrity: Mutex<IntegrityState>,
    /// Where the last verification ended, for incremental checks.
    verified_prefix: Mutex<Option<audit::VerifiedPrefix>>,
    /// Serializes target edits (read, edit, validate, rename, reload).
    edit: Mutex<()>,
    /// How this broker is deployed, as the overview reports it.
    pub mode: Mode,
    /// Peers the operator socket refused (shared with the socket's server).
    pub operator_refusals: Arc<AtomicU64>,
}

/// How the broker behind a console is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The broker runs as the person's own user (the desktop app, or a daemon without an
    /// operator group): an agent running as that user can read the journal and reach
    /// the keychain.
    SingleUser,
    /// The broker runs as its own system user; operators reach it over the operator
    /// socket.
    PrivilegeSeparated,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::SingleUser => "single_user",
            Mode::PrivilegeSeparated => "privilege_separated",
        }
    }
}

fn journal_error(e: &JournalError) -> CommandError {
    CommandError::new(
        ErrorCode::JournalUnreadable,
        format!("The journal could not be read: {e}"),
    )
}

impl Console {
    pub fn new(
        engine: OperatorApi,
        sessions: Arc<Sessions>,
        approvals: Arc<Approvals>,
        paths: Paths,
    ) -> Self {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_else(|_| "operator".into());
        Console {
            engine,
            sessions,
            approvals,
            paths,
            operator: format!("console:{user}"),
            reader: Mutex::new(None),
            integrity: Mutex::new(IntegrityState::checking()),
            verified_prefix: Mutex::new(None),
            edit: Mutex::new(()),
            mode: Mode::SingleUser,
            operator_refusals: Arc::new(AtomicU64::new(0)),
        }
    }

    /// This console, reporting `mode` in its overview.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    fn now(&self) -> i64 {
        self.engine.journal().now_ms()
    }

    /// Runs `f` on a read-only connection to the journal (opened on first use; WAL lets
    /// it read while the broker writes).
    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, JournalError>,
    ) -> Result<T, CommandError> {
        let mut guard = self.reader.lock().map_err(|_| {
            CommandError::new(ErrorCode::Internal, "the journal reader was poisoned")
        })?;
        if guard.is_none() {
            let conn = Connection::open_with_flags(
                self.engine.journal().path(),
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(|e| journal_error(&JournalError::from(e)))?;
            let _ = conn.busy_timeout(std::time::Duration::from_secs(5));
            *guard = Some(conn);
        }
        match guard.as_ref() {
            Some(conn) => f(conn).map_err(|e| journal_error(&e)),
            None => Err(CommandError::new(ErrorCode::Internal, "no journal reader")),
        }
    }

    /// The newest journal sequence (0 for an empty journal).
    pub fn last_seq(&self) -> Result<u64, CommandError> {
        self.read(query::last_seq)
    }

    // ----- overview -------------------------------------------------------------------

    pub fn overview(&self) -> Result<Overview, CommandError> {
        let credentials = self.credential_metas()?.len();
        let config = self.engine.config().current();
        let unsettled = self.unsettled_rows()?.len();
        let store_failures = self
            .engine
            .journal()
            .store_failures()
            .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?;
        Ok(Overview {
            vault_empty: credentials == 0,
            credentials: count(credentials),
            targets: count(config.http.len() + config.ssh.len()),
            pending_approvals: count(self.approvals.pending().len()),
            needs_reconciliation: count(unsettled),
            data_dir: self.paths.data_dir.display().to_string(),
            config_path: self.paths.config.display().to_string(),
            socket: self.paths.socket.display().to_string(),
            bridge_command: bridge_command(),
            keychain: self.paths.keychain.clone(),
            mode: self.mode.as_str().to_string(),
            operator_refusals: u32::try_from(self.operator_refusals.load(Ordering::Relaxed))
                .unwrap_or(u32::MAX),
            last_seq: self.last_seq()?,
            result_store_failures: count(store_failures.len()),
            result_store_failure_latest: store_failures.last().map(|f| f.invocation_id.clone()),
            agents_paused: self.engine.pause().is_paused(),
        })
    }

    /// Pauses or resumes agent calls (operator only: the agent side has no way to reach
    /// this). While paused, calls that would run an invocation are refused with
    /// AGENTS_PAUSED; what runs finishes and pending approvals can still be answered.
    /// Each change is recorded in the journal under `operator`; a pause holds even if
    /// it cannot be recorded, a resume happens only once it is.
    pub fn set_agents_paused(
        &self,
        paused: bool,
        operator: &str,
    ) -> Result<AgentPauseState, CommandError> {
        self.engine
            .set_agents_paused(paused, operator)
            .map_err(|e| {
                let state = if self.engine.pause().is_paused() {
                    "Agents are paused"
                } else {
                    "Agents are not paused"
                };
                CommandError::new(
                    ErrorCode::JournalRefused,
                    format!("{state}, but the journal could not record the change: {e}"),
                )
            })?;
        Ok(AgentPauseState {
            paused: self.engine.pause().is_paused(),
        })
    }

    // ----- approvals ------------------------------------------------------------------

    pub fn approval_cards(&self) -> Vec<ApprovalCard> {
        let sessions = self.sessions.list();
        self.approvals
            .pending()
            .into_iter()
            .map(|p| card(p, &sessions))
            .collect()
    }

    /// Answers one card. Approve grants exactly `fingerprint`: if the request changed
    /// since the card was drawn, the broker refuses it with FINGERPRINT_MISMATCH and
    /// nothing is sent. Deny always stops the request. Both name the digest of the card
    /// answered (`card_digest`), which the journal records; an approval of a card other
    /// than the pending one is refused (CARD_CHANGED) and the request keeps waiting.
    pub fn answer(
        &self,
        invocation_id: &str,
        fingerprint: &str,
        card_digest: &str,
        decision: Decision,
    ) -> Result<(), CommandError> {
        self.answer_as(
            invocation_id,
            fingerprint,
            card_digest,
            decision,
            &self.operator,
        )
    }

    /// [`Console::answer`], recorded as answered by `operator` (the operator socket
    /// names the peer user).
    pub fn answer_as(
        &self,
        invocation_id: &str,
        fingerprint: &str,
        card_digest: &str,
        decision: Decision,
        operator: &str,
    ) -> Result<(), CommandError> {
        let not_pending = |e: AnswerError| match e {
            AnswerError::CardChanged { .. } => CommandError::field(
                ErrorCode::CardChanged,
                "card_digest",
                format!("{e}; the card changed since it was drawn, read it again"),
            ),
            AnswerError::NotPending(_) => CommandError::new(
                ErrorCode::NotPending,
                format!(
                    "{invocation_id} is no longer waiting for an answer (answered, timed out \
                     or cancelled by the agent)"
                ),
            ),
        };
        if card_digest.trim().is_empty() {
            return Err(CommandError::field(
                ErrorCode::InvalidInput,
                "card_digest",
                "An answer must name the card it answers.",
            ));
        }
        match decision {
            Decision::Approve => {
                if fingerprint.trim().is_empty() {
                    return Err(CommandError::field(
                        ErrorCode::InvalidInput,
                        "fingerprint",
                        "An approval must name the fingerprint it approves.",
                    ));
                }
                self.approvals
                    .approve_card(invocation_id, fingerprint, card_digest, operator)
                    .map_err(not_pending)
            }
            Decision::Deny => self
                .approvals
                .deny_card(invocation_id, card_digest, operator)
                .map_err(not_pending),
        }
    }

    // ----- sessions and timeline ------------------------------------------------------

    pub fn sessions(&self) -> Result<Vec<SessionSummary>, CommandError> {
        let live = self.sessions.list();
        let summary =
            |session: &str, invocations, first_at_ms, last_at_ms, recorded| SessionSummary {
                session: session.to_string(),
                invocations,
                first_at_ms,
                last_at_ms,
                agent: live
                    .iter()
                    .find(|l| l.identity.session == session)
                    .map(agent_card),
                recorded,
            };
        let rows = self.read(|conn| query::sessions(conn, 200))?;
        let mut out: Vec<SessionSummary> = rows
            .iter()
            .map(|r| {
                let recorded = self.recorded_agent(Some(&r.session));
                summary(
                    &r.session,
                    r.invocations,
                    r.first_at_ms,
                    r.last_at_ms,
                    recorded,
                )
            })
            .collect();
        // Sessions the journal recorded that never invoked anything (earlier runs too).
        let recorded = self.read(|conn| provenance::recorded_sessions(conn, 200))?;
        for r in &recorded {
            if !out.iter().any(|s| s.session == r.opened.session) {
                let agent = Some(RecordedAgent::from(r));
                out.push(summary(&r.opened.session, 0, r.at_ms, r.at_ms, agent));
            }
        }
        // Live sessions that have not invoked anything yet still show.
        for record in &live {
            let session = &record.identity.session;
            if !out.iter().any(|s| s.session == *session) {
                let agent = self.recorded_agent(Some(session));
                let seen = record.first_seen_ms;
                out.push(summary(session, 0, seen, seen, agent));
            }
        }
        out.sort_by_key(|s| std::cmp::Reverse(s.last_at_ms));
        Ok(out)
    }

    /// The agent of `session` as the journal recorded it (absent without a record, or
    /// when it cannot be read: the listing still shows the session).
    fn recorded_agent(&self, session: Option<&str>) -> Option<RecordedAgent> {
        let session = session?;
        let recorded = self.read(|conn| provenance::recorded_session(conn, session));
        recorded.ok().flatten().as_ref().map(RecordedAgent::from)
    }

    /// Every invocation of one session (the newest [`TIMELINE_LIMIT`]), oldest first,
    /// each with its transitions.
    pub fn timeline(&self, session: &str) -> Result<Vec<InvocationDetail>, CommandError> {
        let rows = self.read(|conn| {
            query::list(
                conn,
                &Filter {
                    session: Some(session.to_string()),
                    limit: Some(TIMELINE_LIMIT),
                    ..Filter::default()
                },
                self.now(),
            )
        })?;
        rows.into_iter()
            .rev()
            .map(|row| self.detail_of(row))
            .collect()
    }

    // ----- activity -------------------------------------------------------------------

    pub fn activity(
        &self,
        filter: &ActivityFilter,
        before_seq: Option<i64>,
        limit: usize,
    ) -> Result<ActivityPage, CommandError> {
        let started = Instant::now();
        let limit = limit.clamp(1, MAX_PAGE);
        let mut filter = to_filter(filter)?;
        filter.before_seq = before_seq;
        filter.limit = Some(limit);
        let rows = self.read(|conn| query::list(conn, &filter, self.now()))?;
        let next_before_seq = if rows.len() == limit {
            rows.last().map(|r| r.accepted_seq)
        } else {
            None
        };
        Ok(ActivityPage {
            rows: rows.into_iter().map(activity_row).collect(),
            next_before_seq,
            took_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        })
    }

    /// Writes every invocation matching `filter` to a new file in `dir`, page by page.
    pub fn export(
        &self,
        filter: &ActivityFilter,
        format: ExportFormat,
        dir: &Path,
    ) -> Result<ExportResult, CommandError> {
        use std::io::Write;
        let io = |e: std::io::Error| {
            CommandError::new(ErrorCode::ExportFailed, format!("{}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let extension = match format {
            ExportFormat::Jsonl => "jsonl",
            ExportFormat::Csv => "csv",
        };
        let path = dir.join(format!("postern-activity-{}.{extension}", self.now()));
        let tmp = path.with_extension(format!("{extension}.partial"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io)?;
        let mut out = std::io::BufWriter::new(file);
        let result = (|| {
            if format == ExportFormat::Csv {
                writeln!(
                    out,
                    "id,accepted_seq,accepted_at_ms,session,target,summary,phase,outcome,retry,code"
                )
                .map_err(io)?;
            }
            let mut before = None;
            let mut rows = 0u64;
            loop {
                let page = self.activity(filter, before, MAX_PAGE)?;
                for row in &page.rows {
                    match format {
                        ExportFormat::Jsonl => {
                            let line = serde_json::to_string(row).map_err(|e| {
                                CommandError::new(ErrorCode::ExportFailed, e.to_string())
                            })?;
                            writeln!(out, "{line}").map_err(io)?;
                        }
                        ExportFormat::Csv => writeln!(out, "{}", csv_line(row)).map_err(io)?,
                    }
                    rows += 1;
                }
                match page.next_before_seq {
                    Some(next) => before = Some(next),
                    None => break,
                }
            }
            out.flush().map_err(io)?;
            out.get_ref().sync_all().map_err(io)?;
            Ok(rows)
        })();
        match result {
            Ok(rows) => {
                std::fs::rename(&tmp, &path).map_err(io)?;
                Ok(ExportResult {
                    path: path.display().to_string(),
                    rows,
                })
            }
            Err(e) => {
                // A failed export leaves no half-written file behind.
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    // ----- one invocation -------------------------------------------------------------

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

    fn detail_of(&self, row: InvocationRow) -> Result<InvocationDetail, CommandError> {
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
        let mut related: Vec<RelatedInvocation> = p
            .parent
            .iter()
            .map(|l| RelatedInvocation {
                invocation_id: l.invocation_id.clone(),
                relation: l.relation.as_str().to_string(),
                role: "parent".into(),
            })
            .collect();
        let children = self
            .engine
            .journal()
            .children(&row.id)
            .map_err(|e| journal_error(&e))?;
        related.extend(children.into_iter().map(|l| RelatedInvocation {
            invocation_id: l.invocation_id,
            relation: l.relation.as_str().to_string(),
            role: "child".into(),
        }));
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

    // ----- peer incidents --------------------------------------------------------------

    /// The newest [`INCIDENT_LIST`] incidents of calls through peer brokers, newest
    /// first, each with the invocation's envelope and the last attestation received.
    pub fn peer_incidents(&self) -> Result<Vec<PeerIncidentRow>, CommandError> {
        use postern_broker::journal::events::EventBody;
        let recorded = self
            .engine
            .journal()
            .peer_incidents(INCIDENT_LIST)
            .map_err(|e| journal_error(&e))?;
        let now = self.now();
        let mut rows = Vec::with_capacity(recorded.len());
        for event in recorded {
            let EventBody::PeerIncident(incident) = event.body else {
                continue;
            };
            let events = self
                .engine
                .journal()
                .events(&event.invocation_id)
                .map_err(|e| journal_error(&e))?;
            let p = Projection::fold(&event.invocation_id, &events)
                .map_err(|e| journal_error(&e.into()))?;
            // The answer the incident names, else the last one before it.
            let attestation = events
                .iter()
                .rev()
                .filter(|e| e.seq < event.seq)
                .find_map(|e| match &e.body {
                    EventBody::PeerAnswer(a) => Some(a.attestation.clone()),
                    _ => None,
                })
                .flatten()
                .and_then(|a| serde_json::to_value(a).ok());
            rows.push(PeerIncidentRow {
                invocation_id: event.invocation_id.clone(),
                seq: event.seq,
                at_ms: event.recorded_at_ms,
                kind: incident.incident.as_str().to_string(),
                owner: incident.owner.as_str().to_string(),
                peer: escape_text(&incident.peer),
                capability: escape_text(&incident.capability),
                code: incident.code,
                signature: incident.signature.as_str().to_string(),
                attestation_digest: incident.attestation_digest.clone(),
                attestation,
                answers: incident.answers,
                transient_used: incident.transient_used,
                unknown_used: incident.unknown_used,
                // Seed 000's envelope (error and evidence), or the status when the
                // record carries no code any more (a reconciliation settled it).
                envelope: p
                    .envelope(now)
                    .and_then(|e| serde_json::to_value(e).ok())
                    .unwrap_or_else(|| evidence::invocation_status(&p, now)),
            });
        }
        Ok(rows)
    }

    // ----- reconciliation -------------------------------------------------------------

    /// The unknown outcomes that nothing has settled, among the newest
    /// [`RECONCILE_LIST`] unknown ones.
    fn unsettled_rows(&self) -> Result<Vec<InvocationRow>, CommandError> {
        self.read(|conn| query::unsettled(conn, RECONCILE_LIST, self.now()))
    }

    /// Every unknown outcome not yet settled, newest first.
    pub fn needs_reconciliation(&self) -> Result<Vec<InvocationDetail>, CommandError> {
        self.unsettled_rows()?
            .into_iter()
            .map(|row| self.detail_of(row))
            .collect()
    }

    /// Runs the target's configured reconcile query; what it proves is recorded on the
    /// original as `remote_query` evidence.
    pub async fn run_reconcile_query(
        &self,
        invocation_id: &str,
    ) -> Result<InvocationDetail, CommandError> {
        let before = self.detail(invocation_id)?;
        if !before.unsettled {
            return Err(CommandError::new(
                ErrorCode::NotUnknown,
                "This invocation's outcome is not an unsettled unknown; there is nothing to \
                 reconcile.",
            ));
        }
        if !before.can_query {
            return Err(CommandError::new(
                ErrorCode::NoReconcileQuery,
                "This target has no [http.reconcile] query configured; check the remote \
                 system and attest what you find.",
            ));
        }
        let through_peer = self
            .engine
            .journal()
            .projection(invocation_id)
            .is_ok_and(|p| p.channel == Some(Channel::Peer));
        let outcome = if through_peer {
            self.engine
                .peer()
                .reconcile(invocation_id, &self.operator)
                .await
                .0
        } else {
            self.engine
                .http()
                .reconcile(invocation_id, &self.operator)
                .await
        };
        let after = self.detail(invocation_id)?;
        if after.unsettled {
            let why = outcome
                .error
                .map(|e| e.error.message)
                .unwrap_or_else(|| "the query's answer did not settle the outcome".into());
            return Err(CommandError::new(ErrorCode::ReconcileInconclusive, why));
        }
        Ok(after)
    }

    /// Records an operator's attestation. The original attempt is never rewritten: a
    /// RECONCILED event (`operator_attested`, who, note) is appended.
    pub fn attest(&self, attestation: &Attestation) -> Result<InvocationDetail, CommandError> {
        evidence::attest(
            self.engine.journal(),
            &evidence::Attestation {
                invocation_id: &attestation.invocation_id,
                settlement: &attestation.settlement,
                note: &attestation.note,
                by: &self.operator,
            },
        )
        .map_err(|e| {
            let code = match &e {
                AttestError::UnknownSettlement
                | AttestError::EmptyNote
                | AttestError::NoteTooLong => ErrorCode::InvalidInput,
                AttestError::UnknownInvocation(_) => ErrorCode::UnknownInvocation,
                AttestError::NotUnsettled => ErrorCode::NotUnknown,
                AttestError::Unreadable(_) => ErrorCode::JournalUnreadable,
                AttestError::Refused(_) => ErrorCode::JournalRefused,
            };
            match e.field() {
                Some(field) => CommandError::field(code, field, e.to_string()),
                None => CommandError::new(code, e.to_string()),
            }
        })?;
        self.detail(&attestation.invocation_id)
    }

    // ----- credentials ----------------------------------------------------------------

    fn credential_metas(&self) -> Result<Vec<postern_broker::vault::CredentialMeta>, CommandError> {
        // The audit signing key lives in the vault too, but it is the broker's own: it is
        // neither listed nor removable here (removing it would orphan the checkpoints).
        Ok(self
            .engine
            .vault()
            .list()
            .map_err(|e| CommandError::new(e.code(), e.to_string()))?
            .into_iter()
            .filter(|m| m.id.as_str() != audit::AUDIT_KEY_ID)
            .collect())
    }

    pub fn credentials(&self) -> Result<Vec<CredentialCard>, CommandError> {
        let config = self.engine.config().current();
        Ok(self
            .credential_metas()?
            .into_iter()
            .map(|m| {
                let id = m.id.as_str().to_string();
                let used_by = config
                    .http
                    .iter()
                    .filter(|t| t.credential.as_str() == id)
                    .map(|t| t.name.clone())
                    .chain(
                        config
                            .ssh
                            .iter()
                            .filter(|t| t.credential.as_str() == id)
                            .map(|t| t.name.clone()),
                    )
                    .collect();
                CredentialCard {
                    kind: m.kind.as_str().to_string(),
                    version: m.version.as_str().to_string(),
                    created_at_ms: m.created_at_ms,
                    rotated_at_ms: (m.rotated_at_ms != m.created_at_ms).then_some(m.rotated_at_ms),
                    last_used_ms: m.last_used_at_ms,
                    used_by,
                    id,
                }
            })
            .collect())
    }

    /// Adds or rotates a credential. The value is moved into a zeroizing buffer at once,
    /// written to the keychain, and never returned or logged.
    pub fn set_credential(&self, input: SetCredential) -> Result<CredentialCard, CommandError> {
        let SetCredential {
            id,
            kind,
            secret,
            passphrase,
        } = input;
        let secret = Secret::from(secret);
        let passphrase = passphrase.map(Secret::from);
        reserved(&id)?;
        let kind: CredentialKind = kind.parse().map_err(|_| {
            CommandError::field(
                ErrorCode::InvalidInput,
                "kind",
                format!(
                    "Unknown credential kind; use one of: {}.",
                    CredentialKind::ALL
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
        if secret.is_empty() {
            return Err(CommandError::field(
                ErrorCode::InvalidInput,
                "secret",
                "The secret is empty; nothing was stored.",
            ));
        }
        let secret = if kind == CredentialKind::SshKey {
            let text = std::str::from_utf8(secret.expose()).map_err(|_| {
                CommandError::field(
                    ErrorCode::InvalidInput,
                    "secret",
                    "The SSH private key is not text.",
                )
            })?;
            let pass = passphrase
                .as_ref()
                .and_then(|p| std::str::from_utf8(p.expose()).ok())
                .filter(|p| !p.is_empty());
            match import_private_key(text, pass) {
                Ok(key) => key.private_openssh,
                Err(KeyImportError::PassphraseRequired) => {
                    return Err(CommandError::field(
                        ErrorCode::InvalidInput,
                        "passphrase",
                        "This SSH key is encrypted: enter its passphrase (used once to decrypt, \
                         never stored).",
                    ));
                }
                Err(e) => {
                    return Err(CommandError::field(
                        ErrorCode::InvalidInput,
                        "secret",
                        format!("{e}; nothing was stored."),
                    ));
                }
            }
        } else {
            secret
        };
        let stored = self
            .engine
            .vault()
            .set(&id, kind, &secret, self.now())
            .map_err(|e| CommandError::field(e.code(), "id", e.to_string()))?;
        drop(secret);
        self.credentials()?
            .into_iter()
            .find(|c| c.id == stored.id.as_str())
            .ok_or_else(|| {
                CommandError::new(ErrorCode::Internal, "the stored credential is not listed")
            })
    }

    pub fn remove_credential(&self, id: &str) -> Result<(), CommandError> {
        reserved(id)?;
        self.engine
            .vault()
            .remove(id)
            .map_err(|e| CommandError::field(e.code(), "id", e.to_string()))
    }

    // ----- targets --------------------------------------------------------------------

    pub fn targets(&self) -> Result<TargetList, CommandError> {
        let config = self.engine.config().current();
        let texts = postern_broker::config_edit::target_texts(&self.paths.config)
            .map_err(|e| CommandError::new(ErrorCode::ConfigUnreadable, e.to_string()))?;
        let text_of = |name: &str| {
            texts
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.text.clone())
                .unwrap_or_default()
        };
        let mut targets: Vec<TargetCard> = config
            .http
            .iter()
            .map(|t| TargetCard {
                name: t.name.clone(),
                channel: "http".into(),
                location: t.base_url.to_string(),
                credential: t.credential.as_str().to_string(),
                approval: t.approval.as_str().into(),
                version: t.version().to_string(),
                toml: text_of(&t.name),
            })
            .collect();
        targets.extend(config.ssh.iter().map(|t| TargetCard {
            name: t.name.clone(),
            channel: "ssh".into(),
            location: format!("{}@{}:{}", t.user, t.host, t.port),
            credential: t.credential.as_str().to_string(),
            approval: t.approval.as_str().into(),
            version: t.version().to_string(),
            toml: text_of(&t.name),
        }));
        Ok(TargetList {
            config_path: self.paths.config.display().to_string(),
            targets,
        })
    }

    /// Replaces one target's table in the config file, or adds a new target (the edited
    /// file is validated before it replaces the original), keeps the previous file in
    /// `config-history/`, and swaps the live config: an edited target gets a new
    /// version, so pending requests bound to the old one are refused at dispatch
    /// (FINGERPRINT_MISMATCH).
    pub fn update_target(&self, edit: &TargetEdit) -> Result<TargetCard, CommandError> {
        let _one_at_a_time = self
            .edit
            .lock()
            .map_err(|_| CommandError::new(ErrorCode::Internal, "the editor lock was poisoned"))?;
        let edited = config_edit::edit_target(
            &self.paths.config,
            &self.paths.data_dir,
            &edit.name,
            &edit.toml,
            self.now(),
        )
        .map_err(|e| match e {
            TargetEditError::Unreadable(e) => {
                CommandError::new(ErrorCode::ConfigUnreadable, e.to_string())
            }
            TargetEditError::Invalid(e) => {
                CommandError::field(ErrorCode::ConfigInvalid, "toml", e.to_string())
            }
        })?;
        self.engine.config().replace(edited.config);
        // Failing to keep the previous file does not undo the edit, but is said.
        if let Err(e) = edited.kept {
            eprintln!("postern-console: the previous config was not kept: {e}");
        }
        self.targets()?
            .targets
            .into_iter()
            .find(|t| t.name == edit.name)
            .ok_or_else(|| {
                CommandError::new(ErrorCode::Internal, "the edited target is not listed")
            })
    }

    // ----- integrity ------------------------------------------------------------------

    pub fn integrity(&self) -> IntegrityState {
        self.integrity
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|_| IntegrityState {
                state: "failed".into(),
                failure: Some("the integrity state was poisoned".into()),
                ..IntegrityState::checking()
            })
    }

    /// Verifies the whole journal file (chain, tree, checkpoints, signing policy, and
    /// the anchor outside the data dir) against this broker's key and stores the result
    /// for the banner. Blocking: run it off the UI thread.
    pub fn verify_now(&self) -> IntegrityState {
        let db = self.engine.journal().path().to_path_buf();
        let key = self.engine.journal().verifying_key();
        let witnesses = self.engine.config().current().witnesses.clone();
        let heads = match self
            .open_verifier(&db)
            .map(|conn| audit::witnessing::cosigned_heads(&conn, &key, &witnesses))
        {
            Some(Err(e)) => return self.store_integrity(Err(e), "full"),
            Some(Ok(heads)) => heads,
            None => Vec::new(),
        };
        let outside = audit::Outside {
            anchor: audit::default_anchor(&self.paths.data_dir),
            heads,
        };
        let result = audit::verify_file_prefix(&db, &key, &outside);
        // The prefix the incremental checks go on from.
        if let Ok(mut p) = self.verified_prefix.lock() {
            *p = result.as_ref().ok().map(|(_, prefix)| prefix.clone());
        }
        self.store_integrity(result.map(|(r, _)| r), "full")
    }

    /// Verifies only what the journal gained since the last check (a full one when
    /// there is none to go on from). Cheap enough to run after every change.
    pub fn verify_incremental(&self) -> IntegrityState {
        let db = self.engine.journal().path().to_path_buf();
        let key = self.engine.journal().verifying_key();
        let from = self.verified_prefix.lock().ok().and_then(|p| p.clone());
        let Some(from) = from else {
            return self.verify_now();
        };
        let Some(conn) = self.open_verifier(&db) else {
            return self.verify_now();
        };
        let result = audit::verify_since(&conn, &key, Some(&from));
        if let Ok(mut p) = self.verified_prefix.lock() {
            *p = result.as_ref().ok().map(|(_, prefix)| prefix.clone());
        }
        self.store_integrity(result.map(|(r, _)| r), "incremental")
    }

    fn open_verifier(&self, db: &Path) -> Option<Connection> {
        Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).ok()
    }

    fn store_integrity(
        &self,
        result: Result<audit::VerifyReport, audit::AuditError>,
        scope: &str,
    ) -> IntegrityState {
        let checked_at_ms = Some(self.now());
        // A witness that refused the journal's history outranks a local pass.
        let result = match (result, self.engine.witnessing().alarms().first()) {
            (Ok(_), Some(alarm)) => Err(audit::AuditError::Refuted {
                detail: alarm.clone(),
            }),
            (result, _) => result,
        };
        let state = match result {
            Ok(report) => IntegrityState {
                // Nothing signed is never "verified".
                state: if report.events == 0 {
                    "empty".into()
                } else {
                    "verified".into()
                },
                through_seq: Some(report.verified_through),
                checked_at_ms,
                events: report.events,
                checkpoints: report.checkpoints,
                failure: None,
                first_bad_seq: None,
                unsigned_events: 0,
                notes: report
                    .signed_late
                    .iter()
                    .map(|l| {
                        format!(
                            "events {}..={} were signed only when the broker next started \
                             (sequence {}): the run that wrote them ended without signing them",
                            l.first, l.last, l.at
                        )
                    })
                    .collect(),
                scope: scope.into(),
            },
            Err(e) => match e.unsigned_events() {
                Some(n) => IntegrityState {
                    state: "unsigned".into(),
                    through_seq: e.first_bad_seq().map(|s| s.saturating_sub(1)),
                    checked_at_ms,
                    unsigned_events: n,
                    failure: Some(e.to_string()),
                    first_bad_seq: e.first_bad_seq(),
                    scope: scope.into(),
                    ..IntegrityState::checking()
                },
                None => IntegrityState {
                    state: "failed".into(),
                    through_seq: e.first_bad_seq().map(|s| s.saturating_sub(1)),
                    checked_at_ms,
                    first_bad_seq: e.first_bad_seq(),
                    failure: Some(e.to_string()),
                    scope: scope.into(),
                    ..IntegrityState::checking()
                },
            },
        };
        if let Ok(mut s) = self.integrity.lock() {
            *s = state.clone();
        }
        state
    }
}

/// `postern` beside this executable (both are built into the same directory), else the
/// bare name for PATH lookup.
fn bridge_command() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("postern")))
        .filter(|p| p.is_file())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "postern".into())
}

/// The broker's own keychain entries cannot be written or removed from the console.
fn reserved(id: &str) -> Result<(), CommandError> {
    if id == audit::AUDIT_KEY_ID {
        return Err(CommandError::field(
            ErrorCode::InvalidInput,
            "id",
            format!("`{id}` is the broker's audit signing key; it cannot be changed here."),
        ));
    }
    Ok(())
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn to_filter(f: &ActivityFilter) -> Result<Filter, CommandError> {
    fn parse<T: Copy>(
        field: &str,
        value: &Option<String>,
        all: &[T],
        name: impl Fn(T) -> &'static str,
    ) -> Result<Option<T>, CommandError> {
        match value.as_deref().filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => all
                .iter()
                .copied()
                .find(|x| name(*x) == v)
                .map(Some)
                .ok_or_else(|| {
                    CommandError::field(
                        ErrorCode::InvalidInput,
                        field,
                        format!("Unknown {field} `{v}`."),
                    )
                }),
        }
    }
    use postern_broker::contract::{Code, Phase};
    let nonempty = |s: &Option<String>| {
        s.as_ref()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    Ok(Filter {
        session: nonempty(&f.session),
        target: nonempty(&f.target),
        phase: parse("phase", &f.phase, Phase::ALL, Phase::as_str)?,
        outcome: parse("outcome", &f.outcome, Outcome::ALL, Outcome::as_str)?,
        code: parse("code", &f.code, Code::ALL, Code::as_str)?,
        since_ms: f.since_ms,
        until_ms: f.until_ms,
        text: nonempty(&f.text),
        ..Filter::default()
    })
}

fn activity_row(r: InvocationRow) -> ActivityRow {
    ActivityRow {
        id: r.id,
        accepted_seq: r.accepted_seq,
        accepted_at_ms: r.accepted_at_ms,
        session: r.session,
        target: r.target,
        summary: escape_text(&r.summary),
        phase: r.phase.as_str().to_string(),
        outcome: r.outcome.as_str().to_string(),
        retry: r.retry.as_str().to_string(),
        code: r.code.map(|c| c.as_str().to_string()),
    }
}

fn csv_field(s: &str) -> String {
    // Quote every field that needs it, and defuse spreadsheet formulas.
    let s = if s.starts_with(['=', '+', '-', '@']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

fn csv_line(r: &ActivityRow) -> String {
    [
        csv_field(&r.id),
        r.accepted_seq.to_string(),
        r.accepted_at_ms.to_string(),
        csv_field(r.session.as_deref().unwrap_or("")),
        csv_field(&r.target),
        csv_field(&r.summary),
        r.phase.clone(),
        r.outcome.clone(),
        r.retry.clone(),
        r.code.clone().unwrap_or_default(),
    ]
    .join(",")
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

fn process_card(p: &ProcessInfo) -> ProcessCard {
    ProcessCard {
        pid: p.pid,
        executable: p.executable.as_deref().map(escape_text),
        claimed_command: escape_text(&p.command),
        cwd: p.cwd.as_deref().map(escape_text),
    }
}

fn agent_card(r: &SessionRecord) -> AgentCard {
    AgentCard {
        session: r.identity.session.clone(),
        agent: process_card(&r.identity.agent),
        parent_chain: r.identity.parent_chain.iter().map(process_card).collect(),
        first_seen_ms: r.first_seen_ms,
        ended_at_ms: r.ended_at_ms,
        connections: r.connections,
    }
}

fn card(p: Pending, sessions: &[SessionRecord]) -> ApprovalCard {
    let live = p
        .request
        .session
        .as_deref()
        .and_then(|s| sessions.iter().find(|rec| rec.identity.session == s))
        .map(agent_card);
    ApprovalCard::shown(&p.request.card(), p.requested_at_ms, p.expires_at_ms, live)
}

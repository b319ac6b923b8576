//! The console's side of the broker: everything a command does, written against the
//! broker types so it can be tested without a window. Commands in the desktop crate
//! are thin wrappers over these methods.
//!
//! This is the operator side. It may answer approvals, read the journal, attest
//! outcomes, store credentials and edit targets; none of it is reachable from the MCP
//! socket. Secret values only ever travel inward (into the keychain).
//!
//! Why this module is split: the console does many unrelated things (cards, sessions,
//! activity, one invocation, incidents, reconciliation, credentials, targets, integrity),
//! each against different broker parts; each has its own file, and they share the
//! [`Console`] handle and its journal reader defined here.
//!
//! # Layout
//! - `approvals.rs`: pending cards and the answer to one.
//! - `sessions.rs`: agent sessions and one session's timeline.
//! - `activity.rs`: the activity log, its filters and its export.
//! - `invocation.rs`: everything shown about one invocation.
//! - `incidents.rs`: incidents of calls through peer brokers.
//! - `reconcile.rs`: unknown outcomes, the reconcile query and attestations.
//! - `credentials.rs`: credential metadata, storing and removing one.
//! - `targets.rs`: the configured targets and editing one.
//! - `integrity.rs`: verifying the audit chain for the banner.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};

use postern_broker::OperatorApi;
use postern_broker::approvals::Approvals;
use postern_broker::audit;
use postern_broker::journal::JournalError;
use postern_broker::journal::query;
use postern_mcp::server::Sessions;

use crate::dto::{AgentPauseState, CommandError, ErrorCode, IntegrityState, Overview};

mod activity;
mod approvals;
mod credentials;
mod incidents;
mod integrity;
mod invocation;
mod reconcile;
mod sessions;
mod targets;

pub use activity::MAX_PAGE;
pub use incidents::INCIDENT_LIST;

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
        let live: Vec<_> = self
            .sessions
            .list()
            .into_iter()
            .filter(|s| s.ended_at_ms.is_none() && s.connections > 0)
            .collect();
        let confined = live
            .iter()
            .filter(|s| s.identity.confinement.is_confined())
            .count();
        Ok(Overview {
            unconfined_sessions: count(live.len() - confined),
            confined_sessions: count(confined),
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

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

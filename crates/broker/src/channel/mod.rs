//! Channels run invocations against remote systems (HTTP now, SSH later). This module
//! holds what they share: the call context (session, approver, cancellation), the
//! credential access the injection step uses, and the live configuration handle.
//!
//! - [`http`]: the HTTP channel.
//! - [`redact`]: scrubbing the injected secret from results.
//! - [`ssh`]: the SSH channel (russh).
//! - [`ssh_keys`]: importing user keys, pinning host keys from known_hosts lines.

pub mod http;
pub mod redact;
pub mod ssh;
pub mod ssh_keys;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};

use rusqlite::Connection;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::contract::{Code, Envelope, ErrorBody, Evidence, Outcome, Phase, Retry};
use crate::journal::JournalError;
use crate::vault::{CredentialId, CredentialMeta, Secret, Vault, VaultError};

/// The configuration in force. A reload swaps the whole snapshot; an invocation binds
/// the version it validated against and re-checks it right before dispatch.
#[derive(Clone)]
pub struct ConfigHandle(Arc<RwLock<Arc<Config>>>);

impl ConfigHandle {
    pub fn new(config: Config) -> Self {
        ConfigHandle(Arc::new(RwLock::new(Arc::new(config))))
    }

    pub fn current(&self) -> Arc<Config> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn replace(&self, config: Config) {
        match self.0.write() {
            Ok(mut g) => *g = Arc::new(config),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(config),
        }
    }
}

/// Keychain access for the injection step: the vault plus a connection for its
/// metadata. Calls block (D-Bus, SQLite); channels run them on the blocking pool.
pub struct Credentials {
    vault: Vault,
    conn: Mutex<Connection>,
}

impl Credentials {
    /// Opens credential metadata in the journal database at `db`.
    pub fn open(vault: Vault, db: &Path) -> Result<Credentials, JournalError> {
        let conn = crate::journal::schema::open_and_migrate(db)?;
        // Credential metadata writes (last-used times) need no fsync of their own: a
        // lost last-used time after a power cut is harmless, and an fsync here would sit
        // on every injection's hot path. WAL commits are ordered, so the journal's next
        // fsync makes a rotation durable too.
        conn.execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(|e| JournalError::Storage(e.to_string()))?;
        Ok(Credentials {
            vault,
            conn: Mutex::new(conn),
        })
    }

    fn with_conn<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, VaultError>,
    ) -> Result<T, VaultError> {
        let conn = self.conn.lock().map_err(|_| VaultError::Locked {
            backend: self.vault.keychain().backend(),
            reason: "credential metadata connection poisoned".into(),
        })?;
        f(&conn)
    }

    /// The non-secret metadata (current version tag) of a credential.
    pub fn meta(&self, id: &str) -> Result<CredentialMeta, VaultError> {
        let id = CredentialId::new(id)?;
        self.with_conn(|conn| {
            crate::vault::meta::get(conn, &id)?.ok_or_else(|| VaultError::Missing {
                credential: id.as_str().to_string(),
            })
        })
    }

    /// Reads the secret for injection. The only path by which secret bytes leave the
    /// keychain.
    pub fn read_for_injection(
        &self,
        id: &str,
        now_ms: i64,
    ) -> Result<(CredentialMeta, Secret), VaultError> {
        let id = CredentialId::new(id)?;
        self.with_conn(|conn| self.vault.read_for_injection(conn, &id, now_ms))
    }

    /// Stores (or rotates) a secret. Operator side only.
    pub fn set(
        &self,
        id: &str,
        kind: crate::vault::CredentialKind,
        secret: &Secret,
        now_ms: i64,
    ) -> Result<CredentialMeta, VaultError> {
        let id = CredentialId::new(id)?;
        self.with_conn(|conn| self.vault.set(conn, &id, kind, secret, now_ms))
    }

    /// Every credential's metadata (never a value). Operator side only.
    pub fn list(&self) -> Result<Vec<CredentialMeta>, VaultError> {
        self.with_conn(|conn| self.vault.list(conn))
    }

    /// Removes a credential and its keychain entry. Operator side only.
    pub fn remove(&self, id: &str) -> Result<(), VaultError> {
        let id = CredentialId::new(id)?;
        self.with_conn(|conn| self.vault.remove(conn, &id))
    }
}

/// Why an invocation did not get past approval (nothing was sent).
#[derive(Debug)]
pub enum ApprovalStop {
    /// Already recorded (denied, stale fingerprint): the envelope is in the error.
    Step(crate::invocation::StepError),
    /// To be recorded as this failure.
    Failed { code: Code, message: &'static str },
    /// The journal could not record the step.
    Journal(JournalError),
}

/// Asks a person when the target's approval mode says so. One place for both channels:
/// no console attached fails fast (NO_APPROVER), the card carries the bound fingerprint,
/// and only a grant of exactly that fingerprint lets the invocation go on.
pub async fn seek_approval(
    rec: &crate::invocation::Recorder,
    mode: crate::config::ApprovalMode,
    mut request: ApprovalRequest,
    ctx: &CallContext,
) -> Result<(), ApprovalStop> {
    use crate::config::ApprovalMode;
    request.mode = match mode {
        ApprovalMode::None => return Ok(()),
        ApprovalMode::Session => "session",
        ApprovalMode::PerCall => "per_call",
    };
    let Some(approver) = ctx.approver.clone() else {
        return Err(ApprovalStop::Failed {
            code: Code::NoApprover,
            message: "This target needs approval and no approval console is attached; nothing was sent.",
        });
    };
    let fingerprint = request.fingerprint.clone();
    rec.approval_requested(&fingerprint, request.mode)
        .map_err(ApprovalStop::Journal)?;
    let answer = tokio::select! {
        answer = approver.approve(request) => answer,
        () = ctx.cancel.cancelled() => {
            return Err(ApprovalStop::Failed {
                code: Code::CallerCancelled,
                message: "The caller cancelled while approval was pending; nothing was sent.",
            });
        }
    };
    match answer {
        ApprovalAnswer::Approved { fingerprint, by } => rec
            .approval_granted(&fingerprint, &by)
            .map(|_| ())
            .map_err(ApprovalStop::Step),
        ApprovalAnswer::Denied { by } => match rec.approval_denied(&fingerprint, &by) {
            Ok(stopped) => Err(ApprovalStop::Step(stopped)),
            Err(e) => Err(ApprovalStop::Journal(e)),
        },
        ApprovalAnswer::TimedOut => Err(ApprovalStop::Failed {
            code: Code::ApprovalTimeout,
            message: "Nobody answered the approval request in time; nothing was sent.",
        }),
    }
}

/// Why the credential bound to an invocation could not be had (nothing was sent).
#[derive(Debug, Clone)]
pub struct InjectionFailure {
    pub phase: Phase,
    pub code: Code,
    pub retry: Retry,
    pub message: String,
}

/// Reads the credential an invocation bound, off the async threads. A credential
/// rotated since binding is refused: it is a changed bound value, so a new invocation.
pub async fn read_bound_credential(
    credentials: &Arc<Credentials>,
    snapshot: &crate::action::ConfigSnapshot,
    now_ms: i64,
) -> Result<(CredentialMeta, Secret), InjectionFailure> {
    let credentials = credentials.clone();
    let credential_id = snapshot.credential_id.clone();
    let read =
        tokio::task::spawn_blocking(move || credentials.read_for_injection(&credential_id, now_ms))
            .await;
    let (meta, secret) = match read {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => {
            return Err(InjectionFailure {
                phase: Phase::CredentialInjection,
                code: e.code(),
                retry: e.code().spec().retry,
                message: e.to_string(),
            });
        }
        Err(_) => {
            return Err(InjectionFailure {
                phase: Phase::CredentialInjection,
                code: Code::VaultLocked,
                retry: Retry::AfterCorrection,
                message: "The keychain read did not finish.".into(),
            });
        }
    };
    if meta.version.as_str() != snapshot.credential_version {
        return Err(InjectionFailure {
            phase: Phase::Validation,
            code: Code::FingerprintMismatch,
            retry: Retry::AfterCorrection,
            message: "The credential was rotated after this request was bound; nothing was sent."
                .into(),
        });
    }
    Ok((meta, secret))
}

/// A request for a person's approval, bound to one fingerprint.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    pub invocation_id: String,
    pub session: Option<String>,
    pub target: String,
    pub summary: String,
    pub fingerprint: String,
    pub credential_id: String,
    pub credential_version: String,
    pub injection_mode: String,
    pub idempotency_key: Option<String>,
    /// `session` or `per_call`.
    pub mode: &'static str,
    /// What the card shows of the action itself.
    pub detail: ApprovalDetail,
}

impl ApprovalRequest {
    /// A card for `invocation_id` binding `fingerprint` under `snapshot` (target and
    /// credential as bound). `seek_approval` sets the mode; a caller with an idempotency
    /// key sets it.
    pub fn bound(
        invocation_id: &str,
        ctx: &CallContext,
        summary: String,
        fingerprint: String,
        snapshot: &crate::action::ConfigSnapshot,
        detail: ApprovalDetail,
    ) -> Self {
        ApprovalRequest {
            invocation_id: invocation_id.to_string(),
            session: ctx.session.clone(),
            target: snapshot.target_id.clone(),
            summary,
            fingerprint,
            credential_id: snapshot.credential_id.clone(),
            credential_version: snapshot.credential_version.clone(),
            injection_mode: snapshot.injection_mode.clone(),
            idempotency_key: None,
            mode: "",
            detail,
        }
    }
}

/// The action behind an approval card, as the fingerprint binds it. Agent-written text
/// (commands, bodies) is escaped so it cannot hide or reorder what a person reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ApprovalDetail {
    /// HTTP: the method.
    pub method: Option<String>,
    /// HTTP: the normalized URL.
    pub url: Option<String>,
    /// HTTP: the request body, previewed.
    pub body: Option<crate::display::BodyPreview>,
    /// SSH: `user@host:port`.
    pub ssh_destination: Option<String>,
    /// SSH: the command, escaped.
    pub command: Option<String>,
    /// SSH first connection: the host key fingerprint that approving pins.
    pub host_key: Option<String>,
}

/// A person's answer. An approval names the fingerprint it approves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalAnswer {
    Approved { fingerprint: String, by: String },
    Denied { by: String },
    TimedOut,
}

/// Whoever can approve (the desktop console). Headless brokers have none.
pub trait Approver: Send + Sync {
    fn approve(
        &self,
        request: ApprovalRequest,
    ) -> Pin<Box<dyn Future<Output = ApprovalAnswer> + Send + '_>>;
}

/// Who is calling and how to stop.
#[derive(Clone, Default)]
pub struct CallContext {
    pub session: Option<String>,
    pub approver: Option<Arc<dyn Approver>>,
    /// Cancelled when the caller loses interest; after dispatch the outcome stays
    /// unknown (the remote may still be running).
    pub cancel: CancellationToken,
}

/// An envelope for a failure that could not even be recorded (the journal is down).
/// Nothing was sent: every path that reaches the network records DISPATCH_STARTED
/// first, and that record is what failed.
pub fn unrecorded_failure(invocation_id: &str, error: &JournalError) -> Envelope {
    broker_unavailable(
        invocation_id,
        format!("The broker could not record this request; nothing was sent. ({error})"),
    )
}

/// The journal failed and its record cannot even be read back, after this invocation
/// may have been dispatched: nothing can prove the request stayed unsent, so report the
/// conservative outcome (a broker that cannot prove an operation stayed unattempted
/// must not call it a preflight failure).
pub fn unprovable(invocation_id: &str, error: &JournalError) -> Envelope {
    Envelope {
        invocation_id: invocation_id.to_string(),
        error: ErrorBody {
            code: Code::ResultStoreFailed,
            phase: Phase::RemoteExecution,
            outcome: Outcome::Unknown,
            retry: Retry::Reconcile,
            message: format!(
                "The journal failed and the record cannot be read; the request may have been sent. ({error})"
            ),
        },
        evidence: Evidence {
            dispatch_started: true,
            ..Evidence::default()
        },
    }
}

/// What to report when the journal failed part-way through an invocation: after a
/// recorded dispatch the outcome stands as recorded (the remote may have acted) with
/// RESULT_STORE_FAILED. Without one, nothing was sent, whether or not the record can be
/// read back: DISPATCH_STARTED is durable before the first byte goes out, so a request
/// this process never dispatched (and whose record shows no earlier dispatch) stayed
/// here. Only an invocation that may have dispatched and whose record is unreadable is
/// unprovable. What is answered for an invocation that left no record is remembered
/// for `get_invocation`.
pub fn journal_failure(
    rec: &crate::invocation::Recorder,
    error: &JournalError,
    now_ms: i64,
) -> Envelope {
    // A step that failed because an earlier one was refused for space says only that
    // the invocation is missing; name the cause instead.
    let full;
    let error = if !error.is_disk_full() && rec.journal().low_space() {
        full = JournalError::DiskFull {
            detail: crate::journal::space::describe(rec.journal().path()),
        };
        &full
    } else {
        error
    };
    match rec.projection() {
        Ok(p) if p.ever_dispatched => {
            let retry = p.retry(now_ms);
            let mut envelope = p.envelope(now_ms).unwrap_or_else(|| Envelope {
                invocation_id: p.invocation_id.clone(),
                error: ErrorBody {
                    code: Code::ResultStoreFailed,
                    phase: p.phase,
                    outcome: p.outcome,
                    retry,
                    message: String::new(),
                },
                evidence: p.evidence(),
            });
            envelope.error.code = Code::ResultStoreFailed;
            envelope.error.message = format!("The journal failed after dispatch: {error}");
            envelope
        }
        Ok(p) => {
            // Close the record if the journal takes it now (the reserve a full disk gives
            // back is there for this), so it does not stay "in progress" until a restart.
            if !p.terminal {
                let _ = rec.fail(
                    p.phase,
                    Code::BrokerUnavailable,
                    Retry::Backoff,
                    "The journal failed before dispatch; nothing was sent.",
                );
            }
            unrecorded_failure(rec.id(), error)
        }
        Err(_) if rec.may_have_dispatched() => unprovable(rec.id(), error),
        Err(_) => {
            let envelope = unrecorded_failure(rec.id(), error);
            rec.journal().note_unrecorded(crate::journal::Unrecorded {
                invocation_id: rec.id().to_string(),
                session: rec.session().map(str::to_string),
                envelope: envelope.clone(),
            });
            envelope
        }
    }
}

/// BROKER_UNAVAILABLE: nothing was recorded and nothing was sent.
pub fn broker_unavailable(invocation_id: &str, message: String) -> Envelope {
    Envelope {
        invocation_id: invocation_id.to_string(),
        error: ErrorBody {
            code: Code::BrokerUnavailable,
            phase: Phase::Validation,
            outcome: Outcome::NotAttempted,
            retry: Retry::Backoff,
            message,
        },
        evidence: Evidence::default(),
    }
}

/// The code and message for a vault failure at injection time.
pub fn vault_failure(e: &VaultError) -> (Code, String) {
    (e.code(), e.to_string())
}

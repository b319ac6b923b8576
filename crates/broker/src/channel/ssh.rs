//! The SSH channel: one command on a configured target, authenticated with an OpenSSH
//! private key from the keychain, against a pinned host key, classified by the last
//! boundary the records prove (seed 000: "For SSH, dispatch begins before the `exec`
//! channel request enters the authenticated transport").
//!
//! The order of one call: accept → validate → bind the snapshot and fingerprint →
//! approval → read the key → lease an attempt → connection setup (dns, tcp_connect,
//! ssh_kex, host_key, user_auth, channel_open; each failure recorded as a
//! `connection_setup` / `not_attempted` attempt) → DISPATCH_STARTED (fsynced,
//! fingerprint re-verified against the live config) → `exec` with want-reply →
//! channel success or failure → output, EOF, exit-status or exit-signal, close → the
//! settled result (fsynced) → return.
//!
//! Channel success only means the server accepted the request to start the command.
//! Only an exit-status or exit-signal settles it; a channel that closes without one is
//! `REMOTE_RESULT_INCOMPLETE` / `unknown`.
//!
//! A target without a pinned host key ends with `HOST_KEY_UNKNOWN`: the first-seen
//! approval that pins a key is a later step.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client;
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use russh::{ChannelMsg, Sig};
use serde::{Deserialize, Serialize};

use super::redact::Redactor;
use super::{
    ApprovalAnswer, ApprovalRequest, ApprovalStop, CallContext, ConfigHandle, Credentials,
    unrecorded_failure,
};
use crate::action::{ConfigSnapshot, Fingerprint, NormalizedAction, NormalizedSsh};
use crate::config::{ApprovalMode, SshTarget};
use crate::contract::{
    Code, ConfidenceSource, Envelope, Outcome, Phase, RemoteContract, Retry, Stage,
};
use crate::invocation::{Exchange, Recorder, StepError, new_invocation_id};
use crate::journal::events::{Channel, OperationFacts, ResultFacts};
use crate::journal::projection::Projection;
use crate::journal::{Journal, JournalError, NewInvocation, ResultToStore, Settle};

/// A shell command is never assumed repeatable: one dispatch per invocation.
const RETRY_BUDGET: u32 = 1;
/// The largest stdin a caller may send.
const MAX_STDIN_BYTES: usize = 16 * 1024 * 1024;

/// What an agent asks for (`ssh_exec`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshRequest {
    /// A target name, or a host that names exactly one target.
    pub host: String,
    pub command: String,
    #[serde(default)]
    pub stdin: Option<Vec<u8>>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// How the remote process ended when it was killed by a signal (RFC 4254 §6.10).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitSignal {
    /// Without the `SIG` prefix: `TERM`, `KILL`, ...
    pub name: String,
    pub core_dumped: bool,
    pub message: String,
}

/// A settled remote result, secrets scrubbed. A stream is complete only when the server
/// sent EOF and nothing was cut at the output limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshResult {
    pub exit_status: Option<u32>,
    pub exit_signal: Option<ExitSignal>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_complete: bool,
    pub stderr_complete: bool,
    /// `SHA256:<base64>` of the verified host key.
    pub host_key_fingerprint: String,
}

/// What a call produced: a settled result (any exit status), or an envelope saying
/// what the records prove.
#[derive(Debug, Clone)]
pub struct SshOutcome {
    pub invocation_id: String,
    pub outcome: Outcome,
    pub result: Option<SshResult>,
    /// Present when the record carries a code.
    pub error: Option<Envelope>,
}

#[derive(Clone)]
pub struct SshChannel {
    inner: Arc<Shared>,
}

struct Shared {
    journal: Journal,
    credentials: Arc<Credentials>,
    config: ConfigHandle,
    holder: String,
}

struct Prepared {
    target: SshTarget,
    action: NormalizedSsh,
    snapshot: ConfigSnapshot,
    fingerprint: String,
    request: SshRequest,
    timeout: Duration,
}

/// What the host key check saw; read after the handshake to name the failing stage.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostKeyVerdict {
    Matched {
        fingerprint: String,
    },
    Mismatch {
        fingerprint: String,
    },
    /// `key`: the presented key as `<algo> <base64>`, for a first-seen pin.
    Unpinned {
        fingerprint: String,
        key: Option<String>,
    },
}

struct Verifier {
    pinned: Option<PublicKey>,
    verdict: Arc<Mutex<Option<HostKeyVerdict>>>,
}

impl client::Handler for Verifier {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        // Certificates are not trusted here: only the exact pinned key is.
        let (verdict, ok) = match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => {
                let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
                match &self.pinned {
                    Some(pinned) if pinned.key_data() == key.key_data() => {
                        (HostKeyVerdict::Matched { fingerprint }, true)
                    }
                    Some(_) => (HostKeyVerdict::Mismatch { fingerprint }, false),
                    None => {
                        let key = key.to_openssh().ok().and_then(|line| {
                            crate::channel::ssh_keys::normalize_public_key(&line).ok()
                        });
                        (HostKeyVerdict::Unpinned { fingerprint, key }, false)
                    }
                }
            }
            PublicKeyOrCertificate::Certificate(cert) => {
                let fingerprint = cert.public_key().fingerprint(HashAlg::Sha256).to_string();
                let verdict = if self.pinned.is_some() {
                    HostKeyVerdict::Mismatch { fingerprint }
                } else {
                    // A certificate is never pinned as a host key.
                    HostKeyVerdict::Unpinned {
                        fingerprint,
                        key: None,
                    }
                };
                (verdict, false)
            }
        };
        if let Ok(mut slot) = self.verdict.lock() {
            *slot = Some(verdict);
        }
        Ok(ok)
    }
}

/// Why the call stopped before a settled result.
enum Stop {
    Timeout,
    Cancelled,
}

impl SshChannel {
    pub fn new(journal: Journal, credentials: Arc<Credentials>, config: ConfigHandle) -> Self {
        SshChannel {
            inner: Arc::new(Shared {
                journal,
                credentials,
                config,
                holder: format!("pid-{}", std::process::id()),
            }),
        }
    }

    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// Runs one command as a new invocation.
    pub async fn execute(&self, request: SshRequest, ctx: &CallContext) -> SshOutcome {
        let id = match new_invocation_id() {
            Ok(id) => id,
            Err(e) => return self.unrecorded("inv_unassigned", &e),
        };
        let config = self.inner.config.current();
        let target = config.resolve_ssh(&request.host).ok().cloned();
        let rec = match Recorder::accept_pipelined(
            &self.inner.journal,
            NewInvocation {
                invocation_id: id.clone(),
                channel: Channel::Ssh,
                target: target.as_ref().map(|t| t.name.clone()).unwrap_or_default(),
                summary: summary(target.as_ref(), &request),
                session: ctx.session.clone(),
                idempotency_key: None,
            },
        ) {
            Ok(rec) => rec,
            Err(e) => return self.unrecorded(&id, &e),
        };
        let Some(target) = target else {
            return self.fail(
                &rec,
                Phase::Validation,
                Code::InvalidTarget,
                Retry::AfterCorrection,
                "The host is not a configured ssh target (or names several).",
                Some("host"),
            );
        };
        let prepared = match self.bind(&rec, target, request) {
            Ok(p) => p,
            Err(outcome) => return *outcome,
        };
        if let Err(outcome) = self.approve(&rec, &prepared, ctx).await {
            return *outcome;
        }
        let mut rec = rec;
        self.run_attempt(&mut rec, &prepared, ctx).await
    }

    fn unrecorded(&self, id: &str, e: &JournalError) -> SshOutcome {
        let env = unrecorded_failure(id, e);
        SshOutcome {
            invocation_id: id.to_string(),
            outcome: env.error.outcome,
            result: None,
            error: Some(env),
        }
    }

    fn outcome_of_projection(&self, p: &Projection) -> SshOutcome {
        SshOutcome {
            invocation_id: p.invocation_id.clone(),
            outcome: p.outcome,
            result: None,
            error: p.envelope(self.inner.journal.now_ms()),
        }
    }

    fn stopped(&self, rec: &Recorder, e: StepError) -> SshOutcome {
        match e {
            StepError::Stopped(env) => SshOutcome {
                invocation_id: rec.id().to_string(),
                outcome: env.error.outcome,
                result: None,
                error: Some(*env),
            },
            StepError::Journal(e) => self.journal_failed(rec, &e),
        }
    }

    fn journal_failed(&self, rec: &Recorder, e: &JournalError) -> SshOutcome {
        let envelope = super::journal_failure(rec, e, self.inner.journal.now_ms());
        SshOutcome {
            invocation_id: rec.id().to_string(),
            outcome: envelope.error.outcome,
            result: None,
            error: Some(envelope),
        }
    }

    fn fail(
        &self,
        rec: &Recorder,
        phase: Phase,
        code: Code,
        retry: Retry,
        message: &str,
        field: Option<&str>,
    ) -> SshOutcome {
        match rec.fail_field(phase, code, retry, message, field) {
            Ok(appended) => self.outcome_of_projection(&appended.projection),
            Err(e) => self.journal_failed(rec, &e),
        }
    }

    /// Records a failed setup stage and ends the attempt (nothing was requested).
    fn setup_failed(&self, rec: &Recorder, stage: Stage, code: Code, detail: &str) -> SshOutcome {
        if let Err(e) = rec.connection_attempt(1, stage, code) {
            return self.journal_failed(rec, &e);
        }
        let message = if detail.is_empty() {
            code.spec().meaning.to_string()
        } else {
            format!("{} ({detail})", code.spec().meaning)
        };
        self.fail(
            rec,
            Phase::ConnectionSetup,
            code,
            code.spec().retry,
            &message,
            None,
        )
    }

    /// Validates and binds the snapshot and fingerprint (PREFLIGHT_VALIDATED).
    fn bind(
        &self,
        rec: &Recorder,
        target: SshTarget,
        request: SshRequest,
    ) -> Result<Prepared, Box<SshOutcome>> {
        if request.timeout_ms == Some(0) {
            return Err(Box::new(self.fail(
                rec,
                Phase::Validation,
                Code::InvalidRequest,
                Retry::AfterCorrection,
                "timeout_ms must be at least 1 (omit it to use the target's timeout).",
                Some("timeout_ms"),
            )));
        }
        let stdin = request.stdin.clone().unwrap_or_default();
        if stdin.len() > MAX_STDIN_BYTES {
            return Err(Box::new(self.fail(
                rec,
                Phase::Validation,
                Code::PayloadLimit,
                Retry::AfterCorrection,
                &format!("stdin is limited to {MAX_STDIN_BYTES} bytes."),
                Some("stdin"),
            )));
        }
        let action = match NormalizedSsh::new(
            &target.name,
            &target.user,
            request.command.as_bytes(),
            &stdin,
        ) {
            Ok(a) => a,
            Err(e) => {
                return Err(Box::new(self.fail(
                    rec,
                    Phase::Validation,
                    e.code,
                    Retry::AfterCorrection,
                    &e.message,
                    Some(&e.field),
                )));
            }
        };
        let meta = match self.inner.credentials.meta(target.credential.as_str()) {
            Ok(meta) => meta,
            Err(e) => {
                return Err(Box::new(self.fail(
                    rec,
                    Phase::CredentialInjection,
                    e.code(),
                    e.code().spec().retry,
                    &e.to_string(),
                    None,
                )));
            }
        };
        let snapshot = ConfigSnapshot::for_ssh(&target, meta.version.as_str());
        let fingerprint =
            Fingerprint::compute(&NormalizedAction::Ssh(action.clone()), &snapshot).to_string();
        let operation = OperationFacts {
            idempotent: false,
            remote_contract: RemoteContract::None,
            idempotency: None,
            reconcile_configured: false,
            retry_budget: RETRY_BUDGET,
        };
        if let Err(e) = rec.preflight(&fingerprint, snapshot.clone(), operation) {
            return Err(Box::new(self.stopped(rec, e)));
        }
        let stored = serde_json::json!({
            "host": request.host,
            "target": target.name,
            "command": request.command,
            "timeout_ms": request.timeout_ms,
        });
        if let Err(e) = self.inner.journal.store_request(rec.id(), stored, stdin) {
            return Err(Box::new(self.journal_failed(rec, &e)));
        }
        let timeout_ms = request
            .timeout_ms
            .map_or(target.timeout_ms, |t| t.min(target.timeout_ms));
        Ok(Prepared {
            target,
            action,
            snapshot,
            fingerprint,
            request,
            timeout: Duration::from_millis(timeout_ms.max(1)),
        })
    }

    async fn approve(
        &self,
        rec: &Recorder,
        p: &Prepared,
        ctx: &CallContext,
    ) -> Result<(), Box<SshOutcome>> {
        let config = self.inner.config.current();
        let mode = config
            .ssh_target(&p.target.name)
            .map(|t| t.approval)
            .unwrap_or(ApprovalMode::None);
        let request = ApprovalRequest::bound(
            rec.id(),
            ctx,
            summary(Some(&p.target), &p.request),
            p.fingerprint.clone(),
            &p.snapshot,
            super::ApprovalDetail {
                ssh_destination: Some(destination(&p.target)),
                command: Some(crate::display::escape_text(&p.request.command)),
                ..Default::default()
            },
        );
        super::seek_approval(rec, mode, request, ctx)
            .await
            .map_err(|stop| {
                Box::new(match stop {
                    ApprovalStop::Step(e) => self.stopped(rec, e),
                    ApprovalStop::Journal(e) => self.journal_failed(rec, &e),
                    ApprovalStop::Failed { code, message } => self.fail(
                        rec,
                        Phase::CredentialInjection,
                        code,
                        Retry::AfterCorrection,
                        message,
                        None,
                    ),
                })
            })
    }

    /// The fingerprint of what is about to be sent, under the live configuration.
    fn fingerprint_now(&self, p: &Prepared) -> String {
        let current = self.inner.config.current();
        match current.ssh_target(&p.target.name) {
            Some(t) => {
                let snapshot = ConfigSnapshot::for_ssh(t, p.snapshot.credential_version.clone());
                Fingerprint::compute(&NormalizedAction::Ssh(p.action.clone()), &snapshot)
                    .to_string()
            }
            None => String::from("target-removed"),
        }
    }

    /// A target without a pinned host key: a person approves the SHA256 fingerprint on a
    /// first-seen card, and the key is pinned in the configuration as a new version. The
    /// invocation itself stops here either way: its bound configuration has no pin, and
    /// a changed bound value means a new invocation.
    async fn first_seen(
        &self,
        rec: &Recorder,
        p: &Prepared,
        ctx: &CallContext,
        fingerprint: &str,
        key: Option<String>,
    ) -> SshOutcome {
        let unknown =
            |detail: &str| self.setup_failed(rec, Stage::HostKey, Code::HostKeyUnknown, detail);
        let (Some(approver), Some(key)) = (ctx.approver.clone(), key) else {
            return unknown(&format!(
                "the server presented {fingerprint}; approve it from the console or pin it with \
                 `postern config pin-host-key`"
            ));
        };
        let request = ApprovalRequest {
            mode: "host_key",
            ..ApprovalRequest::bound(
                rec.id(),
                ctx,
                format!(
                    "First connection to {} ({}:{}): host key {fingerprint}",
                    p.target.name, p.target.host, p.target.port
                ),
                fingerprint.to_string(),
                &p.snapshot,
                super::ApprovalDetail {
                    ssh_destination: Some(destination(&p.target)),
                    host_key: Some(fingerprint.to_string()),
                    ..Default::default()
                },
            )
        };
        let answer = tokio::select! {
            answer = approver.approve(request) => answer,
            () = ctx.cancel.cancelled() => ApprovalAnswer::TimedOut,
        };
        let by = match answer {
            ApprovalAnswer::Approved {
                fingerprint: approved,
                by,
            } if approved == fingerprint => by,
            ApprovalAnswer::Approved { .. } => {
                return unknown("a different host key was approved than the server presented");
            }
            ApprovalAnswer::Denied { by } => {
                return unknown(&format!("{by} did not accept host key {fingerprint}"));
            }
            ApprovalAnswer::TimedOut => {
                return unknown(&format!("nobody approved host key {fingerprint} in time"));
            }
        };
        let source = self.inner.config.current().source.clone();
        match crate::config_edit::pin_host_key(&source, &p.target.name, &key, false) {
            Ok((pinned, config)) => {
                self.inner.config.replace(config);
                let version = match pinned {
                    crate::config_edit::Pinned::Changed { new_version, .. } => new_version,
                    crate::config_edit::Pinned::Unchanged { version } => version,
                };
                unknown(&format!(
                    "{by} approved host key {fingerprint}; it is now pinned (configuration \
                     version {version}); send the command again"
                ))
            }
            Err(e) => unknown(&format!(
                "host key {fingerprint} was approved but not pinned: {e}"
            )),
        }
    }

    async fn run_attempt(&self, rec: &mut Recorder, p: &Prepared, ctx: &CallContext) -> SshOutcome {
        // The key: the only place secret bytes leave the keychain.
        let now = self.inner.journal.now_ms();
        let (meta, secret) =
            match super::read_bound_credential(&self.inner.credentials, &p.snapshot, now).await {
                Ok(pair) => pair,
                Err(f) => return self.fail(rec, f.phase, f.code, f.retry, &f.message, None),
            };
        let redactor = key_redactor(secret.expose());
        let key = match std::str::from_utf8(secret.expose())
            .ok()
            .and_then(|text| russh::keys::decode_secret_key(text, None).ok())
        {
            Some(k) => Arc::new(k),
            None => {
                return self.fail(
                    rec,
                    Phase::CredentialInjection,
                    Code::KeyDecryptionFailed,
                    Retry::AfterCorrection,
                    "The stored credential is not an unencrypted OpenSSH private key; nothing was sent.",
                    None,
                );
            }
        };
        drop(secret);
        let pinned = match &p.target.host_key {
            Some(text) => match PublicKey::from_openssh(text) {
                Ok(k) => Some(k),
                Err(e) => {
                    return self.fail(
                        rec,
                        Phase::Validation,
                        Code::InvalidTarget,
                        Retry::AfterCorrection,
                        &format!("The pinned host key does not parse: {e}"),
                        None,
                    );
                }
            },
            None => None,
        };
        let ttl = i64::try_from(p.timeout.as_millis())
            .unwrap_or(i64::MAX)
            .saturating_add(30_000);
        if let Err(e) = rec.authorize_and_start(
            &p.snapshot.credential_id,
            meta.version.as_str(),
            &self.inner.holder,
            ttl,
        ) {
            return self.journal_failed(rec, &e);
        }

        // Connection setup is bounded by the timeout; at dispatch the deadline restarts,
        // so the command itself gets the whole timeout (as the HTTP channel does for the
        // response body).
        let deadline = tokio::time::sleep(p.timeout);
        tokio::pin!(deadline);
        macro_rules! bounded {
            ($fut:expr) => {
                tokio::select! {
                    r = $fut => Ok(r),
                    () = &mut deadline => Err(Stop::Timeout),
                    () = ctx.cancel.cancelled() => Err(Stop::Cancelled),
                }
            };
        }
        let setup_stopped = |this: &Self, rec: &Recorder, stage: Stage, stop: Stop| match stop {
            Stop::Timeout => this.setup_failed(rec, stage, Code::ConnectTimeout, ""),
            Stop::Cancelled => this.fail(
                rec,
                Phase::ConnectionSetup,
                Code::CallerCancelled,
                Retry::Backoff,
                "The caller cancelled before dispatch; nothing was sent.",
                None,
            ),
        };

        // dns and tcp_connect.
        let host = p.target.host.clone();
        let port = p.target.port;
        let addrs: Vec<std::net::SocketAddr> =
            match bounded!(tokio::net::lookup_host((host.as_str(), port))) {
                Ok(Ok(a)) => a.collect(),
                Ok(Err(e)) => {
                    return self.setup_failed(rec, Stage::Dns, Code::DnsFailed, &e.to_string());
                }
                Err(stop) => return setup_stopped(self, rec, Stage::Dns, stop),
            };
        let stream = match bounded!(tokio::net::TcpStream::connect(addrs.as_slice())) {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let code = if e.kind() == std::io::ErrorKind::TimedOut {
                    Code::ConnectTimeout
                } else {
                    Code::ConnectionRefused
                };
                return self.setup_failed(rec, Stage::TcpConnect, code, &e.to_string());
            }
            Err(stop) => return setup_stopped(self, rec, Stage::TcpConnect, stop),
        };
        let _ = stream.set_nodelay(true);

        // ssh_kex and host_key.
        //
        // russh, not libssh2 (ssh2): libssh2's exit-status accessor returns 0 both for
        // "exited 0" and for "no exit status received", which would turn a command
        // whose result never arrived into a committed success. russh delivers exec
        // success/failure, exit-status, exit-signal, EOF and close as distinct messages.
        let verdict = Arc::new(Mutex::new(None));
        let handler = Verifier {
            pinned,
            verdict: verdict.clone(),
        };
        let config = Arc::new(client::Config {
            inactivity_timeout: None,
            nodelay: true,
            ..Default::default()
        });
        let connected = bounded!(client::connect_stream(config, stream, handler));
        let seen = verdict.lock().ok().and_then(|g| g.clone());
        let mut handle = match (connected, seen) {
            (Ok(Ok(h)), Some(HostKeyVerdict::Matched { .. })) => h,
            (_, Some(HostKeyVerdict::Mismatch { fingerprint })) => {
                return self.setup_failed(
                    rec,
                    Stage::HostKey,
                    Code::HostKeyMismatch,
                    &format!("the server presented {fingerprint}"),
                );
            }
            (_, Some(HostKeyVerdict::Unpinned { fingerprint, key })) => {
                return self.first_seen(rec, p, ctx, &fingerprint, key).await;
            }
            (Err(stop), _) => return setup_stopped(self, rec, Stage::SshKex, stop),
            (Ok(Err(e)), _) => {
                return self.setup_failed(
                    rec,
                    Stage::SshKex,
                    Code::SshHandshakeFailed,
                    &e.to_string(),
                );
            }
            (Ok(Ok(_)), None) => {
                return self.setup_failed(
                    rec,
                    Stage::HostKey,
                    Code::SshHandshakeFailed,
                    "the handshake finished without a host key check",
                );
            }
        };
        let host_key_fingerprint = match verdict.lock().ok().and_then(|g| g.clone()) {
            Some(HostKeyVerdict::Matched { fingerprint }) => fingerprint,
            _ => String::new(),
        };

        // user_auth.
        let hash = if key.algorithm().is_rsa() {
            match bounded!(handle.best_supported_rsa_hash()) {
                // Never fall back to SHA-1 signatures (`ssh-rsa`).
                Ok(Ok(Some(Some(h)))) => Some(h),
                Ok(Ok(_)) => Some(HashAlg::Sha512),
                Ok(Err(e)) => {
                    return self.setup_failed(
                        rec,
                        Stage::UserAuth,
                        Code::SshHandshakeFailed,
                        &e.to_string(),
                    );
                }
                Err(stop) => return setup_stopped(self, rec, Stage::UserAuth, stop),
            }
        } else {
            None
        };
        let auth = bounded!(handle.authenticate_publickey(
            p.target.user.clone(),
            PrivateKeyWithHashAlg::new(key.clone(), hash)
        ));
        drop(key);
        match auth {
            Ok(Ok(r)) if r.success() => {}
            Ok(Ok(_)) => {
                return self.setup_failed(rec, Stage::UserAuth, Code::SshAuthFailed, "");
            }
            Ok(Err(e)) => {
                return self.setup_failed(
                    rec,
                    Stage::UserAuth,
                    Code::SshHandshakeFailed,
                    &e.to_string(),
                );
            }
            Err(stop) => return setup_stopped(self, rec, Stage::UserAuth, stop),
        }

        // channel_open.
        let channel = match bounded!(handle.channel_open_session()) {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return self.setup_failed(
                    rec,
                    Stage::ChannelOpen,
                    Code::ChannelOpenFailed,
                    &e.to_string(),
                );
            }
            Err(stop) => return setup_stopped(self, rec, Stage::ChannelOpen, stop),
        };

        // DISPATCH_STARTED, fsynced, before the exec request is written.
        let fingerprint_now = self.fingerprint_now(p);
        let connection_id = format!("{}/g{}/c1", rec.id(), rec.generation());
        let gate_rec = rec.clone();
        let peer = Some(host_key_fingerprint.clone());
        let gate = tokio::task::spawn_blocking(move || {
            gate_rec.dispatch_started(&fingerprint_now, Some(connection_id), peer)
        })
        .await;
        match gate {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return self.stopped(rec, e),
            Err(_) => {
                return self.fail(
                    rec,
                    Phase::Validation,
                    Code::BrokerUnavailable,
                    Retry::Backoff,
                    "The dispatch record did not finish; nothing was sent.",
                    None,
                );
            }
        }

        deadline
            .as_mut()
            .reset(tokio::time::Instant::now() + p.timeout);
        let mut run = Run::new(p.target.max_output_bytes);
        let exchange = async {
            // want_reply: the server answers with channel success or failure.
            channel
                .exec(true, p.request.command.as_bytes().to_vec())
                .await
                .map_err(|_| Lost::Transport)?;
            let (mut read, write) = channel.split();
            let mut write = Some(write);
            let stdin = p.request.stdin.clone().unwrap_or_default();
            let mut writer: Option<tokio::task::JoinHandle<bool>> = None;
            while let Some(msg) = read.wait().await {
                match msg {
                    ChannelMsg::Success if !run.accepted => {
                        run.accepted = true;
                        let stdin = stdin.clone();
                        let Some(write) = write.take() else { continue };
                        writer = Some(tokio::spawn(async move {
                            let sent =
                                stdin.is_empty() || write.data(stdin.as_slice()).await.is_ok();
                            sent && write.eof().await.is_ok()
                        }));
                    }
                    ChannelMsg::Failure if !run.accepted => return Err(Lost::Refused),
                    other => run.observe(other),
                }
                if run.closed {
                    break;
                }
            }
            // A writer still blocked (the remote stopped reading stdin) must not hold a
            // settled result hostage: stdin is then recorded as incomplete.
            if let Some(w) = writer {
                if w.is_finished() {
                    run.stdin_complete = w.await.unwrap_or(false);
                } else {
                    w.abort();
                }
            }
            Ok(())
        };
        let ended = bounded!(exchange);
        // Closing our end does not stop the remote process; the record says so.
        let _ = handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
        match ended {
            Err(Stop::Timeout) => self.fail(
                rec,
                Phase::RemoteExecution,
                Code::RemoteTimeout,
                Retry::Reconcile,
                "No exit status arrived in time after the exec request; the remote process may still be running.",
                None,
            ),
            Err(Stop::Cancelled) => self.fail(
                rec,
                Phase::RemoteExecution,
                Code::CallerCancelled,
                Retry::Reconcile,
                "The caller cancelled after the exec request; the remote process may still be running.",
                None,
            ),
            Ok(Err(Lost::Refused)) => self.commit(
                rec,
                &run,
                &redactor,
                host_key_fingerprint,
                Settlement::Refused,
            ),
            Ok(Err(Lost::Transport)) => self.fail(
                rec,
                Phase::RemoteExecution,
                Code::RemoteOutcomeUnknown,
                Retry::Reconcile,
                "The connection failed while the exec request was being sent; the command may have started.",
                None,
            ),
            Ok(Ok(())) if run.exit_status.is_some() || run.exit_signal.is_some() => self.commit(
                rec,
                &run,
                &redactor,
                host_key_fingerprint,
                Settlement::Exited,
            ),
            Ok(Ok(())) if run.closed => self.fail(
                rec,
                Phase::RemoteExecution,
                Code::RemoteResultIncomplete,
                Retry::Reconcile,
                "The channel closed without an exit status or exit signal; the command's result is unknown.",
                None,
            ),
            Ok(Ok(())) => self.fail(
                rec,
                Phase::RemoteExecution,
                Code::RemoteOutcomeUnknown,
                Retry::Reconcile,
                "The connection was lost after the exec request and before an exit status; the command may have run.",
                None,
            ),
        }
    }

    fn commit(
        &self,
        rec: &Recorder,
        run: &Run,
        redactor: &Redactor,
        host_key_fingerprint: String,
        settlement: Settlement,
    ) -> SshOutcome {
        let digest = {
            let mut h = blake3::Hasher::new();
            for stream in [&run.stdout, &run.stderr] {
                h.update(&(stream.len() as u64).to_le_bytes());
                h.update(stream);
            }
            format!("blake3:{}", h.finalize().to_hex())
        };
        let (stdout, n_out) = redactor.scrub(&run.stdout);
        let (stderr, n_err) = redactor.scrub(&run.stderr);
        let result = SshResult {
            exit_status: run.exit_status,
            exit_signal: run.exit_signal.clone(),
            stdout,
            stderr,
            stdout_complete: run.eof && !run.stdout_truncated,
            stderr_complete: run.eof && !run.stderr_truncated,
            host_key_fingerprint,
        };
        let (outcome, code, retry) = match settlement {
            Settlement::Exited => (Outcome::Committed, None, Retry::Never),
            Settlement::Refused => (
                Outcome::Rejected,
                Some(Code::ExecRefused),
                Retry::AfterCorrection,
            ),
        };
        let stored = ResultToStore {
            meta: serde_json::json!({
                "exit_status": result.exit_status,
                "exit_signal": result.exit_signal,
                "stdout_complete": result.stdout_complete,
                "stderr_complete": result.stderr_complete,
                "stdout_truncated": run.stdout_truncated,
                "stderr_truncated": run.stderr_truncated,
                "exec_accepted": run.accepted,
                "eof": run.eof,
                "channel_closed": run.closed,
                "host_key_fingerprint": result.host_key_fingerprint,
            }),
            streams: vec![
                ("stdout".to_string(), result.stdout.clone()),
                ("stderr".to_string(), result.stderr.clone()),
            ],
        };
        let settle = Settle {
            outcome,
            code,
            retry,
            facts: ResultFacts {
                exit_status: result
                    .exit_status
                    .map(|s| i32::try_from(s).unwrap_or(i32::MAX)),
                exit_signal: result.exit_signal.as_ref().map(|s| s.name.clone()),
                ..Default::default()
            },
            confidence: ConfidenceSource::RemoteResponse,
            redactions: n_out.saturating_add(n_err),
        };
        // The exec request is the "headers"; stdin delivered with EOF is the "body".
        let exchange = Exchange {
            headers_sent: true,
            body_complete: run.stdin_complete,
            http_status: None,
            remote_request_id: None,
            digest,
        };
        match rec.commit_exchange(exchange, stored, settle) {
            Ok(appended) => {
                let mut outcome = self.outcome_of_projection(&appended.projection);
                if settlement == Settlement::Exited {
                    outcome.result = Some(result);
                }
                outcome
            }
            Err(e) => self.journal_failed(rec, &e),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settlement {
    Exited,
    Refused,
}

enum Lost {
    Refused,
    Transport,
}

/// What arrived on the channel after the exec request.
struct Run {
    limit: usize,
    accepted: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    eof: bool,
    closed: bool,
    stdin_complete: bool,
    exit_status: Option<u32>,
    exit_signal: Option<ExitSignal>,
}

impl Run {
    fn new(limit: u64) -> Self {
        Run {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            accepted: false,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            eof: false,
            closed: false,
            stdin_complete: false,
            exit_status: None,
            exit_signal: None,
        }
    }

    fn keep(buf: &mut Vec<u8>, truncated: &mut bool, data: &[u8], limit: usize) {
        let room = limit.saturating_sub(buf.len());
        if data.len() > room {
            *truncated = true;
        }
        buf.extend_from_slice(&data[..data.len().min(room)]);
    }

    fn observe(&mut self, msg: ChannelMsg) {
        match msg {
            ChannelMsg::Data { data } => {
                Self::keep(
                    &mut self.stdout,
                    &mut self.stdout_truncated,
                    &data,
                    self.limit,
                );
            }
            ChannelMsg::ExtendedData { data, ext: 1 } => {
                Self::keep(
                    &mut self.stderr,
                    &mut self.stderr_truncated,
                    &data,
                    self.limit,
                );
            }
            ChannelMsg::Eof => self.eof = true,
            ChannelMsg::Close => self.closed = true,
            ChannelMsg::ExitStatus { exit_status } if self.exit_signal.is_none() => {
                self.exit_status = Some(exit_status);
            }
            ChannelMsg::ExitSignal {
                signal_name,
                core_dumped,
                error_message,
                ..
            } if self.exit_status.is_none() => {
                self.exit_signal = Some(ExitSignal {
                    name: signal_name_of(&signal_name),
                    core_dumped,
                    message: error_message,
                });
            }
            _ => {}
        }
    }
}

fn signal_name_of(sig: &Sig) -> String {
    match sig {
        Sig::ABRT => "ABRT",
        Sig::ALRM => "ALRM",
        Sig::FPE => "FPE",
        Sig::HUP => "HUP",
        Sig::ILL => "ILL",
        Sig::INT => "INT",
        Sig::KILL => "KILL",
        Sig::PIPE => "PIPE",
        Sig::QUIT => "QUIT",
        Sig::SEGV => "SEGV",
        Sig::TERM => "TERM",
        Sig::USR1 => "USR1",
        Sig::Custom(name) => name.as_str(),
    }
    .to_string()
}

/// The private key text, and each line of its armored body, so output that echoes the
/// key (whole or line by line) is scrubbed.
fn key_redactor(secret: &[u8]) -> Redactor {
    let text = String::from_utf8_lossy(secret);
    let lines: Vec<Vec<u8>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .map(|l| l.as_bytes().to_vec())
        .collect();
    let trimmed = text.trim().as_bytes().to_vec();
    let mut rendered: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
    rendered.push(&trimmed);
    Redactor::new(secret, &rendered)
}

/// A secret-free description: target and a digest of the command.
fn destination(target: &SshTarget) -> String {
    format!("{}@{}:{}", target.user, target.host, target.port)
}

fn summary(target: Option<&SshTarget>, request: &SshRequest) -> String {
    let digest = blake3::hash(request.command.as_bytes()).to_hex();
    let name = target.map_or(request.host.as_str(), |t| t.name.as_str());
    format!("ssh {name} command blake3:{}", &digest.as_str()[..16])
}

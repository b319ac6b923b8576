//! One SSH attempt: dns, tcp_connect, ssh_kex, host_key, user_auth and channel_open
//! (each failure recorded as a `connection_setup` / `not_attempted` attempt), then
//! DISPATCH_STARTED, the `exec` request with want-reply, output, EOF, exit-status or
//! exit-signal and close, and the settled result.

use std::sync::{Arc, Mutex};

use russh::client;
use russh::keys::{HashAlg, PublicKey, PublicKeyOrCertificate};
use russh::{ChannelMsg, Sig};

use super::{Armed, ExitSignal, Ssh, SshOutcome, SshResult, StoredExec, destination};
use crate::approvals::{ApprovalAnswer, ApprovalDetail, ApprovalRequest};
use crate::budget::ByteBudget;
use crate::channel::guard::{AddressPolicy, LookupError, Resolver};
use crate::channel::redact::Redactor;
use crate::contract::{Code, ConfidenceSource, Outcome, Phase, Retry, Stage};
use crate::invocation::{Attempt, CallContext, Exchange, GateShut};
use crate::journal::Settle;
use crate::journal::events::ResultFacts;

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
                        let key = key
                            .to_openssh()
                            .ok()
                            .and_then(|line| crate::ssh_keys::normalize_public_key(&line).ok());
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

/// Records a failed setup stage and ends the attempt (nothing was requested).
fn setup_failed(attempt: &Attempt<'_, Ssh>, stage: Stage, code: Code, detail: &str) -> SshOutcome {
    if let Err(outcome) = attempt.setup_stage_failed(1, stage, code) {
        return *outcome;
    }
    let message = if detail.is_empty() {
        code.spec().meaning.to_string()
    } else {
        format!("{} ({detail})", code.spec().meaning)
    };
    attempt.fail(Phase::ConnectionSetup, code, code.spec().retry, &message)
}

/// Runs one armed attempt up to a stored result or a recorded failure.
pub(super) async fn attempt(
    resolver: &Resolver,
    attempt: Attempt<'_, Ssh>,
    armed: Armed,
    ctx: &CallContext,
) -> SshOutcome {
    let bound = attempt.bound();
    let p = &bound.plan;
    // Connection setup is bounded by the timeout; at dispatch the deadline restarts,
    // so the command itself gets the whole timeout (as the HTTP channel does for the
    // response body).
    let deadline = tokio::time::sleep(bound.timeout);
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
    // russh reported an error at `stage`: the handshake failed there.
    let handshake_failed = |attempt: &Attempt<'_, Ssh>, stage: Stage, e: russh::Error| {
        setup_failed(attempt, stage, Code::SshHandshakeFailed, &e.to_string())
    };
    let setup_stopped = |attempt: &Attempt<'_, Ssh>, stage: Stage, stop: Stop| match stop {
        Stop::Timeout => setup_failed(attempt, stage, Code::ConnectTimeout, ""),
        Stop::Cancelled => attempt.fail(
            Phase::ConnectionSetup,
            Code::CallerCancelled,
            Retry::Backoff,
            "The caller cancelled before dispatch; nothing was sent.",
        ),
    };

    // dns, the address guard and tcp_connect: the connect takes exactly the checked
    // addresses.
    let host = p.target.host.clone();
    let port = p.target.port;
    let policy = AddressPolicy::for_host(&host, p.target.allow_private);
    let addrs: Vec<std::net::SocketAddr> = match bounded!(resolver.lookup_checked(&host, policy)) {
        Ok(Ok(ips)) => ips
            .into_iter()
            .map(|ip| std::net::SocketAddr::new(ip, port))
            .collect(),
        Ok(Err(LookupError::Refused(refusal))) => {
            if let Err(outcome) =
                attempt.setup_stage_failed(1, Stage::AddressGuard, Code::AddressRefused)
            {
                return *outcome;
            }
            return attempt.fail(
                Phase::ConnectionSetup,
                Code::AddressRefused,
                Retry::AfterCorrection,
                &refusal.message(),
            );
        }
        Ok(Err(e)) => {
            return setup_failed(&attempt, Stage::Dns, Code::DnsFailed, &e.to_string());
        }
        Err(stop) => return setup_stopped(&attempt, Stage::Dns, stop),
    };
    let stream = match bounded!(tokio::net::TcpStream::connect(addrs.as_slice())) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let code = if e.kind() == std::io::ErrorKind::TimedOut {
                Code::ConnectTimeout
            } else if crate::platform::out_of_descriptors(&e) {
                // The broker is out of descriptors (ENFILE, EMFILE): not the remote's
                // doing, and nothing to correct (issue 26).
                Code::BrokerUnavailable
            } else {
                Code::ConnectionRefused
            };
            return setup_failed(&attempt, Stage::TcpConnect, code, &e.to_string());
        }
        Err(stop) => return setup_stopped(&attempt, Stage::TcpConnect, stop),
    };
    let _ = stream.set_nodelay(true);
    // Where the key will come from, for a first-seen card: the address connected to and
    // every address the name resolved to.
    let reached = describe_reached(&host, &addrs, stream.peer_addr().ok());

    // ssh_kex and host_key.
    //
    // russh, not libssh2 (ssh2): libssh2's exit-status accessor returns 0 both for
    // "exited 0" and for "no exit status received", which would turn a command
    // whose result never arrived into a committed success. russh delivers exec
    // success/failure, exit-status, exit-signal, EOF and close as distinct messages.
    let verdict = Arc::new(Mutex::new(None));
    let handler = Verifier {
        pinned: armed.pinned.clone(),
        verdict: verdict.clone(),
    };
    let config = Arc::new(client::Config {
        inactivity_timeout: None,
        nodelay: true,
        ..Default::default()
    });
    let connected = bounded!(client::connect_stream(config, stream, handler));
    let seen = verdict.lock().ok().and_then(|g| g.clone());
    let (mut handle, host_key_fingerprint) = match (connected, seen) {
        (Ok(Ok(h)), Some(HostKeyVerdict::Matched { fingerprint })) => (h, fingerprint),
        (_, Some(HostKeyVerdict::Mismatch { fingerprint })) => {
            return setup_failed(
                &attempt,
                Stage::HostKey,
                Code::HostKeyMismatch,
                &format!("the server presented {fingerprint}"),
            );
        }
        (_, Some(HostKeyVerdict::Unpinned { fingerprint, key })) => {
            return first_seen(&attempt, ctx, &fingerprint, key, reached).await;
        }
        (Err(stop), _) => return setup_stopped(&attempt, Stage::SshKex, stop),
        (Ok(Err(e)), _) => {
            return handshake_failed(&attempt, Stage::SshKex, e);
        }
        (Ok(Ok(_)), None) => {
            return setup_failed(
                &attempt,
                Stage::HostKey,
                Code::SshHandshakeFailed,
                "the handshake finished without a host key check",
            );
        }
    };

    // user_auth.
    let hash = if armed.key.is_rsa() {
        match bounded!(handle.best_supported_rsa_hash()) {
            // Never fall back to SHA-1 signatures (`ssh-rsa`).
            Ok(Ok(Some(Some(h)))) => Some(h),
            Ok(Ok(_)) => Some(HashAlg::Sha512),
            Ok(Err(e)) => {
                return handshake_failed(&attempt, Stage::UserAuth, e);
            }
            Err(stop) => return setup_stopped(&attempt, Stage::UserAuth, stop),
        }
    } else {
        None
    };
    let mut signer = super::signer::ThreadSigner(&armed.key);
    let auth = bounded!(handle.authenticate_publickey_with(
        p.target.user.clone(),
        armed.key.public().clone(),
        hash,
        &mut signer
    ));
    match auth {
        Ok(Ok(r)) if r.success() => {}
        Ok(Ok(_)) => {
            return setup_failed(&attempt, Stage::UserAuth, Code::SshAuthFailed, "");
        }
        Ok(Err(e @ super::signer::KeyError::Session)) => {
            return setup_failed(
                &attempt,
                Stage::UserAuth,
                Code::SshHandshakeFailed,
                &e.to_string(),
            );
        }
        // The key thread failed: the broker's doing, and nothing was sent.
        Ok(Err(e)) => {
            return setup_failed(
                &attempt,
                Stage::UserAuth,
                Code::BrokerUnavailable,
                &e.to_string(),
            );
        }
        Err(stop) => return setup_stopped(&attempt, Stage::UserAuth, stop),
    }

    // channel_open.
    let channel = match bounded!(handle.channel_open_session()) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return setup_failed(
                &attempt,
                Stage::ChannelOpen,
                Code::ChannelOpenFailed,
                &e.to_string(),
            );
        }
        Err(stop) => return setup_stopped(&attempt, Stage::ChannelOpen, stop),
    };

    // DISPATCH_STARTED, fsynced, before the exec request is written.
    let gate = attempt.gate(attempt.connection_id(1));
    match gate.open(Some(host_key_fingerprint.clone())).await {
        Ok(()) => {}
        Err(GateShut::Refused(e)) => return attempt.stopped(e),
        Err(GateShut::Interrupted) => {
            return attempt.fail(
                Phase::Validation,
                Code::BrokerUnavailable,
                Retry::Backoff,
                "The dispatch record did not finish; nothing was sent.",
            );
        }
    }

    deadline
        .as_mut()
        .reset(tokio::time::Instant::now() + bound.timeout);
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
                        let sent = stdin.is_empty() || write.data(stdin.as_slice()).await.is_ok();
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
            Err(Stop::Timeout) => attempt.fail(Phase::RemoteExecution,
                Code::RemoteTimeout,
                Retry::Reconcile,
                "No exit status arrived in time after the exec request; the remote process may still be running."),
            Err(Stop::Cancelled) => attempt.fail(Phase::RemoteExecution,
                Code::CallerCancelled,
                Retry::Reconcile,
                "The caller cancelled after the exec request; the remote process may still be running."),
            Ok(Err(Lost::Refused)) => commit(&attempt, &run, &armed.redactor,
                host_key_fingerprint,
                Settlement::Refused,
            ).await,
            Ok(Err(Lost::Transport)) => attempt.fail(Phase::RemoteExecution,
                Code::RemoteOutcomeUnknown,
                Retry::Reconcile,
                "The connection failed while the exec request was being sent; the command may have started."),
            Ok(Ok(())) if run.exit_status.is_some() || run.exit_signal.is_some() => commit(&attempt, &run, &armed.redactor,
                host_key_fingerprint,
                Settlement::Exited,
            ).await,
            Ok(Ok(())) if run.closed => attempt.fail(Phase::RemoteExecution,
                Code::RemoteResultIncomplete,
                Retry::Reconcile,
                "The channel closed without an exit status or exit signal; the command's result is unknown."),
            Ok(Ok(())) => attempt.fail(Phase::RemoteExecution,
                Code::RemoteOutcomeUnknown,
                Retry::Reconcile,
                "The connection was lost after the exec request and before an exit status; the command may have run."),
        }
}

/// A target without a pinned host key: a person approves the SHA256 fingerprint on a
/// first-seen card, and the key is pinned in the configuration as a new version. The
/// invocation itself stops here either way: its bound configuration has no pin, and
/// a changed bound value means a new invocation.
async fn first_seen(
    attempt: &Attempt<'_, Ssh>,
    ctx: &CallContext,
    fingerprint: &str,
    key: Option<String>,
    reached: String,
) -> SshOutcome {
    let p = &attempt.bound().plan;
    let unknown =
        |detail: &str| setup_failed(attempt, Stage::HostKey, Code::HostKeyUnknown, detail);
    let (Some(approver), Some(key)) = (ctx.approver.clone(), key) else {
        return unknown(&format!(
            "the server presented {fingerprint}; approve it from the console or pin it with \
                 `postern config pin-host-key`"
        ));
    };
    let request = ApprovalRequest {
        mode: "host_key",
        covers: crate::approvals::covers("host_key", &p.target.name, 1),
        agent: crate::provenance::card_agent_of(attempt.journal(), ctx.session.as_deref()),
        ..ApprovalRequest::bound(
            attempt.invocation_id(),
            ctx.session.clone(),
            format!(
                "First connection to {} ({}:{}): host key {fingerprint}",
                p.target.name, p.target.host, p.target.port
            ),
            fingerprint.to_string(),
            &attempt.bound().snapshot,
            ApprovalDetail {
                ssh_destination: Some(destination(&p.target)),
                host_key: Some(fingerprint.to_string()),
                resolved: Some(reached),
                ..Default::default()
            },
        )
    };
    // Journaled like every other approval (issue 26): the card and its digest, then the
    // answer. The events name the invocation's bound fingerprint; the card binds the key.
    let rec = attempt.recorder();
    let bound_fingerprint = &attempt.bound().fingerprint;
    if let Err(e) = rec.approval_requested(bound_fingerprint, "host_key", request.card()) {
        return unknown(&format!("the host key card could not be recorded: {e}"));
    }
    let answer = tokio::select! {
        answer = approver.approve(request) => answer,
        () = ctx.cancel.cancelled() => ApprovalAnswer::TimedOut,
    };
    let by = match answer {
        ApprovalAnswer::Approved {
            fingerprint: approved,
            by,
            card_digest,
        } if approved == fingerprint => {
            if let Err(e) = rec.approval_granted(bound_fingerprint, &by, card_digest) {
                return unknown(&format!("the approval could not be recorded: {e:?}"));
            }
            by
        }
        ApprovalAnswer::Approved { .. } => {
            return unknown("a different host key was approved than the server presented");
        }
        ApprovalAnswer::Denied { by, card_digest } => {
            if let Err(e) = rec.denial(bound_fingerprint, &by, card_digest) {
                return unknown(&format!("the denial could not be recorded: {e}"));
            }
            return unknown(&format!("{by} did not accept host key {fingerprint}"));
        }
        ApprovalAnswer::TimedOut => {
            return unknown(&format!("nobody approved host key {fingerprint} in time"));
        }
    };
    let source = attempt.config().current().source.clone();
    match crate::config_edit::pin_host_key(&source, &p.target.name, &key, false) {
        Ok((pinned, config)) => {
            attempt.config().replace(config);
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

/// What a first-seen card says of where the key came from: the address the connection
/// reached and what the name resolved to (an agent that maps the name to its own server
/// shows up here).
fn describe_reached(
    host: &str,
    addrs: &[std::net::SocketAddr],
    peer: Option<std::net::SocketAddr>,
) -> String {
    let all: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    let peer = peer.map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
    format!(
        "key presented by {peer}; {host} resolved to {}",
        all.join(", ")
    )
}

async fn commit(
    attempt: &Attempt<'_, Ssh>,
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
    let stored = StoredExec {
        exit_status: result.exit_status,
        exit_signal: result.exit_signal.clone(),
        stdout_complete: result.stdout_complete,
        stderr_complete: result.stderr_complete,
        stdout_truncated: run.stdout_truncated,
        stderr_truncated: run.stderr_truncated,
        exec_accepted: run.accepted,
        eof: run.eof,
        channel_closed: run.closed,
        host_key_fingerprint: result.host_key_fingerprint.clone(),
    }
    .to_store(&result);
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
    let exchange = Exchange::exec(run.stdin_complete, digest);
    // A refused exec settles as rejected and returns no output.
    let returned = (settlement == Settlement::Exited).then_some(result);
    attempt.commit(exchange, stored, settle, returned).await
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
/// The output all running commands may hold at once in the broker's memory, beside each
/// target's own `max_output_bytes` per stream: issue 26 found four calls holding 1 GB.
/// Output past it is cut and its stream marked incomplete, as at a target's limit.
pub const MAX_OUTPUT_HELD: usize = 256 * 1024 * 1024;

/// The broker's one budget for command output.
static OUTPUT: ByteBudget = ByteBudget::new(MAX_OUTPUT_HELD);

struct Run {
    /// Where this run's output is counted; what it holds is given back when it ends.
    budget: &'static ByteBudget,
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
        Run::within(limit, &OUTPUT)
    }

    fn within(limit: u64, budget: &'static ByteBudget) -> Self {
        Run {
            budget,
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

    fn keep(
        budget: &ByteBudget,
        buf: &mut Vec<u8>,
        truncated: &mut bool,
        data: &[u8],
        limit: usize,
    ) {
        let room = budget.take_up_to(data.len().min(limit.saturating_sub(buf.len())));
        if data.len() > room {
            *truncated = true;
        }
        buf.extend_from_slice(&data[..room]);
    }

    fn observe(&mut self, msg: ChannelMsg) {
        match msg {
            ChannelMsg::Data { data } => {
                Self::keep(
                    self.budget,
                    &mut self.stdout,
                    &mut self.stdout_truncated,
                    &data,
                    self.limit,
                );
            }
            ChannelMsg::ExtendedData { data, ext: 1 } => {
                Self::keep(
                    self.budget,
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

impl Drop for Run {
    fn drop(&mut self) {
        self.budget
            .give_back(self.stdout.len().saturating_add(self.stderr.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(bytes: &[u8]) -> ChannelMsg {
        ChannelMsg::Data {
            data: bytes::Bytes::copy_from_slice(bytes),
        }
    }

    // Regression: issue 26 (item 8): output was bounded per stream and per call only.
    #[test]
    fn concurrent_commands_share_one_output_budget_and_give_it_back_when_they_end() {
        static BUDGET: ByteBudget = ByteBudget::new(10);
        let mut first = Run::within(1000, &BUDGET);
        first.observe(out(b"12345678"));
        let mut second = Run::within(1000, &BUDGET);
        second.observe(out(b"abcdef"));
        assert_eq!(second.stdout, b"ab", "only what is left of the budget");
        assert!(second.stdout_truncated, "a cut stream says so");
        assert!(!first.stdout_truncated);
        assert_eq!(BUDGET.held(), 10);
        drop(first);
        assert_eq!(BUDGET.held(), 2);
        let mut third = Run::within(1000, &BUDGET);
        third.observe(out(b"xyzxyzxy"));
        assert_eq!(third.stdout, b"xyzxyzxy");
        drop((second, third));
        assert_eq!(BUDGET.held(), 0);
    }
}

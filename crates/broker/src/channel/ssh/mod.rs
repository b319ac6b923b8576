//! The SSH channel: one command on a configured target, authenticated with an OpenSSH
//! private key from the keychain, against a pinned host key. The [invocation
//! pipeline](crate::invocation::pipeline) runs it; this module holds validation, the
//! key, and the result types, and `exec` the connection and the command.
//!
//! For SSH, dispatch begins before the `exec` channel request enters the authenticated
//! transport: DISPATCH_STARTED is durable before it is written. Channel success only
//! means the server accepted the request to start the command. Only an exit-status or
//! exit-signal settles it; a channel that closes without one is
//! `REMOTE_RESULT_INCOMPLETE` / `unknown`.
//!
//! A target without a pinned host key asks a person to approve the presented key
//! (first seen); approving pins it, and the command is sent again as a new invocation.

mod exec;
mod signer;

use std::sync::Arc;
use std::time::Duration;

use russh::keys::PublicKey;
use serde::{Deserialize, Serialize};

use crate::action::{NormalizedAction, NormalizedSsh};
use crate::approvals::ApprovalDetail;
use crate::channel::guard::{AddressPolicy, Resolver};
use crate::channel::redact::Redactor;
use crate::config::{Config, ConfigHandle, SshTarget};
use crate::contract::{Code, Phase, RemoteContract, Retry};
use crate::invocation::{
    Accepted, Attempt, Bound, CallContext, Channel, Failure, Invalid, Pipeline, Validated,
};
use crate::journal::events::{self, OperationFacts};
use crate::journal::{Journal, ResultToStore, StoredResult};
use crate::vault::{Secret, Vault};

/// A shell command is never assumed repeatable: one dispatch per invocation.
const RETRY_BUDGET: u32 = 1;
/// The largest stdin a caller may send (see [`crate::config::MAX_PAYLOAD_BYTES`]).
const MAX_STDIN_BYTES: usize = crate::config::MAX_PAYLOAD_BYTES as usize;
/// The longest command a caller may send. The exec request carries it in one packet, and
/// RFC 4253 §6.1 only promises that every implementation takes a payload of 32768 bytes;
/// a longer command can be refused by the server after dispatch (OpenSSH: "Bad packet
/// length"), which would leave the call `unknown`. Longer scripts go on stdin.
pub const MAX_COMMAND_BYTES: usize = 30 * 1024;
/// Programs that run what arrives on their stdin as code: a card whose command starts one
/// of them and that has stdin says so first.
const INTERPRETERS: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "mksh",
    "fish",
    "csh",
    "tcsh",
    "ash",
    "python",
    "perl",
    "ruby",
    "node",
    "nodejs",
    "deno",
    "bun",
    "php",
    "lua",
    "tclsh",
    "wish",
    "awk",
    "gawk",
    "mawk",
    "pwsh",
    "powershell",
    "Rscript",
    "julia",
    "irb",
    "psql",
    "mysql",
    "sqlite3",
    "xargs",
    "ssh",
];

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

/// What is stored of a settled exec: the result's facts and how the run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredExec {
    pub exit_status: Option<u32>,
    pub exit_signal: Option<ExitSignal>,
    pub stdout_complete: bool,
    pub stderr_complete: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The server answered the exec request with channel success.
    pub exec_accepted: bool,
    pub eof: bool,
    pub channel_closed: bool,
    pub host_key_fingerprint: String,
}

impl StoredExec {
    /// The stored form: these facts as metadata, stdout and stderr as streams.
    fn to_store(&self, result: &SshResult) -> ResultToStore {
        ResultToStore {
            meta: serde_json::to_value(self).unwrap_or_default(),
            streams: vec![
                ("stdout".to_string(), result.stdout.clone()),
                ("stderr".to_string(), result.stderr.clone()),
            ],
        }
    }
}

/// An SSH result read back from the store; `None` if the record is not an exec result.
pub fn stored_result(stored: &StoredResult) -> Option<SshResult> {
    let exec: StoredExec = serde_json::from_value(stored.meta.clone()).ok()?;
    let stream = |name: &str| {
        stored
            .streams
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
            .unwrap_or_default()
    };
    Some(SshResult {
        exit_status: exec.exit_status,
        exit_signal: exec.exit_signal,
        stdout: stream("stdout"),
        stderr: stream("stderr"),
        stdout_complete: exec.stdout_complete,
        stderr_complete: exec.stderr_complete,
        host_key_fingerprint: exec.host_key_fingerprint,
    })
}

/// What an SSH call produced.
pub type SshOutcome = crate::invocation::Outcome<SshResult>;

/// The SSH channel, run by the invocation pipeline.
pub type SshChannel = Pipeline<Ssh>;

/// What validation found that the attempt reads.
#[derive(Debug, Clone)]
pub struct Plan {
    target: SshTarget,
    request: SshRequest,
}

/// One attempt's key and host-key pin.
pub struct Armed {
    /// The key, on a thread of its own (see [`signer`]).
    key: signer::KeySigner,
    pinned: Option<PublicKey>,
    redactor: Redactor,
}

/// SSH's steps of the pipeline.
pub struct Ssh {
    /// Where host names resolve; the address guard checks its answers.
    resolver: Resolver,
}

/// How long building an approval card waits for the host's addresses.
const CARD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

impl Channel for Ssh {
    type Request = SshRequest;
    type Plan = Plan;
    type Armed = Armed;
    type Result = SshResult;

    const KIND: events::Channel = events::Channel::Ssh;
    const TARGET_FIELD: &'static str = "host";

    fn accepted(&self, request: &SshRequest, config: &Config) -> Accepted {
        let target = config.resolve_ssh(&request.host).ok();
        Accepted {
            target: target.map(|t| t.name.clone()),
            summary: summary(target, request),
            idempotency_key: None,
        }
    }

    fn validate(&self, request: &SshRequest, config: &Config) -> Result<Validated<Plan>, Invalid> {
        let Ok(target) = config.resolve_ssh(&request.host) else {
            return Err(Invalid::new(
                Code::InvalidTarget,
                "host",
                "The host is not a configured ssh target (or names several).",
            ));
        };
        if request.timeout_ms == Some(0) {
            return Err(Invalid::new(
                Code::InvalidRequest,
                "timeout_ms",
                "timeout_ms must be at least 1 (omit it to use the target's timeout).",
            ));
        }
        if request.command.len() > MAX_COMMAND_BYTES {
            return Err(Invalid::too_large(
                "command",
                format!(
                    "The command is {} bytes; commands are limited to {MAX_COMMAND_BYTES} bytes (send a longer script on stdin).",
                    request.command.len()
                ),
            ));
        }
        let stdin = request.stdin.clone().unwrap_or_default();
        if stdin.len() > MAX_STDIN_BYTES {
            return Err(Invalid::too_large(
                "stdin",
                format!("stdin is limited to {MAX_STDIN_BYTES} bytes."),
            ));
        }
        let action = NormalizedSsh::new(
            &target.name,
            &target.user,
            request.command.as_bytes(),
            &stdin,
        )
        .map_err(|e| Invalid::new(e.code, e.field, e.message))?;
        let stored = serde_json::json!({
            "host": request.host,
            "target": target.name,
            "command": request.command,
            "timeout_ms": request.timeout_ms,
        });
        let timeout_ms = request
            .timeout_ms
            .map_or(target.timeout_ms, |t| t.min(target.timeout_ms));
        Ok(Validated {
            target: target.name.clone(),
            action: NormalizedAction::Ssh(action),
            idempotency_key: None,
            timeout: Duration::from_millis(timeout_ms.max(1)),
            stored: (stored, stdin),
            plan: Plan {
                target: target.clone(),
                request: request.clone(),
            },
        })
    }

    fn operation(&self, _config: &Config, _bound: &Bound<Plan>, _now_ms: i64) -> OperationFacts {
        OperationFacts {
            idempotent: false,
            remote_contract: RemoteContract::None,
            idempotency: None,
            reconcile_configured: false,
            source_query: None,
            batch: None,
            retry_budget: RETRY_BUDGET,
            peer: None,
        }
    }

    async fn approval(&self, bound: &Bound<Plan>) -> (String, ApprovalDetail) {
        let p = &bound.plan;
        let policy = AddressPolicy::for_host(&p.target.host, p.target.allow_private);
        let resolved = tokio::time::timeout(
            CARD_LOOKUP_TIMEOUT,
            self.resolver.describe(&p.target.host, policy),
        )
        .await
        .unwrap_or_else(|_| "did not resolve in time".to_string());
        let stdin = p.request.stdin.as_deref().filter(|s| !s.is_empty());
        let cautions = stdin
            .and_then(|_| interpreter_in(&p.request.command))
            .map(|program| {
                vec![format!(
                    "stdin is a script: the command starts {}, which runs what it reads from stdin",
                    crate::display::escape_text(program)
                )]
            })
            .unwrap_or_default();
        let detail = ApprovalDetail {
            resolved: Some(resolved),
            ssh_destination: Some(destination(&p.target)),
            command: Some(crate::display::escape_text(&p.request.command)),
            stdin: stdin.map(crate::display::BodyPreview::of),
            cautions,
            ..Default::default()
        };
        (summary(Some(&p.target), &p.request), detail)
    }

    fn arm(&self, _config: &Config, bound: &Bound<Plan>, secret: Secret) -> Result<Armed, Failure> {
        let redactor = key_redactor(secret.expose());
        let key = signer::KeySigner::start(secret).map_err(|e| match e {
            signer::KeyError::NotAKey => Failure {
                phase: Phase::CredentialInjection,
                code: Code::KeyDecryptionFailed,
                retry: Retry::AfterCorrection,
                message: "The stored credential is not an unencrypted OpenSSH private key; \
                          nothing was sent."
                    .into(),
            },
            other => Failure {
                phase: Phase::CredentialInjection,
                code: Code::BrokerUnavailable,
                retry: Retry::Backoff,
                message: format!("The key could not be prepared ({other}); nothing was sent."),
            },
        })?;
        let pinned = match &bound.plan.target.host_key {
            Some(text) => Some(PublicKey::from_openssh(text).map_err(|e| Failure {
                phase: Phase::Validation,
                code: Code::InvalidTarget,
                retry: Retry::AfterCorrection,
                message: format!("The pinned host key does not parse: {e}"),
            })?),
            None => None,
        };
        Ok(Armed {
            key,
            pinned,
            redactor,
        })
    }

    async fn attempt(
        &self,
        attempt: Attempt<'_, Self>,
        armed: Armed,
        ctx: &CallContext,
    ) -> SshOutcome {
        exec::attempt(&self.resolver, attempt, armed, ctx).await
    }

    fn stored_result(stored: &StoredResult) -> Option<SshResult> {
        stored_result(stored)
    }
}

impl Pipeline<Ssh> {
    pub fn new(journal: Journal, vault: Arc<Vault>, config: ConfigHandle) -> Self {
        Self::with_resolver(journal, vault, config, Resolver::system())
    }

    /// [`Pipeline::new`] resolving through `resolver` (a hosts-style map in tests; the
    /// daemon and the app always use the system resolver).
    pub fn with_resolver(
        journal: Journal,
        vault: Arc<Vault>,
        config: ConfigHandle,
        resolver: Resolver,
    ) -> Self {
        Pipeline::with(Ssh { resolver }, journal, vault, config)
    }

    /// Runs one command as a new invocation.
    pub async fn execute(&self, request: SshRequest, ctx: &CallContext) -> SshOutcome {
        self.run(&request, ctx).await
    }
}

/// The private key text, and each line of its armored body, so output that echoes the
/// key (whole or line by line) is scrubbed.
fn key_redactor(secret: &[u8]) -> Redactor {
    // Borrowed from `secret` when it is UTF-8 (an OpenSSH key is); any copy is wiped.
    let text = zeroize::Zeroizing::new(String::from_utf8_lossy(secret).into_owned());
    let rendered: Vec<&[u8]> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .map(str::as_bytes)
        .chain(std::iter::once(text.trim().as_bytes()))
        .collect();
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

/// The first program in `command` that runs code it reads (see [`INTERPRETERS`]), by its
/// name as written; `None` if there is none. Words are split at blanks and the shell's
/// separators, paths reduced to their last part and versions (`python3.12`) ignored, so
/// `/usr/bin/env bash -s` and `cat x | python3 -` are both found.
fn interpreter_in(command: &str) -> Option<&str> {
    command
        .split(|c: char| {
            c.is_whitespace() || matches!(c, ';' | '|' | '&' | '(' | ')' | '`' | '$' | '{' | '}')
        })
        .find(|word| {
            let program = word.rsplit('/').next().unwrap_or(word);
            let program = program.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
            INTERPRETERS.contains(&program)
        })
}

#[cfg(test)]
mod tests {
    use super::interpreter_in;

    #[test]
    fn a_command_that_runs_its_stdin_names_the_interpreter() {
        assert_eq!(interpreter_in("bash -s"), Some("bash"));
        assert_eq!(
            interpreter_in("/usr/bin/env python3.12 -"),
            Some("/usr/bin/env python3.12 -".split(' ').nth(1).unwrap())
        );
        assert_eq!(interpreter_in("sudo -u app sh"), Some("sh"));
        assert_eq!(
            interpreter_in("cat > /tmp/x; cat /tmp/x|psql db"),
            Some("psql")
        );
        assert_eq!(interpreter_in("tee /srv/app/config.json"), None);
        assert_eq!(interpreter_in("wc -l"), None);
        // A word that only contains a name is not that program.
        assert_eq!(interpreter_in("cat bashrc.bak"), None);
    }
}

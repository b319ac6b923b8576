//! The `postern` binary: the headless daemon, the stdio MCP bridge an agent's client
//! launches, the operator commands (audit, log, stats, vault, config) and a witness.
//!
//! Exit status: 0 success; 1 a check failed or an operation was refused (audit chain
//! broken, config invalid, vault refused); 2 the command could not run (no journal,
//! unreadable file, keychain unreachable, usage error).

mod common;
mod config_cmd;
mod journal_cmds;
mod operator_cmd;
mod shield;
mod timefmt;
mod vault_cmd;
mod witness_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

/// Every heap block is wiped when it is freed: the broker's own secret types wipe
/// themselves, and this catches the copies libraries make of a secret (the keychain
/// client's messages, key parsing, the scrubber's automaton), which issue 26 found still in
/// a daemon's memory seconds after an SSH call. 1Password's wrapper over the system
/// allocator; `realloc` becomes allocate, copy and wipe.
#[global_allocator]
static ALLOCATOR: zeroizing_alloc::ZeroAlloc<std::alloc::System> =
    zeroizing_alloc::ZeroAlloc(std::alloc::System);

use clap::{Args, Parser, Subcommand, ValueEnum};
use postern_broker::contract::{Code, Outcome, Phase};
use postern_broker::vault::{CredentialKind, DEFAULT_SERVICE, KeychainBackend};

use common::Failure;

#[derive(Parser)]
#[command(
    name = "postern",
    version,
    about = "Postern: a secret broker and approval console for AI agents",
    long_about = None,
    after_help = "Examples:\n  \
        postern daemon --data-dir ~/.local/share/postern --config targets.toml\n  \
        postern log --since 2h --outcome unknown\n  \
        printf '%s' \"$TOKEN\" | postern vault set payments-key\n\n\
        Exit status: 0 success, 1 a check failed or was refused, 2 could not run."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker headless (servers, CI, tests).
    #[command(after_help = "Example:\n  \
        postern daemon --data-dir /var/lib/postern --config /etc/postern/targets.toml\n\n\
        The agent-facing socket defaults to DIR/run/postern.sock.")]
    Daemon(DaemonCmd),
    /// The stdio MCP server an agent's client launches; it connects to a running daemon.
    #[command(after_help = "Example (an MCP client's server entry):\n  \
        {\"command\": \"postern\", \"args\": [\"mcp\"]}\n  \
        POSTERN_SOCKET=/var/lib/postern/run/postern.sock postern mcp")]
    Mcp(McpCmd),
    /// Verify the audit chain and its signed checkpoints.
    #[command(
        subcommand,
        after_help = "Example:\n  postern audit verify --data-dir ~/.local/share/postern"
    )]
    Audit(AuditCmd),
    /// The activity log: invocations, newest first.
    #[command(after_help = "Examples:\n  \
        postern log --since 15m\n  \
        postern log --session s-42 --outcome unknown --json\n  \
        postern log --target payments --since 2026-11-29T10:00:00Z --limit 20\n\n\
        Phases: validation, credential_injection, connection_setup, remote_execution, \
        result_delivery\n\
        Outcomes: not_attempted, rejected, committed, unknown")]
    Log(LogCmd),
    /// Counts of invocations by phase, by outcome (kept separate) and by code.
    #[command(after_help = "Example:\n  postern stats --data-dir ~/.local/share/postern --json")]
    Stats(StatsCmd),
    /// Credentials in the OS keychain (secrets are read from stdin or a prompt, never argv).
    #[command(
        subcommand,
        after_help = "Examples:\n  \
            postern vault set payments-key < token.txt\n  \
            postern vault list\n  \
            postern vault rm payments-key"
    )]
    Vault(VaultCmd),
    /// Check a targets file; pin an SSH target's host key.
    #[command(
        subcommand,
        after_help = "Examples:\n  postern config check /etc/postern/targets.toml\n  \
            postern config pin-host-key targets.toml web1 --key \"ssh-ed25519 AAAA...\""
    )]
    Config(ConfigCmd),
    /// A transparency-log witness that cosigns the audit log's checkpoints.
    #[command(
        subcommand,
        after_help = "Examples:\n  postern witness init --data-dir DIR --name witness.example/w1\n  \
            postern witness add-log --data-dir DIR --origin ORIGIN --key VKEY\n  \
            postern witness serve --data-dir DIR --listen 127.0.0.1:7380"
    )]
    Witness(witness_cmd::WitnessCmd),
    /// Operate a running daemon over its operator socket (approvals, overview,
    /// integrity, sessions); answers are printed as JSON.
    #[command(after_help = "Examples:\n  \
        postern operator --socket /run/postern/operator.sock approvals\n  \
        postern operator --socket /run/postern/operator.sock approve inv_… FINGERPRINT CARD_DIGEST\n\n\
        Exit status: 0 answered, 1 refused (including a peer the socket does not admit), \
        2 the socket cannot be reached.")]
    Operator(OperatorCmd),
    /// Run an agent confined so that Postern's MCP socket is its only way to a
    /// credential, the record or an approval (Linux: bubblewrap).
    #[command(after_help = "Examples:\n  \
        postern shield -- claude\n  \
        postern shield --network broker-only --rw ~/.cache/pip -- codex\n\n\
        Inside, the agent writes only its working directory, its own state and each --rw \
        path; it cannot see Postern's data, the keychain, ~/.ssh, the display or the session \
        bus. Its sessions are recorded as confined, as targets with require_confined = true \
        demand.\n\n\
        Exit status: the command's own, or 125 when the shield failed and the command never \
        started.")]
    Shield(shield::ShieldCmd),
}

#[derive(Args)]
struct OperatorCmd {
    /// The daemon's operator socket [default: DATA_DIR/run/operator.sock of the default
    /// data dir].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    action: OperatorAction,
}

#[derive(Subcommand)]
enum OperatorAction {
    /// Counts, paths, the keychain and the deployment mode.
    Overview,
    /// Pending approval cards (each with the fingerprint an approval must name).
    Approvals,
    /// Approve exactly this fingerprint of this invocation, as shown on the card with
    /// this digest (both are in `approvals`).
    Approve {
        invocation_id: String,
        fingerprint: String,
        card_digest: String,
    },
    /// Deny this invocation, as shown on the card with this digest.
    Deny {
        invocation_id: String,
        fingerprint: String,
        card_digest: String,
    },
    /// Verify the journal's chain and signed checkpoints now (exit 1 when they fail).
    Verify,
    /// Agent sessions, newest first.
    Sessions,
    /// Credentials as metadata (id, kind, version, dates, targets using them).
    Credentials,
    /// Incidents of calls through peer brokers, newest first, each routed to its owner
    /// (policy: the peering owner; contract violation: the peer's operator; transient
    /// exhaustion: this broker's operator), with the envelope and the signature check.
    Incidents,
    /// Store or rotate a credential in the broker's keychain; the secret is read from
    /// stdin or a no-echo prompt (or --from-file), never argv.
    SetCredential {
        id: String,
        #[arg(long, value_enum, default_value_t = KindArg::Token)]
        kind: KindArg,
        #[arg(long, value_name = "PATH")]
        from_file: Option<PathBuf>,
    },
    /// Remove a credential.
    RemoveCredential { id: String },
    /// Pause agent calls: new requests, retries and job polls are refused with
    /// AGENTS_PAUSED (nothing recorded or sent) until `resume`; what runs finishes.
    Pause,
    /// Resume agent calls after `pause`.
    Resume,
}

#[derive(Args)]
struct DataDirArg {
    /// The data directory [default: $XDG_DATA_HOME/postern or ~/.local/share/postern].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

impl DataDirArg {
    fn resolve(self) -> PathBuf {
        common::data_dir_or_default(self.data_dir)
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum KeychainArg {
    /// The freedesktop Secret Service (GNOME Keyring, KWallet, KeePassXC).
    SecretService,
    /// The Linux kernel keyring (secrets vanish on reboot).
    Keyutils,
    /// Sealed files in the data dir, under a key from --vault-key-file or systemd's
    /// credential directory (for a broker running as its own system user).
    File,
    /// The macOS login keychain.
    #[cfg(target_os = "macos")]
    MacosKeychain,
    /// The Windows Credential Manager (this user's credentials, kept on this machine).
    #[cfg(windows)]
    WindowsCredentialManager,
}

impl KeychainArg {
    fn backend(self) -> KeychainBackend {
        match self {
            KeychainArg::SecretService => KeychainBackend::SecretService,
            KeychainArg::Keyutils => KeychainBackend::Keyutils,
            KeychainArg::File => KeychainBackend::File,
            #[cfg(target_os = "macos")]
            KeychainArg::MacosKeychain => KeychainBackend::MacosKeychain,
            #[cfg(windows)]
            KeychainArg::WindowsCredentialManager => KeychainBackend::WindowsCredentialManager,
        }
    }

    /// The person's OS keychain on this platform.
    fn platform_default() -> KeychainArg {
        #[cfg(target_os = "macos")]
        return KeychainArg::MacosKeychain;
        #[cfg(windows)]
        return KeychainArg::WindowsCredentialManager;
        #[cfg(not(any(target_os = "macos", windows)))]
        KeychainArg::SecretService
    }

    fn choice(self) -> postern_mcp::KeychainChoice {
        match self {
            KeychainArg::SecretService => postern_mcp::KeychainChoice::SecretService,
            KeychainArg::Keyutils => postern_mcp::KeychainChoice::Keyutils,
            KeychainArg::File => postern_mcp::KeychainChoice::File,
            #[cfg(target_os = "macos")]
            KeychainArg::MacosKeychain => postern_mcp::KeychainChoice::MacosKeychain,
            #[cfg(windows)]
            KeychainArg::WindowsCredentialManager => {
                postern_mcp::KeychainChoice::WindowsCredentialManager
            }
        }
    }
}

/// Where the broker keeps its state: the data directory, and the keychain that holds its
/// secrets.
#[derive(Args)]
struct StateArgs {
    #[command(flatten)]
    data_dir: DataDirArg,
    #[command(flatten)]
    keychain: KeychainArgs,
}

#[derive(Args)]
struct KeychainArgs {
    /// Which OS keychain holds the secrets.
    #[arg(long, value_enum, default_value_t = KeychainArg::platform_default())]
    keychain: KeychainArg,
    /// The keychain service name entries live under.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_SERVICE)]
    keychain_service: String,
    /// The `file` keychain's 32-byte key (mode 0400/0600, owned by this user)
    /// [default: $CREDENTIALS_DIRECTORY/postern-vault-key].
    #[arg(long, value_name = "PATH")]
    vault_key_file: Option<PathBuf>,
}

impl KeychainArgs {
    fn spec(&self) -> common::KeychainSpec<'_> {
        common::KeychainSpec {
            backend: self.keychain.backend(),
            service: &self.keychain_service,
            vault_key_file: self.vault_key_file.as_deref(),
        }
    }
}

/// Where the latest signed checkpoint is kept outside the data directory.
#[derive(Args)]
struct AnchorArg {
    /// The audit anchor file [default: $XDG_STATE_HOME/postern/anchors/<hash of the data
    /// dir>.checkpoint, or under ~/.local/state].
    #[arg(long, value_name = "FILE")]
    anchor: Option<PathBuf>,
}

#[derive(Args)]
struct DaemonCmd {
    #[command(flatten)]
    data_dir: DataDirArg,
    #[command(flatten)]
    anchor: AnchorArg,
    /// The targets file [default: DIR/postern.toml, made empty if missing, as the
    /// console does].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The agent-facing socket [default: DIR/run/postern.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The operator socket the console and `postern operator` use [default:
    /// operator.sock beside the agent socket].
    #[arg(long, value_name = "PATH")]
    operator_socket: Option<PathBuf>,
    /// Members of this group may operate the broker (the operator socket becomes 0660,
    /// owned by it). Without it only this user and root may.
    #[arg(long, value_name = "NAME")]
    operator_group: Option<String>,
    /// Who may open MCP sessions on the agent socket: `own` (this user) or `any` (every
    /// local user; for a broker running as its own system user).
    #[arg(long, value_enum, default_value_t = AgentUsers::Own)]
    agent_users: AgentUsers,
    /// How long a request waits for an operator's answer, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    approval_timeout: u64,
    /// Serve federated peer brokers (the `[[peer]]` entries with `exports`) over MCP
    /// Streamable HTTP at http://ADDR/mcp. Loopback addresses only, unless
    /// --peer-listen-any; plain HTTP (put TLS in front for confidentiality).
    #[arg(long, value_name = "ADDR")]
    peer_listen: Option<std::net::SocketAddr>,
    /// Allow --peer-listen on a non-loopback address (behind a TLS terminator).
    #[arg(long, requires = "peer_listen")]
    peer_listen_any: bool,
    #[command(flatten)]
    keychain: KeychainArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum AgentUsers {
    /// Only the user the daemon runs as.
    Own,
    /// Every local user (the socket file is 0666).
    Any,
}

#[derive(Args)]
struct McpCmd {
    /// The daemon's socket [env: POSTERN_SOCKET; default: the default data dir's
    /// run/postern.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

#[derive(Subcommand)]
enum AuditCmd {
    /// Print the journal's checkpoint origin and the audit public key, as a witness
    /// needs them (public values; nothing is created).
    #[command(after_help = "Example:\n  \
        postern audit key --data-dir ~/.local/share/postern\n  \
        postern witness add-log --data-dir W --origin ORIGIN --key KEY")]
    Key {
        #[command(flatten)]
        state: StateArgs,
        /// Print {"origin": …, "key": …} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Verify the hash chain and signed checkpoints; exit 1 with the first bad sequence.
    #[command(after_help = "Examples:\n  \
        postern audit verify --data-dir ~/.local/share/postern\n  \
        postern audit verify --data-dir /var/lib/postern --keychain keyutils --json\n\n\
        Exit status: 0 verified, 1 the record was altered (the first bad sequence is \
        printed), 2 the journal or the audit key cannot be read.")]
    Verify {
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        anchor: AnchorArg,
        /// The targets file: its [[witness]] keys check the cosignatures the journal
        /// stored.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Also ask each configured witness what it last cosigned (needs --config); a
        /// journal cut or rewritten behind it fails.
        #[arg(long)]
        ask_witnesses: bool,
        /// Verify with this public verifier key (`name+id+base64`, as `postern audit key`
        /// prints it) instead of the keychain's: no keychain is opened, so a copy of the
        /// journal can be checked on another machine, by an auditor who holds no secret.
        #[arg(long, value_name = "VKEY")]
        key: Option<String>,
        /// Print the report (or the failure) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a retry manifest as another party would: its digest against the facts it
    /// carries, and the broker's signature with the key `postern audit key` prints.
    /// Needs no journal and no keychain.
    #[command(
        name = "verify-manifest",
        after_help = "Examples:\n  \
        postern audit verify-manifest --key \"$(postern audit key --json | jq -r .key)\" manifest.json\n  \
        some-agent-log | postern audit verify-manifest --key KEY -\n\n\
        The input is a manifest, or an answer that holds one under `manifest`.\n\
        Exit status: 0 valid, 1 altered or signed by another key, 2 unreadable input."
    )]
    VerifyManifest {
        /// The broker's verifier key (`name+id+base64`, as `postern audit key` prints).
        #[arg(long)]
        key: String,
        /// The manifest file, or `-` for standard input.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct LogCmd {
    #[command(flatten)]
    data_dir: DataDirArg,
    /// Only this agent session.
    #[arg(long, value_name = "S")]
    session: Option<String>,
    /// Only this target.
    #[arg(long, value_name = "T")]
    target: Option<String>,
    /// Only invocations currently in this phase.
    #[arg(long, value_name = "P", value_parser = journal_cmds::parse_phase)]
    phase: Option<Phase>,
    /// Only invocations with this outcome.
    #[arg(long, value_name = "O", value_parser = journal_cmds::parse_outcome)]
    outcome: Option<Outcome>,
    /// Only invocations with this code (e.g. REMOTE_OUTCOME_UNKNOWN).
    #[arg(long, value_name = "C", value_parser = journal_cmds::parse_code)]
    code: Option<Code>,
    /// Only invocations accepted since TIME: RFC 3339 (2026-11-29T10:00:00Z) or a span
    /// back from now (90s, 15m, 2h, 3d, 1w).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// At most N invocations (after filtering).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StatsCmd {
    #[command(flatten)]
    data_dir: DataDirArg,
    /// Print the counts as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum KindArg {
    /// An API or bearer token.
    Token,
    /// An SSH private key.
    #[value(name = "ssh_key", alias = "ssh-key")]
    SshKey,
}

#[derive(Subcommand)]
enum VaultCmd {
    /// Store or rotate a credential. The secret is read from stdin (one trailing newline
    /// is stripped), or prompted for without echo when stdin is a terminal.
    #[command(after_help = "Examples:\n  \
        postern vault set payments-key              # prompts, without echo\n  \
        printf '%s' \"$TOKEN\" | postern vault set payments-key\n  \
        postern vault set web1-key --kind ssh_key --from-file ~/.ssh/id_ed25519\n\n\
        There is deliberately no option that takes the secret itself: argv and the \
        environment are visible to other processes.")]
    Set {
        /// The credential id targets name in `credential = "..."`.
        id: String,
        /// What the credential is.
        #[arg(long, value_enum, default_value_t = KindArg::Token)]
        kind: KindArg,
        /// Read the secret from this file instead of stdin.
        #[arg(long, value_name = "PATH")]
        from_file: Option<PathBuf>,
        #[command(flatten)]
        state: StateArgs,
    },
    /// List credentials: id, kind, version, created, rotated, last used. Never secrets.
    #[command(after_help = "Example:\n  postern vault list --data-dir ~/.local/share/postern")]
    List {
        #[command(flatten)]
        state: StateArgs,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Remove a credential: its keychain entry, then its metadata.
    #[command(
        alias = "remove",
        after_help = "Example:\n  postern vault rm payments-key"
    )]
    Rm {
        id: String,
        /// Also allow removing the audit signing key.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        state: StateArgs,
    },
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Load and validate a targets file; list its targets or name the bad field.
    #[command(
        after_help = "Example:\n  postern config check /etc/postern/targets.toml\n\n\
        Exit status: 0 valid, 1 invalid (the message names file, target and field)."
    )]
    Check {
        /// The targets file.
        file: PathBuf,
    },
    /// Pin the host key of an [[ssh]] target, from a known_hosts line or a public key.
    #[command(
        after_help = "Examples:\n  \
        postern config pin-host-key targets.toml web1 \\\n      \
        --known-hosts-line \"$(ssh-keyscan -t ed25519 web1.example.com 2>/dev/null)\"\n  \
        postern config pin-host-key targets.toml web1 --key \"ssh-ed25519 AAAA...\"\n\n\
        The file is edited in place (comments and layout kept), validated, and replaced \
        atomically. A different key already pinned is only replaced with --replace.",
        group = clap::ArgGroup::new("pin_source").required(true).multiple(false)
    )]
    PinHostKey {
        /// The targets file.
        file: PathBuf,
        /// The name of the [[ssh]] target.
        target: String,
        /// An OpenSSH known_hosts line for the target's host and port (hashed entries
        /// are matched too).
        #[arg(long, value_name = "LINE", group = "pin_source")]
        known_hosts_line: Option<String>,
        /// The host's public key: "<algo> <base64> [comment]".
        #[arg(long, value_name = "KEY", group = "pin_source")]
        key: Option<String>,
        /// Replace a different key that is already pinned.
        #[arg(long)]
        replace: bool,
    },
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    built(tokio::runtime::Builder::new_multi_thread())
}

/// A runtime on the calling thread alone.
pub(crate) fn runtime_on_this_thread() -> Result<tokio::runtime::Runtime, Failure> {
    built(tokio::runtime::Builder::new_current_thread())
}

fn built(mut builder: tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, Failure> {
    builder
        .enable_all()
        .build()
        .map_err(|e| Failure::unavailable(format!("cannot start the async runtime: {e}")))
}

fn run(cli: Cli) -> common::Outcome {
    match cli.command {
        Command::Daemon(cmd) => {
            let data_dir = cmd.data_dir.resolve();
            let config = match cmd.config {
                Some(config) => config,
                None => postern_console::headless::default_config(&data_dir)
                    .map_err(|e| Failure::failed(format!("daemon: {}: {e}", data_dir.display())))?,
            };
            let args = postern_console::headless::HeadlessArgs {
                daemon: postern_mcp::DaemonArgs {
                    data_dir,
                    config,
                    socket: cmd.socket,
                    keychain: cmd.keychain.keychain.choice(),
                    service: cmd.keychain.keychain_service,
                    vault_key_file: cmd.keychain.vault_key_file,
                    anchor: cmd.anchor.anchor,
                },
                operator_socket: cmd.operator_socket,
                operator_group: cmd.operator_group,
                agent_access: match cmd.agent_users {
                    AgentUsers::Own => postern_mcp::daemon::AgentAccess::OwnUser,
                    AgentUsers::Any => postern_mcp::daemon::AgentAccess::AnyLocalUser,
                },
                approval_timeout: std::time::Duration::from_secs(cmd.approval_timeout),
                peer_listen: cmd.peer_listen.map(|addr| {
                    let reach = if cmd.peer_listen_any {
                        postern_mcp::peering::Reach::Any
                    } else {
                        postern_mcp::peering::Reach::Loopback
                    };
                    (addr, reach)
                }),
            };
            runtime()?
                .block_on(postern_console::headless::run(args))
                .map_err(|e| Failure::failed(format!("daemon: {e}")))
        }
        Command::Mcp(cmd) => {
            let socket = cmd
                .socket
                .or_else(|| {
                    std::env::var_os("POSTERN_SOCKET")
                        .filter(|s| !s.is_empty())
                        .map(PathBuf::from)
                })
                .unwrap_or_else(|| postern_mcp::default_socket(&common::default_data_dir()));
            // One thread: the bridge relays one session, and its tasks hand each message
            // to one another; on one thread that is no wake-up of another.
            let runtime = runtime_on_this_thread()?;
            let result =
                runtime.block_on(postern_mcp::run_bridge(postern_mcp::BridgeArgs { socket }));
            // A read of stdin may still be blocked in the runtime's blocking pool (the
            // broker went away first): do not wait for the agent to write again.
            runtime.shutdown_background();
            result.map_err(|e| Failure::failed(format!("mcp: {e}")))
        }
        Command::Audit(AuditCmd::Key { state, json }) => {
            journal_cmds::audit_key_print(&state.data_dir.resolve(), &state.keychain.spec(), json)
        }
        Command::Audit(AuditCmd::VerifyManifest { key, file, json }) => {
            journal_cmds::verify_manifest(&key, &file, json)
        }
        Command::Audit(AuditCmd::Verify {
            state,
            anchor,
            config,
            ask_witnesses,
            key,
            json,
        }) => journal_cmds::audit_verify(
            &state.data_dir.resolve(),
            match key.as_deref() {
                Some(key) => journal_cmds::Verifier::Public(key),
                None => journal_cmds::Verifier::Keychain(state.keychain.spec()),
            },
            &journal_cmds::VerifyAgainst {
                anchor: anchor.anchor.as_deref(),
                config: config.as_deref(),
                ask_witnesses,
            },
            json,
        ),
        Command::Log(cmd) => journal_cmds::log(
            &cmd.data_dir.resolve(),
            journal_cmds::LogArgs {
                session: cmd.session,
                target: cmd.target,
                phase: cmd.phase,
                outcome: cmd.outcome,
                code: cmd.code,
                since: cmd.since,
                limit: cmd.limit,
                json: cmd.json,
            },
        ),
        Command::Stats(cmd) => journal_cmds::stats(&cmd.data_dir.resolve(), cmd.json),
        Command::Vault(VaultCmd::Set {
            id,
            kind,
            from_file,
            state,
        }) => {
            let kind = match kind {
                KindArg::Token => CredentialKind::Token,
                KindArg::SshKey => CredentialKind::SshKey,
            };
            let source = match from_file {
                Some(path) => vault_cmd::Source::File(path),
                None => vault_cmd::Source::Stdin,
            };
            vault_cmd::set(
                &state.data_dir.resolve(),
                &state.keychain.spec(),
                &id,
                kind,
                &source,
            )
        }
        Command::Vault(VaultCmd::List { state, json }) => {
            vault_cmd::list(&state.data_dir.resolve(), json)
        }
        Command::Vault(VaultCmd::Rm { id, force, state }) => vault_cmd::remove(
            &state.data_dir.resolve(),
            &state.keychain.spec(),
            &id,
            force,
        ),
        Command::Operator(cmd) => {
            let socket = cmd.socket.unwrap_or_else(|| {
                postern_console::operator::default_operator_socket(&postern_mcp::default_socket(
                    &common::default_data_dir(),
                ))
            });
            let request = match cmd.action {
                OperatorAction::Overview => operator_cmd::request::overview(),
                OperatorAction::Approvals => operator_cmd::request::approvals(),
                OperatorAction::Approve {
                    invocation_id,
                    fingerprint,
                    card_digest,
                } => {
                    operator_cmd::request::answer(&invocation_id, &fingerprint, &card_digest, true)
                }
                OperatorAction::Deny {
                    invocation_id,
                    fingerprint,
                    card_digest,
                } => {
                    operator_cmd::request::answer(&invocation_id, &fingerprint, &card_digest, false)
                }
                OperatorAction::Verify => operator_cmd::request::verify(),
                OperatorAction::Sessions => operator_cmd::request::sessions(),
                OperatorAction::Credentials => operator_cmd::request::credentials(),
                OperatorAction::Incidents => operator_cmd::request::incidents(),
                OperatorAction::RemoveCredential { id } => {
                    operator_cmd::request::remove_credential(&id)
                }
                OperatorAction::Pause => operator_cmd::request::pause(true),
                OperatorAction::Resume => operator_cmd::request::pause(false),
                OperatorAction::SetCredential {
                    id,
                    kind,
                    from_file,
                } => {
                    let source = match from_file {
                        Some(path) => vault_cmd::Source::File(path),
                        None => vault_cmd::Source::Stdin,
                    };
                    let kind = match kind {
                        KindArg::Token => CredentialKind::Token,
                        KindArg::SshKey => CredentialKind::SshKey,
                    };
                    operator_cmd::request::set_credential(&id, kind.as_str(), &source)?
                }
            };
            operator_cmd::run(&socket, request)
        }
        Command::Config(ConfigCmd::Check { file }) => config_cmd::check(&file),
        Command::Config(ConfigCmd::PinHostKey {
            file,
            target,
            known_hosts_line,
            key,
            replace,
        }) => {
            let source = match (known_hosts_line, key) {
                (Some(line), _) => config_cmd::PinSource::KnownHostsLine(line),
                (None, Some(key)) => config_cmd::PinSource::Key(key),
                (None, None) => {
                    return Err(Failure::unavailable(
                        "pass --known-hosts-line LINE or --key \"<algo> <base64>\"",
                    ));
                }
            };
            config_cmd::pin_host_key_command(&file, &target, &source, replace)
        }
        Command::Witness(cmd) => witness_cmd::run(cmd),
        Command::Shield(cmd) => shield::run(cmd),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

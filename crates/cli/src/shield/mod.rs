//! `postern shield [options] -- COMMAND…`: runs an agent confined so that Postern's MCP
//! socket is its only route to a credential, the record or an approval.
//!
//! On Linux: asks the broker for a socket of this shield's own
//! ([`postern_mcp::daemon::shield`]), plans the sandbox ([`plan`]), starts bubblewrap held
//! before the command runs ([`confine`]), has the broker inspect the sandbox, and only
//! then lets the command run; it exits with the command's status. On macOS a Seatbelt
//! profile ([`seatbelt`]) runs through `sandbox-exec` (not yet exercised). Windows has no
//! shield.
//!
//! Exit status 125 means the shield itself failed and the command never started.

#[cfg(unix)]
pub mod plan;
// Built on every unix so that it is checked here; run on macOS only.
#[cfg(unix)]
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub mod seatbelt;

#[cfg(target_os = "linux")]
mod confine;

use std::ffi::OsString;
#[cfg(unix)]
use std::path::Path;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::common::{Failure, Outcome};
#[cfg(unix)]
use postern_mcp::daemon::shield::Network;

/// The exit status of a shield that failed before its command ran.
pub const EXIT_SHIELD: u8 = 125;

#[derive(Args, Debug)]
pub struct ShieldCmd {
    /// The broker's agent socket [env: POSTERN_SOCKET; default: the default data dir's
    /// run/postern.sock]. Inside the sandbox the shield's own socket sits at this path.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// `full`: the host's network (coding agents need it for their model's API);
    /// `broker-only`: a network of the sandbox's own with no route out, so the only way
    /// to a remote system is through Postern's policy.
    #[arg(long, value_enum, default_value = "full")]
    network: NetworkArg,
    /// Also let the agent write PATH (repeatable). The working directory and the known
    /// agents' own state (e.g. ~/.claude, ~/.codex) are writable already.
    #[arg(long = "rw", value_name = "PATH")]
    rw: Vec<PathBuf>,
    /// Let in ~/.ssh and the user's SSH agent (hidden by default).
    #[arg(long)]
    ssh_agent_ok: bool,
    /// Print the sandbox this would start (the profile the broker checks and records,
    /// its digest, and bubblewrap's arguments) as JSON, and start nothing.
    #[arg(long)]
    print: bool,
    /// The agent and its arguments.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum NetworkArg {
    Full,
    BrokerOnly,
}

#[cfg(unix)]
impl From<NetworkArg> for Network {
    fn from(n: NetworkArg) -> Network {
        match n {
            NetworkArg::Full => Network::Full,
            NetworkArg::BrokerOnly => Network::BrokerOnly,
        }
    }
}

fn shield_failure(message: impl Into<String>) -> Failure {
    Failure {
        status: EXIT_SHIELD,
        message: message.into(),
        json: None,
    }
}

#[cfg(unix)]
/// The agent socket `postern mcp` would use: `--socket`, else POSTERN_SOCKET, else the
/// default data dir's.
fn agent_socket(given: Option<PathBuf>) -> PathBuf {
    given
        .or_else(|| {
            std::env::var_os("POSTERN_SOCKET")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| postern_mcp::default_socket(&crate::common::default_data_dir()))
}

#[cfg(unix)]
/// A path made absolute and resolved; it must exist.
fn resolved(path: &Path, what: &str) -> Result<PathBuf, Failure> {
    std::fs::canonicalize(path)
        .map_err(|e| shield_failure(format!("{what} {}: {e}", path.display())))
}

/// The command's exit status as this process's: its code, or 128 + the signal.
#[cfg(unix)]
fn exit_of(status: std::process::ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    match u8::try_from(code) {
        Ok(0) => Ok(()),
        Ok(code) => Err(Failure::silent(code)),
        Err(_) => Err(Failure::silent(1)),
    }
}

/// Runs `cmd`.
#[cfg(target_os = "linux")]
pub fn run(cmd: ShieldCmd) -> Outcome {
    linux::run(cmd)
}

#[cfg(target_os = "macos")]
pub fn run(cmd: ShieldCmd) -> Outcome {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .ok_or_else(|| shield_failure("HOME is not set"))?;
    let cwd = resolved(Path::new("."), "the working directory")?;
    let socket = agent_socket(cmd.socket);
    let data_dir = crate::common::default_data_dir();
    let mut writable = Vec::new();
    for w in &cmd.rw {
        writable.push(resolved(w, "--rw")?);
    }
    for rel in plan::agent_state(&cmd.command[0].to_string_lossy()) {
        let path = home.join(rel);
        if path.exists() {
            writable.push(path);
        }
    }
    let mut hidden = vec![data_dir, home.join(".gnupg")];
    if !cmd.ssh_agent_ok {
        hidden.push(home.join(".ssh"));
    }
    let profile = seatbelt::profile(&seatbelt::SeatbeltHost {
        home,
        cwd,
        agent_socket: socket,
        hidden,
        writable,
        broker_only: cmd.network == NetworkArg::BrokerOnly,
    });
    eprintln!(
        "postern: the macOS shield is not yet exercised; its sessions are recorded as \
         unconfined"
    );
    let status = std::process::Command::new("/usr/bin/sandbox-exec")
        .arg("-p")
        .arg(profile)
        .args(&cmd.command)
        .status()
        .map_err(|e| shield_failure(format!("sandbox-exec could not be started: {e}")))?;
    exit_of(status)
}

#[cfg(windows)]
pub fn run(_cmd: ShieldCmd) -> Outcome {
    Err(shield_failure(
        "postern shield is not available on Windows: no sandbox there can hide the \
         Credential Manager and Postern's files from a process of the same user without \
         administrator set-up (AppContainer profiles). Run the agent under another \
         account, or on Linux where the shield exists",
    ))
}

#[cfg(target_os = "linux")]
mod linux {
    use super::*;
    use crate::shield::confine;
    use crate::shield::plan::{Host, Kind, Options};
    use postern_mcp::daemon::shield::ControlClient;

    pub fn run(cmd: ShieldCmd) -> Outcome {
        let bwrap = find_bwrap()?;
        user_namespaces_enabled()?;
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| {
                shield_failure("HOME is not set; the shield needs it to know what to hide")
            })?;
        let home = resolved(&home, "the home directory")?;
        let cwd = resolved(Path::new("."), "the working directory")?;
        let mut rw = Vec::new();
        for path in &cmd.rw {
            rw.push(resolved(path, "--rw")?);
        }
        let socket = agent_socket(cmd.socket.clone());
        let socket = postern_mcp::daemon::shield::absolute(&socket);
        let runtime = crate::runtime_on_this_thread()?;
        runtime.block_on(async move {
            let (mut control, opened) =
                ControlClient::open(&socket).await.map_err(shield_failure)?;
            let host = Host {
                home,
                cwd,
                agent_socket: socket,
                shield_socket: opened.socket.clone(),
                guarded: opened
                    .guarded
                    .iter()
                    .map(|p| postern_mcp::daemon::shield::absolute(p))
                    .collect(),
                runtime_dir: std::env::var_os("XDG_RUNTIME_DIR")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from),
                ssh_auth_sock: std::env::var_os("SSH_AUTH_SOCK")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from),
                resolv_conf: resolv_conf_in_run(),
                landlock_scopes: confine::landlock_scopes(),
            };
            let options = Options {
                network: cmd.network.into(),
                rw,
                ssh_agent_ok: cmd.ssh_agent_ok,
                program: cmd.command[0].to_string_lossy().into_owned(),
            };
            let plan =
                plan::plan(&host, &options, &kind_of).map_err(|e| shield_failure(e.to_string()))?;
            if cmd.print {
                let shown = serde_json::json!({
                    "profile": plan.profile,
                    "profile_digest": plan.profile.digest(),
                    "bwrap": plan.args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
                    "command": cmd.command.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
                });
                println!("{shown:#}");
                return Ok(());
            }
            let held = confine::start(&bwrap, &plan.args, &cmd.command)
                .map_err(|e| shield_failure(e.to_string()))?;
            let confinement = match control.register(held.sandbox_pid, &plan.profile).await {
                Ok(c) => c,
                Err(e) => {
                    held.abort();
                    return Err(shield_failure(e));
                }
            };
            eprintln!(
                "postern: shield {} ({} network); agent sessions from it are recorded as \
                 confined",
                confinement.shield, confinement.network
            );
            let sandbox = held.sandbox_pid;
            let resized =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change());
            let mut child = held
                .release()
                .map_err(|e| shield_failure(format!("the sandbox could not be released: {e}")))?;
            let resizes =
                resized.map(|signal| tokio::spawn(confine::forward_resizes(sandbox, signal)));
            let status = tokio::task::spawn_blocking(move || child.wait())
                .await
                .map_err(|e| shield_failure(e.to_string()))?
                .map_err(|e| shield_failure(format!("waiting for the sandbox: {e}")))?;
            if let Ok(resizes) = resizes {
                resizes.abort();
            }
            // The broker removes the shield's socket when this goes.
            drop(control);
            exit_of(status)
        })
    }

    fn kind_of(path: &Path) -> Kind {
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Kind::Dir,
            Ok(_) => Kind::File,
            Err(_) => Kind::Missing,
        }
    }

    /// `/etc/resolv.conf`'s target when it is a link into /run (which the sandbox
    /// empties), so name resolution keeps working.
    fn resolv_conf_in_run() -> Option<PathBuf> {
        let target = std::fs::canonicalize("/etc/resolv.conf").ok()?;
        target.starts_with("/run").then_some(target)
    }

    /// bubblewrap on PATH (or the usual place).
    fn find_bwrap() -> Result<PathBuf, Failure> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join("bwrap"))
            .chain(std::iter::once(PathBuf::from("/usr/bin/bwrap")))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                shield_failure(
                    "bubblewrap (bwrap) is not installed, and the shield is built on it: \
                     install it with `sudo apt install bubblewrap` (Debian, Ubuntu) or \
                     `sudo dnf install bubblewrap` (Fedora)",
                )
            })
    }

    /// Refuses early where the kernel says unprivileged user namespaces are off.
    fn user_namespaces_enabled() -> Result<(), Failure> {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().to_string())
        };
        let root = postern_broker::platform::own_uid() == Some(0);
        if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
            return Err(shield_failure(
                "user namespaces are disabled (user.max_user_namespaces = 0), and the shield \
                 needs one: enable them with `sudo sysctl user.max_user_namespaces=15000`",
            ));
        }
        if !root && read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
            return Err(shield_failure(
                "unprivileged user namespaces are disabled \
                 (kernel.unprivileged_userns_clone = 0), and the shield needs one: enable \
                 them with `sudo sysctl kernel.unprivileged_userns_clone=1`",
            ));
        }
        Ok(())
    }
}

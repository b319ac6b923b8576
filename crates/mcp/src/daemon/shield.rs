//! Shields: an agent socket of its own for each `postern shield` run, admitting only
//! processes inside the sandbox the broker inspected for it, so that a session arriving
//! there is confined by construction and recorded so ([`Confinement::Shield`]).
//!
//! The exchange on the control socket (`shield.sock` beside the agent socket; this user
//! only), one JSON line each way ([`ControlRequest`], [`ControlAnswer`]):
//!
//! 1. `{"op":"open"}`: the broker binds the shield's socket (`shields/shd_….sock` beside
//!    the agent socket, 0600) and answers with it and with the broker's own paths the
//!    sandbox must hide (data dir, targets file, anchors, every socket of this broker).
//! 2. The shield starts the sandbox held before the command runs (bubblewrap's
//!    `--block-fd`), binds the shield's socket at the place `postern mcp` looks, and sends
//!    `{"op":"sandbox","pid":N,"profile":{…}}`. The broker then inspects the sandbox itself
//!    through `/proc/N` ([`inspect`]): its user, mount and pid namespaces (and network,
//!    for `broker_only`) are not the broker's, no_new_privs is set, it runs as this user,
//!    and every guarded or hidden path is invisible inside (absent, or an empty directory;
//!    the one entry allowed is the shield's socket itself). Only then does it answer
//!    `confined`, and from then on the shield's socket admits processes in exactly those
//!    namespaces. Anything else: `refused`, with the reason, and the shield never starts
//!    the command.
//! 3. The shield keeps the connection open while its sandbox runs; when it closes, the
//!    shield's socket stops listening and is removed.
//!
//! What this does not stop: the user's own unconfined processes can still enter a
//! sandbox's namespaces (`nsenter` as the owner of its user namespace) and talk on the
//! shield's socket from there. Confinement is a fact about the sandbox, not a defence
//! against a same-user attacker already outside it (see the README's mode table).
//!
//! Never: admit a connection on a shield's socket before its sandbox is registered, take
//! the shield's word for what the sandbox hides, or keep a shield's socket after its
//! control connection ends.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Semaphore;

use postern_broker::AgentApi;
use postern_broker::platform::{self, Listener};
use postern_broker::record::session::{Confinement, ShieldConfinement};

use super::{Admits, AgentAccess, DaemonError, bind, file_identity, serve_gated};
use crate::caller::AgentIdentity;
use crate::server::Sessions;

/// The control socket's name beside the agent socket.
pub const CONTROL_SOCKET: &str = "shield.sock";
/// The directory beside the agent socket that holds the shields' sockets.
pub const SHIELD_DIR: &str = "shields";
/// The most shields one broker runs at once (each holds a listener and a connection).
pub const MAX_SHIELDS: usize = 64;
/// How long a shield may take between `open` and `sandbox`.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest request line read.
const MAX_LINE: usize = 64 * 1024;

/// The network a sandbox gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// The host's network (what coding agents need for their model's API).
    Full,
    /// A network namespace of its own with no route out: the only way to a remote system
    /// is Postern's socket.
    BrokerOnly,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Full => "full",
            Network::BrokerOnly => "broker_only",
        }
    }
}

/// What a shield says its sandbox is. The broker checks what it can see of it (every
/// hidden path, the namespaces) and records its digest; the rest (the system calls
/// refused, how abstract sockets are closed) is the shield's own construction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShieldProfile {
    pub network: Network,
    /// `~/.ssh` and the user's SSH agent let in (`--ssh-agent-ok`).
    pub ssh_agent: bool,
    /// Absolute paths the agent may write (its working directory, its own state).
    pub writable: Vec<String>,
    /// Absolute paths replaced by empty directories.
    pub hidden: Vec<String>,
    /// Absolute paths bound read-only over a writable one (shell start-up files).
    pub read_only: Vec<String>,
    /// System calls the sandbox's filter refuses.
    pub blocked_syscalls: Vec<String>,
    /// How abstract unix sockets outside are kept out of reach: `landlock_scoped` or
    /// `own_network`.
    pub abstract_sockets: String,
}

impl ShieldProfile {
    /// `blake3:<hex>` of the profile's JSON (fields in declaration order).
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("blake3:{}", blake3::hash(&json).to_hex())
    }
}

/// What a shield sends on the control socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlRequest {
    Open,
    Sandbox { pid: u32, profile: ShieldProfile },
}

/// What the broker answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlAnswer {
    Opened {
        shield: String,
        socket: String,
        /// The broker's paths the sandbox must hide.
        guarded: Vec<String>,
    },
    Confined {
        confinement: ShieldConfinement,
    },
    Refused {
        reason: String,
    },
}

/// Where shields go and what they must hide, from the broker that serves them.
#[derive(Debug, Clone)]
pub struct ShieldSetup {
    /// The directory for the shields' sockets.
    pub dir: PathBuf,
    /// The broker's own paths: data dir, targets file, anchors, sockets, key file.
    pub guarded: Vec<PathBuf>,
}

impl ShieldSetup {
    /// The setup for a broker whose agent socket is `agent_socket`, guarding `paths`
    /// (the agent socket, the control socket and the shields' directory are added).
    pub fn new(agent_socket: &Path, paths: impl IntoIterator<Item = PathBuf>) -> ShieldSetup {
        let control = control_socket(agent_socket);
        let dir = platform::sibling_endpoint(agent_socket, SHIELD_DIR);
        let mut guarded: BTreeSet<PathBuf> = paths.into_iter().map(|p| absolute(&p)).collect();
        guarded.insert(absolute(agent_socket));
        guarded.insert(absolute(&control));
        guarded.insert(absolute(&dir));
        for dir in user_secret_dirs() {
            guarded.insert(dir);
        }
        ShieldSetup {
            dir,
            guarded: guarded.into_iter().collect(),
        }
    }
}

impl ShieldSetup {
    /// The setup of the broker `args` opens, listening on `agent_socket` (and, for a
    /// headless daemon, `operator_socket`): its data dir, targets file, audit anchor, the
    /// `file` keychain's key and every socket it serves are guarded.
    pub fn for_daemon(
        args: &crate::DaemonArgs,
        agent_socket: &Path,
        operator_socket: Option<&Path>,
    ) -> ShieldSetup {
        let mut paths = vec![args.data_dir.clone(), args.config.clone()];
        paths.extend(args.anchor.clone());
        paths.extend(platform::anchor_dir());
        paths.extend(args.vault_key_file.clone());
        paths.extend(operator_socket.map(Path::to_path_buf));
        ShieldSetup::new(agent_socket, paths)
    }
}

/// The control socket beside `agent_socket`.
pub fn control_socket(agent_socket: &Path) -> PathBuf {
    platform::sibling_endpoint(agent_socket, CONTROL_SOCKET)
}

/// Where the user's other secrets live, hidden from every sandbox: the Secret Service's
/// keyring files and GnuPG's keys.
pub fn user_secret_dirs() -> Vec<PathBuf> {
    let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
        return Vec::new();
    };
    let home = PathBuf::from(home);
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| home.join(".local/share"), PathBuf::from);
    vec![
        absolute(&data.join("keyrings")),
        absolute(&home.join(".gnupg")),
    ]
}

/// `path` made absolute and, where it exists, with its links resolved (a sandbox binds
/// and hides resolved paths, and the broker checks them the same way).
pub fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Accepts shields on the control socket `listener` until `stop` completes; each one's
/// agent sessions are served with `agents` and recorded in `sessions`.
pub async fn serve_control(
    agents: AgentApi,
    sessions: Arc<Sessions>,
    setup: ShieldSetup,
    mut listener: Listener,
    stop: impl std::future::Future<Output = ()>,
) {
    let setup = Arc::new(setup);
    let slots = Arc::new(Semaphore::new(MAX_SHIELDS));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok(stream) = accepted else { continue };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    // Too many shields: the connection is closed unread.
                    continue;
                };
                let (agents, sessions, setup) = (agents.clone(), sessions.clone(), setup.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    run_shield(agents, sessions, &setup, stream).await;
                });
            }
            () = &mut stop => break,
        }
    }
}

/// Binds the control socket beside `agent_socket` (0600, owner-only directories).
pub async fn bind_control(agent_socket: &Path) -> Result<Listener, DaemonError> {
    bind(&control_socket(agent_socket)).await
}

/// The gate of one shield's socket: empty until the sandbox is registered.
#[derive(Default)]
struct ShieldGate {
    registered: OnceLock<(Namespaces, Confinement)>,
}

impl Admits for ShieldGate {
    fn admit(&self, identity: &AgentIdentity) -> Option<Confinement> {
        let (ns, confinement) = self.registered.get()?;
        let inside = |pid: u32| Namespaces::of(pid).is_some_and(|n| &n == ns);
        (inside(identity.bridge_pid) && inside(identity.agent.pid)).then(|| confinement.clone())
    }
}

/// One shield, from `open` to its control connection's end.
async fn run_shield(
    agents: AgentApi,
    sessions: Arc<Sessions>,
    setup: &ShieldSetup,
    stream: platform::Accepted,
) {
    let Ok(cred) = platform::peer_of(&stream) else {
        return;
    };
    let Ok(me) = platform::current_user() else {
        return;
    };
    if cred.user != me {
        return;
    }
    let (read, mut write) = platform::split(stream);
    let mut lines = BufReader::new(read);
    match read_request(&mut lines).await {
        Some(ControlRequest::Open) => {}
        _ => {
            let _ = answer(&mut write, &refused("the first request must be `open`")).await;
            return;
        }
    }
    let Ok(id) = shield_id() else {
        let _ = answer(&mut write, &refused("no randomness for a shield id")).await;
        return;
    };
    let socket = setup.dir.join(format!("{id}.sock"));
    let listener = match bind(&socket).await {
        Ok(l) => l,
        Err(e) => {
            let _ = answer(&mut write, &refused(&format!("the shield's socket: {e}"))).await;
            return;
        }
    };
    let bound = file_identity(&socket);
    let gate = Arc::new(ShieldGate::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(serve_gated(
        agents,
        sessions,
        listener,
        async move {
            let mut rx = stop_rx;
            let _ = rx.wait_for(|stop| *stop).await;
        },
        AgentAccess::OwnUser,
        Some(gate.clone() as Arc<dyn Admits>),
    ));
    let opened = ControlAnswer::Opened {
        shield: id.clone(),
        socket: socket.display().to_string(),
        guarded: setup
            .guarded
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
    };
    if answer(&mut write, &opened).await.is_ok() {
        confine(&mut lines, &mut write, setup, &id, bound, &gate).await;
    }
    let _ = stop_tx.send(true);
    let _ = serving.await;
    if bound.is_some() && file_identity(&socket) == bound {
        let _ = std::fs::remove_file(&socket);
    }
}

/// Waits for the shield to register its sandbox, inspects it, opens `gate` to it, and
/// holds until the shield goes (its end is the connection's). A sandbox that fails
/// inspection is refused with the reason and the gate stays shut.
async fn confine<R, W>(
    lines: &mut R,
    write: &mut W,
    setup: &ShieldSetup,
    id: &str,
    bound: Option<(u64, u64)>,
    gate: &ShieldGate,
) where
    R: tokio::io::AsyncBufRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let registered = tokio::time::timeout(REGISTER_TIMEOUT, read_request(lines)).await;
    let Ok(Some(ControlRequest::Sandbox { pid, profile })) = registered else {
        let why = "expected `sandbox` with the sandbox's pid and profile";
        let _ = answer(write, &refused(why)).await;
        return;
    };
    let inspected = bound
        .ok_or_else(|| "the shield's socket is gone".to_string())
        .and_then(|socket_id| inspect(pid, &profile, &setup.guarded, socket_id));
    let ns = match inspected {
        Ok(ns) => ns,
        Err(reason) => {
            let _ = answer(write, &refused(&reason)).await;
            return;
        }
    };
    let confinement = ShieldConfinement {
        shield: id.to_string(),
        profile_digest: profile.digest(),
        network: profile.network.as_str().to_string(),
        ssh_agent: profile.ssh_agent,
        writable: profile.writable.clone(),
    };
    let _ = gate
        .registered
        .set((ns, Confinement::Shield(confinement.clone())));
    if answer(write, &ControlAnswer::Confined { confinement })
        .await
        .is_ok()
    {
        // Whatever the shield still sends is read and dropped, never kept.
        let mut sink = [0u8; 512];
        while matches!(
            tokio::io::AsyncReadExt::read(lines, &mut sink).await,
            Ok(n) if n > 0
        ) {}
    }
}

fn refused(reason: &str) -> ControlAnswer {
    ControlAnswer::Refused {
        reason: reason.to_string(),
    }
}

async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut R) -> Option<ControlRequest> {
    let mut line = Vec::new();
    let mut limited = tokio::io::AsyncReadExt::take(lines, MAX_LINE as u64);
    limited.read_until(b'\n', &mut line).await.ok()?;
    serde_json::from_slice(&line).ok()
}

async fn answer<W: tokio::io::AsyncWrite + Unpin>(
    write: &mut W,
    answer: &ControlAnswer,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(answer).map_err(std::io::Error::other)?;
    line.push(b'\n');
    write.write_all(&line).await?;
    write.flush().await
}

/// `shd_` and 16 random hex digits.
fn shield_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)?;
    Ok(format!("shd_{}", hex::encode(bytes)))
}

/// The namespaces that make a sandbox, as the inode numbers `/proc/PID/ns/*` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Namespaces {
    pub user: u64,
    pub mnt: u64,
    pub pid: u64,
    pub net: u64,
}

impl Namespaces {
    /// The namespaces of `pid`, or `None` when it is gone or not this user's to read.
    pub fn of(pid: u32) -> Option<Namespaces> {
        Self::at(&PathBuf::from(format!("/proc/{pid}")))
    }

    /// This process's namespaces.
    pub fn own() -> Option<Namespaces> {
        Self::at(Path::new("/proc/self"))
    }

    fn at(proc_dir: &Path) -> Option<Namespaces> {
        let read = |name: &str| -> Option<u64> {
            let link = std::fs::read_link(proc_dir.join("ns").join(name)).ok()?;
            let text = link.to_str()?;
            text.strip_prefix(name)?
                .strip_prefix(":[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        };
        Some(Namespaces {
            user: read("user")?,
            mnt: read("mnt")?,
            pid: read("pid")?,
            net: read("net")?,
        })
    }
}

/// Inspects the sandbox whose first process is `pid` (held before its command runs) and
/// returns its namespaces, or why it is not the sandbox `profile` describes: see the
/// module docs. `socket` is the shield's own socket, the one entry a hidden directory
/// may hold.
pub fn inspect(
    pid: u32,
    profile: &ShieldProfile,
    guarded: &[PathBuf],
    socket: (u64, u64),
) -> Result<Namespaces, String> {
    let own = Namespaces::own().ok_or("this broker's own namespaces cannot be read")?;
    let ns = Namespaces::of(pid)
        .ok_or_else(|| format!("process {pid} is gone or not this user's to inspect"))?;
    for (name, theirs, mine) in [
        ("user", ns.user, own.user),
        ("mount", ns.mnt, own.mnt),
        ("pid", ns.pid, own.pid),
    ] {
        if theirs == mine {
            return Err(format!(
                "process {pid} shares the broker's {name} namespace: it is not in a sandbox"
            ));
        }
    }
    if profile.network == Network::BrokerOnly && ns.net == own.net {
        return Err(format!(
            "process {pid} shares the host's network although the profile says broker_only"
        ));
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status cannot be read ({e})"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    if field("NoNewPrivs:") != Some("1") {
        return Err(format!(
            "process {pid} may gain privileges (no_new_privs is not set)"
        ));
    }
    let uid = platform::own_uid().ok_or("this broker's own uid is unknown")?;
    let real_uid = field("Uid:").and_then(|v| v.split_whitespace().next());
    if real_uid != Some(uid.to_string().as_str()) {
        return Err(format!("process {pid} does not run as this broker's user"));
    }
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let mut must_hide: BTreeSet<PathBuf> = guarded.iter().cloned().collect();
    must_hide.extend(profile.hidden.iter().map(PathBuf::from));
    must_hide.extend(display_paths());
    for path in &must_hide {
        hidden_in(&root, path, socket)?;
    }
    // Checked again: the process must still be the one inspected.
    if Namespaces::of(pid) != Some(ns) {
        return Err(format!("process {pid} changed while it was inspected"));
    }
    Ok(ns)
}

/// The places a display server or the session bus listens on a path: a sandbox must show
/// none of them.
pub fn display_paths() -> Vec<PathBuf> {
    let mut paths = vec![PathBuf::from("/tmp/.X11-unix")];
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        paths.push(PathBuf::from(runtime));
    }
    if let Some(bus) = std::env::var("DBUS_SESSION_BUS_ADDRESS")
        .ok()
        .and_then(|a| bus_path(&a))
    {
        paths.push(bus);
    }
    paths
}

/// The socket path of a D-Bus address `unix:path=…` (abstract addresses have none).
pub fn bus_path(address: &str) -> Option<PathBuf> {
    address.split(';').find_map(|a| {
        a.strip_prefix("unix:")?
            .split(',')
            .find_map(|kv| kv.strip_prefix("path="))
            .map(PathBuf::from)
    })
}

/// Checks that `path` is hidden inside the sandbox whose root is `root`: absent, or a
/// directory tree holding nothing but directories and the shield's `socket`.
fn hidden_in(root: &Path, path: &Path, socket: (u64, u64)) -> Result<(), String> {
    let inside = root.join(path.strip_prefix("/").unwrap_or(path));
    let visible = |why: &str| {
        Err(format!(
            "{} is visible inside the sandbox ({why}); it must be hidden",
            path.display()
        ))
    };
    let meta = match std::fs::symlink_metadata(&inside) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            // Not even listable from outside means not listable from inside either
            // only when the sandbox's own view says so; refuse rather than guess.
            return Err(format!(
                "{} cannot be examined inside the sandbox ({e})",
                path.display()
            ));
        }
    };
    if is_shield_socket(&meta, socket) {
        return Ok(());
    }
    if !meta.is_dir() {
        return visible("it is not an empty directory");
    }
    let mut stack = vec![(inside, 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| format!("{} cannot be listed ({e})", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{} cannot be listed ({e})", dir.display()))?;
            seen += 1;
            let meta = entry
                .metadata()
                .map_err(|e| format!("{} cannot be examined ({e})", entry.path().display()))?;
            if is_shield_socket(&meta, socket) {
                continue;
            }
            if !meta.is_dir() || depth >= 4 || seen > 64 {
                return visible(&format!(
                    "it holds {}",
                    entry
                        .path()
                        .strip_prefix(root)
                        .unwrap_or(&entry.path())
                        .display()
                ));
            }
            stack.push((entry.path(), depth + 1));
        }
    }
    Ok(())
}

fn is_shield_socket(meta: &std::fs::Metadata, socket: (u64, u64)) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    meta.file_type().is_socket() && (meta.dev(), meta.ino()) == socket
}

/// A shield's side of the control socket: `open`, then `register` the sandbox; the
/// shield holds the connection for the sandbox's life.
pub struct ControlClient {
    lines: BufReader<tokio::net::unix::OwnedReadHalf>,
    write: tokio::net::unix::OwnedWriteHalf,
}

/// What `open` gives a shield.
#[derive(Debug, Clone)]
pub struct Opened {
    pub shield: String,
    pub socket: PathBuf,
    pub guarded: Vec<PathBuf>,
}

impl ControlClient {
    /// Connects to the control socket beside `agent_socket` and opens a shield.
    pub async fn open(agent_socket: &Path) -> Result<(ControlClient, Opened), String> {
        let control = control_socket(agent_socket);
        let stream = tokio::net::UnixStream::connect(&control)
            .await
            .map_err(|e| {
                format!(
                    "no broker answers on {} ({e}); start the console or `postern daemon` first",
                    control.display()
                )
            })?;
        crate::bridge::verify_broker(&control, &stream)
            .map_err(|why| crate::bridge::untrusted_message(&control, &why))?;
        let (read, write) = stream.into_split();
        let mut client = ControlClient {
            lines: BufReader::new(read),
            write,
        };
        match client.ask(&ControlRequest::Open).await? {
            ControlAnswer::Opened {
                shield,
                socket,
                guarded,
            } => Ok((
                client,
                Opened {
                    shield,
                    socket: PathBuf::from(socket),
                    guarded: guarded.into_iter().map(PathBuf::from).collect(),
                },
            )),
            ControlAnswer::Refused { reason } => Err(format!("the broker refused: {reason}")),
            ControlAnswer::Confined { .. } => Err("the broker answered out of turn".into()),
        }
    }

    /// Registers the sandbox whose first process is `pid`; the broker inspects it.
    pub async fn register(
        &mut self,
        pid: u32,
        profile: &ShieldProfile,
    ) -> Result<ShieldConfinement, String> {
        let request = ControlRequest::Sandbox {
            pid,
            profile: profile.clone(),
        };
        match self.ask(&request).await? {
            ControlAnswer::Confined { confinement } => Ok(confinement),
            ControlAnswer::Refused { reason } => {
                Err(format!("the broker refused the sandbox: {reason}"))
            }
            ControlAnswer::Opened { .. } => Err("the broker answered out of turn".into()),
        }
    }

    async fn ask(&mut self, request: &ControlRequest) -> Result<ControlAnswer, String> {
        let mut line = serde_json::to_vec(request).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.write
            .write_all(&line)
            .await
            .map_err(|e| format!("the broker went away ({e})"))?;
        let mut answer = String::new();
        self.lines
            .read_line(&mut answer)
            .await
            .map_err(|e| format!("the broker went away ({e})"))?;
        serde_json::from_str(&answer)
            .map_err(|_| "the broker's answer is not one a shield knows".into())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_bus_address_names_its_socket_only_when_it_has_a_path() {
        assert_eq!(
            bus_path("unix:path=/run/user/1000/bus"),
            Some(PathBuf::from("/run/user/1000/bus"))
        );
        assert_eq!(
            bus_path("unix:abstract=/tmp/dbus-x,guid=1;unix:path=/tmp/b"),
            Some(PathBuf::from("/tmp/b"))
        );
        assert_eq!(bus_path("unix:abstract=/tmp/dbus-x,guid=1"), None);
    }

    #[test]
    fn this_process_is_not_a_sandbox() {
        let profile = ShieldProfile {
            network: Network::Full,
            ssh_agent: false,
            writable: vec![],
            hidden: vec![],
            read_only: vec![],
            blocked_syscalls: vec![],
            abstract_sockets: "landlock_scoped".into(),
        };
        let err = inspect(std::process::id(), &profile, &[], (0, 0)).unwrap_err();
        assert!(err.contains("shares the broker's user namespace"), "{err}");
    }

    #[test]
    fn a_profile_digest_changes_with_what_it_hides() {
        let mut profile = ShieldProfile {
            network: Network::Full,
            ssh_agent: false,
            writable: vec!["/work".into()],
            hidden: vec!["/home/u/.ssh".into()],
            read_only: vec![],
            blocked_syscalls: vec!["keyctl".into()],
            abstract_sockets: "landlock_scoped".into(),
        };
        let before = profile.digest();
        assert!(before.starts_with("blake3:") && before.len() == 7 + 64);
        profile.hidden.clear();
        assert_ne!(profile.digest(), before);
    }

    #[test]
    fn a_hidden_path_may_hold_only_directories_and_the_shields_socket() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        std::fs::create_dir_all(data.join("run")).unwrap();
        let sock_path = data.join("run/postern.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock_path).unwrap();
        let meta = std::fs::metadata(&sock_path).unwrap();
        let socket = (meta.dev(), meta.ino());
        assert!(hidden_in(root.path(), Path::new("/data"), socket).is_ok());
        assert!(hidden_in(root.path(), Path::new("/absent"), socket).is_ok());
        // Another socket is not the shield's.
        assert!(hidden_in(root.path(), Path::new("/data"), (0, 0)).is_err());
        std::fs::write(data.join("journal.db"), b"x").unwrap();
        let err = hidden_in(root.path(), Path::new("/data"), socket).unwrap_err();
        assert!(err.contains("journal.db"), "{err}");
    }
}

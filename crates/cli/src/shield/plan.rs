//! What a shield's sandbox shows its agent, decided before anything starts: the
//! bubblewrap arguments and the profile the broker checks and records. Pure: the facts of
//! the host ([`Host`]) come in, nothing is read or started here.
//!
//! The layers, in the order bubblewrap applies them (a later mount covers an earlier):
//! 1. the whole filesystem read-only, a fresh `/dev`, `/proc` of the sandbox's own pid
//!    namespace, and empty `/tmp` and `/run` (no display socket, no session or system
//!    bus, no other user's runtime files);
//! 2. the agent's working directory, its own state (per known agent) and each `--rw`
//!    path, read-write;
//! 3. shell start-up files and autostart entries inside a writable path, read-only again;
//! 4. every path the broker guards and the user's other secrets (keyrings, GnuPG, SSH)
//!    replaced by empty directories;
//! 5. the shield's own socket, bound where `postern mcp` looks for the broker.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use postern_mcp::daemon::shield::{Network, ShieldProfile};

/// What a path is on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Missing,
}

/// The facts of the host a plan is made from; every path absolute and resolved.
#[derive(Debug, Clone)]
pub struct Host {
    pub home: PathBuf,
    pub cwd: PathBuf,
    /// Where `postern mcp` looks for the broker (inside the sandbox as outside it).
    pub agent_socket: PathBuf,
    /// The socket the broker made for this shield.
    pub shield_socket: PathBuf,
    /// The broker's paths the sandbox must hide (its `opened` answer).
    pub guarded: Vec<PathBuf>,
    pub runtime_dir: Option<PathBuf>,
    pub ssh_auth_sock: Option<PathBuf>,
    /// Where `/etc/resolv.conf` leads when it is a link into `/run` (systemd-resolved).
    pub resolv_conf: Option<PathBuf>,
    /// Whether the kernel's Landlock can scope abstract unix sockets (ABI 6 and later).
    pub landlock_scopes: bool,
}

/// What the person asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub network: Network,
    pub rw: Vec<PathBuf>,
    pub ssh_agent_ok: bool,
    /// The command's first word, for the known agents' state directories.
    pub program: String,
}

/// The sandbox to start.
#[derive(Debug, Clone)]
pub struct Plan {
    /// bubblewrap's arguments, up to (not including) the descriptors and the command.
    pub args: Vec<OsString>,
    pub profile: ShieldProfile,
}

/// Why no sandbox was planned; nothing was started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "{0} would be writable, and it holds your shell start-up files or autostart \
         entries; name the directories the agent needs instead (e.g. --rw ~/projects/x)"
    )]
    CoversStartup(PathBuf),
    #[error(
        "{writable} would be writable, and it holds {guarded}, which the shield must hide; \
         run the agent from a directory that does not contain it, or name a narrower --rw"
    )]
    CoversGuarded { writable: PathBuf, guarded: PathBuf },
    #[error("--rw {0}: no such file or directory (create it first)")]
    MissingWritable(PathBuf),
    #[error(
        "{0} must be hidden from the agent, but it is a file in a directory the agent needs \
         ({1}); move it into Postern's data directory or another directory of its own"
    )]
    CannotHide(PathBuf, PathBuf),
    #[error(
        "this kernel's Landlock cannot keep abstract unix sockets (the X server's, D-Bus's) \
         away from a sandbox that shares the network (Linux 6.12 or later is needed); use \
         --network broker-only, which gives the agent a network of its own"
    )]
    NoAbstractScope,
}

/// The system calls a shield refuses: the kernel keyrings, whatever the keyring.
pub const BLOCKED_SYSCALLS: &[&str] = &["keyctl", "add_key", "request_key"];

/// Variables that would point the agent at what it must not reach.
const UNSET_ENV: &[&str] = &[
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XAUTHORITY",
    "DBUS_SESSION_BUS_ADDRESS",
    "DBUS_SYSTEM_BUS_ADDRESS",
    "GNOME_KEYRING_CONTROL",
    "SESSION_MANAGER",
    "GPG_AGENT_INFO",
];

/// Start-up files and autostart locations, relative to the home directory: read-only
/// inside whenever they fall under a writable path, and a writable path may not hold
/// their directories.
pub const STARTUP: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".xprofile",
    ".xsessionrc",
    ".xinitrc",
    ".pam_environment",
    ".config/fish",
    ".config/autostart",
    ".config/systemd",
    ".config/environment.d",
    ".local/share/applications",
    ".local/bin",
];

/// The state and configuration each known agent keeps, relative to the home directory.
pub fn agent_state(program: &str) -> &'static [&'static str] {
    let name = program.rsplit('/').next().unwrap_or(program);
    match name {
        "claude" => &[".claude", ".claude.json", ".config/claude"],
        "codex" => &[".codex"],
        "gemini" => &[".gemini"],
        "cursor-agent" => &[".cursor"],
        "opencode" => &[
            ".config/opencode",
            ".local/share/opencode",
            ".local/state/opencode",
        ],
        "aider" => &[".aider"],
        "goose" => &[".config/goose", ".local/share/goose"],
        _ => &[],
    }
}

/// Plans the sandbox; `kind` says what a host path is.
pub fn plan(host: &Host, opts: &Options, kind: &dyn Fn(&Path) -> Kind) -> Result<Plan, PlanError> {
    if opts.network == Network::Full && !host.landlock_scopes {
        return Err(PlanError::NoAbstractScope);
    }
    let mut hidden: BTreeSet<PathBuf> = host.guarded.iter().cloned().collect();
    if !opts.ssh_agent_ok {
        hidden.insert(host.home.join(".ssh"));
    }
    // Writable: the working directory, the agent's own state, each --rw.
    let mut writable: BTreeSet<PathBuf> = BTreeSet::new();
    writable.insert(host.cwd.clone());
    for rel in agent_state(&opts.program) {
        let path = host.home.join(rel);
        if kind(&path) != Kind::Missing {
            writable.insert(path);
        }
    }
    for path in &opts.rw {
        if kind(path) == Kind::Missing {
            return Err(PlanError::MissingWritable(path.clone()));
        }
        writable.insert(path.clone());
    }
    let startup_dirs: Vec<PathBuf> = std::iter::once(host.home.clone())
        .chain(
            STARTUP
                .iter()
                .map(|rel| host.home.join(rel))
                .filter_map(|p| p.parent().map(Path::to_path_buf)),
        )
        .collect();
    for w in &writable {
        if startup_dirs.iter().any(|d| d.starts_with(w)) {
            return Err(PlanError::CoversStartup(w.clone()));
        }
        if let Some(g) = hidden.iter().find(|g| g.starts_with(w)) {
            return Err(PlanError::CoversGuarded {
                writable: w.clone(),
                guarded: g.clone(),
            });
        }
    }
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
        args.extend(items.iter().map(|i| i.as_ref().to_os_string()));
    };
    // Namespaces and process.
    push(&[
        &"--unshare-user",
        &"--unshare-pid",
        &"--unshare-ipc",
        &"--unshare-uts",
        &"--unshare-cgroup-try",
    ]);
    if opts.network == Network::BrokerOnly {
        push(&[&"--unshare-net"]);
    }
    push(&[
        &"--die-with-parent",
        &"--new-session",
        &"--cap-drop",
        &"ALL",
    ]);
    // 1. The base.
    push(&[
        &"--ro-bind",
        &"/",
        &"/",
        &"--dev",
        &"/dev",
        &"--proc",
        &"/proc",
    ]);
    push(&[&"--tmpfs", &"/tmp", &"--tmpfs", &"/run"]);
    if let Some(target) = &host.resolv_conf {
        push(&[&"--ro-bind", target, target]);
    }
    if let Some(runtime) = &host.runtime_dir {
        push(&[&"--perms", &"0700", &"--dir", runtime]);
    }
    // 2. Writable.
    for w in &writable {
        push(&[&"--bind", w, w]);
    }
    // 3. Start-up files under a writable path: read-only again.
    let mut read_only = Vec::new();
    for rel in STARTUP {
        let path = host.home.join(rel);
        if kind(&path) != Kind::Missing && writable.iter().any(|w| path.starts_with(w)) {
            push(&[&"--ro-bind", &path, &path]);
            read_only.push(path.display().to_string());
        }
    }
    // 4. Hidden: a directory becomes an empty one; a file's own directory is hidden,
    // unless the agent needs that directory.
    let mut covered: BTreeSet<PathBuf> = BTreeSet::new();
    for path in &hidden {
        match kind(path) {
            Kind::Missing => {}
            Kind::Dir => {
                covered.insert(path.clone());
            }
            Kind::File => {
                let parent = path.parent().unwrap_or(Path::new("/")).to_path_buf();
                let needed = parent == Path::new("/")
                    || host.home.starts_with(&parent)
                    || writable
                        .iter()
                        .any(|w| w.starts_with(&parent) || parent.starts_with(w));
                if needed {
                    return Err(PlanError::CannotHide(path.clone(), parent));
                }
                covered.insert(parent);
            }
        }
    }
    for dir in &covered {
        // Under /tmp or /run, or under another hidden directory, it is already gone.
        let inside_another = covered.iter().any(|c| c != dir && dir.starts_with(c));
        if dir.starts_with("/tmp") || dir.starts_with("/run") || inside_another {
            continue;
        }
        push(&[&"--perms", &"0700", &"--tmpfs", dir]);
    }
    // 5. The broker, where `postern mcp` looks.
    push(&[&"--bind", &host.shield_socket, &host.agent_socket]);
    let mut unset_env: Vec<&'static str> = UNSET_ENV.to_vec();
    match (&host.ssh_auth_sock, opts.ssh_agent_ok) {
        (Some(sock), true) => push(&[&"--bind", sock, sock]),
        _ => unset_env.push("SSH_AUTH_SOCK"),
    }
    for var in &unset_env {
        push(&[&"--unsetenv", var]);
    }
    let abstract_sockets = match opts.network {
        Network::BrokerOnly => "own_network",
        Network::Full => "landlock_scoped",
    };
    let profile = ShieldProfile {
        network: opts.network,
        ssh_agent: opts.ssh_agent_ok,
        writable: writable.iter().map(|p| p.display().to_string()).collect(),
        hidden: hidden.iter().map(|p| p.display().to_string()).collect(),
        read_only,
        blocked_syscalls: BLOCKED_SYSCALLS.iter().map(|s| s.to_string()).collect(),
        abstract_sockets: abstract_sockets.to_string(),
    };
    Ok(Plan { args, profile })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn host() -> Host {
        Host {
            home: "/home/u".into(),
            cwd: "/home/u/src/app".into(),
            agent_socket: "/home/u/.local/share/postern/run/postern.sock".into(),
            shield_socket: "/home/u/.local/share/postern/run/shields/shd_1.sock".into(),
            guarded: vec![
                "/home/u/.local/share/postern".into(),
                "/home/u/.local/share/keyrings".into(),
                "/home/u/.gnupg".into(),
            ],
            runtime_dir: Some("/run/user/1000".into()),
            ssh_auth_sock: Some("/run/user/1000/ssh-agent.sock".into()),
            resolv_conf: None,
            landlock_scopes: true,
        }
    }

    fn opts() -> Options {
        Options {
            network: Network::Full,
            rw: vec![],
            ssh_agent_ok: false,
            program: "claude".into(),
        }
    }

    fn exists(path: &Path) -> Kind {
        let dirs = [
            "/home/u/.claude",
            "/home/u/.local/share/postern",
            "/home/u/.local/share/keyrings",
            "/home/u/.ssh",
            "/home/u/src/app",
            "/home/u/src",
            "/home/u/.config/autostart",
        ];
        let files = ["/home/u/.bashrc", "/home/u/.claude.json"];
        if dirs.iter().any(|d| Path::new(d) == path) {
            Kind::Dir
        } else if files.iter().any(|f| Path::new(f) == path) {
            Kind::File
        } else {
            Kind::Missing
        }
    }

    fn words(plan: &Plan) -> String {
        plan.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn the_sandbox_hides_the_broker_and_the_users_secrets_and_binds_only_the_shields_socket() {
        let plan = plan(&host(), &opts(), &exists).unwrap();
        let w = words(&plan);
        for expected in [
            "--unshare-user --unshare-pid --unshare-ipc",
            "--die-with-parent --new-session --cap-drop ALL",
            "--ro-bind / /",
            "--tmpfs /tmp --tmpfs /run",
            "--bind /home/u/src/app /home/u/src/app",
            "--bind /home/u/.claude /home/u/.claude",
            "--bind /home/u/.claude.json /home/u/.claude.json",
            "--perms 0700 --tmpfs /home/u/.local/share/postern",
            "--perms 0700 --tmpfs /home/u/.local/share/keyrings",
            "--perms 0700 --tmpfs /home/u/.ssh",
            "--bind /home/u/.local/share/postern/run/shields/shd_1.sock \
             /home/u/.local/share/postern/run/postern.sock",
            "--unsetenv DISPLAY",
            "--unsetenv DBUS_SESSION_BUS_ADDRESS",
            "--unsetenv SSH_AUTH_SOCK",
        ] {
            assert!(w.contains(expected), "missing {expected:?} in {w}");
        }
        // The socket is bound after the data dir is hidden, so it is the one entry there.
        let hide = w.find("--tmpfs /home/u/.local/share/postern").unwrap();
        let bind = w.find("shd_1.sock").unwrap();
        assert!(hide < bind);
        // A missing path is not mounted, but it is still checked by the broker.
        assert!(!w.contains(".gnupg"));
        assert!(plan.profile.hidden.contains(&"/home/u/.gnupg".to_string()));
        assert!(!w.contains("--unshare-net"));
        assert_eq!(plan.profile.abstract_sockets, "landlock_scoped");
    }

    #[test]
    fn broker_only_gives_the_agent_a_network_of_its_own() {
        let mut o = opts();
        o.network = Network::BrokerOnly;
        let mut h = host();
        h.landlock_scopes = false;
        let plan = plan(&h, &o, &exists).unwrap();
        assert!(words(&plan).contains("--unshare-net"));
        assert_eq!(plan.profile.abstract_sockets, "own_network");
    }

    #[test]
    fn a_shared_network_without_landlock_scopes_is_refused_before_anything_starts() {
        let mut h = host();
        h.landlock_scopes = false;
        assert_eq!(
            plan(&h, &opts(), &exists).unwrap_err(),
            PlanError::NoAbstractScope
        );
    }

    #[test]
    fn the_home_directory_or_a_path_holding_the_data_dir_is_never_writable() {
        let mut h = host();
        h.cwd = "/home/u".into();
        assert!(matches!(
            plan(&h, &opts(), &exists),
            Err(PlanError::CoversStartup(_))
        ));
        let mut o = opts();
        o.rw = vec!["/home/u/.local/share/postern".into()];
        let err = plan(&host(), &o, &exists).unwrap_err();
        assert!(matches!(err, PlanError::CoversGuarded { .. }), "{err}");
        o.rw = vec!["/home/u/.config".into()];
        // ~/.config does not exist in this fake host.
        assert!(matches!(
            plan(&host(), &o, &exists),
            Err(PlanError::MissingWritable(_))
        ));
    }

    #[test]
    fn ssh_agent_ok_lets_in_the_agent_socket_and_dot_ssh() {
        let mut o = opts();
        o.ssh_agent_ok = true;
        let plan = plan(&host(), &o, &exists).unwrap();
        let w = words(&plan);
        assert!(w.contains("--bind /run/user/1000/ssh-agent.sock /run/user/1000/ssh-agent.sock"));
        assert!(!w.contains("--tmpfs /home/u/.ssh"));
        assert!(!w.contains("--unsetenv SSH_AUTH_SOCK"));
        assert!(plan.profile.ssh_agent);
    }

    #[test]
    fn a_guarded_file_is_hidden_with_its_own_directory_or_refused() {
        let mut h = host();
        h.guarded.push("/etc/postern/vault.key".into());
        let files = |p: &Path| {
            if p == Path::new("/etc/postern/vault.key") {
                Kind::File
            } else {
                exists(p)
            }
        };
        let w = words(&plan(&h, &opts(), &files).unwrap());
        assert!(w.contains("--tmpfs /etc/postern"), "{w}");
        let mut h = host();
        h.guarded.push("/home/u/postern.toml".into());
        let files = |p: &Path| {
            if p == Path::new("/home/u/postern.toml") {
                Kind::File
            } else {
                exists(p)
            }
        };
        assert!(matches!(
            plan(&h, &opts(), &files),
            Err(PlanError::CannotHide(..))
        ));
    }
}

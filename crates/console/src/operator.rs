//! The operator socket: a second listener beside the agent (MCP) socket, through which a
//! console running as another user (the person, while the broker runs as its own system
//! user) drives the broker. Agents never reach it: it is another socket file, with its
//! own protocol, and the agent socket understands MCP only.
//!
//! # Protocol
//! Newline-delimited JSON, one request per line, answered in order on the same
//! connection:
//!
//! ```text
//! → {"id": 1, "command": "answer_approval", "args": {"invocationId": "…", "fingerprint": "…", "decision": "approve"}}
//! ← {"id": 1, "ok": null}
//! ← {"id": 2, "error": {"code": "NOT_PENDING", "message": "…", "field": null}}
//! ```
//!
//! `command` and `args` are exactly what [`crate::dispatch`] takes. A line longer than
//! [`MAX_REQUEST`], one that is not JSON, or one without a `command` is answered with an
//! INVALID_INPUT error (`id` null when it could not be read), and the connection goes on.
//!
//! # Who may connect
//! The socket file is 0660 and owned by the operator group (0600 without one), and every
//! connection's peer credentials (SO_PEERCRED) are checked again: the broker's own uid,
//! root, or a process whose primary or supplementary groups include the operator group.
//! Anyone else gets one OPERATOR_REFUSED line and the connection is closed; the refusal
//! is logged and counted (the count is in the overview).
//!
//! The operator group is the privilege-separated install's, and Linux only: elsewhere
//! [`lookup_group`] says so. On macOS the peer is read with getpeereid (the broker's own
//! uid or root); on Windows the socket is a named pipe beside the agent's and the peer
//! must run as the broker's own user (its token's SID).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use zeroize::Zeroizing;

#[cfg(target_os = "linux")]
use postern_broker::platform::supplementary_groups;
use postern_broker::platform::{self, Accepted, Listener, PeerCred, UserId};
use postern_mcp::bridge::{Line, LineReader, MAX_DEPTH, nesting_exceeds};
use postern_mcp::daemon::{DaemonError, bind_with_mode};

use crate::console::Console;
use crate::dispatch::{Caller, dispatch_as};
use crate::dto::{CommandError, ErrorCode};

/// The longest request line accepted (an SSH private key in `set_credential` fits many
/// times over).
pub const MAX_REQUEST: usize = 1024 * 1024;

/// The operator socket's default path: beside the agent socket (on Windows, the pipe
/// `<agent pipe>-operator`).
pub fn default_operator_socket(agent_socket: &Path) -> PathBuf {
    platform::sibling_endpoint(agent_socket, "operator.sock")
}

/// One request line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Echoed in the answer; any JSON value the client chooses.
    #[serde(default)]
    pub id: Value,
    pub command: String,
    #[serde(default)]
    pub args: Value,
}

/// One answer line: exactly one of `ok` and `error`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Response {
    pub id: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CommandError>,
}

/// The group whose members may operate the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorGroup {
    pub name: String,
    pub gid: u32,
}

/// Why the operator socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("the operator group `{0}` does not exist (not in /etc/group and not a number)")]
    UnknownGroup(String),
    #[error("cannot read /etc/group: {0}")]
    GroupFile(std::io::Error),
    #[error("{0}")]
    Socket(#[from] DaemonError),
    #[error(
        "cannot give the operator socket {path} to group {group}: {source} (the broker's \
         user must be a member of {group}; under systemd, SupplementaryGroups={group})"
    )]
    Chown {
        path: String,
        group: String,
        source: std::io::Error,
    },
    #[error("cannot tell which user this process runs as")]
    NoUid,
    #[error(
        "operator groups (`{0}`) belong to the privilege-separated install, which is Linux \
         only; on this platform only the broker's own user may operate it"
    )]
    GroupsUnsupported(String),
}

/// Finds `name` in /etc/group (a plain number is taken as the gid itself).
#[cfg(target_os = "linux")]
pub fn lookup_group(name: &str) -> Result<OperatorGroup, OperatorError> {
    let text = std::fs::read_to_string("/etc/group").map_err(OperatorError::GroupFile)?;
    let found = text.lines().find_map(|line| {
        let mut fields = line.split(':');
        let group = fields.next()?;
        let gid = fields.nth(1)?.parse().ok()?;
        (group == name).then_some(gid)
    });
    match found.or_else(|| name.parse().ok()) {
        Some(gid) => Ok(OperatorGroup {
            name: name.to_string(),
            gid,
        }),
        None => Err(OperatorError::UnknownGroup(name.to_string())),
    }
}

/// Operator groups are Linux only (see the module docs).
#[cfg(not(target_os = "linux"))]
pub fn lookup_group(name: &str) -> Result<OperatorGroup, OperatorError> {
    Err(OperatorError::GroupsUnsupported(name.to_string()))
}

/// The supplementary groups of process `pid`: none are read where operator groups do
/// not exist.
#[cfg(all(unix, not(target_os = "linux")))]
fn supplementary_groups(_pid: u32) -> Vec<u32> {
    Vec::new()
}

/// The kernel's word on who connected.
#[cfg(unix)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<u32>,
}

/// Who may operate this broker.
#[cfg(unix)]
#[derive(Debug, Clone)]
pub struct OperatorAccess {
    pub own_uid: u32,
    pub group: Option<OperatorGroup>,
}

/// Who may operate this broker: on Windows, its own user only.
#[cfg(windows)]
#[derive(Debug, Clone)]
pub struct OperatorAccess {
    pub own_user: UserId,
}

#[cfg(windows)]
impl OperatorAccess {
    fn new(group: Option<OperatorGroup>) -> Result<Self, OperatorError> {
        if let Some(group) = group {
            return Err(OperatorError::GroupsUnsupported(group.name));
        }
        let own_user = platform::current_user().map_err(|_| OperatorError::NoUid)?;
        Ok(OperatorAccess { own_user })
    }

    /// Whether a peer running as `user` may operate the broker.
    pub fn allows_user(&self, user: &UserId) -> bool {
        *user == self.own_user
    }

    /// The admission decision for `cred`, and how to name the peer in a refusal.
    fn admit(&self, cred: &PeerCred) -> (bool, String) {
        let who = format!(
            "{} pid {}",
            cred.user,
            cred.pid.map_or("?".to_string(), |p| p.to_string())
        );
        (self.allows_user(&cred.user), who)
    }

    fn refusal(&self, cred: &PeerCred) -> String {
        format!(
            "This broker's operator socket refuses {}: only the broker's own user may operate it.",
            cred.user
        )
    }
}

#[cfg(unix)]
impl OperatorAccess {
    fn new(group: Option<OperatorGroup>) -> Result<Self, OperatorError> {
        let own_uid = platform::own_uid().ok_or(OperatorError::NoUid)?;
        Ok(OperatorAccess { own_uid, group })
    }

    fn peer(cred: &PeerCred) -> Option<Peer> {
        let UserId::Uid(uid) = cred.user else {
            return None;
        };
        Some(Peer {
            uid,
            gid: cred.gid?,
            pid: cred.pid,
        })
    }

    /// The admission decision for `cred`, and how to name the peer in a refusal.
    fn admit(&self, cred: &PeerCred) -> (bool, String) {
        let Some(peer) = Self::peer(cred) else {
            return (false, cred.user.to_string());
        };
        let groups = peer.pid.map(supplementary_groups).unwrap_or_default();
        let who = format!(
            "uid {} gid {} pid {}",
            peer.uid,
            peer.gid,
            peer.pid.map_or("?".to_string(), |p| p.to_string()),
        );
        (self.allows(&peer, &groups), who)
    }

    fn refusal(&self, cred: &PeerCred) -> String {
        format!(
            "This broker's operator socket refuses {}: only the broker's own user, \
             root{} may operate it.",
            cred.user,
            self.group
                .as_ref()
                .map_or(String::new(), |g| format!(" or members of {}", g.name))
        )
    }
}

#[cfg(unix)]
impl OperatorAccess {
    /// Whether `peer` may operate the broker; `groups` are its supplementary groups.
    pub fn allows(&self, peer: &Peer, groups: &[u32]) -> bool {
        if peer.uid == self.own_uid || peer.uid == 0 {
            return true;
        }
        match &self.group {
            Some(g) => peer.gid == g.gid || groups.contains(&g.gid),
            None => false,
        }
    }
}

/// The operator socket's server: the console it drives, who may drive it, and how many
/// were refused.
pub struct OperatorServer {
    pub console: Arc<Console>,
    pub access: OperatorAccess,
    /// Where `export_activity` writes, for every operator.
    pub export_dir: PathBuf,
}

impl OperatorServer {
    pub fn new(console: Arc<Console>, group: Option<OperatorGroup>) -> Result<Self, OperatorError> {
        let access = OperatorAccess::new(group)?;
        let export_dir = console.paths.data_dir.join("exports");
        Ok(OperatorServer {
            console,
            access,
            export_dir,
        })
    }

    fn refusals(&self) -> &AtomicU64 {
        &self.console.operator_refusals
    }
}

/// Binds the operator socket: the same path checks as the agent socket (a safe
/// directory, only a stale socket of our own replaced), then mode 0660 and the operator
/// group, or 0600 without one. (On Windows, a pipe for this user; no group.)
pub async fn bind_operator(
    path: &Path,
    group: Option<&OperatorGroup>,
) -> Result<Listener, OperatorError> {
    let listener = bind_with_mode(path, 0o600).await?;
    give_to_group(path, group)?;
    Ok(listener)
}

#[cfg(unix)]
fn give_to_group(path: &Path, group: Option<&OperatorGroup>) -> Result<(), OperatorError> {
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    if let Some(group) = group {
        std::os::unix::fs::chown(path, None, Some(group.gid)).map_err(|source| {
            OperatorError::Chown {
                path: path.display().to_string(),
                group: group.name.clone(),
                source,
            }
        })?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(
            |source| OperatorError::Chown {
                path: path.display().to_string(),
                group: group.name.clone(),
                source,
            },
        )?;
    }
    Ok(())
}

#[cfg(windows)]
fn give_to_group(_path: &Path, group: Option<&OperatorGroup>) -> Result<(), OperatorError> {
    match group {
        Some(group) => Err(OperatorError::GroupsUnsupported(group.name.clone())),
        None => Ok(()),
    }
}

/// Accepts operator connections until `stop` completes.
pub async fn serve_operator(
    server: Arc<OperatorServer>,
    mut listener: Listener,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok(stream) = accepted {
                    tokio::spawn(serve_operator_connection(server.clone(), stream));
                }
            }
            () = &mut stop => break,
        }
    }
}

fn line_of(response: &Response) -> Vec<u8> {
    let mut line = serde_json::to_vec(response).unwrap_or_else(|_| {
        br#"{"id":null,"error":{"code":"INTERNAL","message":"the answer could not be encoded","field":null}}"#
            .to_vec()
    });
    line.push(b'\n');
    line
}

fn failure(id: Value, error: CommandError) -> Response {
    Response {
        id,
        ok: None,
        error: Some(error),
    }
}

/// Serves one operator connection: checks the peer, then answers request lines in order.
pub async fn serve_operator_connection(server: Arc<OperatorServer>, stream: Accepted) {
    let Ok(cred) = platform::peer_of(&stream) else {
        return;
    };
    let (admitted, who) = server.access.admit(&cred);
    let (read, mut write) = platform::split(stream);
    if !admitted {
        let n = server.refusals().fetch_add(1, Ordering::Relaxed) + 1;
        eprintln!(
            "postern: operator socket: refused {who} ({}); {n} refused so far",
            operator_group_note(&server.access),
        );
        let refused = failure(
            Value::Null,
            CommandError::new(ErrorCode::OperatorRefused, server.access.refusal(&cred)),
        );
        let _ = write.write_all(&line_of(&refused)).await;
        let _ = write.shutdown().await;
        return;
    }
    let caller = Caller {
        operator: match platform::user_name(&cred.user) {
            Some(name) => format!("operator:{name}"),
            None => match &cred.user {
                UserId::Uid(uid) => format!("operator:uid{uid}"),
                UserId::Sid(sid) => format!("operator:{sid}"),
            },
        },
        export_dir: server.export_dir.clone(),
    };
    let mut lines = LineReader::new(BufReader::new(read), MAX_REQUEST);
    while let Ok(Some(line)) = lines.next().await {
        let response = match line {
            Line::TooLong => failure(
                Value::Null,
                CommandError::field(
                    ErrorCode::InvalidInput,
                    "request",
                    format!("The request line is longer than {MAX_REQUEST} bytes; it was dropped."),
                ),
            ),
            Line::Complete(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => continue,
            Line::Complete(bytes) => {
                // A set_credential line carries a secret: wiped once it is handled.
                let bytes = Zeroizing::new(bytes);
                answer(&server.console, &caller, &bytes).await
            }
        };
        if write.write_all(&line_of(&response)).await.is_err() {
            return;
        }
    }
}

/// Why a refused peer is not an operator, for the log.
#[cfg(unix)]
fn operator_group_note(access: &OperatorAccess) -> String {
    access
        .group
        .as_ref()
        .map_or("no operator group is set".to_string(), |g| {
            format!("not in the operator group {}", g.name)
        })
}

/// Why a refused peer is not an operator, for the log.
#[cfg(windows)]
fn operator_group_note(_access: &OperatorAccess) -> String {
    "not the broker's own user".to_string()
}

async fn answer(console: &Arc<Console>, caller: &Caller, bytes: &[u8]) -> Response {
    if nesting_exceeds(bytes, MAX_DEPTH) {
        return failure(
            Value::Null,
            CommandError::field(
                ErrorCode::InvalidInput,
                "request",
                format!("The request nests deeper than {MAX_DEPTH} levels."),
            ),
        );
    }
    let request: Request = match serde_json::from_slice(bytes) {
        Ok(r) => r,
        Err(e) => {
            // The id, if the line has one, so the client can match the error.
            let id = serde_json::from_slice::<Value>(bytes)
                .ok()
                .and_then(|v| v.get("id").cloned())
                .unwrap_or(Value::Null);
            let what = if e.is_data() {
                "a request is {\"id\": …, \"command\": \"…\", \"args\": {…}}"
            } else {
                "the line is not JSON"
            };
            return failure(
                id,
                CommandError::field(
                    ErrorCode::InvalidInput,
                    "request",
                    format!("Malformed request: {what}."),
                ),
            );
        }
    };
    match dispatch_as(console, caller, &request.command, request.args).await {
        Ok(value) => Response {
            id: request.id,
            ok: Some(value),
            error: None,
        },
        Err(e) => failure(request.id, e),
    }
}

/// A client of the operator socket: what `postern operator` and an attached desktop
/// console use. Each call opens its own connection, so calls may run concurrently.
#[derive(Debug, Clone)]
pub struct OperatorClient {
    pub socket: PathBuf,
}

impl OperatorClient {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        OperatorClient {
            socket: socket.into(),
        }
    }

    fn unreachable(&self, what: String) -> CommandError {
        CommandError::new(
            ErrorCode::OperatorUnreachable,
            format!("Operator socket {}: {what}", self.socket.display()),
        )
    }

    /// Sends one typed command and waits for its answer.
    pub async fn run(
        &self,
        command: &crate::protocol::OperatorCommand,
    ) -> Result<Value, CommandError> {
        self.call(command.name(), command.args_value()).await
    }

    /// Sends the command named `command` with `args` as they are (the wire form; tests
    /// use it to send what no typed command would) and waits for its answer.
    pub async fn call(&self, command: &str, args: Value) -> Result<Value, CommandError> {
        let stream = platform::connect(&self.socket).await.map_err(|e| {
            // On Windows a refusal names the pipe's user itself (platform::connect).
            let hint = if cfg!(unix) && e.kind() == std::io::ErrorKind::PermissionDenied {
                " (is this user in the broker's operator group? a new group membership \
                 needs a new login)"
            } else {
                ""
            };
            self.unreachable(format!("{e}{hint}"))
        })?;
        let (read, mut write) = tokio::io::split(stream);
        let mut line = serde_json::to_vec(&Request {
            id: Value::from(1),
            command: command.to_string(),
            args,
        })
        .map_err(|e| CommandError::new(ErrorCode::Internal, e.to_string()))?;
        line.push(b'\n');
        // The line may carry a set_credential secret: wiped when this call returns.
        let line = Zeroizing::new(line);
        // A refused peer may find the connection closed before the request is written;
        // the refusal line is still there to read.
        let _ = write.write_all(&line).await;
        let mut reader = BufReader::new(read);
        let mut answer = String::new();
        reader
            .read_line(&mut answer)
            .await
            .map_err(|e| self.unreachable(e.to_string()))?;
        if answer.is_empty() {
            return Err(self.unreachable("the broker closed the connection".into()));
        }
        let response: Response = serde_json::from_str(&answer)
            .map_err(|e| self.unreachable(format!("an unreadable answer ({e})")))?;
        match (response.ok, response.error) {
            (_, Some(error)) => Err(error),
            (Some(ok), None) => Ok(ok),
            (None, None) => Ok(Value::Null),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    #[cfg(unix)]
    fn the_broker_user_root_and_the_operator_group_are_allowed_and_no_one_else() {
        let access = OperatorAccess {
            own_uid: 990,
            group: Some(OperatorGroup {
                name: "postern-operators".into(),
                gid: 980,
            }),
        };
        let peer = |uid, gid| Peer {
            uid,
            gid,
            pid: None,
        };
        assert!(access.allows(&peer(990, 990), &[]));
        assert!(access.allows(&peer(0, 0), &[]));
        assert!(access.allows(&peer(1000, 980), &[]));
        assert!(access.allows(&peer(1000, 1000), &[27, 980]));
        assert!(!access.allows(&peer(1000, 1000), &[27]));
        let no_group = OperatorAccess {
            own_uid: 990,
            group: None,
        };
        assert!(!no_group.allows(&peer(1000, 980), &[980]));
    }

    #[test]
    #[cfg(windows)]
    fn only_the_brokers_own_user_may_operate_it_on_windows() {
        let access = OperatorAccess::new(None).unwrap();
        assert!(access.allows_user(&platform::current_user().unwrap()));
        // The anonymous logon SID: never this user.
        assert!(!access.allows_user(&UserId::Sid("S-1-5-7".into())));
        let group = OperatorGroup {
            name: "postern-operators".into(),
            gid: 980,
        };
        assert!(matches!(
            OperatorAccess::new(Some(group)),
            Err(OperatorError::GroupsUnsupported(_))
        ));
        assert!(matches!(
            lookup_group("postern-operators"),
            Err(OperatorError::GroupsUnsupported(_))
        ));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn groups_are_found_by_name_or_number() {
        assert_eq!(lookup_group("root").unwrap().gid, 0);
        assert_eq!(lookup_group("4242").unwrap().gid, 4242);
        assert!(matches!(
            lookup_group("postern-no-such-group-x"),
            Err(OperatorError::UnknownGroup(_))
        ));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn this_process_supplementary_groups_are_read() {
        // Whatever they are, reading them must not fail for a live process.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
        let expected: Vec<u32> = line["Groups:".len()..]
            .split_whitespace()
            .map(|g| g.parse().unwrap())
            .collect();
        assert_eq!(supplementary_groups(std::process::id()), expected);
    }
}

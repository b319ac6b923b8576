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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use zeroize::Zeroizing;

use postern_mcp::bridge::{Line, LineReader, MAX_DEPTH, nesting_exceeds};
use postern_mcp::daemon::{DaemonError, bind_with_mode};
use postern_mcp::peer::own_uid;

use crate::console::Console;
use crate::dispatch::{Caller, dispatch_as};
use crate::dto::{CommandError, ErrorCode};

/// The longest request line accepted (an SSH private key in `set_credential` fits many
/// times over).
pub const MAX_REQUEST: usize = 1024 * 1024;

/// The operator socket's default path: beside the agent socket.
pub fn default_operator_socket(agent_socket: &Path) -> PathBuf {
    agent_socket
        .parent()
        .unwrap_or(Path::new("."))
        .join("operator.sock")
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
}

/// Finds `name` in /etc/group (a plain number is taken as the gid itself).
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

/// The user name of `uid` from /etc/passwd, if it has one.
fn user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id: u32 = fields.nth(1)?.parse().ok()?;
        (id == uid).then(|| name.to_string())
    })
}

/// The supplementary groups of process `pid` (/proc/PID/status `Groups:`).
fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("Groups:").map(|rest| {
                    rest.split_whitespace()
                        .filter_map(|g| g.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

/// The kernel's word on who connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<u32>,
}

/// Who may operate this broker.
#[derive(Debug, Clone)]
pub struct OperatorAccess {
    pub own_uid: u32,
    pub group: Option<OperatorGroup>,
}

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
        let own_uid = own_uid().ok_or(OperatorError::NoUid)?;
        let export_dir = console.paths.data_dir.join("exports");
        Ok(OperatorServer {
            console,
            access: OperatorAccess { own_uid, group },
            export_dir,
        })
    }

    fn refusals(&self) -> &AtomicU64 {
        &self.console.operator_refusals
    }
}

/// Binds the operator socket: the same path checks as the agent socket (a safe
/// directory, only a stale socket of our own replaced), then mode 0660 and the operator
/// group, or 0600 without one.
pub async fn bind_operator(
    path: &Path,
    group: Option<&OperatorGroup>,
) -> Result<UnixListener, OperatorError> {
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    let listener = bind_with_mode(path, 0o600).await?;
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
    Ok(listener)
}

/// Accepts operator connections until `stop` completes.
pub async fn serve_operator(
    server: Arc<OperatorServer>,
    listener: UnixListener,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
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
pub async fn serve_operator_connection(server: Arc<OperatorServer>, stream: UnixStream) {
    let Ok(cred) = stream.peer_cred() else { return };
    let peer = Peer {
        uid: cred.uid(),
        gid: cred.gid(),
        pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
    };
    let groups = peer.pid.map(supplementary_groups).unwrap_or_default();
    let (read, mut write) = stream.into_split();
    if !server.access.allows(&peer, &groups) {
        let n = server.refusals().fetch_add(1, Ordering::Relaxed) + 1;
        let group = server
            .access
            .group
            .as_ref()
            .map_or("no operator group is set".to_string(), |g| {
                format!("not in the operator group {}", g.name)
            });
        eprintln!(
            "postern: operator socket: refused uid {} gid {} pid {} ({group}); {n} refused so far",
            peer.uid,
            peer.gid,
            peer.pid.map_or("?".to_string(), |p| p.to_string()),
        );
        let refused = failure(
            Value::Null,
            CommandError::new(
                ErrorCode::OperatorRefused,
                format!(
                    "This broker's operator socket refuses uid {}: only the broker's own user, \
                     root{} may operate it.",
                    peer.uid,
                    server
                        .access
                        .group
                        .as_ref()
                        .map_or(String::new(), |g| format!(" or members of {}", g.name))
                ),
            ),
        );
        let _ = write.write_all(&line_of(&refused)).await;
        let _ = write.shutdown().await;
        return;
    }
    let caller = Caller {
        operator: match user_name(peer.uid) {
            Some(name) => format!("operator:{name}"),
            None => format!("operator:uid{}", peer.uid),
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

    /// Sends one command and waits for its answer.
    pub async fn call(&self, command: &str, args: Value) -> Result<Value, CommandError> {
        let stream = UnixStream::connect(&self.socket).await.map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                " (is this user in the broker's operator group? a new group membership \
                 needs a new login)"
            } else {
                ""
            };
            self.unreachable(format!("{e}{hint}"))
        })?;
        let (read, mut write) = stream.into_split();
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
    fn groups_are_found_by_name_or_number() {
        assert_eq!(lookup_group("root").unwrap().gid, 0);
        assert_eq!(lookup_group("4242").unwrap().gid, 4242);
        assert!(matches!(
            lookup_group("postern-no-such-group-x"),
            Err(OperatorError::UnknownGroup(_))
        ));
    }

    #[test]
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

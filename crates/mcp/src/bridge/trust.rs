//! Who answers: before the bridge sends a byte, the server it reached must be the broker
//! (see the module docs of [`crate::bridge`]), and an agent that gets no broker is told
//! why, by cause.

use std::path::Path;

/// Checks that the server on `stream`, reached at `socket`, is the broker (see the module
/// docs): the path's components are trusted and the server runs as the socket's owner.
/// The error says why not, as a sentence about the path.
#[cfg(unix)]
pub fn verify_broker(socket: &Path, stream: &tokio::net::UnixStream) -> Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    use crate::daemon::socket_path::{Trust, WalkError, own_gid, walk_trusted};

    let me = crate::caller::own_uid().ok_or("this process's own uid is unknown")?;
    let peer = stream
        .peer_cred()
        .map_err(|e| format!("the server's credentials cannot be read ({e})"))?
        .uid();
    // The owner the path leads to now; the walk then checks every step to it, and that
    // it still leads to a socket of that owner.
    let owner = std::fs::metadata(socket)
        .map_err(|e| format!("{} cannot be examined ({e})", socket.display()))?
        .uid();
    let trust = Trust {
        me,
        gid: own_gid(),
        also: Some(owner),
    };
    let walked = walk_trusted(socket, &trust).map_err(|e| match e {
        WalkError::Untrusted(u) => format!("{} {}", u.component.display(), u.reason),
        WalkError::Io { path, source } => {
            format!("{} cannot be examined ({source})", path.display())
        }
    })?;
    let at = walked.resolved.display();
    if walked.missing {
        return Err(format!("the socket {at} went away while it was checked"));
    }
    if !walked.meta.file_type().is_socket() {
        return Err(format!("{at} is not a socket"));
    }
    if walked.meta.uid() != owner {
        return Err(format!("the socket {at} changed while it was checked"));
    }
    if peer != owner {
        return Err(format!(
            "the server listening there runs as uid {peer}, but the socket file {at} is \
             owned by uid {owner}: another user's listener answers on it"
        ));
    }
    Ok(())
}

/// What an agent is told when the server at `socket` is not trusted to be the broker.
pub fn untrusted_message(socket: &Path, why: &str) -> String {
    format!(
        "Refusing the server at the Postern broker socket {}: {why}. It may not be the \
         broker, so nothing was sent. Use a socket path whose directories and links only \
         root, this user or the broker's user can change (the broker refuses others too).",
        socket.display()
    )
}
/// What an agent is told when the socket cannot be reached, by cause: nothing listening
/// (no socket file, or nobody accepting) is "not running"; a refusal by file permissions
/// (EACCES/EPERM on the socket or a directory above it) is "permission denied", which
/// means the broker runs as another user or with other permissions.
pub fn unreachable_message(socket: &Path, error: &std::io::Error) -> String {
    let socket = socket.display();
    match error.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "No Postern broker is running at {socket}; nothing was sent. Start it and retry."
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "Permission denied connecting to the Postern broker socket {socket}: this user may \
             not reach it (the broker runs as another user, or the socket or its directory \
             has other permissions); nothing was sent. Run the agent as the broker's user, \
             or start a broker for this user."
        ),
        _ => {
            format!("Cannot reach the Postern broker socket {socket} ({error}); nothing was sent.")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(unix)]
    fn permission_denied_is_not_reported_as_no_broker_running() {
        let socket = Path::new("/srv/postern/run/postern.sock");
        let denied = unreachable_message(socket, &std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(denied.contains("Permission denied") && denied.contains("another user"));
        assert!(denied.contains("/srv/postern/run/postern.sock"));
        let eperm = unreachable_message(socket, &std::io::Error::from_raw_os_error(libc::EPERM));
        assert!(eperm.contains("Permission denied"));
        for errno in [libc::ENOENT, libc::ECONNREFUSED] {
            let absent = unreachable_message(socket, &std::io::Error::from_raw_os_error(errno));
            assert!(
                absent.starts_with("No Postern broker is running"),
                "{absent}"
            );
        }
    }

    #[test]
    #[cfg(windows)]
    fn a_refused_pipe_is_not_reported_as_no_broker_running() {
        let pipe = Path::new(r"\\.\pipe\postern-0123456789abcdef");
        // ERROR_ACCESS_DENIED: another user's pipe.
        let denied = unreachable_message(pipe, &std::io::Error::from_raw_os_error(5));
        assert!(denied.contains("Permission denied") && denied.contains("another user"));
        // ERROR_FILE_NOT_FOUND: nobody serves the name.
        let absent = unreachable_message(pipe, &std::io::Error::from_raw_os_error(2));
        assert!(
            absent.starts_with("No Postern broker is running"),
            "{absent}"
        );
    }

    // Regression: issue 26 (item 3): the bridge sent a user's calls to whatever listened
    // at the socket path, also through another user's symlink.
    #[tokio::test]
    #[cfg(unix)]
    async fn a_server_is_trusted_only_through_trusted_links_and_as_the_sockets_owner() {
        if crate::caller::own_uid() != Some(0) {
            eprintln!("skipped: not root, cannot give a link or a socket to another uid");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let socket = real.join("postern.sock");
        let _listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        verify_broker(&socket, &stream).unwrap();
        // The same listener through another user's symlink is refused, naming the link.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let through = link.join("postern.sock");
        let stream = tokio::net::UnixStream::connect(&through).await.unwrap();
        let why = verify_broker(&through, &stream).unwrap_err();
        assert!(
            why.contains(&format!(
                "{} is a symbolic link owned by uid 65534",
                link.display()
            )),
            "{why}"
        );
        // A socket file of another user's with root's listener behind it: the server is
        // not the file's owner.
        std::os::unix::fs::chown(&socket, Some(65534), Some(65534)).unwrap();
        let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let why = verify_broker(&socket, &stream).unwrap_err();
        assert!(
            why.contains("runs as uid 0") && why.contains("owned by uid 65534"),
            "{why}"
        );
        let message = untrusted_message(&socket, &why);
        assert!(message.contains("nothing was sent"), "{message}");
    }
}

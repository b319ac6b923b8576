//! Where `postern daemon` puts its socket and what it does to the paths it is given:
//! it replaces only its own stale socket, never follows a symlink, never changes the
//! mode of a directory it did not create, and says plainly when the data dir is not
//! writable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::ffi::OsStr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{config, daemon_refusal, start_daemon_at, start_daemon_in};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Arguments for a daemon over a fresh data dir in `dir`, with `socket`.
fn args(dir: &Path, socket: &Path) -> Vec<std::ffi::OsString> {
    let data = dir.join("data");
    let config_path = dir.join("postern.toml");
    std::fs::write(&config_path, config("http://127.0.0.1:9")).unwrap();
    vec![
        "--data-dir".into(),
        data.into(),
        "--config".into(),
        config_path.into(),
        "--socket".into(),
        socket.into(),
        "--keychain-service".into(),
        "postern-test-never-created".into(),
    ]
}

fn refuse(args: &[std::ffi::OsString]) -> String {
    let args: Vec<&OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (status, stderr) = daemon_refusal(&args);
    assert!(!status.success(), "the daemon refuses: {stderr}");
    stderr
}

// Regression: issue 10
#[test]
fn a_regular_file_at_the_socket_path_is_left_untouched_and_the_daemon_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("notes.txt");
    std::fs::write(&socket, "precious").unwrap();
    let stderr = refuse(&args(dir.path(), &socket));
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "precious");
    assert!(stderr.contains(&socket.display().to_string()), "{stderr}");
    assert!(stderr.contains("regular file"), "{stderr}");
    assert!(
        !dir.path().join("data").exists(),
        "nothing is created before the socket path is known to be usable"
    );
}

// Regression: issue 10
#[test]
fn a_symlink_at_the_socket_path_is_neither_followed_nor_removed() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.txt");
    std::fs::write(&target, "precious").unwrap();
    let socket = dir.path().join("postern.sock");
    std::os::unix::fs::symlink(&target, &socket).unwrap();
    let stderr = refuse(&args(dir.path(), &socket));
    assert!(
        std::fs::symlink_metadata(&socket)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
    assert!(stderr.contains("symbolic link"), "{stderr}");

    // A dangling one too: the daemon must not create the socket where it points.
    let dangling = dir.path().join("dangling.sock");
    let elsewhere = dir.path().join("elsewhere.sock");
    std::os::unix::fs::symlink(&elsewhere, &dangling).unwrap();
    let stderr = refuse(&args(dir.path(), &dangling));
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert!(!elsewhere.exists());
}

// Regression: issue 10
#[test]
fn a_directory_at_the_socket_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("postern.sock");
    std::fs::create_dir(&socket).unwrap();
    std::fs::write(socket.join("keep"), "x").unwrap();
    let stderr = refuse(&args(dir.path(), &socket));
    assert!(stderr.contains("directory"), "{stderr}");
    assert!(socket.join("keep").exists());
}

// Regression: issue 10
#[test]
fn a_socket_in_an_existing_shared_directory_leaves_the_directory_mode_unchanged() {
    for shared_mode in [0o755, 0o1777] {
        let outer = tempfile::tempdir().unwrap();
        let shared = outer.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(shared_mode)).unwrap();
        let socket = shared.join("postern.sock");
        let daemon = start_daemon_at("http://127.0.0.1:9", Some(&socket));
        assert_eq!(
            mode(&shared),
            shared_mode,
            "the directory's mode is unchanged"
        );
        let socket_meta = std::fs::symlink_metadata(&socket).unwrap();
        assert!(socket_meta.file_type().is_socket());
        assert_eq!(socket_meta.permissions().mode() & 0o777, 0o600);
        drop(daemon);
    }
}

// Regression: issue 10
#[test]
fn missing_socket_directories_are_created_private() {
    let outer = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = outer.path().join("a").join("b").join("postern.sock");
    let _daemon = start_daemon_at("http://127.0.0.1:9", Some(&socket));
    assert_eq!(mode(outer.path()), 0o755);
    assert_eq!(mode(&outer.path().join("a")), 0o700);
    assert_eq!(mode(&outer.path().join("a").join("b")), 0o700);
}

// Regression: issue 10
#[test]
fn a_stale_socket_of_our_own_is_replaced() {
    let outer = tempfile::tempdir().unwrap();
    let socket = outer.path().join("postern.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists(), "a stale socket file is left behind");
    let _daemon = start_daemon_at("http://127.0.0.1:9", Some(&socket));
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
}

// Regression: issue 10
#[test]
fn the_data_dir_mode_is_left_as_the_operator_set_it() {
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let socket = elsewhere.path().join("postern.sock");
    let data_path = data.path().to_path_buf();
    let _daemon = start_daemon_in(data, &config("http://127.0.0.1:9"), Some(&socket));
    assert_eq!(mode(&data_path), 0o750, "the data dir's mode is unchanged");
    assert!(
        !data_path.join("run").exists(),
        "with --socket elsewhere the data dir gets no socket directory"
    );
}

/// A read-only tmpfs mounted on a fresh directory, unmounted on drop.
struct ReadOnlyMount {
    path: PathBuf,
}

impl ReadOnlyMount {
    fn new(path: PathBuf) -> Result<ReadOnlyMount, String> {
        std::fs::create_dir_all(&path).map_err(|e| e.to_string())?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if output.status.success() {
            Ok(ReadOnlyMount { path })
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_string())
        }
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

// Regression: issue 10
#[test]
fn a_read_only_data_dir_is_refused_with_a_journal_error_not_a_socket_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _mount = match ReadOnlyMount::new(data.clone()) {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("skipped: cannot mount a read-only tmpfs here ({why})");
            return;
        }
    };
    let socket_dir = dir.path().join("sockets");
    let socket = socket_dir.join("postern.sock");
    let stderr = refuse(&args(dir.path(), &socket));
    assert!(stderr.contains(&data.display().to_string()), "{stderr}");
    assert!(stderr.contains("journal"), "{stderr}");
    assert!(stderr.contains("write"), "{stderr}");
    assert!(
        !stderr.contains("socket"),
        "the error is about the data dir: {stderr}"
    );
    assert!(!socket_dir.exists(), "nothing half-created");
}

// Regression: issue 10
#[test]
fn an_unwritable_data_dir_is_refused_when_permissions_apply() {
    if std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:\t0\t"))
    {
        eprintln!("skipped: root ignores mode 0500 (the read-only mount test covers root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o500)).unwrap();
    let socket = dir.path().join("sockets").join("postern.sock");
    let stderr = refuse(&args(dir.path(), &socket));
    assert!(stderr.contains("journal"), "{stderr}");
    assert_eq!(mode(&data), 0o500, "the data dir's mode is unchanged");
}

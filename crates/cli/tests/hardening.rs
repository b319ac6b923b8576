//! A process of the broker's own user cannot read the broker's memory: the daemon makes
//! itself non-dumpable before it reads a secret, so `/proc/PID/mem`, `environ` and
//! `maps` are closed to a same-user process without CAP_SYS_PTRACE, while the same
//! process reads an ordinary process of that user (the control).
//!
//! Both run as a uid of their own through `setpriv`, so the test needs root (CI runs as
//! root). Without root it says so and passes, unless POSTERN_REQUIRE_PRIVSEP_TESTS=1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::{PermissionsExt, chown};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const POSTERN: &str = env!("CARGO_BIN_EXE_postern");
/// A uid no account uses, so nothing else of its runs here.
const UID: u32 = 64_917;

fn as_root() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:\t0\t"));
    if !root {
        assert!(
            std::env::var("POSTERN_REQUIRE_PRIVSEP_TESTS").as_deref() != Ok("1"),
            "the hardening test needs root to run the broker as a uid of its own, and did NOT run"
        );
        eprintln!("*** the hardening test SKIPPED: not root ***");
    }
    root
}

/// `program args…` as [`UID`], with HOME and the state dir in `home`.
fn as_user(home: &Path, program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args([
            &format!("--reuid={UID}"),
            &format!("--regid={UID}"),
            "--clear-groups",
            "--",
            program,
        ])
        .env("HOME", home)
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env_remove("DBUS_SESSION_BUS_ADDRESS");
    command
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_process_of_the_brokers_own_user_cannot_read_its_memory_or_environment() {
    if !as_root() {
        return;
    }
    let root = tempfile::Builder::new()
        .prefix("postern-hardening-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let home = root.path().join("home");
    std::fs::create_dir_all(home.join("state")).unwrap();
    let postern = root.path().join("postern");
    std::fs::copy(POSTERN, &postern).unwrap();
    let key = home.join("vault.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    for path in [root.path(), &home, &home.join("state"), &key, &postern] {
        chown(path, Some(UID), Some(UID)).unwrap();
    }
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = home.join("data/postern");
    let daemon = Killed(
        as_user(&home, postern.to_str().unwrap())
            .args(["daemon", "--keychain", "file", "--vault-key-file"])
            .arg(&key)
            .arg("--data-dir")
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let socket = data.join("run/postern.sock");
    let started = Instant::now();
    while !socket.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // setpriv execs the daemon in place: the child's pid is the broker's.
    let broker = daemon.0.id();
    let control = Killed(as_user(&home, "sleep").arg("30").spawn().unwrap());
    let read = |pid: u32, file: &str| {
        as_user(&home, "cat")
            .arg(format!("/proc/{pid}/{file}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    };
    for file in ["environ", "maps"] {
        let ordinary = read(control.0.id(), file);
        assert!(
            ordinary.status.success(),
            "the control: a same-user process reads another's {file}: {}",
            String::from_utf8_lossy(&ordinary.stderr)
        );
        let out = read(broker, file);
        assert!(!out.status.success(), "read the broker's {file}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Memory, through a reader that seeks (cat cannot open it at all).
    let mem = as_user(&home, "dd")
        .args([
            &format!("if=/proc/{broker}/mem"),
            "bs=1",
            "count=1",
            "skip=4096",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!mem.status.success(), "read the broker's memory");
    let status = std::fs::read_to_string(format!("/proc/{broker}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with(&format!("Uid:\t{UID}\t"))),
        "{status}"
    );
    drop(control);
    drop(daemon);
}

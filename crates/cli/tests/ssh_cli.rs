#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Drives the real `postern` binary for SSH keys: `config pin-host-key` and, when a
//! Secret Service is reachable (`DBUS_SESSION_BUS_ADDRESS` set), `vault set --kind
//! ssh_key`. Keys come from `ssh-keygen`; tests skip when it is not installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use postern_broker::config::Config;

fn postern<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_postern"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn all_output(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn have_ssh_keygen() -> bool {
    Command::new("ssh-keygen").arg("-?").output().is_ok()
}

/// Generates a key; returns (private key path, `<algo> <base64>`, `SHA256:...`).
fn keygen(dir: &Path, name: &str, algo: &str, passphrase: &str) -> (PathBuf, String, String) {
    let path = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            algo,
            "-C",
            "test@postern",
            "-N",
            passphrase,
            "-f",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pub_path = PathBuf::from(format!("{}.pub", path.display()));
    let public = std::fs::read_to_string(&pub_path).unwrap();
    let public = public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let fp = Command::new("ssh-keygen")
        .args(["-l", "-E", "sha256", "-f"])
        .arg(&pub_path)
        .output()
        .unwrap();
    let fp = String::from_utf8(fp.stdout)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_owned();
    (path, public, fp)
}

const TARGETS: &str = r#"# Targets for the tests.
[[http]]
name = "payments"
base_url = "https://api.example.test/v1"
methods = ["GET"]
credential = "payments-key"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "per_call"

# The web server.
[[ssh]]
name = "web1"
host = "127.0.0.1"
port = 2222
user = "deploy"
credential = "web1-key"
approval = "session"

[[ssh]]
name = "db1"
host = "db1.example.test"
user = "deploy"
credential = "db1-key"
approval = "session"
"#;

fn version_of(file: &Path, target: &str) -> (String, Option<String>) {
    let config = Config::load(file).unwrap();
    let t = config.ssh_target(target).unwrap();
    (t.version().to_string(), t.host_key.clone())
}

#[test]
fn pin_host_key_from_a_known_hosts_line_then_refuse_a_different_key() {
    if !have_ssh_keygen() {
        eprintln!("ssh-keygen not installed; skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, host_pub, host_fp) = keygen(dir.path(), "host", "ed25519", "");
    let (_, other_pub, other_fp) = keygen(dir.path(), "other", "ecdsa", "");
    let file = dir.path().join("targets.toml");
    std::fs::write(&file, TARGETS).unwrap();
    let (v0, pinned0) = version_of(&file, "web1");
    assert_eq!(pinned0, None);

    // A line for another host is refused and changes nothing.
    let wrong = format!("[127.0.0.1]:22 {host_pub}");
    let out = postern(&[
        "config".as_ref(),
        "pin-host-key".as_ref(),
        file.as_os_str(),
        "web1".as_ref(),
        "--known-hosts-line".as_ref(),
        wrong.as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), TARGETS);

    let line = format!("[127.0.0.1]:2222,[localhost]:2222 {host_pub} root@web1");
    let out = postern(&[
        "config".as_ref(),
        "pin-host-key".as_ref(),
        file.as_os_str(),
        "web1".as_ref(),
        "--known-hosts-line".as_ref(),
        line.as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains(&host_fp), "{text}");
    let (v1, pinned1) = version_of(&file, "web1");
    assert_eq!(pinned1.as_deref(), Some(host_pub.as_str()));
    assert_ne!(v1, v0);
    assert!(text.contains(&v0) && text.contains(&v1), "{text}");
    // Comments and the other targets are kept; only web1 changed.
    let edited = std::fs::read_to_string(&file).unwrap();
    assert!(edited.contains("# The web server."), "{edited}");
    assert_eq!(version_of(&file, "db1").1, None);
    // No temp file left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 5);

    // A different key is refused without --replace; the file is untouched.
    let other_line = format!("[127.0.0.1]:2222 {other_pub}");
    let out = postern(&[
        "config".as_ref(),
        "pin-host-key".as_ref(),
        file.as_os_str(),
        "web1".as_ref(),
        "--known-hosts-line".as_ref(),
        other_line.as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert!(
        all_output(&out).contains("--replace"),
        "{}",
        all_output(&out)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), edited);

    // Pinning the same key again is a no-op.
    let out = postern(&[
        "config".as_ref(),
        "pin-host-key".as_ref(),
        file.as_os_str(),
        "web1".as_ref(),
        "--key".as_ref(),
        host_pub.as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), edited);

    // With --replace, from --key.
    let out = postern(&[
        "config".as_ref(),
        "pin-host-key".as_ref(),
        file.as_os_str(),
        "web1".as_ref(),
        "--key".as_ref(),
        other_pub.as_ref(),
        "--replace".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(all_output(&out).contains(&other_fp));
    let (v2, pinned2) = version_of(&file, "web1");
    assert_eq!(pinned2.as_deref(), Some(other_pub.as_str()));
    assert_ne!(v2, v1);
    let out = postern(&["config".as_ref(), "check".as_ref(), file.as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
}

#[test]
fn pin_host_key_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("targets.toml");
    std::fs::write(&file, TARGETS).unwrap();
    let f = file.to_str().unwrap();
    // Neither or both sources: usage error.
    let out = postern(&["config", "pin-host-key", f, "web1"]);
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
    let out = postern(&[
        "config",
        "pin-host-key",
        f,
        "web1",
        "--key",
        "a b",
        "--known-hosts-line",
        "c d e",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
    // Unknown target and a bad key: refused.
    let out = postern(&[
        "config",
        "pin-host-key",
        f,
        "nope",
        "--key",
        "ssh-ed25519 AAAA",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    let out = postern(&[
        "config",
        "pin-host-key",
        f,
        "web1",
        "--key",
        "ssh-ed25519 AAAA",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), TARGETS);
    let out = postern(&["config", "pin-host-key", "--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Example"));
}

fn has_secret_service() -> bool {
    std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some_and(|v| !v.is_empty())
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{:x}",
        u64::from(std::process::id()) * 1_000_000_007 + u64::from(nanos)
    )
}

#[test]
fn vault_set_ssh_key_shows_the_fingerprint_never_the_key() {
    if !has_secret_service() || !have_ssh_keygen() {
        eprintln!("no Secret Service or ssh-keygen; skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (key, public, fp) = keygen(dir.path(), "id", "ed25519", "");
    let (enc, _, _) = keygen(dir.path(), "enc", "ed25519", "pw");
    let private = std::fs::read_to_string(&key).unwrap();
    let body = private.lines().nth(1).unwrap().to_owned();
    let data = dir.path().join("data");
    let service = unique("postern-test");
    let common = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        v.extend([
            "--data-dir".into(),
            data.to_str().unwrap().into(),
            "--keychain-service".into(),
            service.clone(),
        ]);
        v
    };

    let out = postern(&common(&[
        "vault",
        "set",
        "web1-key",
        "--kind",
        "ssh_key",
        "--from-file",
        key.to_str().unwrap(),
    ]));
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains(&fp), "{text}");
    assert!(text.contains(&public), "{text}");
    assert!(
        !text.contains(&body) && !text.contains("PRIVATE KEY"),
        "{text}"
    );

    // An encrypted key without a terminal: refused clearly, nothing stored.
    let out = postern(&common(&[
        "vault",
        "set",
        "enc-key",
        "--kind",
        "ssh_key",
        "--from-file",
        enc.to_str().unwrap(),
    ]));
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("encrypted"), "{text}");

    // Not a key at all: refused.
    let junk = dir.path().join("junk");
    std::fs::write(&junk, "not a key").unwrap();
    let out = postern(&common(&[
        "vault",
        "set",
        "junk-key",
        "--kind",
        "ssh_key",
        "--from-file",
        junk.to_str().unwrap(),
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));

    let out = postern(&common(&["vault", "list"]));
    let listed = all_output(&out);
    assert!(listed.contains("web1-key"), "{listed}");
    assert!(
        !listed.contains("enc-key") && !listed.contains("junk-key"),
        "{listed}"
    );

    let out = postern(&common(&["vault", "rm", "web1-key"]));
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
}

//! `ssh_keys`: private key import, `known_hosts` lines and fingerprints, against
//! keys made by `ssh-keygen` (skipped, with a note, when `ssh-keygen` is not installed).

use std::path::{Path, PathBuf};
use std::process::Command;

use postern_broker::ssh_keys::{
    HostKeyError, KeyImportError, fingerprint_of_public, host_key_from_known_hosts_line,
    import_private_key, normalize_public_key,
};

struct Generated {
    private: String,
    /// `<algo> <base64> <comment>` as ssh-keygen wrote it.
    public_line: String,
    /// `SHA256:...` as `ssh-keygen -l` prints it.
    fingerprint: String,
}

fn have_ssh_keygen() -> bool {
    Command::new("ssh-keygen").arg("-?").output().is_ok()
}

fn keygen(dir: &Path, name: &str, args: &[&str], passphrase: &str) -> Generated {
    let path: PathBuf = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(args)
        .args(["-q", "-C", "test@postern", "-N", passphrase, "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pub_path = path.with_extension("pub");
    let pub_path = if pub_path.exists() {
        pub_path
    } else {
        PathBuf::from(format!("{}.pub", path.display()))
    };
    let fp = Command::new("ssh-keygen")
        .args(["-l", "-E", "sha256", "-f"])
        .arg(&pub_path)
        .output()
        .unwrap();
    assert!(fp.status.success());
    let fingerprint = String::from_utf8(fp.stdout)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_owned();
    Generated {
        private: std::fs::read_to_string(&path).unwrap(),
        public_line: std::fs::read_to_string(&pub_path)
            .unwrap()
            .trim()
            .to_owned(),
        fingerprint,
    }
}

fn algo_b64(line: &str) -> String {
    line.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

macro_rules! need_ssh_keygen {
    () => {
        if !have_ssh_keygen() {
            eprintln!("ssh-keygen not installed; skipping");
            return;
        }
    };
}

#[test]
fn imports_unencrypted_ed25519_ecdsa_and_rsa() {
    need_ssh_keygen!();
    let dir = tempfile::tempdir().unwrap();
    for (name, args, algo) in [
        ("ed", &["-t", "ed25519"][..], "ssh-ed25519"),
        (
            "ec",
            &["-t", "ecdsa", "-b", "256"][..],
            "ecdsa-sha2-nistp256",
        ),
        (
            "ec384",
            &["-t", "ecdsa", "-b", "384"][..],
            "ecdsa-sha2-nistp384",
        ),
        ("rsa", &["-t", "rsa", "-b", "2048"][..], "ssh-rsa"),
    ] {
        let g = keygen(dir.path(), name, args, "");
        let k = import_private_key(&g.private, None).unwrap();
        assert_eq!(k.algorithm, algo, "{name}");
        assert_eq!(k.public, algo_b64(&g.public_line), "{name}");
        assert_eq!(k.fingerprint, g.fingerprint, "{name}");
        let pem = std::str::from_utf8(k.private_openssh.expose()).unwrap();
        assert!(
            pem.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"),
            "{name}"
        );
        // What the SSH channel does with the stored credential.
        let back = russh::keys::decode_secret_key(pem, None).unwrap();
        assert_eq!(
            back.public_key()
                .fingerprint(russh::keys::HashAlg::Sha256)
                .to_string(),
            g.fingerprint
        );
        // The debug form never shows the key.
        assert!(!format!("{k:?}").contains("PRIVATE KEY"));
    }
}

#[test]
fn imports_a_pem_rsa_key() {
    need_ssh_keygen!();
    let dir = tempfile::tempdir().unwrap();
    let g = keygen(
        dir.path(),
        "pem",
        &["-t", "rsa", "-b", "2048", "-m", "PEM"],
        "",
    );
    assert!(g.private.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    let k = import_private_key(&g.private, None).unwrap();
    assert_eq!(k.fingerprint, g.fingerprint);
    assert!(
        std::str::from_utf8(k.private_openssh.expose())
            .unwrap()
            .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
    );
}

#[test]
fn an_encrypted_key_is_decrypted_once_and_stored_unencrypted() {
    need_ssh_keygen!();
    let dir = tempfile::tempdir().unwrap();
    let g = keygen(dir.path(), "enc", &["-t", "ed25519"], "pw");
    assert_eq!(
        import_private_key(&g.private, None).unwrap_err(),
        KeyImportError::PassphraseRequired
    );
    assert_eq!(
        import_private_key(&g.private, Some("nope")).unwrap_err(),
        KeyImportError::WrongPassphrase
    );
    let k = import_private_key(&g.private, Some("pw")).unwrap();
    assert_eq!(k.fingerprint, g.fingerprint);
    let pem = std::str::from_utf8(k.private_openssh.expose()).unwrap();
    // Readable without any passphrase: the passphrase is not needed (or kept) later.
    let back = russh::keys::decode_secret_key(pem, None).unwrap();
    assert!(!back.is_encrypted());
    assert_ne!(pem.trim(), g.private.trim());
}

#[test]
fn errors_are_typed_and_carry_no_key_bytes() {
    need_ssh_keygen!();
    let dir = tempfile::tempdir().unwrap();
    let g = keygen(dir.path(), "ed", &["-t", "ed25519"], "");
    // Corrupt the body: still a PEM block, no longer a key.
    let body_line = g.private.lines().nth(1).unwrap().to_owned();
    let corrupt = g.private.replace(&body_line, &"A".repeat(body_line.len()));
    for bad in [corrupt.as_str(), "", "hello", g.public_line.as_str()] {
        let e = import_private_key(bad, None).unwrap_err();
        assert!(matches!(e, KeyImportError::Invalid { .. }), "{e:?}");
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains(&body_line), "{shown}");
        assert!(!shown.contains("AAAA"), "{shown}");
    }
}

#[test]
fn known_hosts_lines_plain_port_and_hashed() {
    need_ssh_keygen!();
    let dir = tempfile::tempdir().unwrap();
    let g = keygen(dir.path(), "host", &["-t", "ed25519"], "");
    let key = algo_b64(&g.public_line);

    let plain = format!("web1.example.com,10.0.0.5 {key} a comment");
    assert_eq!(
        host_key_from_known_hosts_line(&plain, "web1.example.com", 22).unwrap(),
        key
    );
    assert_eq!(
        host_key_from_known_hosts_line(&plain, "10.0.0.5", 22).unwrap(),
        key
    );
    // Port 22 entries do not cover another port.
    assert!(matches!(
        host_key_from_known_hosts_line(&plain, "web1.example.com", 2222),
        Err(HostKeyError::HostNotMatched { .. })
    ));
    assert!(matches!(
        host_key_from_known_hosts_line(&plain, "other.example.com", 22),
        Err(HostKeyError::HostNotMatched { .. })
    ));

    let bracket = format!("[127.0.0.1]:2222 {key}");
    assert_eq!(
        host_key_from_known_hosts_line(&bracket, "127.0.0.1", 2222).unwrap(),
        key
    );
    assert!(host_key_from_known_hosts_line(&bracket, "127.0.0.1", 22).is_err());

    let v6 = format!("[::1]:2200 {key}");
    assert_eq!(
        host_key_from_known_hosts_line(&v6, "::1", 2200).unwrap(),
        key
    );

    let wildcard = format!("*.example.com,!bad.example.com {key}");
    assert!(host_key_from_known_hosts_line(&wildcard, "web2.example.com", 22).is_ok());
    assert!(host_key_from_known_hosts_line(&wildcard, "bad.example.com", 22).is_err());

    // Hashed entries, hashed by ssh-keygen -H itself.
    let kh = dir.path().join("known_hosts");
    std::fs::write(&kh, format!("{plain}\n{bracket}\n")).unwrap();
    let out = Command::new("ssh-keygen")
        .args(["-H", "-f"])
        .arg(&kh)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hashed = std::fs::read_to_string(&kh).unwrap();
    let lines: Vec<&str> = hashed.lines().filter(|l| l.starts_with("|1|")).collect();
    assert_eq!(lines.len(), 3, "{hashed}");
    let matches = |host: &str, port: u16| {
        lines
            .iter()
            .filter(|l| host_key_from_known_hosts_line(l, host, port).as_deref() == Ok(&key))
            .count()
    };
    assert_eq!(matches("web1.example.com", 22), 1);
    assert_eq!(matches("10.0.0.5", 22), 1);
    assert_eq!(matches("127.0.0.1", 2222), 1);
    assert_eq!(matches("127.0.0.1", 22), 0);
    assert_eq!(matches("web9.example.com", 22), 0);
}

#[test]
fn known_hosts_lines_that_are_refused() {
    need_ssh_keygen!();
    let dir = tempfile::tempdir().unwrap();
    let g = keygen(dir.path(), "host", &["-t", "ed25519"], "");
    let key = algo_b64(&g.public_line);
    let b64 = key.split_whitespace().nth(1).unwrap();
    assert!(matches!(
        host_key_from_known_hosts_line(
            &format!("@cert-authority *.example.com {key}"),
            "a.example.com",
            22
        ),
        Err(HostKeyError::UnsupportedMarker { .. })
    ));
    assert!(matches!(
        host_key_from_known_hosts_line("# a comment", "h", 22),
        Err(HostKeyError::Malformed { .. })
    ));
    assert!(matches!(
        host_key_from_known_hosts_line("h ssh-ed25519", "h", 22),
        Err(HostKeyError::Malformed { .. })
    ));
    // The blob is an ed25519 key; calling it RSA is refused.
    assert!(matches!(
        host_key_from_known_hosts_line(&format!("h ssh-rsa {b64}"), "h", 22),
        Err(HostKeyError::InvalidKey { .. })
    ));
    assert!(matches!(
        host_key_from_known_hosts_line(&format!("|1|bad|salt {key}"), "h", 22),
        Err(HostKeyError::Malformed { .. })
    ));
}

#[test]
fn fingerprints_match_ssh_keygen() {
    need_ssh_keygen!();
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("ed", &["-t", "ed25519"][..]),
        ("ec", &["-t", "ecdsa"][..]),
        ("rsa", &["-t", "rsa", "-b", "2048"][..]),
    ] {
        let g = keygen(dir.path(), name, args, "");
        assert_eq!(
            fingerprint_of_public(&g.public_line).unwrap(),
            g.fingerprint
        );
        assert_eq!(
            fingerprint_of_public(&algo_b64(&g.public_line)).unwrap(),
            g.fingerprint
        );
        assert_eq!(
            normalize_public_key(&g.public_line).unwrap(),
            algo_b64(&g.public_line)
        );
    }
    assert!(fingerprint_of_public("ssh-ed25519").is_err());
    assert!(fingerprint_of_public("ssh-ed25519 !!!").is_err());
    assert!(fingerprint_of_public("ssh-dss AAAAB3NzaC1kc3M=").is_err());
}

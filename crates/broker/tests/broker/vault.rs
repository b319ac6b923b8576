//! Vault tests against real keychains.
//!
//! Secret Service tests need an unlocked Secret Service on the session bus, e.g.:
//!
//! ```sh
//! dbus-run-session -- sh -c 'export HOME=$(mktemp -d) XDG_DATA_HOME=$HOME/.local/share; \
//!   echo -n pw | gnome-keyring-daemon --unlock --components=secrets >/dev/null; cargo test'
//! ```
//!
//! Set `POSTERN_TEST_SKIP_SECRET_SERVICE=1` to skip them where no Secret Service exists.
//! Keyutils tests run only with `POSTERN_TEST_KEYUTILS=1`, inside a private session
//! keyring: `POSTERN_TEST_KEYUTILS=1 keyctl session - cargo test`.
//!
//! Every test uses its own random keychain service name and its own database, and
//! removes the entries it created, so a developer's real credentials are never touched.

// Always true in a test binary; it marks the shared helpers below as test code so the
// workspace's unwrap/expect/panic lints treat them like the `#[test]` functions.
#![cfg(test)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use postern_broker::contract::*;
use postern_broker::vault::*;
use rusqlite::Connection;
use tempfile::TempDir;

const CANARY: &str = "pst-canary-7f3a9c1e2b4d6f80-do-not-leak";
const CANARY_2: &str = "pst-canary-rotated-51c2e8a7d9b3f046";

fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn test_service() -> String {
    format!("postern-test-{}", random_hex())
}

fn id(text: &str) -> CredentialId {
    CredentialId::new(text).unwrap()
}

fn secret(text: &str) -> Secret {
    Secret::from(text.to_owned())
}

fn secret_service_enabled() -> bool {
    if std::env::var_os("POSTERN_TEST_SKIP_SECRET_SERVICE").is_some_and(|v| v == "1") {
        eprintln!("skipped: POSTERN_TEST_SKIP_SECRET_SERVICE=1");
        return false;
    }
    true
}

fn keyutils_enabled() -> bool {
    if std::env::var_os("POSTERN_TEST_KEYUTILS").is_some_and(|v| v == "1") {
        return true;
    }
    eprintln!("skipped: set POSTERN_TEST_KEYUTILS=1 and run inside `keyctl session -`");
    false
}

/// A vault over a fresh keychain service name and a fresh database file.
struct Fixture {
    dir: TempDir,
    conn: Connection,
    vault: Arc<Vault>,
}

impl Fixture {
    fn new(backend: KeychainBackend) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("journal.db")).unwrap();
        conn.execute_batch(SCHEMA_SQL).unwrap();
        let vault = Arc::new(Vault::over(
            Keychain::new(backend, test_service()).unwrap(),
            Connection::open(dir.path().join("journal.db")).unwrap(),
        ));
        Self { dir, conn, vault }
    }

    fn secret_service() -> Self {
        Self::new(KeychainBackend::SecretService)
    }

    fn keychain(&self) -> &Keychain {
        self.vault.keychain()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        cleanup(&self.vault);
    }
}

fn cleanup(vault: &Vault) {
    if let Ok(all) = vault.list() {
        for meta in all {
            let _ = vault.remove(&meta.id);
        }
    }
}

fn read_dir_bytes(dir: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        bytes.extend(std::fs::read(file).unwrap());
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn assert_no_canary(text: &str) {
    assert!(!text.contains(CANARY), "canary leaked into: {text}");
    assert!(!text.contains(CANARY_2), "canary leaked into: {text}");
}

fn assert_error_is_clean(err: &VaultError) {
    assert_no_canary(&err.to_string());
    assert_no_canary(&format!("{err:?}"));
    assert_no_canary(&format!("{err:#?}"));
}

#[test]
fn set_then_read_round_trips_the_secret() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("github-token");

    let meta = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1_000)
        .unwrap();
    assert_eq!(meta.id, cred);
    assert_eq!(meta.kind, CredentialKind::Token);
    assert_eq!(meta.version.generation(), 1);
    assert_eq!((meta.created_at_ms, meta.rotated_at_ms), (1_000, 1_000));
    assert_eq!(meta.last_used_at_ms, None);

    let (read_meta, read) = f.vault.read_for_injection(&cred, 2_000).unwrap();
    assert_eq!(read.expose(), CANARY.as_bytes());
    assert_eq!(read_meta.version, meta.version);
    assert_eq!(read_meta.last_used_at_ms, Some(2_000));

    let listed = f.vault.list().unwrap();
    assert_eq!(listed, vec![read_meta]);

    // The keychain entry is addressable directly by id and version.
    let direct = f.keychain().get(&cred, &meta.version).unwrap();
    assert_eq!(direct.expose(), CANARY.as_bytes());
}

#[test]
fn binary_secrets_round_trip() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("deploy_key.ed25519");
    let bytes: Vec<u8> = (0..=255u8).rev().chain([0, 0, 0xff]).collect();

    f.vault
        .set(
            &cred,
            CredentialKind::SshKey,
            &Secret::new(bytes.clone()),
            1,
        )
        .unwrap();
    let (_, read) = f.vault.read_for_injection(&cred, 2).unwrap();
    assert_eq!(read.expose(), bytes.as_slice());
}

#[test]
fn rotation_writes_a_new_version_and_deletes_the_old_entry() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("api.token");

    let first = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1_000)
        .unwrap();
    let second = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY_2), 5_000)
        .unwrap();

    assert_ne!(second.version, first.version);
    assert_eq!(second.version.generation(), 2);
    assert_eq!(second.created_at_ms, 1_000);
    assert_eq!(second.rotated_at_ms, 5_000);

    let old = f.keychain().get(&cred, &first.version).unwrap_err();
    assert_eq!(old.code(), Code::CredentialMissing);

    let (meta, read) = f.vault.read_for_injection(&cred, 6_000).unwrap();
    assert_eq!(meta.version, second.version);
    assert_eq!(read.expose(), CANARY_2.as_bytes());
}

/// The injection read (the Secret Service's one round trip, awaited, with the entry's
/// object path remembered) follows the entry: the new secret after a rotation,
/// CREDENTIAL_MISSING once the entry was deleted behind the broker's back (the path it
/// remembered is stale), and the new entry's secret once the same version is stored
/// again (under a new object path).
#[tokio::test]
async fn the_injection_read_follows_rotation_and_an_entry_deleted_behind_its_back() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("async-read");
    let read = async || f.vault.clone().read_secret_async(cred.to_string()).await;

    let first = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap();
    for _ in 0..2 {
        let (meta, bytes) = read().await.unwrap();
        assert_eq!(meta.version, first.version);
        assert_eq!(bytes.expose(), CANARY.as_bytes());
    }

    let second = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY_2), 2)
        .unwrap();
    let (meta, bytes) = read().await.unwrap();
    assert_eq!(meta.version, second.version);
    assert_eq!(bytes.expose(), CANARY_2.as_bytes());

    f.keychain().delete(&cred, &second.version).unwrap();
    let err = read().await.unwrap_err();
    assert_eq!(err.code(), Code::CredentialMissing);
    assert_error_is_clean(&err);

    f.keychain()
        .put(&cred, &second.version, &secret(CANARY))
        .unwrap();
    let (meta, bytes) = read().await.unwrap();
    assert_eq!(meta.version, second.version);
    assert_eq!(bytes.expose(), CANARY.as_bytes());
}

#[test]
fn unknown_credential_is_credential_missing() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let err = f.vault.read_for_injection(id("nope"), 1).unwrap_err();
    assert!(matches!(&err, VaultError::Missing { credential } if credential == "nope"));
    assert_eq!(err.code(), Code::CredentialMissing);
    let spec = err.code().spec();
    assert_eq!(spec.phase, Some(Phase::CredentialInjection));
    assert_eq!(spec.outcome, Some(Outcome::NotAttempted));
    assert!(err.to_string().contains("postern vault set nope"), "{err}");
}

#[test]
fn metadata_without_a_keychain_entry_is_credential_missing() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("vanished");
    let meta = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap();
    // Someone deleted the entry with a keyring tool behind the broker's back.
    f.keychain().delete(&cred, &meta.version).unwrap();

    let err = f.vault.read_for_injection(&cred, 2).unwrap_err();
    assert_eq!(err.code(), Code::CredentialMissing);
    assert_error_is_clean(&err);
    // Use is recorded only when a secret was actually handed out.
    let stored = f.vault.list().unwrap();
    assert_eq!(stored[0].last_used_at_ms, None);

    // Removing still works and clears the metadata.
    f.vault.remove(&cred).unwrap();
    assert!(f.vault.list().unwrap().is_empty());
}

#[test]
fn remove_deletes_metadata_and_keychain_entry() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("to-remove");
    let keep = id("to-keep");
    let meta = f
        .vault
        .set(&cred, CredentialKind::SigningKey, &secret(CANARY), 1)
        .unwrap();
    f.vault
        .set(&keep, CredentialKind::Token, &secret(CANARY_2), 1)
        .unwrap();

    f.vault.remove(&cred).unwrap();

    let ids: Vec<_> = f.vault.list().unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![keep.clone()]);
    let gone = f.keychain().get(&cred, &meta.version).unwrap_err();
    assert_eq!(gone.code(), Code::CredentialMissing);
    let again = f.vault.remove(&cred).unwrap_err();
    assert_eq!(again.code(), Code::CredentialMissing);
    let (_, kept) = f.vault.read_for_injection(&keep, 2).unwrap();
    assert_eq!(kept.expose(), CANARY_2.as_bytes());
}

#[test]
fn invalid_ids_are_rejected_without_echoing_them() {
    for bad in [
        "",
        "has space",
        "user@host",
        "a/b",
        "ünïcode",
        &"x".repeat(129),
        CANARY_2,
    ] {
        let bad = if bad == CANARY_2 {
            format!("{CANARY} {CANARY_2}")
        } else {
            bad.to_owned()
        };
        let err = CredentialId::new(bad.as_str()).unwrap_err();
        assert!(matches!(err, VaultError::InvalidId { .. }), "{bad:?}");
        assert_eq!(err.code(), Code::InvalidRequest);
        assert_error_is_clean(&err);
        assert!(bad.is_empty() || !err.to_string().contains(&bad), "{err}");
    }
    assert!(CredentialId::new("x".repeat(128)).is_ok());
    assert!(CredentialId::new("A-z_0.9").is_ok());
    let from_json: Result<CredentialId, _> = serde_json::from_str("\"a b\"");
    assert!(from_json.is_err());
    assert!(matches!(
        Keychain::new(KeychainBackend::SecretService, "bad service"),
        Err(VaultError::InvalidId { .. })
    ));
}

#[test]
fn secret_debug_is_redacted() {
    let s = secret(CANARY);
    assert_eq!(format!("{s:?}"), "<redacted>");
    assert_eq!(format!("{s:#?}"), "<redacted>");
    assert_eq!(format!("{:?}", Secret::new(vec![1, 2, 3])), "<redacted>");
    assert_no_canary(&format!("{:?}", (id("x"), &s)));
}

#[test]
fn empty_secret_is_rejected_before_touching_anything() {
    // No keychain access happens, so this runs without a Secret Service too.
    let f = Fixture::secret_service();
    let err = f
        .vault
        .set(
            id("empty"),
            CredentialKind::Token,
            &Secret::new(Vec::new()),
            1,
        )
        .unwrap_err();
    assert!(matches!(err, VaultError::InvalidSecret { .. }));
    assert_eq!(err.code(), Code::InvalidRequest);
    assert!(f.vault.list().unwrap().is_empty());
}

#[test]
fn changing_the_kind_requires_a_remove() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("typed");
    let meta = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap();
    let err = f
        .vault
        .set(&cred, CredentialKind::SshKey, &secret(CANARY_2), 2)
        .unwrap_err();
    assert!(matches!(err, VaultError::KindMismatch { .. }));
    assert_error_is_clean(&err);
    let (after, read) = f.vault.read_for_injection(&cred, 3).unwrap();
    assert_eq!(after.version, meta.version);
    assert_eq!(read.expose(), CANARY.as_bytes());
}

#[test]
fn last_used_never_moves_backwards() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("clock");
    f.vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap();
    f.vault.read_for_injection(&cred, 100).unwrap();
    let (meta, _) = f.vault.read_for_injection(&cred, 50).unwrap();
    assert_eq!(meta.last_used_at_ms, Some(100));
    assert_eq!(f.vault.list().unwrap()[0].last_used_at_ms, Some(100));
}

#[test]
fn canary_never_reaches_the_database_or_metadata() {
    if !secret_service_enabled() {
        return;
    }
    let f = Fixture::secret_service();
    let cred = id("canary");
    let created = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap();
    let rotated = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY_2), 2)
        .unwrap();
    let (read_meta, read) = f.vault.read_for_injection(&cred, 3).unwrap();
    assert_eq!(read.expose(), CANARY_2.as_bytes());

    for meta in [&created, &rotated, &read_meta] {
        assert_no_canary(&serde_json::to_string(meta).unwrap());
        assert_no_canary(&format!("{meta:?}"));
    }
    assert_no_canary(&format!("{:?}", f.vault));

    // Checkpoint so everything SQLite knows is in the files we inspect.
    f.conn
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    let db = read_dir_bytes(f.dir.path());
    assert!(
        contains(&db, "canary"),
        "the id should be stored: sanity check of the scan"
    );
    assert!(!contains(&db, CANARY) && !contains(&db, CANARY_2));

    // Deleted rows linger in free pages; they must not hold the secret either.
    cleanup(&f.vault);
    let after_cleanup = read_dir_bytes(f.dir.path());
    assert!(!contains(&after_cleanup, CANARY) && !contains(&after_cleanup, CANARY_2));
}

#[test]
fn keychains_with_different_service_names_coexist() {
    if !secret_service_enabled() {
        return;
    }
    let a = Fixture::secret_service();
    let b = Fixture::secret_service();
    let cred = id("shared-name");
    a.vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap();
    b.vault
        .set(&cred, CredentialKind::Token, &secret(CANARY_2), 1)
        .unwrap();
    assert_eq!(
        a.vault.read_for_injection(&cred, 2).unwrap().1.expose(),
        CANARY.as_bytes()
    );
    assert_eq!(
        b.vault.read_for_injection(&cred, 2).unwrap().1.expose(),
        CANARY_2.as_bytes()
    );

    a.vault.remove(&cred).unwrap();
    assert_eq!(
        b.vault.read_for_injection(&cred, 3).unwrap().1.expose(),
        CANARY_2.as_bytes()
    );
}

const CHILD_ENV: &str = "POSTERN_TEST_VAULT_CHILD";

/// Runs `no_secret_service_child` in a child process whose session bus address points at
/// a socket that does not exist. A child is needed because the bus address is read from
/// the environment, which a multithreaded test process must not modify.
#[test]
fn no_secret_service_is_vault_locked() {
    let dir = tempfile::tempdir().unwrap();
    let bus = dir.path().join("no-such-bus");
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "vault::no_secret_service_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "no_secret_service")
        .env(
            "DBUS_SESSION_BUS_ADDRESS",
            format!("unix:path={}", bus.display()),
        )
        .env("POSTERN_TEST_CHILD_DIR", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "child did not run the check:\n{stdout}"
    );
    assert_no_canary(&stdout);
    assert_no_canary(&stderr);
}

#[test]
fn no_secret_service_child() {
    if std::env::var(CHILD_ENV).as_deref() != Ok("no_secret_service") {
        return;
    }
    let dir = PathBuf::from(std::env::var_os("POSTERN_TEST_CHILD_DIR").unwrap());
    let conn = Connection::open(dir.join("journal.db")).unwrap();
    conn.execute_batch(SCHEMA_SQL).unwrap();
    let vault = Vault::over(
        Keychain::new(KeychainBackend::SecretService, test_service()).unwrap(),
        Connection::open(dir.join("journal.db")).unwrap(),
    );
    let cred = id("unreachable");

    let err = vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap_err();
    assert!(matches!(
        err,
        VaultError::Locked {
            backend: KeychainBackend::SecretService,
            ..
        }
    ));
    assert_eq!(err.code(), Code::VaultLocked);
    assert_eq!(err.code().spec().phase, Some(Phase::CredentialInjection));
    assert_eq!(err.code().spec().outcome, Some(Outcome::NotAttempted));
    assert!(err.to_string().contains("unlock the keychain"), "{err}");
    assert_error_is_clean(&err);
    // A failed set leaves no metadata behind.
    assert!(vault.list().unwrap().is_empty());

    // Metadata present, keychain unreachable: reading is locked, not missing.
    let version = VersionTag::generate(None).unwrap();
    conn.execute(
        "INSERT INTO credentials VALUES (?1, 'token', ?2, 1, 1, NULL)",
        [cred.as_str(), version.as_str()],
    )
    .unwrap();
    let err = vault.read_for_injection(&cred, 2).unwrap_err();
    assert_eq!(err.code(), Code::VaultLocked);
    let err = vault.remove(&cred).unwrap_err();
    assert_eq!(err.code(), Code::VaultLocked);
    assert_eq!(vault.list().unwrap().len(), 1, "metadata kept for a retry");
}

#[test]
fn keyutils_round_trip_rotation_and_remove() {
    if !keyutils_enabled() {
        return;
    }
    let f = Fixture::new(KeychainBackend::Keyutils);
    let cred = id("kernel-held");

    let first = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap();
    let (_, read) = f.vault.read_for_injection(&cred, 2).unwrap();
    assert_eq!(read.expose(), CANARY.as_bytes());

    let second = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY_2), 3)
        .unwrap();
    assert_ne!(first.version, second.version);
    assert_eq!(
        f.keychain().get(&cred, &first.version).unwrap_err().code(),
        Code::CredentialMissing
    );
    let (_, read) = f.vault.read_for_injection(&cred, 4).unwrap();
    assert_eq!(read.expose(), CANARY_2.as_bytes());

    f.vault.remove(&cred).unwrap();
    assert_eq!(
        f.keychain().get(&cred, &second.version).unwrap_err().code(),
        Code::CredentialMissing
    );
    let err = f.vault.read_for_injection(&cred, 5).unwrap_err();
    assert_eq!(err.code(), Code::CredentialMissing);
}

fn native_keychain_enabled() -> bool {
    if cfg!(target_os = "linux") {
        eprintln!("skipped: the macOS keychain and the Windows Credential Manager are not here");
        return false;
    }
    if std::env::var_os("POSTERN_TEST_NATIVE_KEYCHAIN").is_some_and(|v| v == "1") {
        return true;
    }
    eprintln!("skipped: set POSTERN_TEST_NATIVE_KEYCHAIN=1 to let it use this keychain");
    false
}

/// The macOS login keychain or the Windows Credential Manager, whichever this is.
#[test]
fn the_platform_keychain_round_trips_rotates_and_removes() {
    if !native_keychain_enabled() {
        return;
    }
    let f = Fixture::new(KeychainBackend::platform_default());
    let cred = id("native-held");

    let first = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
        .unwrap();
    let (_, read) = f.vault.read_for_injection(&cred, 2).unwrap();
    assert_eq!(read.expose(), CANARY.as_bytes());

    let second = f
        .vault
        .set(&cred, CredentialKind::Token, &secret(CANARY_2), 3)
        .unwrap();
    assert_ne!(first.version, second.version);
    assert_eq!(
        f.keychain().get(&cred, &first.version).unwrap_err().code(),
        Code::CredentialMissing
    );
    let (_, read) = f.vault.read_for_injection(&cred, 4).unwrap();
    assert_eq!(read.expose(), CANARY_2.as_bytes());

    f.vault.remove(&cred).unwrap();
    assert_eq!(
        f.keychain().get(&cred, &second.version).unwrap_err().code(),
        Code::CredentialMissing
    );
    let err = f.vault.read_for_injection(&cred, 5).unwrap_err();
    assert_eq!(err.code(), Code::CredentialMissing);
}

/// A keychain another platform has is a typed, clean VAULT_LOCKED, never a panic.
#[test]
fn another_platforms_keychain_is_locked_and_says_so() {
    let elsewhere: &[KeychainBackend] = if cfg!(target_os = "macos") {
        &[
            KeychainBackend::WindowsCredentialManager,
            KeychainBackend::Keyutils,
        ]
    } else if cfg!(windows) {
        &[KeychainBackend::MacosKeychain, KeychainBackend::Keyutils]
    } else {
        &[
            KeychainBackend::MacosKeychain,
            KeychainBackend::WindowsCredentialManager,
        ]
    };
    for backend in elsewhere {
        let f = Fixture::new(*backend);
        let cred = id("elsewhere");
        let err = f
            .vault
            .set(&cred, CredentialKind::Token, &secret(CANARY), 1)
            .unwrap_err();
        assert!(
            matches!(&err, VaultError::Locked { backend: b, reason } if b == backend && reason.contains("only available on")),
            "{err:?}"
        );
        assert_eq!(err.code(), Code::VaultLocked);
        assert_error_is_clean(&err);
        assert!(f.vault.list().unwrap().is_empty());
    }
}

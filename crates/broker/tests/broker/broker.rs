//! Opening the engine: journal, vault, targets and channels from a data dir and a
//! keychain, with what the operator should be told returned rather than printed.
//!
//! These use the Secret Service (as the daemon does by default) under a random service
//! name; set `POSTERN_TEST_SKIP_SECRET_SERVICE=1` to skip them where none exists.

use std::path::Path;

use postern_broker::audit::AUDIT_KEY_ID;
use postern_broker::config::Caution;
use postern_broker::invocation::Recorder;
use postern_broker::vault::{Keychain, KeychainBackend, Vault};
use postern_broker::{Broker, BrokerOptions, OpenError, OpenWarning, Opened, OperatorApi};

use crate::support::new_invocation;

const UNPINNED: &str = r#"
[[ssh]]
name = "web1"
host = "127.0.0.1"
user = "deploy"
credential = "web1-key"
approval = "session"
"#;

fn secret_service_enabled() -> bool {
    if std::env::var_os("POSTERN_TEST_SKIP_SECRET_SERVICE").is_some_and(|v| v == "1") {
        eprintln!("skipped: POSTERN_TEST_SKIP_SECRET_SERVICE=1");
        return false;
    }
    true
}

fn service() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap();
    format!("postern-test-{}", hex::encode(bytes))
}

fn open(dir: &Path, service: &str) -> Result<Opened, OpenError> {
    Broker::open(BrokerOptions {
        data_dir: dir.to_path_buf(),
        config: dir.join("postern.toml"),
        keychain: KeychainBackend::SecretService,
        service: service.to_string(),
        approver: None,
        anchor: None,
        vault_key: None,
    })
}

/// Removes the audit key this test's broker made.
fn forget_audit_key(broker: &OperatorApi) {
    let _ = broker.vault().remove(AUDIT_KEY_ID);
}

#[test]
fn opening_makes_the_journal_and_returns_an_unpinned_host_key_as_a_warning() {
    if !secret_service_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("postern.toml"), UNPINNED).unwrap();
    let service = service();
    let Opened {
        operator: broker,
        warnings,
    } = open(dir.path(), &service).unwrap();
    assert!(Broker::journal_path(dir.path()).is_file());
    assert_eq!(broker.journal().path(), Broker::journal_path(dir.path()));
    assert!(broker.approver().is_none());
    assert!(broker.config().current().ssh_target("web1").is_some());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let OpenWarning::Config(warning) = &warnings[0] else {
        panic!("{warnings:?}");
    };
    assert_eq!(warning.caution, Caution::HostKeyNotPinned);
    assert_eq!(warnings[0].to_string(), warning.to_string());
    forget_audit_key(&broker);
    broker.journal().clone().close().unwrap();
}

#[test]
fn a_signing_key_that_did_not_sign_the_journal_is_returned_as_a_warning() {
    if !secret_service_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("postern.toml"), "").unwrap();
    let service = service();
    let first = open(dir.path(), &service).unwrap();
    assert!(first.warnings.is_empty(), "{:?}", first.warnings);
    // The journal signs a checkpoint over what it holds when it closes; then the keychain
    // loses the key that signed it.
    Recorder::accept(first.operator.journal(), new_invocation("inv_1", None)).unwrap();
    forget_audit_key(&first.operator);
    first.operator.journal().clone().close().unwrap();
    drop(first);

    let second = open(dir.path(), &service).unwrap();
    assert_eq!(second.warnings, vec![OpenWarning::SigningKeyChanged]);
    assert_eq!(
        second.warnings[0].to_string(),
        "the audit signing key in the keychain is not the key that signed this journal's \
         earlier checkpoints (the keychain lost it); `postern audit verify` will report those \
         checkpoints as not signed by the current key"
    );
    forget_audit_key(&second.operator);
    second.operator.journal().clone().close().unwrap();
}

#[test]
fn a_targets_file_that_does_not_load_is_an_error() {
    if !secret_service_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("postern.toml"), "[[http]]\nname = 3\n").unwrap();
    let service = service();
    let err = open(dir.path(), &service).err().unwrap();
    assert!(matches!(err, OpenError::Config(_)), "{err}");
    assert!(err.to_string().contains("postern.toml"), "{err}");
    // The audit key was made before the targets file was read; remove it.
    let keychain = Keychain::new(KeychainBackend::SecretService, service).unwrap();
    let vault = Vault::open(keychain, &Broker::journal_path(dir.path())).unwrap();
    vault.remove(AUDIT_KEY_ID).unwrap();
}

#[test]
fn the_file_keychain_seals_the_audit_key_and_a_wrong_vault_key_opens_nothing() {
    use postern_broker::sealed_store::{STORE_DIR, VaultKey};
    use postern_broker::vault::VaultError;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("postern.toml"), "").unwrap();
    let open_with = |byte: u8| {
        Broker::open(BrokerOptions {
            data_dir: dir.path().to_path_buf(),
            config: dir.path().join("postern.toml"),
            keychain: KeychainBackend::File,
            service: "postern".to_string(),
            approver: None,
            anchor: None,
            vault_key: Some(VaultKey::from_bytes(&[byte; 32]).unwrap()),
        })
    };
    let opened = open_with(3).unwrap();
    let seed = opened
        .operator
        .vault()
        .read_for_injection(AUDIT_KEY_ID, 0)
        .unwrap()
        .1;
    let key_bytes = seed.expose().to_vec();
    opened.operator.journal().clone().close().unwrap();
    drop(opened);
    let records: Vec<_> = std::fs::read_dir(dir.path().join(STORE_DIR))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(records.len(), 1, "one sealed record: the audit key");
    assert!(!records[0].windows(32).any(|w| w == key_bytes.as_slice()));
    // The same key reopens it; another one is refused with a typed error.
    let again = open_with(3).unwrap();
    again.operator.journal().clone().close().unwrap();
    drop(again);
    match open_with(4) {
        Err(OpenError::AuditKey(e)) => assert!(
            matches!(
                e,
                postern_broker::audit::AuditKeyError::Vault(VaultError::Corrupt { .. })
            ),
            "{e}"
        ),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a wrong vault key opened the broker"),
    }
    // Without a key the file keychain refuses rather than guessing.
    let keyless = Broker::open(BrokerOptions {
        data_dir: dir.path().to_path_buf(),
        config: dir.path().join("postern.toml"),
        keychain: KeychainBackend::File,
        service: "postern".to_string(),
        approver: None,
        anchor: None,
        vault_key: None,
    });
    assert!(keyless.is_err());
}

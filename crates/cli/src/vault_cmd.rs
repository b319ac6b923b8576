//! `postern vault set|list|rm`: credentials in the OS keychain, metadata in the journal
//! database. Secrets come from stdin or a no-echo prompt, never from argv or the
//! environment, and are never printed.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use postern_broker::audit::AUDIT_KEY_ID;
use postern_broker::ssh_keys::{ImportedKey, KeyImportError, import_private_key};
use postern_broker::vault::{CredentialId, CredentialKind, CredentialMeta, Secret, Vault, meta};
use serde_json::json;

use crate::common::{self, Failure, KeychainSpec, print_listing};
use crate::timefmt;

/// Where `vault set` reads the secret from.
pub enum Source {
    /// stdin: piped (read to the end), or a terminal (prompted without echo).
    Stdin,
    File(PathBuf),
}

/// Removes one trailing line ending (`\n` or `\r\n`): what `echo` and editors add.
fn strip_one_newline(bytes: &mut Vec<u8>) {
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
}

pub fn read_secret(id: &str, source: &Source) -> Result<Secret, Failure> {
    let mut bytes = match source {
        Source::File(path) => std::fs::read(path)
            .map_err(|e| Failure::unavailable(format!("cannot read {}: {e}", path.display())))?,
        Source::Stdin if std::io::stdin().is_terminal() => {
            let first = rpassword::prompt_password(format!("Secret for `{id}` (not echoed): "))
                .map_err(|e| Failure::unavailable(format!("cannot read the secret: {e}")))?;
            let first = Secret::from(first);
            let again = rpassword::prompt_password("Again, to confirm: ")
                .map_err(|e| Failure::unavailable(format!("cannot read the secret: {e}")))?;
            let again = Secret::from(again);
            if first.expose() != again.expose() {
                return Err(Failure::failed(
                    "the two entries differ; nothing was stored",
                ));
            }
            return Ok(first);
        }
        Source::Stdin => {
            let mut buf = Vec::with_capacity(8192);
            std::io::stdin()
                .lock()
                .read_to_end(&mut buf)
                .map_err(|e| Failure::unavailable(format!("cannot read stdin: {e}")))?;
            buf
        }
    };
    strip_one_newline(&mut bytes);
    Ok(Secret::new(bytes))
}

/// Creates the data directory (owner-only) if it does not exist yet.
fn ensure_data_dir(dir: &Path) -> Result<(), Failure> {
    if dir.is_dir() {
        return Ok(());
    }
    postern_broker::platform::create_owner_only_dir_all(dir)
        .map_err(|e| Failure::unavailable(format!("cannot create {}: {e}", dir.display())))
}

fn credential_id(id: &str) -> Result<CredentialId, Failure> {
    CredentialId::new(id).map_err(|e| Failure::failed(e.to_string()))
}

pub fn set(
    data_dir: &Path,
    keychain: &KeychainSpec<'_>,
    id: &str,
    kind: CredentialKind,
    source: &Source,
) -> common::Outcome {
    credential_id(id)?;
    if id == AUDIT_KEY_ID {
        return Err(Failure::failed(format!(
            "`{AUDIT_KEY_ID}` is the audit signing key; the broker manages it"
        )));
    }
    if kind == CredentialKind::SshKey
        && matches!(source, Source::Stdin)
        && std::io::stdin().is_terminal()
    {
        return Err(Failure::failed(
            "an SSH private key cannot be typed at a prompt; pass --from-file PATH or pipe the key on stdin",
        ));
    }
    let keychain = common::keychain(keychain, data_dir)?;
    let secret = read_secret(id, source)?;
    if secret.is_empty() {
        return Err(Failure::failed("the secret is empty; nothing was stored"));
    }
    let (secret, shown) = if kind == CredentialKind::SshKey {
        let key = import_ssh_key(&secret, source)?;
        drop(secret);
        let shown = format!(
            "public key: {}\nfingerprint: {} ({})",
            key.public, key.fingerprint, key.algorithm
        );
        (key.private_openssh, Some(shown))
    } else {
        (secret, None)
    };
    ensure_data_dir(data_dir)?;
    let db = common::journal_path(data_dir);
    let vault = Vault::open(keychain, &db)
        .map_err(|e| Failure::unavailable(format!("{}: {e}", db.display())))?;
    let stored = vault
        .set(id, kind, &secret, common::now_ms())
        .map_err(|e| Failure::failed(e.to_string()))?;
    drop(secret);
    let verb = if stored.created_at_ms == stored.rotated_at_ms {
        "stored"
    } else {
        "rotated"
    };
    println!(
        "{verb} credential `{}` ({}), version {}",
        stored.id, stored.kind, stored.version
    );
    if let Some(shown) = shown {
        println!("{shown}");
    }
    Ok(())
}

/// Decodes an SSH private key (decrypting it once, with a passphrase prompted for on
/// the terminal) into the unencrypted OpenSSH form the SSH channel reads.
fn import_ssh_key(secret: &Secret, source: &Source) -> Result<ImportedKey, Failure> {
    let text = std::str::from_utf8(secret.expose())
        .map_err(|_| Failure::failed("the SSH private key is not text; nothing was stored"))?;
    let refused = |e: KeyImportError| Failure::failed(format!("{e}; nothing was stored"));
    match import_private_key(text, None) {
        Ok(key) => Ok(key),
        Err(KeyImportError::PassphraseRequired) => {
            if matches!(source, Source::Stdin) || !std::io::stdin().is_terminal() {
                return Err(Failure::failed(
                    "the SSH private key is encrypted and its passphrase can only be typed at \
                     a terminal: run `postern vault set ID --kind ssh_key --from-file PATH` \
                     interactively; nothing was stored",
                ));
            }
            let pass = rpassword::prompt_password("Passphrase for the key (not echoed): ")
                .map_err(|e| Failure::unavailable(format!("cannot read the passphrase: {e}")))?;
            let pass = Secret::from(pass);
            let pass = std::str::from_utf8(pass.expose())
                .map_err(|_| Failure::failed("the passphrase is not UTF-8"))?;
            import_private_key(text, Some(pass)).map_err(refused)
        }
        Err(e) => Err(refused(e)),
    }
}

fn meta_json(m: &CredentialMeta) -> serde_json::Value {
    json!({
        "id": m.id.as_str(),
        "kind": m.kind.as_str(),
        "version": m.version.as_str(),
        "created_at_ms": m.created_at_ms,
        "created_at": timefmt::format_ms(m.created_at_ms),
        "rotated_at_ms": m.rotated_at_ms,
        "rotated_at": timefmt::format_ms(m.rotated_at_ms),
        "last_used_at_ms": m.last_used_at_ms,
        "last_used_at": m.last_used_at_ms.map(timefmt::format_ms),
    })
}

/// Lists credential metadata (never secrets) from a read-only connection; the keychain
/// is not touched.
pub fn list(data_dir: &Path, json: bool) -> common::Outcome {
    let db = common::journal_path(data_dir);
    if !db.exists() {
        if !json {
            eprintln!("no journal at {}: no credentials stored", db.display());
        }
        return Ok(());
    }
    let (db, conn) = common::open_journal_read_only(data_dir)?;
    let all =
        meta::list(&conn).map_err(|e| Failure::unavailable(format!("{}: {e}", db.display())))?;
    print_listing(
        &all,
        json,
        meta_json,
        "no credentials stored",
        &["ID", "KIND", "VERSION", "CREATED", "ROTATED", "LAST USED"],
        |m| {
            vec![
                m.id.to_string(),
                m.kind.to_string(),
                m.version.to_string(),
                timefmt::format_secs(m.created_at_ms),
                timefmt::format_secs(m.rotated_at_ms),
                m.last_used_at_ms
                    .map_or_else(|| "never".into(), timefmt::format_secs),
            ]
        },
    );
    Ok(())
}

pub fn remove(
    data_dir: &Path,
    keychain: &KeychainSpec<'_>,
    id: &str,
    force: bool,
) -> common::Outcome {
    credential_id(id)?;
    if id == AUDIT_KEY_ID && !force {
        return Err(Failure::failed(format!(
            "`{AUDIT_KEY_ID}` is the audit signing key; without it the audit log can no \
             longer be verified. Pass --force to remove it anyway"
        )));
    }
    let keychain = common::keychain(keychain, data_dir)?;
    let db = common::journal_path(data_dir);
    if !db.is_file() {
        return Err(Failure::failed(format!(
            "credential `{id}` is not stored (no journal at {})",
            db.display()
        )));
    }
    let vault = Vault::open(keychain, &db)
        .map_err(|e| Failure::unavailable(format!("{}: {e}", db.display())))?;
    vault
        .remove(id)
        .map_err(|e| Failure::failed(e.to_string()))?;
    println!("removed credential `{id}`");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::strip_one_newline;

    #[test]
    fn strips_exactly_one_line_ending() {
        for (input, expected) in [
            (&b"tok\n"[..], &b"tok"[..]),
            (b"tok\r\n", b"tok"),
            (b"tok\n\n", b"tok\n"),
            (b"tok", b"tok"),
            (b"", b""),
        ] {
            let mut v = input.to_vec();
            strip_one_newline(&mut v);
            assert_eq!(v, expected);
        }
    }
}

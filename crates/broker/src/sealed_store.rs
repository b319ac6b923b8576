//! The `file` keychain: secrets sealed at rest in the data dir, for a broker that runs as
//! its own system user (no login session, so no Secret Service, and a kernel keyring
//! that would not survive a reboot).
//!
//! One file per credential version in `DATA_DIR/vault/` (0700), each 0600 and written
//! atomically (a temporary file, fsync, rename, fsync of the directory). A record is
//! `MAGIC || nonce (12) || AES-256-GCM(secret)`, with the service, credential id and
//! version as associated data, so a record copied over another one's name fails to
//! open. File names are a keyed-free hash of those three, so the directory listing says
//! nothing about which credentials exist.
//!
//! The 32-byte key comes from outside the data dir: systemd's credential directory
//! (`$CREDENTIALS_DIRECTORY/postern-vault-key`, from `LoadCredentialEncrypted=` or
//! `LoadCredential=`) or a key file only its owner can read ([`load_key`]). It is held
//! in a zeroizing buffer; the cipher state is wiped on drop too.

use std::io::Write;
use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use zeroize::Zeroizing;

use crate::platform;
use crate::secret::Secret;

/// The file name of the key in systemd's credential directory.
pub const CREDENTIAL_NAME: &str = "postern-vault-key";
/// The directory inside the data dir.
pub const STORE_DIR: &str = "vault";
const MAGIC: &[u8; 8] = b"PSTVLT1\0";
const NONCE_LEN: usize = 12;

/// The vault key: 32 bytes, wiped when dropped.
pub struct VaultKey(Zeroizing<[u8; 32]>);

impl std::fmt::Debug for VaultKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VaultKey(<redacted>)")
    }
}

impl VaultKey {
    /// A key from exactly 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let array: [u8; 32] = bytes
            .try_into()
            .map_err(|_| KeyError::Length { len: bytes.len() })?;
        Ok(VaultKey(Zeroizing::new(array)))
    }
}

/// Why the vault key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "no vault key: pass --vault-key-file PATH, or run under systemd with \
         LoadCredentialEncrypted={CREDENTIAL_NAME}:… (or LoadCredential=)"
    )]
    NotGiven,
    #[error("cannot read the vault key {path}: {source}")]
    Unreadable {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the vault key {path} is readable by its group or others (mode {mode:04o}); \
         refusing to use it. chmod 0400 it (owned by the broker's user)"
    )]
    TooOpen { path: String, mode: u32 },
    #[error(
        "the vault key {path} cannot be checked for who may read it on this platform \
         (Windows has no mode bits); the file keychain is for Linux and macOS: use \
         --keychain windows-credential-manager"
    )]
    Unverifiable { path: String },
    #[error("the vault key {path} is not a regular file")]
    NotAFile { path: String },
    #[error(
        "the vault key must be exactly 32 bytes (it is {len}); make one with \
         `head -c 32 /dev/urandom`"
    )]
    Length { len: usize },
}

/// Loads the key: `explicit` (`--vault-key-file`) when given, else
/// `$CREDENTIALS_DIRECTORY/postern-vault-key`. A key file others could read is refused
/// (systemd's credential directory is private to the service, so its files are not
/// checked for mode). Where no mode can be read (Windows) a key file is refused, never
/// used unchecked.
pub fn load_key(explicit: Option<&Path>) -> Result<VaultKey, KeyError> {
    let (path, check_mode) = match explicit {
        Some(path) => (path.to_path_buf(), true),
        None => match std::env::var_os("CREDENTIALS_DIRECTORY").filter(|d| !d.is_empty()) {
            Some(dir) => (PathBuf::from(dir).join(CREDENTIAL_NAME), false),
            None => return Err(KeyError::NotGiven),
        },
    };
    let shown = path.display().to_string();
    let unreadable = |source| KeyError::Unreadable {
        path: shown.clone(),
        source,
    };
    let meta = std::fs::metadata(&path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(KeyError::NotAFile { path: shown });
    }
    if check_mode {
        match platform::mode_of(&meta) {
            Some(mode) if mode & 0o077 != 0 => {
                return Err(KeyError::TooOpen { path: shown, mode });
            }
            Some(_) => {}
            None => return Err(KeyError::Unverifiable { path: shown }),
        }
    }
    let bytes = Zeroizing::new(std::fs::read(&path).map_err(unreadable)?);
    VaultKey::from_bytes(&bytes)
}

/// What went wrong in the sealed store. Never carries secret bytes.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no such entry")]
    Missing,
    #[error("{0}")]
    Io(String),
    #[error("the sealed record does not open with this vault key (wrong key, or altered)")]
    Unsealable,
}

/// Secrets sealed in files under one directory.
pub struct SealedStore {
    dir: PathBuf,
    cipher: Aes256Gcm,
}

impl std::fmt::Debug for SealedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

impl SealedStore {
    /// The store in `data_dir/vault`, created owner-only if missing (0700; on Windows
    /// a DACL for this user and SYSTEM, see [`platform::protect_dir`]).
    pub fn open(data_dir: &Path, key: &VaultKey) -> Result<Self, StoreError> {
        let dir = data_dir.join(STORE_DIR);
        match platform::owner_only_dir(&mut std::fs::DirBuilder::new()).create(&dir) {
            Ok(()) => platform::protect_dir(&dir).map_err(|e| io("cannot protect", &dir, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("cannot create", &dir, e)),
        }
        let cipher = Aes256Gcm::new(&Key::<Aes256Gcm>::from(*key.0));
        Ok(SealedStore { dir, cipher })
    }

    fn label(service: &str, user: &str) -> Vec<u8> {
        let mut aad = b"postern-vault-v1\0".to_vec();
        aad.extend_from_slice(service.as_bytes());
        aad.push(0);
        aad.extend_from_slice(user.as_bytes());
        aad
    }

    fn path(&self, service: &str, user: &str) -> PathBuf {
        let name = blake3::hash(&Self::label(service, user)).to_hex();
        self.dir.join(format!("{name}.sealed"))
    }

    /// Seals `secret` under (`service`, `user`), replacing any record there.
    pub fn put(&self, service: &str, user: &str, secret: &Secret) -> Result<(), StoreError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| StoreError::Io(format!("no randomness: {e}")))?;
        let aad = Self::label(service, user);
        let sealed = self
            .cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: secret.expose(),
                    aad: &aad,
                },
            )
            .map_err(|_| StoreError::Io("sealing failed".into()))?;
        let mut record = Vec::with_capacity(MAGIC.len() + NONCE_LEN + sealed.len());
        record.extend_from_slice(MAGIC);
        record.extend_from_slice(&nonce);
        record.extend_from_slice(&sealed);
        let path = self.path(service, user);
        let tmp = self.dir.join(format!(
            ".{}.tmp-{}",
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("record"),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let written = (|| {
            let mut file = platform::create_mode(
                std::fs::OpenOptions::new().write(true).create_new(true),
                0o600,
            )
            .open(&tmp)?;
            file.write_all(&record)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            platform::sync_dir(&self.dir)
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io("cannot write", &path, e)
        })
    }

    /// Opens the record under (`service`, `user`).
    pub fn get(&self, service: &str, user: &str) -> Result<Secret, StoreError> {
        let path = self.path(service, user);
        let record = match std::fs::read(&path) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::Missing),
            Err(e) => return Err(io("cannot read", &path, e)),
        };
        let body = record
            .strip_prefix(MAGIC.as_slice())
            .filter(|b| b.len() >= NONCE_LEN)
            .ok_or(StoreError::Unsealable)?;
        let (nonce, sealed) = body.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| StoreError::Unsealable)?;
        let aad = Self::label(service, user);
        self.cipher
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map(Secret::new)
            .map_err(|_| StoreError::Unsealable)
    }

    /// Removes the record under (`service`, `user`).
    pub fn delete(&self, service: &str, user: &str) -> Result<(), StoreError> {
        let path = self.path(service, user);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::Missing),
            Err(e) => Err(io("cannot remove", &path, e)),
        }
    }
}

// They check mode bits, which only unix has.
#[cfg(test)]
#[cfg(unix)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn key(byte: u8) -> VaultKey {
        VaultKey::from_bytes(&[byte; 32]).unwrap()
    }

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_and_under_its_own_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = SealedStore::open(dir.path(), &key(7)).unwrap();
        store
            .put(
                "postern",
                "api@v1",
                &Secret::new(b"canary-sealed-1".to_vec()),
            )
            .unwrap();
        assert_eq!(
            store.get("postern", "api@v1").unwrap().expose(),
            b"canary-sealed-1"
        );
        // Nothing on disk holds the plaintext.
        for entry in std::fs::read_dir(dir.path().join(STORE_DIR)).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            assert!(!bytes.windows(15).any(|w| w == b"canary-sealed-1"));
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        assert_eq!(
            std::fs::metadata(dir.path().join(STORE_DIR))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        let other = SealedStore::open(dir.path(), &key(8)).unwrap();
        assert!(matches!(
            other.get("postern", "api@v1"),
            Err(StoreError::Unsealable)
        ));
        // A record moved to another entry's name does not open there.
        let from = store.path("postern", "api@v1");
        let to = store.path("postern", "other@v1");
        std::fs::copy(&from, &to).unwrap();
        assert!(matches!(
            store.get("postern", "other@v1"),
            Err(StoreError::Unsealable)
        ));
        store.delete("postern", "api@v1").unwrap();
        assert!(matches!(
            store.get("postern", "api@v1"),
            Err(StoreError::Missing)
        ));
        assert!(matches!(
            store.delete("postern", "api@v1"),
            Err(StoreError::Missing)
        ));
    }

    #[test]
    fn a_key_file_others_can_read_or_of_the_wrong_length_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vault.key");
        std::fs::write(&path, [1u8; 32]).unwrap();
        for open in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(open)).unwrap();
            assert!(
                matches!(load_key(Some(&path)), Err(KeyError::TooOpen { .. })),
                "{open:o}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(load_key(Some(&path)).is_ok());
        let short = dir.path().join("short.key");
        std::fs::write(&short, [1u8; 31]).unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            load_key(Some(&short)),
            Err(KeyError::Length { len: 31 })
        ));
        assert!(matches!(
            load_key(Some(&dir.path().join("absent"))),
            Err(KeyError::Unreadable { .. })
        ));
    }
}

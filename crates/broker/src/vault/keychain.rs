//! The OS keychain backends (Secret Service, keyutils, the macOS Keychain, the Windows
//! Credential Manager, the sealed `file` store) behind one `Keychain`.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use keyring_core::{CredentialStore, Entry};
use serde::{Deserialize, Serialize};
use zeroize::Zeroize;

use super::error::VaultError;
use super::ids::*;
use crate::sealed_store::{SealedStore, StoreError, VaultKey};
use crate::secret::Secret;

/// Which OS keychain holds the secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeychainBackend {
    /// The freedesktop Secret Service over the D-Bus session bus (GNOME Keyring, KWallet,
    /// KeePassXC). Persistent across reboots.
    SecretService,
    /// The Linux kernel key retention service (session keyring, linked to the persistent
    /// keyring when available). Secrets vanish on reboot.
    Keyutils,
    /// Sealed files in the data dir under a key from outside it
    /// ([`crate::sealed_store`]): for a broker running as its own system user.
    File,
    /// The macOS login keychain (generic passwords, through the Security framework).
    MacosKeychain,
    /// The Windows Credential Manager (generic credentials of this user, persisted on
    /// this machine only: never roamed to a domain profile).
    WindowsCredentialManager,
}

impl KeychainBackend {
    /// The config and display form, e.g. `"secret_service"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeychainBackend::SecretService => "secret_service",
            KeychainBackend::Keyutils => "keyutils",
            KeychainBackend::File => "file",
            KeychainBackend::MacosKeychain => "macos_keychain",
            KeychainBackend::WindowsCredentialManager => "windows_credential_manager",
        }
    }

    /// The OS keychain a person's broker uses on this platform by default: the Secret
    /// Service on Linux, the login keychain on macOS, the Credential Manager on Windows.
    pub fn platform_default() -> KeychainBackend {
        if cfg!(target_os = "macos") {
            KeychainBackend::MacosKeychain
        } else if cfg!(windows) {
            KeychainBackend::WindowsCredentialManager
        } else {
            KeychainBackend::SecretService
        }
    }
}

impl fmt::Display for KeychainBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Secret storage in one OS keychain backend under one service name.
///
/// Each `Keychain` owns its own credential store object rather than using the keyring
/// ecosystem's process-wide default store, so several backends and service names can
/// coexist in one process (tests rely on this).
///
/// The store is opened lazily on first use and reopened after a platform failure, so a
/// broker started before the user logs in, or outliving a keyring daemon restart,
/// recovers without a restart of its own.
pub struct Keychain {
    backend: KeychainBackend,
    service: String,
    store: Mutex<Option<Arc<CredentialStore>>>,
    /// The `file` backend's store (`None` for the OS keychains).
    sealed: Option<SealedStore>,
    /// The Secret Service reads of injections: one connection and session, and where
    /// each entry is (its object path, never its secret), so a read is one round trip.
    #[cfg(all(
        unix,
        not(any(target_os = "macos", target_os = "ios", target_os = "android"))
    ))]
    reads: reads::Reads,
}

impl fmt::Debug for Keychain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keychain")
            .field("backend", &self.backend)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl Keychain {
    /// A keychain in `backend` whose entries live under `service` (normally
    /// [`DEFAULT_SERVICE`]). Does not touch the keychain yet.
    ///
    /// # Errors
    ///
    /// [`VaultError::InvalidId`] if `service` does not follow the credential id rules
    /// (it becomes part of entry names, so the same alphabet applies).
    pub fn new(backend: KeychainBackend, service: impl Into<String>) -> Result<Self, VaultError> {
        let service = service.into();
        if !is_valid_name(&service) {
            return Err(VaultError::InvalidId { len: service.len() });
        }
        Ok(Self {
            backend,
            service,
            store: Mutex::new(None),
            sealed: None,
            #[cfg(all(
                unix,
                not(any(target_os = "macos", target_os = "ios", target_os = "android"))
            ))]
            reads: reads::Reads::default(),
        })
    }

    /// The `file` keychain: sealed records in `data_dir/vault` under `key`, entries
    /// under `service`.
    ///
    /// # Errors
    ///
    /// [`VaultError::InvalidId`] for a bad service name, [`VaultError::Locked`] if the
    /// store directory cannot be made.
    pub fn file(
        data_dir: &Path,
        key: &VaultKey,
        service: impl Into<String>,
    ) -> Result<Self, VaultError> {
        let mut keychain = Self::new(KeychainBackend::File, service)?;
        keychain.sealed =
            Some(
                SealedStore::open(data_dir, key).map_err(|e| VaultError::Locked {
                    backend: KeychainBackend::File,
                    reason: e.to_string(),
                })?,
            );
        Ok(keychain)
    }

    /// Runs `op` on the sealed store, for the `file` backend; `None` for the others.
    fn with_sealed<T>(
        &self,
        id: &CredentialId,
        version: &VersionTag,
        op: impl FnOnce(&SealedStore, &str, &str) -> Result<T, StoreError>,
    ) -> Option<Result<T, VaultError>> {
        if self.backend != KeychainBackend::File {
            return None;
        }
        let Some(store) = self.sealed.as_ref() else {
            return Some(Err(VaultError::Locked {
                backend: KeychainBackend::File,
                reason: "the file keychain was opened without its vault key".to_owned(),
            }));
        };
        let user = entry_user(id, version);
        Some(op(store, &self.service, &user).map_err(|e| match e {
            StoreError::Missing => VaultError::Missing {
                credential: id.to_string(),
            },
            StoreError::Unsealable => VaultError::Corrupt {
                credential: id.to_string(),
                reason: e.to_string(),
            },
            StoreError::Io(reason) => VaultError::Locked {
                backend: KeychainBackend::File,
                reason,
            },
        }))
    }

    /// The backend this keychain uses.
    pub fn backend(&self) -> KeychainBackend {
        self.backend
    }

    /// The service name entries are stored under.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Stores `secret` as version `version` of credential `id`, replacing any entry
    /// with the same id and version.
    ///
    /// # Errors
    ///
    /// [`VaultError::Locked`] if the keychain cannot be reached or written.
    pub fn put(
        &self,
        id: &CredentialId,
        version: &VersionTag,
        secret: &Secret,
    ) -> Result<(), VaultError> {
        if let Some(done) = self.with_sealed(id, version, |s, svc, user| s.put(svc, user, secret)) {
            return done;
        }
        self.with_entry(id, version, |entry| entry.set_secret(secret.expose()))
    }

    /// Reads version `version` of credential `id`.
    ///
    /// # Errors
    ///
    /// [`VaultError::Missing`] if there is no such entry, [`VaultError::Locked`] if the
    /// keychain cannot be reached or read.
    pub fn get(&self, id: &CredentialId, version: &VersionTag) -> Result<Secret, VaultError> {
        if let Some(done) = self.with_sealed(id, version, |s, svc, user| s.get(svc, user)) {
            return done;
        }
        self.with_entry(id, version, |entry| entry.get_secret().map(Secret::new))
    }

    /// The Secret Service's one-round-trip read of version `version` of credential `id`
    /// ([`reads`]), awaited on the caller's runtime: no thread blocks while the bus
    /// answers. `None` when it does not answer (another backend; an entry missing, locked
    /// or not unique; a bus error): [`Keychain::get`] then reads it the keyring store's
    /// way, which unlocks and says what went wrong.
    pub async fn get_fast(&self, id: &CredentialId, version: &VersionTag) -> Option<Secret> {
        #[cfg(all(
            unix,
            not(any(target_os = "macos", target_os = "ios", target_os = "android"))
        ))]
        if self.backend == KeychainBackend::SecretService {
            return self
                .reads
                .get(&self.service, &entry_user(id, version))
                .await;
        }
        let _ = (id, version);
        None
    }

    /// Deletes version `version` of credential `id`.
    ///
    /// # Errors
    ///
    /// [`VaultError::Missing`] if there is no such entry, [`VaultError::Locked`] if the
    /// keychain cannot be reached or written.
    pub fn delete(&self, id: &CredentialId, version: &VersionTag) -> Result<(), VaultError> {
        if let Some(done) = self.with_sealed(id, version, |s, svc, user| s.delete(svc, user)) {
            return done;
        }
        self.with_entry(id, version, Entry::delete_credential)
    }

    /// Builds the entry for (`id`, `version`) and runs `op` on it, mapping keyring errors
    /// (including those from opening the store) into [`VaultError`].
    fn with_entry<T>(
        &self,
        id: &CredentialId,
        version: &VersionTag,
        op: impl FnOnce(&Entry) -> keyring_core::Result<T>,
    ) -> Result<T, VaultError> {
        let result = self.store().and_then(|store| {
            let user = entry_user(id, version);
            let entry = match self.backend {
                // A readable label for keyring UIs such as Seahorse; the Secret Service
                // store would otherwise label items `keyring:<user>@<service>`.
                KeychainBackend::SecretService => {
                    let label = format!("Postern credential {id} ({version})");
                    let modifiers = HashMap::from([("label", label.as_str())]);
                    store.build(&self.service, &user, Some(&modifiers))?
                }
                // Local: the Credential Manager would otherwise roam the secret with an
                // enterprise profile to every machine the user signs in to.
                KeychainBackend::WindowsCredentialManager => {
                    let modifiers = HashMap::from([("persistence", "Local")]);
                    store.build(&self.service, &user, Some(&modifiers))?
                }
                KeychainBackend::Keyutils
                | KeychainBackend::File
                | KeychainBackend::MacosKeychain => store.build(&self.service, &user, None)?,
            };
            op(&entry)
        });
        result.map_err(|err| {
            if matches!(
                err,
                keyring_core::Error::PlatformFailure(_) | keyring_core::Error::NoStorageAccess(_)
            ) {
                // The connection may be dead (daemon restarted, bus gone); the next call
                // reconnects instead of failing forever on a stale handle.
                self.forget_store();
            }
            self.map_error(err, id)
        })
    }

    fn store(&self) -> keyring_core::Result<Arc<CredentialStore>> {
        let mut slot = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(store) = slot.as_ref() {
            return Ok(Arc::clone(store));
        }
        let store = open_store(self.backend)?;
        *slot = Some(Arc::clone(&store));
        Ok(store)
    }

    fn forget_store(&self) {
        *self.store.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn map_error(&self, err: keyring_core::Error, id: &CredentialId) -> VaultError {
        use keyring_core::Error as K;
        let credential = id.to_string();
        let locked = |reason: String| VaultError::Locked {
            backend: self.backend,
            reason,
        };
        match err {
            K::NoEntry => VaultError::Missing { credential },
            K::NoStorageAccess(e) => locked(format!("access denied: {e}")),
            K::PlatformFailure(e) => locked(e.to_string()),
            K::NoDefaultStore => locked("no credential store is configured".to_owned()),
            K::NotSupportedByStore(what) => locked(format!("not supported: {what}")),
            // Both carry the raw bytes read from the keychain: wipe them and keep only
            // the fact that they were unusable.
            K::BadEncoding(mut bytes) => {
                bytes.zeroize();
                VaultError::Corrupt {
                    credential,
                    reason: "the stored data is not valid text".to_owned(),
                }
            }
            K::BadDataFormat(mut bytes, _) => {
                bytes.zeroize();
                VaultError::Corrupt {
                    credential,
                    reason: "the stored data is malformed".to_owned(),
                }
            }
            K::BadStoreFormat(reason) => VaultError::Corrupt { credential, reason },
            K::Ambiguous(entries) => VaultError::Corrupt {
                credential,
                reason: format!("{} keychain entries match one version", entries.len()),
            },
            // The Windows Credential Manager holds at most 2560 bytes a credential; its
            // store names the secret ("secret", "password encoded as UTF-16").
            K::TooLong(what, _) if what == "secret" || what.starts_with("password") => {
                VaultError::InvalidSecret {
                    reason: "it is larger than this keychain can hold",
                }
            }
            // Only the id, version and service name reach the backend, and the first two
            // are validated; a backend limit on them is reported against the id.
            K::TooLong(..) | K::Invalid(..) => VaultError::InvalidId {
                len: credential.len(),
            },
            // Variants added to the (non-exhaustive) keyring error later may carry
            // payload bytes, so neither their Display nor their Debug is trusted here.
            _ => locked("unexpected keychain error".to_owned()),
        }
    }
}

#[cfg(all(
    unix,
    not(any(target_os = "macos", target_os = "ios", target_os = "android"))
))]
fn open_secret_service() -> keyring_core::Result<Arc<CredentialStore>> {
    let store: Arc<CredentialStore> = zbus_secret_service_keyring_store::Store::new()?;
    Ok(store)
}

#[cfg(not(all(
    unix,
    not(any(target_os = "macos", target_os = "ios", target_os = "android"))
)))]
fn open_secret_service() -> keyring_core::Result<Arc<CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore(
        "the Secret Service backend is not available on this platform".to_owned(),
    ))
}

#[cfg(target_os = "linux")]
fn open_keyutils() -> keyring_core::Result<Arc<CredentialStore>> {
    let store: Arc<CredentialStore> = linux_keyutils_keyring_store::Store::new()?;
    Ok(store)
}

#[cfg(not(target_os = "linux"))]
fn open_keyutils() -> keyring_core::Result<Arc<CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore(
        "the keyutils backend is only available on Linux".to_owned(),
    ))
}

#[cfg(target_os = "macos")]
fn open_macos_keychain() -> keyring_core::Result<Arc<CredentialStore>> {
    let store: Arc<CredentialStore> = apple_native_keyring_store::keychain::Store::new()?;
    Ok(store)
}

#[cfg(not(target_os = "macos"))]
fn open_macos_keychain() -> keyring_core::Result<Arc<CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore(
        "the macOS keychain is only available on macOS".to_owned(),
    ))
}

#[cfg(windows)]
fn open_windows_credential_manager() -> keyring_core::Result<Arc<CredentialStore>> {
    let store: Arc<CredentialStore> = windows_native_keyring_store::Store::new()?;
    Ok(store)
}

#[cfg(not(windows))]
fn open_windows_credential_manager() -> keyring_core::Result<Arc<CredentialStore>> {
    Err(keyring_core::Error::NotSupportedByStore(
        "the Windows Credential Manager is only available on Windows".to_owned(),
    ))
}

fn open_store(backend: KeychainBackend) -> keyring_core::Result<Arc<CredentialStore>> {
    match backend {
        KeychainBackend::SecretService => open_secret_service(),
        KeychainBackend::Keyutils => open_keyutils(),
        KeychainBackend::MacosKeychain => open_macos_keychain(),
        KeychainBackend::WindowsCredentialManager => open_windows_credential_manager(),
        // Never reached: the file backend's entries go through `with_sealed`.
        KeychainBackend::File => Err(keyring_core::Error::NotSupportedByStore(
            "the file keychain has no OS store".to_owned(),
        )),
    }
}

/// The keychain entry's user name for version `version` of credential `id`: each
/// version is its own entry under the keychain's service.
fn entry_user(id: &CredentialId, version: &VersionTag) -> String {
    format!("{id}@{version}")
}

/// Secret Service reads in one round trip, awaited on the caller's runtime.
///
/// The keyring store finds an entry by its attributes (SearchItems) and then reads it
/// (GetSecret): two calls through the bus per read, over a connection it locks for both.
/// Here the entry's object path, once found, is remembered (a path says where a secret
/// is; it is not the secret), so a read is GetSecret alone, over one connection and one
/// encrypted (DH) session kept open. The secret itself is read from the keychain on
/// every call and never kept.
///
/// Anything unusual is left to the keyring store: an entry not found or not unique, a
/// locked item, any bus or session error (the connection is then dropped, and opened
/// again on a later read).
#[cfg(all(
    unix,
    not(any(target_os = "macos", target_os = "ios", target_os = "android"))
))]
mod reads {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use secret_service::{EncryptionType, SecretService};
    use zbus::zvariant::OwnedObjectPath;

    use super::Secret;

    #[derive(Default)]
    pub(super) struct Reads {
        /// The open connection and session; locked only to open or drop them, so
        /// concurrent reads share one connection side by side.
        open: tokio::sync::Mutex<Option<Arc<Open>>>,
    }

    struct Open {
        service: SecretService<'static>,
        /// `user` → the item's object path (one map per keychain service).
        paths: Mutex<HashMap<String, OwnedObjectPath>>,
    }

    impl Reads {
        /// The secret of the entry (`service`, `user`), or `None` when the keyring store
        /// should answer instead.
        pub(super) async fn get(&self, service: &str, user: &str) -> Option<Secret> {
            let open = self.open().await?;
            let known = open.paths.lock().ok()?.get(user).cloned();
            let path = match known {
                Some(path) => path,
                None => {
                    let attributes = HashMap::from([("service", service), ("username", user)]);
                    let found = open.service.search_items(attributes).await.ok()?;
                    let [item] = found.unlocked.as_slice() else {
                        return None;
                    };
                    if !found.locked.is_empty() {
                        return None;
                    }
                    let path = item.item_path.clone();
                    open.paths
                        .lock()
                        .ok()?
                        .insert(user.to_string(), path.clone());
                    path
                }
            };
            let read = match open.service.get_item_by_path(path).await {
                Ok(item) => item.get_secret().await,
                Err(e) => Err(e),
            };
            match read {
                Ok(bytes) => Some(Secret::new(bytes)),
                Err(_) => {
                    // The item may be gone (removed, rotated away) or locked, or the bus
                    // or session broken: start over next time; the keyring store decides
                    // this read.
                    self.forget(&open).await;
                    None
                }
            }
        }

        /// The open connection and session, opening them if none is.
        async fn open(&self) -> Option<Arc<Open>> {
            let mut slot = self.open.lock().await;
            if let Some(open) = slot.as_ref() {
                return Some(open.clone());
            }
            let service = SecretService::connect(EncryptionType::Dh).await.ok()?;
            let open = Arc::new(Open {
                service,
                paths: Mutex::default(),
            });
            *slot = Some(open.clone());
            Some(open)
        }

        /// Drops `open` if it is still the current one: the next read opens anew.
        async fn forget(&self, open: &Arc<Open>) {
            let mut slot = self.open.lock().await;
            if slot
                .as_ref()
                .is_some_and(|current| Arc::ptr_eq(current, open))
            {
                *slot = None;
            }
        }
    }
}

//! The secret bytes type, on the ground floor: the vault reads it, the sealed store
//! seals it, the channels inject it. It can be neither printed, serialized nor cloned.
//!
//! Never: give a secret a `Display`, `Serialize` or `Clone`.

use std::fmt;

use zeroize::Zeroizing;

/// Secret bytes (an API token, an SSH or signing private key).
///
/// The bytes are zeroized when the value is dropped. `Debug` prints `<redacted>`; there is
/// deliberately no `Display`, `Serialize` or `Clone`, so a secret cannot be formatted into
/// a message, written to JSON or silently duplicated.
///
/// ```compile_fail
/// use postern_broker::vault::Secret;
///
/// let secret = Secret::from("hunter2".to_string());
/// let _ = serde_json::to_string(&secret);
/// ```
///
/// Copies made outside this type (by the keychain client library, the kernel or the
/// transport) are out of its reach; keeping the window between
/// [`Keychain::get`](crate::vault::Keychain::get) and the
/// transport write short is the caller's job.
pub struct Secret(Zeroizing<Vec<u8>>);

impl Secret {
    /// Wraps `bytes` without copying them.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The secret bytes.
    ///
    /// Only the credential injection step (which writes them to the transport) and the
    /// keychain write call this. Anything else that needs to know about a secret should
    /// use [`Secret::len`] or the credential's metadata.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The number of secret bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the secret has no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<u8>> for Secret {
    fn from(bytes: Vec<u8>) -> Self {
        Self::new(bytes)
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Self::new(text.into_bytes())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

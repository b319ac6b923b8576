//! SSH key handling on the operator side: importing a private key into the keychain
//! form the SSH channel reads, and turning OpenSSH public keys and `known_hosts` lines
//! into the `<algo> <base64>` a target pins as `host_key`.
//!
//! - [`import_private_key`]: an OpenSSH (or PEM / PKCS#8) private key, ed25519, ECDSA
//!   or RSA, decrypted once with its passphrase and re-encoded as an *unencrypted*
//!   OpenSSH private key, so the passphrase is never stored.
//! - [`host_key_from_known_hosts_line`]: the key a `known_hosts` line records for one
//!   host and port (plain, `[host]:port`, wildcard and hashed `|1|salt|hash` entries).
//! - [`fingerprint_of_public`] / [`normalize_public_key`]: `SHA256:...` and the
//!   canonical `<algo> <base64>` of a public key line.
//!
//! No error carries key material: messages name the problem, never the bytes.

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use russh::keys::ssh_key::LineEnding;
use russh::keys::{Algorithm, HashAlg, PrivateKey, PublicKey};
use sha1::Sha1;

use crate::vault::Secret;

/// A private key ready for the keychain, with what may be shown about it.
pub struct ImportedKey {
    /// The key as an unencrypted OpenSSH private key (`-----BEGIN OPENSSH PRIVATE KEY-----`).
    pub private_openssh: Secret,
    /// `<algo> <base64>`, without a comment.
    pub public: String,
    /// `SHA256:<base64, unpadded>`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    /// The key algorithm, e.g. `ssh-ed25519`, `ecdsa-sha2-nistp256`, `ssh-rsa`.
    pub algorithm: String,
}

impl std::fmt::Debug for ImportedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedKey")
            .field("private_openssh", &"<redacted>")
            .field("public", &self.public)
            .field("fingerprint", &self.fingerprint)
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

/// Why a private key could not be imported. Never contains key bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyImportError {
    #[error("the key is encrypted; a passphrase is needed")]
    PassphraseRequired,
    #[error("the passphrase is wrong (the key could not be decrypted)")]
    WrongPassphrase,
    #[error("unsupported key algorithm `{algorithm}` (ed25519, ECDSA and RSA are supported)")]
    Unsupported { algorithm: String },
    #[error("not a valid private key: {reason}")]
    Invalid { reason: &'static str },
    #[error("the key could not be re-encoded: {reason}")]
    Encode { reason: &'static str },
}

/// Why a public key or `known_hosts` line was not accepted. Never contains key bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostKeyError {
    #[error("malformed line: {reason}")]
    Malformed { reason: &'static str },
    #[error("the `{marker}` marker is not supported (a host key line is expected)")]
    UnsupportedMarker { marker: String },
    #[error("unsupported key algorithm `{algorithm}`")]
    UnsupportedAlgorithm { algorithm: String },
    #[error("not a valid `{algorithm}` public key")]
    InvalidKey { algorithm: String },
    #[error("the line does not match host `{host}`")]
    HostNotMatched { host: String },
}

fn supported(algorithm: &Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::Ed25519 | Algorithm::Ecdsa { .. } | Algorithm::Rsa { .. }
    )
}

/// Decodes `text` (OpenSSH, or PEM PKCS#1 / SEC1 / PKCS#8), decrypting it with
/// `passphrase` if it is encrypted, and re-encodes it as an unencrypted OpenSSH key.
///
/// A passphrase given for an unencrypted key is ignored.
pub fn import_private_key(
    text: &str,
    passphrase: Option<&str>,
) -> Result<ImportedKey, KeyImportError> {
    let key = decode_private(text, passphrase)?;
    let algorithm = key.algorithm();
    if !supported(&algorithm) {
        return Err(KeyImportError::Unsupported {
            algorithm: algorithm.as_str().to_owned(),
        });
    }
    let pem = key
        .to_openssh(LineEnding::LF)
        .map_err(|_| KeyImportError::Encode {
            reason: "OpenSSH private key encoding failed",
        })?;
    let public = public_without_comment(key.public_key()).map_err(|_| KeyImportError::Encode {
        reason: "OpenSSH public key encoding failed",
    })?;
    Ok(ImportedKey {
        private_openssh: Secret::new(pem.as_bytes().to_vec()),
        public,
        fingerprint: key.public_key().fingerprint(HashAlg::Sha256).to_string(),
        algorithm: algorithm.as_str().to_owned(),
    })
}

fn decode_private(text: &str, passphrase: Option<&str>) -> Result<PrivateKey, KeyImportError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(KeyImportError::Invalid {
            reason: "the input is empty",
        });
    }
    if trimmed.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----") {
        let key = PrivateKey::from_openssh(trimmed).map_err(|e| match e {
            russh::keys::ssh_key::Error::AlgorithmUnknown
            | russh::keys::ssh_key::Error::AlgorithmUnsupported { .. } => {
                KeyImportError::Unsupported {
                    algorithm: "unknown".to_owned(),
                }
            }
            _ => KeyImportError::Invalid {
                reason: "the OpenSSH private key could not be decoded",
            },
        })?;
        if !key.is_encrypted() {
            return Ok(key);
        }
        if !supported(&key.algorithm()) {
            return Err(KeyImportError::Unsupported {
                algorithm: key.algorithm().as_str().to_owned(),
            });
        }
        let Some(pass) = passphrase else {
            return Err(KeyImportError::PassphraseRequired);
        };
        return key
            .decrypt(pass.as_bytes())
            .map_err(|_| KeyImportError::WrongPassphrase);
    }
    if !trimmed.starts_with("-----BEGIN ") {
        return Err(KeyImportError::Invalid {
            reason: "expected a PEM block such as -----BEGIN OPENSSH PRIVATE KEY-----",
        });
    }
    let encrypted_pem =
        trimmed.contains("Proc-Type: 4,ENCRYPTED") || trimmed.contains("BEGIN ENCRYPTED");
    russh::keys::decode_secret_key(trimmed, passphrase).map_err(|e| match e {
        russh::keys::Error::KeyIsEncrypted if passphrase.is_none() => {
            KeyImportError::PassphraseRequired
        }
        russh::keys::Error::KeyIsEncrypted => KeyImportError::WrongPassphrase,
        russh::keys::Error::UnsupportedKeyType { .. } | russh::keys::Error::UnknownAlgorithm(_) => {
            KeyImportError::Unsupported {
                algorithm: "unknown".to_owned(),
            }
        }
        _ if encrypted_pem && passphrase.is_none() => KeyImportError::PassphraseRequired,
        _ if encrypted_pem => KeyImportError::WrongPassphrase,
        _ => KeyImportError::Invalid {
            reason: "the PEM private key could not be decoded",
        },
    })
}

fn public_without_comment(key: &PublicKey) -> Result<String, russh::keys::ssh_key::Error> {
    let mut key = key.clone();
    key.set_comment("");
    let line = key.to_openssh()?;
    Ok(line.trim().to_owned())
}

/// Parses `<algo> <base64> [comment]` into a public key of a supported algorithm.
fn parse_public(algo: &str, b64: &str) -> Result<PublicKey, HostKeyError> {
    let key = PublicKey::from_openssh(&format!("{algo} {b64}")).map_err(|_| {
        HostKeyError::InvalidKey {
            algorithm: algo.to_owned(),
        }
    })?;
    if key.algorithm().as_str() != algo {
        return Err(HostKeyError::InvalidKey {
            algorithm: algo.to_owned(),
        });
    }
    if !supported(&key.algorithm()) {
        return Err(HostKeyError::UnsupportedAlgorithm {
            algorithm: algo.to_owned(),
        });
    }
    Ok(key)
}

fn split_public(line: &str) -> Result<PublicKey, HostKeyError> {
    let mut parts = line.split_whitespace();
    let (Some(algo), Some(b64)) = (parts.next(), parts.next()) else {
        return Err(HostKeyError::Malformed {
            reason: "expected `<algo> <base64> [comment]`",
        });
    };
    parse_public(algo, b64)
}

/// The canonical `<algo> <base64>` of a public key line (`<algo> <base64> [comment]`).
pub fn normalize_public_key(line: &str) -> Result<String, HostKeyError> {
    let key = split_public(line)?;
    public_without_comment(&key).map_err(|_| HostKeyError::InvalidKey {
        algorithm: key.algorithm().as_str().to_owned(),
    })
}

/// The SHA256 fingerprint (`SHA256:...`) of a public key line (`<algo> <base64> [comment]`).
pub fn fingerprint_of_public(line: &str) -> Result<String, HostKeyError> {
    Ok(split_public(line)?.fingerprint(HashAlg::Sha256).to_string())
}

/// The name `known_hosts` records for `host` at `port`: `host` for port 22, else
/// `[host]:port`.
fn known_hosts_name(host: &str, port: u16) -> String {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = host.to_ascii_lowercase();
    if port == 22 {
        host
    } else {
        format!("[{host}]:{port}")
    }
}

/// OpenSSH pattern matching: `*` any run, `?` one character, case-insensitive.
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some(p);
                mark = n;
                p += 1;
            }
            Some(&c) if c == b'?' || c.eq_ignore_ascii_case(&name[n]) => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some(s) => {
                    p = s + 1;
                    mark += 1;
                    n = mark;
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

fn hashed_match(entry: &str, name: &str) -> Result<bool, HostKeyError> {
    let malformed = HostKeyError::Malformed {
        reason: "a hashed host entry must be `|1|<base64 salt>|<base64 hash>`",
    };
    let mut parts = entry.split('|');
    let (Some(""), Some("1"), Some(salt), Some(hash), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(malformed);
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let (Ok(salt), Ok(hash)) = (b64.decode(salt), b64.decode(hash)) else {
        return Err(malformed);
    };
    let Ok(mac) = Hmac::<Sha1>::new_from_slice(&salt) else {
        return Err(malformed);
    };
    Ok(mac
        .chain_update(name.as_bytes())
        .verify_slice(&hash)
        .is_ok())
}

/// Whether the comma-separated host field of a `known_hosts` line matches `name`.
/// A matching negated pattern (`!pattern`) rejects the line outright.
fn hosts_match(field: &str, name: &str) -> Result<bool, HostKeyError> {
    if field.starts_with('|') {
        return hashed_match(field, name);
    }
    let mut matched = false;
    for pattern in field.split(',').filter(|p| !p.is_empty()) {
        if let Some(neg) = pattern.strip_prefix('!') {
            if glob_match(neg.as_bytes(), name.as_bytes()) {
                return Ok(false);
            }
        } else if glob_match(pattern.as_bytes(), name.as_bytes()) {
            matched = true;
        }
    }
    Ok(matched)
}

/// The `<algo> <base64>` an OpenSSH `known_hosts` line records for `host`:`port`.
///
/// Accepts `host[,host2] algo base64 [comment]`, `[host]:port` names, `*`/`?`
/// wildcards, `!` negations and hashed `|1|salt|hash` names. `@cert-authority` and
/// `@revoked` lines are refused.
pub fn host_key_from_known_hosts_line(
    line: &str,
    host: &str,
    port: u16,
) -> Result<String, HostKeyError> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Err(HostKeyError::Malformed {
            reason: "the line is empty or a comment",
        });
    }
    let mut fields = line.split_whitespace();
    let hosts = fields.next().unwrap_or_default();
    if hosts.starts_with('@') {
        return Err(HostKeyError::UnsupportedMarker {
            marker: hosts.to_owned(),
        });
    }
    let (Some(algo), Some(b64)) = (fields.next(), fields.next()) else {
        return Err(HostKeyError::Malformed {
            reason: "expected `<hosts> <algo> <base64> [comment]`",
        });
    };
    let key = parse_public(algo, b64)?;
    let name = known_hosts_name(host, port);
    if !hosts_match(hosts, &name)? {
        return Err(HostKeyError::HostNotMatched { host: name });
    }
    public_without_comment(&key).map_err(|_| HostKeyError::InvalidKey {
        algorithm: algo.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs() {
        assert!(glob_match(b"*.example.com", b"web1.example.com"));
        assert!(glob_match(b"web?.example.com", b"WEB1.example.com"));
        assert!(!glob_match(b"web?.example.com", b"web12.example.com"));
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"[10.0.0.*]:2222", b"[10.0.0.7]:2222"));
        assert!(!glob_match(b"a*b", b"acbd"));
    }
}

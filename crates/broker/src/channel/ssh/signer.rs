//! The SSH private key lives on a thread of its own for one attempt: decoded there from
//! the keychain's text, used there to sign the user-auth request, dropped there, and the
//! thread's stack overwritten before it ends.
//!
//! Decoding and signing copy the raw key onto whatever stack runs them (ed25519 builds a
//! signing key from the seed on the stack, the PEM decoder leaves pieces in dead
//! frames). Done on a shared runtime worker, those copies stayed in its stack until other
//! work happened to overwrite them: issue 26 found the raw seed in a daemon's memory
//! after an SSH call in some runs. A thread that does nothing else has a stack this module
//! can wipe whole, so no copy outlives the attempt.
//!
//! Never: hand the private key, or anything decoded from it, out of the key thread;
//! anything that leaves is the public key and signatures.

use std::sync::mpsc;

use russh::keys::ssh_encoding::Encode;
use russh::keys::ssh_key::private::KeypairData;
use russh::keys::{HashAlg, PrivateKey, PublicKey, signature};

use crate::vault::Secret;

/// The key thread's stack. Decoding an OpenSSH key and signing (RSA-4096 included) use a
/// few tens of KiB; the margin leaves room for the wipe below its first frame.
const STACK_BYTES: usize = 512 * 1024;

/// How much of the key thread's stack is overwritten before it ends: everything below its
/// first frame that decoding and signing could have reached.
const WIPE_BYTES: usize = 384 * 1024;

/// Why the key thread could not be started or the key not used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the stored credential is not an unencrypted OpenSSH private key")]
    NotAKey,
    #[error("the key thread could not start: {0}")]
    NoThread(std::io::Error),
    #[error("the key thread ended before it answered")]
    Gone,
    #[error("signing failed: {0}")]
    Sign(String),
    /// russh's session ended while the signature was made (the connection dropped).
    #[error("the SSH session ended during user authentication")]
    Session,
}

/// One request to the key thread: the bytes russh asks to have signed, and where the
/// signed buffer goes.
struct SignRequest {
    to_sign: Vec<u8>,
    hash: Option<HashAlg>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, KeyError>>,
}

/// A handle on the key thread: its public key, and a way to ask for signatures. Dropping
/// it ends the thread, which drops the key and wipes its stack.
pub struct KeySigner {
    public: PublicKey,
    requests: mpsc::Sender<SignRequest>,
}

impl KeySigner {
    /// Starts the key thread with `secret` (an OpenSSH private key's text) and waits for it
    /// to decode the key. `secret` is moved to the thread and dropped (wiped) there.
    pub fn start(secret: Secret) -> Result<KeySigner, KeyError> {
        let (requests, inbox) = mpsc::channel::<SignRequest>();
        let (ready, decoded) = mpsc::sync_channel::<Option<PublicKey>>(1);
        std::thread::Builder::new()
            .name("postern-ssh-key".into())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                serve(secret, &ready, &inbox);
                wipe_stack();
            })
            .map_err(KeyError::NoThread)?;
        match decoded.recv() {
            Ok(Some(public)) => Ok(KeySigner { public, requests }),
            Ok(None) => Err(KeyError::NotAKey),
            Err(_) => Err(KeyError::Gone),
        }
    }

    /// The key's public half, which names it in the user-auth request.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// Whether the key is RSA (the caller then negotiates the signature hash).
    pub fn is_rsa(&self) -> bool {
        self.public.algorithm().is_rsa()
    }

    /// `to_sign` followed by the SSH-encoded signature over it, as russh's user-auth
    /// request wants it.
    pub async fn sign(&self, to_sign: Vec<u8>, hash: Option<HashAlg>) -> Result<Vec<u8>, KeyError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.requests
            .send(SignRequest {
                to_sign,
                hash,
                reply,
            })
            .map_err(|_| KeyError::Gone)?;
        answer.await.map_err(|_| KeyError::Gone)?
    }
}

/// Lets russh's `authenticate_publickey_with` sign through the key thread.
pub struct ThreadSigner<'a>(pub &'a KeySigner);

impl From<russh::SendError> for KeyError {
    fn from(_: russh::SendError) -> Self {
        KeyError::Session
    }
}

impl russh::Signer for ThreadSigner<'_> {
    type Error = KeyError;

    fn auth_sign(
        &mut self,
        _key: &russh::keys::agent::AgentIdentity,
        hash_alg: Option<HashAlg>,
        to_sign: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, Self::Error>> + Send {
        self.0.sign(to_sign, hash_alg)
    }
}

/// The key thread's work, in a frame of its own below which [`wipe_stack`] reaches.
#[inline(never)]
fn serve(
    secret: Secret,
    ready: &mpsc::SyncSender<Option<PublicKey>>,
    inbox: &mpsc::Receiver<SignRequest>,
) {
    let key = decode(&secret);
    drop(secret);
    let Some(key) = key else {
        let _ = ready.send(None);
        return;
    };
    if ready.send(Some(key.public_key().clone())).is_err() {
        return;
    }
    for request in inbox {
        let _ = request
            .reply
            .send(sign(&key, request.to_sign, request.hash));
    }
}

#[inline(never)]
fn decode(secret: &Secret) -> Option<PrivateKey> {
    let text = std::str::from_utf8(secret.expose()).ok()?;
    russh::keys::decode_secret_key(text, None).ok()
}

/// `to_sign` with its signature appended (a string holding the encoded signature), as
/// russh appends it when it holds the key itself. RSA signs with the negotiated hash.
#[inline(never)]
fn sign(
    key: &PrivateKey,
    mut to_sign: Vec<u8>,
    hash: Option<HashAlg>,
) -> Result<Vec<u8>, KeyError> {
    let signed = match key.key_data() {
        KeypairData::Rsa(rsa) => signature::Signer::try_sign(&(rsa, hash), &to_sign),
        keypair => signature::Signer::try_sign(keypair, &to_sign),
    }
    .map_err(|e| KeyError::Sign(e.to_string()))?;
    let encoded = signed
        .encode_vec()
        .map_err(|e| KeyError::Sign(e.to_string()))?;
    encoded
        .as_slice()
        .encode(&mut to_sign)
        .map_err(|e| KeyError::Sign(e.to_string()))?;
    Ok(to_sign)
}

/// Overwrites [`WIPE_BYTES`] of the key thread's stack below its first frame, where
/// decoding and signing ran. Called last, on the key thread.
#[inline(never)]
fn wipe_stack() {
    let mut dead = [0u8; WIPE_BYTES];
    // The write is observed, so it is not optimised away.
    std::hint::black_box(&mut dead);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_that_is_not_a_key_is_refused_with_a_typed_error() {
        let refused = KeySigner::start(Secret::new(b"not a key".to_vec()));
        assert!(matches!(refused, Err(KeyError::NotAKey)));
    }
}

//! The text formats a witness and a log exchange: checkpoint bodies
//! (c2sp.org/tlog-checkpoint), Ed25519 signed notes (c2sp.org/signed-note), verifier
//! keys, and Ed25519 `cosignature/v1` signatures (c2sp.org/tlog-cosignature).
//!
//! Signing goes through our own `ed25519_dalek` keys wrapped in [`signed_note::Signer`]
//! implementations; no private-key string (`PRIVATE+KEY+…`) is ever built, so a key never
//! exists in a form that could be logged or pasted.
//!
//! Key ids (signed-note, "Signatures"): `SHA-256(name || 0x0A || type || public key)[:4]`,
//! type `0x01` for a note signature, `0x04` for an Ed25519 cosignature.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use signed_note::{Note, Signature};
use tlog_tiles::checkpoint::Checkpoint;

/// Signature type of an Ed25519 note signature (signed-note, "Signature types").
pub const ALG_ED25519: u8 = 0x01;
/// Signature type of an Ed25519 `cosignature/v1` (tlog-cosignature, "Format").
pub const ALG_COSIGNATURE_V1: u8 = 0x04;

/// The header line of the message a `cosignature/v1` signs (tlog-cosignature, "Ed25519
/// signed message"); it is the domain separation between the two signature types.
const COSIGNATURE_HEADER: &[u8] = b"cosignature/v1\n";

/// Bytes of a cosignature's payload after the key id: timestamp then Ed25519 signature.
const COSIGNATURE_LEN: usize = 8 + 64;

/// A note or cosignature that does not parse, is not signed by the expected key, or is
/// for another log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("malformed signed note: {0}")]
    Malformed(&'static str),
    #[error("malformed checkpoint: the note text is not `<origin>\\n<size>\\n<base64 root>\\n`")]
    MalformedCheckpoint,
    #[error("invalid key name `{0}`: it must be non-empty, without spaces or `+`")]
    InvalidKeyName(String),
    #[error("invalid origin: it must be one non-empty line without control characters")]
    InvalidOrigin,
    #[error("invalid verifier key: {0}")]
    InvalidVerifierKey(&'static str),
    #[error("the checkpoint is for origin `{found}`, expected `{expected}`")]
    WrongOrigin { expected: String, found: String },
    #[error("the note carries no signature by key `{name}` ({id:08x})")]
    NotSigned { name: String, id: u32 },
    #[error("the signature by key `{name}` ({id:08x}) does not verify")]
    BadSignature { name: String, id: u32 },
    #[error("cosignature timestamp {0} exceeds 2^63 - 1")]
    TimestampOutOfRange(u64),
}

/// The signed part of a checkpoint: the first three lines of its note text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointBody {
    /// The log's identity; a witness keys its state by it.
    pub origin: String,
    /// Number of leaves in the tree.
    pub size: u64,
    /// RFC 6962 Merkle tree hash of those leaves.
    pub root: [u8; 32],
}

impl CheckpointBody {
    /// A body for `origin`, refused if the origin cannot be one note line.
    pub fn new(origin: &str, size: u64, root: [u8; 32]) -> Result<Self, NoteError> {
        if origin.is_empty() || origin.chars().any(char::is_control) {
            return Err(NoteError::InvalidOrigin);
        }
        Ok(CheckpointBody {
            origin: origin.to_string(),
            size,
            root,
        })
    }

    /// `<origin>\n<size>\n<base64 root>\n`: the note text (tlog-checkpoint, "Note text").
    pub fn to_text(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            BASE64.encode(self.root)
        )
    }

    /// Parses a checkpoint note text. Extension lines after the root are allowed (and
    /// covered by signatures over the text) but not returned: nothing here reads them.
    pub fn parse(text: &[u8]) -> Result<Self, NoteError> {
        let checkpoint =
            Checkpoint::from_bytes(text).map_err(|_| NoteError::MalformedCheckpoint)?;
        CheckpointBody::new(checkpoint.origin(), checkpoint.size(), checkpoint.hash().0)
            .map_err(|_| NoteError::MalformedCheckpoint)
    }
}

fn check_key_name(name: &str) -> Result<(), NoteError> {
    if signed_note::is_key_name_valid(name) {
        Ok(())
    } else {
        Err(NoteError::InvalidKeyName(name.to_string()))
    }
}

/// `SHA-256(name || "\n" || alg || public key)[:4]` as a big-endian u32.
pub fn key_id(name: &str, alg: u8, public_key: &VerifyingKey) -> u32 {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([alg]);
    h.update(public_key.as_bytes());
    let digest = h.finalize();
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// What a verifier key is for: its signature type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlg {
    /// `0x01`: signs notes (a log's checkpoints).
    Ed25519,
    /// `0x04`: signs `cosignature/v1` cosignatures (a witness).
    CosignatureV1,
}

impl KeyAlg {
    pub fn byte(self) -> u8 {
        match self {
            KeyAlg::Ed25519 => ALG_ED25519,
            KeyAlg::CosignatureV1 => ALG_COSIGNATURE_V1,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            ALG_ED25519 => Some(KeyAlg::Ed25519),
            ALG_COSIGNATURE_V1 => Some(KeyAlg::CosignatureV1),
            _ => None,
        }
    }
}

/// A public key with its name and type, as written in configuration files:
/// `<name>+<8 hex key id>+<base64(type || 32-byte key)>` (signed-note, "Verifier keys").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifierKey {
    pub name: String,
    pub alg: KeyAlg,
    pub key: VerifyingKey,
}

impl VerifierKey {
    pub fn new(name: &str, alg: KeyAlg, key: VerifyingKey) -> Result<Self, NoteError> {
        check_key_name(name)?;
        Ok(VerifierKey {
            name: name.to_string(),
            alg,
            key,
        })
    }

    pub fn key_id(&self) -> u32 {
        key_id(&self.name, self.alg.byte(), &self.key)
    }

    /// The `name+id+key` string.
    pub fn encode(&self) -> String {
        let mut material = Vec::with_capacity(33);
        material.push(self.alg.byte());
        material.extend_from_slice(self.key.as_bytes());
        format!(
            "{}+{:08x}+{}",
            self.name,
            self.key_id(),
            BASE64.encode(material)
        )
    }

    /// Parses a `name+id+key` string, checking the id against the key and refusing key
    /// types other than Ed25519 (`0x01`) and Ed25519 cosignature (`0x04`).
    pub fn parse(s: &str) -> Result<Self, NoteError> {
        let s = s.trim();
        // The name cannot hold a `+` and the id is hex; base64 can hold `+`, so the key
        // is everything after the second one.
        let mut parts = s.splitn(3, '+');
        let (Some(name), Some(id_hex), Some(key_b64)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(NoteError::InvalidVerifierKey(
                "expected `<name>+<key id>+<base64 key>`",
            ));
        };
        check_key_name(name)?;
        if id_hex.len() != 8 || !id_hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(NoteError::InvalidVerifierKey(
                "the key id is not 8 hex digits",
            ));
        }
        let id = u32::from_str_radix(id_hex, 16)
            .map_err(|_| NoteError::InvalidVerifierKey("the key id is not 8 hex digits"))?;
        let material = BASE64
            .decode(key_b64)
            .map_err(|_| NoteError::InvalidVerifierKey("the key is not base64"))?;
        let Some((&alg, key)) = material.split_first() else {
            return Err(NoteError::InvalidVerifierKey("the key is empty"));
        };
        let alg = KeyAlg::from_byte(alg).ok_or(NoteError::InvalidVerifierKey(
            "unsupported key type (expected 0x01 Ed25519 or 0x04 Ed25519 cosignature)",
        ))?;
        let key: [u8; 32] = key
            .try_into()
            .map_err(|_| NoteError::InvalidVerifierKey("an Ed25519 key is 32 bytes"))?;
        let key = VerifyingKey::from_bytes(&key)
            .map_err(|_| NoteError::InvalidVerifierKey("not an Ed25519 public key"))?;
        let parsed = VerifierKey::new(name, alg, key)?;
        if parsed.key_id() != id {
            return Err(NoteError::InvalidVerifierKey(
                "the key id does not match the name and key",
            ));
        }
        Ok(parsed)
    }
}

impl std::fmt::Display for VerifierKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.encode())
    }
}

impl std::str::FromStr for VerifierKey {
    type Err = NoteError;
    fn from_str(s: &str) -> Result<Self, NoteError> {
        VerifierKey::parse(s)
    }
}

/// Signs notes with an Ed25519 key we hold (type `0x01`). Borrows the key: the secret is
/// never copied.
pub struct NoteSigner<'k> {
    name: String,
    id: u32,
    key: &'k SigningKey,
}

impl<'k> NoteSigner<'k> {
    pub fn new(name: &str, key: &'k SigningKey) -> Result<Self, NoteError> {
        check_key_name(name)?;
        Ok(NoteSigner {
            name: name.to_string(),
            id: key_id(name, ALG_ED25519, &key.verifying_key()),
            key,
        })
    }
}

impl signed_note::Signer for NoteSigner<'_> {
    fn name(&self) -> &str {
        &self.name
    }
    fn key_id(&self) -> u32 {
        self.id
    }
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, ed25519_dalek::SignatureError> {
        Ok(self.key.sign(msg).to_bytes().to_vec())
    }
}

/// Verifies Ed25519 note signatures (type `0x01`).
#[derive(Debug, Clone)]
pub struct NoteVerifier {
    name: String,
    id: u32,
    key: VerifyingKey,
}

impl NoteVerifier {
    pub fn new(name: &str, key: VerifyingKey) -> Result<Self, NoteError> {
        check_key_name(name)?;
        Ok(NoteVerifier {
            name: name.to_string(),
            id: key_id(name, ALG_ED25519, &key),
            key,
        })
    }
}

impl signed_note::Verifier for NoteVerifier {
    fn name(&self) -> &str {
        &self.name
    }
    fn key_id(&self) -> u32 {
        self.id
    }
    fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        let Ok(sig) = ed25519_dalek::Signature::from_slice(sig) else {
            return false;
        };
        // Strict: no malleable signatures, no small-order keys.
        self.key.verify_strict(msg, &sig).is_ok()
    }
}

/// Signs `origin`/`size`/`root` as a checkpoint: the whole note (text, blank line, one
/// signature line by `key_name`).
pub fn sign_checkpoint(
    origin: &str,
    size: u64,
    root: [u8; 32],
    key_name: &str,
    key: &SigningKey,
) -> Result<Vec<u8>, NoteError> {
    let body = CheckpointBody::new(origin, size, root)?;
    let signer = NoteSigner::new(key_name, key)?;
    let mut note = Note::new(body.to_text().as_bytes(), &[])
        .map_err(|_| NoteError::Malformed("checkpoint text"))?;
    note.add_sigs(&[&signer])
        .map_err(|_| NoteError::InvalidKeyName(key_name.to_string()))?;
    Ok(note.to_bytes())
}

/// Parses a signed note (signed-note, "Format"), refusing anything over 1 MB, with
/// control characters, or without a signature block.
pub fn parse_note(note: &[u8]) -> Result<Note, NoteError> {
    Note::from_bytes(note).map_err(|_| NoteError::Malformed("not a signed note"))
}

/// Checks that `note` is a checkpoint for `origin` signed by `key_name`/`log_key`, and
/// returns its body. Signatures by other keys are ignored, as signed-note requires.
pub fn open_checkpoint(
    note: &[u8],
    origin: &str,
    key_name: &str,
    log_key: &VerifyingKey,
) -> Result<CheckpointBody, NoteError> {
    let note = parse_note(note)?;
    let verifier = NoteVerifier::new(key_name, *log_key)?;
    verify_note_signature(&note, &verifier)?;
    let body = CheckpointBody::parse(note.text())?;
    if body.origin != origin {
        return Err(NoteError::WrongOrigin {
            expected: origin.to_string(),
            found: body.origin,
        });
    }
    Ok(body)
}

/// The signatures on `note` that `verifier` made, all verified; an error if there is
/// none or one fails.
pub fn verify_note_signature(
    note: &Note,
    verifier: &NoteVerifier,
) -> Result<Vec<Signature>, NoteError> {
    use signed_note::Verifier as _;
    let mut verified = Vec::new();
    for sig in sigs_of(note) {
        if sig.name() != verifier.name() || sig.id() != verifier.key_id() {
            continue;
        }
        if !verifier.verify(note.text(), sig.signature()) {
            return Err(NoteError::BadSignature {
                name: verifier.name().to_string(),
                id: verifier.key_id(),
            });
        }
        if !verified.contains(&sig) {
            verified.push(sig);
        }
    }
    if verified.is_empty() {
        return Err(NoteError::NotSigned {
            name: verifier.name().to_string(),
            id: verifier.key_id(),
        });
    }
    Ok(verified)
}

/// The signature lines of a parsed note. `signed_note::Note` keeps them private; they
/// are re-read from its own encoding, which it produced from well-formed lines.
pub fn sigs_of(note: &Note) -> Vec<Signature> {
    let bytes = note.to_bytes();
    let sig_block = bytes.get(note.text().len() + 1..).unwrap_or_default();
    sig_block
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .filter_map(|line| Signature::from_bytes(line).ok())
        .collect()
}

/// The message a `cosignature/v1` signs: `cosignature/v1\ntime <T>\n` then the note text
/// (tlog-cosignature, "Ed25519 signed message").
pub fn cosignature_message(time: u64, text: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(COSIGNATURE_HEADER.len() + 26 + text.len());
    msg.extend_from_slice(COSIGNATURE_HEADER);
    msg.extend_from_slice(format!("time {time}\n").as_bytes());
    msg.extend_from_slice(text);
    msg
}

/// Cosigns a checkpoint note text (the text without its signature lines) at `time`
/// (POSIX seconds): one signature line, `— <witness_name> base64(key id || time || sig)`.
pub fn cosign(
    text: &[u8],
    time: u64,
    witness_name: &str,
    key: &SigningKey,
) -> Result<Signature, NoteError> {
    check_key_name(witness_name)?;
    if time > i64::MAX as u64 {
        return Err(NoteError::TimestampOutOfRange(time));
    }
    // Only a checkpoint is cosigned: the statement is about a tree head.
    CheckpointBody::parse(text)?;
    let sig = key.sign(&cosignature_message(time, text));
    let mut payload = Vec::with_capacity(COSIGNATURE_LEN);
    payload.extend_from_slice(&time.to_be_bytes());
    payload.extend_from_slice(&sig.to_bytes());
    let id = key_id(witness_name, ALG_COSIGNATURE_V1, &key.verifying_key());
    Signature::new(witness_name.to_string(), id, payload)
        .map_err(|_| NoteError::InvalidKeyName(witness_name.to_string()))
}

/// Verifies one cosignature line over the note text `text`, returning its timestamp.
pub fn verify_cosignature(
    text: &[u8],
    line: &Signature,
    witness_name: &str,
    witness_key: &VerifyingKey,
) -> Result<u64, NoteError> {
    check_key_name(witness_name)?;
    let id = key_id(witness_name, ALG_COSIGNATURE_V1, witness_key);
    if line.name() != witness_name || line.id() != id {
        return Err(NoteError::NotSigned {
            name: witness_name.to_string(),
            id,
        });
    }
    let bad = || NoteError::BadSignature {
        name: witness_name.to_string(),
        id,
    };
    let payload = line.signature();
    if payload.len() != COSIGNATURE_LEN {
        return Err(bad());
    }
    let (time, sig) = payload.split_at(8);
    let time = u64::from_be_bytes(time.try_into().map_err(|_| bad())?);
    if time > i64::MAX as u64 {
        return Err(NoteError::TimestampOutOfRange(time));
    }
    let sig = ed25519_dalek::Signature::from_slice(sig).map_err(|_| bad())?;
    witness_key
        .verify_strict(&cosignature_message(time, text), &sig)
        .map_err(|_| bad())?;
    Ok(time)
}

/// Parses one signature line (`— <name> <base64>`, with or without its newline).
pub fn parse_signature_line(line: &[u8]) -> Result<Signature, NoteError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    Signature::from_bytes(line).map_err(|_| NoteError::Malformed("not a note signature line"))
}

/// `note` with `extra` signature lines (e.g. verified cosignatures) appended, as one
/// signed note; a line identical to one already there is not repeated.
pub fn append_signatures(note: &[u8], extra: &[Signature]) -> Result<Vec<u8>, NoteError> {
    let parsed = parse_note(note)?;
    let mut sigs = sigs_of(&parsed);
    for sig in extra {
        if !sigs.contains(sig) {
            sigs.push(sig.clone());
        }
    }
    let joined = Note::new(parsed.text(), &sigs).map_err(|_| NoteError::Malformed("note text"))?;
    Ok(joined.to_bytes())
}

/// A checkpoint signed by its log and cosigned by a witness, both verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cosigned {
    pub body: CheckpointBody,
    /// When the witness cosigned, POSIX seconds.
    pub time: u64,
}

/// Opens a note carrying both the log's signature and a witness cosignature (what
/// `GET /postern/latest` serves): checks the log signature, the origin, and the first
/// cosignature line by `witness_name`/`witness_key`.
pub fn open_cosigned(
    note: &[u8],
    origin: &str,
    log_name: &str,
    log_key: &VerifyingKey,
    witness_name: &str,
    witness_key: &VerifyingKey,
) -> Result<Cosigned, NoteError> {
    let body = open_checkpoint(note, origin, log_name, log_key)?;
    let parsed = parse_note(note)?;
    let id = key_id(witness_name, ALG_COSIGNATURE_V1, witness_key);
    let line = sigs_of(&parsed)
        .into_iter()
        .find(|s| s.name() == witness_name && s.id() == id)
        .ok_or(NoteError::NotSigned {
            name: witness_name.to_string(),
            id,
        })?;
    let time = verify_cosignature(parsed.text(), &line, witness_name, witness_key)?;
    Ok(Cosigned { body, time })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known answers computed outside this code, with Python's `hashlib` and
    // `cryptography` (Ed25519 is deterministic): log seed 00..1f, witness seed 20..3f,
    // root = SHA-256("postern test root"), cosigned at 1700000000.
    const LOG_NAME: &str = "postern.test/log";
    const WITNESS_NAME: &str = "witness.test/w1";
    const LOG_PK: &str = "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8";
    const WITNESS_PK: &str = "29acbae141bccaf0b22e1a94d34d0bc7361e526d0bfe12c89794bc9322966dd7";
    const LOG_VKEY: &str = "postern.test/log+0628c750+AQOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4";
    const WITNESS_VKEY: &str =
        "witness.test/w1+ad1959f2+BCmsuuFBvMrwsi4alNNNC8c2HlJtC/4SyJeUvJMilm3X";
    const ROOT: &str = "b9950a9c896eba6a41df3f3030009f736ee86c91381e53b5a796667eb677e19b";
    const BODY: &str = "postern.test/log\n5\nuZUKnIluumpB3z8wMACfc27obJE4HlO1p5ZmfrZ34Zs=\n";
    const NOTE: &str = "postern.test/log\n5\nuZUKnIluumpB3z8wMACfc27obJE4HlO1p5ZmfrZ34Zs=\n\n\
        \u{2014} postern.test/log BijHUFmgP80Z5ua6j4OlEjMnBPINFhbcRhLTZdYzqrBvnRLrtoDXx9dJWXFJ+DA5S9Xy4eLIOCP9HVWrDIX55ejr9gQ=\n";
    const COSIG_LINE: &str = "\u{2014} witness.test/w1 rRlZ8gAAAABlU/EATm455KYOSbik4tdB2PT0v4wyLtZM2uFZCl6enT28/a6NkOlbFhQObAqpwV1nOSY+B4IaL2aYHQ63jB4Y8EOWAQ==\n";
    const TIME: u64 = 1_700_000_000;

    fn seed(start: u8) -> SigningKey {
        let mut s = [0u8; 32];
        for (i, b) in s.iter_mut().enumerate() {
            *b = start + i as u8;
        }
        SigningKey::from_bytes(&s)
    }

    fn log_key() -> SigningKey {
        seed(0)
    }

    fn witness_key() -> SigningKey {
        seed(32)
    }

    fn root() -> [u8; 32] {
        hex::decode(ROOT).unwrap().try_into().unwrap()
    }

    #[test]
    fn fixed_seeds_give_the_expected_public_keys() {
        assert_eq!(hex::encode(log_key().verifying_key().as_bytes()), LOG_PK);
        assert_eq!(
            hex::encode(witness_key().verifying_key().as_bytes()),
            WITNESS_PK
        );
    }

    #[test]
    fn key_ids_match_known_answers() {
        assert_eq!(
            key_id(LOG_NAME, ALG_ED25519, &log_key().verifying_key()),
            0x0628_c750
        );
        assert_eq!(
            key_id(
                WITNESS_NAME,
                ALG_COSIGNATURE_V1,
                &witness_key().verifying_key()
            ),
            0xad19_59f2
        );
    }

    #[test]
    fn verifier_keys_encode_and_parse_to_known_answers() {
        let log = VerifierKey::new(LOG_NAME, KeyAlg::Ed25519, log_key().verifying_key()).unwrap();
        assert_eq!(log.encode(), LOG_VKEY);
        let witness = VerifierKey::new(
            WITNESS_NAME,
            KeyAlg::CosignatureV1,
            witness_key().verifying_key(),
        )
        .unwrap();
        assert_eq!(witness.to_string(), WITNESS_VKEY);
        assert_eq!(VerifierKey::parse(LOG_VKEY).unwrap(), log);
        assert_eq!(WITNESS_VKEY.parse::<VerifierKey>().unwrap(), witness);
    }

    #[test]
    fn verifier_key_matches_the_go_note_example() {
        // The example key of golang.org/x/mod/sumdb/note, also in signed_note's docs.
        let vkey = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
        let parsed = VerifierKey::parse(vkey).unwrap();
        assert_eq!(parsed.alg, KeyAlg::Ed25519);
        assert_eq!(parsed.key_id(), 0xc74f_20a3);
        assert_eq!(parsed.encode(), vkey);
        let text = "If you think cryptography is the answer to your problem,\n\
                    then you don't know what your problem is.\n";
        let msg = format!(
            "{text}\n\u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
        );
        let note = parse_note(msg.as_bytes()).unwrap();
        let verifier = NoteVerifier::new(&parsed.name, parsed.key).unwrap();
        assert_eq!(verify_note_signature(&note, &verifier).unwrap().len(), 1);
    }

    #[test]
    fn malformed_verifier_keys_are_refused_with_a_reason() {
        let cases = [
            "",
            "name",
            "name+0628c750",
            "a b+0628c750+AQOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4",
            "postern.test/log+0628c75+AQOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4",
            "postern.test/log+0628c75z+AQOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4",
            "postern.test/log+0628c751+AQOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4",
            "postern.test/log+0628c750+!!!",
            "postern.test/log+0628c750+",
            "postern.test/log+0628c750+AQOh",
            // Type 0x02 (not ours).
            "postern.test/log+0628c750+AgOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4",
            "postern.test/log+0628c750+AQOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4+extra",
        ];
        for case in cases {
            assert!(VerifierKey::parse(case).is_err(), "accepted {case:?}");
        }
    }

    #[test]
    fn checkpoint_body_is_the_three_line_text() {
        let body = CheckpointBody::new(LOG_NAME, 5, root()).unwrap();
        assert_eq!(body.to_text(), BODY);
        assert_eq!(CheckpointBody::parse(BODY.as_bytes()).unwrap(), body);
    }

    #[test]
    fn signed_checkpoint_matches_the_known_answer() {
        let note = sign_checkpoint(LOG_NAME, 5, root(), LOG_NAME, &log_key()).unwrap();
        assert_eq!(String::from_utf8(note).unwrap(), NOTE);
    }

    #[test]
    fn open_checkpoint_accepts_the_known_note() {
        let body = open_checkpoint(
            NOTE.as_bytes(),
            LOG_NAME,
            LOG_NAME,
            &log_key().verifying_key(),
        )
        .unwrap();
        assert_eq!(body, CheckpointBody::new(LOG_NAME, 5, root()).unwrap());
    }

    #[test]
    fn open_checkpoint_refuses_other_keys_origins_and_edits() {
        let vk = log_key().verifying_key();
        // Another key: the note carries no signature it can check.
        let other = seed(7).verifying_key();
        assert!(matches!(
            open_checkpoint(NOTE.as_bytes(), LOG_NAME, LOG_NAME, &other),
            Err(NoteError::NotSigned { .. })
        ));
        // The right key, another origin expected.
        assert!(matches!(
            open_checkpoint(NOTE.as_bytes(), "other/origin", LOG_NAME, &vk),
            Err(NoteError::WrongOrigin { .. })
        ));
        // A changed size under the same signature.
        let edited = NOTE.replace("\n5\n", "\n6\n");
        assert!(matches!(
            open_checkpoint(edited.as_bytes(), LOG_NAME, LOG_NAME, &vk),
            Err(NoteError::BadSignature { .. })
        ));
        // An extra unknown signature is ignored.
        let mut extra = NOTE.to_string();
        extra.push_str(COSIG_LINE);
        assert!(open_checkpoint(extra.as_bytes(), LOG_NAME, LOG_NAME, &vk).is_ok());
    }

    #[test]
    fn cosignature_matches_the_known_answer() {
        let line = cosign(BODY.as_bytes(), TIME, WITNESS_NAME, &witness_key()).unwrap();
        assert_eq!(String::from_utf8(line.to_bytes()).unwrap(), COSIG_LINE);
    }

    #[test]
    fn cosignature_message_is_header_time_then_body() {
        assert_eq!(
            cosignature_message(TIME, BODY.as_bytes()),
            format!("cosignature/v1\ntime 1700000000\n{BODY}").into_bytes()
        );
    }

    #[test]
    fn verify_cosignature_returns_the_time_and_refuses_tampering() {
        let wk = witness_key().verifying_key();
        let line = parse_signature_line(COSIG_LINE.as_bytes()).unwrap();
        assert_eq!(
            verify_cosignature(BODY.as_bytes(), &line, WITNESS_NAME, &wk).unwrap(),
            TIME
        );
        // Another body.
        let other = BODY.replace("\n5\n", "\n6\n");
        assert!(matches!(
            verify_cosignature(other.as_bytes(), &line, WITNESS_NAME, &wk),
            Err(NoteError::BadSignature { .. })
        ));
        // Another timestamp in the payload (the signature covers it).
        let mut payload = line.signature().to_vec();
        payload[7] ^= 1;
        let shifted = Signature::new(WITNESS_NAME.into(), line.id(), payload).unwrap();
        assert!(verify_cosignature(BODY.as_bytes(), &shifted, WITNESS_NAME, &wk).is_err());
        // A truncated payload.
        let short = Signature::new(WITNESS_NAME.into(), line.id(), vec![0; 40]).unwrap();
        assert!(verify_cosignature(BODY.as_bytes(), &short, WITNESS_NAME, &wk).is_err());
        // Another witness key or name.
        assert!(matches!(
            verify_cosignature(
                BODY.as_bytes(),
                &line,
                WITNESS_NAME,
                &seed(9).verifying_key()
            ),
            Err(NoteError::NotSigned { .. })
        ));
        assert!(verify_cosignature(BODY.as_bytes(), &line, "witness.test/w2", &wk).is_err());
        // A note signature (type 0x01) is not a cosignature even by the same key.
        let note_sig = sign_checkpoint(LOG_NAME, 5, root(), WITNESS_NAME, &witness_key()).unwrap();
        let parsed = parse_note(&note_sig).unwrap();
        let as_line = sigs_of(&parsed).remove(0);
        assert!(verify_cosignature(BODY.as_bytes(), &as_line, WITNESS_NAME, &wk).is_err());
    }

    #[test]
    fn cosign_refuses_out_of_range_times_and_non_checkpoints() {
        assert!(matches!(
            cosign(BODY.as_bytes(), u64::MAX, WITNESS_NAME, &witness_key()),
            Err(NoteError::TimestampOutOfRange(_))
        ));
        assert!(matches!(
            cosign(b"hello\n", TIME, WITNESS_NAME, &witness_key()),
            Err(NoteError::MalformedCheckpoint)
        ));
        assert!(cosign(BODY.as_bytes(), TIME, "bad name", &witness_key()).is_err());
    }

    #[test]
    fn open_cosigned_checks_both_signatures() {
        let line = parse_signature_line(COSIG_LINE.as_bytes()).unwrap();
        let both = append_signatures(NOTE.as_bytes(), &[line.clone(), line]).unwrap();
        assert_eq!(
            String::from_utf8(both.clone()).unwrap(),
            format!("{NOTE}{COSIG_LINE}")
        );
        let cosigned = open_cosigned(
            &both,
            LOG_NAME,
            LOG_NAME,
            &log_key().verifying_key(),
            WITNESS_NAME,
            &witness_key().verifying_key(),
        )
        .unwrap();
        assert_eq!(cosigned.time, TIME);
        assert_eq!(cosigned.body.size, 5);
        assert!(matches!(
            open_cosigned(
                NOTE.as_bytes(),
                LOG_NAME,
                LOG_NAME,
                &log_key().verifying_key(),
                WITNESS_NAME,
                &witness_key().verifying_key(),
            ),
            Err(NoteError::NotSigned { .. })
        ));
    }

    #[test]
    fn malformed_notes_and_checkpoints_are_errors_not_panics() {
        let vk = log_key().verifying_key();
        let long_origin = format!("{}\n5\n{}\n\n", "a".repeat(2_000_000), &BODY[19..]);
        let cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"\n".to_vec(),
            b"\n\n".to_vec(),
            BODY.as_bytes().to_vec(),
            NOTE.as_bytes()[..NOTE.len() - 10].to_vec(),
            NOTE.replace("\u{2014}", "-").into_bytes(),
            NOTE.replace("\n5\n", "\n05\n").into_bytes(),
            NOTE.replace("\n5\n", "\n18446744073709551616\n")
                .into_bytes(),
            NOTE.replace("\n5\n", "\n-1\n").into_bytes(),
            NOTE.replace("uZUK", "uZU!").into_bytes(),
            NOTE.replace("=\n\n", "\n\n").into_bytes(),
            [b"\xff".as_slice(), NOTE.as_bytes()].concat(),
            NOTE.replace("postern.test/log\n5", "postern.test/log\x01\n5")
                .into_bytes(),
            long_origin.into_bytes(),
        ];
        for case in cases {
            assert!(
                open_checkpoint(&case, LOG_NAME, LOG_NAME, &vk).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(&case[..case.len().min(200)])
            );
        }
        for text in [
            b"".as_slice(),
            b"origin\n",
            b"origin\n5\n",
            b"origin\n5\nAAAA\n",
            b"\n5\nuZUKnIluumpB3z8wMACfc27obJE4HlO1p5ZmfrZ34Zs=\n",
        ] {
            assert!(CheckpointBody::parse(text).is_err());
        }
        for line in [
            b"".as_slice(),
            b"\xe2\x80\x94 name",
            b"\xe2\x80\x94 name AAAA",
        ] {
            assert!(parse_signature_line(line).is_err());
        }
    }

    #[test]
    fn checkpoint_body_refuses_bad_origins() {
        assert!(CheckpointBody::new("", 1, [0; 32]).is_err());
        assert!(CheckpointBody::new("a\nb", 1, [0; 32]).is_err());
        assert!(sign_checkpoint("a\nb", 1, [0; 32], LOG_NAME, &log_key()).is_err());
        assert!(sign_checkpoint(LOG_NAME, 1, [0; 32], "has space", &log_key()).is_err());
    }
}

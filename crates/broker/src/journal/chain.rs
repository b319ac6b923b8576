//! The audit chain and checkpoint format, as the journal writes it: each event row's
//! keyed blake3 chain value ([`ChainHasher`]), the signed [`Checkpoint`] over the chain
//! head and the Merkle root ([`super::merkle`]), the checkpoint rows, and the checkpoint
//! file kept beside the database (and at the anchor).
//!
//! The writer ([`super::writer`]) produces all of it; [`crate::audit`] verifies it and
//! re-exports these names. Nothing here reads the journal's events or judges them: the
//! verifier and its policy (what may be unsigned, how late) live in `audit`.

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

const EVENT_CONTEXT: &str = "postern 2026 audit-event v1";
const CHECKPOINT_CONTEXT: &str = "postern 2026 audit-checkpoint v1";
/// Checkpoints that also sign the Merkle root.
const CHECKPOINT_CONTEXT_V2: &str = "postern 2026 audit-checkpoint v2";

/// The longest an event waits for a checkpoint that is kept: checkpoints made within
/// this window of the last kept one are replaced by the next.
pub const SIGN_INTERVAL_MS: i64 = 2_000;

/// The event kind the writer records when it signs events a previous run left unsigned.
pub const SIGNING_RESUMED: &str = "SIGNING_RESUMED";

/// The chain value before the first event.
pub const GENESIS: [u8; 32] = [0u8; 32];

/// The fields of a stored event that the chain covers.
#[derive(Debug, Clone, Copy)]
pub struct ChainedRow<'a> {
    pub seq: u64,
    pub invocation_id: &'a str,
    pub kind: &'a str,
    pub body: &'a str,
    pub recorded_at_ms: i64,
}

/// Computes chain hashes; holds the derived key and a scratch buffer so verifying a
/// million rows does not allocate per row.
pub struct ChainHasher {
    key: [u8; 32],
    scratch: Vec<u8>,
}

impl Default for ChainHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainHasher {
    pub fn new() -> Self {
        ChainHasher {
            key: blake3::derive_key(EVENT_CONTEXT, b"chain"),
            scratch: Vec::new(),
        }
    }

    /// The hash of `row` chained after `prev`.
    pub fn link(&mut self, prev: &[u8; 32], row: &ChainedRow<'_>) -> [u8; 32] {
        let buf = &mut self.scratch;
        buf.clear();
        buf.extend_from_slice(prev);
        buf.extend_from_slice(&row.seq.to_le_bytes());
        for field in [row.invocation_id, row.kind, row.body] {
            buf.extend_from_slice(&(field.len() as u64).to_le_bytes());
            buf.extend_from_slice(field.as_bytes());
        }
        buf.extend_from_slice(&row.recorded_at_ms.to_le_bytes());
        *blake3::keyed_hash(&self.key, buf).as_bytes()
    }
}

/// A signed statement that the chain had `count` events ending at `seq` with `head`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub seq: u64,
    #[serde(with = "hex_bytes")]
    pub head: [u8; 32],
    pub count: u64,
    #[serde(with = "hex_bytes")]
    pub public_key: [u8; 32],
    #[serde(with = "hex_bytes")]
    pub signature: [u8; 64],
    pub made_at_ms: i64,
    /// The Merkle root of the tree of `seq` events. Absent on checkpoints made before
    /// the tree existed (they sign the chain head only).
    #[serde(
        default,
        with = "opt_hex_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub root: Option<[u8; 32]>,
    /// The same tree in the C2SP signed-note checkpoint format, for witnesses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn checkpoint_message(
    seq: u64,
    head: &[u8; 32],
    count: u64,
    made_at_ms: i64,
    root: Option<&[u8; 32]>,
) -> [u8; 32] {
    let context = match root {
        None => CHECKPOINT_CONTEXT,
        Some(_) => CHECKPOINT_CONTEXT_V2,
    };
    let mut h = blake3::Hasher::new_derive_key(context);
    h.update(&seq.to_le_bytes());
    h.update(head);
    h.update(&count.to_le_bytes());
    h.update(&made_at_ms.to_le_bytes());
    if let Some(root) = root {
        h.update(root);
    }
    *h.finalize().as_bytes()
}

impl Checkpoint {
    /// Signs a checkpoint over the chain head and the Merkle root with the audit key.
    pub fn sign(
        key: &SigningKey,
        seq: u64,
        head: [u8; 32],
        root: [u8; 32],
        made_at_ms: i64,
    ) -> Self {
        Checkpoint::signed(key, seq, head, Some(root), made_at_ms)
    }

    fn signed(
        key: &SigningKey,
        seq: u64,
        head: [u8; 32],
        root: Option<[u8; 32]>,
        made_at_ms: i64,
    ) -> Self {
        let message = checkpoint_message(seq, &head, seq, made_at_ms, root.as_ref());
        Checkpoint {
            seq,
            head,
            count: seq,
            public_key: key.verifying_key().to_bytes(),
            signature: key.sign(&message).to_bytes(),
            made_at_ms,
            root,
            note: None,
        }
    }

    /// The same checkpoint as a C2SP signed note ([`log_origin`], size, root), signed by
    /// `key`, for witnesses. A checkpoint without a root has none.
    pub fn with_note(mut self, key: &SigningKey) -> Self {
        let origin = log_origin(&key.verifying_key());
        self.note = self.root.and_then(|root| {
            crate::transparency::note::sign_checkpoint(&origin, self.seq, root, &origin, key)
                .ok()
                .and_then(|n| String::from_utf8(n).ok())
        });
        self
    }

    /// A checkpoint in the format used before the Merkle tree (chain head only). Only
    /// for tests of journals written by earlier versions.
    #[doc(hidden)]
    pub fn sign_chain_only(key: &SigningKey, seq: u64, head: [u8; 32], made_at_ms: i64) -> Self {
        Checkpoint::signed(key, seq, head, None, made_at_ms)
    }

    /// Whether `key` signed exactly these fields.
    pub fn signature_valid(&self, key: &VerifyingKey) -> bool {
        let msg = checkpoint_message(
            self.seq,
            &self.head,
            self.count,
            self.made_at_ms,
            self.root.as_ref(),
        );
        self.public_key == key.to_bytes()
            && key
                .verify(&msg, &Signature::from_bytes(&self.signature))
                .is_ok()
    }
}

/// The witness file kept beside a journal database.
pub fn witness_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".checkpoint");
    db.with_file_name(name)
}

/// The C2SP checkpoint origin of the journal signed by `key` (also the note key name):
/// `postern.local/audit/` and the first 8 bytes of the key's blake3, in hex. Witnesses
/// know a log by it.
pub fn log_origin(key: &VerifyingKey) -> String {
    let id = blake3::hash(key.as_bytes());
    format!("postern.local/audit/{}", hex::encode(&id.as_bytes()[..8]))
}

/// Replaces the checkpoint file at `path` atomically (write, fsync, rename), creating
/// its directory (0700) if needed. Used for the witness file beside the journal and the
/// anchor outside the data directory.
pub fn write_checkpoint_file(path: &Path, cp: &Checkpoint) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        crate::platform::create_owner_only_dir_all(dir)?;
    }
    let text = serde_json::to_vec(cp).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&text)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The columns [`checkpoint_row`] reads, in order.
pub const CHECKPOINT_COLUMNS: &str =
    "seq, head, count, public_key, signature, made_at_ms, root, note";

/// A checkpoint from a row of [`CHECKPOINT_COLUMNS`], or its sequence and which field
/// is malformed.
pub fn checkpoint_row(
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<Result<Checkpoint, (u64, &'static str)>> {
    let seq = u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0);
    let head = <[u8; 32]>::try_from(row.get::<_, Vec<u8>>(1)?);
    let public_key = <[u8; 32]>::try_from(row.get::<_, Vec<u8>>(3)?);
    let signature = <[u8; 64]>::try_from(row.get::<_, Vec<u8>>(4)?);
    let root = row
        .get::<_, Option<Vec<u8>>>(6)?
        .map(<[u8; 32]>::try_from)
        .transpose();
    let (count, made_at_ms, note) = (row.get::<_, i64>(2)?, row.get(5)?, row.get(7)?);
    Ok((|| {
        Ok(Checkpoint {
            seq,
            head: head.map_err(|_| (seq, "head"))?,
            count: u64::try_from(count).unwrap_or(0),
            public_key: public_key.map_err(|_| (seq, "key"))?,
            signature: signature.map_err(|_| (seq, "signature"))?,
            made_at_ms,
            root: root.map_err(|_| (seq, "root"))?,
            note,
        })
    })())
}

mod opt_hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match b {
            Some(b) => s.serialize_str(&hex::encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 32]>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let bytes = hex::decode(text).map_err(serde::de::Error::custom)?;
        bytes
            .try_into()
            .map(Some)
            .map_err(|_| serde::de::Error::custom("expected 32 bytes"))
    }
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer, const N: usize>(b: &[u8; N], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(b))
    }

    pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        d: D,
    ) -> Result<[u8; N], D::Error> {
        let text = String::deserialize(d)?;
        let bytes = hex::decode(text).map_err(serde::de::Error::custom)?;
        bytes
            .try_into()
            .map_err(|_| serde::de::Error::custom(format!("expected {N} bytes")))
    }
}

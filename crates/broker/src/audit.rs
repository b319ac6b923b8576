//! The audit chain: the journal's own `events` table, hash-chained with blake3, plus
//! ed25519-signed checkpoints.
//!
//! We chain the journal itself rather than mirroring it into a second log: every
//! transition is covered by construction, and there is no window in which an event is
//! in the journal but not yet in the audit log. Each row's hash is
//! `H_k(prev_hash ‖ seq ‖ len‖invocation_id ‖ len‖kind ‖ len‖body ‖ recorded_at_ms)` with
//! a key derived from a fixed context string (domain separation), so no other blake3 use
//! in the product can produce a colliding chain value. Known-answer vectors:
//! `tests/vectors/audit_chain_v1.json`.
//!
//! Checkpoints (every N events and at clean shutdown) sign `(seq, head, count)`. The
//! latest one is also written to a witness file beside the database, so removing the
//! checkpoint rows together with the tail is still detected.
//!
//! Writing lives in the journal writer; this module holds the hashing and the verifier,
//! which only reads. A hash chain proves recorded events were not altered; it cannot
//! prove every event was recorded.

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};

const EVENT_CONTEXT: &str = "postern 2026 audit-event v1";
const CHECKPOINT_CONTEXT: &str = "postern 2026 audit-checkpoint v1";

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
}

fn checkpoint_message(seq: u64, head: &[u8; 32], count: u64, made_at_ms: i64) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(CHECKPOINT_CONTEXT);
    h.update(&seq.to_le_bytes());
    h.update(head);
    h.update(&count.to_le_bytes());
    h.update(&made_at_ms.to_le_bytes());
    *h.finalize().as_bytes()
}

impl Checkpoint {
    /// Signs a checkpoint with the audit key.
    pub fn sign(key: &SigningKey, seq: u64, head: [u8; 32], count: u64, made_at_ms: i64) -> Self {
        let signature = key.sign(&checkpoint_message(seq, &head, count, made_at_ms));
        Checkpoint {
            seq,
            head,
            count,
            public_key: key.verifying_key().to_bytes(),
            signature: signature.to_bytes(),
            made_at_ms,
        }
    }

    /// Whether `key` signed exactly these fields.
    pub fn signature_valid(&self, key: &VerifyingKey) -> bool {
        let msg = checkpoint_message(self.seq, &self.head, self.count, self.made_at_ms);
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

/// What went wrong, at the first sequence number where the record stops verifying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tamper {
    /// A row's contents do not match its chain hash (modified, inserted or reordered).
    HashMismatch,
    /// A sequence number is missing (a row was deleted) or out of place.
    SequenceGap,
    /// A checkpoint names events that are no longer there (tail truncated).
    Truncated,
    /// A checkpoint's head does not match the recomputed chain at its sequence.
    CheckpointMismatch,
    /// A checkpoint is not signed by the audit key.
    BadSignature,
}

/// The audit record does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
pub enum AuditError {
    #[error("audit chain broken at sequence {first_bad_seq}: {kind:?}: {detail}")]
    Broken {
        first_bad_seq: u64,
        kind: Tamper,
        detail: String,
    },
    #[error("cannot read the audit record in {path}: {detail}")]
    Unreadable { path: String, detail: String },
    /// The chain verifies, but the file around it does not: a damaged page, a cut-off
    /// end. What such a file says cannot be trusted whole.
    #[error("the journal file {path} is damaged: {detail}")]
    Damaged { path: String, detail: String },
}

impl AuditError {
    /// The first sequence number that fails, when the chain itself is broken.
    pub fn first_bad_seq(&self) -> Option<u64> {
        match self {
            AuditError::Broken { first_bad_seq, .. } => Some(*first_bad_seq),
            AuditError::Unreadable { .. } | AuditError::Damaged { .. } => None,
        }
    }
}

/// A successful verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub events: u64,
    /// Every event up to and including this sequence verifies.
    pub verified_through: u64,
    pub head_hex: String,
    pub checkpoints: u64,
    /// The last signed checkpoint; events after it are chained but not yet signed.
    pub last_checkpoint_seq: Option<u64>,
}

fn broken(first_bad_seq: u64, kind: Tamper, detail: impl Into<String>) -> AuditError {
    AuditError::Broken {
        first_bad_seq,
        kind,
        detail: detail.into(),
    }
}

/// Verifies the journal at `db` read-only against the audit public key: the chain and
/// its signed checkpoints, then the integrity of the whole file (every page of every
/// table and index, and its length against its header), since a damaged page outside
/// the events would otherwise pass.
pub fn verify_file(db: &Path, key: &VerifyingKey) -> Result<VerifyReport, AuditError> {
    let unreadable = |e: &dyn std::fmt::Display| AuditError::Unreadable {
        path: db.display().to_string(),
        detail: e.to_string(),
    };
    let damaged = |detail: String| AuditError::Damaged {
        path: db.display().to_string(),
        detail,
    };
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| unreadable(&e))?;
    let witness = read_witness(db).map_err(|e| unreadable(&e))?;
    let report = verify(&conn, key, witness.as_ref()).map_err(|e| match e {
        VerifyFailure::Audit(a) => a,
        VerifyFailure::Sql(s)
            if s.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseCorrupt) =>
        {
            damaged(s.to_string())
        }
        VerifyFailure::Sql(s) => unreadable(&s),
    })?;
    if let Err(crate::journal::JournalError::Damaged { detail, .. }) =
        crate::journal::schema::check_length(db)
    {
        return Err(damaged(detail));
    }
    // quick_check reads every page of the file (it skips only the index-to-table
    // cross-check of integrity_check, which costs a sort per index).
    let mut problems: Vec<String> = Vec::new();
    let checked = conn.prepare("PRAGMA quick_check(20)").and_then(|mut stmt| {
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        for row in rows {
            problems.push(row?);
        }
        Ok(())
    });
    match checked {
        Ok(()) if problems.len() == 1 && problems[0] == "ok" => Ok(report),
        Ok(()) => Err(damaged(problems.join("; "))),
        Err(e) => Err(damaged(e.to_string())),
    }
}

fn read_witness(db: &Path) -> Result<Option<Checkpoint>, String> {
    let path = witness_path(db);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("witness file {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("witness file {}: {e}", path.display())),
    }
}

#[derive(Debug)]
enum VerifyFailure {
    Audit(AuditError),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for VerifyFailure {
    fn from(e: rusqlite::Error) -> Self {
        VerifyFailure::Sql(e)
    }
}

fn verify(
    conn: &Connection,
    key: &VerifyingKey,
    witness: Option<&Checkpoint>,
) -> Result<VerifyReport, VerifyFailure> {
    let mut checkpoints = load_checkpoints(conn)?;
    if let Some(w) = witness {
        // The witness must itself be signed; then it counts like any checkpoint.
        if !checkpoints.iter().any(|c| c == w) {
            checkpoints.push(w.clone());
            checkpoints.sort_by_key(|c| c.seq);
        }
    }
    for c in &checkpoints {
        if !c.signature_valid(key) || c.count != c.seq {
            return Err(VerifyFailure::Audit(broken(
                c.seq,
                Tamper::BadSignature,
                "checkpoint is not signed by the audit key",
            )));
        }
    }
    let mut pending = checkpoints.iter().peekable();

    let mut hasher = ChainHasher::new();
    let mut head = GENESIS;
    let mut expected_seq = 1u64;
    let mut stmt = conn.prepare(
        "SELECT seq, invocation_id, kind, body, recorded_at_ms, hash FROM events ORDER BY seq",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let seq = u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0);
        if seq != expected_seq {
            return Err(VerifyFailure::Audit(broken(
                expected_seq,
                Tamper::SequenceGap,
                format!("expected sequence {expected_seq}, found {seq}"),
            )));
        }
        let invocation_id = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
        let kind = row.get_ref(2)?.as_str().map_err(rusqlite::Error::from)?;
        let body = row.get_ref(3)?.as_str().map_err(rusqlite::Error::from)?;
        let recorded_at_ms = row.get::<_, i64>(4)?;
        let stored = row.get_ref(5)?.as_blob().map_err(rusqlite::Error::from)?;
        let computed = hasher.link(
            &head,
            &ChainedRow {
                seq,
                invocation_id,
                kind,
                body,
                recorded_at_ms,
            },
        );
        if stored != computed {
            return Err(VerifyFailure::Audit(broken(
                seq,
                Tamper::HashMismatch,
                "row contents do not match the chain",
            )));
        }
        head = computed;
        while let Some(c) = pending.next_if(|c| c.seq == seq) {
            if c.head != head {
                return Err(VerifyFailure::Audit(broken(
                    seq,
                    Tamper::CheckpointMismatch,
                    "signed checkpoint head differs from the chain",
                )));
            }
        }
        expected_seq += 1;
    }
    let last = expected_seq - 1;
    if let Some(c) = pending.next() {
        return Err(VerifyFailure::Audit(broken(
            last + 1,
            Tamper::Truncated,
            format!(
                "checkpoint at sequence {} but the journal ends at {last}",
                c.seq
            ),
        )));
    }
    Ok(VerifyReport {
        events: last,
        verified_through: last,
        head_hex: hex::encode(head),
        checkpoints: checkpoints.len() as u64,
        last_checkpoint_seq: checkpoints.last().map(|c| c.seq),
    })
}

fn load_checkpoints(conn: &Connection) -> Result<Vec<Checkpoint>, VerifyFailure> {
    let mut stmt = conn.prepare(
        "SELECT seq, head, count, public_key, signature, made_at_ms FROM checkpoints ORDER BY seq",
    )?;
    let mut out = Vec::new();
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let seq = u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0);
        let fixed = |v: Vec<u8>| -> Result<Vec<u8>, VerifyFailure> { Ok(v) };
        let head: [u8; 32] = fixed(row.get(1)?)?.try_into().map_err(|_| {
            VerifyFailure::Audit(broken(
                seq,
                Tamper::BadSignature,
                "malformed checkpoint head",
            ))
        })?;
        let public_key: [u8; 32] = fixed(row.get(3)?)?.try_into().map_err(|_| {
            VerifyFailure::Audit(broken(
                seq,
                Tamper::BadSignature,
                "malformed checkpoint key",
            ))
        })?;
        let signature: [u8; 64] = fixed(row.get(4)?)?.try_into().map_err(|_| {
            VerifyFailure::Audit(broken(seq, Tamper::BadSignature, "malformed signature"))
        })?;
        out.push(Checkpoint {
            seq,
            head,
            count: u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0),
            public_key,
            signature,
            made_at_ms: row.get(5)?,
        });
    }
    Ok(out)
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

/// The keychain entry holding the audit signing key.
pub const AUDIT_KEY_ID: &str = "postern-audit-signing";

/// Why the audit key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AuditKeyError {
    #[error(transparent)]
    Vault(#[from] crate::vault::VaultError),
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    #[error("the audit signing key in the keychain is not a 32-byte ed25519 seed")]
    Malformed,
}

/// Loads the audit signing key from the vault, creating and storing one on first use.
/// The seed itself exists only in the keychain and in the returned key.
pub fn signing_key_from_vault(
    vault: &crate::vault::Vault,
    now_ms: i64,
) -> Result<SigningKey, AuditKeyError> {
    use crate::vault::{CredentialId, CredentialKind, Secret, VaultError};
    let id = CredentialId::new(AUDIT_KEY_ID)?;
    let secret = match vault.read_for_injection(&id, now_ms) {
        Ok((_, secret)) => secret,
        Err(VaultError::Missing { .. }) => {
            let mut seed = vec![0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| {
                AuditKeyError::Journal(crate::journal::JournalError::Storage(format!(
                    "no randomness for the audit key: {e}"
                )))
            })?;
            let secret = Secret::new(seed);
            vault.set(&id, CredentialKind::SigningKey, &secret, now_ms)?;
            secret
        }
        Err(e) => return Err(e.into()),
    };
    signing_key_from_secret(&secret)
}

/// The audit key from the keychain entry's bytes (a 32-byte ed25519 seed).
pub fn signing_key_from_secret(secret: &crate::vault::Secret) -> Result<SigningKey, AuditKeyError> {
    let seed: [u8; 32] = secret
        .expose()
        .try_into()
        .map_err(|_| AuditKeyError::Malformed)?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The public key of the newest signed checkpoint in the journal at `db`, if any: lets
/// a broker notice that the audit key it loaded is not the one that signed the past.
pub fn last_checkpoint_key(db: &Path) -> Option<[u8; 32]> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
    let key: Vec<u8> = conn
        .query_row(
            "SELECT public_key FROM checkpoints ORDER BY seq DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .ok()?;
    key.try_into().ok()
}

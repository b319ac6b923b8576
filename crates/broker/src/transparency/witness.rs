//! A transparency-log witness (c2sp.org/tlog-witness): it keeps, per log origin, the
//! latest checkpoint it cosigned, and cosigns a new checkpoint only when a consistency
//! proof shows it extends that one.
//!
//! The checks of `add-checkpoint`, in the specification's order: the request parses
//! (400); the origin is known (404); a signature by the log's configured key verifies
//! (403); `old` is not above the checkpoint size (400); `old` equals the size last
//! cosigned (409, `text/x.tlog.size`, the size as body); at equal sizes the roots match
//! (409: an equivocation); otherwise the RFC 6962 consistency proof from the stored root
//! to the new one verifies (422). Check and update happen in one IMMEDIATE transaction
//! under one lock, so two concurrent submissions cannot roll the state back. Refusals
//! that may prove the log misbehaved are kept in the store with the whole request.
//!
//! Data dir layout: `witness.key` (the 32-byte Ed25519 seed, mode 0600, created by
//! [`init`]; the witness refuses to start when group or others can read it) and
//! `witness.db` (see [`super::store`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::SigningKey;
use rusqlite::{Connection, TransactionBehavior};
use signed_note::Signature;
use tlog_tiles::tlog::{Hash, check_tree};
use zeroize::Zeroizing;

use super::note::{
    self, CheckpointBody, KeyAlg, NoteError, NoteVerifier, VerifierKey, parse_note,
    verify_note_signature,
};
use super::store::{self, Latest, Refusal, RefusalReason, StoreError};
use crate::clock::Clock;

/// The private key file in a witness data dir.
pub const KEY_FILE: &str = "witness.key";
/// The database file in a witness data dir.
pub const DB_FILE: &str = "witness.db";

/// Largest request body accepted: a checkpoint note is a few hundred bytes, 63 proof
/// lines are 2.8 KiB; a note may carry up to 100 signatures.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// tlog-witness: "The client MUST NOT send more than 63 consistency proof lines."
pub const MAX_PROOF_LINES: usize = 63;
/// Sizes are stored as SQLite integers; no real log comes near 2^63 leaves.
pub const MAX_TREE_SIZE: u64 = i64::MAX as u64;

/// The body of `POST /add-checkpoint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddCheckpoint {
    /// The size of the checkpoint the submitter believes the witness holds.
    pub old_size: u64,
    /// RFC 6962 consistency proof from `old_size` to the new checkpoint.
    pub proof: Vec<[u8; 32]>,
    /// The signed checkpoint note.
    pub note: Vec<u8>,
}

/// A request body that does not follow the `add-checkpoint` format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request body is larger than {MAX_REQUEST_BYTES} bytes")]
    TooLarge,
    #[error("the request ends before the blank line that precedes the checkpoint")]
    Truncated,
    #[error("the first line must be `old <size>` (decimal, no leading zeroes)")]
    BadOldLine,
    #[error("consistency proof line {line} is not one base64-encoded 32-byte hash")]
    BadProofLine { line: usize },
    #[error("more than {MAX_PROOF_LINES} consistency proof lines")]
    TooManyProofLines,
}

/// Parses an `add-checkpoint` request body (tlog-witness, "add-checkpoint"). The note
/// itself is returned as bytes; it is parsed by the caller.
pub fn parse_add_checkpoint(body: &[u8]) -> Result<AddCheckpoint, RequestError> {
    if body.len() > MAX_REQUEST_BYTES {
        return Err(RequestError::TooLarge);
    }
    let mut rest = body;
    let mut next_line = || -> Result<&[u8], RequestError> {
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(RequestError::Truncated)?;
        let (line, tail) = rest.split_at(end);
        rest = tail.get(1..).unwrap_or_default();
        Ok(line)
    };
    let old_size = parse_old_line(next_line()?)?;
    let mut proof = Vec::new();
    loop {
        let line = next_line()?;
        if line.is_empty() {
            break;
        }
        if proof.len() == MAX_PROOF_LINES {
            return Err(RequestError::TooManyProofLines);
        }
        let bad = RequestError::BadProofLine {
            line: proof.len() + 1,
        };
        let hash = BASE64.decode(line).map_err(|_| bad.clone())?;
        proof.push(hash.try_into().map_err(|_| bad)?);
    }
    Ok(AddCheckpoint {
        old_size,
        proof,
        note: rest.to_vec(),
    })
}

fn parse_old_line(line: &[u8]) -> Result<u64, RequestError> {
    let digits = line.strip_prefix(b"old ").ok_or(RequestError::BadOldLine)?;
    let canonical = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" || digits[0] != b'0');
    if !canonical {
        return Err(RequestError::BadOldLine);
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or(RequestError::BadOldLine)
}

/// Encodes an `add-checkpoint` request body.
pub fn encode_add_checkpoint(old_size: u64, proof: &[[u8; 32]], note: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + proof.len() * 45 + 1 + note.len());
    out.extend_from_slice(format!("old {old_size}\n").as_bytes());
    for hash in proof {
        out.extend_from_slice(BASE64.encode(hash).as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(note);
    out
}

/// Why a submission was not cosigned; [`AddError::status`] is the HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error("malformed request: {0}")]
    Malformed(#[from] RequestError),
    #[error("malformed checkpoint: {0}")]
    MalformedNote(NoteError),
    #[error("tree size {0} is above 2^63 - 1")]
    SizeOutOfRange(u64),
    #[error("unknown log origin `{0}`")]
    UnknownOrigin(String),
    #[error("the checkpoint is not signed by the key configured for `{origin}`: {reason}")]
    Unauthorized { origin: String, reason: NoteError },
    #[error("old size {old} is larger than the checkpoint size {size}")]
    OldExceedsSize { old: u64, size: u64 },
    #[error("old size {old} is not the latest size cosigned for this log, {latest}")]
    Conflict { old: u64, latest: u64 },
    #[error("a checkpoint of size {size} with another root was already cosigned (equivocation)")]
    Equivocation { size: u64 },
    #[error("the consistency proof from size {old} to size {size} does not verify")]
    Inconsistent { old: u64, size: u64 },
    #[error("the witness cannot cosign: {0}")]
    Cosign(NoteError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AddError {
    /// The HTTP status tlog-witness prescribes for this refusal.
    pub fn status(&self) -> u16 {
        match self {
            AddError::Malformed(_)
            | AddError::MalformedNote(_)
            | AddError::SizeOutOfRange(_)
            | AddError::OldExceedsSize { .. } => 400,
            AddError::Unauthorized { .. } => 403,
            AddError::UnknownOrigin(_) => 404,
            AddError::Conflict { .. } | AddError::Equivocation { .. } => 409,
            AddError::Inconsistent { .. } => 422,
            AddError::Cosign(_) | AddError::Store(_) => 500,
        }
    }
}

/// Setting a witness up or starting it failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("invalid witness name: {0}")]
    Name(NoteError),
    #[error("invalid log: {0}")]
    Log(NoteError),
    #[error("{path} already holds a witness key; refusing to replace it")]
    AlreadyInitialized { path: PathBuf },
    #[error("no witness in {path}: run `postern witness init` first")]
    NotInitialized { path: PathBuf },
    #[error("{path} is readable by group or others (mode {mode:o}); the witness key must be 0600")]
    KeyPermissions { path: PathBuf, mode: u32 },
    #[error("{path} is not a witness key (expected 32 bytes, found {len})")]
    KeyLength { path: PathBuf, len: usize },
    #[error("cannot get randomness for the witness key: {0}")]
    Entropy(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SetupError + '_ {
    move |source| SetupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates a witness in `data_dir`: a fresh key in `witness.key` (0600, never
/// overwritten) and `witness.db` with the witness's `name`. Returns the witness's
/// verifier key (type 0x04, cosignature/v1), the string logs configure.
pub fn init(data_dir: &Path, name: &str) -> Result<VerifierKey, SetupError> {
    let mut seed = Zeroizing::new([0u8; 32]);
    getrandom::fill(seed.as_mut_slice()).map_err(|e| SetupError::Entropy(e.to_string()))?;
    init_with_seed(data_dir, name, &seed)
}

/// [`init`] with the seed passed in (tests).
pub fn init_with_seed(
    data_dir: &Path,
    name: &str,
    seed: &[u8; 32],
) -> Result<VerifierKey, SetupError> {
    let key = SigningKey::from_bytes(seed);
    let vkey = VerifierKey::new(name, KeyAlg::CosignatureV1, key.verifying_key())
        .map_err(SetupError::Name)?;
    create_private_dir(data_dir)?;
    let key_path = data_dir.join(KEY_FILE);
    let db_path = data_dir.join(DB_FILE);
    if key_path.exists() {
        return Err(SetupError::AlreadyInitialized { path: key_path });
    }
    let conn = store::open(&db_path)?;
    if store::name(&conn)?.is_some() {
        return Err(SetupError::AlreadyInitialized { path: db_path });
    }
    write_key_file(&key_path, seed)?;
    store::set_name(&conn, name)?;
    Ok(vkey)
}

fn create_private_dir(dir: &Path) -> Result<(), SetupError> {
    crate::platform::create_owner_only_dir_all(dir).map_err(io_err(dir))
}

fn write_key_file(path: &Path, seed: &[u8; 32]) -> Result<(), SetupError> {
    let mut options = std::fs::OpenOptions::new();
    // create_new: never truncate a key that appeared since the check above.
    options.write(true).create_new(true);
    crate::platform::create_mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(io_err(path))?;
    file.write_all(seed).map_err(io_err(path))?;
    file.sync_all().map_err(io_err(path))?;
    // The directory entry too, so the key is not lost with the db that names it.
    if let Some(parent) = path.parent() {
        let _ = crate::platform::sync_dir(parent);
    }
    Ok(())
}

fn load_key(path: &Path) -> Result<SigningKey, SetupError> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SetupError::NotInitialized {
                path: path.parent().unwrap_or(path).to_path_buf(),
            });
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    // Windows has no mode to check: the key's directory was created with a DACL for
    // this user and SYSTEM only (`platform::protect_dir`), and the README says the file's
    // own ACL is not checked.
    if let Some(mode) = crate::platform::mode_of(&meta).map(|m| m & 0o777)
        && mode & 0o077 != 0
    {
        return Err(SetupError::KeyPermissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    let bytes = Zeroizing::new(std::fs::read(path).map_err(io_err(path))?);
    let seed: &[u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| SetupError::KeyLength {
            path: path.to_path_buf(),
            len: bytes.len(),
        })?;
    Ok(SigningKey::from_bytes(seed))
}

/// Adds a log the witness will cosign for: its checkpoint `origin` and its signed-note
/// verifier key (`name+id+base64(0x01 || key)`). Only touches the database, so it works
/// while the witness serves (each request reads the configured keys).
pub fn add_log(data_dir: &Path, origin: &str, vkey: &str, now: u64) -> Result<(), SetupError> {
    let key = VerifierKey::parse(vkey).map_err(SetupError::Log)?;
    CheckpointBody::new(origin, 0, [0; 32]).map_err(SetupError::Log)?;
    let db_path = data_dir.join(DB_FILE);
    if !db_path.exists() {
        return Err(SetupError::NotInitialized {
            path: data_dir.to_path_buf(),
        });
    }
    let conn = store::open(&db_path)?;
    store::add_log(&conn, origin, &key, now)?;
    Ok(())
}

/// A running witness: its key, its name and its state.
pub struct Witness {
    name: String,
    key: SigningKey,
    /// One connection behind one lock: every check-and-update is serialized, which is
    /// what the specification's atomicity requirement asks for.
    conn: Mutex<Connection>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Witness")
            .field("name", &self.name)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl Witness {
    /// Opens the witness in `data_dir`, refusing a key file others can read.
    pub fn open(data_dir: &Path, clock: Arc<dyn Clock>) -> Result<Self, SetupError> {
        let key = load_key(&data_dir.join(KEY_FILE))?;
        let db_path = data_dir.join(DB_FILE);
        if !db_path.exists() {
            return Err(SetupError::NotInitialized {
                path: data_dir.to_path_buf(),
            });
        }
        let conn = store::open(&db_path)?;
        let name = store::name(&conn)?.ok_or(SetupError::NotInitialized {
            path: data_dir.to_path_buf(),
        })?;
        Ok(Witness {
            name,
            key,
            conn: Mutex::new(conn),
            clock,
        })
    }

    /// The witness's key name (its cosignature lines start `— <name> `).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The witness's verifier key (type 0x04), as logs and auditors configure it.
    pub fn verifier_key(&self) -> Result<VerifierKey, NoteError> {
        VerifierKey::new(&self.name, KeyAlg::CosignatureV1, self.key.verifying_key())
    }

    fn lock(&self) -> Result<MutexGuard<'_, Connection>, StoreError> {
        self.conn.lock().map_err(|_| StoreError::Poisoned)
    }

    fn now_secs(&self) -> u64 {
        u64::try_from(self.clock.now_ms() / 1000).unwrap_or(0)
    }

    /// Handles one `add-checkpoint` request body: the cosignature line(s) to answer 200
    /// with, or why not.
    pub fn add_checkpoint(&self, body: &[u8]) -> Result<Vec<Signature>, AddError> {
        let request = parse_add_checkpoint(body)?;
        let note = parse_note(&request.note).map_err(AddError::MalformedNote)?;
        let checkpoint = CheckpointBody::parse(note.text()).map_err(AddError::MalformedNote)?;
        for size in [request.old_size, checkpoint.size] {
            if size > MAX_TREE_SIZE {
                return Err(AddError::SizeOutOfRange(size));
            }
        }
        let origin = checkpoint.origin.clone();

        let mut conn = self.lock()?;
        let Some(log_key) = store::log_key(&conn, &origin)? else {
            return Err(AddError::UnknownOrigin(origin));
        };
        let unauthorized = |reason| AddError::Unauthorized {
            origin: origin.clone(),
            reason,
        };
        let verifier = NoteVerifier::new(&log_key.name, log_key.key).map_err(unauthorized)?;
        let log_sigs = verify_note_signature(&note, &verifier).map_err(unauthorized)?;

        let now = self.now_secs();
        let refusal = |reason: RefusalReason, status: u16| Refusal {
            origin: origin.clone(),
            at: now,
            status,
            reason,
            old_size: request.old_size,
            size: checkpoint.size,
            root: checkpoint.root,
            request: body.to_vec(),
        };
        if request.old_size > checkpoint.size {
            let refused = AddError::OldExceedsSize {
                old: request.old_size,
                size: checkpoint.size,
            };
            store::record_refusal(&conn, &refusal(RefusalReason::OldExceedsSize, 400))?;
            return Err(refused);
        }

        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::from)?;
        let latest = store::latest(&tx, &origin)?;
        let latest_size = latest.as_ref().map_or(0, |l| l.size);
        if request.old_size != latest_size {
            // Not misbehavior: the submitter is behind or ahead; it retries with this size.
            return Err(AddError::Conflict {
                old: request.old_size,
                latest: latest_size,
            });
        }
        let verdict = check_consistency(latest.as_ref(), &checkpoint, &request.proof);
        if let Err(refused) = verdict {
            let reason = match refused {
                AddError::Equivocation { .. } => RefusalReason::Equivocation,
                _ => RefusalReason::Inconsistent,
            };
            store::record_refusal(&tx, &refusal(reason, refused.status()))?;
            tx.commit().map_err(StoreError::from)?;
            return Err(refused);
        }

        let cosignature =
            note::cosign(note.text(), now, &self.name, &self.key).map_err(AddError::Cosign)?;
        let mut stored_note = note.text().to_vec();
        stored_note.push(b'\n');
        for sig in &log_sigs {
            stored_note.extend_from_slice(&sig.to_bytes());
        }
        store::put_latest(
            &tx,
            &Latest {
                origin: origin.clone(),
                size: checkpoint.size,
                root: checkpoint.root,
                note: stored_note,
                cosignature: cosignature.to_bytes(),
                cosigned_at: now,
            },
        )?;
        // Durable (synchronous = FULL) before the cosignature leaves.
        tx.commit().map_err(StoreError::from)?;
        Ok(vec![cosignature])
    }

    /// The latest checkpoint cosigned for `origin`, with its cosignature.
    pub fn latest(&self, origin: &str) -> Result<Option<Latest>, StoreError> {
        store::latest(&*self.lock()?, origin)
    }

    /// Whether `origin` is a configured log.
    pub fn knows(&self, origin: &str) -> Result<bool, StoreError> {
        Ok(store::log_key(&*self.lock()?, origin)?.is_some())
    }

    /// The refusals kept as evidence for `origin`, oldest first.
    pub fn refusals(&self, origin: &str) -> Result<Vec<Refusal>, StoreError> {
        store::refusals(&*self.lock()?, origin)
    }
}

/// Whether `new` extends `latest` (the state whose size the submitter named as `old`).
fn check_consistency(
    latest: Option<&Latest>,
    new: &CheckpointBody,
    proof: &[[u8; 32]],
) -> Result<(), AddError> {
    let inconsistent = |old| AddError::Inconsistent {
        old,
        size: new.size,
    };
    match latest {
        // Nothing cosigned yet, or an empty tree: every tree extends it, and the
        // specification says the proof from size zero is empty.
        None => proof.is_empty().then_some(()).ok_or(inconsistent(0)),
        Some(l) if l.size == new.size => {
            if l.root != new.root {
                return Err(AddError::Equivocation { size: new.size });
            }
            proof.is_empty().then_some(()).ok_or(inconsistent(l.size))
        }
        Some(l) if l.size == 0 => proof.is_empty().then_some(()).ok_or(inconsistent(0)),
        Some(l) => {
            let proof: Vec<Hash> = proof.iter().copied().map(Hash).collect();
            check_tree(&proof, new.size, Hash(new.root), l.size, Hash(l.root))
                .map_err(|_| inconsistent(l.size))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::transparency::note::{sign_checkpoint, verify_cosignature};
    use tlog_tiles::tlog::{HashReader, prove_tree, stored_hashes, tree_hash};

    const ORIGIN: &str = "postern.test/journal";

    /// An in-memory RFC 6962 tree, leaves as the audit log will make them: 8-byte
    /// big-endian seq then a 32-byte chain value.
    #[derive(Default)]
    struct Tree {
        hashes: Vec<Hash>,
        n: u64,
    }

    impl HashReader for Tree {
        fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::tlog::Error> {
            indexes
                .iter()
                .map(|&i| {
                    self.hashes
                        .get(i as usize)
                        .copied()
                        .ok_or(tlog_tiles::tlog::Error::IndexesNotInTree)
                })
                .collect()
        }
    }

    impl Tree {
        fn push(&mut self, seq: u64, chain: [u8; 32]) {
            let mut data = seq.to_be_bytes().to_vec();
            data.extend_from_slice(&chain);
            let new = stored_hashes(self.n, &data, &*self).unwrap();
            self.hashes.extend(new);
            self.n += 1;
        }

        fn with_leaves(n: u64, tweak: Option<u64>) -> Tree {
            let mut t = Tree::default();
            for seq in 0..n {
                let fill = if Some(seq) == tweak { 0xee } else { seq as u8 };
                t.push(seq, [fill; 32]);
            }
            t
        }

        fn root(&self, n: u64) -> [u8; 32] {
            tree_hash(n, self).unwrap().0
        }

        fn proof(&self, from: u64, to: u64) -> Vec<[u8; 32]> {
            prove_tree(to, from, self)
                .unwrap()
                .iter()
                .map(|h| h.0)
                .collect()
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        witness: Witness,
        log_key: SigningKey,
        clock: ManualClock,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("w");
        init_with_seed(&data, "witness.test/w1", &[9; 32]).unwrap();
        let log_key = SigningKey::from_bytes(&[1; 32]);
        let vkey = VerifierKey::new(ORIGIN, KeyAlg::Ed25519, log_key.verifying_key()).unwrap();
        add_log(&data, ORIGIN, &vkey.encode(), 0).unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let witness = Witness::open(&data, Arc::new(clock.clone())).unwrap();
        Fixture {
            _dir: dir,
            witness,
            log_key,
            clock,
        }
    }

    impl Fixture {
        fn note(&self, tree: &Tree, size: u64) -> Vec<u8> {
            sign_checkpoint(ORIGIN, size, tree.root(size), ORIGIN, &self.log_key).unwrap()
        }

        fn submit(
            &self,
            old: u64,
            proof: &[[u8; 32]],
            note: &[u8],
        ) -> Result<Vec<Signature>, AddError> {
            self.witness
                .add_checkpoint(&encode_add_checkpoint(old, proof, note))
        }
    }

    #[test]
    fn the_test_tree_is_rfc6962_over_seq_and_chain_value() {
        // Computed independently (Python hashlib): leaves SHA-256(0x00 || seq_be64 ||
        // SHA-256("chain<seq>")), nodes SHA-256(0x01 || l || r), RFC 6962 section 2.1.
        use sha2::{Digest, Sha256};
        let mut t = Tree::default();
        for seq in 0..5u64 {
            t.push(seq, Sha256::digest(format!("chain{seq}")).into());
        }
        assert_eq!(
            hex::encode(t.root(5)),
            "5d1814cd303f7fa00e9204c26c51ee2dc8577891c340acba0b7e08bc263c2a6a"
        );
    }

    #[test]
    fn request_round_trips() {
        let req = AddCheckpoint {
            old_size: 20852014,
            proof: vec![[1; 32], [2; 32]],
            note: b"note\n\n\xe2\x80\x94 x AAAA\n".to_vec(),
        };
        let encoded = encode_add_checkpoint(req.old_size, &req.proof, &req.note);
        assert!(encoded.starts_with(b"old 20852014\nAQEB"));
        assert_eq!(parse_add_checkpoint(&encoded).unwrap(), req);
        let empty = parse_add_checkpoint(b"old 0\n\nrest").unwrap();
        assert_eq!(empty.old_size, 0);
        assert!(empty.proof.is_empty());
        assert_eq!(empty.note, b"rest");
    }

    #[test]
    fn malformed_requests_are_typed_errors() {
        let hash = BASE64.encode([7u8; 32]);
        let cases: Vec<(Vec<u8>, RequestError)> = vec![
            (b"".to_vec(), RequestError::Truncated),
            (b"old 5".to_vec(), RequestError::Truncated),
            (b"old 5\n".to_vec(), RequestError::Truncated),
            (
                format!("old 5\n{hash}").into_bytes(),
                RequestError::Truncated,
            ),
            (b"old\n\n".to_vec(), RequestError::BadOldLine),
            (b"old \n\n".to_vec(), RequestError::BadOldLine),
            (b"old 05\n\n".to_vec(), RequestError::BadOldLine),
            (b"old -1\n\n".to_vec(), RequestError::BadOldLine),
            (b"old +1\n\n".to_vec(), RequestError::BadOldLine),
            (b"old 1 \n\n".to_vec(), RequestError::BadOldLine),
            (b"OLD 1\n\n".to_vec(), RequestError::BadOldLine),
            (
                b"old 18446744073709551616\n\n".to_vec(),
                RequestError::BadOldLine,
            ),
            (
                b"old 99999999999999999999999999\n\n".to_vec(),
                RequestError::BadOldLine,
            ),
            (b"old 1\r\n\n".to_vec(), RequestError::BadOldLine),
            (
                b"old 1\nnot base64!\n\n".to_vec(),
                RequestError::BadProofLine { line: 1 },
            ),
            (
                format!("old 1\n{hash}\nAAAA\n\n").into_bytes(),
                RequestError::BadProofLine { line: 2 },
            ),
            (
                format!("old 1\n{hash}=\n\n").into_bytes(),
                RequestError::BadProofLine { line: 1 },
            ),
            (
                format!("old 1\n{}\n\n", format!("{hash}\n").repeat(64).trim_end()).into_bytes(),
                RequestError::TooManyProofLines,
            ),
            (vec![b'x'; MAX_REQUEST_BYTES + 1], RequestError::TooLarge),
        ];
        for (body, expected) in cases {
            assert_eq!(
                parse_add_checkpoint(&body),
                Err(expected),
                "{:?}",
                String::from_utf8_lossy(&body[..body.len().min(80)])
            );
        }
        let max = format!("old 1\n{}\n", format!("{hash}\n").repeat(63));
        assert_eq!(
            parse_add_checkpoint(max.as_bytes()).unwrap().proof.len(),
            63
        );
        assert_eq!(
            parse_add_checkpoint(b"old 18446744073709551615\n\n")
                .unwrap()
                .old_size,
            u64::MAX
        );
    }

    #[test]
    fn the_add_checkpoint_sequence_follows_the_specification() {
        let f = fixture();
        let tree = Tree::with_leaves(12, None);
        let wkey = f.witness.verifier_key().unwrap();

        // First checkpoint: old 0, empty proof.
        let note5 = f.note(&tree, 5);
        let sigs = f.submit(0, &[], &note5).unwrap();
        assert_eq!(sigs.len(), 1);
        let text = parse_note(&note5).unwrap().text().to_vec();
        assert_eq!(
            verify_cosignature(&text, &sigs[0], &wkey.name, &wkey.key).unwrap(),
            1_700_000_000
        );

        // Extension to 9 with a proof.
        f.clock.advance_ms(5_000);
        let note9 = f.note(&tree, 9);
        f.submit(5, &tree.proof(5, 9), &note9).unwrap();
        assert_eq!(f.witness.latest(ORIGIN).unwrap().unwrap().size, 9);

        // Stale old → 409 with the latest size.
        let err = f
            .submit(5, &tree.proof(5, 12), &f.note(&tree, 12))
            .unwrap_err();
        assert!(
            matches!(err, AddError::Conflict { old: 5, latest: 9 }),
            "{err}"
        );
        assert_eq!(err.status(), 409);

        // A rewritten tree (leaf 3 changed) with a proof from 9 → 422, kept as evidence.
        let forged = Tree::with_leaves(12, Some(3));
        let forged_note = f.note(&forged, 12);
        let err = f.submit(9, &forged.proof(9, 12), &forged_note).unwrap_err();
        assert!(
            matches!(err, AddError::Inconsistent { old: 9, size: 12 }),
            "{err}"
        );
        assert_eq!(err.status(), 422);
        // The real tree's proof with the forged root fails too.
        assert!(f.submit(9, &tree.proof(9, 12), &forged_note).is_err());
        assert_eq!(f.witness.latest(ORIGIN).unwrap().unwrap().size, 9);

        // Same size, another root: an equivocation → 409, kept as evidence.
        let err = f.submit(9, &[], &f.note(&forged, 9)).unwrap_err();
        assert!(matches!(err, AddError::Equivocation { size: 9 }), "{err}");
        assert_eq!(err.status(), 409);

        // old above the size → 400.
        let err = f.submit(9, &[], &f.note(&tree, 8)).unwrap_err();
        assert!(matches!(err, AddError::OldExceedsSize { .. }));
        assert_eq!(err.status(), 400);

        // Resubmitting the same checkpoint is cosigned again.
        f.submit(9, &[], &note9).unwrap();

        let reasons: Vec<_> = f
            .witness
            .refusals(ORIGIN)
            .unwrap()
            .iter()
            .map(|r| r.reason)
            .collect();
        assert_eq!(
            reasons,
            vec![
                RefusalReason::Inconsistent,
                RefusalReason::Inconsistent,
                RefusalReason::Equivocation,
                RefusalReason::OldExceedsSize
            ]
        );
        let evidence = &f.witness.refusals(ORIGIN).unwrap()[0];
        assert_eq!(
            evidence.request,
            encode_add_checkpoint(9, &forged.proof(9, 12), &forged_note)
        );

        // The real extension still goes through.
        f.submit(9, &tree.proof(9, 12), &f.note(&tree, 12)).unwrap();
        let latest = f.witness.latest(ORIGIN).unwrap().unwrap();
        assert_eq!(latest.size, 12);
        assert_eq!(latest.root, tree.root(12));
    }

    #[test]
    fn concurrent_submissions_from_the_same_old_size_cosign_exactly_one() {
        let f = fixture();
        let tree = Tree::with_leaves(16, None);
        f.submit(0, &[], &f.note(&tree, 4)).unwrap();
        let bodies: Vec<Vec<u8>> = (5..=16)
            .map(|size| encode_add_checkpoint(4, &tree.proof(4, size), &f.note(&tree, size)))
            .collect();
        let results: Vec<Result<Vec<Signature>, AddError>> = std::thread::scope(|s| {
            let handles: Vec<_> = bodies
                .iter()
                .map(|body| s.spawn(|| f.witness.add_checkpoint(body)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<u64> = results
            .iter()
            .zip(5..=16u64)
            .filter(|(r, _)| r.is_ok())
            .map(|(_, size)| size)
            .collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(matches!(r, AddError::Conflict { old: 4, .. }), "{r}");
        }
        // Whatever won is what is stored: no later write rolled it back.
        assert_eq!(f.witness.latest(ORIGIN).unwrap().unwrap().size, winners[0]);
    }

    #[test]
    fn unknown_origins_bad_signatures_and_proofs_from_zero_are_refused() {
        let f = fixture();
        let tree = Tree::with_leaves(5, None);
        let other_origin =
            sign_checkpoint("other.test/log", 5, tree.root(5), ORIGIN, &f.log_key).unwrap();
        let err = f.submit(0, &[], &other_origin).unwrap_err();
        assert!(matches!(err, AddError::UnknownOrigin(_)));
        assert_eq!(err.status(), 404);

        let wrong_key = SigningKey::from_bytes(&[2; 32]);
        let forged = sign_checkpoint(ORIGIN, 5, tree.root(5), ORIGIN, &wrong_key).unwrap();
        let err = f.submit(0, &[], &forged).unwrap_err();
        assert!(matches!(err, AddError::Unauthorized { .. }));
        assert_eq!(err.status(), 403);

        let good = f.note(&tree, 5);
        let tampered = String::from_utf8(good.clone())
            .unwrap()
            .replace("\n5\n", "\n4\n");
        let err = f.submit(0, &[], tampered.as_bytes()).unwrap_err();
        assert_eq!(err.status(), 403);

        let err = f.submit(0, &[[0; 32]], &good).unwrap_err();
        assert!(matches!(err, AddError::Inconsistent { old: 0, .. }));
        assert!(f.witness.latest(ORIGIN).unwrap().is_none());
    }

    #[test]
    fn malformed_bodies_never_panic_and_answer_400() {
        let f = fixture();
        let tree = Tree::with_leaves(5, None);
        let note = f.note(&tree, 5);
        let good = encode_add_checkpoint(0, &[], &note);
        let huge = sign_checkpoint(ORIGIN, u64::MAX, [0; 32], ORIGIN, &f.log_key).unwrap();
        let mut bodies: Vec<Vec<u8>> = vec![
            encode_add_checkpoint(0, &[], b""),
            encode_add_checkpoint(0, &[], b"\n\n"),
            encode_add_checkpoint(0, &[], &note[..note.len() / 2]),
            encode_add_checkpoint(0, &[], &huge),
            encode_add_checkpoint(u64::MAX, &[], &note),
        ];
        for cut in 0..good.len() {
            bodies.push(good[..cut].to_vec());
        }
        for body in bodies {
            let err = f.witness.add_checkpoint(&body).unwrap_err();
            assert_eq!(
                err.status(),
                400,
                "{err} for {:?}",
                String::from_utf8_lossy(&body)
            );
        }
        // Extra lines after the note make it another (unsigned) text: 400 or 403, never 200.
        let mut extra = good.clone();
        extra.extend_from_slice(b"trailing\n");
        assert!(f.witness.add_checkpoint(&extra).is_err());
        assert!(f.witness.latest(ORIGIN).unwrap().is_none());
        f.witness.add_checkpoint(&good).unwrap();
    }

    #[test]
    fn random_proofs_against_random_sizes_are_refused_without_panicking() {
        let f = fixture();
        let tree = Tree::with_leaves(3, None);
        f.submit(0, &[], &f.note(&tree, 3)).unwrap();
        // A tiny deterministic generator: the point is shapes, not randomness quality.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..120 {
            let size = match next() % 4 {
                0 => 3 + next() % 8,
                1 => MAX_TREE_SIZE - next() % 4,
                2 => 1 << (next() % 63),
                _ => next() % 100_000,
            };
            let proof: Vec<[u8; 32]> = (0..next() % 64).map(|_| [next() as u8; 32]).collect();
            let note =
                sign_checkpoint(ORIGIN, size, [next() as u8; 32], ORIGIN, &f.log_key).unwrap();
            let result = f.submit(3, &proof, &note);
            assert!(result.is_err(), "cosigned a random proof to size {size}");
        }
        assert_eq!(f.witness.latest(ORIGIN).unwrap().unwrap().size, 3);
    }

    #[test]
    #[cfg(unix)]
    fn a_key_file_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        init_with_seed(dir.path(), "w", &[3; 32]).unwrap();
        let key = dir.path().join(KEY_FILE);
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = Witness::open(dir.path(), Arc::new(ManualClock::new(0))).unwrap_err();
        assert!(
            matches!(err, SetupError::KeyPermissions { mode: 0o640, .. }),
            "{err}"
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        Witness::open(dir.path(), Arc::new(ManualClock::new(0))).unwrap();
        // A second init never replaces the key.
        assert!(matches!(
            init_with_seed(dir.path(), "w", &[4; 32]),
            Err(SetupError::AlreadyInitialized { .. })
        ));
        std::fs::write(&key, [1u8; 31]).unwrap();
        assert!(matches!(
            Witness::open(dir.path(), Arc::new(ManualClock::new(0))),
            Err(SetupError::KeyLength { len: 31, .. })
        ));
    }

    #[test]
    fn opening_an_uninitialized_dir_says_so() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Witness::open(dir.path(), Arc::new(ManualClock::new(0))),
            Err(SetupError::NotInitialized { .. })
        ));
        assert!(matches!(
            add_log(dir.path(), ORIGIN, "x+00000000+AQ==", 0),
            Err(SetupError::Log(_))
        ));
    }
}

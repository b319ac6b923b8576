//! The audit record against a real journal file, as a tamper matrix: every test seals
//! a journal written through the ordinary lifecycle, tampers with the SQLite file (and
//! the files beside and outside it) the way an attacker with file access would, and
//! checks that verification names the first sequence number that stops verifying.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ed25519_dalek::{SigningKey, VerifyingKey};
use postern_broker::audit::merkle::{self, Frontier, check_consistency, consistency_proof};
use postern_broker::audit::{
    AuditError, ChainHasher, ChainedRow, Checkpoint, GENESIS, Outside, SIGN_INTERVAL_MS,
    SignedLate, Tamper, TreeHead, VerifyReport, verify_file, verify_file_with, verify_since,
    witness_path, write_checkpoint_file,
};
use postern_broker::clock::ManualClock;
use postern_broker::journal::{Journal, JournalError, JournalOptions};
use rusqlite::{Connection, params};

use crate::support::*;

/// Invocations written by [`sealed`]; each is `ready` (4 events) plus DISPATCH_STARTED.
const INVOCATIONS: u64 = 8;
const EVENTS: u64 = INVOCATIONS * 5;

/// A journal written and cleanly closed. The clock moves 3 s between invocations (more
/// than the signing interval), so each invocation's last checkpoint is kept; within an
/// invocation the clock stands still and checkpoints replace each other.
struct Sealed {
    _dir: tempfile::TempDir,
    db: PathBuf,
    clock: ManualClock,
    anchor: PathBuf,
}

fn sealed() -> Sealed {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    // Outside the "data dir": its own directory.
    let anchor = dir.path().join("outside").join("anchor.checkpoint");
    let clock = ManualClock::new(T0);
    let journal = open_anchored(&db, &clock, &anchor);
    for i in 0..INVOCATIONS {
        let rec = ready(&journal, &format!("inv_{i}"), false, None);
        rec.dispatch_started(FP, Some(format!("conn-{i}")), None)
            .unwrap();
        clock.advance_ms(3_000);
    }
    journal.close().unwrap();
    Sealed {
        _dir: dir,
        db,
        clock,
        anchor,
    }
}

fn open_anchored(db: &Path, clock: &ManualClock, anchor: &Path) -> Journal {
    Journal::open(
        db,
        JournalOptions {
            anchor: Some(anchor.to_path_buf()),
            ..JournalOptions::new(Arc::new(clock.clone()), signing_key())
        },
    )
    .unwrap()
}

fn key() -> VerifyingKey {
    signing_key().verifying_key()
}

fn other_key() -> SigningKey {
    SigningKey::from_bytes(&[42u8; 32])
}

fn rw(db: &Path) -> Connection {
    Connection::open(db).unwrap()
}

#[derive(Debug, Clone, PartialEq)]
struct Row {
    seq: u64,
    invocation_id: String,
    kind: String,
    body: String,
    recorded_at_ms: i64,
    hash: Vec<u8>,
}

impl Row {
    fn chained(&self) -> ChainedRow<'_> {
        ChainedRow {
            seq: self.seq,
            invocation_id: &self.invocation_id,
            kind: &self.kind,
            body: &self.body,
            recorded_at_ms: self.recorded_at_ms,
        }
    }
}

fn row(conn: &Connection, seq: u64) -> Row {
    conn.query_row(
        "SELECT seq, invocation_id, kind, body, recorded_at_ms, hash FROM events WHERE seq = ?1",
        [seq as i64],
        |r| {
            Ok(Row {
                seq: r.get::<_, i64>(0)? as u64,
                invocation_id: r.get(1)?,
                kind: r.get(2)?,
                body: r.get(3)?,
                recorded_at_ms: r.get(4)?,
                hash: r.get(5)?,
            })
        },
    )
    .unwrap()
}

fn count(conn: &Connection, table: &str) -> u64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| {
        r.get::<_, i64>(0)
    })
    .unwrap() as u64
}

fn hash_at(conn: &Connection, seq: u64) -> [u8; 32] {
    if seq == 0 {
        return GENESIS;
    }
    row(conn, seq).hash.try_into().unwrap()
}

fn checkpoint_seqs(conn: &Connection) -> Vec<u64> {
    conn.prepare("SELECT seq FROM checkpoints ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get::<_, i64>(0))
        .unwrap()
        .map(|s| s.unwrap() as u64)
        .collect()
}

/// The first kept checkpoint at or after `seq`.
fn checkpoint_covering(conn: &Connection, seq: u64) -> u64 {
    checkpoint_seqs(conn)
        .into_iter()
        .find(|&c| c >= seq)
        .unwrap()
}

fn insert_row(conn: &Connection, r: &Row) {
    conn.execute(
        "INSERT INTO events (seq, invocation_id, kind, body, recorded_at_ms, hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            r.seq as i64,
            r.invocation_id,
            r.kind,
            r.body,
            r.recorded_at_ms,
            r.hash
        ],
    )
    .unwrap();
}

/// What an attacker who knows the (public) algorithm does after editing: recompute
/// every stored hash from `from` to the end so each row links to the one before.
fn rechain_from(conn: &Connection, from: u64) {
    let mut hasher = ChainHasher::new();
    let mut head = hash_at(conn, from - 1);
    let last: i64 = conn
        .query_row("SELECT max(seq) FROM events", [], |r| r.get(0))
        .unwrap();
    for seq in from..=last as u64 {
        let r = row(conn, seq);
        head = hasher.link(&head, &r.chained());
        conn.execute(
            "UPDATE events SET hash = ?1 WHERE seq = ?2",
            params![&head[..], seq as i64],
        )
        .unwrap();
    }
}

/// The Merkle root over the events as stored (what a forger recomputes).
fn tree_root_at(conn: &Connection, size: u64) -> [u8; 32] {
    let mut frontier = Frontier::default();
    for seq in 1..=size {
        frontier.push_leaf(merkle::leaf_hash(seq, &hash_at(conn, seq)));
    }
    frontier.root()
}

/// An attacker holding the audit key: re-signs every checkpoint row over the rewritten
/// events, and rewrites the witness file and the anchor to match.
fn re_sign_everything(conn: &Connection, key: &SigningKey, db: &Path, anchor: &Path) {
    let mut last = None;
    for seq in checkpoint_seqs(conn) {
        let made_at: i64 = conn
            .query_row(
                "SELECT made_at_ms FROM checkpoints WHERE seq = ?1",
                [seq as i64],
                |r| r.get(0),
            )
            .unwrap();
        let cp = Checkpoint::sign(
            key,
            seq,
            hash_at(conn, seq),
            tree_root_at(conn, seq),
            made_at,
        )
        .with_note(key);
        conn.execute(
            "UPDATE checkpoints SET head = ?1, root = ?2, public_key = ?3, signature = ?4,
               note = ?5
             WHERE seq = ?6",
            params![
                &cp.head[..],
                &cp.root.unwrap()[..],
                &cp.public_key[..],
                &cp.signature[..],
                cp.note,
                seq as i64
            ],
        )
        .unwrap();
        last = Some(cp);
    }
    let last = last.unwrap();
    write_checkpoint_file(&witness_path(db), &last).unwrap();
    write_checkpoint_file(anchor, &last).unwrap();
}

/// Flips one ASCII byte of the body of event `seq`, keeping it valid UTF-8.
fn flip_body_byte(conn: &Connection, seq: u64) {
    let mut body = row(conn, seq).body.into_bytes();
    let i = body.iter().position(|b| b.is_ascii_lowercase()).unwrap();
    body[i] = if body[i] == b'z' { b'y' } else { body[i] + 1 };
    let body = String::from_utf8(body).unwrap();
    let n = conn
        .execute(
            "UPDATE events SET body = ?1 WHERE seq = ?2",
            params![body, seq as i64],
        )
        .unwrap();
    assert_eq!(n, 1);
}

/// The verification failure, checked for consistency with `first_bad_seq()`.
fn broken(db: &Path) -> (u64, Tamper) {
    broken_with(db, &key(), &Outside::default())
}

fn broken_with(db: &Path, key: &VerifyingKey, outside: &Outside) -> (u64, Tamper) {
    let err = match verify_file_with(db, key, outside) {
        Ok(report) => panic!("tampered journal verified: {report:?}"),
        Err(e) => e,
    };
    let AuditError::Broken {
        first_bad_seq,
        kind,
        ..
    } = err
    else {
        panic!("expected a broken chain, got {err}")
    };
    assert_eq!(err.first_bad_seq(), Some(first_bad_seq));
    assert!(
        err.to_string().contains(&first_bad_seq.to_string()),
        "{err}"
    );
    (first_bad_seq, kind)
}

fn anchored(s: &Sealed) -> Outside {
    Outside {
        anchor: Some(s.anchor.clone()),
        heads: Vec::new(),
    }
}

fn verified(db: &Path) -> VerifyReport {
    match verify_file(db, &key()) {
        Ok(r) => r,
        Err(e) => panic!("journal does not verify: {e}"),
    }
}

fn witness(db: &Path) -> Checkpoint {
    serde_json::from_slice(&std::fs::read(witness_path(db)).unwrap()).unwrap()
}

// ---------------------------------------------------------------------------------
// 1. The untouched journal, and the signing policy.

#[test]
fn an_untouched_sealed_journal_verifies_through_its_last_event() {
    let s = sealed();
    let conn = rw(&s.db);
    let rows = count(&conn, "events");
    assert_eq!(rows, EVENTS);
    let kept = checkpoint_seqs(&conn);
    assert_eq!(kept.last(), Some(&EVENTS));
    let head = hash_at(&conn, EVENTS);
    let root = tree_root_at(&conn, EVENTS);
    drop(conn);

    let report = verify_file_with(&s.db, &key(), &anchored(&s)).unwrap();
    assert_eq!(report.events, rows);
    assert_eq!(report.verified_through, EVENTS);
    assert_eq!(report.last_checkpoint_seq, Some(EVENTS));
    assert_eq!(report.checkpoints, kept.len() as u64);
    assert_eq!(report.head_hex, hex::encode(head));
    assert_eq!(report.root_hex, hex::encode(root));
    assert!(report.signed_late.is_empty());
    // The witness file and the anchor were both checked.
    assert_eq!(report.outside_checked, 2);
    // Both hold the final checkpoint, signed by the key, over the same tree.
    for cp in [
        witness(&s.db),
        serde_json::from_slice(&std::fs::read(&s.anchor).unwrap()).unwrap(),
    ] {
        assert_eq!((cp.seq, cp.head, cp.root), (EVENTS, head, Some(root)));
        assert!(cp.signature_valid(&key()));
    }
    // Verifying is a read: doing it again gives the same answer.
    assert_eq!(
        verify_file_with(&s.db, &key(), &anchored(&s)).unwrap(),
        report
    );
}

#[test]
fn every_commit_is_signed_and_checkpoints_are_kept_about_once_per_interval() {
    let f = Fixture::new();
    let conn = rw(&f.db());
    // 30 commits in one interval: each is signed when it returns, and they replace one
    // another, so the table stays small.
    for i in 0..6 {
        let rec = ready(&f.journal, &format!("inv_{i}"), false, None);
        rec.dispatch_started(FP, None, None).unwrap();
        let last: i64 = conn
            .query_row("SELECT max(seq) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(checkpoint_seqs(&conn).last(), Some(&(last as u64)));
    }
    assert!(
        checkpoint_seqs(&conn).len() <= 2,
        "{:?}",
        checkpoint_seqs(&conn)
    );
    // A new interval keeps the last checkpoint of the one before.
    let before = *checkpoint_seqs(&conn).last().unwrap();
    f.clock.advance_ms(SIGN_INTERVAL_MS + 1);
    ready(&f.journal, "inv_next", false, None);
    assert!(checkpoint_seqs(&conn).contains(&before));
    drop(conn);
    assert!(verify_file(&f.db(), &key()).is_ok());
}

#[test]
fn the_stored_hashes_are_the_public_chain_algorithm_over_the_rows() {
    let s = sealed();
    let conn = rw(&s.db);
    let mut hasher = ChainHasher::new();
    let mut head = GENESIS;
    for seq in 1..=EVENTS {
        let r = row(&conn, seq);
        head = hasher.link(&head, &r.chained());
        assert_eq!(r.hash, head.to_vec(), "hash of row {seq}");
    }
}

#[test]
fn every_kept_checkpoint_signs_the_rfc_6962_root_and_proofs_connect_them() {
    let s = sealed();
    let conn = rw(&s.db);
    let kept = checkpoint_seqs(&conn);
    assert!(kept.len() >= INVOCATIONS as usize, "{kept:?}");
    let roots: Vec<(u64, [u8; 32])> = kept
        .iter()
        .map(|&seq| {
            let root: Vec<u8> = conn
                .query_row(
                    "SELECT root FROM checkpoints WHERE seq = ?1",
                    [seq as i64],
                    |r| r.get(0),
                )
                .unwrap();
            let root: [u8; 32] = root.try_into().unwrap();
            assert_eq!(root, tree_root_at(&conn, seq), "root at {seq}");
            (seq, root)
        })
        .collect();
    // A consistency proof from every kept size to every later one, read from the
    // stored tree, checks out; a proof against a different old root does not.
    for (i, &(old, old_root)) in roots.iter().enumerate() {
        for &(new, new_root) in &roots[i..] {
            let proof = consistency_proof(&conn, new, old).unwrap();
            assert!(
                check_consistency(&proof, new, new_root, old, old_root),
                "{old}->{new}"
            );
            if old < new {
                assert!(!check_consistency(&proof, new, new_root, old, [7; 32]));
            }
        }
    }
    // Asking for a proof past the tree is an error, not a panic.
    assert!(consistency_proof(&conn, EVENTS + 5, 3).is_err());
    assert!(consistency_proof(&conn, 3, 5).is_err());
}

#[test]
fn a_journal_reopened_and_appended_to_still_verifies() {
    let s = sealed();
    let journal = open_anchored(&s.db, &s.clock, &s.anchor);
    let rec = ready(&journal, "inv_late", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    journal.close().unwrap();

    let report = verify_file_with(&s.db, &key(), &anchored(&s)).unwrap();
    assert_eq!(report.events, EVENTS + 5);
    assert_eq!(report.last_checkpoint_seq, Some(EVENTS + 5));
    assert_eq!(witness(&s.db).seq, EVENTS + 5);
}

#[test]
fn a_journal_whose_tree_table_was_lost_is_rebuilt_at_open_with_the_same_roots() {
    let s = sealed();
    let conn = rw(&s.db);
    let before: Vec<(i64, Vec<u8>)> = conn
        .prepare("SELECT idx, hash FROM merkle ORDER BY idx")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    conn.execute("DELETE FROM merkle WHERE idx % 3 = 1", [])
        .unwrap();
    drop(conn);
    let journal = open(&s.db, &s.clock);
    journal.close().unwrap();
    let conn = rw(&s.db);
    let after: Vec<(i64, Vec<u8>)> = conn
        .prepare("SELECT idx, hash FROM merkle ORDER BY idx")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(after, before);
}

#[test]
fn a_missing_witness_file_alone_is_not_tampering() {
    let s = sealed();
    std::fs::remove_file(witness_path(&s.db)).unwrap();
    let report = verified(&s.db);
    assert_eq!(report.events, EVENTS);
    assert_eq!(report.last_checkpoint_seq, Some(EVENTS));
}

#[test]
fn incremental_verification_goes_on_from_where_it_stopped() {
    let s = sealed();
    let conn = Connection::open(&s.db).unwrap();
    let (first, prefix) = verify_since(&conn, &key(), None).unwrap();
    assert_eq!(first.events, EVENTS);
    assert_eq!(prefix.seq(), EVENTS);
    drop(conn);
    let journal = open(&s.db, &s.clock);
    ready(&journal, "inv_more", false, None);
    journal.close().unwrap();
    let conn = Connection::open(&s.db).unwrap();
    let (next, prefix2) = verify_since(&conn, &key(), Some(&prefix)).unwrap();
    assert_eq!(next.events, EVENTS + 4);
    assert_eq!(next.root_hex, verified(&s.db).root_hex);
    // A change after the prefix is found; so is a change to the row it ended at.
    flip_body_byte(&conn, EVENTS + 2);
    assert_eq!(
        verify_since(&conn, &key(), Some(&prefix))
            .unwrap_err()
            .first_bad_seq(),
        Some(EVENTS + 2)
    );
    flip_body_byte(&conn, EVENTS + 2);
    conn.execute(
        "UPDATE events SET hash = zeroblob(32) WHERE seq = ?1",
        [(EVENTS + 4) as i64],
    )
    .unwrap();
    assert_eq!(
        verify_since(&conn, &key(), Some(&prefix2))
            .unwrap_err()
            .first_bad_seq(),
        Some(EVENTS + 4)
    );
}

// ---------------------------------------------------------------------------------
// 2. Modification.

#[test]
fn one_changed_body_byte_is_reported_at_its_sequence() {
    for k in [1, 7, 16, 23, EVENTS] {
        let s = sealed();
        flip_body_byte(&rw(&s.db), k);
        assert_eq!(broken(&s.db), (k, Tamper::HashMismatch), "body of {k}");
    }
}

#[test]
fn a_changed_recorded_at_is_reported_at_its_sequence() {
    let s = sealed();
    let k = 11;
    rw(&s.db)
        .execute(
            "UPDATE events SET recorded_at_ms = recorded_at_ms + 1 WHERE seq = ?1",
            [k as i64],
        )
        .unwrap();
    assert_eq!(broken(&s.db), (k, Tamper::HashMismatch));
}

#[test]
fn a_changed_kind_is_reported_at_its_sequence() {
    let s = sealed();
    let k = 15;
    let conn = rw(&s.db);
    assert_eq!(row(&conn, k).kind, "DISPATCH_STARTED");
    conn.execute(
        "UPDATE events SET kind = 'RESULT_COMMITTED' WHERE seq = ?1",
        [k as i64],
    )
    .unwrap();
    drop(conn);
    assert_eq!(broken(&s.db), (k, Tamper::HashMismatch));
}

#[test]
fn a_changed_invocation_id_is_reported_at_its_sequence() {
    let s = sealed();
    let k = 27;
    rw(&s.db)
        .execute(
            "UPDATE events SET invocation_id = 'inv_someone_else' WHERE seq = ?1",
            [k as i64],
        )
        .unwrap();
    assert_eq!(broken(&s.db), (k, Tamper::HashMismatch));
}

#[test]
fn a_changed_stored_hash_is_reported_at_its_sequence() {
    let s = sealed();
    let k = 9;
    rw(&s.db)
        .execute(
            "UPDATE events SET hash = zeroblob(32) WHERE seq = ?1",
            [k as i64],
        )
        .unwrap();
    assert_eq!(broken(&s.db), (k, Tamper::HashMismatch));
}

// ---------------------------------------------------------------------------------
// 3. Deletion.

#[test]
fn a_deleted_middle_row_is_a_sequence_gap_at_its_sequence() {
    for k in [1, 20, EVENTS - 1] {
        let s = sealed();
        rw(&s.db)
            .execute("DELETE FROM events WHERE seq = ?1", [k as i64])
            .unwrap();
        assert_eq!(broken(&s.db), (k, Tamper::SequenceGap), "deleted {k}");
    }
}

// ---------------------------------------------------------------------------------
// 4. Insertion.

/// Moves rows `k..` up by one sequence number (through negatives, so the primary key
/// never collides) and returns the original row `k`.
fn make_room_at(conn: &Connection, k: u64) -> Row {
    let original = row(conn, k);
    conn.execute_batch(&format!(
        "BEGIN;
         UPDATE events SET seq = -(seq + 1) WHERE seq >= {k};
         UPDATE events SET seq = -seq WHERE seq < 0;
         COMMIT;"
    ))
    .unwrap();
    assert_eq!(count(conn, "events"), EVENTS);
    original
}

fn forged_at(k: u64, original: &Row) -> Row {
    Row {
        seq: k,
        invocation_id: original.invocation_id.clone(),
        kind: "REQUEST_SENT".into(),
        body: r#"{"kind":"REQUEST_SENT","headers_sent":true,"body_complete":true}"#.into(),
        recorded_at_ms: original.recorded_at_ms,
        hash: original.hash.clone(),
    }
}

#[test]
fn an_inserted_row_with_a_borrowed_hash_is_reported_at_its_sequence() {
    let s = sealed();
    let k = 18;
    let conn = rw(&s.db);
    let original = make_room_at(&conn, k);
    // The forged row carries the hash that used to sit at k: a well-formed chain value.
    insert_row(&conn, &forged_at(k, &original));
    assert_eq!(count(&conn, "events"), EVENTS + 1);
    drop(conn);
    assert_eq!(broken(&s.db), (k, Tamper::HashMismatch));
}

#[test]
fn an_inserted_row_chained_correctly_breaks_the_chain_at_the_displaced_row() {
    // The attacker links the forged row to its predecessor with the public algorithm.
    // The forged row itself then verifies; the displaced original (now at k + 1) does
    // not, because its sequence number is part of its hash.
    let s = sealed();
    let k = 18;
    let conn = rw(&s.db);
    let original = make_room_at(&conn, k);
    let mut forged = forged_at(k, &original);
    forged.hash = ChainHasher::new()
        .link(&hash_at(&conn, k - 1), &forged.chained())
        .to_vec();
    insert_row(&conn, &forged);
    drop(conn);
    assert_eq!(broken(&s.db), (k + 1, Tamper::HashMismatch));
}

#[test]
fn an_inserted_row_with_the_whole_tail_rechained_is_caught_by_the_next_checkpoint() {
    let s = sealed();
    let k = 18;
    let conn = rw(&s.db);
    let original = make_room_at(&conn, k);
    insert_row(&conn, &forged_at(k, &original));
    rechain_from(&conn, k);
    let checkpoint = checkpoint_covering(&conn, k);
    drop(conn);
    assert_eq!(broken(&s.db), (checkpoint, Tamper::CheckpointMismatch));
}

// ---------------------------------------------------------------------------------
// 5. Reordering.

#[test]
fn swapped_contents_of_adjacent_rows_are_reported_at_the_first_of_them() {
    let s = sealed();
    // 5 is inv_0's DISPATCH_STARTED and 6 is inv_1's ACTION_ACCEPTED.
    let k = 5;
    let conn = rw(&s.db);
    let (a, b) = (row(&conn, k), row(&conn, k + 1));
    assert_ne!((&a.kind, &a.invocation_id), (&b.kind, &b.invocation_id));
    for (dst, src) in [(k, &b), (k + 1, &a)] {
        conn.execute(
            "UPDATE events SET invocation_id = ?1, kind = ?2, body = ?3, recorded_at_ms = ?4
             WHERE seq = ?5",
            params![
                src.invocation_id,
                src.kind,
                src.body,
                src.recorded_at_ms,
                dst as i64
            ],
        )
        .unwrap();
    }
    drop(conn);
    assert_eq!(broken(&s.db), (k, Tamper::HashMismatch));
}

#[test]
fn swapped_whole_rows_with_their_hashes_are_reported_at_the_first_of_them() {
    let s = sealed();
    let k = 21;
    let conn = rw(&s.db);
    let (a, b) = (row(&conn, k), row(&conn, k + 1));
    conn.execute_batch(&format!(
        "UPDATE events SET seq = -1 WHERE seq = {k};
         UPDATE events SET seq = {k} WHERE seq = {};
         UPDATE events SET seq = {} WHERE seq = -1;",
        k + 1,
        k + 1
    ))
    .unwrap();
    assert_eq!(row(&conn, k).hash, b.hash);
    assert_eq!(row(&conn, k + 1).hash, a.hash);
    drop(conn);
    assert_eq!(broken(&s.db), (k, Tamper::HashMismatch));
}

// ---------------------------------------------------------------------------------
// 6. A recomputed (forged) chain.

#[test]
fn a_modification_with_every_later_hash_recomputed_is_caught_by_the_signed_checkpoint() {
    for k in [5, 16, 20, 33, EVENTS] {
        let s = sealed();
        let conn = rw(&s.db);
        let checkpoint = checkpoint_covering(&conn, k);
        flip_body_byte(&conn, k);
        rechain_from(&conn, k);
        drop(conn);
        assert_eq!(
            broken(&s.db),
            (checkpoint, Tamper::CheckpointMismatch),
            "modified {k}"
        );
    }
}

#[test]
fn a_full_rewrite_with_the_chain_recomputed_and_the_checkpoints_deleted_is_unsigned() {
    let s = sealed();
    let conn = rw(&s.db);
    flip_body_byte(&conn, 3);
    rechain_from(&conn, 3);
    conn.execute("DELETE FROM checkpoints", []).unwrap();
    drop(conn);
    std::fs::remove_file(witness_path(&s.db)).unwrap();
    assert_eq!(broken(&s.db), (1, Tamper::Unsigned));
    // The anchor outside still holds the signed head of the original.
    assert_eq!(
        broken_with(&s.db, &key(), &anchored(&s)),
        (EVENTS, Tamper::CheckpointMismatch)
    );
}

#[test]
fn a_rewrite_re_signed_with_the_stolen_audit_key_is_caught_only_by_a_witness() {
    let s = sealed();
    // What a witness cosigned before the theft: the tree at the last checkpoint.
    let conn = rw(&s.db);
    let cosigned = TreeHead {
        size: EVENTS,
        root: tree_root_at(&conn, EVENTS),
        source: "witness w1".into(),
        witness: Some("w1".into()),
    };
    flip_body_byte(&conn, 12);
    rechain_from(&conn, 12);
    re_sign_everything(&conn, &signing_key(), &s.db, &s.anchor);
    drop(conn);
    // Everything local agrees with the forgery: the key is the broker's own.
    verify_file_with(&s.db, &key(), &anchored(&s)).unwrap();
    let outside = Outside {
        anchor: Some(s.anchor.clone()),
        heads: vec![cosigned],
    };
    let err = verify_file_with(&s.db, &key(), &outside).unwrap_err();
    assert_eq!(err.first_bad_seq(), Some(EVENTS));
    assert!(err.to_string().contains("witness w1"), "{err}");
    assert!(matches!(
        err,
        AuditError::Broken {
            kind: Tamper::CheckpointMismatch,
            ..
        }
    ));
}

// ---------------------------------------------------------------------------------
// 7. and 8. Truncation, and checkpoints that vanish.

#[test]
fn a_truncated_tail_behind_a_checkpoint_is_reported_at_the_first_missing_sequence() {
    for m in [1, 4, 8] {
        let s = sealed();
        rw(&s.db)
            .execute("DELETE FROM events WHERE seq > ?1", [(EVENTS - m) as i64])
            .unwrap();
        assert_eq!(
            broken(&s.db),
            (EVENTS - m + 1, Tamper::Truncated),
            "cut {m}"
        );
    }
}

#[test]
fn a_truncated_tail_with_its_checkpoint_rows_deleted_is_caught_by_the_witness_file() {
    for keep in [36, 30, 10] {
        let s = sealed();
        let conn = rw(&s.db);
        conn.execute("DELETE FROM events WHERE seq > ?1", [keep as i64])
            .unwrap();
        conn.execute("DELETE FROM checkpoints WHERE seq > ?1", [keep as i64])
            .unwrap();
        drop(conn);
        assert!(witness_path(&s.db).exists());
        assert_eq!(broken(&s.db), (keep + 1, Tamper::Truncated), "kept {keep}");
    }
}

#[test]
fn a_tail_cut_at_a_checkpoint_with_the_witness_file_deleted_is_caught_by_the_anchor() {
    let s = sealed();
    let conn = rw(&s.db);
    // Cut back to an earlier kept checkpoint, so what is left is signed throughout.
    let keep = checkpoint_seqs(&conn)
        .into_iter()
        .rev()
        .find(|&c| c < EVENTS - 5)
        .unwrap();
    conn.execute("DELETE FROM events WHERE seq > ?1", [keep as i64])
        .unwrap();
    conn.execute("DELETE FROM checkpoints WHERE seq > ?1", [keep as i64])
        .unwrap();
    drop(conn);
    std::fs::remove_file(witness_path(&s.db)).unwrap();
    // The data dir alone cannot tell: it is a shorter journal, signed throughout.
    assert_eq!(verified(&s.db).events, keep);
    assert_eq!(
        broken_with(&s.db, &key(), &anchored(&s)),
        (keep + 1, Tamper::Truncated)
    );
}

#[test]
fn a_journal_emptied_of_events_and_checkpoints_is_caught_by_the_witness_file() {
    let s = sealed();
    rw(&s.db)
        .execute_batch("DELETE FROM events; DELETE FROM checkpoints;")
        .unwrap();
    assert_eq!(broken(&s.db), (1, Tamper::Truncated));
}

#[test]
fn deleting_the_newest_checkpoints_leaves_unsigned_events() {
    let s = sealed();
    let conn = rw(&s.db);
    let kept = checkpoint_seqs(&conn);
    let previous = kept[kept.len() - 2];
    conn.execute("DELETE FROM checkpoints WHERE seq > ?1", [previous as i64])
        .unwrap();
    drop(conn);
    std::fs::remove_file(witness_path(&s.db)).unwrap();
    let err = verify_file(&s.db, &key()).unwrap_err();
    assert_eq!(err.first_bad_seq(), Some(previous + 1));
    assert_eq!(err.unsigned_events(), Some(EVENTS - previous));
    assert!(
        err.to_string().contains(&format!(
            "{} events after sequence {previous}",
            EVENTS - previous
        )),
        "{err}"
    );
}

#[test]
fn checkpoints_removed_from_the_middle_are_a_late_signature() {
    let s = sealed();
    let conn = rw(&s.db);
    let kept = checkpoint_seqs(&conn);
    // Keep the first and the last; everything between them goes.
    let (first, last) = (kept[0], *kept.last().unwrap());
    conn.execute(
        "DELETE FROM checkpoints WHERE seq > ?1 AND seq < ?2",
        params![first as i64, last as i64],
    )
    .unwrap();
    drop(conn);
    // The last checkpoint still signs the whole tree, but it was made ~21 s after the
    // events that follow the first one.
    assert_eq!(broken(&s.db), (first + 1, Tamper::LateSignature));
}

#[test]
fn a_tail_a_previous_run_left_unsigned_is_signed_at_the_next_start_and_said_so() {
    let s = sealed();
    let conn = rw(&s.db);
    let kept = checkpoint_seqs(&conn);
    let previous = kept[kept.len() - 2];
    // What a run of an earlier version leaves after a crash: no checkpoint over the
    // tail, and a witness file from before it.
    conn.execute("DELETE FROM checkpoints WHERE seq > ?1", [previous as i64])
        .unwrap();
    drop(conn);
    std::fs::remove_file(witness_path(&s.db)).unwrap();
    s.clock.advance_ms(60_000);
    let journal = open(&s.db, &s.clock);
    journal.close().unwrap();
    let report = verified(&s.db);
    assert_eq!(report.events, EVENTS + 1);
    assert_eq!(
        report.signed_late,
        vec![SignedLate {
            first: previous + 1,
            last: EVENTS,
            at: EVENTS + 1,
        }]
    );
    let r = row(&rw(&s.db), EVENTS + 1);
    assert_eq!(
        (r.invocation_id.as_str(), r.kind.as_str()),
        ("journal", "SIGNING_RESUMED")
    );
}

#[test]
fn a_torn_last_page_is_damage_not_a_pass() {
    let s = sealed();
    // Fold the WAL in so the main file holds every page, then cut the last one short.
    rw(&s.db)
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let bytes = std::fs::read(&s.db).unwrap();
    std::fs::write(&s.db, &bytes[..bytes.len() - 1000]).unwrap();
    let err = verify_file(&s.db, &key()).unwrap_err();
    assert!(
        matches!(
            err,
            AuditError::Damaged { .. } | AuditError::Unreadable { .. }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("journal.db"), "{err}");
}

// ---------------------------------------------------------------------------------
// 9. Keys and signatures.

fn checkpoint_row(conn: &Connection, seq: u64) -> Checkpoint {
    let (head, root, made_at_ms): (Vec<u8>, Vec<u8>, i64) = conn
        .query_row(
            "SELECT head, root, made_at_ms FROM checkpoints WHERE seq = ?1",
            [seq as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    Checkpoint::sign(
        &signing_key(),
        seq,
        head.try_into().unwrap(),
        root.try_into().unwrap(),
        made_at_ms,
    )
}

#[test]
fn a_checkpoint_re_signed_by_another_key_is_a_bad_signature() {
    let s = sealed();
    let conn = rw(&s.db);
    let seq = checkpoint_seqs(&conn)[1];
    let cp = checkpoint_row(&conn, seq);
    // Same statement, same head and root: only the signer differs.
    let forged = Checkpoint::sign(&other_key(), seq, cp.head, cp.root.unwrap(), cp.made_at_ms);
    conn.execute(
        "UPDATE checkpoints SET public_key = ?1, signature = ?2 WHERE seq = ?3",
        params![&forged.public_key[..], &forged.signature[..], seq as i64],
    )
    .unwrap();
    drop(conn);
    assert_eq!(broken(&s.db), (seq, Tamper::BadSignature));
}

#[test]
fn a_checkpoint_signed_by_another_key_but_claiming_the_audit_key_is_a_bad_signature() {
    let s = sealed();
    let conn = rw(&s.db);
    let seq = checkpoint_seqs(&conn)[2];
    let cp = checkpoint_row(&conn, seq);
    let forged = Checkpoint::sign(&other_key(), seq, cp.head, cp.root.unwrap(), T0);
    conn.execute(
        "UPDATE checkpoints SET signature = ?1, made_at_ms = ?2 WHERE seq = ?3",
        params![&forged.signature[..], forged.made_at_ms, seq as i64],
    )
    .unwrap();
    drop(conn);
    assert_eq!(broken(&s.db), (seq, Tamper::BadSignature));
}

#[test]
fn an_edited_checkpoint_head_root_or_time_is_a_bad_signature() {
    for column in ["head", "root"] {
        let s = sealed();
        let conn = rw(&s.db);
        let seq = checkpoint_seqs(&conn)[2];
        conn.execute(
            &format!("UPDATE checkpoints SET {column} = zeroblob(32) WHERE seq = ?1"),
            [seq as i64],
        )
        .unwrap();
        drop(conn);
        assert_eq!(broken(&s.db), (seq, Tamper::BadSignature), "{column}");
    }
    // Moving a checkpoint's time back to hide a late signature breaks its signature.
    let s = sealed();
    let conn = rw(&s.db);
    let seq = checkpoint_seqs(&conn)[2];
    conn.execute(
        "UPDATE checkpoints SET made_at_ms = made_at_ms - 1 WHERE seq = ?1",
        [seq as i64],
    )
    .unwrap();
    drop(conn);
    assert_eq!(broken(&s.db), (seq, Tamper::BadSignature));
}

#[test]
fn a_witness_file_signed_by_another_key_is_a_bad_signature() {
    let s = sealed();
    let w = witness(&s.db);
    let forged = Checkpoint::sign(&other_key(), w.seq, w.head, w.root.unwrap(), w.made_at_ms);
    std::fs::write(witness_path(&s.db), serde_json::to_vec(&forged).unwrap()).unwrap();
    assert_eq!(broken(&s.db), (EVENTS, Tamper::BadSignature));
}

#[test]
fn an_untouched_journal_does_not_verify_against_another_key() {
    let s = sealed();
    let first = checkpoint_seqs(&rw(&s.db))[0];
    assert_eq!(
        broken_with(&s.db, &other_key().verifying_key(), &Outside::default()),
        (first, Tamper::BadSignature)
    );
}

#[test]
fn a_journal_signed_throughout_by_another_key_does_not_verify_against_the_audit_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    let clock = ManualClock::new(T0);
    let journal = Journal::open(
        &db,
        JournalOptions::new(Arc::new(clock.clone()), other_key()),
    )
    .unwrap();
    for i in 0..4 {
        ready(&journal, &format!("inv_{i}"), false, None);
    }
    journal.close().unwrap();
    // Self-consistent under its own key.
    let own = verify_file(&db, &other_key().verifying_key()).unwrap();
    assert_eq!(own.events, 16);
    let first = checkpoint_seqs(&rw(&db))[0];
    assert_eq!(broken(&db), (first, Tamper::BadSignature));
}

// ---------------------------------------------------------------------------------
// Bad input: files that are not (usable) Postern journals.

fn options(clock: &ManualClock) -> JournalOptions {
    JournalOptions::new(Arc::new(clock.clone()), signing_key())
}

/// Opens `path` expecting a refusal; checks the file and its directory are left as
/// they were and the message names the file.
fn refused(path: &Path) -> JournalError {
    let before = std::fs::read(path).unwrap();
    let err = match Journal::open(path, options(&ManualClock::new(T0))) {
        Ok(_) => panic!("{} was opened as a journal", path.display()),
        Err(e) => e,
    };
    assert_unchanged(path, &before, &err.to_string());
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        assert!(
            !Path::new(&side).exists(),
            "refusing {} left {suffix} behind ({err})",
            path.display()
        );
    }
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "message does not name the file: {err}"
    );
    err
}

/// Byte-for-byte equality, reported as the first differing offset rather than a dump.
fn assert_unchanged(path: &Path, before: &[u8], context: &str) {
    let after = std::fs::read(path).unwrap();
    if after != before {
        let at = before
            .iter()
            .zip(&after)
            .position(|(a, b)| a != b)
            .unwrap_or(before.len().min(after.len()));
        panic!(
            "{} was modified ({context}): {} bytes before, {} after, first difference at \
             offset {at} ({:?} -> {:?})",
            path.display(),
            before.len(),
            after.len(),
            before.get(at),
            after.get(at),
        );
    }
}

/// Deterministic noise (xorshift), never starting with the SQLite magic.
fn garbage(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn bad_input_garbage_bytes_are_refused_as_corrupt_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    std::fs::write(&path, garbage(16 * 1024)).unwrap();
    let err = refused(&path);
    let JournalError::Corrupt { path: named, .. } = &err else {
        panic!("expected Corrupt, got {err}")
    };
    assert_eq!(named, &path);
}

#[test]
fn bad_input_a_sqlite_header_over_garbage_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend(garbage(8 * 1024));
    std::fs::write(&path, bytes).unwrap();
    let err = refused(&path);
    assert!(
        matches!(
            err,
            JournalError::Corrupt { .. } | JournalError::Open { .. }
        ),
        "{err}"
    );
}

// Fails today: `schema::configure` runs `PRAGMA journal_mode = WAL` before `migrate`
// checks the application id, so the foreign file's header (bytes 18-19) is rewritten
// from rollback-journal to WAL before it is refused.
#[test]
fn bad_input_another_applications_database_is_refused_as_foreign_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    {
        // An ordinary SQLite file in the default (rollback journal) mode.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE foo (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO foo (name) VALUES ('bar');",
        )
        .unwrap();
    }
    let err = refused(&path);
    let JournalError::Foreign { path: named } = &err else {
        panic!("expected Foreign, got {err}")
    };
    assert_eq!(named, &path);
    // Still the other application's database, in its own journal mode.
    let conn = Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    let name: String = conn
        .query_row("SELECT name FROM foo", [], |r| r.get(0))
        .unwrap();
    assert_eq!(name, "bar");
}

#[test]
fn bad_input_a_journal_from_a_newer_schema_is_refused_and_left_untouched() {
    let s = sealed();
    {
        let conn = rw(&s.db);
        conn.execute_batch("PRAGMA user_version = 99").unwrap();
    }
    let err = refused(&s.db);
    let JournalError::NewerSchema {
        path: named,
        found,
        supported,
    } = &err
    else {
        panic!("expected NewerSchema, got {err}")
    };
    assert_eq!(named, &s.db);
    assert_eq!(*found, 99);
    assert!(*supported < 99);
    // Still readable by the newer build's verifier: nothing was rewritten.
    assert_eq!(verified(&s.db).events, EVENTS);
}

#[test]
fn bad_input_a_journal_cut_to_half_its_size_is_refused_without_panicking() {
    let s = sealed();
    // A larger file, so that half of it loses real pages.
    let journal = open(&s.db, &s.clock);
    for i in 0..40 {
        ready(&journal, &format!("inv_more_{i}"), false, None);
    }
    journal.close().unwrap();
    let bytes = std::fs::read(&s.db).unwrap();
    assert!(bytes.len() >= 8 * 4096, "journal is {} bytes", bytes.len());
    std::fs::write(&s.db, &bytes[..bytes.len() / 2]).unwrap();
    let err = refused(&s.db);
    assert!(
        matches!(
            err,
            JournalError::Corrupt { .. } | JournalError::Open { .. } | JournalError::Damaged { .. }
        ),
        "expected Corrupt, Open or Damaged, got {err:?}"
    );
}

#[test]
fn bad_input_verify_file_on_garbage_is_unreadable_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let bytes = garbage(16 * 1024);
    std::fs::write(&path, &bytes).unwrap();
    let err = verify_file(&path, &key()).unwrap_err();
    assert!(matches!(err, AuditError::Unreadable { .. }), "{err}");
    assert_eq!(err.first_bad_seq(), None);
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert_unchanged(&path, &bytes, "verify_file");
}

#[test]
fn bad_input_verify_file_on_a_missing_or_foreign_file_is_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing.db");
    let err = verify_file(&missing, &key()).unwrap_err();
    assert!(matches!(err, AuditError::Unreadable { .. }), "{err}");
    assert!(!missing.exists(), "verifying created the file");

    let foreign = dir.path().join("other.db");
    Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE foo (x)")
        .unwrap();
    let err = verify_file(&foreign, &key()).unwrap_err();
    assert!(matches!(err, AuditError::Unreadable { .. }), "{err}");
    assert!(err.to_string().contains("other.db"), "{err}");
}

#[test]
fn bad_input_an_unparsable_witness_file_is_unreadable_not_a_pass() {
    let s = sealed();
    std::fs::write(witness_path(&s.db), b"not json").unwrap();
    let err = verify_file(&s.db, &key()).unwrap_err();
    assert!(matches!(err, AuditError::Unreadable { .. }), "{err}");
}

#[test]
fn bad_input_a_malformed_checkpoint_row_is_a_bad_signature_not_a_panic() {
    let s = sealed();
    rw(&s.db)
        .execute(
            "UPDATE checkpoints SET signature = x'00' WHERE seq = ?1",
            [EVENTS as i64],
        )
        .unwrap();
    assert_eq!(broken(&s.db), (EVENTS, Tamper::BadSignature));
}

#[test]
fn the_audit_signing_key_is_created_once_in_the_keychain_and_reused() {
    if std::env::var_os("POSTERN_TEST_SKIP_SECRET_SERVICE").is_some_and(|v| v == "1") {
        return;
    }
    use postern_broker::vault::{Keychain, KeychainBackend, Vault};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    let service = format!("postern-test-audit-{}", std::process::id());
    let vault = Vault::open(
        Keychain::new(KeychainBackend::SecretService, &service).unwrap(),
        &db,
    )
    .unwrap();
    let first = postern_broker::audit::signing_key_from_vault(&vault, 1).unwrap();
    let again = postern_broker::audit::signing_key_from_vault(&vault, 2).unwrap();
    assert_eq!(first.to_bytes(), again.to_bytes());
    // The seed is in the keychain, not in the database.
    // The vault's connection is still open, so what it wrote may be in the WAL file.
    let mut bytes = std::fs::read(&db).unwrap();
    if let Ok(wal) = std::fs::read(db.with_extension("db-wal")) {
        bytes.extend(wal);
    }
    assert!(!bytes.windows(32).any(|w| w == first.to_bytes()));
    vault.remove("postern-audit-signing").unwrap();
}

// ---------------------------------------------------------------------------------
// Journals from before the Merkle tree and per-batch signing.

#[test]
fn a_journal_from_before_the_tree_is_upgraded_at_open_and_its_old_checkpoints_still_count() {
    let s = sealed();
    let conn = rw(&s.db);
    // What the previous version left: chain-only checkpoints every 16 events, an
    // unsigned tail after the last one, no tree.
    conn.execute_batch(
        "DROP TABLE merkle; DROP TABLE cosignatures; DELETE FROM checkpoints;
         ALTER TABLE checkpoints DROP COLUMN root; ALTER TABLE checkpoints DROP COLUMN note;
         DROP INDEX invocations_by_parent; ALTER TABLE invocations DROP COLUMN parent_id;
         ALTER TABLE invocations DROP COLUMN relation;
         PRAGMA user_version = 6;",
    )
    .unwrap();
    for seq in [16u64, 32] {
        let cp = Checkpoint::sign_chain_only(&signing_key(), seq, hash_at(&conn, seq), T0);
        conn.execute(
            "INSERT INTO checkpoints (seq, head, count, public_key, signature, made_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                seq as i64,
                &cp.head[..],
                seq as i64,
                &cp.public_key[..],
                &cp.signature[..],
                T0
            ],
        )
        .unwrap();
    }
    drop(conn);
    std::fs::remove_file(witness_path(&s.db)).unwrap();
    // Before the new broker opens it, the old tail is unsigned.
    assert_eq!(broken(&s.db), (33, Tamper::Unsigned));

    let journal = open(&s.db, &s.clock);
    journal.close().unwrap();
    let report = verified(&s.db);
    assert_eq!(report.events, EVENTS + 1);
    assert_eq!(
        report.signed_late,
        vec![SignedLate {
            first: 33,
            last: EVENTS,
            at: EVENTS + 1
        }]
    );
    // The tree now covers every event, old ones included.
    let conn = rw(&s.db);
    assert_eq!(
        hex::encode(tree_root_at(&conn, EVENTS + 1)),
        report.root_hex
    );
    // An edit to an old, chain-only-signed event is still found at its sequence.
    flip_body_byte(&conn, 10);
    drop(conn);
    assert_eq!(broken(&s.db), (10, Tamper::HashMismatch));
}

#[test]
fn the_published_checkpoint_carries_the_c2sp_note_a_witness_opens() {
    use postern_broker::audit::log_origin;
    use postern_broker::transparency::note::open_checkpoint;
    let s = sealed();
    let origin = log_origin(&key());
    // The witness file and the anchor hold the newest checkpoint with its note.
    for cp in [
        witness(&s.db),
        serde_json::from_slice(&std::fs::read(&s.anchor).unwrap()).unwrap(),
    ] {
        let note = cp
            .note
            .clone()
            .expect("a published checkpoint has its note");
        let body = open_checkpoint(note.as_bytes(), &origin, &origin, &key()).unwrap();
        assert_eq!((body.size, Some(body.root)), (cp.seq, cp.root));
    }
    // A note that does not say what the checkpoint says fails verification at it.
    let mut w = witness(&s.db);
    let other = checkpoint_seqs(&rw(&s.db))[0];
    w.note = Checkpoint::sign(&signing_key(), other, w.head, [9; 32], w.made_at_ms)
        .with_note(&signing_key())
        .note;
    std::fs::write(witness_path(&s.db), serde_json::to_vec(&w).unwrap()).unwrap();
    assert_eq!(broken(&s.db), (EVENTS, Tamper::BadSignature));
}

#[test]
fn a_recorded_cosignature_is_kept_and_read_back() {
    let f = Fixture::new();
    ready(&f.journal, "inv_c", false, None);
    f.journal
        .record_cosignature(4, "witness.test/w1", "note".into(), "line".into())
        .unwrap();
    assert_eq!(f.journal.cosigned_size("witness.test/w1").unwrap(), Some(4));
    let n: i64 = rw(&f.db())
        .query_row("SELECT count(*) FROM cosignatures", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn an_operators_pause_is_a_journal_record_the_chain_covers_and_a_reopen_reads() {
    let f = Fixture::new();
    assert!(!f.journal.agent_pause().unwrap(), "never paused");
    f.journal.record_agent_pause(true, "alice").unwrap();
    assert!(f.journal.agent_pause().unwrap());
    f.journal.record_agent_pause(false, "alice").unwrap();
    f.journal.record_agent_pause(true, "bob").unwrap();
    let f = f.reopen();
    assert!(f.journal.agent_pause().unwrap(), "the newest record wins");
    let db = f.db();
    f.journal.close().unwrap();
    let report = verified(&db);
    assert_eq!(report.events, 3);
}

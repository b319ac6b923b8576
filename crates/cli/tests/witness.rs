//! `postern witness` as a separate process: a real witness over HTTP on 127.0.0.1, fed
//! checkpoints of a log built here with tlog_tiles, killed with SIGKILL and restarted on
//! the same data dir.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use ed25519_dalek::SigningKey;
use postern_broker::transparency::client::{WitnessError, fetch_latest, submit};
use postern_broker::transparency::note::{
    KeyAlg, VerifierKey, open_cosigned, parse_note, sign_checkpoint, verify_cosignature,
};
use tlog_tiles::tlog::{Hash, HashReader, prove_tree, stored_hashes, tree_hash};

mod support;
use support::serve_witness;

const POSTERN: &str = env!("CARGO_BIN_EXE_postern");
const ORIGIN: &str = "postern.test/journal";
const WITNESS_NAME: &str = "witness.test/w1";

/// An RFC 6962 tree in memory; leaves as the audit log makes them: the 8-byte
/// big-endian sequence number, then the row's 32-byte chain value.
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
    /// `n` leaves; `rewritten` replaces the chain value of that one leaf.
    fn new(n: u64, rewritten: Option<u64>) -> Tree {
        let mut t = Tree::default();
        for seq in 0..n {
            let mut chain = [0x5a; 32];
            chain[..8].copy_from_slice(&seq.to_le_bytes());
            if Some(seq) == rewritten {
                chain = [0xee; 32];
            }
            let mut data = seq.to_be_bytes().to_vec();
            data.extend_from_slice(&chain);
            let new = stored_hashes(t.n, &data, &t).unwrap();
            t.hashes.extend(new);
            t.n += 1;
        }
        t
    }

    fn root(&self, size: u64) -> [u8; 32] {
        tree_hash(size, self).unwrap().0
    }

    fn proof(&self, from: u64, to: u64) -> Vec<[u8; 32]> {
        prove_tree(to, from, self)
            .unwrap()
            .iter()
            .map(|h| h.0)
            .collect()
    }
}

fn postern(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(POSTERN)
        .arg("witness")
        .args(&args[..1])
        .arg("--data-dir")
        .arg(dir)
        .args(&args[1..])
        .output()
        .unwrap()
}

/// A witness data dir with the test log added; returns the witness's verifier key.
fn init(dir: &Path, log_key: &SigningKey) -> VerifierKey {
    let out = postern(&["init", "--name", WITNESS_NAME], dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vkey = VerifierKey::parse(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    assert_eq!(vkey.name, WITNESS_NAME);
    assert_eq!(vkey.alg, KeyAlg::CosignatureV1);
    let log_vkey = VerifierKey::new(ORIGIN, KeyAlg::Ed25519, log_key.verifying_key())
        .unwrap()
        .encode();
    let out = postern(&["add-log", "--origin", ORIGIN, "--key", &log_vkey], dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    vkey
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn witness_cosigns_extensions_refuses_rewrites_and_remembers_across_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("witness");
    let log_key = SigningKey::from_bytes(&[0x11; 32]);
    let witness_key = init(&data, &log_key);
    let served = serve_witness(&data);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let tree = Tree::new(12, None);
    let note = |t: &Tree, size: u64, key: &SigningKey| {
        sign_checkpoint(ORIGIN, size, t.root(size), ORIGIN, key).unwrap()
    };

    // Size 5 from nothing: 200, and the cosignature verifies with the witness key.
    let note5 = note(&tree, 5, &log_key);
    let before = now();
    let sigs = rt
        .block_on(submit(&client, &served.url, 0, &[], &note5))
        .unwrap();
    assert_eq!(sigs.len(), 1);
    let text5 = parse_note(&note5).unwrap().text().to_vec();
    let time = verify_cosignature(&text5, &sigs[0], &witness_key.name, &witness_key.key).unwrap();
    assert!((before..=now()).contains(&time), "cosigned at {time}");

    // Size 9 with a consistency proof from 5: 200.
    let note9 = note(&tree, 9, &log_key);
    let sigs = rt
        .block_on(submit(&client, &served.url, 5, &tree.proof(5, 9), &note9))
        .unwrap();
    let text9 = parse_note(&note9).unwrap().text().to_vec();
    verify_cosignature(&text9, &sigs[0], &witness_key.name, &witness_key.key).unwrap();

    // A rewritten tree of size 12 (another leaf 3) with its own proof from 9: 422.
    let rewritten = Tree::new(12, Some(3));
    let forged = note(&rewritten, 12, &log_key);
    let err = rt
        .block_on(submit(
            &client,
            &served.url,
            9,
            &rewritten.proof(9, 12),
            &forged,
        ))
        .unwrap_err();
    assert!(
        matches!(err, WitnessError::Refused { status: 422, .. }),
        "{err}"
    );

    // Same size, another root: an equivocation, 409 but not a size conflict.
    let err = rt
        .block_on(submit(
            &client,
            &served.url,
            9,
            &[],
            &note(&rewritten, 9, &log_key),
        ))
        .unwrap_err();
    assert!(
        matches!(err, WitnessError::Refused { status: 409, .. }),
        "{err}"
    );

    // A stale old size: 409 text/x.tlog.size with the witness's size.
    let err = rt
        .block_on(submit(
            &client,
            &served.url,
            5,
            &tree.proof(5, 12),
            &note(&tree, 12, &log_key),
        ))
        .unwrap_err();
    assert!(
        matches!(err, WitnessError::Conflict { witness_size: 9 }),
        "{err}"
    );

    // A checkpoint signed by another key: 403.
    let stranger = SigningKey::from_bytes(&[0x22; 32]);
    let err = rt
        .block_on(submit(
            &client,
            &served.url,
            9,
            &tree.proof(9, 12),
            &note(&tree, 12, &stranger),
        ))
        .unwrap_err();
    assert!(
        matches!(err, WitnessError::Refused { status: 403, .. }),
        "{err}"
    );

    // An origin the witness does not serve: 404.
    let other = sign_checkpoint("other.test/log", 5, tree.root(5), ORIGIN, &log_key).unwrap();
    let err = rt
        .block_on(submit(&client, &served.url, 0, &[], &other))
        .unwrap_err();
    assert!(
        matches!(err, WitnessError::Refused { status: 404, .. }),
        "{err}"
    );

    // None of the refusals moved the witness: it still holds 9.
    let latest = rt
        .block_on(fetch_latest(&client, &served.url, ORIGIN))
        .unwrap()
        .unwrap();
    let opened = open_cosigned(
        &latest,
        ORIGIN,
        ORIGIN,
        &log_key.verifying_key(),
        &witness_key.name,
        &witness_key.key,
    )
    .unwrap();
    assert_eq!(opened.body.size, 9);

    // SIGKILL, restart on the same data dir: size 9 is still what it knows.
    served.kill_9();
    let served = serve_witness(&data);
    let err = rt
        .block_on(submit(&client, &served.url, 0, &[], &note9))
        .unwrap_err();
    assert!(
        matches!(err, WitnessError::Conflict { witness_size: 9 }),
        "{err}"
    );

    // GET latest: the size-9 note, with the log's signature and a valid cosignature.
    let latest = rt
        .block_on(fetch_latest(&client, &served.url, ORIGIN))
        .unwrap()
        .unwrap();
    let opened = open_cosigned(
        &latest,
        ORIGIN,
        ORIGIN,
        &log_key.verifying_key(),
        &witness_key.name,
        &witness_key.key,
    )
    .unwrap();
    assert_eq!(opened.body.size, 9);
    assert_eq!(opened.body.root, tree.root(9));
    assert!(
        rt.block_on(fetch_latest(&client, &served.url, "other.test/log"))
            .unwrap()
            .is_none()
    );

    // And it still extends from 9 after the restart.
    rt.block_on(submit(
        &client,
        &served.url,
        9,
        &tree.proof(9, 12),
        &note(&tree, 12, &log_key),
    ))
    .unwrap();
}

#[test]
fn a_stale_old_size_answers_409_with_the_tlog_size_content_type() {
    let dir = tempfile::tempdir().unwrap();
    let log_key = SigningKey::from_bytes(&[0x33; 32]);
    init(dir.path(), &log_key);
    let served = serve_witness(dir.path());
    let tree = Tree::new(4, None);
    let note4 = sign_checkpoint(ORIGIN, 4, tree.root(4), ORIGIN, &log_key).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    rt.block_on(submit(&client, &served.url, 0, &[], &note4))
        .unwrap();

    let mut body = b"old 0\n\n".to_vec();
    body.extend_from_slice(&note4);
    let response = rt
        .block_on(
            client
                .post(format!("{}/add-checkpoint", served.url))
                .body(body)
                .send(),
        )
        .unwrap();
    assert_eq!(response.status().as_u16(), 409);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/x.tlog.size"
    );
    assert_eq!(rt.block_on(response.text()).unwrap(), "4\n");

    // Malformed bodies are 400, an oversized one 413, other paths 404/405.
    for (body, status) in [
        (b"old 01\n\n".to_vec(), 400),
        (b"garbage".to_vec(), 400),
        (vec![b'a'; 70 * 1024], 413),
    ] {
        let response = rt
            .block_on(
                client
                    .post(format!("{}/add-checkpoint", served.url))
                    .body(body)
                    .send(),
            )
            .unwrap();
        assert_eq!(response.status().as_u16(), status);
    }
    let get = rt
        .block_on(client.get(format!("{}/add-checkpoint", served.url)).send())
        .unwrap();
    assert_eq!(get.status().as_u16(), 405);
    let nowhere = rt
        .block_on(client.get(format!("{}/elsewhere", served.url)).send())
        .unwrap();
    assert_eq!(nowhere.status().as_u16(), 404);
}

#[test]
fn serve_refuses_a_key_file_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    init(dir.path(), &SigningKey::from_bytes(&[0x44; 32]));
    let key = dir.path().join("witness.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = postern(&["serve", "--listen", "127.0.0.1:0"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("0600"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn every_witness_subcommand_help_shows_an_example() {
    for command in [
        &["witness"][..],
        &["witness", "init"],
        &["witness", "add-log"],
        &["witness", "serve"],
    ] {
        let out = Command::new(POSTERN)
            .args(command)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{command:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("Example"),
            "{command:?} help has no example:\n{text}"
        );
        assert!(text.contains("postern witness "), "{command:?}:\n{text}");
    }
}

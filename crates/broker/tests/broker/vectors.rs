//! Known-answer vectors for the hashes a verifier outside this code base must be able
//! to recompute: the audit chain link, the Merkle tree over it (leaves, roots and
//! consistency proofs), and the target configuration version. The expected values were
//! computed from the encodings documented in `src/audit/` and `src/config.rs` by
//! independent implementations (`tests/vectors/make_vectors.py`,
//! `tests/vectors/make_merkle_vectors.py`), not by this crate.

use std::path::Path;

use postern_broker::audit::{ChainHasher, ChainedRow, GENESIS};
use postern_broker::config::Config;
use serde::Deserialize;

#[derive(Deserialize)]
struct ChainVector {
    seq: u64,
    invocation_id: String,
    kind: String,
    body: String,
    recorded_at_ms: i64,
    prev: String,
    hash: String,
}

#[derive(Deserialize)]
struct TargetVector {
    description: String,
    kind: String,
    toml: String,
    fields: serde_json::Value,
    version: String,
}

#[test]
fn audit_chain_links_match_the_known_answers() {
    let vectors: Vec<ChainVector> =
        serde_json::from_str(include_str!("../vectors/audit_chain_v1.json")).unwrap();
    assert!(vectors.len() >= 4);
    let mut hasher = ChainHasher::new();
    let mut prev = GENESIS;
    for v in &vectors {
        assert_eq!(hex::encode(prev), v.prev, "seq {}: chained after", v.seq);
        let row = ChainedRow {
            seq: v.seq,
            invocation_id: &v.invocation_id,
            kind: &v.kind,
            body: &v.body,
            recorded_at_ms: v.recorded_at_ms,
        };
        prev = hasher.link(&prev, &row);
        assert_eq!(hex::encode(prev), v.hash, "seq {}", v.seq);
    }
}

#[test]
fn target_versions_match_the_known_answers() {
    let vectors: Vec<TargetVector> =
        serde_json::from_str(include_str!("../vectors/target_version_v1.json")).unwrap();
    assert!(vectors.iter().any(|v| v.kind == "http"));
    assert!(vectors.iter().any(|v| v.kind == "ssh"));
    for v in &vectors {
        let config = Config::parse(&v.toml, Path::new("/etc/postern/config.toml"))
            .unwrap_or_else(|e| panic!("{}: {e}", v.description));
        let name = v.fields["name"].as_str().unwrap();
        let target = config
            .target(name)
            .expect("the vector's target is configured");
        assert_eq!(target.version().as_str(), v.version, "{}", v.description);
    }
}

#[derive(serde::Deserialize)]
struct MerkleVectors {
    chain: Vec<String>,
    leaves: Vec<String>,
    roots: Vec<String>,
    proofs: Vec<ProofVector>,
}

#[derive(serde::Deserialize)]
struct ProofVector {
    old: u64,
    new: u64,
    proof: Vec<String>,
}

fn h32(s: &str) -> [u8; 32] {
    hex::decode(s).unwrap().try_into().unwrap()
}

#[test]
fn merkle_leaves_roots_and_consistency_proofs_match_the_known_answers() {
    use postern_broker::audit::merkle::{
        Frontier, check_consistency, consistency_proof, leaf_hash, store_hashes,
    };
    let v: MerkleVectors = serde_json::from_str(include_str!("../vectors/merkle_v1.json")).unwrap();
    // The first chain values are the audit-chain vectors' own.
    assert_eq!(
        v.chain[0],
        "320357ca0143e72d268d9b4c051ecb2ff6914d632385ac39a87ac97d0b46413c"
    );
    // The stored hashes go where the journal keeps them.
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    conn.execute_batch("CREATE TABLE merkle (idx INTEGER PRIMARY KEY, hash BLOB NOT NULL)")
        .unwrap();
    let mut frontier = Frontier::default();
    assert_eq!(hex::encode(frontier.root()), v.roots[0]);
    let mut stored = Vec::new();
    for (i, chain) in v.chain.iter().enumerate() {
        let seq = i as u64 + 1;
        let leaf = leaf_hash(seq, &h32(chain));
        assert_eq!(hex::encode(leaf), v.leaves[i], "leaf {seq}");
        frontier.push(leaf, &mut stored);
        store_hashes(&conn, seq, &stored).unwrap();
        assert_eq!(
            hex::encode(frontier.root()),
            v.roots[i + 1],
            "root of {seq}"
        );
    }
    for p in &v.proofs {
        let ours = consistency_proof(&conn, p.new, p.old).unwrap();
        let ours: Vec<String> = ours.iter().map(hex::encode).collect();
        assert_eq!(ours, p.proof, "proof {} -> {}", p.old, p.new);
        let proof: Vec<[u8; 32]> = p.proof.iter().map(|s| h32(s)).collect();
        let (old_root, new_root) = (h32(&v.roots[p.old as usize]), h32(&v.roots[p.new as usize]));
        assert!(check_consistency(&proof, p.new, new_root, p.old, old_root));
        // Any other old root fails.
        assert!(!check_consistency(&proof, p.new, new_root, p.old, new_root));
    }
}

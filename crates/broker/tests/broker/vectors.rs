//! Known-answer vectors for the two hashes a verifier outside this code base must be
//! able to recompute: the audit chain link and the target configuration version. The
//! expected values were computed from the encodings documented in `src/audit.rs` and
//! `src/config.rs` by an independent implementation (`tests/vectors/make_vectors.py`),
//! not by this crate.

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

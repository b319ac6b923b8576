//! The RFC 6962 Merkle tree over the journal's events.
//!
//! Leaf `n` (0-based, the event with sequence `n + 1`) is `SHA-256(0x00 ‖ seq_be ‖
//! chain_hash)`: the event's sequence number as 8 big-endian bytes, then the blake3
//! chain value the row already stores. The chain value commits to the row's contents
//! and to every row before it, so the tree commits to the whole journal; interior nodes
//! are `SHA-256(0x01 ‖ left ‖ right)` as RFC 6962 §2.1 says. Known-answer vectors:
//! `tests/vectors/merkle_v1.json`.
//!
//! The tree is what makes consistency proofs possible: a witness that cosigned the tree
//! at size `m` can check that the tree at size `n` extends it, without reading the
//! journal. The writer keeps the tree's stored hashes (in the order and at the indexes
//! `tlog_tiles::tlog::stored_hash_index` defines) in the `merkle` table, written in the
//! same transaction as the events, so any proof can be read back later.

use rusqlite::{Connection, OptionalExtension};
use tlog_tiles::tlog::{self, Hash, HashReader};

/// The root of the empty tree (RFC 6962: the hash of the empty string).
pub const EMPTY_ROOT: [u8; 32] = tlog::EMPTY_HASH.0;

/// The leaf hash of the event with sequence number `seq` and chain value `chain`.
pub fn leaf_hash(seq: u64, chain: &[u8; 32]) -> [u8; 32] {
    let mut data = [0u8; 40];
    data[..8].copy_from_slice(&seq.to_be_bytes());
    data[8..].copy_from_slice(chain);
    tlog::record_hash(&data).0
}

fn node(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    tlog::node_hash(Hash(*left), Hash(*right)).0
}

/// The right edge of the tree: the roots of its complete subtrees, largest first. Enough
/// to append a leaf and to compute the root, in `O(log n)` memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    nodes: Vec<[u8; 32]>,
}

impl Frontier {
    /// How many leaves the tree has.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends a leaf. `stored` receives the hashes the tree stores for it, level 0
    /// first: at index `stored_hash_index(0, size)` and the ones after it.
    pub fn push(&mut self, leaf: [u8; 32], stored: &mut Vec<[u8; 32]>) {
        stored.clear();
        stored.push(leaf);
        let mut hash = leaf;
        let mut n = self.size;
        while n & 1 == 1 {
            let Some(left) = self.nodes.pop() else { break };
            hash = node(&left, &hash);
            stored.push(hash);
            n >>= 1;
        }
        self.nodes.push(hash);
        self.size += 1;
    }

    /// Appends a leaf, discarding the stored hashes (for verifiers).
    pub fn push_leaf(&mut self, leaf: [u8; 32]) {
        let mut hash = leaf;
        let mut n = self.size;
        while n & 1 == 1 {
            let Some(left) = self.nodes.pop() else { break };
            hash = node(&left, &hash);
            n >>= 1;
        }
        self.nodes.push(hash);
        self.size += 1;
    }

    /// The tree's root hash (RFC 6962 MTH).
    pub fn root(&self) -> [u8; 32] {
        let mut nodes = self.nodes.iter().rev();
        let Some(last) = nodes.next() else {
            return EMPTY_ROOT;
        };
        nodes.fold(*last, |acc, left| node(left, &acc))
    }

    /// The frontier of the tree of `size` leaves, from its stored hashes.
    pub fn load(size: u64, reader: &impl HashReader) -> Result<Frontier, tlog::Error> {
        let indexes = tlog::sub_tree_index(0, size, Vec::new());
        let hashes = reader.read_hashes(&indexes)?;
        Ok(Frontier {
            size,
            nodes: hashes.into_iter().map(|h| h.0).collect(),
        })
    }
}

/// Writes the hashes [`Frontier::push`] returned for the event with sequence `seq` into
/// the journal's `merkle` table, at their stored-hash indexes.
pub fn store_hashes(conn: &Connection, seq: u64, stored: &[[u8; 32]]) -> rusqlite::Result<()> {
    let base = tlog::stored_hash_index(0, seq - 1);
    let mut insert = conn.prepare_cached("INSERT INTO merkle (idx, hash) VALUES (?1, ?2)")?;
    for (k, h) in stored.iter().enumerate() {
        insert.execute(rusqlite::params![(base + k as u64) as i64, &h[..]])?;
    }
    Ok(())
}

/// Reads stored hashes from a journal's `merkle` table.
pub struct StoredHashes<'a> {
    pub conn: &'a Connection,
}

impl HashReader for StoredHashes<'_> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog::Error> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT hash FROM merkle WHERE idx = ?1")
            .map_err(|_| tlog::Error::IndexesNotInTree)?;
        indexes
            .iter()
            .map(|&i| {
                let idx = i64::try_from(i).map_err(|_| tlog::Error::IndexesNotInTree)?;
                let hash: Option<Vec<u8>> = stmt
                    .query_row([idx], |r| r.get(0))
                    .optional()
                    .map_err(|_| tlog::Error::IndexesNotInTree)?;
                hash.and_then(|h| <[u8; 32]>::try_from(h).ok())
                    .map(Hash)
                    .ok_or(tlog::Error::IndexesNotInTree)
            })
            .collect()
    }
}

/// A consistency proof that the tree of `new_size` extends the tree of `old_size`
/// (RFC 6962 §2.1.2), read from the journal's stored hashes.
pub fn consistency_proof(
    conn: &Connection,
    new_size: u64,
    old_size: u64,
) -> Result<Vec<[u8; 32]>, tlog::Error> {
    if old_size > new_size {
        return Err(tlog::Error::InvalidInput(format!(
            "the old tree ({old_size}) is larger than the new one ({new_size})"
        )));
    }
    if old_size == 0 || old_size == new_size {
        return Ok(Vec::new());
    }
    // The proof reads only hashes the tree of new_size stores; check they are all there
    // before tlog's index arithmetic relies on it.
    let needed = tlog::stored_hash_count(new_size);
    let have: i64 = conn
        .query_row(
            "SELECT count(*) FROM merkle WHERE idx < ?1",
            [needed as i64],
            |r| r.get(0),
        )
        .map_err(|_| tlog::Error::IndexesNotInTree)?;
    if u64::try_from(have).unwrap_or(0) != needed {
        return Err(tlog::Error::IndexesNotInTree);
    }
    let proof = tlog::prove_tree(new_size, old_size, &StoredHashes { conn })?;
    Ok(proof.into_iter().map(|h| h.0).collect())
}

/// Whether `proof` shows the tree (`new_size`, `new_root`) extends (`old_size`,
/// `old_root`).
pub fn check_consistency(
    proof: &[[u8; 32]],
    new_size: u64,
    new_root: [u8; 32],
    old_size: u64,
    old_root: [u8; 32],
) -> bool {
    if old_size > new_size {
        return false;
    }
    if old_size == new_size {
        return proof.is_empty() && old_root == new_root;
    }
    if old_size == 0 {
        return proof.is_empty();
    }
    let proof: Vec<Hash> = proof.iter().map(|h| Hash(*h)).collect();
    tlog::check_tree(&proof, new_size, Hash(new_root), old_size, Hash(old_root)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Mem(HashMap<u64, Hash>);
    impl HashReader for Mem {
        fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog::Error> {
            indexes
                .iter()
                .map(|i| self.0.get(i).copied().ok_or(tlog::Error::IndexesNotInTree))
                .collect()
        }
    }

    #[test]
    fn the_frontier_stores_what_tlog_stores_and_agrees_on_every_root() {
        let mut frontier = Frontier::default();
        let mut mem = Mem(HashMap::new());
        let mut stored = Vec::new();
        for n in 0..70u64 {
            let leaf = leaf_hash(n + 1, &[n as u8; 32]);
            let expected = tlog::stored_hashes_for_record_hash(n, Hash(leaf), &mem).unwrap();
            frontier.push(leaf, &mut stored);
            assert_eq!(
                stored,
                expected.iter().map(|h| h.0).collect::<Vec<_>>(),
                "record {n}"
            );
            let base = tlog::stored_hash_index(0, n);
            for (k, h) in expected.into_iter().enumerate() {
                mem.0.insert(base + k as u64, h);
            }
            assert_eq!(frontier.root(), tlog::tree_hash(n + 1, &mem).unwrap().0);
            assert_eq!(Frontier::load(n + 1, &mem).unwrap(), frontier);
        }
    }

    #[test]
    fn the_empty_tree_has_the_rfc_6962_root() {
        assert_eq!(
            hex::encode(Frontier::default().root()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}

#!/usr/bin/env python3
"""Computes the Merkle-tree known-answer vectors (merkle_v1.json) from RFC 6962 §2.1,
independently of the Rust code: recursive MTH and SUBPROOF, standard library only.

Leaf n (0-based) is SHA-256(0x00 ‖ seq_be64 ‖ chain_value) for the event with sequence
seq = n + 1; the chain values are those of audit_chain_v1.json, then synthetic ones
(SHA-256 of "chain" ‖ seq) up to 13 leaves. Run from this directory:
`python3 make_merkle_vectors.py > merkle_v1.json`."""
import hashlib, json, struct

def sha(b): return hashlib.sha256(b).digest()
def leaf(seq, chain): return sha(b"\x00" + struct.pack(">Q", seq) + chain)
def node(l, r): return sha(b"\x01" + l + r)

def k_of(n):
    k = 1
    while k * 2 < n:
        k *= 2
    return k

def mth(leaves):
    if not leaves:
        return sha(b"")
    if len(leaves) == 1:
        return leaves[0]
    k = k_of(len(leaves))
    return node(mth(leaves[:k]), mth(leaves[k:]))

def subproof(m, leaves, complete):
    n = len(leaves)
    if m == n:
        return [] if complete else [mth(leaves)]
    k = k_of(n)
    if m <= k:
        return subproof(m, leaves[:k], complete) + [mth(leaves[k:])]
    return subproof(m - k, leaves[k:], False) + [mth(leaves[:k])]

chain = [bytes.fromhex(v["hash"]) for v in json.load(open("audit_chain_v1.json"))]
while len(chain) < 13:
    chain.append(sha(b"chain" + struct.pack(">Q", len(chain) + 1)))
leaves = [leaf(i + 1, c) for i, c in enumerate(chain)]

out = {
    "chain": [c.hex() for c in chain],
    "leaves": [l.hex() for l in leaves],
    "roots": [mth(leaves[:n]).hex() for n in range(0, len(leaves) + 1)],
    "proofs": [
        {"old": m, "new": n, "proof": [h.hex() for h in subproof(m, leaves[:n], True)]}
        for (m, n) in [(1, 2), (1, 8), (3, 7), (4, 8), (5, 13), (6, 8), (7, 13), (12, 13)]
    ],
}
print(json.dumps(out, indent=2))

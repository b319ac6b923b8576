#!/usr/bin/env python3
"""Computes the audit-chain and target-version known-answer vectors from the encodings
documented in src/journal/chain.rs, src/journal/merkle.rs and src/config.rs, independently
of the Rust code.
Needs the `blake3` Python package. Run as `make_vectors.py targets.json` where targets.json is target_version_v1.json
without its `version` fields; prints {"chain": [...], "targets": [...]}, the content of
audit_chain_v1.json and target_version_v1.json."""
import json, struct, sys
import blake3

def u64(n): return struct.pack('<Q', n)
def i64(n): return struct.pack('<q', n)

# ---- audit chain: H_k(prev ‖ seq ‖ len‖invocation_id ‖ len‖kind ‖ len‖body ‖ recorded_at_ms)
CHAIN_KEY = blake3.blake3(b"chain", derive_key_context="postern 2026 audit-event v1").digest()

def link(prev, row):
    buf = prev + u64(row["seq"])
    for f in ("invocation_id", "kind", "body"):
        b = row[f].encode()
        buf += u64(len(b)) + b
    buf += i64(row["recorded_at_ms"])
    return blake3.blake3(buf, key=CHAIN_KEY).digest()

rows = [
    {"seq": 1, "invocation_id": "inv_00000000000000000000000000000001", "kind": "ACTION_ACCEPTED",
     "body": '{"kind":"ACTION_ACCEPTED","channel":"http","target":"payments","summary":"POST https://api.example.test/v1/payments","session":"s1","idempotency_key":null}',
     "recorded_at_ms": 1767225600000},
    {"seq": 2, "invocation_id": "inv_00000000000000000000000000000001", "kind": "DISPATCH_STARTED",
     "body": '{"kind":"DISPATCH_STARTED","generation":1}', "recorded_at_ms": 1767225600005},
    {"seq": 3, "invocation_id": "inv_00000000000000000000000000000002", "kind": "RESULT_DELIVERED",
     "body": "{\"note\":\"non-ASCII \u00e9 and an empty id follow\"}", "recorded_at_ms": -1},
    {"seq": 4, "invocation_id": "", "kind": "", "body": "", "recorded_at_ms": 0},
]
prev = bytes(32)
chain = []
for r in rows:
    h = link(prev, r)
    chain.append(dict(r, prev=prev.hex(), hash=h.hex()))
    prev = h

# ---- target version (format 1)
class C:
    def __init__(self):
        self.h = blake3.blake3(derive_key_context="postern 2026 target-config v1")
        self.h.update(b"\x01")
    def item(self, b): self.h.update(u64(len(b)) + b)
    def bytes(self, tag, b): self.h.update(bytes([tag])); self.item(b)
    def str(self, tag, s): self.bytes(tag, s.encode())
    def u64(self, tag, v): self.bytes(tag, u64(v))
    def opt(self, tag, b):
        self.h.update(bytes([tag]))
        if b is None: self.h.update(b"\x00")
        else: self.h.update(b"\x01"); self.item(b)
    def presence(self, tag, p): self.h.update(bytes([tag, 1 if p else 0]))
    def list(self, tag, items):
        self.h.update(bytes([tag])); self.h.update(u64(len(items)))
        for b in items: self.item(b)
    def done(self): return "blake3:" + self.h.hexdigest()

def http_version(t):
    c = C()
    c.str(0x02, "http"); c.str(0x40, t["name"]); c.str(0x41, t["base_url"])
    c.list(0x42, sorted(set(m.encode() for m in t["methods"])))
    c.str(0x43, t["credential"]); c.str(0x44, t["inject_mode"]); c.opt(0x45, None if t["inject_detail"] is None else t["inject_detail"].encode())
    c.str(0x46, t["approval"])
    c.list(0x47, sorted(set(m.encode() for m in t["idempotent_methods"])))
    c.opt(0x48, None)
    c.u64(0x49, t["timeout_ms"]); c.u64(0x4a, t["max_response_bytes"]); c.u64(0x4b, t["max_request_body_bytes"])
    c.bytes(0x4c, bytes([1 if t["follow_redirects"] else 0]))
    i = t.get("idempotency")
    c.presence(0x4d, i is not None)
    if i:
        c.str(0x50, i["header"].lower()); c.str(0x51, i["scope"]); c.u64(0x52, i["retention_secs"])
    r = t.get("reconcile")
    c.presence(0x4e, r is not None)
    if r:
        c.str(0x58, r["method"]); c.str(0x59, r["path"])
        c.list(0x5a, [struct.pack('<H', s) for s in sorted(set(r["committed_status"]))])
        c.list(0x5b, [struct.pack('<H', s) for s in sorted(set(r["not_applied_status"]))])
    return c.done()

def ssh_version(t):
    c = C()
    c.str(0x02, "ssh"); c.str(0x60, t["name"]); c.str(0x61, t["host"]); c.bytes(0x62, struct.pack('<H', t["port"]))
    c.str(0x63, t["user"]); c.str(0x64, t["credential"])
    c.opt(0x65, None if t["host_key"] is None else t["host_key"].encode())
    c.str(0x66, t["approval"]); c.u64(0x67, t["timeout_ms"]); c.u64(0x68, t["max_output_bytes"])
    return c.done()

targets = json.load(open(sys.argv[1]))
for t in targets:
    t["version"] = http_version(t["fields"]) if t["kind"] == "http" else ssh_version(t["fields"])

json.dump({"chain": chain, "targets": targets}, sys.stdout, indent=2, ensure_ascii=False)
print()

//! What two brokers say to each other: the peering tools the answering broker (B)
//! serves over MCP Streamable HTTP, their arguments and answers, the request
//! fingerprint, and the signature that authenticates the asking broker (A).
//!
//! Both directions are authenticated by Ed25519 keys pinned in `[[peer]]`: every tool
//! call carries a [`PeerAuth`] signed with A's broker key, and every answer carries an
//! [`Attestation`](super::Attestation) signed with B's.
//!
//! # Encodings, version 1
//!
//! Both are BLAKE3 in key-derivation mode over fields each preceded by its length as
//! u64 LE; lists are preceded by their count (u64 LE), pairs are two fields, an optional
//! field is a presence byte followed by the value.
//!
//! - Request fingerprint (context `"postern 2026 peer-request v1"`): capability, method,
//!   path, headers (list of pairs), query (list of pairs), body (the bytes), idempotency
//!   key (optional), timeout ms (optional u64 LE).
//! - Auth digest (context `"postern 2026 peer-auth v1"`): tool name, asking broker's
//!   key name, issued-at (i64 LE), nonce, subject: [`call_subject`] for `peer_call`
//!   (every field of the call the answer depends on: the request fingerprint, the
//!   caller's invocation id and attempt, and the policy version the caller saw),
//!   [`reconcile_subject`] for `peer_reconcile` (the invocation on the answering broker,
//!   the capability and the request fingerprint), empty for `peer_capabilities`. The
//!   signature is Ed25519 over [`AUTH_SIGNING_CONTEXT`] followed by the digest's text.
//!
//! A party on the path can therefore change nothing a broker decides on without the
//! call's signature failing (issue 27: a rewritten `policy_version` had B sign a genuine
//! `unavailable` that the relay then replayed over B's committed outcome).

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::Attestation;
use crate::canonical::signed_message;
use crate::contract::{Envelope, Outcome};

/// B lists what it exports to A.
pub const TOOL_CAPABILITIES: &str = "peer_capabilities";
/// A asks B to run one request against an exported capability.
pub const TOOL_CALL: &str = "peer_call";
/// A asks B to reconcile one of B's unknown outcomes and answer the settlement.
pub const TOOL_RECONCILE: &str = "peer_reconcile";

/// How far an auth's time may be from the answering broker's clock.
pub const AUTH_WINDOW_MS: i64 = 120_000;

/// What A's signature on a tool call covers, before the digest.
pub const AUTH_SIGNING_CONTEXT: &[u8] = b"postern peer-auth signature v1\n";

/// Who is asking: the asking broker's key name (its audit log origin,
/// `postern.local/audit/<hex>`, by which the answering broker finds its `[[peer]]`
/// entry), when, a fresh nonce, and the asking broker's signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerAuth {
    pub peer: String,
    pub issued_at_ms: i64,
    /// 16 random bytes, hex; the answering broker refuses one it has seen.
    pub nonce: String,
    /// Ed25519, hex.
    pub signature: String,
}

/// Why an auth is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthRefused {
    #[error(
        "the request is signed at {issued_at_ms}, more than {AUTH_WINDOW_MS} ms from now ({now_ms})"
    )]
    Stale { issued_at_ms: i64, now_ms: i64 },
    #[error("the nonce is not 32 hex digits")]
    MalformedNonce,
    #[error("the signature is not 64 bytes of hex")]
    MalformedSignature,
    #[error("the signature does not verify with the key pinned for {peer}")]
    BadSignature { peer: String },
}

fn auth_digest(tool: &str, peer: &str, issued_at_ms: i64, nonce: &str, subject: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key("postern 2026 peer-auth v1");
    for bytes in [
        tool.as_bytes(),
        peer.as_bytes(),
        &issued_at_ms.to_le_bytes(),
        nonce.as_bytes(),
        subject.as_bytes(),
    ] {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    format!("blake3:{}", h.finalize().to_hex())
}

impl PeerAuth {
    /// Signs a call to `tool` about `subject` as `peer` (this broker's name at the
    /// answering broker), with a fresh `nonce` (16 random bytes).
    pub fn sign(
        key: &SigningKey,
        tool: &str,
        peer: &str,
        subject: &str,
        issued_at_ms: i64,
        nonce: [u8; 16],
    ) -> PeerAuth {
        let nonce = hex::encode(nonce);
        let digest = auth_digest(tool, peer, issued_at_ms, &nonce, subject);
        PeerAuth {
            peer: peer.to_string(),
            issued_at_ms,
            nonce,
            signature: hex::encode(
                key.sign(&signed_message(AUTH_SIGNING_CONTEXT, &digest))
                    .to_bytes(),
            ),
        }
    }

    /// Checks the signature with the key pinned for `self.peer`, and the time window.
    /// The caller keeps the nonces it has seen within the window and refuses repeats.
    pub fn verify(
        &self,
        pinned: &VerifyingKey,
        tool: &str,
        subject: &str,
        now_ms: i64,
    ) -> Result<(), AuthRefused> {
        if (now_ms - self.issued_at_ms).abs() > AUTH_WINDOW_MS {
            return Err(AuthRefused::Stale {
                issued_at_ms: self.issued_at_ms,
                now_ms,
            });
        }
        if self.nonce.len() != 32 || !self.nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(AuthRefused::MalformedNonce);
        }
        let bytes: [u8; 64] = hex::decode(&self.signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(AuthRefused::MalformedSignature)?;
        let digest = auth_digest(tool, &self.peer, self.issued_at_ms, &self.nonce, subject);
        pinned
            .verify_strict(
                &signed_message(AUTH_SIGNING_CONTEXT, &digest),
                &Signature::from_bytes(&bytes),
            )
            .map_err(|_| AuthRefused::BadSignature {
                peer: self.peer.clone(),
            })
    }
}

/// `peer_capabilities` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilitiesArgs {
    pub auth: PeerAuth,
}

/// One capability B exports to A: one of B's HTTP targets, without its secrets or URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capability {
    pub name: String,
    pub methods: Vec<String>,
    pub idempotent_methods: Vec<String>,
    /// B's approval mode for it (`none`, `session`, `per_call`): B's approver decides.
    pub approval: String,
}

/// `peer_capabilities` answer. The attestation's kind is `outcome` (or `denial` when B
/// refuses to say), its capability [`ALL_CAPABILITIES`], its fingerprint the digest of
/// `capabilities` ([`capabilities_digest`]); an `outcome` binds that same digest as its
/// `outcome_digest` (the listing is what it attests).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilitiesAnswer {
    pub attestation: Attestation,
    pub capabilities: Vec<Capability>,
}

/// The capability a `peer_capabilities` attestation names: all of them.
pub const ALL_CAPABILITIES: &str = "*";

/// The fingerprint a `peer_capabilities` attestation binds: BLAKE3 (context
/// `"postern 2026 peer-capabilities v1"`) over the JSON of `capabilities` (serde's
/// field order, in the order listed).
pub fn capabilities_digest(capabilities: &[Capability]) -> String {
    let json = serde_json::to_vec(capabilities).unwrap_or_default();
    let mut h = blake3::Hasher::new_derive_key("postern 2026 peer-capabilities v1");
    h.update(&json);
    format!("blake3:{}", h.finalize().to_hex())
}

/// The request A asks B to run: relative to the capability's base URL at B.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRequest {
    pub capability: String,
    pub method: String,
    /// Starts with `/`; relative to the exported target's base URL (may carry a query).
    pub path: String,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub query: Vec<(String, String)>,
    #[serde(default)]
    pub body_base64: String,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl PeerRequest {
    /// The request fingerprint (see the module doc), over the decoded body bytes.
    pub fn fingerprint(&self, body: &[u8]) -> String {
        let mut h = blake3::Hasher::new_derive_key("postern 2026 peer-request v1");
        let mut field = |bytes: &[u8]| {
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(self.capability.as_bytes());
        field(self.method.as_bytes());
        field(self.path.as_bytes());
        for list in [&self.headers, &self.query] {
            field(&(list.len() as u64).to_le_bytes());
            for (k, v) in list {
                field(k.as_bytes());
                field(v.as_bytes());
            }
        }
        field(body);
        match &self.idempotency_key {
            None => field(&[0]),
            Some(k) => {
                field(&[1]);
                field(k.as_bytes());
            }
        }
        match self.timeout_ms {
            None => field(&[0]),
            Some(t) => {
                field(&[1]);
                field(&t.to_le_bytes());
            }
        }
        format!("blake3:{}", h.finalize().to_hex())
    }
}

/// `peer_call` arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallArgs {
    pub auth: PeerAuth,
    pub request: PeerRequest,
    /// The asking broker's invocation id. The answering broker runs a request at most
    /// once per (asking broker, caller invocation): asking again, after a timeout or a
    /// reset, returns what its record says instead of running it again.
    pub caller_invocation: String,
    /// The asking broker's attempt (its dispatch generation) this call belongs to. Signed
    /// with the call, and named by the answer's attestation.
    pub caller_attempt: u32,
    /// B's export policy version A saw when the attempt began, if it knew one.
    #[serde(default)]
    pub policy_version: Option<String>,
}

/// A complete HTTP response B received, secrets scrubbed by B.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body_base64: String,
}

/// What B's own record says of the call: seed 000's envelope as B proves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerOutcome {
    /// The invocation on B.
    pub invocation_id: String,
    pub outcome: Outcome,
    /// B's envelope when its record carries a code.
    pub error: Option<Envelope>,
    pub response: Option<PeerResponse>,
}

impl PeerOutcome {
    /// The digest an `outcome` attestation binds: BLAKE3 (context
    /// `"postern 2026 peer-outcome v1"`) over this value's JSON (serde's field order).
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut h = blake3::Hasher::new_derive_key("postern 2026 peer-outcome v1");
        h.update(&json);
        format!("blake3:{}", h.finalize().to_hex())
    }
}

/// The subject a `peer_call` auth signs: the request fingerprint, the caller's
/// invocation id and attempt, and the policy version the caller saw (`-` for none, else
/// `=` and the version), one per line. Every field is printable ASCII without a newline
/// (the invocation id is checked), so the lines cannot run into each other.
pub fn call_subject(
    request_fingerprint: &str,
    caller_invocation: &str,
    caller_attempt: u32,
    policy_version: Option<&str>,
) -> String {
    let policy = policy_version.map_or_else(|| "-".to_string(), |v| format!("={v}"));
    format!("{request_fingerprint}\n{caller_invocation}\n{caller_attempt}\n{policy}")
}

/// The subject a `peer_reconcile` auth signs: the invocation on the answering broker,
/// the capability and the request fingerprint, one per line.
pub fn reconcile_subject(
    invocation_id: &str,
    capability: &str,
    request_fingerprint: &str,
) -> String {
    format!("{invocation_id}\n{capability}\n{request_fingerprint}")
}

/// `peer_call` and `peer_reconcile` answer: always an attestation; an outcome when its
/// kind is `outcome` (and its digest is that outcome's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallAnswer {
    pub attestation: Attestation,
    pub outcome: Option<PeerOutcome>,
}

/// `peer_reconcile` arguments: the invocation on B, and the fingerprint of the request
/// A sent (the attestation is about it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileArgs {
    pub auth: PeerAuth,
    pub capability: String,
    pub invocation_id: String,
    pub request_fingerprint: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[3u8; 32])
    }

    #[test]
    fn an_auth_verifies_for_its_tool_subject_and_time_only() {
        let now = 1_800_000_000_000;
        let auth = PeerAuth::sign(&key(), TOOL_CALL, "org-a", "blake3:aa", now, [7u8; 16]);
        let pinned = key().verifying_key();
        assert_eq!(
            auth.verify(&pinned, TOOL_CALL, "blake3:aa", now + 1000),
            Ok(())
        );
        assert!(matches!(
            auth.verify(&pinned, TOOL_RECONCILE, "blake3:aa", now),
            Err(AuthRefused::BadSignature { .. })
        ));
        assert!(matches!(
            auth.verify(&pinned, TOOL_CALL, "blake3:bb", now),
            Err(AuthRefused::BadSignature { .. })
        ));
        assert!(matches!(
            auth.verify(&pinned, TOOL_CALL, "blake3:aa", now + AUTH_WINDOW_MS + 1),
            Err(AuthRefused::Stale { .. })
        ));
        let other = SigningKey::from_bytes(&[4u8; 32]).verifying_key();
        assert!(matches!(
            auth.verify(&other, TOOL_CALL, "blake3:aa", now),
            Err(AuthRefused::BadSignature { .. })
        ));
        let mut renamed = auth.clone();
        renamed.peer = "org-c".into();
        assert!(matches!(
            renamed.verify(&pinned, TOOL_CALL, "blake3:aa", now),
            Err(AuthRefused::BadSignature { .. })
        ));
        let mut short = auth;
        short.nonce = "ab".into();
        assert_eq!(
            short.verify(&pinned, TOOL_CALL, "blake3:aa", now),
            Err(AuthRefused::MalformedNonce)
        );
    }

    #[test]
    fn the_fingerprint_binds_every_field_and_the_body() {
        let base = PeerRequest {
            capability: "payments".into(),
            method: "POST".into(),
            path: "/charges".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            query: vec![("a".into(), "1".into())],
            body_base64: String::new(),
            idempotency_key: Some("k".into()),
            timeout_ms: Some(5000),
        };
        let fp = base.fingerprint(b"{}");
        let mut seen = vec![fp.clone()];
        type Edit = fn(&mut PeerRequest);
        let edits: [Edit; 7] = [
            |r| r.capability = "refunds".into(),
            |r| r.method = "PUT".into(),
            |r| r.path = "/charges/1".into(),
            |r| r.headers.clear(),
            |r| r.query = vec![("a".into(), "2".into())],
            |r| r.idempotency_key = None,
            |r| r.timeout_ms = None,
        ];
        for edit in edits {
            let mut r = base.clone();
            edit(&mut r);
            let f = r.fingerprint(b"{}");
            assert!(!seen.contains(&f));
            seen.push(f);
        }
        assert!(!seen.contains(&base.fingerprint(b"{ }")));
        assert_eq!(base.fingerprint(b"{}"), fp);
    }
}

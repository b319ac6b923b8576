//! The target version: a BLAKE3 digest of a target's normalized configuration
//! ([`TargetVersion`]), computed over the [`Canonical`] encoding that the `config`
//! module documentation specifies (format version 1) and that the known-answer vectors
//! pin.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{HttpTarget, Injection, SshTarget};
use crate::canonical::Canonical;

const VERSION_CONTEXT: &str = "postern 2026 target-config v1";
const VERSION_FORMAT: u8 = 1;

/// The digest of a target's normalized configuration: `blake3:<64 hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TargetVersion(String);

impl TargetVersion {
    /// Wraps a raw 32-byte digest (from [`HttpTarget::version`] or a test fixture).
    pub fn from_digest(d: [u8; 32]) -> Self {
        Self(format!("blake3:{}", hex::encode(d)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TargetVersion {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        let ok = s.strip_prefix("blake3:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if ok {
            Ok(Self(s))
        } else {
            Err(format!("not a target version: {s:?}"))
        }
    }
}

impl From<TargetVersion> for String {
    fn from(v: TargetVersion) -> Self {
        v.0
    }
}

impl fmt::Display for TargetVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn sorted_list<'a>(c: &mut Canonical, tag: u8, items: &'a [String]) {
    let mut v: Vec<&'a [u8]> = items.iter().map(|s| s.as_bytes()).collect();
    v.sort_unstable();
    v.dedup();
    c.list(tag, v.into_iter());
}

fn status_list(c: &mut Canonical, tag: u8, items: &[u16]) {
    let mut v: Vec<u16> = items.to_vec();
    v.sort_unstable();
    v.dedup();
    let bytes: Vec<[u8; 2]> = v.iter().map(|s| s.to_le_bytes()).collect();
    c.list(tag, bytes.iter().map(|b| &b[..]));
}

impl HttpTarget {
    /// The digest of this target's normalized configuration (see the [module
    /// doc](super) for the encoding).
    pub fn version(&self) -> TargetVersion {
        let mut c = Canonical::new(VERSION_CONTEXT, VERSION_FORMAT);
        c.str(0x02, "http");
        c.str(0x40, &self.name);
        c.str(0x41, self.base_url.as_str());
        sorted_list(&mut c, 0x42, &self.methods);
        c.str(0x43, self.credential.as_str());
        c.str(0x44, &self.inject.mode());
        match &self.inject {
            Injection::Header { format, .. } => c.opt(0x45, Some(format.as_bytes())),
            Injection::Basic { user } => c.opt(0x45, Some(user.as_bytes())),
            Injection::Query { .. } => c.opt(0x45, None),
        }
        c.str(0x46, self.approval.as_str());
        sorted_list(&mut c, 0x47, &self.idempotent_methods);
        c.opt(
            0x48,
            self.ca_file
                .as_ref()
                .map(|p| p.as_os_str().as_encoded_bytes()),
        );
        c.u64(0x49, self.timeout_ms);
        c.u64(0x4a, self.max_response_bytes);
        c.u64(0x4b, self.max_request_body_bytes);
        c.bytes(0x4c, &[u8::from(self.follow_redirects)]);
        c.presence(0x4d, self.idempotency.is_some());
        if let Some(i) = &self.idempotency {
            c.str(0x50, &i.header.to_ascii_lowercase());
            c.str(0x51, &i.scope);
            c.u64(0x52, i.retention.as_secs());
        }
        c.presence(0x4e, self.reconcile.is_some());
        if let Some(r) = &self.reconcile {
            c.str(0x58, &r.method);
            c.str(0x59, &r.path);
            status_list(&mut c, 0x5a, &r.committed_status);
            status_list(&mut c, 0x5b, &r.not_applied_status);
        }
        // Added after v1's vectors: present only when set, so targets without them keep
        // their digests.
        if self.allow_private {
            c.bytes(0x4f, &[1]);
        }
        // Later groups are encoded only when present, so the version of a target that
        // does not use them is what it was before they existed.
        if let Some(j) = &self.job {
            c.presence(0x76, true);
            c.opt(0x70, j.id_pointer.as_deref().map(str::as_bytes));
            c.opt(0x71, j.status_pointer.as_deref().map(str::as_bytes));
            c.opt(0x72, j.state_pointer.as_deref().map(str::as_bytes));
            sorted_list(&mut c, 0x73, &j.pending);
            sorted_list(&mut c, 0x74, &j.succeeded);
            sorted_list(&mut c, 0x75, &j.failed);
        }
        if let Some(b) = &self.batch {
            c.presence(0x7f, true);
            c.str(0x80, &b.path);
            c.str(0x81, &b.members);
            c.opt(0x82, b.member_id.as_deref().map(str::as_bytes));
            c.str(0x83, &b.results);
            c.opt(0x84, b.result_id.as_deref().map(str::as_bytes));
            c.str(0x85, &b.status);
            sorted_list(&mut c, 0x86, &b.applied);
            sorted_list(&mut c, 0x87, &b.not_applied);
            c.opt(0x88, b.partial_header.as_deref().map(str::as_bytes));
            c.opt(0x89, b.partial_pointer.as_deref().map(str::as_bytes));
            c.bytes(0x8a, &[u8::from(b.atomic)]);
            c.presence(0x8b, b.query.is_some());
            if let Some(q) = &b.query {
                c.str(0x8c, &q.method);
                c.str(0x8d, &q.path);
                status_list(&mut c, 0x8e, &q.committed_status);
                status_list(&mut c, 0x8f, &q.not_applied_status);
            }
        }
        if let Some(proxy) = self.proxy.via() {
            c.str(0x90, &proxy.url());
        }
        if self.require_confined {
            c.bytes(0x91, &[1]);
        }
        TargetVersion::from_digest(c.finish())
    }
}

impl SshTarget {
    /// The digest of this target's normalized configuration (see the [module
    /// doc](super) for the encoding).
    pub fn version(&self) -> TargetVersion {
        let mut c = Canonical::new(VERSION_CONTEXT, VERSION_FORMAT);
        c.str(0x02, "ssh");
        c.str(0x60, &self.name);
        c.str(0x61, &self.host);
        c.bytes(0x62, &self.port.to_le_bytes());
        c.str(0x63, &self.user);
        c.str(0x64, self.credential.as_str());
        c.opt(0x65, self.host_key.as_deref().map(str::as_bytes));
        c.str(0x66, self.approval.as_str());
        c.u64(0x67, self.timeout_ms);
        c.u64(0x68, self.max_output_bytes);
        if self.allow_private {
            c.bytes(0x69, &[1]);
        }
        if self.require_confined {
            c.bytes(0x6a, &[1]);
        }
        TargetVersion::from_digest(c.finish())
    }
}

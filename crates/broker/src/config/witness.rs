//! `[[witness]]`: a witness the broker's checkpoints are sent to, checked at load: a
//! cosignature/v1 verifier key and an http(s) URL without credentials.

use std::path::Path;

use serde::Deserialize;
use url::Url;

use super::{ConfigError, Ctx, Problem, Section, TargetRef};

/// A witness (c2sp.org/tlog-witness) the broker sends its checkpoints to, and whose
/// cosignatures `audit verify` checks: `[[witness]] url = "…", key = "<verifier key>"`.
/// Checkpoints are public, so plain http is allowed; what the witness returns is
/// checked against `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessConfig {
    /// The witness's key name (from `key`).
    pub name: String,
    pub url: String,
    /// A cosignature/v1 verifier key, as `postern witness init` prints it.
    pub key: crate::transparency::note::VerifierKey,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWitness {
    url: String,
    key: String,
}

pub(super) fn validate_witness(
    path: &Path,
    index: usize,
    raw: &RawWitness,
) -> Result<WitnessConfig, ConfigError> {
    use crate::transparency::note::{KeyAlg, VerifierKey};
    let mut target = TargetRef {
        section: Section::Witness,
        index,
        name: None,
    };
    let key_problem = |reason: String| Problem::InvalidWitnessKey { reason };
    let key = VerifierKey::parse(raw.key.trim()).map_err(|e| {
        Ctx {
            file: path,
            target: target.clone(),
        }
        .err("key", key_problem(e.to_string()))
    })?;
    if key.alg != KeyAlg::CosignatureV1 {
        let problem = key_problem("the key is not of type 0x04 (cosignature/v1)".into());
        return Err(Ctx { file: path, target }.err("key", problem));
    }
    target.name = Some(key.name.clone());
    let ctx = Ctx { file: path, target };
    let url = Url::parse(&raw.url).map_err(|e| {
        ctx.err(
            "url",
            Problem::InvalidUrl {
                reason: e.to_string(),
            },
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        let problem = Problem::UnsupportedScheme {
            scheme: url.scheme().to_owned(),
        };
        return Err(ctx.err("url", problem));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ctx.err("url", Problem::UserinfoInUrl));
    }
    if url.host_str().is_none_or(str::is_empty) {
        let problem = Problem::InvalidUrl {
            reason: "no host".to_owned(),
        };
        return Err(ctx.err("url", problem));
    }
    Ok(WitnessConfig {
        name: key.name.clone(),
        url: raw.url.trim_end_matches('/').to_owned(),
        key,
    })
}

//! Arming one attempt: the credential injected into what goes on the wire, the
//! redactor built from every rendered form of it, and the TLS trust the target asks
//! for. Nothing is sent here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustls::client::WebPkiServerVerifier;

use super::{Armed, Plan};
use crate::action::percent_encode;
use crate::channel::redact::Redactor;
use crate::config::{Config, HttpTarget, Injection};
use crate::contract::{Code, Phase, Retry};
use crate::invocation::{Bound, Failure};
use crate::vault::Secret;
use zeroize::Zeroizing;

/// Trust roots per (target, ca_file): loading the system's roots costs milliseconds.
pub(super) struct Trust {
    verifiers: Mutex<HashMap<String, Arc<WebPkiServerVerifier>>>,
    pub(super) provider: Arc<rustls::crypto::CryptoProvider>,
}

impl Trust {
    pub(super) fn new() -> Self {
        Trust {
            verifiers: Mutex::new(HashMap::new()),
            provider: Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        }
    }

    fn verifier(&self, target: &HttpTarget) -> Result<Arc<WebPkiServerVerifier>, String> {
        let key = format!("{}|{:?}", target.name, target.ca_file);
        if let Ok(cache) = self.verifiers.lock()
            && let Some(v) = cache.get(&key)
        {
            return Ok(v.clone());
        }
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            // A malformed system certificate is skipped, as every TLS client does.
            let _ = roots.add(cert);
        }
        if let Some(path) = &target.ca_file {
            use rustls::pki_types::pem::PemObject;
            let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("ca_file {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
            }
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| format!("trust roots: {e}"))?;
        if let Ok(mut cache) = self.verifiers.lock() {
            cache.insert(key, verifier.clone());
        }
        Ok(verifier)
    }
}

/// Builds the request that goes on the wire with the credential in it.
pub(super) fn arm(
    trust: &Trust,
    config: &Config,
    bound: &Bound<Plan>,
    secret: Secret,
) -> Result<Armed, Failure> {
    let p = &bound.plan;
    let Some(target) = config.http_target(&bound.target).cloned() else {
        return Err(Failure {
            phase: Phase::Validation,
            code: Code::FingerprintMismatch,
            retry: Retry::AfterCorrection,
            message: "The target changed after this request was bound; nothing was sent.".into(),
        });
    };
    let mut url = p.http.url();
    let mut headers: Vec<(String, String)> = p.request.headers.clone();
    // The broker owns the coding: what it cannot decode it cannot scrub.
    headers.push(("accept-encoding".into(), "identity".into()));
    // Every rendered form of the credential feeds the redactor.
    let secret_text = Zeroizing::new(String::from_utf8_lossy(secret.expose()).into_owned());
    let mut rendered: Zeroizing<Vec<Vec<u8>>> = Zeroizing::new(Vec::new());
    match &target.inject {
        Injection::Header { name, format } => {
            let value = format.replace("{secret}", secret_text.as_str());
            rendered.push(value.clone().into_bytes());
            headers.push((name.clone(), value));
        }
        Injection::Basic { user } => {
            use base64::Engine;
            let pair = format!("{user}:{}", secret_text.as_str());
            let value = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())
            );
            rendered.push(pair.into_bytes());
            rendered.push(value.clone().into_bytes());
            headers.push(("authorization".into(), value));
        }
        Injection::Query { param } => {
            let sep = if url.contains('?') { '&' } else { '?' };
            url = format!(
                "{url}{sep}{}={}",
                percent_encode(param.as_bytes()),
                percent_encode(secret.expose())
            );
        }
    }
    if let (Some(contract), Some(key)) = (&target.idempotency, &bound.idempotency_key) {
        headers.push((contract.header.clone(), key.clone()));
    }
    let rendered_refs: Vec<&[u8]> = rendered.iter().map(Vec::as_slice).collect();
    let redactor = Redactor::new(secret.expose(), &rendered_refs);
    drop(secret_text);
    drop(secret);

    let verifier = if p.http.scheme == "https" {
        // The local TLS setup (trust roots, ca_file) failed: nothing was sent.
        Some(trust.verifier(&target).map_err(|message| Failure {
            phase: Phase::ConnectionSetup,
            code: Code::TlsRejected,
            retry: Retry::AfterCorrection,
            message,
        })?)
    } else {
        None
    };
    Ok(Armed {
        target,
        url,
        headers,
        redactor,
        verifier,
    })
}

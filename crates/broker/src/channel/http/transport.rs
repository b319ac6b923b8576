//! One HTTP attempt over reqwest, with every boundary the contract needs made visible
//! through reqwest's extension points rather than by reading error strings:
//!
//! - a DNS resolver that records the `dns` stage and runs the [address
//!   guard](crate::channel::guard) on the addresses it hands to the connector;
//! - a rustls certificate verifier (system roots plus the target's `ca_file`) that
//!   records the `tls_handshake` verdict and the verified peer identity;
//! - a connector layer that runs when TCP and TLS are done and, before handing the
//!   connection to hyper, makes DISPATCH_STARTED durable (re-verifying the fingerprint):
//!   no request byte can reach the socket before that append returns;
//! - a request body that marks when hyper took the headers and the last body byte.
//!
//! Each attempt gets its own client with pooling off, so a connection is never reused
//! (no "write on a stale pooled socket" ambiguity), redirects are never followed by the
//! library, reqwest's own proxy support is never consulted and its retries are off. A
//! target with a proxy goes through [`super::tunnel`] instead, which reuses the probe,
//! the verifier and the gate from here.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::channel::guard::{AddressPolicy, LookupError, Refusal, Resolver};
use crate::contract::{Code, Stage};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the TLS verifier concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsVerdict {
    Verified { peer: String },
    Rejected { reason: &'static str },
}

/// What the dispatch gate concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateVerdict {
    /// DISPATCH_STARTED is durable; the connection went to hyper.
    Dispatched,
    /// The gate refused (fingerprint changed, lease lost, journal failed); the
    /// connection was dropped before any byte.
    Refused,
}

/// Observations of one attempt, written from resolver, verifier, connector and body
/// (possibly on other threads) and read once the exchange ends.
#[derive(Debug, Default)]
pub struct Probe {
    dns: Mutex<Option<Result<(), ()>>>,
    refused: Mutex<Option<Refusal>>,
    tls: Mutex<Option<TlsVerdict>>,
    connected: AtomicBool,
    /// A TCP connection to the target's proxy was made.
    proxy_connected: AtomicBool,
    /// The proxy answered CONNECT with 2xx: the tunnel to the origin is open.
    tunnel_open: AtomicBool,
    gate: Mutex<Option<GateVerdict>>,
    headers_taken: AtomicBool,
    body_taken: AtomicBool,
}

impl Probe {
    pub fn dns(&self) -> Option<Result<(), ()>> {
        self.dns.lock().ok().and_then(|g| *g)
    }
    /// The address the guard refused, if it did.
    pub fn refused(&self) -> Option<Refusal> {
        self.refused.lock().ok().and_then(|g| *g)
    }
    /// Records a refusal made before the client was built (an IP-literal host).
    pub fn refuse(&self, refusal: Refusal) {
        Probe::set(&self.refused, refusal);
    }
    pub fn tls(&self) -> Option<TlsVerdict> {
        self.tls.lock().ok().and_then(|g| g.clone())
    }
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }
    pub fn proxy_connected(&self) -> bool {
        self.proxy_connected.load(Ordering::SeqCst)
    }
    pub fn tunnel_open(&self) -> bool {
        self.tunnel_open.load(Ordering::SeqCst)
    }
    pub(super) fn mark_proxy_connected(&self) {
        self.proxy_connected.store(true, Ordering::SeqCst);
    }
    pub(super) fn mark_tunnel_open(&self) {
        self.tunnel_open.store(true, Ordering::SeqCst);
    }
    pub fn gate(&self) -> Option<GateVerdict> {
        self.gate.lock().ok().and_then(|g| g.clone())
    }
    /// hyper took the request head and started on the body.
    pub fn headers_taken(&self) -> bool {
        self.headers_taken.load(Ordering::SeqCst)
    }
    /// hyper took the last body byte.
    pub fn body_taken(&self) -> bool {
        self.body_taken.load(Ordering::SeqCst)
    }
    fn set<T>(slot: &Mutex<Option<T>>, value: T) {
        if let Ok(mut g) = slot.lock() {
            *g = Some(value);
        }
    }

    /// The connection-setup stage that failed and its code, judged from what was
    /// observed (never from an error message). `io_kind` is the kind of the first
    /// `std::io::Error` in the failure's source chain, if any; `tls_error` whether a
    /// `rustls::Error` was in it; `out_of_descriptors` whether the broker could not
    /// open a socket at all ([`crate::platform::out_of_descriptors`]): BROKER_UNAVAILABLE
    /// and backoff, never a refused connection or a rejected certificate (issue 26).
    pub fn setup_failure(
        &self,
        https: bool,
        io_kind: Option<std::io::ErrorKind>,
        tls_error: bool,
        out_of_descriptors: bool,
    ) -> (Stage, Code) {
        use std::io::ErrorKind as K;
        if out_of_descriptors && self.tls().is_none() {
            return (Stage::TcpConnect, Code::BrokerUnavailable);
        }
        if self.refused().is_some() {
            return (Stage::AddressGuard, Code::AddressRefused);
        }
        if self.dns() == Some(Err(())) {
            return (Stage::Dns, Code::DnsFailed);
        }
        if let Some(TlsVerdict::Rejected { .. }) = self.tls() {
            return (Stage::TlsHandshake, Code::TlsRejected);
        }
        let tcp_failed = matches!(
            io_kind,
            Some(
                K::ConnectionRefused
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::AddrNotAvailable
                    | K::TimedOut
            )
        );
        if !tcp_failed && https && (tls_error || self.tls().is_some() || io_kind.is_some()) {
            // A TCP connect either succeeds or fails with one of the kinds above; any
            // other failure on an https connection happened during the handshake.
            return (Stage::TlsHandshake, Code::TlsRejected);
        }
        if io_kind == Some(K::TimedOut) {
            return (Stage::TcpConnect, Code::ConnectTimeout);
        }
        (Stage::TcpConnect, Code::ConnectionRefused)
    }
}

/// What a failure's source chain says: the first `io::Error` kind, whether a
/// `rustls::Error` appears in it, and whether an `io::Error` in it is the broker out of
/// descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChainFacts {
    pub io_kind: Option<std::io::ErrorKind>,
    pub tls: bool,
    pub out_of_descriptors: bool,
}

/// [`ChainFacts`] of `err`.
pub fn error_chain_facts(err: &(dyn std::error::Error + 'static)) -> ChainFacts {
    let mut io_kind = None;
    let mut tls = false;
    let mut out_of_descriptors = false;
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            io_kind.get_or_insert(io.kind());
            out_of_descriptors |= crate::platform::out_of_descriptors(io);
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                tls = true;
            }
        }
        if e.downcast_ref::<rustls::Error>().is_some() {
            tls = true;
        }
        current = e.source();
    }
    ChainFacts {
        io_kind,
        tls,
        out_of_descriptors,
    }
}

/// Records the DNS stage and guards what it resolved: the connector is handed exactly
/// the checked addresses, so nothing else can be connected to. IP literals never reach
/// it (the exchange checks those before building the client).
pub struct RecordingResolver {
    pub probe: Arc<Probe>,
    pub resolver: Resolver,
    pub policy: AddressPolicy,
}

impl reqwest::dns::Resolve for RecordingResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let probe = self.probe.clone();
        let resolver = self.resolver.clone();
        let policy = self.policy;
        let host = name.as_str().to_string();
        Box::pin(async move {
            match resolver.lookup_checked(&host, policy).await {
                Ok(addrs) => {
                    Probe::set(&probe.dns, Ok(()));
                    let addrs = addrs.into_iter().map(|ip| SocketAddr::new(ip, 0));
                    Ok(Box::new(addrs) as reqwest::dns::Addrs)
                }
                Err(LookupError::Refused(refusal)) => {
                    Probe::set(&probe.dns, Ok(()));
                    Probe::set(&probe.refused, refusal);
                    Err(BoxError::from(refusal))
                }
                Err(e) => {
                    Probe::set(&probe.dns, Err(()));
                    Err(BoxError::from(e))
                }
            }
        })
    }
}

/// Verifies like webpki (system roots plus `ca_file`) and records the verdict and the
/// peer identity (blake3 of the end-entity certificate).
#[derive(Debug)]
pub struct RecordingVerifier {
    pub inner: Arc<WebPkiServerVerifier>,
    pub probe: Arc<Probe>,
}

fn certificate_reason(e: &rustls::Error) -> &'static str {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "expired",
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "not yet valid"
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "not valid for this host name"
            }
            CertificateError::UnknownIssuer => "issued by an untrusted authority",
            CertificateError::Revoked => "revoked",
            _ => "invalid",
        },
        _ => "rejected",
    }
}

impl ServerCertVerifier for RecordingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match &verdict {
            Ok(_) => Probe::set(
                &self.probe.tls,
                TlsVerdict::Verified {
                    peer: format!("cert-blake3:{}", blake3::hash(end_entity.as_ref()).to_hex()),
                },
            ),
            Err(e) => Probe::set(
                &self.probe.tls,
                TlsVerdict::Rejected {
                    reason: certificate_reason(e),
                },
            ),
        }
        verdict
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The check that runs between "connection ready" and "first byte": appends
/// DISPATCH_STARTED durably. Returns false to refuse the connection.
pub type Gate = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// Holds a ready connection (TCP and TLS done, and the proxy tunnel if any) until `gate`
/// has made dispatch durable, and records the verdict. Nothing may be written to the
/// connection unless this returned true.
pub async fn pass_gate(probe: &Probe, gate: &Gate) -> bool {
    probe.connected.store(true, Ordering::SeqCst);
    if gate().await {
        Probe::set(&probe.gate, GateVerdict::Dispatched);
        true
    } else {
        Probe::set(&probe.gate, GateVerdict::Refused);
        false
    }
}

/// A connector layer that holds the connection until the gate has made dispatch
/// durable.
#[derive(Clone)]
pub struct DispatchLayer {
    pub probe: Arc<Probe>,
    pub gate: Gate,
}

impl<S> tower_layer::Layer<S> for DispatchLayer {
    type Service = DispatchService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        DispatchService {
            inner,
            probe: self.probe.clone(),
            gate: self.gate.clone(),
        }
    }
}

#[derive(Clone)]
pub struct DispatchService<S> {
    inner: S,
    probe: Arc<Probe>,
    gate: Gate,
}

/// The gate refused the connection; the request was never written.
#[derive(Debug)]
pub struct GateRefused;

impl std::fmt::Display for GateRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dispatch refused before the first byte")
    }
}
impl std::error::Error for GateRefused {}

impl<S, R> tower_service::Service<R> for DispatchService<S>
where
    S: tower_service::Service<R, Error = BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let connecting = self.inner.call(request);
        let probe = self.probe.clone();
        let gate = self.gate.clone();
        Box::pin(async move {
            let conn = connecting.await?;
            if pass_gate(&probe, &gate).await {
                Ok(conn)
            } else {
                Err(BoxError::from(GateRefused))
            }
        })
    }
}

/// A request body that marks when hyper takes it: the first poll comes after the head
/// was queued for writing, and it hands over the whole body at once.
pub struct MarkingBody {
    data: Option<Bytes>,
    probe: Arc<Probe>,
}

impl MarkingBody {
    pub fn new(data: Bytes, probe: Arc<Probe>) -> Self {
        let data = if data.is_empty() { None } else { Some(data) };
        MarkingBody { data, probe }
    }
}

impl http_body::Body for MarkingBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.probe.headers_taken.store(true, Ordering::SeqCst);
        // The whole body is one frame: once hyper takes it, every body byte has been
        // handed to the transport (with a known length hyper may not poll again).
        self.probe.body_taken.store(true, Ordering::SeqCst);
        match self.data.take() {
            Some(data) => Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// The codings a response says its body carries, in the order the remote applied them:
/// every `content-encoding` value, then every `transfer-encoding` value except the
/// final `chunked` (hyper undoes that framing; anything else would reach us encoded).
/// Tokens are lowercased; `identity` is dropped.
pub fn codings(headers: &reqwest::header::HeaderMap) -> Vec<String> {
    let tokens = |name: &str| -> Vec<String> {
        let mut out = Vec::new();
        for value in headers.get_all(name) {
            for token in String::from_utf8_lossy(value.as_bytes()).split(',') {
                let token = token.trim().to_ascii_lowercase();
                if !token.is_empty() {
                    out.push(token);
                }
            }
        }
        out
    };
    let mut all = tokens("content-encoding");
    let mut transfer = tokens("transfer-encoding");
    if transfer.last().is_some_and(|t| t == "chunked") {
        transfer.pop();
    }
    all.extend(transfer);
    all.retain(|t| t != "identity");
    all
}

/// A received body, made scrubbable.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// No coding: the body as received.
    Plain(Vec<u8>),
    /// Every coding undone; `from` lists them as the remote applied them.
    Decoded { body: Vec<u8>, from: String },
    /// A coding the broker cannot undo, or a body that did not decode: nothing it cannot
    /// scrub is returned or stored.
    Withheld(super::BodyWithheld),
    /// Decoding produced more than the limit (a decompression bomb, or just too big).
    TooLarge,
}

/// How a single decoding step failed.
enum Fault {
    Corrupt,
    TooLarge,
}

/// Undoes `codings` (last applied first) with every intermediate and the final body
/// bounded by `limit` bytes.
pub fn decode_body(codings: &[String], body: Vec<u8>, limit: u64) -> Decoded {
    if codings.is_empty() {
        return Decoded::Plain(body);
    }
    if let Some(unknown) = codings
        .iter()
        .find(|c| !matches!(c.as_str(), "gzip" | "x-gzip" | "deflate"))
    {
        return Decoded::Withheld(super::BodyWithheld::UnsupportedEncoding {
            coding: unknown.clone(),
        });
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut current = body;
    for coding in codings.iter().rev() {
        let step = match coding.as_str() {
            "deflate" => inflate(&current, limit),
            _ => gunzip(&current, limit),
        };
        current = match step {
            Ok(next) => next,
            Err(Fault::TooLarge) => return Decoded::TooLarge,
            Err(Fault::Corrupt) => {
                return Decoded::Withheld(super::BodyWithheld::UndecodableBody {
                    coding: coding.clone(),
                });
            }
        };
    }
    Decoded::Decoded {
        body: current,
        from: codings.join(", "),
    }
}

/// gzip (RFC 1952), one member or several; the trailer's CRC and length are checked, so
/// a truncated stream is corrupt, not short.
fn gunzip(input: &[u8], limit: usize) -> Result<Vec<u8>, Fault> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(input)
        .take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|_| Fault::Corrupt)?;
    if out.len() > limit {
        return Err(Fault::TooLarge);
    }
    Ok(out)
}

/// `deflate` as servers send it: the zlib format RFC 9110 §8.4.1.2 names, or the raw
/// deflate stream some send instead (told apart by the zlib header check). The stream
/// must end properly and nothing may follow it.
fn inflate(input: &[u8], limit: usize) -> Result<Vec<u8>, Fault> {
    use flate2::{Decompress, FlushDecompress, Status};
    const STEP: usize = 64 * 1024;
    let zlib = match input {
        [cmf, flg, ..] => cmf & 0x0F == 8 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0,
        _ => false,
    };
    let mut inflater = Decompress::new(zlib);
    let mut out: Vec<u8> = Vec::new();
    loop {
        let room = limit.saturating_add(1).saturating_sub(out.len());
        if room == 0 {
            return Err(Fault::TooLarge);
        }
        if out.len() == out.capacity() {
            out.reserve_exact(room.min(STEP.max(out.len())));
        }
        let consumed = usize::try_from(inflater.total_in()).map_err(|_| Fault::Corrupt)?;
        let produced = out.len();
        let rest = input.get(consumed..).ok_or(Fault::Corrupt)?;
        let status = inflater
            .decompress_vec(rest, &mut out, FlushDecompress::None)
            .map_err(|_| Fault::Corrupt)?;
        if out.len() > limit {
            return Err(Fault::TooLarge);
        }
        let used = usize::try_from(inflater.total_in()).map_err(|_| Fault::Corrupt)?;
        match status {
            Status::StreamEnd if used == input.len() => return Ok(out),
            Status::StreamEnd => return Err(Fault::Corrupt),
            // No progress with room left: the input ended before the stream did.
            _ if used == consumed && out.len() == produced && out.len() < out.capacity() => {
                return Err(Fault::Corrupt);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::http::BodyWithheld;
    use crate::contract::{Outcome, Retry};
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn list(codings: &[&str]) -> Vec<String> {
        codings.iter().map(|c| c.to_string()).collect()
    }

    // Regression: issue 10
    #[test]
    fn gzip_zlib_raw_deflate_and_stacked_codings_decode_in_reverse_order() {
        let plain = b"secret=pstn-canary".to_vec();
        let decoded = |codings: &[&str], body: Vec<u8>| decode_body(&list(codings), body, 1 << 20);
        let ok = |from: &str| Decoded::Decoded {
            body: plain.clone(),
            from: from.to_string(),
        };
        assert_eq!(decoded(&["gzip"], gzip(&plain)), ok("gzip"));
        assert_eq!(decoded(&["x-gzip"], gzip(&plain)), ok("x-gzip"));
        assert_eq!(decoded(&["deflate"], zlib(&plain)), ok("deflate"));
        assert_eq!(decoded(&["deflate"], raw_deflate(&plain)), ok("deflate"));
        assert_eq!(
            decoded(&["gzip", "deflate"], zlib(&gzip(&plain))),
            ok("gzip, deflate")
        );
        assert_eq!(decoded(&[], plain.clone()), Decoded::Plain(plain.clone()));
    }

    // Regression: issue 10
    #[test]
    fn unknown_codings_and_broken_streams_are_withheld_and_bombs_are_too_large() {
        let plain = b"secret=pstn-canary".to_vec();
        for coding in ["br", "zstd", "compress", "x-custom"] {
            assert_eq!(
                decode_body(&list(&["gzip", coding]), gzip(&plain), 1 << 20),
                Decoded::Withheld(BodyWithheld::UnsupportedEncoding {
                    coding: coding.to_string()
                })
            );
        }
        let mut truncated = gzip(&plain);
        truncated.truncate(truncated.len() - 6);
        for (coding, body) in [
            ("gzip", truncated),
            ("gzip", plain.clone()),
            ("deflate", zlib(&plain)[..8].to_vec()),
            ("deflate", plain.clone()),
        ] {
            assert_eq!(
                decode_body(&list(&[coding]), body, 1 << 20),
                Decoded::Withheld(BodyWithheld::UndecodableBody {
                    coding: coding.to_string()
                }),
                "{coding}"
            );
        }
        let bomb = vec![0u8; 8 << 20];
        assert_eq!(
            decode_body(&list(&["gzip"]), gzip(&bomb), 1 << 20),
            Decoded::TooLarge
        );
        assert_eq!(
            decode_body(&list(&["deflate"]), zlib(&bomb), 1 << 20),
            Decoded::TooLarge
        );
        // Exactly at the limit is fine.
        assert!(matches!(
            decode_body(&list(&["deflate"]), raw_deflate(&bomb), 8 << 20),
            Decoded::Decoded { .. }
        ));
    }

    #[test]
    fn codings_read_both_headers_and_ignore_identity_and_chunked() {
        let mut h = reqwest::header::HeaderMap::new();
        h.append("content-encoding", "GZIP, identity".parse().unwrap());
        h.append("content-encoding", "deflate".parse().unwrap());
        h.append("transfer-encoding", "gzip, chunked".parse().unwrap());
        assert_eq!(codings(&h), list(&["gzip", "deflate", "gzip"]));
    }

    /// An error chain as reqwest builds one: its own error around hyper's around the
    /// connector's io::Error.
    #[derive(Debug)]
    struct Wrapped(Box<dyn std::error::Error + Send + Sync + 'static>);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "wrapped")
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(self.0.as_ref())
        }
    }

    // Regression: issue 26 (item 4): a broker out of descriptors reported other users'
    // HTTP calls as CONNECTION_REFUSED (after_correction), and over https as a rejected
    // certificate.
    #[test]
    fn a_socket_the_broker_could_not_open_is_broker_unavailable_not_the_remotes_doing() {
        #[cfg(unix)]
        let codes = [
            rustix::io::Errno::MFILE.raw_os_error(),
            rustix::io::Errno::NFILE.raw_os_error(),
        ];
        #[cfg(windows)]
        let codes = [10024];
        for code in codes {
            let chain = Wrapped(Box::new(Wrapped(Box::new(
                std::io::Error::from_raw_os_error(code),
            ))));
            let facts = error_chain_facts(&chain);
            assert!(facts.out_of_descriptors, "{code}");
            for https in [false, true] {
                let (stage, code) = Probe::default().setup_failure(
                    https,
                    facts.io_kind,
                    facts.tls,
                    facts.out_of_descriptors,
                );
                assert_eq!((stage, code), (Stage::TcpConnect, Code::BrokerUnavailable));
                assert_eq!(code.spec().retry, Retry::Backoff);
                assert_eq!(code.spec().outcome, Some(Outcome::NotAttempted));
            }
        }
        // A refused connection is still the remote's answer.
        let refused = Wrapped(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let facts = error_chain_facts(&refused);
        assert!(!facts.out_of_descriptors);
        assert_eq!(
            Probe::default().setup_failure(false, facts.io_kind, facts.tls, false),
            (Stage::TcpConnect, Code::ConnectionRefused)
        );
    }
}

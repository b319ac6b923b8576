//! An adversarial HTTP/1.1 server for tests.
//!
//! [`Adversary`] listens on `127.0.0.1:0` (plain TCP, or TLS with a certificate from a
//! [`TestPki`]) and answers every connection with one configured [`Behavior`]: a normal
//! response, or one of the ways a real server misbehaves at the byte level (closing before
//! or after applying a request, a short body, broken chunked framing, a stall, ...). It is
//! written on raw tokio TCP on purpose, so that it can send exactly the bytes a behaviour
//! asks for.
//!
//! # Protocol
//!
//! * One request per connection. Every complete response carries `connection: close` and the
//!   server closes the connection after writing it, so "connection n" in [`Behavior::Sequence`]
//!   is also "request n" for a client that honours `connection: close`.
//! * The server reads the request line and the header block (up to 64 KiB), then the body
//!   framed by `transfer-encoding: chunked` or `content-length` (no framing = empty body).
//!   If the request carries `expect: 100-continue`, `100 Continue` is sent before the body is
//!   read (except by [`Behavior::ReadHeadersThenClose`], which never reads the body).
//! * Everything the server parsed is recorded as a [`SeenRequest`] *before* the server
//!   responds or closes, so once a client has seen the response (or the close), the record
//!   and the effect counter are up to date. [`Behavior::Stall`] and
//!   [`Behavior::StallThenRespond`] are the exception: the client sees nothing until
//!   [`Adversary::release`]; use [`Adversary::wait_for_effects`] there.
//!
//! # Effects
//!
//! [`Adversary::effects`] counts requests the server *applied* (the side effect a retry
//! could duplicate):
//!
//! | behaviour | applies |
//! |---|---|
//! | `Respond` | every request whose method is not `GET`/`HEAD`/`OPTIONS` |
//! | `ApplyThenClose`, `ApplyThen500`, `ShortBody`, `BrokenChunked`, `Stall`, `StallThenRespond` | every request it read completely, whatever the method |
//! | `ApplyThenCloseWithLookup` | every request that is not a `GET`/`HEAD` |
//! | `BatchApplyThenCloseWithLookup` | the first `apply` members of every batch that is not a `GET`/`HEAD` |
//! | `Idempotent` | the first use of each key (and every keyless non-`GET` request) |
//! | `CloseBeforeReading`, `ReadHeadersThenClose`, `ContinueThenClose`, `Status`, `EchoAuthorization`, `EchoCompressed`, `CompressionBomb`, `EchoHeadersEncoded` | never |
//!
//! # Shutdown
//!
//! Dropping the [`Adversary`] stops the accept loop and closes every connection it still
//! holds (including stalled ones). Nothing here blocks the test process from exiting.
//!
//! # TLS
//!
//! [`TestPki::new`] makes a test root CA and four server certificates ([`TestCert`]). A client
//! trusts the CA through [`TestPki::ca_pem`], [`TestPki::write_ca`] (a `ca_file`), or
//! [`TestPki::client_config`]. All rustls configs here use the `aws_lc_rs` provider
//! explicitly and never install a process-wide default provider. The TLS server offers ALPN
//! `http/1.1` only, so an HTTP/2-capable client falls back to HTTP/1.1.

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

/// Error type of the setup helpers (PKI generation, TLS configs).
pub type SetupError = Box<dyn Error + Send + Sync>;

/// Largest request header block the server accepts.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body the server accepts.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// How long a TLS handshake may take before the server gives up on the connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A response header: `(name, value)`.
pub type Header = (String, String);

/// What the server does with every connection. See the module docs for which behaviours
/// count an effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// A normal complete response. Applies (effect += 1) when the method is not
    /// `GET`/`HEAD`/`OPTIONS`. `content-length` and `connection: close` are added unless
    /// `headers` already has them (a `transfer-encoding` header also suppresses
    /// `content-length`; `body` is then sent as given).
    Respond {
        status: u16,
        headers: Vec<Header>,
        body: Vec<u8>,
    },
    /// Accept, then close at once without reading a byte (for TLS: before the handshake).
    /// The kernel may turn this into a reset if the request had already arrived.
    CloseBeforeReading,
    /// Read the request line and headers, then close: no body read, no response, no effect.
    /// The request is recorded with `body_complete == false`. If body bytes had already
    /// arrived, the kernel may turn the close into a reset.
    ReadHeadersThenClose,
    /// Read the whole request, apply it, close without responding.
    ApplyThenClose,
    /// Read the whole request, apply it, then answer a complete `500` with a small JSON body.
    ApplyThen500,
    /// A complete response that never applies anything: 401, 429 + `Retry-After`,
    /// 202 + `Location`, 307 + `Location`, ... Framing headers as for `Respond`.
    Status {
        status: u16,
        headers: Vec<Header>,
        body: Vec<u8>,
    },
    /// After the headers, send `HTTP/1.1 100 Continue` (whether or not the client asked),
    /// read the body, then close without a final response. Applies nothing.
    ContinueThenClose,
    /// Apply, answer `200` with `content-length: declared` but only `sent` body bytes
    /// (ASCII `x`), then close.
    ShortBody { declared: usize, sent: usize },
    /// Apply, answer `200` with `transfer-encoding: chunked`, one valid chunk
    /// (`5\r\nhello\r\n`), then a non-hex chunk size line, then close.
    BrokenChunked,
    /// Read the request, apply it, then hold the connection open without a byte until
    /// [`Adversary::release`] is called (then answer `200 {"released":true}`), the client
    /// goes away (its side reads EOF, so a client that half-closes counts as gone), or the
    /// server is dropped. Release is sticky: after it, later `Stall`
    /// connections answer at once.
    Stall,
    /// Like `Stall`, but on release answer a complete `status` with `body`
    /// (`content-type: application/octet-stream`): a large answer that arrives only when
    /// the test says so (after it changed the client's environment, say).
    StallThenRespond { status: u16, body: Vec<u8> },
    /// Apply nothing; answer `200` with header `x-echo-auth: <Authorization value>` and a
    /// JSON body `{"authorization": <value or null>, "query": <raw query or null>}`.
    EchoAuthorization,
    /// Apply nothing; answer `200` with the body `secret=<token>` (the `Authorization`
    /// value after its scheme, or the raw query), encoded as `encoding` says, whatever
    /// the request's `accept-encoding`. See [`Encoding`].
    EchoCompressed { encoding: Encoding },
    /// Apply nothing; answer `200`, `content-encoding: gzip`, with a gzip stream of
    /// `inflated` zero bytes (a few KiB on the wire).
    CompressionBomb { inflated: usize },
    /// Apply nothing; answer `200` with a text body listing the request target and every
    /// request header value in many encodings (see [`encodings`]), plus response headers
    /// `x-request-id` (the raw `Authorization` value), `x-echo-hex` and `x-echo-b64`.
    EchoHeadersEncoded,
    /// A de-duplicating API (Stripe-like), keyed by request header `header`:
    ///
    /// * non-`GET` with the key, first time: apply, store (blake3 of the body, response),
    ///   answer `201 {"id":"pay_<n>","key":"<key>"}` (n counts applications from 1). With
    ///   `close_after_apply_first`, close without responding instead (the stored response
    ///   is still what repeats get).
    /// * same key, same body: the stored response plus `idempotent-replayed: true`, no effect.
    /// * same key, different body: `422 {"error":"idempotency_key_reused"}`, no effect.
    /// * non-`GET` without the key: applied every time, `201 {"id":"pay_<n>","key":null}`.
    /// * `GET <any path>?idempotency_key=K`: `200` with the stored body if `K` was applied,
    ///   else `404` (the reconciliation query). Any other `GET`/`HEAD`: `404`.
    Idempotent {
        header: String,
        close_after_apply_first: bool,
    },
    /// Like `ApplyThenClose` for any method but `GET`/`HEAD` (which are never applied). A
    /// `GET` to *any* path (query ignored) is the reconciliation lookup: `200` with
    /// `{"applied":<effects>}` once anything was applied, else `404 {"applied":0}`.
    ApplyThenCloseWithLookup,
    /// A batch endpoint that fails part-way: a request that is not a `GET`/`HEAD` is read
    /// as `{"items":[{"id":..},...]}`, its first `apply` members are applied (one effect
    /// each, their ids remembered) and the connection closes without an answer. A `GET`
    /// whose path ends in `/<id>` is the member lookup: `200 {"id":..}` if that member
    /// was applied, else `404`.
    BatchApplyThenCloseWithLookup { apply: usize },
    /// Connection n (0-based, in accept order) gets behaviour n; the last one repeats. An
    /// empty sequence behaves like `CloseBeforeReading`.
    Sequence(Vec<Behavior>),
}

impl Behavior {
    /// `Respond` with `status`, no extra headers, and `body`.
    pub fn respond(status: u16, body: impl Into<Vec<u8>>) -> Behavior {
        Behavior::Respond {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// `Respond` 200 with a JSON body (`content-type: application/json`).
    pub fn ok_json(body: &str) -> Behavior {
        Behavior::respond(200, body).header("content-type", "application/json")
    }

    /// `Status` with `status`, no extra headers, and an empty body.
    pub fn status(status: u16) -> Behavior {
        Behavior::Status {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// `Idempotent` keyed by header `header`, answering every application.
    pub fn idempotent(header: &str) -> Behavior {
        Behavior::Idempotent {
            header: header.to_string(),
            close_after_apply_first: false,
        }
    }

    /// Adds a response header to `Respond`/`Status`; other behaviours are returned unchanged.
    pub fn header(mut self, name: &str, value: &str) -> Behavior {
        if let Behavior::Respond { headers, .. } | Behavior::Status { headers, .. } = &mut self {
            headers.push((name.to_string(), value.to_string()));
        }
        self
    }

    /// Replaces the body of `Respond`/`Status`; other behaviours are returned unchanged.
    pub fn body(mut self, new_body: impl Into<Vec<u8>>) -> Behavior {
        if let Behavior::Respond { body, .. } | Behavior::Status { body, .. } = &mut self {
            *body = new_body.into();
        }
        self
    }

    /// The behaviour connection `n` gets (resolves `Sequence`, also nested).
    fn for_connection(&self, n: u64) -> &Behavior {
        match self {
            Behavior::Sequence(steps) => {
                let index = usize::try_from(n).unwrap_or(usize::MAX);
                match steps.get(index).or_else(|| steps.last()) {
                    Some(step) => step.for_connection(n),
                    None => &Behavior::CloseBeforeReading,
                }
            }
            other => other,
        }
    }
}

/// How [`Behavior::EchoCompressed`] encodes its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// gzip, `content-encoding: gzip`.
    Gzip,
    /// zlib (RFC 1950), `content-encoding: deflate`.
    Zlib,
    /// Raw deflate (RFC 1951), `content-encoding: deflate`, as some servers send it.
    RawDeflate,
    /// gzip then zlib, `content-encoding: gzip, deflate`.
    GzipThenDeflate,
    /// gzip, but sent as `transfer-encoding: gzip, chunked` (no content-encoding).
    TransferGzip,
    /// gzip bytes labelled with another coding (`br`, `zstd`, anything).
    Labelled(String),
    /// The plain body labelled `content-encoding: gzip` (a stream that cannot decode).
    Corrupt,
}

/// One request as the server parsed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenRequest {
    /// 0-based index of the connection it arrived on.
    pub connection: u64,
    /// As sent, e.g. `POST`.
    pub method: String,
    /// The request target as sent: path plus `?query`.
    pub target: String,
    /// All headers in order, names lowercased, values trimmed.
    pub headers: Vec<Header>,
    /// The body bytes read (de-chunked).
    pub body: Vec<u8>,
    /// False when the server did not read the body to its end (`ReadHeadersThenClose`,
    /// or the client went away / sent bad framing mid-body).
    pub body_complete: bool,
}

impl SeenRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path part of the target.
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(&self.target, |(p, _)| p)
    }

    /// The raw query string (after `?`), if any.
    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    /// Whether `needle` occurs anywhere the client could have put it: the target, any
    /// header name or value, or the body. For asserting that a secret never arrived.
    pub fn mentions(&self, needle: &str) -> bool {
        let bytes = needle.as_bytes();
        self.target.contains(needle)
            || self
                .headers
                .iter()
                .any(|(n, v)| n.contains(needle) || v.contains(needle))
            || (!bytes.is_empty() && self.body.windows(bytes.len()).any(|w| w == bytes))
    }
}

/// Which server certificate a TLS [`Adversary`] presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TestCert {
    /// SAN `localhost` + `127.0.0.1`, signed by the test CA, valid now.
    Valid,
    /// Valid names and issuer, but `not_after` in 2001.
    Expired,
    /// SAN `other.test` only, signed by the test CA.
    WrongName,
    /// Valid names, signed by a different CA that clients do not trust.
    Untrusted,
}

struct Leaf {
    chain: Vec<CertificateDer<'static>>,
    key_pkcs8: Vec<u8>,
}

/// A test PKI: a root CA clients can trust, and one server certificate per [`TestCert`].
/// Cheap to clone.
#[derive(Clone)]
pub struct TestPki {
    inner: Arc<PkiInner>,
}

struct PkiInner {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    leaves: HashMap<TestCert, Leaf>,
}

impl fmt::Debug for TestPki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestPki").finish_non_exhaustive()
    }
}

fn ca_cert_params(common_name: &str) -> Result<CertificateParams, SetupError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

fn leaf(
    names: &[&str],
    expired: bool,
    issuer: &Issuer<'_, KeyPair>,
    issuer_der: &CertificateDer<'static>,
) -> Result<Leaf, SetupError> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "postern adversary test server");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    if expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok(Leaf {
        chain: vec![cert.der().clone(), issuer_der.clone()],
        key_pkcs8: key.serialize_der(),
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

impl TestPki {
    /// Generates the test CA, a second (untrusted) CA, and the four server certificates.
    pub fn new() -> Result<TestPki, SetupError> {
        let ca_key = KeyPair::generate()?;
        let ca_params = ca_cert_params("postern test root CA")?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = Issuer::new(ca_params, ca_key);
        let ca_der = ca_cert.der().clone();

        let rogue_key = KeyPair::generate()?;
        let rogue_params = ca_cert_params("postern untrusted CA")?;
        let rogue_cert = rogue_params.self_signed(&rogue_key)?;
        let rogue = Issuer::new(rogue_params, rogue_key);
        let rogue_der = rogue_cert.der().clone();

        let good_names = ["localhost", "127.0.0.1"];
        let mut leaves = HashMap::new();
        leaves.insert(TestCert::Valid, leaf(&good_names, false, &ca, &ca_der)?);
        leaves.insert(TestCert::Expired, leaf(&good_names, true, &ca, &ca_der)?);
        leaves.insert(
            TestCert::WrongName,
            leaf(&["other.test"], false, &ca, &ca_der)?,
        );
        leaves.insert(
            TestCert::Untrusted,
            leaf(&good_names, false, &rogue, &rogue_der)?,
        );
        Ok(TestPki {
            inner: Arc::new(PkiInner {
                ca_pem: ca_cert.pem(),
                ca_der,
                leaves,
            }),
        })
    }

    /// The test root CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.inner.ca_pem.clone()
    }

    /// The test root CA certificate, DER.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.inner.ca_der.clone()
    }

    /// Writes the CA certificate to `dir/postern-test-ca.pem` and returns that path.
    pub fn write_ca(&self, dir: &Path) -> io::Result<PathBuf> {
        let path = dir.join("postern-test-ca.pem");
        std::fs::write(&path, self.inner.ca_pem.as_bytes())?;
        Ok(path)
    }

    /// A root store holding only the test CA.
    pub fn root_store(&self) -> Result<RootCertStore, SetupError> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der())?;
        Ok(roots)
    }

    /// A rustls client config (aws_lc_rs provider) that trusts only the test CA.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, SetupError> {
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.root_store()?)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// A rustls server config (aws_lc_rs provider, ALPN `http/1.1`) presenting `cert`.
    pub fn server_config(&self, cert: TestCert) -> Result<Arc<ServerConfig>, SetupError> {
        let leaf = self
            .inner
            .leaves
            .get(&cert)
            .ok_or_else(|| format!("no certificate generated for {cert:?}"))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key_pkcs8.clone()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(leaf.chain.clone(), key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Returns a `127.0.0.1` address with nothing listening on it (bound, then released; another
/// process could in principle grab the port in between).
pub fn refused_addr() -> io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.local_addr()
}

#[derive(Clone)]
struct StoredReply {
    digest: [u8; 32],
    status: u16,
    body: Vec<u8>,
}

struct Shared {
    behavior: Behavior,
    effects: AtomicU64,
    connections: AtomicU64,
    handshake_failures: AtomicU64,
    next_id: AtomicU64,
    requests: Mutex<Vec<SeenRequest>>,
    idempotent: Mutex<HashMap<String, StoredReply>>,
    /// Batch member ids applied by `BatchApplyThenCloseWithLookup`.
    applied_members: Mutex<Vec<String>>,
    released: watch::Sender<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn apply(&self) -> u64 {
        self.effects.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn record(&self, request: SeenRequest) {
        lock(&self.requests).push(request);
    }
}

/// A running adversarial server. Dropping it stops the server and closes its connections.
pub struct Adversary {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl fmt::Debug for Adversary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adversary")
            .field("addr", &self.addr)
            .field("tls", &self.tls)
            .field("behavior", &self.shared.behavior)
            .finish_non_exhaustive()
    }
}

impl Drop for Adversary {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

impl Adversary {
    /// Starts a plain-TCP server on `127.0.0.1:0`. Must be called inside a tokio runtime.
    pub async fn start(behavior: Behavior) -> io::Result<Adversary> {
        Adversary::launch(behavior, None).await
    }

    /// Starts a TLS server on `127.0.0.1:0` presenting `cert` from `pki`.
    pub async fn start_tls(
        behavior: Behavior,
        cert: TestCert,
        pki: &TestPki,
    ) -> Result<Adversary, SetupError> {
        let acceptor = TlsAcceptor::from(pki.server_config(cert)?);
        Ok(Adversary::launch(behavior, Some(acceptor)).await?)
    }

    async fn launch(behavior: Behavior, tls: Option<TlsAcceptor>) -> io::Result<Adversary> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (released, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            behavior,
            effects: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            handshake_failures: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            requests: Mutex::new(Vec::new()),
            idempotent: Mutex::new(HashMap::new()),
            applied_members: Mutex::new(Vec::new()),
            released,
        });
        let is_tls = tls.is_some();
        let task = tokio::spawn(accept_loop(listener, tls, Arc::clone(&shared)));
        Ok(Adversary {
            addr,
            tls: is_tls,
            shared,
            task,
        })
    }

    /// The listening address (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT` for TLS (the name the valid
    /// certificate carries). No trailing slash.
    pub fn base_url(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://127.0.0.1:{}", self.addr.port())
        }
    }

    /// `base_url()` followed by `path` (which should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// Side effects applied so far (see the module docs for what counts).
    pub fn effects(&self) -> u64 {
        self.shared.effects.load(Ordering::SeqCst)
    }

    /// Polls until `effects() >= n` or `within` passes; returns whether it got there.
    pub async fn wait_for_effects(&self, n: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.effects() >= n {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Every request the server parsed, in the order it finished reading them.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Whether any request so far `mentions` `needle` (target, headers, or body).
    pub fn saw(&self, needle: &str) -> bool {
        lock(&self.shared.requests)
            .iter()
            .any(|r| r.mentions(needle))
    }

    /// TCP connections accepted so far (including ones whose TLS handshake failed).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// TLS handshakes that failed or timed out (always 0 for plain TCP).
    pub fn handshake_failures(&self) -> u64 {
        self.shared.handshake_failures.load(Ordering::SeqCst)
    }

    /// Lets current and future `Stall` connections finish with `200 {"released":true}`
    /// (`StallThenRespond` ones with their own response).
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }
}

async fn accept_loop(listener: TcpListener, tls: Option<TlsAcceptor>, shared: Arc<Shared>) {
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _peer)) = accepted else {
                    // Transient accept errors (e.g. fd exhaustion): back off briefly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let n = shared.connections.fetch_add(1, Ordering::SeqCst);
                let shared = Arc::clone(&shared);
                let tls = tls.clone();
                tasks.spawn(async move { handle_tcp(tcp, n, tls, shared).await });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

async fn handle_tcp(tcp: TcpStream, n: u64, tls: Option<TlsAcceptor>, shared: Arc<Shared>) {
    let behavior = shared.behavior.for_connection(n);
    if matches!(behavior, Behavior::CloseBeforeReading) {
        drop(tcp);
        return;
    }
    let _ = tcp.set_nodelay(true);
    match tls {
        None => serve(tcp, n, behavior, &shared).await,
        Some(acceptor) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => serve(stream, n, behavior, &shared).await,
                Ok(Err(_)) | Err(_) => {
                    shared.handshake_failures.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
}

/// Why reading a request stopped.
#[derive(Debug)]
enum ReadError {
    /// The peer closed or the socket failed.
    Io,
    /// The bytes were not HTTP/1.1 as this server understands it.
    Malformed,
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> ReadError {
        ReadError::Io
    }
}

struct Head {
    method: String,
    target: String,
    headers: Vec<Header>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn expects_continue(&self) -> bool {
        self.header("expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    }

    fn is_chunked(&self) -> bool {
        self.headers.iter().any(|(n, v)| {
            n == "transfer-encoding"
                && v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("chunked"))
        })
    }

    fn is_read_only(&self) -> bool {
        matches!(self.method.as_str(), "GET" | "HEAD")
    }

    fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    fn seen(&self, connection: u64, body: Vec<u8>, body_complete: bool) -> SeenRequest {
        SeenRequest {
            connection,
            method: self.method.clone(),
            target: self.target.clone(),
            headers: self.headers.clone(),
            body,
            body_complete,
        }
    }
}

/// A stream plus the bytes read ahead of what has been consumed.
struct Conn<S> {
    io: S,
    buf: Vec<u8>,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Reads more bytes into `buf`; `Ok(0)` at end of stream.
    async fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 8192];
        let n = self.io.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// The request line and headers; `Ok(None)` if the peer closed before sending a byte.
    async fn read_head(&mut self) -> Result<Option<Head>, ReadError> {
        let end = loop {
            if let Some(pos) = find(&self.buf, b"\r\n\r\n") {
                break pos;
            }
            if self.buf.len() > MAX_HEAD {
                return Err(ReadError::Malformed);
            }
            if self.fill().await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadError::Io)
                };
            }
        };
        let head_bytes: Vec<u8> = self.buf.drain(..end + 4).collect();
        let text = std::str::from_utf8(&head_bytes[..end]).map_err(|_| ReadError::Malformed)?;
        let mut lines = text.split("\r\n");
        let request_line = lines.next().ok_or(ReadError::Malformed)?;
        let mut parts = request_line.split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ReadError::Malformed);
        };
        if !version.starts_with("HTTP/1.") || method.is_empty() || target.is_empty() {
            return Err(ReadError::Malformed);
        }
        let mut headers = Vec::new();
        for line in lines {
            let (name, value) = line.split_once(':').ok_or(ReadError::Malformed)?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
        Ok(Some(Head {
            method: method.to_string(),
            target: target.to_string(),
            headers,
        }))
    }

    async fn take(&mut self, n: usize, out: &mut Vec<u8>) -> Result<(), ReadError> {
        while self.buf.len() < n {
            if self.fill().await? == 0 {
                out.append(&mut self.buf);
                return Err(ReadError::Io);
            }
        }
        out.extend(self.buf.drain(..n));
        Ok(())
    }

    async fn line(&mut self) -> Result<String, ReadError> {
        loop {
            if let Some(pos) = find(&self.buf, b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..pos + 2).collect();
                return String::from_utf8(line[..pos].to_vec()).map_err(|_| ReadError::Malformed);
            }
            if self.buf.len() > MAX_HEAD {
                return Err(ReadError::Malformed);
            }
            if self.fill().await? == 0 {
                return Err(ReadError::Io);
            }
        }
    }

    /// Reads the body framed as `head` says into `out`.
    async fn read_body(&mut self, head: &Head, out: &mut Vec<u8>) -> Result<(), ReadError> {
        if head.is_chunked() {
            loop {
                let line = self.line().await?;
                let size_text = line.split(';').next().unwrap_or("").trim();
                let size =
                    usize::from_str_radix(size_text, 16).map_err(|_| ReadError::Malformed)?;
                if size == 0 {
                    // Trailers, up to the empty line.
                    while !self.line().await?.is_empty() {}
                    return Ok(());
                }
                if size > MAX_BODY.saturating_sub(out.len()) {
                    return Err(ReadError::Malformed);
                }
                self.take(size, out).await?;
                if !self.line().await?.is_empty() {
                    return Err(ReadError::Malformed);
                }
            }
        }
        let Some(length) = head.header("content-length") else {
            return Ok(());
        };
        let length: usize = length.trim().parse().map_err(|_| ReadError::Malformed)?;
        if length > MAX_BODY {
            return Err(ReadError::Malformed);
        }
        self.take(length, out).await
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes).await?;
        self.io.flush().await
    }

    /// Closes gracefully (FIN; close_notify first for TLS).
    async fn close(mut self) {
        let _ = self.io.shutdown().await;
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// The bytes of a complete response. Adds `content-length` (unless `headers` has it or a
/// `transfer-encoding`, or the status forbids a body) and `connection: close` (unless
/// present). `HEAD` requests and 1xx/204/304 get no body bytes.
fn response(status: u16, headers: &[Header], body: &[u8], method: &str) -> Vec<u8> {
    let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let no_body_status = status < 200 || status == 204 || status == 304;
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
    for (name, value) in headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    if !no_body_status && !has("content-length") && !has("transfer-encoding") {
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    if !has("connection") {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if method != "HEAD" && !no_body_status {
        out.extend_from_slice(body);
    }
    out
}

fn json_response(status: u16, body: &serde_json::Value, extra: &[Header], method: &str) -> Vec<u8> {
    json_response_bytes(status, body.to_string().as_bytes(), extra, method)
}

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    io: S,
    n: u64,
    behavior: &Behavior,
    shared: &Shared,
) {
    let mut conn = Conn {
        io,
        buf: Vec::new(),
    };
    let head = match conn.read_head().await {
        Ok(Some(head)) => head,
        Ok(None) | Err(_) => return,
    };

    match behavior {
        Behavior::ReadHeadersThenClose => {
            shared.record(head.seen(n, Vec::new(), false));
            conn.close().await;
            return;
        }
        Behavior::ContinueThenClose => {
            if conn.send(CONTINUE).await.is_err() {
                shared.record(head.seen(n, Vec::new(), false));
                return;
            }
            let mut body = Vec::new();
            let complete = conn.read_body(&head, &mut body).await.is_ok();
            shared.record(head.seen(n, body, complete));
            conn.close().await;
            return;
        }
        _ => {}
    }

    if head.expects_continue() && conn.send(CONTINUE).await.is_err() {
        shared.record(head.seen(n, Vec::new(), false));
        return;
    }
    let mut body = Vec::new();
    if conn.read_body(&head, &mut body).await.is_err() {
        // Not a complete request: record what arrived, never apply, just close.
        shared.record(head.seen(n, body, false));
        return;
    }
    shared.record(head.seen(n, body.clone(), true));
    let method = head.method.as_str();

    let reply: Option<Vec<u8>> = match behavior {
        Behavior::Respond {
            status,
            headers,
            body: response_body,
        } => {
            if !matches!(method, "GET" | "HEAD" | "OPTIONS") {
                shared.apply();
            }
            Some(response(*status, headers, response_body, method))
        }
        Behavior::Status {
            status,
            headers,
            body: response_body,
        } => Some(response(*status, headers, response_body, method)),
        Behavior::ApplyThenClose => {
            shared.apply();
            None
        }
        Behavior::ApplyThen500 => {
            shared.apply();
            Some(json_response(
                500,
                &serde_json::json!({"error": "internal"}),
                &[],
                method,
            ))
        }
        Behavior::ShortBody { declared, sent } => {
            shared.apply();
            let mut bytes = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {declared}\r\n\
                 connection: close\r\n\r\n"
            )
            .into_bytes();
            bytes.resize(bytes.len().saturating_add(*sent), b'x');
            Some(bytes)
        }
        Behavior::BrokenChunked => {
            shared.apply();
            Some(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\
                  connection: close\r\n\r\n5\r\nhello\r\nzz-not-a-chunk-size\r\n"
                    .to_vec(),
            )
        }
        Behavior::Stall => {
            shared.apply();
            stall(&mut conn, shared)
                .await
                .then(|| json_response(200, &serde_json::json!({"released": true}), &[], method))
        }
        Behavior::StallThenRespond {
            status,
            body: response_body,
        } => {
            shared.apply();
            let headers = [(
                "content-type".to_string(),
                "application/octet-stream".to_string(),
            )];
            stall(&mut conn, shared)
                .await
                .then(|| response(*status, &headers, response_body, method))
        }
        Behavior::EchoAuthorization => {
            let auth = head.header("authorization");
            let body = serde_json::json!({"authorization": auth, "query": head.query()});
            let extra: Vec<Header> = auth
                .map(|a| vec![("x-echo-auth".to_string(), a.to_string())])
                .unwrap_or_default();
            Some(json_response(200, &body, &extra, method))
        }
        Behavior::EchoCompressed { encoding } => {
            let token = head
                .header("authorization")
                .map(|a| a.split_once(' ').map_or(a, |(_, t)| t))
                .or(head.query())
                .unwrap_or_default();
            Some(compressed(
                encoding,
                format!("secret={token}").as_bytes(),
                method,
            ))
        }
        Behavior::CompressionBomb { inflated } => {
            let body = gzip(&vec![0u8; *inflated]);
            let headers = vec![
                ("content-type".to_string(), "text/plain".to_string()),
                ("content-encoding".to_string(), "gzip".to_string()),
            ];
            Some(response(200, &headers, &body, method))
        }
        Behavior::EchoHeadersEncoded => {
            let mut body = String::new();
            for (form, text) in encodings(head.target.as_bytes()) {
                body.push_str(&format!("target {form}: {text}\n"));
            }
            for (name, value) in &head.headers {
                let token = value.split_once(' ').map_or(value.as_str(), |(_, t)| t);
                for (what, bytes) in [("value", value.as_str()), ("token", token)] {
                    for (form, text) in encodings(bytes.as_bytes()) {
                        body.push_str(&format!("{name} {what} {form}: {text}\n"));
                    }
                }
            }
            let auth = head.header("authorization").unwrap_or_default();
            let headers = vec![
                ("content-type".to_string(), "text/plain".to_string()),
                ("x-request-id".to_string(), auth.to_string()),
                ("x-echo-hex".to_string(), hex::encode(auth)),
                ("x-echo-b64".to_string(), b64(auth.as_bytes())),
            ];
            Some(response(200, &headers, body.as_bytes(), method))
        }
        Behavior::Idempotent {
            header,
            close_after_apply_first,
        } => idempotent(&head, &body, header, *close_after_apply_first, shared),
        Behavior::BatchApplyThenCloseWithLookup { apply } => {
            if head.is_read_only() {
                let path = head.target.split('?').next().unwrap_or_default();
                let id = path.rsplit('/').next().unwrap_or_default().to_string();
                let applied = lock(&shared.applied_members).contains(&id);
                let status = if applied { 200 } else { 404 };
                Some(json_response(
                    status,
                    &serde_json::json!({"id": id}),
                    &[],
                    method,
                ))
            } else {
                let doc: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let ids = doc["items"]
                    .as_array()
                    .map(|items| {
                        items
                            .iter()
                            .filter_map(|m| match &m["id"] {
                                serde_json::Value::String(s) => Some(s.clone()),
                                other => other.as_u64().map(|n| n.to_string()),
                            })
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                for id in ids.into_iter().take(*apply) {
                    shared.apply();
                    lock(&shared.applied_members).push(id);
                }
                None
            }
        }
        Behavior::ApplyThenCloseWithLookup => {
            if head.is_read_only() {
                let applied = shared.effects.load(Ordering::SeqCst);
                let status = if applied > 0 { 200 } else { 404 };
                Some(json_response(
                    status,
                    &serde_json::json!({"applied": applied}),
                    &[],
                    method,
                ))
            } else {
                shared.apply();
                None
            }
        }
        // Handled before the body was read / resolved by `for_connection`.
        Behavior::CloseBeforeReading
        | Behavior::ReadHeadersThenClose
        | Behavior::ContinueThenClose
        | Behavior::Sequence(_) => None,
    };
    if let Some(bytes) = reply
        && conn.send(&bytes).await.is_err()
    {
        return;
    }
    conn.close().await;
}

/// Holds the connection until released (true) or the client goes away (false).
async fn stall<S: AsyncRead + AsyncWrite + Unpin>(conn: &mut Conn<S>, shared: &Shared) -> bool {
    let mut released = shared.released.subscribe();
    let mut scratch = [0u8; 1024];
    loop {
        tokio::select! {
            res = released.wait_for(|r| *r) => return res.is_ok(),
            read = conn.io.read(&mut scratch) => match read {
                Ok(0) | Err(_) => return false,
                Ok(_) => continue,
            },
        }
    }
}

/// The `Idempotent` behaviour; `None` means close without a response.
fn idempotent(
    head: &Head,
    body: &[u8],
    key_header: &str,
    close_after_apply_first: bool,
    shared: &Shared,
) -> Option<Vec<u8>> {
    let method = head.method.as_str();
    if head.is_read_only() {
        let key = head.query().and_then(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "idempotency_key")
                .map(|(_, v)| v.into_owned())
        });
        let stored = key.and_then(|k| lock(&shared.idempotent).get(&k).cloned());
        return Some(match stored {
            Some(reply) => json_response_bytes(200, &reply.body, &[], method),
            None => json_response(404, &serde_json::json!({"error": "not_found"}), &[], method),
        });
    }
    let key_name = key_header.to_ascii_lowercase();
    let Some(key) = head.header(&key_name).map(str::to_string) else {
        shared.apply();
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        return Some(json_response(
            201,
            &serde_json::json!({"id": format!("pay_{id}"), "key": null}),
            &[],
            method,
        ));
    };
    let digest = *blake3::hash(body).as_bytes();
    let mut store = lock(&shared.idempotent);
    match store.get(&key) {
        Some(reply) if reply.digest == digest => Some(json_response_bytes(
            reply.status,
            &reply.body,
            &[("idempotent-replayed".to_string(), "true".to_string())],
            method,
        )),
        Some(_) => Some(json_response(
            422,
            &serde_json::json!({"error": "idempotency_key_reused"}),
            &[],
            method,
        )),
        None => {
            shared.apply();
            let id = shared.next_id.fetch_add(1, Ordering::SeqCst) + 1;
            let reply_body = serde_json::json!({"id": format!("pay_{id}"), "key": key})
                .to_string()
                .into_bytes();
            store.insert(
                key,
                StoredReply {
                    digest,
                    status: 201,
                    body: reply_body.clone(),
                },
            );
            if close_after_apply_first {
                None
            } else {
                Some(json_response_bytes(201, &reply_body, &[], method))
            }
        }
    }
}

fn json_response_bytes(status: u16, body: &[u8], extra: &[Header], method: &str) -> Vec<u8> {
    let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
    headers.extend_from_slice(extra);
    response(status, &headers, body, method)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = e.write_all(data);
    e.finish().unwrap_or_default()
}

fn zlib(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = e.write_all(data);
    e.finish().unwrap_or_default()
}

fn raw_deflate(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = e.write_all(data);
    e.finish().unwrap_or_default()
}

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The [`Behavior::EchoCompressed`] response for `plain`.
fn compressed(encoding: &Encoding, plain: &[u8], method: &str) -> Vec<u8> {
    let (label, body) = match encoding {
        Encoding::Gzip => ("gzip".to_string(), gzip(plain)),
        Encoding::Zlib => ("deflate".to_string(), zlib(plain)),
        Encoding::RawDeflate => ("deflate".to_string(), raw_deflate(plain)),
        Encoding::GzipThenDeflate => ("gzip, deflate".to_string(), zlib(&gzip(plain))),
        Encoding::Labelled(label) => (label.clone(), gzip(plain)),
        Encoding::Corrupt => ("gzip".to_string(), plain.to_vec()),
        Encoding::TransferGzip => {
            let body = gzip(plain);
            let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\
                            transfer-encoding: gzip, chunked\r\nconnection: close\r\n\r\n"
                .to_vec();
            out.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
            out.extend_from_slice(&body);
            out.extend_from_slice(b"\r\n0\r\n\r\n");
            return out;
        }
    };
    let headers = vec![
        ("content-type".to_string(), "text/plain".to_string()),
        ("content-encoding".to_string(), label),
    ];
    response(200, &headers, &body, method)
}

/// RFC 4648 base32, padded.
fn base32(data: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    for chunk in data.chunks(5) {
        let mut block = [0u8; 5];
        block[..chunk.len()].copy_from_slice(chunk);
        let bits = block.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b));
        let chars = (chunk.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < chars {
                out.push(char::from(ALPHABET[((bits >> (35 - 5 * i)) & 31) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `value` in the encodings an echoing server might use, each labelled: raw, case-changed,
/// reversed, hex, base64 (standard and URL-safe, alone and after 1 and 2 other bytes),
/// base32 (after 0 to 4 other bytes, either case), JSON `\u` escapes (and a mix with raw
/// characters), and percent-encoding (every byte, either case, or some bytes).
pub fn encodings(value: &[u8]) -> Vec<(String, String)> {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    let text = String::from_utf8_lossy(value).into_owned();
    let mut out = vec![
        ("raw".to_string(), text.clone()),
        ("upper".to_string(), text.to_uppercase()),
        ("lower".to_string(), text.to_lowercase()),
        ("reversed".to_string(), text.chars().rev().collect()),
        ("hex".to_string(), hex::encode(value)),
        ("HEX".to_string(), hex::encode_upper(value)),
    ];
    for (k, prefix) in ["", "a", "ab"].iter().enumerate() {
        let shifted = [prefix.as_bytes(), value].concat();
        out.push((format!("base64+{k}"), STANDARD.encode(&shifted)));
        out.push((format!("base64url+{k}"), URL_SAFE_NO_PAD.encode(&shifted)));
    }
    for (k, prefix) in ["", "a", "ab", "abc", "abcd"].iter().enumerate() {
        let encoded = base32(&[prefix.as_bytes(), value].concat());
        out.push((format!("base32+{k}"), encoded.clone()));
        out.push((format!("base32lower+{k}"), encoded.to_lowercase()));
    }
    let json: String = text.encode_utf16().map(|u| format!("\\u{u:04x}")).collect();
    out.push(("json".to_string(), json.clone()));
    out.push((
        "JSON".to_string(),
        json.to_uppercase().replace("\\U", "\\u"),
    ));
    let mixed: String = text
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i % 2 == 0 {
                format!("\\u{:04X}", u32::from(c))
            } else if c == '/' {
                "\\/".to_string()
            } else {
                c.to_string()
            }
        })
        .collect();
    out.push(("json-mixed".to_string(), mixed));
    let every: String = value.iter().map(|b| format!("%{b:02X}")).collect();
    out.push(("percent".to_string(), every.clone()));
    out.push(("percent-lower".to_string(), every.to_lowercase()));
    let some: String = value
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if i % 3 == 0 {
                format!("%{b:02x}")
            } else {
                char::from(b).to_string()
            }
        })
        .collect();
    out.push(("percent-some".to_string(), some));
    out
}

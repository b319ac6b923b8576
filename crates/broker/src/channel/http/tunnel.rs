//! One HTTP attempt through a proxy's CONNECT tunnel (RFC 9110 §9.3.6), for https and
//! plain http alike, so the dispatch gate sits in the same place on both:
//!
//! 1. the proxy's name is resolved and its addresses guarded
//!    ([`AddressPolicy::for_proxy`]: loopback and private are allowed, since the
//!    operator named the proxy; metadata and link-local are not), then TCP to it;
//! 2. `CONNECT host:port`, with `Proxy-Authorization` when the proxy URL carried
//!    credentials, and the proxy's answer head read (bounded);
//! 3. for https, TLS with the origin through the tunnel, verified by the same
//!    [`RecordingVerifier`](super::transport::RecordingVerifier) as a direct connection,
//!    so the origin's identity is checked and recorded exactly as without a proxy;
//! 4. the dispatch gate ([`transport::pass_gate`]): DISPATCH_STARTED is durable before
//!    the first request byte;
//! 5. hyper's HTTP/1 client on that stream; the response is handed back as a
//!    `reqwest::Response`, so it is read, decoded and committed like a direct one.
//!
//! reqwest's own proxy support is not used: a refused tunnel reaches the caller without
//! its status, plain http would be forwarded rather than tunnelled, and its connector
//! layer cannot substitute a connection of its own.
//!
//! Nothing is written towards the origin before step 4, so every failure in steps 1 to 3
//! proves `not_attempted`; what the proxy answered is the proxy's word, recorded as such
//! (the attempt names the proxy as the hop), never as the origin's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use zeroize::Zeroizing;

use super::transport::{self, MarkingBody, Probe, TlsVerdict};
use crate::channel::guard::{AddressPolicy, LookupError, Refusal, Resolver};
use crate::config::proxy::Proxy;
use crate::contract::{Code, Retry, Stage};

/// The most bytes read from a proxy before its answer to CONNECT is complete (interim
/// 1xx answers included).
const MAX_ANSWER: usize = 16 * 1024;

/// Why a request through a proxy did not produce a response head.
#[derive(Debug)]
pub(super) enum TunnelError {
    /// The guard refused one of the proxy's addresses.
    AddressRefused(Refusal),
    /// The proxy's name did not resolve.
    ProxyDns,
    /// No TCP connection to any of the proxy's addresses.
    Unreachable(std::io::ErrorKind),
    /// The broker could not open a socket: it is out of descriptors.
    OutOfDescriptors,
    /// The proxy answered CONNECT with this status (not 2xx).
    Refused(u16),
    /// The proxy closed or broke the CONNECT exchange before a complete answer; says how.
    Broken(&'static str),
    /// TLS with the origin through the tunnel failed (the probe holds the verdict).
    Tls(std::io::Error),
    /// The request cannot be put on the wire (a header value, the URL); nothing was sent.
    InvalidRequest,
    /// The dispatch gate stayed shut; nothing was sent.
    GateRefused,
    /// After dispatch: the exchange failed before a response head arrived.
    Exchange,
}

/// A connection-setup failure as the record states it.
pub(super) struct SetupFailure {
    pub stage: Stage,
    pub code: Code,
    pub retry: Retry,
    pub message: String,
}

impl TunnelError {
    /// The setup stage, code, retry and message of a failure before dispatch; `None`
    /// for the ones the caller handles itself (an invalid request, a shut gate, a failure
    /// after dispatch).
    pub(super) fn setup_failure(&self, proxy: &Proxy, probe: &Probe) -> Option<SetupFailure> {
        let hop = proxy.authority();
        let failure = |stage, code: Code, retry, message: String| {
            Some(SetupFailure {
                stage,
                code,
                retry,
                message,
            })
        };
        match self {
            TunnelError::AddressRefused(refusal) => failure(
                Stage::AddressGuard,
                Code::AddressRefused,
                Retry::AfterCorrection,
                format!(
                    "The proxy {hop} resolved to {refusal}, which Postern refuses to connect to (a proxy may be on loopback or a private network, never on a link-local or metadata address). Nothing was sent."
                ),
            ),
            TunnelError::ProxyDns => failure(
                Stage::ProxyTunnel,
                Code::ProxyUnreachable,
                Retry::Backoff,
                format!("The proxy {hop} did not resolve; nothing was sent."),
            ),
            TunnelError::Unreachable(kind) => failure(
                Stage::ProxyTunnel,
                Code::ProxyUnreachable,
                Retry::Backoff,
                format!("No TCP connection to the proxy {hop} ({kind}); nothing was sent."),
            ),
            TunnelError::OutOfDescriptors => failure(
                Stage::ProxyTunnel,
                Code::BrokerUnavailable,
                Retry::Backoff,
                format!(
                    "The broker is out of descriptors and could not open a connection to the proxy {hop}; nothing was sent. Retry later."
                ),
            ),
            TunnelError::Refused(status) => failure(
                Stage::ProxyTunnel,
                Code::ProxyRefused,
                refused_retry(*status),
                format!(
                    "The proxy {hop} answered CONNECT with {status}{}. This is the proxy's answer, not the origin's; nothing was sent to the origin.",
                    refused_hint(*status)
                ),
            ),
            TunnelError::Broken(how) => failure(
                Stage::ProxyTunnel,
                Code::ProxyTunnelFailed,
                Retry::Backoff,
                format!("The proxy {hop} {how}; nothing was sent to the origin."),
            ),
            TunnelError::Tls(e) => {
                let reason = match probe.tls() {
                    Some(TlsVerdict::Rejected { reason }) => format!(" (certificate {reason})"),
                    Some(TlsVerdict::Verified { .. }) => String::new(),
                    None => format!(" (the handshake broke off: {})", e.kind()),
                };
                failure(
                    Stage::TlsHandshake,
                    Code::TlsRejected,
                    Retry::AfterCorrection,
                    format!(
                        "{}{reason} The TLS handshake ran through the proxy {hop}'s tunnel.",
                        Code::TlsRejected.spec().meaning
                    ),
                )
            }
            TunnelError::InvalidRequest | TunnelError::GateRefused | TunnelError::Exchange => None,
        }
    }
}

/// What a caller may do after the proxy refused the tunnel: a 407 needs other proxy
/// credentials and a 403 (or any other 4xx) a proxy policy change; 408, 429 and 5xx
/// (502/503/504: the proxy could not reach the origin, or is overloaded) may pass.
pub(super) fn refused_retry(status: u16) -> Retry {
    match status {
        408 | 429 | 500..=599 => Retry::Backoff,
        _ => Retry::AfterCorrection,
    }
}

fn refused_hint(status: u16) -> &'static str {
    match status {
        407 => " (proxy authentication required: check the credentials in the target's proxy URL)",
        403 => " (the proxy's policy forbids this destination)",
        502 | 504 => " (the proxy could not reach the origin)",
        503 => " (the proxy is unavailable)",
        _ => "",
    }
}

/// The request as it goes on the wire through the tunnel, and the origin the tunnel
/// must reach (`host:port`, IPv6 in brackets) with the name TLS verifies.
pub(super) struct Prepared {
    pub request: hyper::Request<MarkingBody>,
    pub authority: String,
    pub server_name: ServerName<'static>,
}

/// Builds the request as reqwest would send it to the origin directly: origin-form
/// target, `host` from the URL, `accept: */*`, then the armed headers in order.
pub(super) fn prepare(
    method: reqwest::Method,
    url: &str,
    headers: &[(String, String)],
    body: MarkingBody,
) -> Result<Prepared, TunnelError> {
    use hyper::header::{ACCEPT, HOST, HeaderName, HeaderValue};
    let url = url::Url::parse(url).map_err(|_| TunnelError::InvalidRequest)?;
    let host = url.host_str().ok_or(TunnelError::InvalidRequest)?;
    let port = url
        .port_or_known_default()
        .ok_or(TunnelError::InvalidRequest)?;
    let host_header = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let target = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(target)
        .body(body)
        .map_err(|_| TunnelError::InvalidRequest)?;
    let map = request.headers_mut();
    map.insert(
        HOST,
        HeaderValue::from_str(&host_header).map_err(|_| TunnelError::InvalidRequest)?,
    );
    map.insert(ACCEPT, HeaderValue::from_static("*/*"));
    for (name, value) in headers {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| TunnelError::InvalidRequest)?;
        let value = HeaderValue::from_str(value).map_err(|_| TunnelError::InvalidRequest)?;
        map.append(name, value);
    }
    let unbracketed = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let server_name =
        ServerName::try_from(unbracketed.to_string()).map_err(|_| TunnelError::InvalidRequest)?;
    Ok(Prepared {
        request,
        authority: format!("{host}:{port}"),
        server_name,
    })
}

/// Runs `prepared` through `proxy`: tunnel, TLS when `tls` is given, gate, exchange.
pub(super) async fn send(
    proxy: &Proxy,
    resolver: &Resolver,
    prepared: Prepared,
    tls: Option<Arc<rustls::ClientConfig>>,
    probe: &Probe,
    gate: &transport::Gate,
) -> Result<reqwest::Response, TunnelError> {
    let Prepared {
        request,
        authority,
        server_name,
    } = prepared;
    let mut tcp = connect(proxy, resolver, probe).await?;
    open_tunnel(&mut tcp, proxy, &authority).await?;
    probe.mark_tunnel_open();
    match tls {
        Some(config) => {
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(server_name, tcp)
                .await
                .map_err(TunnelError::Tls)?;
            exchange(stream, probe, gate, request).await
        }
        None => exchange(tcp, probe, gate, request).await,
    }
}

/// TCP to the first of the proxy's (guarded) addresses that accepts.
async fn connect(
    proxy: &Proxy,
    resolver: &Resolver,
    probe: &Probe,
) -> Result<TcpStream, TunnelError> {
    let addrs = match resolver
        .lookup_checked(proxy.host(), AddressPolicy::for_proxy())
        .await
    {
        Ok(addrs) => addrs,
        Err(LookupError::Refused(refusal)) => return Err(TunnelError::AddressRefused(refusal)),
        Err(LookupError::Dns(_)) => return Err(TunnelError::ProxyDns),
    };
    let mut last = std::io::ErrorKind::ConnectionRefused;
    for ip in addrs {
        match TcpStream::connect(SocketAddr::new(ip, proxy.port())).await {
            Ok(tcp) => {
                let _ = tcp.set_nodelay(true);
                probe.mark_proxy_connected();
                return Ok(tcp);
            }
            Err(e) if crate::platform::out_of_descriptors(&e) => {
                return Err(TunnelError::OutOfDescriptors);
            }
            Err(e) => last = e.kind(),
        }
    }
    Err(TunnelError::Unreachable(last))
}

/// Sends CONNECT and reads the proxy's answer up to a 2xx head.
async fn open_tunnel(
    tcp: &mut TcpStream,
    proxy: &Proxy,
    authority: &str,
) -> Result<(), TunnelError> {
    let auth = proxy.authorization();
    let mut head = Zeroizing::new(String::with_capacity(
        96 + 2 * authority.len() + auth.map_or(0, str::len),
    ));
    head.push_str("CONNECT ");
    head.push_str(authority);
    head.push_str(" HTTP/1.1\r\nHost: ");
    head.push_str(authority);
    head.push_str("\r\n");
    if let Some(auth) = auth {
        head.push_str("Proxy-Authorization: ");
        head.push_str(auth);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes())
        .await
        .map_err(|_| TunnelError::Broken("broke the connection while CONNECT was being sent"))?;
    drop(head);
    let mut answer = Answer::default();
    let mut chunk = [0u8; 1024];
    loop {
        match answer.next() {
            Step::More => {}
            Step::Open => return Ok(()),
            Step::Fail(e) => return Err(e),
        }
        let room = MAX_ANSWER.saturating_sub(answer.read).min(chunk.len());
        if room == 0 {
            return Err(TunnelError::Broken(
                "sent more than 16 KiB without completing its answer to CONNECT",
            ));
        }
        let slot = chunk.get_mut(..room).unwrap_or_default();
        match tcp.read(slot).await {
            Ok(0) if answer.buf.is_empty() => {
                return Err(TunnelError::Broken(
                    "closed the connection without answering CONNECT",
                ));
            }
            Ok(0) => {
                return Err(TunnelError::Broken(
                    "closed the connection in the middle of its answer to CONNECT",
                ));
            }
            Ok(n) => answer.push(slot.get(..n).unwrap_or_default()),
            Err(_) => {
                return Err(TunnelError::Broken(
                    "broke the connection before answering CONNECT",
                ));
            }
        }
    }
}

/// The proxy's answer to CONNECT as it arrives.
#[derive(Default)]
struct Answer {
    /// Bytes not yet consumed as a complete head.
    buf: Vec<u8>,
    /// Every byte read so far, interim answers included.
    read: usize,
}

enum Step {
    More,
    Open,
    Fail(TunnelError),
}

impl Answer {
    fn push(&mut self, bytes: &[u8]) {
        self.read += bytes.len();
        self.buf.extend_from_slice(bytes);
    }

    /// Consumes complete heads: interim 1xx answers are skipped; a 2xx opens the tunnel,
    /// anything else is the proxy's refusal.
    fn next(&mut self) -> Step {
        loop {
            let Some(end) = head_end(&self.buf) else {
                return Step::More;
            };
            let Some(status) = status_of(self.buf.get(..end).unwrap_or_default()) else {
                return Step::Fail(TunnelError::Broken(
                    "answered CONNECT with something that is not an HTTP/1 response",
                ));
            };
            match status {
                100..=199 => {
                    self.buf.drain(..end);
                }
                // RFC 9110 §9.3.6: a 2xx answer has no content; the tunnel starts right
                // after the head, and the origin does not speak first in HTTP or TLS.
                200..=299 if self.buf.len() > end => {
                    return Step::Fail(TunnelError::Broken(
                        "sent data after its 2xx answer to CONNECT before the client spoke",
                    ));
                }
                200..=299 => return Step::Open,
                _ => return Step::Fail(TunnelError::Refused(status)),
            }
        }
    }
}

/// Where the first head in `buf` ends (after its empty line), if it is complete. Lines
/// end in CRLF or, as RFC 9112 §2.2 lets a recipient accept, a bare LF.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.iter().enumerate().find_map(|(i, &b)| {
        if b != b'\n' {
            return None;
        }
        match buf.get(i + 1..) {
            Some([b'\n', ..]) => Some(i + 2),
            Some([b'\r', b'\n', ..]) => Some(i + 3),
            _ => None,
        }
    })
}

/// The status code of an HTTP/1 status line (`HTTP/1.x NNN [reason]`).
fn status_of(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"HTTP/1.")?;
    let (minor, rest) = rest.split_first()?;
    if !minor.is_ascii_digit() {
        return None;
    }
    let rest = rest.strip_prefix(b" ")?;
    let code = rest.get(..3)?;
    if !code.iter().all(u8::is_ascii_digit) || !matches!(rest.get(3), None | Some(b' ')) {
        return None;
    }
    let status: u16 = std::str::from_utf8(code).ok()?.parse().ok()?;
    (100..=599).contains(&status).then_some(status)
}

/// The gate, then one request with hyper's HTTP/1 client on `stream`.
async fn exchange<S>(
    stream: S,
    probe: &Probe,
    gate: &transport::Gate,
    request: hyper::Request<MarkingBody>,
) -> Result<reqwest::Response, TunnelError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if !transport::pass_gate(probe, gate).await {
        return Err(TunnelError::GateRefused);
    }
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| TunnelError::Exchange)?;
    // The connection is driven on its own task for as long as the response body is
    // read; the guard aborts it when the body (or this future, on a timeout) is dropped.
    let driver = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let response = sender
        .send_request(request)
        .await
        .map_err(|_| TunnelError::Exchange)?;
    let (parts, body) = response.into_parts();
    let body = reqwest::Body::wrap(Driven {
        body,
        _sender: sender,
        _driver: driver,
    });
    Ok(reqwest::Response::from(hyper::Response::from_parts(
        parts, body,
    )))
}

/// Aborts the connection task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A response body that keeps its connection driven while it is read.
struct Driven {
    body: hyper::body::Incoming,
    _sender: hyper::client::conn::http1::SendRequest<MarkingBody>,
    _driver: AbortOnDrop,
}

impl http_body::Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(bytes: &[u8]) -> Result<(), String> {
        let mut a = Answer::default();
        a.push(bytes);
        match a.next() {
            Step::Open => Ok(()),
            Step::More => Err("more".into()),
            Step::Fail(e) => Err(format!("{e:?}")),
        }
    }

    #[test]
    fn connect_answers_open_refuse_or_break_the_tunnel() {
        assert_eq!(
            answer(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Ok(())
        );
        assert_eq!(answer(b"HTTP/1.0 200\n\n"), Ok(()));
        assert_eq!(
            answer(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 OK\r\nX: y\r\n\r\n"),
            Ok(())
        );
        assert_eq!(answer(b"HTTP/1.1 200 OK\r\n"), Err("more".into()));
        assert_eq!(answer(b"HTTP/1.1 100 Continue\r\n\r\n"), Err("more".into()));
        assert_eq!(
            answer(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n"),
            Err("Refused(407)".into())
        );
        assert_eq!(
            answer(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\n\r\nbad"),
            Err("Refused(502)".into())
        );
        for garbage in [
            &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
            b"HTTP/2 200\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 2000\r\n\r\n",
            b"HTTP/1.1 999 Nope\r\n\r\n",
        ] {
            assert!(
                answer(garbage).unwrap_err().starts_with("Broken"),
                "{garbage:?}"
            );
        }
        assert!(
            answer(b"HTTP/1.1 200 OK\r\n\r\nearly")
                .unwrap_err()
                .starts_with("Broken")
        );
    }

    #[test]
    fn a_refused_tunnel_is_retried_only_where_waiting_can_help() {
        for status in [407, 403, 400, 404, 405, 301] {
            assert_eq!(refused_retry(status), Retry::AfterCorrection, "{status}");
        }
        for status in [502, 503, 504, 500, 408, 429] {
            assert_eq!(refused_retry(status), Retry::Backoff, "{status}");
        }
    }

    #[test]
    fn the_tunnelled_request_is_origin_form_with_the_host_of_the_url() {
        let probe = Arc::new(Probe::default());
        let body = MarkingBody::new(Bytes::from_static(b"{}"), probe);
        let p = prepare(
            reqwest::Method::POST,
            "https://api.example.test:8443/v1/pay?x=1",
            &[("x-a".into(), "1".into()), ("x-a".into(), "2".into())],
            body,
        )
        .unwrap();
        assert_eq!(p.authority, "api.example.test:8443");
        assert_eq!(p.server_name.to_str(), "api.example.test");
        assert_eq!(p.request.uri(), "/v1/pay?x=1");
        assert_eq!(p.request.headers()["host"], "api.example.test:8443");
        assert_eq!(p.request.headers().get_all("x-a").iter().count(), 2);
        let probe = Arc::new(Probe::default());
        let v6 = prepare(
            reqwest::Method::GET,
            "http://[::1]/",
            &[],
            MarkingBody::new(Bytes::new(), probe.clone()),
        )
        .unwrap();
        assert_eq!(
            (v6.authority.as_str(), v6.server_name.to_str().as_ref()),
            ("[::1]:80", "::1")
        );
        assert_eq!(v6.request.headers()["host"], "[::1]");
        let bad = prepare(
            reqwest::Method::GET,
            "http://127.0.0.1/",
            &[("x".into(), "a\nb".into())],
            MarkingBody::new(Bytes::new(), probe),
        );
        assert!(matches!(bad, Err(TunnelError::InvalidRequest)));
    }
}

//! Tests of the adversarial test server itself, driven by raw TCP / TLS clients so that
//! the assertions are about the exact bytes each behaviour sends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use postern_tests::adversary::{Adversary, Behavior, TestCert, TestPki, refused_addr};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const READ_LIMIT: Duration = Duration::from_secs(2);

/// How a read-to-end finished.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Clean end of stream.
    Eof,
    /// Reset / other I/O error.
    Error(io::ErrorKind),
}

/// Reads until the peer closes (or `READ_LIMIT`, which fails the test).
async fn read_all<S: AsyncRead + Unpin>(stream: &mut S) -> (Vec<u8>, End) {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(READ_LIMIT, stream.read(&mut chunk))
            .await
            .expect("server neither answered nor closed in time");
        match read {
            Ok(0) => return (out, End::Eof),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) => return (out, End::Error(e.kind())),
        }
    }
}

/// Reads until `needle` has arrived (and returns everything read so far).
async fn read_until<S: AsyncRead + Unpin>(stream: &mut S, needle: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while !out.ends_with(needle) {
        let n = tokio::time::timeout(READ_LIMIT, stream.read(&mut byte))
            .await
            .expect("timed out waiting for bytes")
            .expect("read failed");
        assert!(n > 0, "closed before {needle:?}; got {out:?}");
        out.push(byte[0]);
    }
    out
}

/// One request on a fresh connection; the whole answer until close.
async fn exchange(addr: SocketAddr, request: &[u8]) -> (Vec<u8>, End) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The server may close before reading everything; a failed write is part of the test.
    let _ = stream.write_all(request).await;
    read_all(&mut stream).await
}

fn post(path: &str, extra_headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n{extra_headers}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn get(target: &str, extra_headers: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nhost: test\r\n{extra_headers}\r\n").into_bytes()
}

/// Splits a response into (head text, body bytes).
fn split(response: &[u8]) -> (String, Vec<u8>) {
    let pos = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header block in {:?}", String::from_utf8_lossy(response)));
    (
        String::from_utf8(response[..pos].to_vec()).unwrap(),
        response[pos + 4..].to_vec(),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn respond_post_applies_and_records_everything() {
    let adv = Adversary::start(Behavior::ok_json(r#"{"ok":true}"#))
        .await
        .unwrap();
    let (resp, end) = exchange(
        adv.addr(),
        &post(
            "/v1/pay?x=1",
            "Authorization: Bearer s3cret\r\n",
            r#"{"amount":5}"#,
        ),
    )
    .await;
    assert_eq!(end, End::Eof);
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert!(head.contains("content-length: 11"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, br#"{"ok":true}"#);
    assert_eq!(adv.effects(), 1);
    assert_eq!(adv.connections(), 1);

    let seen = adv.requests();
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!(r.connection, 0);
    assert_eq!(r.method, "POST");
    assert_eq!(r.target, "/v1/pay?x=1");
    assert_eq!(r.path(), "/v1/pay");
    assert_eq!(r.query(), Some("x=1"));
    assert_eq!(r.header("AUTHORIZATION"), Some("Bearer s3cret"));
    assert!(r.headers.iter().any(|(n, _)| n == "authorization"));
    assert_eq!(r.body, br#"{"amount":5}"#);
    assert!(r.body_complete);
    assert!(adv.saw("s3cret"));
    assert!(adv.saw("amount"));
    assert!(!adv.saw("never-sent"));
    assert_eq!(
        adv.base_url(),
        format!("http://127.0.0.1:{}", adv.addr().port())
    );
    assert_eq!(adv.url("/a"), format!("{}/a", adv.base_url()));
}

#[tokio::test]
async fn respond_get_does_not_apply_and_head_gets_no_body() {
    let adv = Adversary::start(Behavior::respond(200, "hello"))
        .await
        .unwrap();
    let (resp, _) = exchange(adv.addr(), &get("/", "")).await;
    assert_eq!(split(&resp).1, b"hello");
    let (resp, _) = exchange(adv.addr(), b"HEAD / HTTP/1.1\r\nhost: t\r\n\r\n").await;
    let (head, body) = split(&resp);
    assert!(head.contains("content-length: 5"), "{head}");
    assert!(body.is_empty());
    assert_eq!(adv.effects(), 0);
    assert_eq!(adv.requests().len(), 2);
}

#[tokio::test]
async fn chunked_request_body_is_decoded() {
    let adv = Adversary::start(Behavior::respond(200, "")).await.unwrap();
    let request = b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n\
                    4\r\nWiki\r\n6;ext=1\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nx-trailer: 1\r\n\r\n";
    let (resp, _) = exchange(adv.addr(), request).await;
    assert!(text(&resp).starts_with("HTTP/1.1 200 OK"));
    let seen = adv.requests();
    assert_eq!(seen[0].body, b"Wikipedia in \r\n\r\nchunks.");
    assert!(seen[0].body_complete);
    assert_eq!(adv.effects(), 1);
}

#[tokio::test]
async fn expect_continue_gets_100_before_the_body() {
    let adv = Adversary::start(Behavior::respond(201, "made"))
        .await
        .unwrap();
    let mut stream = TcpStream::connect(adv.addr()).await.unwrap();
    stream
        .write_all(
            b"PUT /x HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let interim = read_until(&mut stream, b"\r\n\r\n").await;
    assert_eq!(interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"data").await.unwrap();
    let (resp, end) = read_all(&mut stream).await;
    assert_eq!(end, End::Eof);
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 201 Created"), "{head}");
    assert_eq!(body, b"made");
    assert_eq!(adv.requests()[0].body, b"data");
    assert_eq!(adv.effects(), 1);
}

#[tokio::test]
async fn close_before_reading_sends_nothing() {
    let adv = Adversary::start(Behavior::CloseBeforeReading)
        .await
        .unwrap();
    let (resp, _end) = exchange(adv.addr(), &post("/x", "", "body")).await;
    assert!(resp.is_empty());
    assert_eq!(adv.connections(), 1);
    assert!(adv.requests().is_empty());
    assert_eq!(adv.effects(), 0);
}

#[tokio::test]
async fn read_headers_then_close_reads_no_body() {
    let adv = Adversary::start(Behavior::ReadHeadersThenClose)
        .await
        .unwrap();
    let mut stream = TcpStream::connect(adv.addr()).await.unwrap();
    // Headers only: the declared body never comes, yet the server closes.
    stream
        .write_all(b"POST /x HTTP/1.1\r\nhost: t\r\nauthorization: Basic abc\r\ncontent-length: 10\r\n\r\n")
        .await
        .unwrap();
    let (resp, end) = read_all(&mut stream).await;
    assert!(resp.is_empty());
    assert_eq!(end, End::Eof);
    let seen = adv.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("authorization"), Some("Basic abc"));
    assert!(seen[0].body.is_empty());
    assert!(!seen[0].body_complete);
    assert_eq!(adv.effects(), 0);
}

#[tokio::test]
async fn apply_then_close_applies_without_answering() {
    let adv = Adversary::start(Behavior::ApplyThenClose).await.unwrap();
    let (resp, end) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    assert!(resp.is_empty());
    assert_eq!(end, End::Eof);
    assert_eq!(adv.effects(), 1);
    assert_eq!(adv.requests()[0].body, b"{}");
}

#[tokio::test]
async fn apply_then_500_applies_and_answers_500() {
    let adv = Adversary::start(Behavior::ApplyThen500).await.unwrap();
    let (resp, end) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    assert_eq!(end, End::Eof);
    let (head, body) = split(&resp);
    assert!(
        head.starts_with("HTTP/1.1 500 Internal Server Error\r\n"),
        "{head}"
    );
    assert_eq!(body, br#"{"error":"internal"}"#);
    assert_eq!(adv.effects(), 1);
}

#[tokio::test]
async fn status_answers_with_headers_and_never_applies() {
    let adv = Adversary::start(
        Behavior::status(429)
            .header("Retry-After", "2")
            .body("slow"),
    )
    .await
    .unwrap();
    let (resp, _) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    let (head, body) = split(&resp);
    assert!(
        head.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nRetry-After: 2\r\n"), "{head}");
    assert_eq!(body, b"slow");
    assert_eq!(adv.effects(), 0);

    let adv = Adversary::start(Behavior::status(307).header("Location", "http://elsewhere.test/"))
        .await
        .unwrap();
    let (resp, _) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    let (head, body) = split(&resp);
    assert!(
        head.starts_with("HTTP/1.1 307 Temporary Redirect\r\n"),
        "{head}"
    );
    assert!(head.contains("Location: http://elsewhere.test/"), "{head}");
    assert!(head.contains("content-length: 0"), "{head}");
    assert!(body.is_empty());
    assert_eq!(adv.effects(), 0);
}

#[tokio::test]
async fn continue_then_close_reads_body_and_closes() {
    let adv = Adversary::start(Behavior::ContinueThenClose).await.unwrap();
    let mut stream = TcpStream::connect(adv.addr()).await.unwrap();
    stream
        .write_all(
            b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let interim = read_until(&mut stream, b"\r\n\r\n").await;
    assert_eq!(interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"hello").await.unwrap();
    let (rest, end) = read_all(&mut stream).await;
    assert!(rest.is_empty(), "{}", text(&rest));
    assert_eq!(end, End::Eof);
    let seen = adv.requests();
    assert_eq!(seen[0].body, b"hello");
    assert!(seen[0].body_complete);
    assert_eq!(adv.effects(), 0);
}

#[tokio::test]
async fn short_body_declares_more_than_it_sends() {
    let adv = Adversary::start(Behavior::ShortBody {
        declared: 10,
        sent: 3,
    })
    .await
    .unwrap();
    let (resp, end) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    assert_eq!(end, End::Eof);
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("content-length: 10"), "{head}");
    assert_eq!(body, b"xxx");
    assert_eq!(adv.effects(), 1);
}

#[tokio::test]
async fn broken_chunked_sends_garbage_after_first_chunk() {
    let adv = Adversary::start(Behavior::BrokenChunked).await.unwrap();
    let (resp, end) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    assert_eq!(end, End::Eof);
    let (head, body) = split(&resp);
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert_eq!(body, b"5\r\nhello\r\nzz-not-a-chunk-size\r\n");
    assert_eq!(adv.effects(), 1);
}

#[tokio::test]
async fn stall_holds_until_released() {
    let adv = Adversary::start(Behavior::Stall).await.unwrap();
    let mut stream = TcpStream::connect(adv.addr()).await.unwrap();
    stream.write_all(&post("/x", "", "{}")).await.unwrap();
    assert!(adv.wait_for_effects(1, READ_LIMIT).await);
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(150), stream.read(&mut byte)).await;
    assert!(early.is_err(), "stalled server sent something: {early:?}");
    adv.release();
    let (resp, end) = read_all(&mut stream).await;
    assert_eq!(end, End::Eof);
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert_eq!(body, br#"{"released":true}"#);
    assert_eq!(adv.effects(), 1);

    // Release is sticky: a later stall answers at once.
    let (resp, _) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    assert!(text(&resp).starts_with("HTTP/1.1 200 OK"));
    assert_eq!(adv.effects(), 2);
}

#[tokio::test]
async fn dropping_the_server_closes_stalled_connections() {
    let adv = Adversary::start(Behavior::Stall).await.unwrap();
    let mut stream = TcpStream::connect(adv.addr()).await.unwrap();
    stream.write_all(&post("/x", "", "{}")).await.unwrap();
    assert!(adv.wait_for_effects(1, READ_LIMIT).await);
    let addr = adv.addr();
    drop(adv);
    let (resp, _end) = read_all(&mut stream).await;
    assert!(resp.is_empty());
    // The listener is gone too.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn echo_authorization_reflects_the_secret() {
    let adv = Adversary::start(Behavior::EchoAuthorization).await.unwrap();
    let (resp, _) = exchange(
        adv.addr(),
        &get(
            "/echo?api_key=q-secret&a=1",
            "Authorization: Bearer h-secret\r\n",
        ),
    )
    .await;
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("\r\nx-echo-auth: Bearer h-secret\r\n"),
        "{head}"
    );
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["authorization"], "Bearer h-secret");
    assert_eq!(json["query"], "api_key=q-secret&a=1");
    assert_eq!(adv.effects(), 0);

    // Without credentials: nulls and no echo header.
    let (resp, _) = exchange(adv.addr(), &get("/echo", "")).await;
    let (head, body) = split(&resp);
    assert!(!head.contains("x-echo-auth"), "{head}");
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["authorization"], serde_json::Value::Null);
    assert_eq!(json["query"], serde_json::Value::Null);
}

#[tokio::test]
async fn idempotent_deduplicates_by_key_and_body() {
    let adv = Adversary::start(Behavior::idempotent("Idempotency-Key"))
        .await
        .unwrap();
    let key = "Idempotency-Key: k-1\r\n";

    let (resp, _) = exchange(adv.addr(), &post("/v1/pay", key, r#"{"amount":5}"#)).await;
    let (head, first) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 201 Created"), "{head}");
    assert_eq!(first, br#"{"id":"pay_1","key":"k-1"}"#);
    assert_eq!(adv.effects(), 1);

    // Same key, same body: the stored answer, no new effect.
    let (resp, _) = exchange(adv.addr(), &post("/v1/pay", key, r#"{"amount":5}"#)).await;
    let (head, again) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 201 Created"), "{head}");
    assert!(head.contains("idempotent-replayed: true"), "{head}");
    assert_eq!(again, first);
    assert_eq!(adv.effects(), 1);

    // Same key, different body: 422.
    let (resp, _) = exchange(adv.addr(), &post("/v1/pay", key, r#"{"amount":6}"#)).await;
    assert!(text(&resp).starts_with("HTTP/1.1 422 "), "{}", text(&resp));
    assert_eq!(adv.effects(), 1);

    // A new key applies again.
    let (resp, _) = exchange(
        adv.addr(),
        &post("/v1/pay", "idempotency-key: k-2\r\n", "{}"),
    )
    .await;
    assert_eq!(split(&resp).1, br#"{"id":"pay_2","key":"k-2"}"#);
    assert_eq!(adv.effects(), 2);

    // Reconciliation queries.
    let (resp, _) = exchange(adv.addr(), &get("/v1/pay?idempotency_key=k-1", "")).await;
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert_eq!(body, first);
    let (resp, _) = exchange(adv.addr(), &get("/v1/pay?idempotency_key=k-9", "")).await;
    assert!(text(&resp).starts_with("HTTP/1.1 404 "));
    let (resp, _) = exchange(adv.addr(), &get("/v1/pay", "")).await;
    assert!(text(&resp).starts_with("HTTP/1.1 404 "));

    // No key: applied every time.
    exchange(adv.addr(), &post("/v1/pay", "", "{}")).await;
    exchange(adv.addr(), &post("/v1/pay", "", "{}")).await;
    assert_eq!(adv.effects(), 4);
}

#[tokio::test]
async fn idempotent_close_after_apply_first() {
    let adv = Adversary::start(Behavior::Idempotent {
        header: "Idempotency-Key".into(),
        close_after_apply_first: true,
    })
    .await
    .unwrap();
    let key = "idempotency-key: k-1\r\n";
    let (resp, end) = exchange(adv.addr(), &post("/v1/pay", key, "{}")).await;
    assert!(resp.is_empty());
    assert_eq!(end, End::Eof);
    assert_eq!(adv.effects(), 1);

    let (resp, _) = exchange(adv.addr(), &get("/v1/pay?idempotency_key=k-1", "")).await;
    assert_eq!(split(&resp).1, br#"{"id":"pay_1","key":"k-1"}"#);

    let (resp, _) = exchange(adv.addr(), &post("/v1/pay", key, "{}")).await;
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 201 "), "{head}");
    assert_eq!(body, br#"{"id":"pay_1","key":"k-1"}"#);
    assert_eq!(adv.effects(), 1);
}

#[tokio::test]
async fn apply_then_close_with_lookup() {
    let adv = Adversary::start(Behavior::ApplyThenCloseWithLookup)
        .await
        .unwrap();
    let (resp, _) = exchange(adv.addr(), &get("/v1/pay/search?ref=abc", "")).await;
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 404 "), "{head}");
    assert_eq!(body, br#"{"applied":0}"#);

    let (resp, end) = exchange(adv.addr(), &post("/v1/pay", "", "{}")).await;
    assert!(resp.is_empty());
    assert_eq!(end, End::Eof);
    assert_eq!(adv.effects(), 1);

    let (resp, _) = exchange(adv.addr(), &get("/anything", "")).await;
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(body, br#"{"applied":1}"#);
    assert_eq!(adv.effects(), 1);
}

#[tokio::test]
async fn sequence_gives_each_connection_its_step() {
    let adv = Adversary::start(Behavior::Sequence(vec![
        Behavior::CloseBeforeReading,
        Behavior::status(503),
        Behavior::respond(200, "ok"),
    ]))
    .await
    .unwrap();
    let (resp, _) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    assert!(resp.is_empty());
    let (resp, _) = exchange(adv.addr(), &post("/x", "", "{}")).await;
    assert!(text(&resp).starts_with("HTTP/1.1 503 "));
    for _ in 0..2 {
        let (resp, _) = exchange(adv.addr(), &post("/x", "", "{}")).await;
        assert_eq!(split(&resp).1, b"ok");
    }
    assert_eq!(adv.connections(), 4);
    assert_eq!(adv.effects(), 2);
    let connections: Vec<u64> = adv.requests().iter().map(|r| r.connection).collect();
    assert_eq!(connections, vec![1, 2, 3]);
}

#[tokio::test]
async fn empty_sequence_closes() {
    let adv = Adversary::start(Behavior::Sequence(Vec::new()))
        .await
        .unwrap();
    let (resp, _) = exchange(adv.addr(), &get("/", "")).await;
    assert!(resp.is_empty());
}

#[tokio::test]
async fn malformed_request_is_closed_without_effect() {
    let adv = Adversary::start(Behavior::ApplyThenClose).await.unwrap();
    let (resp, _) = exchange(adv.addr(), b"NONSENSE\r\n\r\n").await;
    assert!(resp.is_empty());
    let huge_chunk = b"POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\n";
    let (resp, _) = exchange(adv.addr(), huge_chunk).await;
    assert!(resp.is_empty());
    // A body cut short by the client is recorded as incomplete and never applied.
    let mut stream = TcpStream::connect(adv.addr()).await.unwrap();
    stream
        .write_all(b"POST /x HTTP/1.1\r\ncontent-length: 10\r\n\r\nabc")
        .await
        .unwrap();
    stream.shutdown().await.unwrap();
    let (resp, _) = read_all(&mut stream).await;
    assert!(resp.is_empty());
    let seen = adv.requests();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].body.is_empty() && !seen[0].body_complete);
    assert_eq!(seen[1].body, b"abc");
    assert!(!seen[1].body_complete);
    assert_eq!(adv.effects(), 0);
}

#[tokio::test]
async fn refused_addr_refuses() {
    let addr = refused_addr().unwrap();
    assert!(addr.ip().is_loopback());
    let err = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
}

// ---- TLS ----

async fn tls_connect(
    adv: &Adversary,
    config: Arc<ClientConfig>,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(adv.addr()).await?;
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(config).connect(name, tcp).await
}

fn certificate_error(err: &io::Error) -> CertificateError {
    match err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(cert)) => cert.clone(),
        other => panic!("expected a rustls certificate error, got {other:?} ({err})"),
    }
}

async fn request_over<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) -> Vec<u8> {
    stream.write_all(&post("/tls", "", "{}")).await.unwrap();
    read_all(stream).await.0
}

#[tokio::test]
async fn tls_valid_certificate_from_written_ca_file() {
    let pki = TestPki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = pki.write_ca(dir.path()).unwrap();
    assert_eq!(std::fs::read_to_string(&ca_file).unwrap(), pki.ca_pem());
    assert!(pki.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));

    // Trust exactly what a client would load from the `ca_file`.
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&ca_file).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();

    let adv = Adversary::start_tls(Behavior::respond(200, "secure"), TestCert::Valid, &pki)
        .await
        .unwrap();
    assert_eq!(
        adv.base_url(),
        format!("https://localhost:{}", adv.addr().port())
    );
    let mut stream = tls_connect(&adv, Arc::new(config)).await.unwrap();
    let resp = request_over(&mut stream).await;
    let (head, body) = split(&resp);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert_eq!(body, b"secure");
    assert_eq!(adv.effects(), 1);
    assert_eq!(adv.handshake_failures(), 0);
}

#[tokio::test]
async fn tls_valid_certificate_by_ip_and_alpn_http11() {
    let pki = TestPki::new().unwrap();
    let adv = Adversary::start_tls(Behavior::respond(200, "ip"), TestCert::Valid, &pki)
        .await
        .unwrap();
    let mut config = (*pki.client_config().unwrap()).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(adv.addr()).await.unwrap();
    let name = ServerName::from(adv.addr().ip());
    let mut stream = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let resp = request_over(&mut stream).await;
    assert_eq!(split(&resp).1, b"ip");
}

async fn assert_rejected(cert: TestCert, expected: fn(&CertificateError) -> bool) {
    let pki = TestPki::new().unwrap();
    let adv = Adversary::start_tls(Behavior::respond(200, "no"), cert, &pki)
        .await
        .unwrap();
    let err = tls_connect(&adv, pki.client_config().unwrap())
        .await
        .expect_err("handshake should fail");
    let cert_err = certificate_error(&err);
    assert!(expected(&cert_err), "{cert:?}: unexpected {cert_err:?}");
    assert!(adv.requests().is_empty());
    assert_eq!(adv.effects(), 0);
    let deadline = tokio::time::Instant::now() + READ_LIMIT;
    while adv.handshake_failures() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(adv.handshake_failures(), 1);
}

#[tokio::test]
async fn tls_expired_certificate_is_rejected() {
    assert_rejected(TestCert::Expired, |e| {
        matches!(
            e,
            CertificateError::Expired | CertificateError::ExpiredContext { .. }
        )
    })
    .await;
}

#[tokio::test]
async fn tls_wrong_name_certificate_is_rejected() {
    assert_rejected(TestCert::WrongName, |e| {
        matches!(
            e,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        )
    })
    .await;
}

#[tokio::test]
async fn tls_untrusted_certificate_is_rejected() {
    assert_rejected(TestCert::Untrusted, |e| {
        matches!(e, CertificateError::UnknownIssuer)
    })
    .await;
}

#[tokio::test]
async fn tls_close_before_reading_fails_the_handshake() {
    let pki = TestPki::new().unwrap();
    let adv = Adversary::start_tls(Behavior::CloseBeforeReading, TestCert::Valid, &pki)
        .await
        .unwrap();
    assert!(
        tls_connect(&adv, pki.client_config().unwrap())
            .await
            .is_err()
    );
    assert_eq!(adv.connections(), 1);
}

#[tokio::test]
async fn tls_apply_then_close_sends_close_notify_only() {
    let pki = TestPki::new().unwrap();
    let adv = Adversary::start_tls(Behavior::ApplyThenClose, TestCert::Valid, &pki)
        .await
        .unwrap();
    let mut stream = tls_connect(&adv, pki.client_config().unwrap())
        .await
        .unwrap();
    stream.write_all(&post("/x", "", "{}")).await.unwrap();
    let (resp, end) = read_all(&mut stream).await;
    assert!(resp.is_empty());
    assert_eq!(end, End::Eof);
    assert_eq!(adv.effects(), 1);
}

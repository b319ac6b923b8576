//! A CONNECT proxy for tests (RFC 9110 §9.3.6), on `127.0.0.1:0`.
//!
//! [`TestProxy`] reads one CONNECT request per connection, answers it as its
//! [`ProxyBehavior`] says, and for a tunnel relays bytes between the client and the
//! destination. It only ever connects to loopback: a destination that does not resolve
//! to a loopback address is answered `403` (after the test's own [`TestProxy::map_host`]
//! names), so a test can never reach the network through it.
//!
//! It counts connections and opened tunnels, and records every CONNECT it read (target
//! and `Proxy-Authorization`), so tests can prove what reached the proxy and that a
//! refused tunnel carried nothing further. It is a real proxy: curl and other clients
//! tunnel through it (see the proxy tests).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The longest CONNECT head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;

/// What the proxy does with each CONNECT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyBehavior {
    /// Opens the tunnel (`200`) and relays both ways until either side closes.
    Tunnel,
    /// Answers with this status (and `connection: close`), then closes.
    Answer(u16),
    /// Reads the CONNECT head, then closes without answering.
    CloseMidConnect,
    /// Sends half a status line, then closes.
    HalfAnswer,
    /// Reads the CONNECT head and never answers (until the proxy is dropped).
    Stall,
    /// Opens the tunnel and relays towards the destination, but closes both sides as
    /// soon as the destination starts answering: the request arrives, its response
    /// never does.
    DieAfterRequest,
}

/// One CONNECT request the proxy read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenConnect {
    /// The request target, e.g. `localhost:8443`.
    pub target: String,
    /// The `Proxy-Authorization` value, if sent.
    pub proxy_authorization: Option<String>,
    /// The whole head as received, for asserting what it did (not) carry.
    pub head: String,
}

struct Shared {
    behavior: ProxyBehavior,
    /// The `Proxy-Authorization` value required, if any (otherwise 407).
    required: Option<String>,
    hosts: Mutex<HashMap<String, IpAddr>>,
    connections: AtomicU64,
    tunnels: AtomicU64,
    seen: Mutex<Vec<SeenConnect>>,
    /// With [`TestProxy::start_held`]: a CONNECT waits here, after it is read and
    /// before the behavior applies, until [`TestProxy::release`] lets one through.
    hold: Option<tokio::sync::Semaphore>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running test proxy; dropping it stops it and closes every connection it holds.
pub struct TestProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl fmt::Debug for TestProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestProxy")
            .field("addr", &self.addr)
            .field("behavior", &self.shared.behavior)
            .finish_non_exhaustive()
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestProxy {
    /// Starts a proxy that needs no credentials. Must be called inside a tokio runtime.
    pub async fn start(behavior: ProxyBehavior) -> io::Result<TestProxy> {
        TestProxy::launch(behavior, None, false).await
    }

    /// Starts a proxy that holds every CONNECT once it has read it (it shows in
    /// [`TestProxy::connects`]) until [`TestProxy::release`], then does what
    /// `behavior` says: a window, inside the client's connection setup, for a test to
    /// act in.
    pub async fn start_held(behavior: ProxyBehavior) -> io::Result<TestProxy> {
        TestProxy::launch(behavior, None, true).await
    }

    /// Lets one held CONNECT go on (see [`TestProxy::start_held`]).
    pub fn release(&self) {
        if let Some(hold) = &self.shared.hold {
            hold.add_permits(1);
        }
    }

    /// Starts a proxy that answers `407` unless CONNECT carries
    /// `Proxy-Authorization: Basic base64(user:password)`.
    pub async fn start_with_credentials(
        behavior: ProxyBehavior,
        user: &str,
        password: &str,
    ) -> io::Result<TestProxy> {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        TestProxy::launch(behavior, Some(format!("Basic {token}")), false).await
    }

    async fn launch(
        behavior: ProxyBehavior,
        required: Option<String>,
        held: bool,
    ) -> io::Result<TestProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            behavior,
            required,
            hosts: Mutex::new(HashMap::new()),
            connections: AtomicU64::new(0),
            tunnels: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            hold: held.then(|| tokio::sync::Semaphore::new(0)),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(TestProxy { addr, shared, task })
    }

    /// Makes the proxy resolve `name` to `ip` (which must be loopback to be connected
    /// to), as a proxy with its own DNS view would.
    pub fn map_host(&self, name: &str, ip: IpAddr) {
        lock(&self.shared.hosts).insert(name.to_ascii_lowercase(), ip);
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT`.
    pub fn authority(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Tunnels opened so far (CONNECT answered `200` after the destination accepted).
    pub fn tunnels(&self) -> u64 {
        self.shared.tunnels.load(Ordering::SeqCst)
    }

    /// Every CONNECT read so far, in order.
    pub fn connects(&self) -> Vec<SeenConnect> {
        lock(&self.shared.seen).clone()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let shared = Arc::clone(&shared);
                tasks.spawn(async move { handle(tcp, shared).await });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

/// Reads up to the end of the CONNECT head; returns the head and any bytes after it.
async fn read_head(tcp: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(chunk.get(..n)?),
        }
    }
}

async fn answer(tcp: &mut TcpStream, status: u16, extra: &str) {
    let head = format!(
        "HTTP/1.1 {status} Test Proxy\r\n{extra}content-length: 0\r\nconnection: close\r\n\r\n"
    );
    let _ = tcp.write_all(head.as_bytes()).await;
    let _ = tcp.shutdown().await;
}

async fn handle(mut tcp: TcpStream, shared: Arc<Shared>) {
    let Some((head, early)) = read_head(&mut tcp).await else {
        return;
    };
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let proxy_authorization = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("proxy-authorization"))
        .map(|(_, v)| v.trim().to_string());
    lock(&shared.seen).push(SeenConnect {
        target: target.to_string(),
        proxy_authorization: proxy_authorization.clone(),
        head: head.clone(),
    });
    if method != "CONNECT" {
        return answer(&mut tcp, 405, "").await;
    }
    if let Some(hold) = &shared.hold {
        match hold.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return,
        }
    }
    match shared.behavior {
        ProxyBehavior::CloseMidConnect => return,
        ProxyBehavior::HalfAnswer => {
            let _ = tcp.write_all(b"HTTP/1.1 20").await;
            return;
        }
        ProxyBehavior::Stall => {
            std::future::pending::<()>().await;
            return;
        }
        ProxyBehavior::Answer(status) => return answer(&mut tcp, status, "").await,
        ProxyBehavior::Tunnel | ProxyBehavior::DieAfterRequest => {}
    }
    if let Some(required) = &shared.required
        && proxy_authorization.as_deref() != Some(required.as_str())
    {
        return answer(
            &mut tcp,
            407,
            "proxy-authenticate: Basic realm=\"test\"\r\n",
        )
        .await;
    }
    let mut origin = match connect_loopback(target, &shared).await {
        Ok(origin) => origin,
        Err(status) => return answer(&mut tcp, status, "").await,
    };
    if tcp
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    shared.tunnels.fetch_add(1, Ordering::SeqCst);
    if !early.is_empty() && origin.write_all(&early).await.is_err() {
        return;
    }
    match shared.behavior {
        ProxyBehavior::DieAfterRequest => {
            let (mut client_read, _client_write) = tcp.into_split();
            let (mut origin_read, mut origin_write) = origin.into_split();
            let upstream = tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut origin_write).await;
            });
            // The first byte of the destination's answer: the request has arrived.
            let mut first = [0u8; 1];
            let _ = origin_read.read(&mut first).await;
            upstream.abort();
            // Every half is dropped here: both connections close, the answer is lost.
        }
        _ => {
            let _ = tokio::io::copy_bidirectional(&mut tcp, &mut origin).await;
        }
    }
}

/// Connects to `target` (`host:port`) if it resolves to a loopback address; otherwise
/// the status to answer: 400 for a malformed target, 403 for one that is not loopback,
/// 502 when nothing accepts.
async fn connect_loopback(target: &str, shared: &Shared) -> Result<TcpStream, u16> {
    let (host, port) = target.rsplit_once(':').ok_or(400u16)?;
    let port: u16 = port.parse().map_err(|_| 400u16)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let mapped = lock(&shared.hosts).get(&host.to_ascii_lowercase()).copied();
    let addrs: Vec<SocketAddr> = match mapped {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => match tokio::net::lookup_host((host, port)).await {
            Ok(addrs) => addrs.collect(),
            Err(_) => return Err(502),
        },
    };
    let loopback: Vec<SocketAddr> = addrs.into_iter().filter(|a| a.ip().is_loopback()).collect();
    if loopback.is_empty() {
        return Err(403);
    }
    for addr in loopback {
        if let Ok(tcp) = TcpStream::connect(addr).await {
            return Ok(tcp);
        }
    }
    Err(502)
}

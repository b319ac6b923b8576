//! The peering port's gate: what a party without a key can make this broker hold,
//! bounded before any body is read (issue 27, item 4; see the parent module's docs for
//! the limits). It must never read a request body before the checks from its headers
//! passed and its bytes were taken from a budget, and never keep those bytes past the
//! request.

use super::*;

/// Whom a connection counts against for [`MAX_PER_SOURCE`]: its IPv4 address, or the
/// /64 its IPv6 address is in (one party gets a whole /64 cheaply). What the kernel
/// reports is the last hop: every peer behind one proxy or TLS terminator, and every
/// local client of `127.0.0.1`, is one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    V4(Ipv4Addr),
    /// The first four groups (the /64) of an IPv6 address.
    V6([u16; 4]),
}

impl Source {
    /// The source of a connection from `ip` (an IPv4-mapped IPv6 address is its IPv4
    /// address).
    pub fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Source::V4(v4),
            IpAddr::V6(v6) => {
                let s = v6.segments();
                Source::V6([s[0], s[1], s[2], s[3]])
            }
        }
    }
}

/// The peering port's connection caps, (in total, per source), for a process that may
/// hold `descriptors` open: [`MAX_CONNECTIONS`] and [`MAX_PER_SOURCE`], lowered so that
/// they take at most a quarter of what is left after a reserve (the agent socket takes
/// up to half, [`crate::admission`]), and so that no source holds more than half.
pub fn caps_for_descriptors(descriptors: Option<u64>) -> (usize, usize) {
    let total = descriptors
        .and_then(|d| usize::try_from(d).ok())
        .map_or(MAX_CONNECTIONS, |d| {
            d.saturating_sub(RESERVED_DESCRIPTORS) / 4
        })
        .clamp(8, MAX_CONNECTIONS);
    (total, MAX_PER_SOURCE.min(total / 2).max(1))
}

/// Why a request was answered by the peering port itself and not passed on. Every one
/// is decided before the rest of its body is read (or instead of reading it) and closes
/// the connection; none is a statement about the peer's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum Refusal {
    #[error("the request body is above {MAX_REQUEST_BYTES} bytes")]
    TooLarge,
    #[error("a request body above {SMALL_BODY_BYTES} bytes must declare its Content-Length")]
    LengthRequired,
    #[error(
        "a request body above {SMALL_BODY_BYTES} bytes needs a Postern-Peer header naming a \
         broker this one pins"
    )]
    Unnamed,
    #[error("this broker holds as many request bodies as it takes at once; retry later")]
    Busy,
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    #[error("the request body stalled")]
    BodyStalled,
    #[error("the request body could not be read")]
    BodyBroken,
}

impl Refusal {
    fn status(self) -> StatusCode {
        match self {
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::LengthRequired => StatusCode::LENGTH_REQUIRED,
            Refusal::Unnamed => StatusCode::FORBIDDEN,
            Refusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::BodyTimeout | Refusal::BodyStalled => StatusCode::REQUEST_TIMEOUT,
            Refusal::BodyBroken => StatusCode::BAD_REQUEST,
        }
    }

    /// The answer: its status and reason, `Connection: close` (the unread rest of the
    /// body is never read), and `Retry-After` when the refusal is only for now.
    fn response(self) -> Response<Body> {
        let mut response = Response::new(Full::new(Bytes::from(format!("{self}\n"))).boxed());
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
        if self == Refusal::Busy {
            headers.insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
        }
        response
    }
}

/// The answer to a connection past a cap, written without reading anything from it.
const TURNED_AWAY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\n\
Content-Type: text/plain\r\nContent-Length: 45\r\nConnection: close\r\n\r\n\
this broker holds too many peer connections\r\n";

/// What a POST's headers allow, decided before a byte of its body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intake {
    /// A body of exactly this many bytes (its Content-Length).
    Declared(usize),
    /// A body of undeclared length (chunked): at most [`SMALL_BODY_BYTES`] of it.
    Undeclared,
}

impl Intake {
    /// The most bytes of body this request may make the broker hold.
    fn limit(self) -> usize {
        match self {
            Intake::Declared(n) => n,
            Intake::Undeclared => SMALL_BODY_BYTES,
        }
    }

    fn is_large(self) -> bool {
        self.limit() > SMALL_BODY_BYTES
    }

    /// What reading more than [`Intake::limit`] is.
    fn overflow(self) -> Refusal {
        match self {
            Intake::Declared(_) => Refusal::TooLarge,
            Intake::Undeclared => Refusal::LengthRequired,
        }
    }
}

/// The cheap checks, from the headers alone: a body of `declared` bytes (`None`: not
/// declared) may be read only when it is small, or at most [`MAX_REQUEST_BYTES`] and
/// sent under a [`PEER_HEADER`] that `is_pinned_peer` knows. Never reads the body.
fn precheck(
    declared: Option<u64>,
    headers: &HeaderMap,
    is_pinned_peer: &dyn Fn(&str) -> bool,
) -> Result<Intake, Refusal> {
    let Some(declared) = declared else {
        return Ok(Intake::Undeclared);
    };
    let length = usize::try_from(declared)
        .ok()
        .filter(|n| *n <= MAX_REQUEST_BYTES)
        .ok_or(Refusal::TooLarge)?;
    if length <= SMALL_BODY_BYTES {
        return Ok(Intake::Declared(length));
    }
    let named = headers
        .get(PEER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .is_some_and(|name| !name.is_empty() && is_pinned_peer(name));
    if named {
        Ok(Intake::Declared(length))
    } else {
        Err(Refusal::Unnamed)
    }
}

/// How long a body may take.
#[derive(Debug, Clone, Copy)]
pub(super) struct BodyTimeouts {
    /// From the end of the headers to the end of the body.
    total: Duration,
    /// Between two pieces of it.
    idle: Duration,
}

pub(super) const BODY_TIMEOUTS: BodyTimeouts = BodyTimeouts {
    total: BODY_TIMEOUT,
    idle: BODY_IDLE_TIMEOUT,
};

/// Reads a body `intake` allows, within `timeouts`. Never holds more than
/// [`Intake::limit`] bytes of it, and never waits past the deadlines.
async fn read_body<B>(
    mut body: B,
    intake: Intake,
    timeouts: BodyTimeouts,
) -> Result<Vec<u8>, Refusal>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let deadline = tokio::time::Instant::now() + timeouts.total;
    let limit = intake.limit();
    // A declared length was taken from the budget: hold exactly it, never a doubling.
    let mut bytes = Vec::with_capacity(match intake {
        Intake::Declared(n) => n,
        Intake::Undeclared => 0,
    });
    loop {
        let wait = deadline.min(tokio::time::Instant::now() + timeouts.idle);
        let frame = match tokio::time::timeout_at(wait, body.frame()).await {
            Err(_) if wait >= deadline => return Err(Refusal::BodyTimeout),
            Err(_) => return Err(Refusal::BodyStalled),
            Ok(None) => return Ok(bytes),
            Ok(Some(Err(_))) => return Err(Refusal::BodyBroken),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.len() > limit.saturating_sub(bytes.len()) {
            return Err(intake.overflow());
        }
        bytes.extend_from_slice(&data);
    }
}

/// Bytes of one request body taken from a budget; given back when dropped, however the
/// request ends (answered, refused, timed out, its connection closed). Never outlives
/// the request.
struct Held<'a> {
    budget: &'a ByteBudget,
    bytes: usize,
    /// Set when a large body is let go: the heap it was in is owed to the system.
    trim_owed: Option<&'a AtomicBool>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
        if let Some(owed) = self.trim_owed {
            owed.store(true, Ordering::Release);
        }
    }
}

/// Makes the allocator hand large freed blocks back to the operating system at once,
/// for the whole process. glibc otherwise raises its thresholds to the largest block
/// freed so far, after which blocks of that size come from its arenas and up to twice
/// that stays resident in each arena once they are freed (issue 27: 1.66 GB still held
/// after the connections closed; here, 70 to 115 MiB after a flood of whole 16 MiB
/// bodies, against under 8 MiB with the thresholds fixed). With them fixed, blocks of
/// [`ALLOCATOR_MMAP_BYTES`] or more are mapped and unmapped on their own, and the free
/// top of an arena is trimmed past [`ALLOCATOR_TRIM_BYTES`]. Never called but by
/// [`serve`]: a process without a peering port keeps glibc's defaults.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(super) fn hand_large_blocks_back() {
    // SAFETY: mallopt takes two integers and sets allocator parameters under the
    // allocator's own lock; it may be called from any thread at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, ALLOCATOR_MMAP_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, ALLOCATOR_TRIM_BYTES);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(super) fn hand_large_blocks_back() {}

/// Hands the free pages inside the allocator's arenas to the operating system (what the
/// fixed thresholds of [`hand_large_blocks_back`] leave: holes between blocks in use).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn release_freed_memory() {
    // SAFETY: malloc_trim takes no pointer from us; it walks the allocator's own free
    // lists under the allocator's locks and may be called from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_freed_memory() {}

/// What the peering port lets its connections hold: connection slots, in all and per
/// source, and request-body bytes, large bodies against one budget and small ones
/// against another. Nothing here reads a body before its checks pass.
pub(super) struct Gate {
    admission: Arc<Admission<Source>>,
    large: ByteBudget,
    small: ByteBudget,
    /// A large body was let go since the freed heap was last handed back.
    trim_owed: AtomicBool,
    timeouts: BodyTimeouts,
    is_pinned_peer: Box<dyn Fn(&str) -> bool + Send + Sync>,
}

impl Gate {
    pub(super) fn new(
        (total, per_source): (usize, usize),
        large_budget: usize,
        timeouts: BodyTimeouts,
        is_pinned_peer: Box<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Gate {
        Gate {
            admission: Admission::new(total, per_source),
            large: ByteBudget::new(large_budget),
            // One small body per connection: never the reason a small call is refused.
            small: ByteBudget::new(total.saturating_mul(SMALL_BODY_BYTES)),
            trim_owed: AtomicBool::new(false),
            timeouts,
            is_pinned_peer,
        }
    }

    /// A slot for a connection from `peer`, or `None` past a cap.
    fn admit(&self, peer: IpAddr) -> Option<Admitted<Source>> {
        let slot = self.admission.try_slot()?;
        self.admission.admit(slot, &Source::of(peer))
    }

    /// Takes what `intake` may hold from its budget, or `None` when it does not fit.
    fn reserve(&self, intake: Intake) -> Option<Held<'_>> {
        let large = intake.is_large();
        let budget = if large { &self.large } else { &self.small };
        let bytes = intake.limit();
        // `then`, never `then_some`: a Held made for bytes not taken would give them
        // back when dropped.
        budget.take(bytes).then(|| Held {
            budget,
            bytes,
            trim_owed: large.then_some(&self.trim_owed),
        })
    }

    /// Hands the freed heap back once no large body is held any more (at most once per
    /// [`TRIM_EVERY`]; never while one is held, so never during a flood's worst).
    fn trim_if_owed(&self) {
        if self.large.held() == 0 && self.trim_owed.swap(false, Ordering::AcqRel) {
            release_freed_memory();
        }
    }

    /// Answers one request: passes it to `handle` with its body read whole, once the
    /// checks allowed it, its bytes were taken from a budget, and it arrived in time;
    /// otherwise answers it itself ([`Refusal`]). The bytes are held until `handle`
    /// has answered.
    async fn answer<B, H, F>(&self, request: Request<B>, handle: H) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Unpin,
        H: FnOnce(Request<Full<Bytes>>) -> F,
        F: Future<Output = Response<Body>>,
    {
        if request.uri().path() != PATH {
            return not_found();
        }
        let (parts, body) = request.into_parts();
        if parts.method != Method::POST {
            // Only a POST carries a message; any other body is never read.
            return handle(Request::from_parts(parts, Full::new(Bytes::new()))).await;
        }
        let intake = match precheck(
            body.size_hint().exact(),
            &parts.headers,
            &*self.is_pinned_peer,
        ) {
            Ok(intake) => intake,
            Err(refusal) => return refusal.response(),
        };
        let Some(held) = self.reserve(intake) else {
            return Refusal::Busy.response();
        };
        let bytes = match read_body(body, intake, self.timeouts).await {
            Ok(bytes) => bytes,
            Err(refusal) => return refusal.response(),
        };
        let response = handle(Request::from_parts(parts, Full::new(Bytes::from(bytes)))).await;
        drop(held);
        response
    }
}

/// Serves `handle` behind `gate` on `listener` until `shutdown` completes; then lets the
/// requests in flight finish, bounded by a few seconds.
pub(super) async fn serve_gated<H, F, S>(
    gate: Arc<Gate>,
    listener: TcpListener,
    handle: H,
    shutdown: S,
) where
    H: Fn(Request<Full<Bytes>>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
    S: Future<Output = ()>,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut tidy = tokio::time::interval(TRIM_EVERY);
    tidy.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        while connections.try_join_next().is_some() {}
        tokio::select! {
            () = &mut shutdown => break,
            _ = tidy.tick() => gate.trim_if_owed(),
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    // Out of file descriptors and the like: back off, keep serving.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let Some(admitted) = gate.admit(peer.ip()) else {
                    // Past a cap: one write that never waits, and the descriptor is
                    // closed at once.
                    let _ = stream.try_write(TURNED_AWAY);
                    continue;
                };
                let (gate, handle) = (gate.clone(), handle.clone());
                let mut stop = stop_rx.clone();
                connections.spawn(async move {
                    let _admitted = admitted;
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (gate, handle) = (gate.clone(), handle.clone());
                        async move { Ok::<_, Infallible>(gate.answer(req, handle).await) }
                    });
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .max_buf_size(READ_BUFFER_BYTES)
                        .serve_connection(TokioIo::new(stream), service);
                    let mut conn = std::pin::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = stop.changed() => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
        }
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Instant;

    use hyper::body::Frame;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::mpsc;

    use super::*;

    const PINNED: &str = "org-a-3f2c";

    fn pinned(name: &str) -> bool {
        name == PINNED
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    // Regression: issue 27 (item 4).
    #[test]
    fn a_large_body_is_refused_from_the_headers_unless_it_is_declared_bounded_and_named() {
        let none = headers(&[]);
        let named = headers(&[(PEER_HEADER, PINNED)]);
        let stranger = headers(&[(PEER_HEADER, "someone-else")]);
        let small = SMALL_BODY_BYTES as u64;
        let max = MAX_REQUEST_BYTES as u64;
        // Small bodies need no name, declared or not: old peers and listings work.
        assert_eq!(precheck(Some(0), &none, &pinned), Ok(Intake::Declared(0)));
        assert_eq!(
            precheck(Some(small), &none, &pinned),
            Ok(Intake::Declared(SMALL_BODY_BYTES))
        );
        assert_eq!(
            precheck(Some(small), &stranger, &pinned),
            Ok(Intake::Declared(SMALL_BODY_BYTES))
        );
        assert_eq!(precheck(None, &none, &pinned), Ok(Intake::Undeclared));
        // Above the threshold: a pinned peer's name, and a length within the maximum.
        for unnamed in [&none, &stranger, &headers(&[(PEER_HEADER, "")])] {
            assert_eq!(
                precheck(Some(small + 1), unnamed, &pinned),
                Err(Refusal::Unnamed)
            );
        }
        assert_eq!(
            precheck(Some(max), &named, &pinned),
            Ok(Intake::Declared(MAX_REQUEST_BYTES))
        );
        assert_eq!(
            precheck(Some(max + 1), &named, &pinned),
            Err(Refusal::TooLarge)
        );
        assert_eq!(
            precheck(Some(u64::MAX), &none, &pinned),
            Err(Refusal::TooLarge)
        );
        assert!(!Intake::Undeclared.is_large());
        assert!(Intake::Declared(SMALL_BODY_BYTES + 1).is_large());
    }

    #[test]
    fn sources_are_addresses_and_ipv6_slash_64s() {
        let v4 = |s: &str| Source::of(s.parse().unwrap());
        assert_eq!(v4("192.0.2.1"), v4("::ffff:192.0.2.1"));
        assert_ne!(v4("192.0.2.1"), v4("192.0.2.2"));
        assert_eq!(v4("2001:db8:1:2::1"), v4("2001:db8:1:2:ffff::9"));
        assert_ne!(v4("2001:db8:1:2::1"), v4("2001:db8:1:3::1"));
    }

    #[test]
    fn a_low_descriptor_limit_lowers_the_connection_caps() {
        assert_eq!(
            caps_for_descriptors(None),
            (MAX_CONNECTIONS, MAX_PER_SOURCE)
        );
        assert_eq!(
            caps_for_descriptors(Some(65_536)),
            (MAX_CONNECTIONS, MAX_PER_SOURCE)
        );
        assert_eq!(caps_for_descriptors(Some(1024)), (192, MAX_PER_SOURCE));
        assert_eq!(caps_for_descriptors(Some(300)), (11, 5));
        assert_eq!(caps_for_descriptors(Some(10)), (8, 4));
    }

    // Regression: issue 27 (item 4).
    #[test]
    fn the_heap_is_owed_back_once_no_large_body_is_held_and_only_then() {
        let gate = Gate::new((8, 4), 4 * MAX_REQUEST_BYTES, QUICK, Box::new(pinned));
        let large = Intake::Declared(SMALL_BODY_BYTES + 1);
        let first = gate.reserve(large).unwrap();
        let second = gate.reserve(large).unwrap();
        drop(gate.reserve(Intake::Declared(10)).unwrap());
        assert!(
            !gate.trim_owed.load(Ordering::Acquire),
            "a small body owes nothing"
        );
        drop(first);
        gate.trim_if_owed();
        assert!(
            gate.trim_owed.load(Ordering::Acquire),
            "not while a large body is still held"
        );
        drop(second);
        assert_eq!(gate.large.held(), 0);
        gate.trim_if_owed();
        assert!(!gate.trim_owed.load(Ordering::Acquire));
    }

    /// A body whose pieces a test sends when it likes.
    struct Pieces(mpsc::UnboundedReceiver<Bytes>);

    impl hyper::body::Body for Pieces {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0
                .poll_recv(cx)
                .map(|piece| piece.map(|b| Ok(Frame::data(b))))
        }
    }

    fn pieces() -> (mpsc::UnboundedSender<Bytes>, Pieces) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Pieces(rx))
    }

    const QUICK: BodyTimeouts = BodyTimeouts {
        total: Duration::from_millis(900),
        idle: Duration::from_millis(300),
    };
    /// Longer than any test takes.
    const PATIENT: BodyTimeouts = BodyTimeouts {
        total: Duration::from_secs(60),
        idle: Duration::from_secs(60),
    };

    #[tokio::test]
    async fn a_body_is_read_whole_within_its_limit_and_its_deadlines() {
        let (tx, body) = pieces();
        tx.send(Bytes::from_static(b"{\"a\":")).unwrap();
        tx.send(Bytes::from_static(b"1}")).unwrap();
        drop(tx);
        assert_eq!(
            read_body(body, Intake::Declared(7), QUICK).await,
            Ok(b"{\"a\":1}".to_vec())
        );

        // An undeclared body past the small threshold needed a declared length.
        let (tx, body) = pieces();
        tx.send(Bytes::from(vec![b'x'; SMALL_BODY_BYTES])).unwrap();
        tx.send(Bytes::from_static(b"x")).unwrap();
        assert_eq!(
            read_body(body, Intake::Undeclared, QUICK).await,
            Err(Refusal::LengthRequired)
        );

        // A body that stops is cut after the idle timeout...
        let (tx, body) = pieces();
        tx.send(Bytes::from_static(b"x")).unwrap();
        let started = Instant::now();
        assert_eq!(
            read_body(body, Intake::Declared(10), QUICK).await,
            Err(Refusal::BodyStalled)
        );
        assert!(started.elapsed() < QUICK.total, "{:?}", started.elapsed());
        drop(tx);

        // ...and one that trickles, never idle for long, at the total deadline.
        let (tx, body) = pieces();
        let trickle = tokio::spawn(async move {
            while tx.send(Bytes::from_static(b"x")).is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let started = Instant::now();
        assert_eq!(
            read_body(body, Intake::Declared(1000), QUICK).await,
            Err(Refusal::BodyTimeout)
        );
        let took = started.elapsed();
        assert!(took >= QUICK.total && took < QUICK.total * 2, "{took:?}");
        trickle.await.unwrap();
    }

    /// A gate in front of a handler that answers the length of the body it got, served
    /// on a loopback port.
    async fn gated(
        caps: (usize, usize),
        large_budget: usize,
        timeouts: BodyTimeouts,
    ) -> (Arc<Gate>, SocketAddr, watch::Sender<bool>) {
        let gate = Arc::new(Gate::new(caps, large_budget, timeouts, Box::new(pinned)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let handle = |request: Request<Full<Bytes>>| async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            Response::new(Full::new(Bytes::from(body.len().to_string())).boxed())
        };
        tokio::spawn(serve_gated(gate.clone(), listener, handle, async move {
            let _ = stop_rx.changed().await;
        }));
        (gate, addr, stop_tx)
    }

    /// A connection that sent `head` (and `body`), not yet answered.
    async fn send(addr: SocketAddr, head: &str, body: &[u8]) -> TcpStream {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        stream
    }

    fn post(length: Option<usize>, extra: &str) -> String {
        let length = length.map_or("Transfer-Encoding: chunked\r\n".to_string(), |n| {
            format!("Content-Length: {n}\r\n")
        });
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\n{length}{extra}\r\n"
        )
    }

    /// The answer's head and whatever of its body came with it, within 5 s.
    async fn answer(stream: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_string)
                    })
                    .and_then(|n| n.trim().parse::<usize>().ok());
                if length.is_some_and(|n| body.len() >= n) {
                    break;
                }
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within 5 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    // Regression: issue 27 (item 4).
    #[tokio::test]
    async fn a_connection_past_a_cap_is_turned_away_unread_and_its_slot_comes_back() {
        let (gate, addr, _stop) = gated((4, 2), LARGE_BODY_BUDGET, PATIENT).await;
        let first = TcpStream::connect(addr).await.unwrap();
        let second = TcpStream::connect(addr).await.unwrap();
        until("two connections held", || gate.admission.free() == 2).await;
        // Past this source's cap: a fixed 503, and closed.
        let mut third = send(addr, &post(Some(2), ""), b"{}").await;
        let refused = answer(&mut third).await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(refused.contains("Retry-After: 2"), "{refused}");
        assert_eq!(gate.admission.free(), 2, "the refused one holds no slot");
        // A connection that ends gives its slot back.
        drop(first);
        until("the slot given back", || gate.admission.free() == 3).await;
        let mut fourth = send(addr, &post(Some(2), ""), b"{}").await;
        let served = answer(&mut fourth).await;
        assert!(served.starts_with("HTTP/1.1 200"), "{served}");
        assert!(served.ends_with("\r\n\r\n2"), "{served}");
        drop((second, fourth));
        until("every slot given back", || gate.admission.free() == 4).await;
    }

    // Regression: issue 27 (item 4).
    #[tokio::test]
    async fn large_bodies_share_one_budget_that_never_turns_a_small_call_away() {
        let large = SMALL_BODY_BYTES + 1000;
        let (gate, addr, _stop) = gated((64, 32), 2 * large, PATIENT).await;
        let named = format!("{PEER_HEADER}: {PINNED}\r\n");
        // Two large bodies from a pinned peer's name take the whole budget and stall.
        let stalled1 = send(addr, &post(Some(large), &named), b"{\"x\":").await;
        let stalled2 = send(addr, &post(Some(large), &named), b"{\"x\":").await;
        until("two bodies held", || gate.large.held() == 2 * large).await;
        // A third is told to come back later, without being buffered.
        let mut third = send(addr, &post(Some(large), &named), &vec![b' '; 4096]).await;
        let busy = answer(&mut third).await;
        assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
        assert!(busy.contains("retry-after: 2"), "{busy}");
        assert_eq!(gate.large.held(), 2 * large);
        // A small call, with or without a name, is served meanwhile.
        for extra in ["", named.as_str()] {
            let mut small = send(addr, &post(Some(2), extra), b"{}").await;
            let served = answer(&mut small).await;
            assert!(served.starts_with("HTTP/1.1 200"), "{served}");
        }
        // The cheap refusals, answered from the headers.
        for (head, status) in [
            (post(Some(large), ""), "403"),
            (
                post(Some(large), &format!("{PEER_HEADER}: stranger\r\n")),
                "403",
            ),
            (post(Some(MAX_REQUEST_BYTES + 1), &named), "413"),
        ] {
            let mut refused = send(addr, &head, b"{").await;
            let got = answer(&mut refused).await;
            assert!(got.starts_with(&format!("HTTP/1.1 {status}")), "{got}");
            assert!(got.contains("connection: close"), "{got}");
        }
        let mut chunked = send(addr, &post(None, ""), b"").await;
        let chunk = vec![b' '; SMALL_BODY_BYTES + 1];
        chunked
            .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await
            .unwrap();
        let _ = chunked.write_all(&chunk).await;
        let got = answer(&mut chunked).await;
        assert!(got.starts_with("HTTP/1.1 411"), "{got}");
        assert_eq!(gate.large.held(), 2 * large, "no refusal took any budget");
        // A stalled body's bytes come back when its connection closes, and the next
        // large body fits.
        drop(stalled1);
        until("the bytes given back", || gate.large.held() == large).await;
        let mut body = b"{\"x\":\"".to_vec();
        body.resize(large - 2, b'y');
        body.extend_from_slice(b"\"}");
        let mut whole = send(addr, &post(Some(large), &named), &body).await;
        let served = answer(&mut whole).await;
        assert!(served.ends_with(&format!("\r\n\r\n{large}")), "{served}");
        until("only the stalled one held", || gate.large.held() == large).await;
        drop(stalled2);
        until("nothing held", || gate.large.held() == 0).await;
        assert_eq!(gate.small.held(), 0);
    }

    // Regression: issue 27 (item 4).
    #[tokio::test]
    async fn a_body_that_stalls_is_answered_408_and_its_bytes_and_slot_come_back() {
        let large = SMALL_BODY_BYTES + 1000;
        let (gate, addr, _stop) = gated((8, 4), 4 * large, QUICK).await;
        let named = format!("{PEER_HEADER}: {PINNED}\r\n");
        let started = Instant::now();
        let mut stalled = send(addr, &post(Some(large), &named), b"{").await;
        let got = answer(&mut stalled).await;
        assert!(got.starts_with("HTTP/1.1 408"), "{got}");
        assert!(started.elapsed() < QUICK.total, "{:?}", started.elapsed());
        // The connection is closed: its slot and its bytes are back.
        let mut rest = [0u8; 16];
        assert!(matches!(stalled.read(&mut rest).await, Ok(0) | Err(_)));
        until("slot and bytes given back", || {
            gate.admission.free() == 8 && gate.large.held() == 0
        })
        .await;
    }
}

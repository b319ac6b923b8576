//! The witness over HTTP/1.1 (hyper):
//!
//! - `POST /add-checkpoint`: c2sp.org/tlog-witness. 200 with the cosignature line(s);
//!   409 `text/x.tlog.size` with the latest size when `old` is stale; otherwise the
//!   status [`AddError::status`] gives, with a one-line `text/plain` reason.
//! - `GET /postern/latest?origin=<urlencoded origin>` (ours, not in the specification):
//!   the latest checkpoint cosigned for that origin as one signed note carrying the log's
//!   signature and our cosignature, so an auditor can show a journal was cut back behind
//!   what the witness saw. 404 when the origin is unknown or nothing was cosigned yet.
//!
//! Bodies above [`MAX_REQUEST_BYTES`] get 413; a client that takes more than
//! [`READ_TIMEOUT`] to send its headers or its body is dropped. The witness's work runs
//! on the blocking pool (SQLite with an fsync per cosignature).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::witness::{AddError, MAX_REQUEST_BYTES, Witness};

/// The submission path (tlog-witness, "add-checkpoint").
pub const ADD_CHECKPOINT_PATH: &str = "/add-checkpoint";
/// Our read endpoint.
pub const LATEST_PATH: &str = "/postern/latest";
/// The content type of a 409's body (tlog-witness).
pub const TLOG_SIZE_CONTENT_TYPE: &str = "text/x.tlog.size";
/// How long a client may take to send its request headers, and then its body.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `witness` on `listener` until `shutdown` completes, then lets the requests in
/// flight finish (bounded by a few seconds). A cosignature is only sent after its state
/// is committed, so a request cut off by the process dying loses nothing.
pub async fn serve<F>(witness: Arc<Witness>, listener: TcpListener, shutdown: F)
where
    F: Future<Output = ()>,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connections so the set does not grow with every client.
        while connections.try_join_next().is_some() {}
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _peer)) => stream,
                    // Out of file descriptors and the like: back off, keep serving.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let witness = witness.clone();
                let mut stop = stop_rx.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(witness.clone(), req));
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(READ_TIMEOUT)
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
    drop(listener);
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn text(status: StatusCode, message: impl std::fmt::Display) -> Reply {
    reply(status, "text/plain; charset=utf-8", format!("{message}\n"))
}

async fn handle(witness: Arc<Witness>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let path = req.uri().path().to_string();
    let reply = match (req.method(), path.as_str()) {
        (&Method::POST, ADD_CHECKPOINT_PATH) => add_checkpoint(witness, req).await,
        (&Method::GET, LATEST_PATH) => latest(witness, req.uri().query()).await,
        (_, ADD_CHECKPOINT_PATH) => method_not_allowed("POST"),
        (_, LATEST_PATH) => method_not_allowed("GET"),
        _ => text(StatusCode::NOT_FOUND, "not found"),
    };
    Ok(reply)
}

fn method_not_allowed(allow: &'static str) -> Reply {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

async fn add_checkpoint(witness: Arc<Witness>, req: Request<Incoming>) -> Reply {
    let body = Limited::new(req.into_body(), MAX_REQUEST_BYTES);
    let body = match tokio::time::timeout(READ_TIMEOUT, body.collect()).await {
        Err(_) => {
            return text(
                StatusCode::REQUEST_TIMEOUT,
                "the request body took too long",
            );
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is larger than {MAX_REQUEST_BYTES} bytes"),
            );
        }
        Ok(Err(_)) => {
            return text(
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
            );
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let outcome = tokio::task::spawn_blocking(move || witness.add_checkpoint(&body)).await;
    match outcome {
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "the witness failed"),
        Ok(Ok(lines)) => {
            let mut out = Vec::new();
            for line in &lines {
                out.extend_from_slice(&line.to_bytes());
            }
            reply(StatusCode::OK, "text/plain; charset=utf-8", out)
        }
        Ok(Err(AddError::Conflict { latest, .. })) => reply(
            StatusCode::CONFLICT,
            TLOG_SIZE_CONTENT_TYPE,
            format!("{latest}\n"),
        ),
        Ok(Err(e)) => {
            let status =
                StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            text(status, e)
        }
    }
}

async fn latest(witness: Arc<Witness>, query: Option<&str>) -> Reply {
    let origin = query.and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "origin")
            .map(|(_, v)| v.into_owned())
    });
    let Some(origin) = origin.filter(|o| !o.is_empty()) else {
        return text(StatusCode::BAD_REQUEST, "missing ?origin=<log origin>");
    };
    let outcome = tokio::task::spawn_blocking(move || {
        let latest = witness.latest(&origin)?;
        let known = latest.is_some() || witness.knows(&origin)?;
        Ok::<_, super::store::StoreError>((origin, latest, known))
    })
    .await;
    match outcome {
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "the witness failed"),
        Ok(Err(e)) => text(StatusCode::INTERNAL_SERVER_ERROR, e),
        Ok(Ok((_, Some(latest), _))) => reply(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            latest.cosigned_note(),
        ),
        Ok(Ok((origin, None, true))) => text(
            StatusCode::NOT_FOUND,
            format!("no checkpoint cosigned yet for `{origin}`"),
        ),
        Ok(Ok((origin, None, false))) => text(
            StatusCode::NOT_FOUND,
            format!("unknown log origin `{origin}`"),
        ),
    }
}

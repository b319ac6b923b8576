//! One HTTP attempt on the wire: connection setup with capped internal retries, the
//! dispatch gate in the connector (DISPATCH_STARTED is durable before the first byte of
//! the request), the response read to the end, decoded, scrubbed, classified and
//! committed. Every failure is recorded as what the last proved boundary says. A target
//! with a proxy connects through [`super::tunnel`]; the rest is the same.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rustls::client::WebPkiServerVerifier;

use super::inject::Trust;
use super::status;
use super::transport::{
    self, Decoded, DispatchLayer, GateVerdict, MarkingBody, Probe, RecordingResolver,
    RecordingVerifier,
};
use super::tunnel::{self, SetupFailure, TunnelError};
use super::validate::HOP_BY_HOP;
use super::{Armed, Http, HttpOutcome, HttpResponse};
use crate::channel::guard::{self, AddressPolicy, Refusal, Resolver};
use crate::config::batch::{self, BatchContract};
use crate::contract::{Code, ConfidenceSource, MemberState, Outcome, Phase, Retry, Stage};
use crate::invocation::{Attempt, CallContext, Exchange, Gate, GateShut, Response};
use crate::journal::events::BatchResult;
use crate::journal::events::ResultFacts;
use crate::journal::{ResultToStore, Settle};

/// Connection-setup attempts per invocation attempt: a refused or reset connection
/// before dispatch is tried once more, then reported.
const MAX_SETUP_ATTEMPTS: u32 = 2;

/// Why an exchange produced no response head: reqwest's error on a direct connection,
/// the tunnel's through a proxy.
enum SendError {
    Http(reqwest::Error),
    Tunnel(TunnelError),
}

type Sending<'a> = Pin<Box<dyn Future<Output = Result<reqwest::Response, SendError>> + Send + 'a>>;

/// The request could not be put on the wire; no connection was tried.
const UNBUILDABLE: &str = "The request could not be built: a header value or the URL is not valid on the wire; nothing was sent.";

/// Runs one armed attempt up to a stored result or a recorded failure.
pub(super) async fn attempt(
    trust: &Trust,
    resolver: &Resolver,
    attempt: Attempt<'_, Http>,
    armed: Armed,
    ctx: &CallContext,
) -> HttpOutcome {
    let bound = attempt.bound();
    let p = &bound.plan;
    let https = p.http.scheme == "https";
    // The local TLS setup failed: nothing was sent.
    let tls_setup_failed = |message: String| {
        attempt.fail(
            Phase::ConnectionSetup,
            Code::TlsRejected,
            Retry::AfterCorrection,
            &message,
        )
    };
    // Validation accepted the method as an RFC 9110 token, which the HTTP stack takes.
    let Ok(method) = reqwest::Method::from_bytes(p.http.method.as_bytes()) else {
        return attempt.fail_field(
            Phase::Validation,
            Code::InvalidRequest,
            Retry::AfterCorrection,
            "The method is not a valid token.",
            "method",
        );
    };
    // The address guard. A name is checked in the resolver, on the addresses then
    // connected to; an IP literal never reaches the resolver, so it is checked here.
    let policy = AddressPolicy::for_host(&p.http.host, armed.target.allow_private);
    if let Some(ip) = guard::parse_literal(&p.http.host)
        && let Err(refusal) = policy.check(ip)
    {
        return address_refused(&attempt, 1, refusal);
    }
    // The proxy the connection goes through; attempts through it name it as their hop.
    let proxy = armed.target.proxy.via();
    let via = proxy.map(|p| p.authority());
    // One copy of the body for every connection-setup attempt (`Bytes` clones share it).
    let body = Bytes::from(p.request.body.clone());
    for n in 1..=MAX_SETUP_ATTEMPTS {
        let probe = Arc::new(Probe::default());
        let gate_error: Arc<Mutex<Option<GateShut>>> = Arc::new(Mutex::new(None));
        let gate = attempt.gate(attempt.connection_id(n));
        let hook = gate_hook(&probe, gate, gate_error.clone());
        let tls = match tls_config(trust, &probe, armed.verifier.clone()) {
            Ok(tls) => tls,
            Err(message) => return tls_setup_failed(message),
        };
        let marked = MarkingBody::new(body.clone(), probe.clone());
        let exchange: Sending<'_> = match proxy {
            None => {
                let client = match client(&probe, (resolver, policy), hook, tls) {
                    Ok(c) => c,
                    Err(message) => return tls_setup_failed(message),
                };
                let mut builder = client.request(method.clone(), &armed.url);
                for (name, value) in &armed.headers {
                    builder = builder.header(name.as_str(), value.as_str());
                }
                Box::pin(async move {
                    let sent = builder.body(reqwest::Body::wrap(marked)).send().await;
                    sent.map_err(SendError::Http)
                })
            }
            Some(proxy) => {
                let prepared = tunnel::prepare(method.clone(), &armed.url, &armed.headers, marked);
                // hyper speaks HTTP/1.1 on the tunnel; ALPN says so to the origin.
                let mut tls = tls;
                tls.alpn_protocols = vec![b"http/1.1".to_vec()];
                let tls = https.then(|| Arc::new(tls));
                let probe = probe.clone();
                Box::pin(async move {
                    let sent = match prepared {
                        Ok(prepared) => {
                            tunnel::send(proxy, resolver, prepared, tls, &probe, &hook).await
                        }
                        Err(e) => Err(e),
                    };
                    sent.map_err(SendError::Tunnel)
                })
            }
        };
        let deadline = tokio::time::sleep(bound.timeout);
        tokio::pin!(deadline);
        let sent = tokio::select! {
            r = exchange => Ok(r),
            () = &mut deadline => Err(Code::RemoteTimeout),
            () = ctx.cancel.cancelled() => Err(Code::CallerCancelled),
        };
        let dispatched = probe.gate() == Some(GateVerdict::Dispatched);
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                if dispatched {
                    mark_request(&attempt, &probe);
                    let message = match &via {
                        Some(hop) => format!("The connection through the proxy {hop} failed after dispatch and before a complete response; the remote may have acted."),
                        None => "The connection failed after dispatch and before a complete response; the remote may have acted.".to_string(),
                    };
                    return attempt.fail(
                        Phase::RemoteExecution,
                        Code::RemoteOutcomeUnknown,
                        Retry::Reconcile,
                        &message,
                    );
                }
                if probe.gate() == Some(GateVerdict::Refused) {
                    return match gate_error.lock().ok().and_then(|mut g| g.take()) {
                        Some(GateShut::Refused(e)) => attempt.stopped(e),
                        Some(GateShut::Interrupted) | None => attempt.recorded(),
                    };
                }
                // The HTTP stack refused to build the request (a header value or the
                // URL it cannot put on the wire): no connection was tried, and waiting
                // will not change the request.
                let unbuildable = match &error {
                    SendError::Http(e) => e.is_builder(),
                    SendError::Tunnel(e) => matches!(e, TunnelError::InvalidRequest),
                };
                if unbuildable {
                    return attempt.fail(
                        Phase::Validation,
                        Code::InvalidRequest,
                        Retry::AfterCorrection,
                        UNBUILDABLE,
                    );
                }
                let failure = match &error {
                    SendError::Http(error) => {
                        if let Some(refusal) = probe.refused() {
                            return address_refused(&attempt, n, refusal);
                        }
                        direct_failure(&probe, https, error)
                    }
                    SendError::Tunnel(e) => {
                        match proxy.and_then(|proxy| e.setup_failure(proxy, &probe)) {
                            Some(failure) => failure,
                            // A shut gate is handled above, and an exchange failure
                            // comes only after dispatch.
                            None => return attempt.recorded(),
                        }
                    }
                };
                let SetupFailure {
                    stage,
                    code,
                    retry,
                    message,
                } = failure;
                if let Err(outcome) = attempt.setup_stage_failed_via(n, stage, code, via.clone()) {
                    return *outcome;
                }
                if retry == Retry::Backoff && n < MAX_SETUP_ATTEMPTS {
                    continue;
                }
                return attempt.fail(Phase::ConnectionSetup, code, retry, &message);
            }
            Err(code) => {
                if dispatched {
                    mark_request(&attempt, &probe);
                    let message = if code == Code::CallerCancelled {
                        "The caller cancelled after dispatch; the remote may still be running."
                    } else {
                        "No complete response arrived in time after dispatch; the remote may still be running."
                    };
                    return attempt.fail(Phase::RemoteExecution, code, Retry::Reconcile, message);
                }
                let (stage, setup_code) = if code == Code::RemoteTimeout {
                    let stage = if proxy.is_some() && !(probe.tunnel_open() && https) {
                        // Before the tunnel opened (or, for plain http, before dispatch
                        // through it) the proxy is the hop that did not finish.
                        Stage::ProxyTunnel
                    } else if probe.tls().is_some() || (probe.connected() && https) {
                        Stage::TlsHandshake
                    } else if probe.dns().is_none()
                        && p.http.host.parse::<std::net::IpAddr>().is_err()
                    {
                        Stage::Dns
                    } else {
                        Stage::TcpConnect
                    };
                    (stage, Code::ConnectTimeout)
                } else {
                    (Stage::TcpConnect, Code::CallerCancelled)
                };
                if setup_code == Code::ConnectTimeout {
                    let _ = attempt.setup_stage_failed_via(n, stage, setup_code, via.clone());
                }
                let message = if setup_code == Code::CallerCancelled {
                    "The caller cancelled before dispatch; nothing was sent."
                } else {
                    "Connection setup did not finish in time; nothing was sent."
                };
                return attempt.fail(Phase::ConnectionSetup, setup_code, Retry::Backoff, message);
            }
        };
        return read_response(&attempt, &armed, response, &probe, ctx).await;
    }
    attempt.recorded()
}

/// The guard refused the address: recorded as the `address_guard` stage; no connection
/// was made.
fn address_refused(attempt: &Attempt<'_, Http>, n: u32, refusal: Refusal) -> HttpOutcome {
    if let Err(outcome) = attempt.setup_stage_failed(n, Stage::AddressGuard, Code::AddressRefused) {
        return *outcome;
    }
    attempt.fail(
        Phase::ConnectionSetup,
        Code::AddressRefused,
        Retry::AfterCorrection,
        &refusal.message(),
    )
}

/// How a direct connection failed before dispatch, judged from what the probe observed.
fn direct_failure(probe: &Probe, https: bool, error: &reqwest::Error) -> SetupFailure {
    let facts = transport::error_chain_facts(error);
    let (stage, code) =
        probe.setup_failure(https, facts.io_kind, facts.tls, facts.out_of_descriptors);
    let reason = match probe.tls() {
        Some(transport::TlsVerdict::Rejected { reason }) => format!(" (certificate {reason})"),
        _ => String::new(),
    };
    SetupFailure {
        stage,
        code,
        retry: code.spec().retry,
        message: format!("{}{reason}", code.spec().meaning),
    }
}

/// Markers of how far the request got, before a failure after dispatch is recorded.
fn mark_request(attempt: &Attempt<'_, Http>, probe: &Probe) {
    attempt.mark(probe.headers_taken(), probe.body_taken(), None);
}

/// The gate hook of one connection: opens `gate` naming the verified peer, and keeps
/// why it stayed shut in `gate_error`.
fn gate_hook(
    probe: &Arc<Probe>,
    gate: Gate,
    gate_error: Arc<Mutex<Option<GateShut>>>,
) -> transport::Gate {
    let gate_probe = probe.clone();
    Arc::new(move || {
        let gate = gate.clone();
        let gate_error = gate_error.clone();
        let probe = gate_probe.clone();
        Box::pin(async move {
            let peer = match probe.tls() {
                Some(transport::TlsVerdict::Verified { peer }) => Some(peer),
                _ => None,
            };
            match gate.open(peer).await {
                Ok(()) => true,
                Err(shut) => {
                    if let Ok(mut slot) = gate_error.lock() {
                        *slot = Some(shut);
                    }
                    false
                }
            }
        })
    })
}

/// A one-connection client whose connector opens the gate (`hook`) before the first
/// byte.
fn client(
    probe: &Arc<Probe>,
    (resolver, policy): (&Resolver, AddressPolicy),
    hook: transport::Gate,
    tls: rustls::ClientConfig,
) -> Result<reqwest::Client, String> {
    let builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .retry(reqwest::retry::never())
        .no_proxy()
        .pool_max_idle_per_host(0)
        .http1_only()
        .dns_resolver(Arc::new(RecordingResolver {
            probe: probe.clone(),
            resolver: resolver.clone(),
            policy,
        }))
        .connector_layer(DispatchLayer {
            probe: probe.clone(),
            gate: hook,
        });
    // Always hand reqwest a prepared TLS config: building its default one loads the
    // platform's roots on every client (milliseconds per request).
    builder
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| format!("HTTP client setup: {e}"))
}

/// The TLS config of one attempt: the target's trust through a verifier that records its
/// verdict in `probe`.
fn tls_config(
    trust: &Trust,
    probe: &Arc<Probe>,
    verifier: Option<Arc<WebPkiServerVerifier>>,
) -> Result<rustls::ClientConfig, String> {
    let base = rustls::ClientConfig::builder_with_provider(trust.provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let tls = match verifier {
        Some(inner) => base
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(RecordingVerifier {
                inner,
                probe: probe.clone(),
            }))
            .with_no_client_auth(),
        // Plain http (loopback only): TLS is never used, so trust nothing.
        None => base
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    };
    Ok(tls)
}

/// Reads a final response to the end (bounded by size and time), decodes and scrubs it,
/// classifies it and commits it as the settled result.
async fn read_response(
    attempt: &Attempt<'_, Http>,
    armed: &Armed,
    mut response: reqwest::Response,
    probe: &Probe,
    ctx: &CallContext,
) -> HttpOutcome {
    let bound = attempt.bound();
    let redactor = &armed.redactor;
    let status = response.status().as_u16();
    // Recorded in the journal as it arrives: scrubbed like every other header.
    let request_id = header(&response, "x-request-id").map(|v| redactor.scrub_str(&v).0);
    // On the success path the markers go in with the result, in one transaction; a
    // failure while the body arrives records them first.
    let head = || {
        attempt.mark(
            probe.headers_taken(),
            probe.body_taken(),
            Some(Response {
                status: Some(status),
                remote_request_id: request_id.clone(),
            }),
        );
    };
    // What arrived is not a result: recorded as incomplete, never returned.
    let incomplete = |message: String| {
        head();
        attempt.fail(
            Phase::RemoteExecution,
            Code::RemoteResultIncomplete,
            Retry::Reconcile,
            &message,
        )
    };
    let limit = armed.target.max_response_bytes;
    let mut body: Vec<u8> = Vec::new();
    let deadline = tokio::time::sleep(bound.timeout);
    tokio::pin!(deadline);
    loop {
        let chunk = tokio::select! {
            c = response.chunk() => c,
            () = &mut deadline => {
                head();
                return attempt.fail(Phase::RemoteExecution, Code::RemoteTimeout, Retry::Reconcile,
                    "The response body did not complete in time; what arrived is not a result.");
            }
            () = ctx.cancel.cancelled() => {
                head();
                return attempt.fail(Phase::RemoteExecution, Code::CallerCancelled, Retry::Reconcile,
                    "The caller cancelled while the response was arriving; what arrived is not a result.");
            }
        };
        match chunk {
            Ok(Some(bytes)) => {
                if (body.len() + bytes.len()) as u64 > limit {
                    let message = format!(
                        "The response exceeded this target's limit of {limit} bytes; it is not returned as a result."
                    );
                    return incomplete(message);
                }
                body.extend_from_slice(&bytes);
            }
            Ok(None) => break,
            Err(_) => {
                // Framing failed (short Content-Length, broken chunking, early close):
                // the partial body is discarded, never returned as a result.
                let message = format!(
                    "The response broke off after {} body bytes; a partial body is not a result.",
                    body.len()
                );
                return incomplete(message);
            }
        }
    }
    let digest = format!("blake3:{}", blake3::hash(&body).to_hex());
    // Whatever still arrives encoded is decoded (bounded) before it is scrubbed, or
    // withheld: nothing the broker cannot scrub is returned or stored.
    let codings = transport::codings(response.headers());
    let recoded = !codings.is_empty();
    let (body, decoded_from, body_withheld) = match transport::decode_body(&codings, body, limit) {
        Decoded::Plain(body) => (body, None, None),
        Decoded::Decoded { body, from } => (body, Some(from), None),
        Decoded::Withheld(reason) => (Vec::new(), None, Some(reason)),
        Decoded::TooLarge => {
            let message = format!(
                "The response decoded to more than this target's limit of {limit} bytes; it is not returned as a result."
            );
            return incomplete(message);
        }
    };
    let mut redactions = 0u32;
    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in response.headers() {
        let name = name.as_str().to_string();
        if HOP_BY_HOP.contains(&name.as_str()) {
            continue;
        }
        // They described the encoded body; the decoded one gets its own length.
        if recoded && matches!(name.as_str(), "content-encoding" | "content-length") {
            continue;
        }
        let (value, n) = redactor.scrub_str(&String::from_utf8_lossy(value.as_bytes()));
        redactions = redactions.saturating_add(n);
        headers.push((name, value));
    }
    let (body, n) = redactor.scrub(&body);
    redactions = redactions.saturating_add(n);
    // The length of what is returned: the decoded body, or one the scrubber changed.
    if (recoded && body_withheld.is_none()) || n > 0 {
        headers.retain(|(name, _)| name != "content-length");
        headers.push(("content-length".into(), body.len().to_string()));
    }
    let retry_after = header(&response, "retry-after");
    let not_before_ms = retry_after
        .as_deref()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map(|secs| attempt.now_ms().saturating_add(secs.saturating_mul(1000)));
    let settlement = status::classify(status, bound.plan.repeat, retry_after.is_some());
    let (settlement, batch) = match &bound.plan.batch_members {
        Some(members) => {
            let (s, b) = settle_batch(
                armed.target.batch.as_ref(),
                members,
                status,
                settlement,
                &headers,
                &body,
            );
            (s, Some(b))
        }
        None => (settlement, None),
    };
    let location = header(&response, "location").map(|l| redactor.scrub_str(&l).0);
    let facts = ResultFacts {
        http_status: Some(status),
        remote_request_id: request_id.clone(),
        status_resource: if status == 202 {
            location.clone()
        } else {
            None
        },
        redirect_location: if (300..400).contains(&status) {
            location
        } else {
            None
        },
        not_before_ms,
        batch,
        ..Default::default()
    };
    let mut meta = serde_json::json!({ "status": status, "headers": headers });
    if let Some(from) = &decoded_from {
        meta["decoded_from"] = serde_json::Value::String(from.clone());
    }
    if let Some(reason) = &body_withheld {
        meta["body_withheld"] = serde_json::to_value(reason).unwrap_or_default();
        meta["body_withheld"]["message"] = serde_json::Value::String(reason.message());
    }
    let stored = ResultToStore {
        meta,
        streams: vec![("body".to_string(), body.clone())],
    };
    let settle = Settle {
        outcome: settlement.outcome,
        code: settlement.code,
        retry: settlement.retry,
        facts,
        confidence: ConfidenceSource::RemoteResponse,
        redactions,
    };
    let exchange = Exchange::http(
        probe.headers_taken(),
        probe.body_taken(),
        status,
        request_id,
        digest,
    );
    let response = HttpResponse {
        status,
        headers,
        body,
        decoded_from,
        body_withheld,
    };
    attempt
        .commit(exchange, stored, settle, Some(response))
        .await
}

/// A complete response to a batch, member by member. A 2xx body is read through the
/// contract (an atomic batch without the partial signature applied every member); a
/// refusal refused every member; any other answer leaves every member unknown, to be
/// reconciled one by one. A batch whose members did not all settle alike is
/// BATCH_PARTIAL: committed as a whole, never to be resent as a whole.
fn settle_batch(
    contract: Option<&BatchContract>,
    members: &[String],
    status: u16,
    whole: status::Settlement,
    headers: &[(String, String)],
    body: &[u8],
) -> (status::Settlement, BatchResult) {
    let state = |id: &String, outcome: Outcome, reported: Option<String>| MemberState {
        id: id.clone(),
        outcome,
        status: reported,
        settled_by: (outcome != Outcome::Unknown).then_some(ConfidenceSource::RemoteResponse),
    };
    let all = |outcome: Outcome| members.iter().map(|id| state(id, outcome, None)).collect();
    let Some(contract) = contract.filter(|_| (200..300).contains(&status)) else {
        let outcome = if whole.outcome == Outcome::Rejected {
            Outcome::Rejected
        } else {
            Outcome::Unknown
        };
        return (
            whole,
            BatchResult {
                members: all(outcome),
                partial_signature: false,
            },
        );
    };
    let (outcomes, partial_signature) = contract.assess(members, headers, body);
    if contract.atomic && !partial_signature {
        return (
            whole,
            BatchResult {
                members: all(Outcome::Committed),
                partial_signature,
            },
        );
    }
    let (overall, partial) = batch::overall(&outcomes);
    let members = outcomes
        .into_iter()
        .map(|m| state(&m.id, m.outcome, m.status))
        .collect();
    let settlement = if partial {
        status::Settlement {
            outcome: Outcome::Committed,
            code: Some(Code::BatchPartial),
            retry: Retry::Never,
        }
    } else if overall == Outcome::Rejected {
        status::Settlement {
            outcome: Outcome::Rejected,
            code: Some(Code::RemoteRejected),
            retry: Retry::AfterCorrection,
        }
    } else {
        whole
    };
    (
        settlement,
        BatchResult {
            members,
            partial_signature,
        },
    )
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

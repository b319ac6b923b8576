//! The bad-input matrix: the real `postern mcp` (with a real `postern daemon` behind it,
//! and with no broker at all) is fed every kind of malformed line an agent could write.
//! For each the bridge answers as JSON-RPC 2.0 says (or stays silent for notifications),
//! within a bound, never exits, and a valid request right after it succeeds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use postern_tests::adversary::{Adversary, Behavior};
use support::{Bridge, start_daemon_with, target};

/// How long one case may take to be answered.
const BOUND: Duration = Duration::from_secs(10);

/// What the bridge must say to one input.
#[derive(Debug)]
enum Expect {
    /// A JSON-RPC error with one of `codes`, for `id` (null when the id is unreadable),
    /// whose message mentions `mentions` (if given).
    Error {
        codes: &'static [i64],
        id: Value,
        mentions: Option<&'static str>,
    },
    /// No reply at all (notifications and responses are never answered).
    Silent,
    /// One array reply: an Invalid Request error per request element, these ids in order.
    Batch(Vec<Value>),
    /// A success result for `id`.
    Success(Value),
    /// An error for `id`, or a tool result with isError true; never a success.
    Rejected(Value),
}

struct Case {
    name: &'static str,
    input: Vec<u8>,
    expect: Expect,
}

fn error(codes: &'static [i64], id: Value) -> Expect {
    Expect::Error {
        codes,
        id,
        mentions: None,
    }
}

fn line(value: &Value) -> Vec<u8> {
    value.to_string().into_bytes()
}

fn tool_call(id: i64, arguments: Value) -> Vec<u8> {
    line(&json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "http_request", "arguments": arguments}
    }))
}

const PARSE: &[i64] = &[-32700];
const INVALID_REQUEST: &[i64] = &[-32600];
const PARSE_OR_INVALID: &[i64] = &[-32700, -32600];
const INVALID_PARAMS: &[i64] = &[-32602];

/// The matrix. `ok_url` answers 200; `stall_url` never answers; `broker` says whether a
/// daemon is behind the bridge (without one, tool arguments are not validated: every
/// known tool answers BROKER_UNAVAILABLE with isError).
fn cases(ok_url: &str, stall_url: &str, broker: bool) -> Vec<Case> {
    let deep_arrays = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_objects = format!("{}1{}", "{\"a\":".repeat(100_000), "}".repeat(100_000));
    // A well-formed request, longer than the 16 MiB line limit.
    let huge = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(17 * 1024 * 1024)
    );
    let long_id = "i".repeat(64 * 1024);
    let bad_arguments = |id: i64| {
        if broker {
            error(INVALID_PARAMS, json!(id))
        } else {
            Expect::Rejected(json!(id))
        }
    };
    vec![
        Case {
            name: "invalid UTF-8",
            input: b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"\xff\xfe\"}"
                .to_vec(),
            expect: error(PARSE, Value::Null),
        },
        Case {
            name: "a lone continuation byte",
            input: b"\x80".to_vec(),
            expect: error(PARSE, Value::Null),
        },
        Case {
            name: "NUL bytes",
            input: b"\0\0{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\0".to_vec(),
            expect: error(PARSE, Value::Null),
        },
        Case {
            name: "an empty line",
            input: Vec::new(),
            expect: Expect::Silent,
        },
        Case {
            name: "a whitespace line",
            input: b" \t  \t".to_vec(),
            expect: Expect::Silent,
        },
        Case {
            name: "truncated JSON",
            input: b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/li".to_vec(),
            expect: error(PARSE, Value::Null),
        },
        Case {
            name: "trailing garbage after a valid object",
            input: b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\"} trailing".to_vec(),
            expect: error(PARSE, Value::Null),
        },
        Case {
            name: "100k-deep arrays",
            input: deep_arrays.into_bytes(),
            expect: error(PARSE_OR_INVALID, Value::Null),
        },
        Case {
            name: "100k-deep objects",
            input: deep_objects.into_bytes(),
            expect: error(PARSE_OR_INVALID, Value::Null),
        },
        Case {
            name: "a 17 MiB line",
            input: huge.into_bytes(),
            // Answered to its request (issue 26, item 9): the id is at the line's start.
            expect: Expect::Error {
                codes: PARSE_OR_INVALID,
                id: json!(99),
                mentions: Some("16 MiB"),
            },
        },
        Case {
            name: "a number at top level",
            input: b"42".to_vec(),
            expect: error(INVALID_REQUEST, Value::Null),
        },
        Case {
            name: "a string at top level",
            input: b"\"tools/list\"".to_vec(),
            expect: error(INVALID_REQUEST, Value::Null),
        },
        Case {
            name: "null at top level",
            input: b"null".to_vec(),
            expect: error(INVALID_REQUEST, Value::Null),
        },
        Case {
            name: "an array of scalars at top level",
            input: b"[1,2]".to_vec(),
            expect: Expect::Batch(vec![Value::Null, Value::Null]),
        },
        Case {
            name: "an empty batch",
            input: b"[]".to_vec(),
            expect: error(INVALID_REQUEST, Value::Null),
        },
        Case {
            name: "a batch",
            input: line(&json!([
                {"jsonrpc": "2.0", "id": 5, "method": "ping"},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": "b", "method": "tools/list"}
            ])),
            expect: Expect::Batch(vec![json!(5), json!("b")]),
        },
        Case {
            name: "a request with a non-string method",
            input: line(&json!({"jsonrpc": "2.0", "id": 6, "method": 6})),
            expect: error(INVALID_REQUEST, json!(6)),
        },
        Case {
            name: "a request without jsonrpc 2.0",
            input: line(&json!({"jsonrpc": "1.0", "id": 7, "method": "ping"})),
            expect: error(INVALID_REQUEST, json!(7)),
        },
        Case {
            name: "a request with array params",
            input: line(&json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": [1]})),
            expect: error(INVALID_REQUEST, json!(8)),
        },
        Case {
            name: "an object that is neither request nor response",
            input: line(&json!({"jsonrpc": "2.0", "id": 9})),
            expect: error(INVALID_REQUEST, json!(9)),
        },
        Case {
            name: "a null id",
            input: line(&json!({"jsonrpc": "2.0", "id": null, "method": "ping"})),
            expect: error(INVALID_REQUEST, Value::Null),
        },
        Case {
            name: "a huge numeric id",
            input:
                b"{\"jsonrpc\":\"2.0\",\"id\":123456789012345678901234567890,\"method\":\"ping\"}"
                    .to_vec(),
            expect: error(INVALID_REQUEST, Value::Null),
        },
        Case {
            name: "a 64 KiB string id",
            input: line(&json!({"jsonrpc": "2.0", "id": long_id, "method": "ping"})),
            expect: Expect::Success(json!(long_id)),
        },
        Case {
            name: "an unknown method",
            input: line(&json!({"jsonrpc": "2.0", "id": 10, "method": "secrets/reveal"})),
            expect: error(&[-32601], json!(10)),
        },
        Case {
            name: "a known method with malformed params",
            input: line(
                &json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": 5}}),
            ),
            expect: error(INVALID_PARAMS, json!(11)),
        },
        Case {
            name: "a notification with bad params",
            input: line(&json!({
                "jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": {"not": "an id"}}
            })),
            expect: Expect::Silent,
        },
        Case {
            name: "a notification with non-object params",
            input: line(
                &json!({"jsonrpc": "2.0", "method": "notifications/initialized", "params": "x"}),
            ),
            expect: Expect::Silent,
        },
        Case {
            name: "a forged delivery acknowledgement",
            input: line(&json!({
                "jsonrpc": "2.0", "method": "notifications/postern/delivered", "params": {"id": 1}
            })),
            expect: Expect::Silent,
        },
        Case {
            name: "a response to nothing",
            input: line(&json!({"jsonrpc": "2.0", "id": 12, "result": {}})),
            expect: Expect::Silent,
        },
        Case {
            name: "tools/call with an unknown tool",
            input: line(&json!({
                "jsonrpc": "2.0", "id": 13, "method": "tools/call",
                "params": {"name": "reveal_secret", "arguments": {}}
            })),
            expect: error(INVALID_PARAMS, json!(13)),
        },
        Case {
            name: "tools/call with extra argument fields",
            input: tool_call(14, json!({"url": ok_url, "method": "GET", "approve": true})),
            expect: bad_arguments(14),
        },
        Case {
            name: "tools/call with timeout_ms 0",
            input: tool_call(
                15,
                json!({"url": stall_url, "method": "GET", "timeout_ms": 0}),
            ),
            expect: Expect::Rejected(json!(15)),
        },
        Case {
            name: "tools/call with timeout_ms -1",
            input: tool_call(
                16,
                json!({"url": ok_url, "method": "GET", "timeout_ms": -1}),
            ),
            expect: bad_arguments(16),
        },
        Case {
            name: "tools/call with timeout_ms 1e30",
            input: tool_call(
                17,
                json!({"url": ok_url, "method": "GET", "timeout_ms": 1e30}),
            ),
            expect: bad_arguments(17),
        },
        Case {
            name: "tools/call with timeout_ms \"5\"",
            input: tool_call(
                18,
                json!({"url": ok_url, "method": "GET", "timeout_ms": "5"}),
            ),
            expect: bad_arguments(18),
        },
        Case {
            name: "CRLF line ending",
            input: b"{\"jsonrpc\":\"2.0\",\"id\":19,\"method\":\"ping\"}\r".to_vec(),
            expect: Expect::Success(json!(19)),
        },
        Case {
            name: "a byte-order mark",
            input: b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":20,\"method\":\"ping\"}".to_vec(),
            expect: Expect::Success(json!(20)),
        },
    ]
}

/// Whether `reply` is what `expect` asks for; `Err` says why not.
fn judge(expect: &Expect, replies: &[Value]) -> Result<(), String> {
    let one = || match replies {
        [reply] => Ok(reply),
        _ => Err(format!("expected one reply, got {replies:?}")),
    };
    match expect {
        Expect::Silent if replies.is_empty() => Ok(()),
        Expect::Silent => Err(format!("expected silence, got {replies:?}")),
        Expect::Error {
            codes,
            id,
            mentions,
        } => {
            let reply = one()?;
            let code = reply["error"]["code"].as_i64().unwrap_or(0);
            let message = reply["error"]["message"].as_str().unwrap_or("");
            if reply["jsonrpc"] != "2.0" || &reply["id"] != id || !codes.contains(&code) {
                return Err(format!("expected error {codes:?} for id {id}, got {reply}"));
            }
            if mentions.is_some_and(|m| !message.contains(m)) {
                return Err(format!(
                    "the message does not mention {mentions:?}: {message}"
                ));
            }
            Ok(())
        }
        Expect::Batch(ids) => {
            let reply = one()?;
            let Some(items) = reply.as_array() else {
                return Err(format!("expected an array reply, got {reply}"));
            };
            let got: Vec<&Value> = items.iter().map(|r| &r["id"]).collect();
            let all_invalid = items.iter().all(|r| r["error"]["code"] == -32600);
            if got != ids.iter().collect::<Vec<_>>() || !all_invalid {
                return Err(format!(
                    "expected Invalid Request for ids {ids:?}, got {reply}"
                ));
            }
            Ok(())
        }
        Expect::Success(id) => {
            let reply = one()?;
            if &reply["id"] == id && reply.get("result").is_some() {
                Ok(())
            } else {
                Err(format!("expected a result for id {id}, got {reply}"))
            }
        }
        Expect::Rejected(id) => {
            let reply = one()?;
            let rejected = reply.get("error").is_some() || reply["result"]["isError"] == true;
            if &reply["id"] == id && rejected {
                Ok(())
            } else {
                Err(format!("expected a rejection for id {id}, got {reply}"))
            }
        }
    }
}

/// Ids a case's replies carry (the ones the harness waits for besides the probe).
fn awaited(expect: &Expect) -> Option<Value> {
    match expect {
        Expect::Success(id) | Expect::Rejected(id) => Some(id.clone()),
        Expect::Error { id, .. } if !id.is_null() => Some(id.clone()),
        _ => None,
    }
}

fn fresh_bridge(socket: &std::path::Path) -> Bridge {
    let mut bridge = Bridge::spawn(socket);
    bridge.initialize();
    bridge
}

/// Runs every case through one bridge (a fresh one if a case killed it), then one real
/// call; returns (cases, answered as expected, failures).
fn run_matrix(socket: &std::path::Path, cases: Vec<Case>, label: &str) -> Vec<String> {
    let mut bridge = fresh_bridge(socket);
    let mut failures = Vec::new();
    let total = cases.len();
    for (n, case) in cases.into_iter().enumerate() {
        let started = Instant::now();
        let probe = json!(format!("probe-{n}"));
        let mut input = case.input.clone();
        input.push(b'\n');
        let sent = bridge.send(&input)
            && bridge.send_json(&json!({"jsonrpc": "2.0", "id": probe, "method": "ping"}));
        // Everything up to the probe's answer, and the case's own (by id) if it comes later.
        let (mut replies, probe_reply) = bridge.recv_until_id(&probe, BOUND);
        if let Some(id) = awaited(&case.expect)
            && !replies.iter().any(|r| r["id"] == id)
        {
            let left = BOUND.saturating_sub(started.elapsed());
            let (more, reply) = bridge.recv_until_id(&id, left);
            replies.extend(more);
            replies.extend(reply);
        }
        let verdict = if !sent {
            Err("the bridge stopped reading its stdin".to_string())
        } else if probe_reply
            .as_ref()
            .is_none_or(|r| r.get("result").is_none())
        {
            Err(format!(
                "the valid request after it got {probe_reply:?} within {BOUND:?} (replies {replies:?})"
            ))
        } else if !bridge.alive() {
            Err("the bridge exited".to_string())
        } else {
            judge(&case.expect, &replies)
        };
        if let Err(why) = verdict {
            failures.push(format!("{label}: {}: {why}", case.name));
            if !bridge.alive() || !sent {
                bridge = fresh_bridge(socket);
            }
        }
    }
    let answered = total - failures.len();
    println!("bridge bad-input matrix ({label}): {total} cases, {answered} answered as expected");
    for failure in &failures {
        println!("  FAILED {failure}");
    }
    failures
}

// Regression: issue 10
#[test]
fn every_bad_input_is_answered_and_the_session_keeps_serving_with_a_broker() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ok = runtime
        .block_on(Adversary::start(Behavior::ok_json("{\"ok\":true}")))
        .unwrap();
    let stall = runtime.block_on(Adversary::start(Behavior::Stall)).unwrap();
    // Two targets: `api` answers, `slow` never does (so a 0 ms timeout cannot pass as
    // a success by luck).
    let config = format!(
        "{}{}",
        target("api", &ok.base_url()),
        target("slow", &stall.base_url())
    );
    let daemon = start_daemon_with(&config, None);
    let cases = cases(&ok.url("/v1/ok"), &stall.url("/v1/stall"), true);
    let failures = run_matrix(&daemon.socket, cases, "broker");

    // And a real call still goes through on a new session.
    let mut bridge = fresh_bridge(&daemon.socket);
    assert!(bridge.send(&tool_call(
        1000,
        json!({"url": ok.url("/v1/after"), "method": "GET"})
    )));
    bridge.send(b"\n");
    let (_, reply) = bridge.recv_until_id(&json!(1000), BOUND);
    let reply = reply.expect("the call after the matrix is answered");
    assert_eq!(
        reply["result"]["structuredContent"]["outcome"], "committed",
        "{reply}"
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

// Regression: issue 10
#[test]
fn every_bad_input_is_answered_and_the_session_keeps_serving_with_no_broker() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nothing.sock");
    let cases = cases(
        "http://127.0.0.1:9/v1/ok",
        "http://127.0.0.1:9/v1/stall",
        false,
    );
    let failures = run_matrix(&socket, cases, "no broker");
    assert!(failures.is_empty(), "{failures:#?}");
}

// Regression: issue 10
#[test]
fn deep_nesting_sent_straight_to_the_socket_does_not_take_the_daemon_down() {
    use std::io::{BufRead, Write};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ok = runtime
        .block_on(Adversary::start(Behavior::ok_json("{\"ok\":true}")))
        .unwrap();
    let daemon = start_daemon_with(&target("api", &ok.base_url()), None);
    // A client that skips the bridge: the daemon's own input guard is all there is.
    let mut raw = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    raw.set_read_timeout(Some(BOUND)).unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}});
    writeln!(raw, "{init}").unwrap();
    writeln!(raw, "{}{}", "[".repeat(100_000), "]".repeat(100_000)).unwrap();
    writeln!(raw, "{}1{}", "{\"a\":".repeat(100_000), "}".repeat(100_000)).unwrap();
    writeln!(
        raw,
        "{}",
        json!({"jsonrpc": "2.0", "id": "after", "method": "ping"})
    )
    .unwrap();
    let mut reader = std::io::BufReader::new(raw.try_clone().unwrap());
    let mut answered = false;
    for _ in 0..4 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let value: Value = serde_json::from_str(&line).unwrap();
        if value["id"] == "after" {
            answered = value.get("result").is_some();
            break;
        }
    }
    assert!(
        answered,
        "the same connection still answers after the deep lines"
    );
    drop(reader);
    drop(raw);

    let mut bridge = fresh_bridge(&daemon.socket);
    assert!(bridge.send(&tool_call(
        1,
        json!({"url": ok.url("/v1/after"), "method": "GET"})
    )));
    bridge.send(b"\n");
    let (_, reply) = bridge.recv_until_id(&json!(1), BOUND);
    let reply = reply.expect("the daemon still serves new sessions");
    assert_eq!(
        reply["result"]["structuredContent"]["outcome"], "committed",
        "{reply}"
    );
}

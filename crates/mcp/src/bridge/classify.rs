//! What reaches the broker: each line from the agent is forwarded as it came, answered
//! here with a JSON-RPC error, dropped (a malformed notification or response) or skipped
//! (framing noise); see the module docs of [`crate::bridge`].

use rmcp::model::{
    CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, InitializeRequestParams,
    JsonRpcMessage, RequestId,
};
use serde_json::{Map, Value, json};

use crate::input::{MAX_DEPTH, MAX_LINE, nesting_exceeds};
use crate::server::DELIVERED;

pub(super) const PARSE_ERROR: i64 = -32700;
pub(super) const INVALID_REQUEST: i64 = -32600;
pub(super) const INVALID_PARAMS: i64 = -32602;
pub(super) const INTERNAL_ERROR: i64 = -32603;

const UTF8_BOM: &[u8] = b"\xef\xbb\xbf";

/// A JSON-RPC error response.
pub(super) fn error_reply(id: Option<&RequestId>, code: i64, message: impl Into<String>) -> Value {
    let id = id
        .and_then(|id| serde_json::to_value(id).ok())
        .unwrap_or(Value::Null);
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

pub(super) fn too_long(id: Option<&RequestId>) -> Value {
    error_reply(
        id,
        INVALID_REQUEST,
        format!(
            "Invalid Request: the message is longer than the line limit of {MAX_LINE} bytes \
             (16 MiB); it was discarded"
        ),
    )
}

/// A JSON-RPC id as MCP accepts it (a string, or an integer that fits i64), parsed the way
/// the broker's MCP layer parses it.
pub(super) fn request_id(value: &Value) -> Option<RequestId> {
    serde_json::from_value(value.clone()).ok()
}

/// The key an id is tracked under: its canonical JSON (`1.0` and `1` are the same id).
pub(super) fn id_key(id: &RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

/// What the bridge does with one line from the agent.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// A blank line: framing noise, ignored.
    Skip,
    /// Well-formed JSON-RPC: relayed to the broker as it came (without CR or BOM).
    Forward { text: String, kind: Kind },
    /// Answered by the bridge itself.
    Reply(Value),
    /// A malformed notification or response: JSON-RPC forbids answering it; logged.
    Drop(String),
}

/// The kind of a forwarded message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Request {
        id: RequestId,
        method: String,
    },
    /// `cancels`: the request a notifications/cancelled gives up on.
    Notification {
        cancels: Option<RequestId>,
    },
    Response,
}

/// Decides what happens to one line from the agent (see the module docs).
pub(crate) fn classify(line: &[u8]) -> Verdict {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
        return Verdict::Skip;
    }
    let text = match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(e) => {
            return Verdict::Reply(error_reply(
                None,
                PARSE_ERROR,
                format!(
                    "Parse error: the message is not valid UTF-8 (invalid byte at offset {})",
                    e.valid_up_to()
                ),
            ));
        }
    };
    if nesting_exceeds(line, MAX_DEPTH) {
        return Verdict::Reply(error_reply(
            None,
            PARSE_ERROR,
            format!(
                "Parse error: the message nests arrays or objects deeper than {MAX_DEPTH} levels"
            ),
        ));
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            return Verdict::Reply(error_reply(None, PARSE_ERROR, format!("Parse error: {e}")));
        }
    };
    match value {
        Value::Object(map) => classify_object(text, &map),
        Value::Array(items) if items.is_empty() => Verdict::Reply(error_reply(
            None,
            INVALID_REQUEST,
            "Invalid Request: an empty batch",
        )),
        Value::Array(items) => classify_batch(&items),
        other => Verdict::Reply(error_reply(
            None,
            INVALID_REQUEST,
            format!(
                "Invalid Request: a JSON-RPC message is an object, not {}",
                json_kind(&other)
            ),
        )),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn classify_object(text: &str, map: &Map<String, Value>) -> Verdict {
    let id_field = map.get("id");
    let id = id_field.and_then(request_id);
    let reject = |message: &str| {
        Verdict::Reply(error_reply(
            id.as_ref(),
            INVALID_REQUEST,
            format!("Invalid Request: {message}"),
        ))
    };
    if map.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return reject("\"jsonrpc\" must be \"2.0\"");
    }
    let method = match map.get("method") {
        Some(Value::String(method)) => method,
        Some(_) => return reject("\"method\" must be a string"),
        None => return classify_response(text, map, id_field.is_some(), reject),
    };
    if id_field.is_some() && id.is_none() {
        return Verdict::Reply(error_reply(
            None,
            INVALID_REQUEST,
            "Invalid Request: \"id\" must be a string or an integer that fits in 64 bits",
        ));
    }
    let params_object = map.get("params").is_none_or(Value::is_object);
    let Some(id) = id.clone() else {
        // A notification: never answered.
        if method == DELIVERED {
            return Verdict::Drop(format!("{DELIVERED}: only the bridge reports delivery"));
        }
        if !params_object {
            return Verdict::Drop(format!("notification {method}: params must be an object"));
        }
        return match serde_json::from_str::<ClientJsonRpcMessage>(text) {
            Ok(_) => Verdict::Forward {
                text: text.to_string(),
                kind: Kind::Notification {
                    cancels: cancelled_request(method, map),
                },
            },
            Err(e) => Verdict::Drop(format!("notification {method}: {e}")),
        };
    };
    if !params_object {
        return reject("\"params\" must be an object (MCP uses named parameters)");
    }
    let invalid_params = |detail: String| {
        Verdict::Reply(error_reply(
            Some(&id),
            INVALID_PARAMS,
            format!("Invalid params for {method}: {detail}"),
        ))
    };
    match serde_json::from_str::<ClientJsonRpcMessage>(text) {
        // The broker's MCP layer takes a known method whose params do not fit it for a
        // custom method and answers "method not found"; say what is wrong instead.
        Ok(JsonRpcMessage::Request(request))
            if matches!(request.request, ClientRequest::CustomRequest(_))
                && STANDARD_REQUESTS.contains(&method.as_str()) =>
        {
            invalid_params(params_mismatch(method, map.get("params")))
        }
        Ok(_) => Verdict::Forward {
            text: text.to_string(),
            kind: Kind::Request {
                id,
                method: method.clone(),
            },
        },
        Err(e) => invalid_params(e.to_string()),
    }
}

/// An object without a method: a response to a request the broker sent the agent.
fn classify_response(
    text: &str,
    map: &Map<String, Value>,
    has_id: bool,
    reject: impl Fn(&str) -> Verdict,
) -> Verdict {
    let has_result = map.contains_key("result");
    let has_error = map.contains_key("error");
    if !has_id || has_result == has_error {
        return reject(
            "a message is a request or notification (a string \"method\") or a response (an \
             \"id\" with exactly one of \"result\" and \"error\")",
        );
    }
    // Answering a response could start an error storm with a peer that echoes errors.
    match serde_json::from_str::<ClientJsonRpcMessage>(text) {
        Ok(_) => Verdict::Forward {
            text: text.to_string(),
            kind: Kind::Response,
        },
        Err(e) => Verdict::Drop(format!("response: {e}")),
    }
}

/// MCP batches are not accepted (MCP 2025-06-18 removed them): each request in one gets
/// Invalid Request with its id; notifications and responses in it get nothing.
fn classify_batch(items: &[Value]) -> Verdict {
    let replies: Vec<Value> = items
        .iter()
        .filter(|item| {
            let Some(map) = item.as_object() else {
                return true;
            };
            let notification =
                map.get("method").is_some_and(Value::is_string) && !map.contains_key("id");
            let response = !map.contains_key("method")
                && (map.contains_key("result") || map.contains_key("error"));
            !notification && !response
        })
        .map(|item| {
            let id = item.get("id").and_then(request_id);
            error_reply(
                id.as_ref(),
                INVALID_REQUEST,
                "Invalid Request: MCP does not accept JSON-RPC batches; send each message on \
                 its own line",
            )
        })
        .collect();
    if replies.is_empty() {
        Verdict::Drop("a batch of notifications or responses (MCP does not accept batches)".into())
    } else {
        Verdict::Reply(Value::Array(replies))
    }
}

/// The request methods an MCP server knows (the broker's MCP layer treats any other
/// method as custom and answers "method not found" itself).
const STANDARD_REQUESTS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "completion/complete",
    "logging/setLevel",
];

/// Why `params` do not fit `method`, as precisely as the types say.
fn params_mismatch(method: &str, params: Option<&Value>) -> String {
    let params = params.cloned().unwrap_or(Value::Null);
    let detail = match method {
        "tools/call" => serde_json::from_value::<CallToolRequestParams>(params).err(),
        "initialize" => serde_json::from_value::<InitializeRequestParams>(params).err(),
        _ => None,
    };
    detail.map_or_else(
        || "the params do not have the shape this method takes".to_string(),
        |e| e.to_string(),
    )
}

/// The request a `notifications/cancelled` gives up on.
fn cancelled_request(method: &str, map: &Map<String, Value>) -> Option<RequestId> {
    if method != "notifications/cancelled" {
        return None;
    }
    map.get("params")?.get("requestId").and_then(request_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(verdict: Verdict) -> Value {
        match verdict {
            Verdict::Reply(value) => value,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn nesting_is_measured_without_recursion_and_ignores_brackets_in_strings() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(nesting_exceeds(deep.as_bytes(), MAX_DEPTH));
        let at_limit = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(!nesting_exceeds(at_limit.as_bytes(), MAX_DEPTH));
        let in_string = format!("{{\"a\":\"{}\\\"{}\"}}", "[".repeat(500), "{".repeat(500));
        assert!(!nesting_exceeds(in_string.as_bytes(), MAX_DEPTH));
    }

    // Regression: issue 10
    #[test]
    fn a_hundred_thousand_deep_message_is_a_parse_error_not_a_stack_overflow() {
        for deep in [
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            format!("{}1{}", "{\"a\":".repeat(100_000), "}".repeat(100_000)),
        ] {
            let value = reply(classify(deep.as_bytes()));
            assert_eq!(value["error"]["code"], PARSE_ERROR);
            assert_eq!(value["id"], Value::Null);
        }
    }

    // Regression: issue 10
    #[test]
    fn serde_json_and_the_mcp_parser_reject_deep_input_without_overflowing_the_stack() {
        // The second lock behind the scan: the parsers the bridge and the broker use stop
        // at serde_json's recursion limit (128) instead of recursing 100k levels.
        for deep in [
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{}1{}}}",
                "{\"a\":".repeat(100_000),
                "}".repeat(100_000)
            ),
        ] {
            let e = serde_json::from_str::<Value>(&deep).unwrap_err();
            assert!(e.to_string().contains("recursion limit exceeded"), "{e}");
            let e = serde_json::from_str::<ClientJsonRpcMessage>(&deep).unwrap_err();
            assert!(e.to_string().contains("recursion limit exceeded"), "{e}");
        }
    }

    // Regression: issue 10
    #[test]
    fn malformed_lines_are_answered_with_json_rpc_errors() {
        let parse = reply(classify(b"{\"a\":\"\xff\"}"));
        assert_eq!(parse["error"]["code"], PARSE_ERROR);
        assert!(
            parse["error"]["message"]
                .as_str()
                .unwrap()
                .contains("UTF-8")
        );
        let truncated = reply(classify(b"{\"jsonrpc\":"));
        assert_eq!(truncated["error"]["code"], PARSE_ERROR);
        let scalar = reply(classify(b"42"));
        assert_eq!(scalar["error"]["code"], INVALID_REQUEST);
        let no_method = reply(classify(br#"{"jsonrpc":"2.0","id":"x","method":7}"#));
        assert_eq!(no_method["error"]["code"], INVALID_REQUEST);
        assert_eq!(no_method["id"], "x", "a readable id is echoed");
        let huge_id = reply(classify(br#"{"jsonrpc":"2.0","id":1e300,"method":"ping"}"#));
        assert_eq!(huge_id["id"], Value::Null);
        let bad_params = reply(classify(
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":5}}"#,
        ));
        assert_eq!(bad_params["error"]["code"], INVALID_PARAMS);
        assert_eq!(bad_params["id"], 3);
        let too_long = too_long(None);
        assert!(
            too_long["error"]["message"]
                .as_str()
                .unwrap()
                .contains("16 MiB")
        );
    }

    #[test]
    fn well_formed_messages_are_forwarded_as_they_came() {
        match classify(b"{\"jsonrpc\":\"2.0\",\"id\":1.0,\"method\":\"ping\"}\r") {
            Verdict::Forward { text, kind } => {
                assert_eq!(text, "{\"jsonrpc\":\"2.0\",\"id\":1.0,\"method\":\"ping\"}");
                let Kind::Request { id, method } = kind else {
                    panic!("a request")
                };
                assert_eq!(id_key(&id), "1", "1.0 and 1 are one id");
                assert_eq!(method, "ping");
            }
            other => panic!("forwarded, got {other:?}"),
        }
        match classify(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}"#,
        ) {
            Verdict::Forward {
                kind: Kind::Notification { cancels: Some(id) },
                ..
            } => assert_eq!(id_key(&id), "4"),
            other => panic!("a cancellation, got {other:?}"),
        }
        assert!(matches!(classify(b"  \t"), Verdict::Skip));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/postern/delivered","params":{"id":1}}"#),
            Verdict::Drop(_)
        ));
    }
}

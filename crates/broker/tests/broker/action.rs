//! Normalized actions and invocation fingerprints: RFC 3986 §6.2.2 equivalence, field
//! binding, the canonical encoding's known answers, and JSON storage.

use postern_broker::action::*;
use postern_broker::config::{Config, TargetVersion};
use postern_broker::contract::Code;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

fn version(n: u8) -> TargetVersion {
    TargetVersion::from_digest([n; 32])
}

fn snapshot() -> ConfigSnapshot {
    ConfigSnapshot {
        target_id: "payments".into(),
        target_version: version(7),
        credential_id: "payments-key".into(),
        credential_version: "v3".into(),
        injection_mode: "header:authorization".into(),
        idempotency_key: Some("4f1c2a".into()),
    }
}

fn http(method: &str, url: &str) -> NormalizedHttp {
    NormalizedHttp::new(method, url, &[], &[], b"").unwrap()
}

fn fp_http(h: &NormalizedHttp) -> Fingerprint {
    Fingerprint::compute(&NormalizedAction::Http(h.clone()), &snapshot())
}

fn fp_http_with(h: &NormalizedHttp, snap: &ConfigSnapshot) -> Fingerprint {
    Fingerprint::compute(&NormalizedAction::Http(h.clone()), snap)
}

fn fp_url(url: &str) -> Fingerprint {
    fp_http(&http("GET", url))
}

// ---- normalization ---------------------------------------------------------------------

#[test]
fn url_is_normalized_per_rfc_3986() {
    let n = http(
        "POST",
        "HTTPS://Api.Example.TEST:443/a/./b/../%7euser/%2f%3a%41?x=%7e%2f&y#frag",
    );
    assert_eq!(n.method, "POST");
    assert_eq!(n.scheme, "https");
    assert_eq!(n.host, "api.example.test");
    assert_eq!(n.port, None);
    assert_eq!(n.path, "/a/~user/%2F%3AA");
    assert_eq!(
        n.query,
        [("x".into(), "~%2F".into()), ("y".into(), String::new())]
    );
    assert_eq!(
        n.url(),
        "https://api.example.test/a/~user/%2F%3AA?x=~%2F&y="
    );
}

#[test]
fn empty_path_becomes_slash_and_non_default_port_is_kept() {
    let n = http("GET", "http://127.0.0.1:8080");
    assert_eq!((n.path.as_str(), n.port), ("/", Some(8080)));
    let n = http("GET", "https://[::1]:443?");
    assert_eq!((n.host.as_str(), n.port, n.query.len()), ("[::1]", None, 0));
}

#[test]
fn internationalized_hosts_are_punycode() {
    assert_eq!(
        http("GET", "https://BÜCHER.example/").host,
        "xn--bcher-kva.example"
    );
}

#[test]
fn query_keeps_order_duplicates_and_reserved_escapes() {
    let n = http("GET", "https://x.test/?b=2&a=1&b=1&&c=a+b&d=%2b");
    let pairs: Vec<(&str, &str)> = n
        .query
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("b", "2"),
            ("a", "1"),
            ("b", "1"),
            ("c", "a+b"),
            ("d", "%2B")
        ]
    );
}

#[test]
fn extra_query_is_encoded_and_appended() {
    let extra = [("q".to_owned(), "a b&c=~/é".to_owned())];
    let n = NormalizedHttp::new("GET", "https://x.test/s?lang=en", &[], &extra, b"").unwrap();
    assert_eq!(
        n.query,
        [
            ("lang".into(), "en".into()),
            ("q".into(), "a%20b%26c%3D~%2F%C3%A9".into())
        ]
    );
    // The same request written into the URL by hand is the same action.
    let by_hand = http("GET", "https://x.test/s?lang=en&q=a%20b%26c%3d%7e%2f%c3%a9");
    assert_eq!(n, by_hand);
}

#[test]
fn headers_are_lowercased_trimmed_and_stably_sorted() {
    let headers = [
        ("X-B".to_owned(), " 1 ".to_owned()),
        ("accept".to_owned(), "a".to_owned()),
        ("x-b".to_owned(), "2".to_owned()),
        ("X-A".to_owned(), "3".to_owned()),
    ];
    let n = NormalizedHttp::new("GET", "https://x.test/", &headers, &[], b"").unwrap();
    let got: Vec<(&str, &[u8])> = n
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            ("accept", &b"a"[..]),
            ("x-a", b"3"),
            ("x-b", b"1"),
            ("x-b", b"2")
        ]
    );
}

#[test]
fn body_is_kept_only_as_digest_and_length() {
    let n = NormalizedHttp::new("POST", "https://x.test/", &[], &[], b"secret-ish body").unwrap();
    assert_eq!(n.body_len, 15);
    assert_eq!(
        n.body_digest,
        blake3::hash(b"secret-ish body").to_hex().as_str()
    );
    let json = serde_json::to_string(&n).unwrap();
    assert!(!json.contains("secret-ish"));
}

#[test]
fn malformed_requests_name_the_field_and_code() {
    let cases = [
        ("GE T", "https://x.test/", Code::InvalidRequest, "method"),
        ("", "https://x.test/", Code::InvalidRequest, "method"),
        ("GET", "not a url", Code::InvalidRequest, "url"),
        ("GET", "https://x.test/%zz", Code::InvalidRequest, "url"),
        ("GET", "https://x.test/?a=%4", Code::InvalidRequest, "url"),
        (
            "GET",
            "https://user:pw@x.test/",
            Code::InvalidRequest,
            "url",
        ),
        ("GET", "ftp://x.test/", Code::InvalidTarget, "url"),
        ("GET", "file:///etc/passwd", Code::InvalidTarget, "url"),
        ("GET", "mailto:a@x.test", Code::InvalidTarget, "url"),
    ];
    for (method, url, code, field) in cases {
        let err = NormalizedHttp::new(method, url, &[], &[], b"").unwrap_err();
        assert_eq!(
            (err.code, err.field.as_str()),
            (code, field),
            "{method} {url}"
        );
    }
    let headers = [
        ("ok".to_owned(), "1".to_owned()),
        ("also-ok".to_owned(), "2".to_owned()),
        ("bad name".to_owned(), "3".to_owned()),
    ];
    let err = NormalizedHttp::new("GET", "https://x.test/", &headers, &[], b"").unwrap_err();
    assert_eq!(
        (err.code, err.field.as_str()),
        (Code::InvalidRequest, "headers[2].name")
    );
    let headers = [("x".to_owned(), "a\r\nInjected: 1".to_owned())];
    let err = NormalizedHttp::new("GET", "https://x.test/", &headers, &[], b"").unwrap_err();
    assert_eq!(
        (err.code, err.field.as_str()),
        (Code::InvalidRequest, "headers[0].value")
    );
    let extra = [(String::new(), "v".to_owned())];
    let err = NormalizedHttp::new("GET", "https://x.test/", &[], &extra, b"").unwrap_err();
    assert_eq!(err.field, "query[0].name");
}

#[test]
fn ssh_commands_are_validated() {
    let n = NormalizedSsh::new("web1", "deploy", b"uptime", b"in").unwrap();
    assert_eq!(n.stdin_len, 2);
    assert_eq!(n.stdin_digest, blake3::hash(b"in").to_hex().as_str());
    let err = NormalizedSsh::new("web1", "deploy", b"", b"").unwrap_err();
    assert_eq!(
        (err.code, err.field.as_str()),
        (Code::InvalidRequest, "command")
    );
    let err = NormalizedSsh::new("web1", "deploy", b"ls\0rm -rf /", b"").unwrap_err();
    assert_eq!(err.field, "command");
}

#[test]
fn snapshot_is_built_from_a_target() {
    let text = r#"
[[http]]
name = "payments"
base_url = "https://api.example.test/v1"
methods = ["POST"]
credential = "payments-key"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "per_call"

[[ssh]]
name = "web1"
host = "127.0.0.1"
user = "deploy"
credential = "web1-key"
approval = "session"
"#;
    let cfg = Config::parse(text, std::path::Path::new("config.toml")).unwrap();
    let s = ConfigSnapshot::for_http(&cfg.http[0], "v1", Some("k".into()));
    assert_eq!(s.target_id, "payments");
    assert_eq!(s.target_version, cfg.http[0].version());
    assert_eq!(s.credential_id, "payments-key");
    assert_eq!(s.injection_mode, "header:authorization");
    assert_eq!(s.idempotency_key.as_deref(), Some("k"));
    let s = ConfigSnapshot::for_ssh(&cfg.ssh[0], "v2");
    assert_eq!(
        (s.injection_mode.as_str(), s.idempotency_key),
        ("ssh_key", None)
    );
}

// ---- storage and display ---------------------------------------------------------------

#[test]
fn actions_and_snapshots_round_trip_through_json() {
    let mut h = NormalizedHttp::new(
        "PUT",
        "https://x.test/a?b=c",
        &[("X-Raw".into(), "v".into())],
        &[],
        b"body",
    )
    .unwrap();
    h.headers.push(("x-bin".into(), vec![0xff, 0x00, 0x41]));
    let ssh = NormalizedSsh::new("web1", "deploy", b"echo \xff", b"").unwrap();
    for action in [NormalizedAction::Http(h), NormalizedAction::Ssh(ssh)] {
        let json = serde_json::to_value(&action).unwrap();
        let back: NormalizedAction = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, action);
        assert!(json["kind"] == "http" || json["kind"] == "ssh");
    }
    let json = serde_json::to_value(snapshot()).unwrap();
    assert_eq!(
        serde_json::from_value::<ConfigSnapshot>(json).unwrap(),
        snapshot()
    );
}

#[test]
fn utf8_header_values_are_stored_as_text() {
    let h = NormalizedHttp::new(
        "GET",
        "https://x.test/",
        &[("A".into(), "b".into())],
        &[],
        b"",
    )
    .unwrap();
    let json = serde_json::to_value(&h).unwrap();
    assert_eq!(json["headers"], serde_json::json!([["a", "b"]]));
}

#[test]
fn fingerprint_displays_and_parses_as_blake3_hex() {
    let fp = fp_url("https://x.test/");
    let text = fp.to_string();
    assert!(text.starts_with("blake3:") && text.len() == 7 + 64);
    assert_eq!(Fingerprint::parse(&text).unwrap(), fp);
    assert_eq!(text.parse::<Fingerprint>().unwrap(), fp);
    assert_eq!(
        serde_json::to_value(fp).unwrap(),
        serde_json::Value::String(text.clone())
    );
    assert_eq!(
        serde_json::from_value::<Fingerprint>(text.clone().into()).unwrap(),
        fp
    );
    for bad in [
        "",
        "blake3:",
        &text[7..],
        &text.to_uppercase(),
        &format!("blake3:{}", text[7..].to_uppercase()),
        &format!("sha256:{}", &text[7..]),
        &text[..text.len() - 1],
        &format!("{text}0"),
        &format!("blake3:{}", "g".repeat(64)),
    ] {
        assert_eq!(Fingerprint::parse(bad), Err(ParseFingerprintError), "{bad}");
    }
}

// ---- known-answer vectors --------------------------------------------------------------

#[derive(Serialize, Deserialize)]
struct Vector {
    description: String,
    action: NormalizedAction,
    snapshot: ConfigSnapshot,
    fingerprint: String,
}

fn vector_inputs() -> Vec<(&'static str, NormalizedAction, ConfigSnapshot)> {
    let base = snapshot();
    let no_key = ConfigSnapshot {
        idempotency_key: None,
        ..snapshot()
    };
    let empty_key = ConfigSnapshot {
        idempotency_key: Some(String::new()),
        ..snapshot()
    };
    let basic = ConfigSnapshot {
        injection_mode: "basic".into(),
        idempotency_key: None,
        ..snapshot()
    };
    let ssh_snap = ConfigSnapshot {
        target_id: "web1".into(),
        target_version: version(9),
        credential_id: "web1-key".into(),
        credential_version: "2026-01-01".into(),
        injection_mode: "ssh_key".into(),
        idempotency_key: None,
    };
    let h = |method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]| {
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NormalizedAction::Http(NormalizedHttp::new(method, url, &headers, &[], body).unwrap())
    };
    let mut binary = NormalizedHttp::new("GET", "https://x.test/", &[], &[], b"").unwrap();
    binary
        .headers
        .push(("x-bin".into(), vec![0x00, 0xff, 0x7f]));
    vec![
        (
            "GET, empty body, no idempotency key",
            h("GET", "https://api.example.test/v1/payments", &[], b""),
            no_key.clone(),
        ),
        (
            "POST with body, headers and idempotency key",
            h(
                "POST",
                "https://api.example.test/v1/payments?expand=customer",
                &[("Content-Type", "application/json"), ("Accept", "*/*")],
                br#"{"amount":100,"currency":"EUR"}"#,
            ),
            base.clone(),
        ),
        (
            "same POST with an empty idempotency key",
            h("POST", "https://api.example.test/v1/payments", &[], b"x"),
            empty_key,
        ),
        (
            "non-default port, IPv6 host, encoded slash, duplicate query names",
            h(
                "DELETE",
                "http://[::1]:8080/items/a%2fb?id=1&id=2&flag",
                &[("X-Dup", "1"), ("x-dup", "2")],
                b"",
            ),
            basic,
        ),
        (
            "non-UTF-8 header value",
            NormalizedAction::Http(binary),
            no_key,
        ),
        (
            "ssh command with stdin",
            NormalizedAction::Ssh(
                NormalizedSsh::new("web1", "deploy", b"systemctl restart app", b"yes\n").unwrap(),
            ),
            ssh_snap.clone(),
        ),
        (
            "ssh command, non-UTF-8 bytes, empty stdin",
            NormalizedAction::Ssh(
                NormalizedSsh::new("web1", "deploy", b"printf '\xe9'", b"").unwrap(),
            ),
            ssh_snap,
        ),
    ]
}

#[test]
fn known_answer_vectors_match() {
    let vectors: Vec<Vector> =
        serde_json::from_str(include_str!("../vectors/fingerprint_v1.json")).unwrap();
    assert!(vectors.len() >= 5);
    for v in &vectors {
        let fp = Fingerprint::compute(&v.action, &v.snapshot);
        assert_eq!(fp.to_string(), v.fingerprint, "{}", v.description);
    }
    // The committed inputs are what today's normalizer produces for the same requests.
    let inputs = vector_inputs();
    assert_eq!(inputs.len(), vectors.len());
    for ((description, action, snapshot), v) in inputs.iter().zip(&vectors) {
        assert_eq!(
            (*description, action, snapshot),
            (v.description.as_str(), &v.action, &v.snapshot)
        );
    }
}

/// Regenerates the vector file. Run only when the encoding version changes:
/// `cargo test --test broker -- --ignored regenerate_fingerprint_vectors`.
#[test]
#[ignore = "writes tests/vectors/fingerprint_v1.json"]
fn regenerate_fingerprint_vectors() {
    let vectors: Vec<Vector> = vector_inputs()
        .into_iter()
        .map(|(description, action, snapshot)| Vector {
            description: description.into(),
            fingerprint: Fingerprint::compute(&action, &snapshot).to_string(),
            action,
            snapshot,
        })
        .collect();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/fingerprint_v1.json"
    );
    let mut json = serde_json::to_string_pretty(&vectors).unwrap();
    json.push('\n');
    std::fs::write(path, json).unwrap();
}

// ---- fingerprint binding ---------------------------------------------------------------

#[test]
fn fields_do_not_bleed_into_each_other() {
    // Length prefixes keep moved bytes from producing the same encoding.
    let mut a = http("GET", "https://x.test/?ab=c");
    let mut b = http("GET", "https://x.test/?a=bc");
    assert_ne!(fp_http(&a), fp_http(&b));
    a.query = vec![("a".into(), "b".into()), ("c".into(), String::new())];
    b.query = vec![("a".into(), "b".into())];
    b.query.push(("c".into(), String::new()));
    assert_eq!(fp_http(&a), fp_http(&b));
    b.query = vec![("a".into(), "bc".into())];
    assert_ne!(fp_http(&a), fp_http(&b));
    let mut s1 = snapshot();
    let mut s2 = snapshot();
    s1.credential_id = "ab".into();
    s1.credential_version = "c".into();
    s2.credential_id = "a".into();
    s2.credential_version = "bc".into();
    let action = NormalizedAction::Http(http("GET", "https://x.test/"));
    assert_ne!(
        Fingerprint::compute(&action, &s1),
        Fingerprint::compute(&action, &s2)
    );
}

#[test]
fn http_and_ssh_actions_never_collide_by_kind() {
    let h = NormalizedAction::Http(http("GET", "https://x.test/"));
    let s = NormalizedAction::Ssh(NormalizedSsh::new("x", "GET", b"ls", b"").unwrap());
    assert_ne!(
        Fingerprint::compute(&h, &snapshot()),
        Fingerprint::compute(&s, &snapshot())
    );
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_.~%/-]{0,12}"
}

fn arb_http() -> impl Strategy<Value = NormalizedHttp> {
    (
        (
            "[A-Z]{1,8}",
            prop_oneof![Just("http"), Just("https")],
            "[a-z0-9.-]{1,20}",
        ),
        (proptest::option::of(any::<u16>()), text()),
        proptest::collection::vec((text(), text()), 0..4),
        proptest::collection::vec(
            ("[a-z-]{1,8}", proptest::collection::vec(any::<u8>(), 0..8)),
            0..4,
        ),
        (any::<[u8; 32]>(), any::<u64>()),
    )
        .prop_map(
            |((method, scheme, host), (port, path), query, mut headers, (digest, len))| {
                headers.sort_by(|a, b| a.0.cmp(&b.0));
                NormalizedHttp {
                    method,
                    scheme: scheme.into(),
                    host,
                    port,
                    path: format!("/{path}"),
                    query,
                    headers,
                    body_digest: hex::encode(digest),
                    body_len: len,
                }
            },
        )
}

fn arb_ssh() -> impl Strategy<Value = NormalizedSsh> {
    (
        text(),
        text(),
        proptest::collection::vec(any::<u8>(), 1..16),
        any::<[u8; 32]>(),
        any::<u64>(),
    )
        .prop_map(|(target, user, command, digest, len)| NormalizedSsh {
            target,
            user,
            command,
            stdin_digest: hex::encode(digest),
            stdin_len: len,
        })
}

fn arb_snapshot() -> impl Strategy<Value = ConfigSnapshot> {
    (
        text(),
        any::<u8>(),
        text(),
        text(),
        text(),
        proptest::option::of(text()),
    )
        .prop_map(
            |(target_id, v, credential_id, credential_version, injection_mode, key)| {
                ConfigSnapshot {
                    target_id,
                    target_version: version(v),
                    credential_id,
                    credential_version,
                    injection_mode,
                    idempotency_key: key,
                }
            },
        )
}

/// Every single-field edit of an http action; each must change what the remote sees or
/// how the broker is bound, so each must change the fingerprint.
fn http_edits(h: &NormalizedHttp) -> Vec<(&'static str, NormalizedHttp)> {
    let mut out = Vec::new();
    let mut e = |name, f: &dyn Fn(&mut NormalizedHttp)| {
        let mut c = h.clone();
        f(&mut c);
        out.push((name, c));
    };
    e("method", &|c| c.method.push('X'));
    e("scheme", &|c| {
        c.scheme = if c.scheme == "http" {
            "https".into()
        } else {
            "http".into()
        }
    });
    e("host", &|c| c.host.push('x'));
    e("port presence", &|c| {
        c.port = if c.port.is_some() { None } else { Some(443) }
    });
    e("port value", &|c| {
        c.port = Some(c.port.map_or(1, |p| p.wrapping_add(1)))
    });
    e("path", &|c| c.path.push('a'));
    e("query added", &|c| c.query.push(("k".into(), "v".into())));
    e("query value", &|c| match c.query.first_mut() {
        Some(q) => q.1.push('v'),
        None => c.query.push((String::new(), String::new())),
    });
    e("header value", &|c| match c.headers.first_mut() {
        Some(hd) => hd.1.push(b'!'),
        None => c.headers.push(("x".into(), Vec::new())),
    });
    e("header name", &|c| match c.headers.first_mut() {
        Some(hd) => hd.0.push('z'),
        None => c.headers.push(("y".into(), b"1".to_vec())),
    });
    e("header removed", &|c| {
        if c.headers.pop().is_none() {
            c.headers.push(("x".into(), Vec::new()));
        }
    });
    e("body digest", &|c| {
        let first = if c.body_digest.starts_with('0') {
            "1"
        } else {
            "0"
        };
        c.body_digest.replace_range(0..1, first);
    });
    e("body length", &|c| c.body_len = c.body_len.wrapping_add(1));
    out
}

fn ssh_edits(s: &NormalizedSsh) -> Vec<(&'static str, NormalizedSsh)> {
    let mut out = Vec::new();
    let mut e = |name, f: &dyn Fn(&mut NormalizedSsh)| {
        let mut c = s.clone();
        f(&mut c);
        out.push((name, c));
    };
    e("target", &|c| c.target.push('x'));
    e("user", &|c| c.user.push('x'));
    e("command", &|c| c.command.push(b' '));
    e("stdin digest", &|c| {
        let first = if c.stdin_digest.starts_with('0') {
            "1"
        } else {
            "0"
        };
        c.stdin_digest.replace_range(0..1, first);
    });
    e("stdin length", &|c| {
        c.stdin_len = c.stdin_len.wrapping_add(1)
    });
    out
}

fn snapshot_edits(s: &ConfigSnapshot) -> Vec<(&'static str, ConfigSnapshot)> {
    let mut out = Vec::new();
    let mut e = |name, f: &dyn Fn(&mut ConfigSnapshot)| {
        let mut c = s.clone();
        f(&mut c);
        out.push((name, c));
    };
    e("target id", &|c| c.target_id.push('x'));
    e("target version", &|c| {
        let other = if c.target_version == version(0) { 1 } else { 0 };
        c.target_version = version(other);
    });
    e("credential id", &|c| c.credential_id.push('x'));
    e("credential version", &|c| c.credential_version.push('x'));
    e("injection mode", &|c| c.injection_mode.push('x'));
    e("idempotency key presence", &|c| {
        c.idempotency_key = match c.idempotency_key {
            Some(_) => None,
            None => Some(String::new()),
        }
    });
    e("idempotency key value", &|c| {
        c.idempotency_key = Some(format!("{}x", c.idempotency_key.as_deref().unwrap_or("")))
    });
    out
}

/// URL pieces that exercise every normalization rule.
fn segment() -> impl Strategy<Value = String> {
    let atoms = prop_oneof![
        Just("a"),
        Just("Z"),
        Just("~"),
        Just("%7e"),
        Just("%7E"),
        Just("%41"),
        Just("%2f"),
        Just("%2F"),
        Just("%3a"),
        Just("."),
        Just(".."),
        Just("%2e"),
        Just("-"),
        Just("_"),
        Just("!"),
        Just("$"),
        Just("'"),
        Just("("),
        Just("*"),
        Just("+"),
        Just(","),
        Just(";"),
        Just("="),
        Just(":"),
        Just("@"),
        Just("%e2%82%ac"),
        Just("€"),
        Just(" "),
        Just("%20"),
        Just("|"),
        Just("^"),
        Just("\""),
        Just("{"),
        Just("`"),
    ];
    proptest::collection::vec(atoms, 0..4).prop_map(|v| v.concat())
}

fn arb_url() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just("http"), Just("HTTPS"), Just("https")],
        prop_oneof![
            Just("Example.COM"),
            Just("127.0.0.1"),
            Just("[::1]"),
            Just("bücher.test")
        ],
        prop_oneof![Just(""), Just(":80"), Just(":443"), Just(":8080")],
        proptest::collection::vec(segment(), 0..5),
        proptest::option::of(proptest::collection::vec((segment(), segment()), 0..4)),
    )
        .prop_map(|(scheme, host, port, segments, query)| {
            let mut url = format!("{scheme}://{host}{port}");
            for s in segments {
                url.push('/');
                url.push_str(&s);
            }
            if let Some(q) = query {
                url.push('?');
                let pairs: Vec<String> = q
                    .into_iter()
                    .map(|(k, v)| format!("{}={}", k.replace(['&', '='], ""), v.replace('&', "")))
                    .collect();
                url.push_str(&pairs.join("&"));
            }
            url
        })
}

/// Unreserved-only segments, so each can be spelled several equivalent ways.
fn plain_segments() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec("[a-zA-Z0-9~._-]{1,6}", 1..5).prop_map(|v| {
        // "." and ".." are dot segments, not data; keep them out of the plain spelling.
        v.into_iter()
            .map(|s| {
                if s.chars().all(|c| c == '.') {
                    format!("x{s}")
                } else {
                    s
                }
            })
            .collect()
    })
}

fn encode_all(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02x}")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn changing_any_bound_http_field_changes_the_fingerprint(
        h in arb_http(),
        snap in arb_snapshot(),
    ) {
        let original = Fingerprint::compute(&NormalizedAction::Http(h.clone()), &snap);
        for (field, edited) in http_edits(&h) {
            prop_assert_ne!(&edited, &h, "edit {} was a no-op", field);
            let fp = Fingerprint::compute(&NormalizedAction::Http(edited), &snap);
            prop_assert_ne!(fp, original, "edit of {} kept the fingerprint", field);
        }
        for (field, edited) in snapshot_edits(&snap) {
            let fp = Fingerprint::compute(&NormalizedAction::Http(h.clone()), &edited);
            prop_assert_ne!(fp, original, "edit of {} kept the fingerprint", field);
        }
        // Query order is meaningful to servers, so swapping two pairs is a change too.
        let mut ab = h.clone();
        ab.query.extend([("a".to_owned(), "1".to_owned()), ("b".to_owned(), "2".to_owned())]);
        let mut ba = h.clone();
        ba.query.extend([("b".to_owned(), "2".to_owned()), ("a".to_owned(), "1".to_owned())]);
        prop_assert_ne!(fp_http_with(&ab, &snap), fp_http_with(&ba, &snap));
    }

    #[test]
    fn changing_any_bound_ssh_field_changes_the_fingerprint(
        s in arb_ssh(),
        snap in arb_snapshot(),
    ) {
        let original = Fingerprint::compute(&NormalizedAction::Ssh(s.clone()), &snap);
        for (field, edited) in ssh_edits(&s) {
            let fp = Fingerprint::compute(&NormalizedAction::Ssh(edited), &snap);
            prop_assert_ne!(fp, original, "edit of {} kept the fingerprint", field);
        }
        for (field, edited) in snapshot_edits(&snap) {
            let fp = Fingerprint::compute(&NormalizedAction::Ssh(s.clone()), &edited);
            prop_assert_ne!(fp, original, "edit of {} kept the fingerprint", field);
        }
    }

    #[test]
    fn changing_the_body_changes_the_fingerprint(
        body in proptest::collection::vec(any::<u8>(), 0..64),
        index in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let original = NormalizedHttp::new("POST", "https://x.test/", &[], &[], &body).unwrap();
        let mut changed = body.clone();
        if changed.is_empty() {
            changed.push(flip);
        } else {
            let i = index.index(changed.len());
            changed[i] ^= flip;
        }
        let edited = NormalizedHttp::new("POST", "https://x.test/", &[], &[], &changed).unwrap();
        prop_assert_ne!(fp_http(&original), fp_http(&edited));
        let mut longer = body.clone();
        longer.push(0);
        let longer = NormalizedHttp::new("POST", "https://x.test/", &[], &[], &longer).unwrap();
        prop_assert_ne!(fp_http(&original), fp_http(&longer));
    }

    #[test]
    fn normalization_is_idempotent(url in arb_url()) {
        let once = http("GET", &url);
        let twice = http("GET", &once.url());
        prop_assert_eq!(&twice, &once);
        prop_assert_eq!(twice.url(), once.url());
        // The normal form has no dot segments and only uppercase escapes.
        prop_assert!(!once.path.split('/').any(|s| s == "." || s == ".."), "{}", once.path);
        let hex_ok = once.path.split('%').skip(1).all(|s| {
            s.len() >= 2 && s[..2].bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        });
        prop_assert!(hex_ok, "{}", once.path);
    }

    #[test]
    fn equivalent_urls_have_equal_fingerprints(
        segments in plain_segments(),
        encode_index in any::<prop::sample::Index>(),
        dot_index in any::<prop::sample::Index>(),
        https in any::<bool>(),
    ) {
        let (scheme, port) = if https { ("https", 443) } else { ("http", 80) };
        let canonical = format!("{scheme}://api.example.test/{}", segments.join("/"));
        let mut spelled = segments.clone();
        let i = encode_index.index(spelled.len());
        spelled[i] = encode_all(&spelled[i]);
        let j = dot_index.index(spelled.len());
        spelled.insert(j, "./gone/..".to_owned());
        let variant = format!(
            "{}://API.Example.TEST:{port}/{}",
            scheme.to_uppercase(),
            spelled.join("/"),
        );
        prop_assert_eq!(fp_url(&canonical), fp_url(&variant), "{} vs {}", canonical, variant);
    }

    #[test]
    fn encoded_slash_stays_distinct_from_slash(
        a in "[a-z0-9]{1,6}",
        b in "[a-z0-9]{1,6}",
        lower in any::<bool>(),
    ) {
        let escape = if lower { "%2f" } else { "%2F" };
        let encoded = http("GET", &format!("https://x.test/{a}{escape}{b}"));
        let slash = http("GET", &format!("https://x.test/{a}/{b}"));
        prop_assert_eq!(&encoded.path, &format!("/{a}%2F{b}"));
        prop_assert_ne!(fp_http(&encoded), fp_http(&slash));
        let other_case = http("GET", &format!("https://x.test/{a}%2f{b}"));
        prop_assert_eq!(fp_http(&encoded), fp_http(&other_case));
    }
}

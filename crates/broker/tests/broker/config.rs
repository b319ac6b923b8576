//! The targets file: parsing, validation errors that name file/target/field, version
//! digests and target resolution.

use std::path::{Path, PathBuf};
use std::time::Duration;

use postern_broker::config::*;
use url::Url;

const ED25519_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f";

/// The documented example configuration, with a real (syntactically valid) host key.
fn design_example() -> String {
    format!(
        r#"
[[http]]
name = "payments"
base_url = "https://api.example.test/v1"
methods = ["GET", "POST", "PUT", "DELETE"]
credential = "payments-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "per_call"
idempotent_methods = ["GET", "PUT", "DELETE"]
ca_file = "certs/ca.pem"
timeout_ms = 30000

[http.idempotency]
header = "Idempotency-Key"
scope = "payments.create"
retention = "24h"

[http.reconcile]
method = "GET"
path = "/payments?idempotency_key={{idempotency_key}}"
committed_status = [200]
not_applied_status = [404]

[[ssh]]
name = "web1"
host = "127.0.0.1"
port = 2222
user = "deploy"
credential = "web1-key"
host_key = "{ED25519_KEY}"
approval = "session"
"#
    )
}

fn path() -> PathBuf {
    PathBuf::from("/etc/postern/config.toml")
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, &path())
}

/// A minimal valid http target with `extra` lines spliced in (later keys override by
/// being the only occurrence: callers pass keys not in the base).
fn http_target(name: &str, base_url: &str, extra: &str) -> String {
    format!(
        r#"
[[http]]
name = "{name}"
base_url = "{base_url}"
methods = ["GET"]
credential = "k"
inject = {{ query = "api_key" }}
approval = "none"
{extra}
"#
    )
}

/// Asserts an `Invalid` error and returns its target, field and problem.
fn invalid(text: &str) -> (TargetRef, String, Problem) {
    match parse(text) {
        Err(ConfigError::Invalid(e)) => {
            let InvalidField {
                file,
                target,
                field,
                problem,
            } = *e;
            assert_eq!(file, path());
            (target, field, problem)
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
}

fn http_ref(index: usize, name: &str) -> TargetRef {
    TargetRef {
        section: Section::Http,
        index,
        name: Some(name.to_owned()),
    }
}

fn ssh_ref(index: usize, name: &str) -> TargetRef {
    TargetRef {
        section: Section::Ssh,
        index,
        name: Some(name.to_owned()),
    }
}

#[test]
fn design_example_parses_with_defaults_and_normalized_fields() {
    let cfg = parse(&design_example()).unwrap();
    assert_eq!(cfg.source, path());
    let p = &cfg.http[0];
    assert_eq!(p.name, "payments");
    assert_eq!(p.base_url.as_str(), "https://api.example.test/v1");
    assert_eq!(p.methods, ["DELETE", "GET", "POST", "PUT"]);
    assert_eq!(p.credential.as_str(), "payments-key");
    assert_eq!(
        p.inject,
        Injection::Header {
            name: "authorization".into(),
            format: "Bearer {secret}".into()
        }
    );
    assert_eq!(p.inject.mode(), "header:authorization");
    assert_eq!(p.approval, ApprovalMode::PerCall);
    assert_eq!(p.idempotent_methods, ["DELETE", "GET", "PUT"]);
    assert_eq!(
        p.ca_file.as_deref(),
        Some(Path::new("/etc/postern/certs/ca.pem"))
    );
    assert_eq!(p.timeout_ms, 30_000);
    assert_eq!(p.max_response_bytes, 10 * 1024 * 1024);
    assert_eq!(p.max_request_body_bytes, 1024 * 1024);
    assert!(!p.follow_redirects);
    let idem = p.idempotency.as_ref().unwrap();
    assert_eq!(idem.header, "idempotency-key");
    assert_eq!(idem.scope, "payments.create");
    assert_eq!(idem.retention, Duration::from_secs(24 * 3600));
    let rec = p.reconcile.as_ref().unwrap();
    assert_eq!(rec.method, "GET");
    assert_eq!(rec.path, "/payments?idempotency_key={idempotency_key}");
    assert_eq!(rec.committed_status, [200]);
    assert_eq!(rec.not_applied_status, [404]);

    let s = &cfg.ssh[0];
    assert_eq!(
        (s.name.as_str(), s.host.as_str(), s.port),
        ("web1", "127.0.0.1", 2222)
    );
    assert_eq!(s.user, "deploy");
    assert_eq!(s.host_key.as_deref(), Some(ED25519_KEY));
    assert_eq!(s.approval, ApprovalMode::Session);
    assert_eq!(s.timeout_ms, 30_000);
    assert_eq!(s.max_output_bytes, 1024 * 1024);
}

#[test]
fn load_reads_the_file_and_resolves_ca_file_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("targets.toml");
    std::fs::write(&file, design_example()).unwrap();
    std::fs::create_dir(dir.path().join("certs")).unwrap();
    std::fs::write(dir.path().join("certs/ca.pem"), TEST_CA_PEM).unwrap();
    let cfg = Config::load(&file).unwrap();
    assert_eq!(cfg.source, file);
    assert_eq!(
        cfg.http[0].ca_file.as_deref(),
        Some(dir.path().join("certs/ca.pem").as_path())
    );
}

#[test]
fn missing_file_is_a_read_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("absent.toml");
    match Config::load(&file) {
        Err(ConfigError::Read { path, source }) => {
            assert_eq!(path, file);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected a read error, got {other:?}"),
    }
}

#[test]
fn empty_file_is_an_empty_config() {
    let cfg = parse("").unwrap();
    assert!(cfg.http.is_empty() && cfg.ssh.is_empty());
}

#[test]
fn invalid_toml_reports_the_file_and_parser_text() {
    for text in [
        "[[http]\nname = 1",
        "name = = 2",
        "\u{0}",
        "[[http]]\nname = \"a\"\nname = \"b\"",
    ] {
        match parse(text) {
            Err(e @ ConfigError::Syntax { .. }) => {
                let ConfigError::Syntax { file, message } = &e else {
                    unreachable!()
                };
                assert_eq!(file, &path());
                assert!(!message.is_empty());
                assert!(
                    e.to_string().starts_with("/etc/postern/config.toml: "),
                    "{e}"
                );
            }
            other => panic!("expected a syntax error for {text:?}, got {other:?}"),
        }
    }
}

#[test]
fn unknown_keys_are_rejected_with_the_key_named() {
    for (text, key) in [
        (
            http_target("a", "https://x.test", "colour = \"red\""),
            "colour",
        ),
        ("[[htp]]\nname = \"a\"".to_owned(), "htp"),
        (
            http_target("a", "https://x.test", "").replace(
                "{ query = \"api_key\" }",
                "{ query = \"k\", header_name = \"x\" }",
            ),
            "header_name",
        ),
        (
            http_target(
                "a",
                "https://x.test",
                "[http.idempotency]\nheader = \"I\"\nscope = \"s\"\nretention = \"1h\"\nttl = 3",
            ),
            "ttl",
        ),
    ] {
        match parse(&text) {
            Err(ConfigError::Syntax { file, message }) => {
                assert_eq!(file, path());
                assert!(message.contains(key), "{message}");
            }
            other => panic!("expected a syntax error naming {key}, got {other:?}"),
        }
    }
}

#[test]
fn wrong_value_types_are_syntax_errors_not_panics() {
    for extra in [
        "timeout_ms = -1",
        "follow_redirects = \"yes\"",
        "ca_file = 3",
    ] {
        let text = http_target("a", "https://x.test", extra);
        assert!(
            matches!(parse(&text), Err(ConfigError::Syntax { .. })),
            "{extra}"
        );
    }
    let text = http_target("a", "https://x.test", "").replace("\"none\"", "\"always\"");
    assert!(matches!(parse(&text), Err(ConfigError::Syntax { .. })));
}

#[test]
fn error_message_names_file_target_and_field() {
    let text = http_target("payments", "http://api.example.test/v1", "");
    let err = parse(&text).unwrap_err();
    assert_eq!(
        err.to_string(),
        "/etc/postern/config.toml: [[http]] \"payments\": field `base_url`: \
         plain http is allowed only for loopback hosts"
    );
}

#[test]
fn invalid_names_are_reported_by_position() {
    for bad in ["", "Payments", "-x", "_x", "a b", "a.b", &"a".repeat(65)] {
        let text = format!(
            "{}{}",
            http_target("ok", "https://x.test", ""),
            http_target(bad, "https://y.test", "")
        );
        let (target, field, problem) = invalid(&text);
        assert_eq!(
            target,
            TargetRef {
                section: Section::Http,
                index: 1,
                name: None
            },
            "{bad:?}"
        );
        assert_eq!(field, "name");
        assert_eq!(problem, Problem::InvalidName);
    }
    for good in ["a", "0", "a-b_c", &"a".repeat(64)] {
        assert!(
            parse(&http_target(good, "https://x.test", "")).is_ok(),
            "{good:?}"
        );
    }
}

#[test]
fn names_are_unique_across_http_and_ssh() {
    let text = format!(
        "{}\n[[ssh]]\nname = \"dup\"\nhost = \"h.test\"\nuser = \"u\"\ncredential = \"c\"\napproval = \"none\"\n",
        http_target("dup", "https://x.test", "")
    );
    let (target, field, problem) = invalid(&text);
    assert_eq!(target, ssh_ref(0, "dup"));
    assert_eq!(field, "name");
    assert_eq!(
        problem,
        Problem::DuplicateName {
            first: http_ref(0, "dup")
        }
    );
}

#[test]
fn plain_http_is_allowed_only_on_loopback() {
    for ok in [
        "http://127.0.0.1:8080",
        "http://127.9.9.9/x",
        "http://[::1]:9000/api",
        "http://localhost/",
        "http://LOCALHOST:1",
    ] {
        assert!(parse(&http_target("a", ok, "")).is_ok(), "{ok}");
    }
    for bad in [
        "http://api.example.test",
        "http://10.0.0.1",
        "http://[::2]",
        "http://localhost.evil.test",
    ] {
        let (target, field, problem) = invalid(&http_target("a", bad, ""));
        assert_eq!(
            (target, field.as_str()),
            (http_ref(0, "a"), "base_url"),
            "{bad}"
        );
        assert_eq!(problem, Problem::PlainHttpNotLoopback, "{bad}");
    }
}

#[test]
fn base_url_rejects_other_schemes_userinfo_query_fragment_and_garbage() {
    let cases = [
        (
            "ftp://x.test",
            Problem::UnsupportedScheme {
                scheme: "ftp".into(),
            },
        ),
        ("https://user:pw@x.test", Problem::UserinfoInUrl),
        ("https://user@x.test", Problem::UserinfoInUrl),
        ("https://x.test/v1?a=1", Problem::QueryOrFragmentInUrl),
        ("https://x.test/v1#frag", Problem::QueryOrFragmentInUrl),
    ];
    for (url, expected) in cases {
        let (_, field, problem) = invalid(&http_target("a", url, ""));
        assert_eq!(field, "base_url");
        assert_eq!(problem, expected, "{url}");
    }
    for url in ["not a url", "https://", "/relative"] {
        let (_, field, problem) = invalid(&http_target("a", url, ""));
        assert_eq!(field, "base_url");
        assert!(
            matches!(problem, Problem::InvalidUrl { .. }),
            "{url}: {problem:?}"
        );
    }
}

#[test]
fn base_url_path_is_normalized_without_trailing_slash() {
    let cfg = parse(&http_target(
        "a",
        "HTTPS://API.Example.TEST:443/v1/./x/../%7euser/",
        "",
    ))
    .unwrap();
    assert_eq!(
        cfg.http[0].base_url.as_str(),
        "https://api.example.test/v1/~user"
    );
    let cfg = parse(&http_target("a", "https://x.test", "")).unwrap();
    assert_eq!(cfg.http[0].base_url.path(), "/");
}

#[test]
fn methods_must_be_non_empty_uppercase_tokens() {
    let text = http_target("a", "https://x.test", "").replace("[\"GET\"]", "[]");
    assert_eq!(invalid(&text).1, "methods");
    assert_eq!(invalid(&text).2, Problem::Empty);
    for (list, index, bad) in [
        ("[\"GET\", \"get\"]", 1, "get"),
        ("[\"PO ST\"]", 0, "PO ST"),
        ("[\"\"]", 0, ""),
    ] {
        let text = http_target("a", "https://x.test", "").replace("[\"GET\"]", list);
        let (_, field, problem) = invalid(&text);
        assert_eq!(field, format!("methods[{index}]"));
        assert_eq!(problem, Problem::InvalidMethod { value: bad.into() });
    }
    let text = http_target("a", "https://x.test", "")
        .replace("[\"GET\"]", "[\"POST\", \"GET\", \"POST\"]");
    assert_eq!(parse(&text).unwrap().http[0].methods, ["GET", "POST"]);
}

#[test]
fn idempotent_methods_must_be_valid_tokens() {
    let (_, field, problem) = invalid(&http_target(
        "a",
        "https://x.test",
        "idempotent_methods = [\"GET\", \"P(T\"]",
    ));
    assert_eq!(field, "idempotent_methods[1]");
    assert_eq!(
        problem,
        Problem::InvalidMethod {
            value: "P(T".into()
        }
    );
    let cfg = parse(&http_target("a", "https://x.test", "")).unwrap();
    assert!(
        cfg.http[0].idempotent_methods.is_empty(),
        "absent means nothing is guaranteed"
    );
}

#[test]
fn timeouts_are_bounded_and_sizes_positive() {
    let cases = [
        (
            "timeout_ms = 0",
            "timeout_ms",
            Problem::OutOfRange {
                min: 1,
                max: 600_000,
            },
        ),
        (
            "timeout_ms = 600001",
            "timeout_ms",
            Problem::OutOfRange {
                min: 1,
                max: 600_000,
            },
        ),
        (
            "max_response_bytes = 0",
            "max_response_bytes",
            Problem::OutOfRange {
                min: 1,
                max: u64::MAX,
            },
        ),
        (
            "max_request_body_bytes = 0",
            "max_request_body_bytes",
            Problem::OutOfRange {
                min: 1,
                max: 10 * 1024 * 1024,
            },
        ),
        // Regression: issue 26 (item 9): a body limit past what the bridge's 16 MiB line
        // can carry could never be reached.
        (
            "max_request_body_bytes = 16777216",
            "max_request_body_bytes",
            Problem::OutOfRange {
                min: 1,
                max: 10 * 1024 * 1024,
            },
        ),
    ];
    for (extra, expected_field, expected) in cases {
        let (target, field, problem) = invalid(&http_target("a", "https://x.test", extra));
        assert_eq!(target, http_ref(0, "a"));
        assert_eq!((field.as_str(), problem), (expected_field, expected));
    }
    assert_eq!(
        parse(&http_target("a", "https://x.test", "timeout_ms = 600000"))
            .unwrap()
            .http[0]
            .timeout_ms,
        600_000
    );
}

#[test]
fn injection_forms_are_parsed_and_validated() {
    let with = |inject: &str| {
        http_target("a", "https://x.test", "").replace("{ query = \"api_key\" }", inject)
    };
    let cfg = parse(&with("{ basic_user = \"svc\" }")).unwrap();
    assert_eq!(cfg.http[0].inject, Injection::Basic { user: "svc".into() });
    assert_eq!(cfg.http[0].inject.mode(), "basic");
    let cfg = parse(&with("{ query = \"api_key\" }")).unwrap();
    assert_eq!(cfg.http[0].inject.mode(), "query:api_key");
    let cfg = parse(&with("{ header = \"X-Api-Key\" }")).unwrap();
    assert_eq!(
        cfg.http[0].inject,
        Injection::Header {
            name: "x-api-key".into(),
            format: "{secret}".into()
        }
    );

    let cases = [
        (
            "{ header = \"Authorization\", format = \"Bearer\" }",
            "inject.format",
            Problem::SecretPlaceholder,
        ),
        (
            "{ header = \"Authorization\", format = \"{secret}{secret}\" }",
            "inject.format",
            Problem::SecretPlaceholder,
        ),
        (
            "{ header = \"A\", format = \"x\\r\\n{secret}\" }",
            "inject.format",
            Problem::InvalidCharacters,
        ),
        (
            "{ header = \"Bad Name\" }",
            "inject.header",
            Problem::InvalidHeaderName,
        ),
        (
            "{ header = \"Host\" }",
            "inject.header",
            Problem::ReservedHeader {
                name: "host".into(),
            },
        ),
        (
            "{ basic_user = \"a:b\" }",
            "inject.basic_user",
            Problem::ColonInBasicUser,
        ),
        ("{ basic_user = \"\" }", "inject.basic_user", Problem::Empty),
        ("{ query = \"\" }", "inject.query", Problem::Empty),
        (
            "{ query = \"a b\" }",
            "inject.query",
            Problem::InvalidCharacters,
        ),
        (
            "{ header = \"A\", query = \"k\" }",
            "inject",
            Problem::InjectionForm,
        ),
        (
            "{ format = \"{secret}\" }",
            "inject",
            Problem::InjectionForm,
        ),
        (
            "{ basic_user = \"svc\", format = \"{secret}\" }",
            "inject",
            Problem::InjectionForm,
        ),
        ("{ }", "inject", Problem::InjectionForm),
    ];
    for (inject, expected_field, expected) in cases {
        let (target, field, problem) = invalid(&with(inject));
        assert_eq!(target, http_ref(0, "a"));
        assert_eq!(
            (field.as_str(), problem),
            (expected_field, expected),
            "{inject}"
        );
    }
}

#[test]
fn idempotency_contract_is_validated() {
    let with = |h: &str, s: &str, r: &str| {
        http_target(
            "a",
            "https://x.test",
            &format!("[http.idempotency]\nheader = \"{h}\"\nscope = \"{s}\"\nretention = \"{r}\""),
        )
    };
    for (r, secs) in [("90s", 90), ("30m", 1800), ("24h", 86_400), ("7d", 604_800)] {
        let cfg = parse(&with("Idempotency-Key", "s", r)).unwrap();
        assert_eq!(
            cfg.http[0].idempotency.as_ref().unwrap().retention,
            Duration::from_secs(secs)
        );
    }
    for r in [
        "",
        "24",
        "h",
        "0h",
        "1.5h",
        "-1h",
        "24H",
        "1w",
        "99999999999999999999d",
    ] {
        let (_, field, problem) = invalid(&with("Idempotency-Key", "s", r));
        assert_eq!(field, "idempotency.retention");
        assert_eq!(problem, Problem::InvalidDuration { value: r.into() });
    }
    let (_, field, problem) = invalid(&with("Bad Header", "s", "1h"));
    assert_eq!(
        (field.as_str(), problem),
        ("idempotency.header", Problem::InvalidHeaderName)
    );
    let (_, field, problem) = invalid(&with("I", "", "1h"));
    assert_eq!(
        (field.as_str(), problem),
        ("idempotency.scope", Problem::Empty)
    );
}

#[test]
fn reconcile_query_is_validated() {
    let contract = "[http.idempotency]\nheader = \"I\"\nscope = \"s\"\nretention = \"1h\"\n";
    let with = |contract: &str, method: &str, path: &str, committed: &str, not_applied: &str| {
        http_target(
            "a",
            "https://x.test",
            &format!(
                "{contract}[http.reconcile]\nmethod = \"{method}\"\npath = \"{path}\"\n\
                 committed_status = {committed}\nnot_applied_status = {not_applied}"
            ),
        )
    };
    assert!(
        parse(&with(
            contract,
            "GET",
            "/p?k={idempotency_key}",
            "[200]",
            "[404]"
        ))
        .is_ok()
    );
    assert!(parse(&with("", "GET", "/status/fixed", "[200, 201]", "[]")).is_ok());

    let cases = [
        (
            with(contract, "get", "/p", "[200]", "[]"),
            "reconcile.method",
            Problem::InvalidMethod {
                value: "get".into(),
            },
        ),
        (
            with(contract, "GET", "p", "[200]", "[]"),
            "reconcile.path",
            Problem::InvalidReconcilePath,
        ),
        (
            with(contract, "GET", "/p/{other}", "[200]", "[]"),
            "reconcile.path",
            Problem::InvalidReconcilePath,
        ),
        (
            with(
                contract,
                "GET",
                "/{idempotency_key}/{idempotency_key}",
                "[200]",
                "[]",
            ),
            "reconcile.path",
            Problem::InvalidReconcilePath,
        ),
        (
            with("", "GET", "/p?k={idempotency_key}", "[200]", "[]"),
            "reconcile.path",
            Problem::PlaceholderWithoutContract,
        ),
        (
            with(contract, "GET", "/p", "[]", "[404]"),
            "reconcile.committed_status",
            Problem::Empty,
        ),
        (
            with(contract, "GET", "/p", "[200, 99]", "[]"),
            "reconcile.committed_status[1]",
            Problem::InvalidStatus { status: 99 },
        ),
        (
            with(contract, "GET", "/p", "[200]", "[600]"),
            "reconcile.not_applied_status[0]",
            Problem::InvalidStatus { status: 600 },
        ),
        (
            with(contract, "GET", "/p", "[200, 404]", "[404]"),
            "reconcile.not_applied_status",
            Problem::ConflictingStatus { status: 404 },
        ),
    ];
    for (text, expected_field, expected) in cases {
        let (target, field, problem) = invalid(&text);
        assert_eq!(target, http_ref(0, "a"));
        assert_eq!((field.as_str(), problem), (expected_field, expected));
    }
}

fn ssh_target(name: &str, extra: &str) -> String {
    format!(
        "[[ssh]]\nname = \"{name}\"\nhost = \"web.example.test\"\nuser = \"deploy\"\n\
         credential = \"key\"\napproval = \"session\"\n{extra}\n"
    )
}

#[test]
fn ssh_targets_are_validated() {
    let cfg = parse(&ssh_target("w", "")).unwrap();
    assert_eq!(cfg.ssh[0].port, 22);
    assert_eq!(cfg.ssh[0].host_key, None);

    let bad_rsa_as_ed = "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQAB";
    let cases = [
        (
            "port = 0",
            "port",
            Problem::OutOfRange { min: 1, max: 65535 },
        ),
        (
            "timeout_ms = 0",
            "timeout_ms",
            Problem::OutOfRange {
                min: 1,
                max: 600_000,
            },
        ),
        (
            "max_output_bytes = 0",
            "max_output_bytes",
            Problem::OutOfRange {
                min: 1,
                max: 64 * 1024 * 1024,
            },
        ),
        // Regression: issue 26 (item 8): 200 MB of output per stream was accepted.
        (
            "max_output_bytes = 209715200",
            "max_output_bytes",
            Problem::OutOfRange {
                min: 1,
                max: 64 * 1024 * 1024,
            },
        ),
    ];
    for (extra, expected_field, expected) in cases {
        let (target, field, problem) = invalid(&ssh_target("w", extra));
        assert_eq!(target, ssh_ref(0, "w"));
        assert_eq!((field.as_str(), problem), (expected_field, expected));
    }
    for key in [
        "",
        "ssh-ed25519",
        "ssh-dss AAAA",
        "ssh-ed25519 not!base64",
        bad_rsa_as_ed,
        "ssh-ed25519 AAAA extra",
    ] {
        let (_, field, problem) = invalid(&ssh_target("w", &format!("host_key = \"{key}\"")));
        assert_eq!(field, "host_key");
        assert!(
            matches!(problem, Problem::InvalidHostKey { .. }),
            "{key}: {problem:?}"
        );
    }
    let (_, field, problem) = invalid(&ssh_target("w", "").replace("web.example.test", "bad host"));
    assert_eq!((field.as_str(), problem), ("host", Problem::InvalidHost));
    let (_, field, problem) = invalid(&ssh_target("w", "").replace("\"deploy\"", "\"de ploy\""));
    assert_eq!(
        (field.as_str(), problem),
        ("user", Problem::InvalidCharacters)
    );
    let (_, field, problem) = invalid(&ssh_target("w", "").replace("\"key\"", "\"\""));
    assert_eq!((field.as_str(), problem), ("credential", Problem::Empty));
}

#[test]
fn ssh_host_is_normalized() {
    let cfg = parse(&ssh_target("w", "").replace("web.example.test", "WEB.Example.TEST")).unwrap();
    assert_eq!(cfg.ssh[0].host, "web.example.test");
    let cfg = parse(&ssh_target("w", "").replace("web.example.test", "[::1]")).unwrap();
    assert_eq!(cfg.ssh[0].host, "::1");
}

// ---- version digests -------------------------------------------------------------------

#[test]
fn version_is_a_blake3_digest_string() {
    let cfg = parse(&design_example()).unwrap();
    for v in [cfg.http[0].version(), cfg.ssh[0].version()] {
        let hex = v.as_str().strip_prefix("blake3:").unwrap();
        assert_eq!(hex.len(), 64);
        assert!(
            hex.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<TargetVersion>(&json).unwrap(), v);
    }
    assert!(serde_json::from_str::<TargetVersion>("\"sha256:00\"").is_err());
    assert_ne!(cfg.http[0].version(), cfg.ssh[0].version());
}

#[test]
fn reordered_keys_keep_the_target_version() {
    let original = parse(&design_example()).unwrap();
    let reordered = format!(
        r#"
# the same targets, keys shuffled, different spacing and quoting
[[ssh]]
approval="session"
host_key = '{ED25519_KEY}'
credential =   "web1-key"
user = "deploy"
port = 2222
host = "127.0.0.1"
name = "web1"

[[http]]
timeout_ms = 30_000
inject = {{ format = "Bearer {{secret}}", header = "authorization" }}
idempotent_methods = ["DELETE", "PUT", "GET", "GET"]
credential = "payments-key"
methods = ["PUT", "POST", "DELETE", "GET"]
approval = "per_call"
ca_file = "certs/ca.pem"
base_url = "https://API.example.test:443/v1/"
name = "payments"
[http.reconcile]
not_applied_status = [404]
committed_status = [200]
path = "/payments?idempotency_key={{idempotency_key}}"
method = "GET"
[http.idempotency]
retention = "1d"
scope = "payments.create"
header = "IDEMPOTENCY-KEY"
"#
    );
    let reordered = parse(&reordered).unwrap();
    assert_eq!(reordered.http[0].version(), original.http[0].version());
    assert_eq!(reordered.ssh[0].version(), original.ssh[0].version());
}

#[test]
fn explicit_defaults_keep_the_target_version() {
    let implicit = parse(&http_target("a", "https://x.test", "")).unwrap();
    let explicit = parse(&http_target(
        "a",
        "https://x.test",
        "timeout_ms = 30000\nmax_response_bytes = 10485760\nmax_request_body_bytes = 1048576\nfollow_redirects = false\nidempotent_methods = []",
    ))
    .unwrap();
    assert_eq!(implicit.http[0].version(), explicit.http[0].version());
}

#[test]
fn changing_any_http_field_changes_the_target_version() {
    let base = design_example();
    let original = parse(&base).unwrap().http[0].version();
    let edits = [
        ("name = \"payments\"", "name = \"payments2\""),
        ("https://api.example.test/v1", "https://api.example.test/v2"),
        (
            "https://api.example.test/v1",
            "https://api.example.test:8443/v1",
        ),
        (
            "methods = [\"GET\", \"POST\", \"PUT\", \"DELETE\"]",
            "methods = [\"GET\", \"PUT\", \"DELETE\"]",
        ),
        (
            "credential = \"payments-key\"",
            "credential = \"payments-key2\"",
        ),
        (
            "header = \"Authorization\", format",
            "header = \"X-Auth\", format",
        ),
        ("Bearer {secret}", "Token {secret}"),
        ("approval = \"per_call\"", "approval = \"session\""),
        ("[\"GET\", \"PUT\", \"DELETE\"]", "[\"GET\", \"PUT\"]"),
        ("certs/ca.pem", "certs/other.pem"),
        ("timeout_ms = 30000", "timeout_ms = 30001"),
        (
            "timeout_ms = 30000",
            "timeout_ms = 30000\nmax_response_bytes = 1",
        ),
        (
            "timeout_ms = 30000",
            "timeout_ms = 30000\nmax_request_body_bytes = 1",
        ),
        (
            "timeout_ms = 30000",
            "timeout_ms = 30000\nfollow_redirects = true",
        ),
        ("ca_file = \"certs/ca.pem\"\n", ""),
        ("header = \"Idempotency-Key\"", "header = \"X-Idem\""),
        ("scope = \"payments.create\"", "scope = \"payments.refund\""),
        ("retention = \"24h\"", "retention = \"23h\""),
        ("method = \"GET\"\npath", "method = \"HEAD\"\npath"),
        ("/payments?idempotency_key=", "/payments?key="),
        ("committed_status = [200]", "committed_status = [200, 201]"),
        ("not_applied_status = [404]", "not_applied_status = [410]"),
    ];
    for (from, to) in edits {
        assert!(base.contains(from), "{from}");
        let changed = parse(&base.replacen(from, to, 1)).unwrap();
        assert_ne!(changed.http[0].version(), original, "{from} -> {to}");
    }
    // Dropping the optional groups (the placeholder needs the contract, so both go).
    let cut = base.find("[http.idempotency]").unwrap();
    let end = base.find("[[ssh]]").unwrap();
    let without = format!("{}{}", &base[..cut], &base[end..]);
    assert_ne!(parse(&without).unwrap().http[0].version(), original);
    // A different injection form.
    let basic = base.replace(
        "{ header = \"Authorization\", format = \"Bearer {secret}\" }",
        "{ basic_user = \"svc\" }",
    );
    assert_ne!(parse(&basic).unwrap().http[0].version(), original);
}

#[test]
fn changing_any_ssh_field_changes_the_target_version() {
    let base = design_example();
    let original = parse(&base).unwrap().ssh[0].version();
    let edits = [
        ("name = \"web1\"", "name = \"web2\""),
        ("host = \"127.0.0.1\"", "host = \"127.0.0.2\""),
        ("port = 2222", "port = 2223"),
        ("user = \"deploy\"", "user = \"root\""),
        ("credential = \"web1-key\"", "credential = \"web2-key\""),
        ("AAAAIAABAgME", "AAAAIAABAgMF"),
        ("approval = \"session\"", "approval = \"per_call\""),
        ("port = 2222", "port = 2222\ntimeout_ms = 1"),
        ("port = 2222", "port = 2222\nmax_output_bytes = 1"),
    ];
    for (from, to) in edits {
        assert!(base.contains(from), "{from}");
        let changed = parse(&base.replacen(from, to, 1)).unwrap();
        assert_ne!(changed.ssh[0].version(), original, "{from} -> {to}");
    }
    let no_key = base.replace(&format!("host_key = \"{ED25519_KEY}\"\n"), "");
    assert_ne!(parse(&no_key).unwrap().ssh[0].version(), original);
}

// ---- resolution ------------------------------------------------------------------------

fn resolver() -> Config {
    let text = [
        http_target("root", "https://api.example.test", ""),
        http_target("v1", "https://api.example.test/v1", ""),
        http_target("v1-admin", "https://api.example.test/v1/admin/", ""),
        http_target("other-port", "https://api.example.test:8443/v1", ""),
        http_target("local", "http://127.0.0.1:8080/api", ""),
    ]
    .concat();
    parse(&text).unwrap()
}

fn resolved(cfg: &Config, url: &str) -> Option<String> {
    cfg.resolve_http(&Url::parse(url).unwrap())
        .ok()
        .map(|t| t.name.clone())
}

#[test]
fn resolution_picks_the_longest_prefix() {
    let cfg = resolver();
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1/admin/users").as_deref(),
        Some("v1-admin")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1/admin").as_deref(),
        Some("v1-admin")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1/users").as_deref(),
        Some("v1")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1").as_deref(),
        Some("v1")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test/").as_deref(),
        Some("root")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test").as_deref(),
        Some("root")
    );
}

#[test]
fn resolution_matches_prefixes_on_segment_boundaries() {
    let cfg = resolver();
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v10").as_deref(),
        Some("root")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1admin").as_deref(),
        Some("root")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1/administrator").as_deref(),
        Some("v1")
    );
    // An encoded slash is not a segment boundary (RFC 3986 §2.2).
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1%2Fadmin").as_deref(),
        Some("root")
    );
    assert_eq!(
        resolved(&cfg, "http://127.0.0.1:8080/apis").as_deref(),
        None
    );
    assert_eq!(
        resolved(&cfg, "http://127.0.0.1:8080/api/x").as_deref(),
        Some("local")
    );
}

#[test]
fn resolution_compares_scheme_host_and_effective_port() {
    let cfg = resolver();
    assert_eq!(
        resolved(&cfg, "HTTPS://API.EXAMPLE.TEST:443/v1/x").as_deref(),
        Some("v1")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test:8443/v1/x").as_deref(),
        Some("other-port")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test:8443/v2").as_deref(),
        None
    );
    assert_eq!(
        resolved(&cfg, "http://api.example.test/v1").as_deref(),
        None
    );
    assert_eq!(
        resolved(&cfg, "https://evil.example.test/v1").as_deref(),
        None
    );
    assert_eq!(resolved(&cfg, "http://localhost:8080/api").as_deref(), None);
    // Dot segments are removed before matching, so they cannot escape a prefix.
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1/admin/../x").as_deref(),
        Some("v1")
    );
    assert_eq!(
        resolved(&cfg, "https://api.example.test/v1/%2E%2E/v1/admin").as_deref(),
        Some("v1-admin")
    );
}

#[test]
fn resolution_failure_is_invalid_target() {
    let cfg = resolver();
    let err = cfg
        .resolve_http(&Url::parse("https://nowhere.test/").unwrap())
        .unwrap_err();
    assert!(matches!(err, ResolveError::NoHttpTarget { .. }));
    assert_eq!(err.code(), postern_broker::contract::Code::InvalidTarget);
}

#[test]
fn resolution_of_a_normalized_request_agrees_with_the_url() {
    let cfg = resolver();
    let req = postern_broker::action::NormalizedHttp::new(
        "GET",
        "https://api.example.test:443/v1/./admin/%7e",
        &[],
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(cfg.resolve_normalized_http(&req).unwrap().name, "v1-admin");
}

#[test]
fn identical_prefixes_are_rejected_at_load() {
    for (a, b) in [
        ("https://x.test/v1", "https://x.test/v1/"),
        ("https://x.test/v1", "https://X.TEST:443/v1"),
        ("https://x.test", "https://x.test/"),
        ("https://x.test/%7Ev1", "https://x.test/~v1"),
    ] {
        let text = format!(
            "{}{}",
            http_target("first", a, ""),
            http_target("second", b, "")
        );
        let (target, field, problem) = invalid(&text);
        assert_eq!(target, http_ref(1, "second"));
        assert_eq!(field, "base_url");
        assert_eq!(
            problem,
            Problem::SamePrefix {
                other: "first".into()
            },
            "{a} vs {b}"
        );
    }
}

#[test]
fn ssh_resolution_by_name_or_host() {
    let text = format!(
        "{}{}{}",
        ssh_target("web1", ""),
        ssh_target("web1-root", "").replace("\"deploy\"", "\"root\""),
        ssh_target("db", "").replace("web.example.test", "db.example.test"),
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(cfg.resolve_ssh("web1").unwrap().name, "web1");
    assert_eq!(cfg.resolve_ssh("web1-root").unwrap().user, "root");
    assert_eq!(cfg.resolve_ssh("DB.example.test").unwrap().name, "db");
    assert_eq!(
        cfg.resolve_ssh("web.example.test").unwrap_err(),
        ResolveError::AmbiguousSshHost {
            host: "web.example.test".into(),
            names: vec!["web1".into(), "web1-root".into()],
        }
    );
    assert!(matches!(
        cfg.resolve_ssh("other.test"),
        Err(ResolveError::NoSshTarget { .. })
    ));
}

// ---- checks `config check` used to pass -------------------------------------------------

/// A self-signed test CA (P-256), only ever parsed here.
const TEST_CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBmTCCAT+gAwIBAgIUJdlpSzQzwTnAiv1FLiMC3rJQGa4wCgYIKoZIzj0EAwIw
ITEfMB0GA1UEAwwWcG9zdGVybiBjb25maWcgdGVzdCBDQTAgFw0yNjEyMDEwMDE3
NDdaGA8yMTI2MTEwNzAwMTc0N1owITEfMB0GA1UEAwwWcG9zdGVybiBjb25maWcg
dGVzdCBDQTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABE2SUIWP/gALClwAsPBs
m1HDVv+ZJm1xZ7XDAsC6FRdD7yWuZ/QRxVRakhq2kjvWwFZrTyGujzhr+rkj61vs
1iujUzBRMB0GA1UdDgQWBBRwleLt/pU+DLnLGSDHOG9xjTn8jDAfBgNVHSMEGDAW
gBRwleLt/pU+DLnLGSDHOG9xjTn8jDAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49
BAMCA0gAMEUCIQDljsqRnJYJmNvZrA7mfhB0lQcVed4ZlfNEylWdh7h6LQIge8gA
78H26VCHaBuvEdiLVqjjcmBLM40dyxCY2dSaKig=
-----END CERTIFICATE-----
";

const IDEMPOTENCY: &str = "[http.idempotency]\nheader = \"{}\"\nscope = \"s\"\nretention = \"1h\"";

// Regression: issue 10
#[test]
fn an_idempotency_header_that_is_the_injection_header_is_refused() {
    let with = |inject: &str, header: &str| {
        http_target("pay", "https://x.test", &IDEMPOTENCY.replace("{}", header))
            .replace("{ query = \"api_key\" }", inject)
    };
    for (inject, header, name) in [
        ("{ header = \"X-Api-Key\" }", "x-api-key", "x-api-key"),
        ("{ header = \"X-Api-Key\" }", "X-API-KEY", "x-api-key"),
        (
            "{ header = \"Authorization\", format = \"Bearer {secret}\" }",
            "authorization",
            "authorization",
        ),
        // Basic travels in Authorization.
        ("{ basic_user = \"svc\" }", "Authorization", "authorization"),
    ] {
        let text = with(inject, header);
        let (target, field, problem) = invalid(&text);
        assert_eq!(target, http_ref(0, "pay"), "{inject} / {header}");
        assert_eq!(field, "idempotency.header");
        assert_eq!(
            problem,
            Problem::IdempotencyHeaderIsInjectionHeader { name: name.into() }
        );
        let message = parse(&text).unwrap_err().to_string();
        assert!(
            message.starts_with(
                "/etc/postern/config.toml: [[http]] \"pay\": field `idempotency.header`: "
            ),
            "{message}"
        );
    }
    // Different headers, or a credential in the query, are fine.
    assert!(parse(&with("{ header = \"X-Api-Key\" }", "Idempotency-Key")).is_ok());
    assert!(parse(&with("{ query = \"api_key\" }", "X-Api-Key")).is_ok());
}

// Regression: issue 10
#[test]
fn an_idempotent_method_that_is_not_an_allowed_method_is_refused() {
    let text = http_target(
        "a",
        "https://x.test",
        "idempotent_methods = [\"GET\", \"PUT\", \"DELETE\"]",
    );
    let (target, field, problem) = invalid(&text);
    assert_eq!(target, http_ref(0, "a"));
    // The position in the file, not in the sorted list.
    assert_eq!(field, "idempotent_methods[1]");
    assert_eq!(
        problem,
        Problem::NotInMethods {
            value: "PUT".into()
        }
    );
    assert!(
        parse(&text)
            .unwrap_err()
            .to_string()
            .contains("`PUT` is not listed in `methods`"),
    );
    let ok = http_target("a", "https://x.test", "idempotent_methods = [\"GET\"]");
    assert_eq!(parse(&ok).unwrap().http[0].idempotent_methods, ["GET"]);
}

/// Loads `text` as `dir/conf/targets.toml` and returns the `ca_file` problem, if any.
fn load_with_ca(dir: &Path, ca_file: &str) -> Result<Config, ConfigError> {
    let conf = dir.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let file = conf.join("targets.toml");
    let text = http_target("tls", "https://x.test", &format!("ca_file = \"{ca_file}\""));
    std::fs::write(&file, text).unwrap();
    Config::load(&file)
}

fn ca_problem(result: Result<Config, ConfigError>) -> (String, Problem) {
    match result {
        Err(ConfigError::Invalid(e)) => {
            assert_eq!(e.target, http_ref(0, "tls"));
            assert_eq!(e.field, "ca_file");
            let message = e.to_string();
            (message, e.problem)
        }
        other => panic!("expected a ca_file error, got {other:?}"),
    }
}

// Regression: issue 10
#[test]
fn a_ca_file_that_cannot_be_read_or_holds_no_certificate_is_refused_on_load() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");

    // Missing: resolved beside the config file, and the resolved path is named.
    let (message, problem) = ca_problem(load_with_ca(dir.path(), "certs/ca.pem"));
    let missing = conf.join("certs/ca.pem");
    assert!(
        matches!(&problem, Problem::UnreadableFile { path, .. } if *path == missing),
        "{problem:?}"
    );
    assert!(message.contains(missing.to_str().unwrap()), "{message}");
    assert!(message.contains("[[http]] \"tls\""), "{message}");
    assert!(message.contains("targets.toml"), "{message}");

    // A directory is not a readable file.
    std::fs::create_dir_all(conf.join("certs")).unwrap();
    let (_, problem) = ca_problem(load_with_ca(dir.path(), "certs"));
    assert!(
        matches!(problem, Problem::UnreadableFile { .. }),
        "{problem:?}"
    );

    // Readable, but nothing a TLS client could trust.
    std::fs::write(conf.join("certs/empty.pem"), "").unwrap();
    let (_, problem) = ca_problem(load_with_ca(dir.path(), "certs/empty.pem"));
    assert_eq!(
        problem,
        Problem::NoCertificate {
            path: conf.join("certs/empty.pem")
        }
    );
    std::fs::write(
        conf.join("certs/bad.pem"),
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let (_, problem) = ca_problem(load_with_ca(dir.path(), "certs/bad.pem"));
    assert!(matches!(problem, Problem::InvalidPem { .. }), "{problem:?}");

    // Relative to the config file's directory, not the working directory.
    std::fs::write(dir.path().join("ca.pem"), TEST_CA_PEM).unwrap();
    let cfg = load_with_ca(dir.path(), "../ca.pem").unwrap();
    assert_eq!(
        cfg.http[0].ca_file.as_deref(),
        Some(conf.join("../ca.pem").as_path())
    );
    // Parsing text alone never touches the file system.
    assert!(
        parse(&http_target(
            "tls",
            "https://x.test",
            "ca_file = \"absent.pem\""
        ))
        .is_ok()
    );
}

// Regression: issue 10
#[test]
fn an_ssh_target_without_a_pinned_host_key_loads_with_a_warning() {
    let pinned = parse(&design_example()).unwrap();
    assert!(pinned.warnings().is_empty());
    let unpinned = design_example().replace(&format!("host_key = \"{ED25519_KEY}\"\n"), "");
    let cfg = parse(&unpinned).unwrap();
    assert_eq!(cfg.ssh[0].host_key, None, "it still loads");
    let warnings = cfg.warnings();
    assert_eq!(
        warnings,
        [ConfigWarning {
            file: path(),
            target: ssh_ref(0, "web1"),
            field: "host_key".into(),
            caution: Caution::HostKeyNotPinned,
        }]
    );
    let text = warnings[0].to_string();
    assert!(
        text.starts_with("/etc/postern/config.toml: [[ssh]] \"web1\": field `host_key`: "),
        "{text}"
    );
    assert!(text.contains("HOST_KEY_UNKNOWN"), "{text}");
}

// Regression: issue 10
#[test]
fn broker_owned_headers_cannot_carry_the_credential_or_the_key() {
    for name in [
        "Host",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "TE",
        "Trailer",
        "Upgrade",
        "Keep-Alive",
        "Proxy-Connection",
        "Expect",
    ] {
        let lower = name.to_ascii_lowercase();
        let text = http_target("a", "https://x.test", "").replace(
            "{ query = \"api_key\" }",
            &format!("{{ header = \"{name}\" }}"),
        );
        let (_, field, problem) = invalid(&text);
        assert_eq!(field, "inject.header", "{name}");
        assert_eq!(
            problem,
            Problem::ReservedHeader {
                name: lower.clone()
            }
        );
        let text = http_target("a", "https://x.test", &IDEMPOTENCY.replace("{}", name));
        let (_, field, problem) = invalid(&text);
        assert_eq!(field, "idempotency.header", "{name}");
        assert_eq!(problem, Problem::ReservedHeader { name: lower });
    }
}

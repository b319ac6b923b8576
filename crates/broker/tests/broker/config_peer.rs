//! `[[peer]]`: a federated broker pinned by its key, what this broker exports to it, and
//! the export policy version that tells a peer the policy moved.

use std::path::Path;

use ed25519_dalek::SigningKey;
use postern_broker::config::*;
use postern_broker::transparency::note::{KeyAlg, VerifierKey};

const TARGETS: &str = r#"
[[http]]
name = "payments"
base_url = "https://api.example.test/v1"
methods = ["GET", "POST"]
credential = "k"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "per_call"

[[http]]
name = "refunds"
base_url = "https://api.example.test/refunds"
methods = ["POST"]
credential = "k"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "per_call"
"#;

fn broker_key(alg: KeyAlg) -> String {
    let key = SigningKey::from_bytes(&[5u8; 32]).verifying_key();
    VerifierKey::new("postern.local/audit/0102030405060708", alg, key)
        .unwrap()
        .encode()
}

fn peer(fields: &str) -> String {
    format!(
        "{TARGETS}\n[[peer]]\nname = \"org-a\"\nkey = \"{}\"\n{fields}\n",
        broker_key(KeyAlg::Ed25519)
    )
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/postern/config.toml"))
}

fn problem(text: &str) -> (String, Problem) {
    match parse(text) {
        Err(ConfigError::Invalid(f)) => (f.field.clone(), f.problem.clone()),
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn a_peer_is_pinned_by_its_key_and_lists_what_it_may_call() {
    let config = parse(&peer(
        "url = \"https://postern.org-a.example:8443\"\nexports = [\"refunds\", \"payments\"]",
    ))
    .unwrap();
    let p = config.peer("org-a").unwrap();
    assert_eq!(p.exports, ["payments", "refunds"]);
    assert_eq!(
        p.key.key,
        SigningKey::from_bytes(&[5u8; 32]).verifying_key()
    );
    assert_eq!(
        p.url.as_ref().map(|u| u.as_str()),
        Some("https://postern.org-a.example:8443/")
    );
    // Either direction alone is enough.
    assert!(parse(&peer("exports = [\"payments\"]")).is_ok());
    assert!(parse(&peer("url = \"http://127.0.0.1:9000\"")).is_ok());
}

#[test]
fn bad_peers_are_refused_naming_the_field() {
    let cases: Vec<(String, &str, Problem)> = vec![
        (peer(""), "url", Problem::UnusedPeer),
        (
            peer("exports = [\"nope\"]"),
            "exports[0]",
            Problem::UnknownExport {
                name: "nope".into(),
            },
        ),
        (
            peer("exports = [\"payments\", \"payments\"]"),
            "exports[1]",
            Problem::DuplicateExport {
                name: "payments".into(),
            },
        ),
        (
            peer("url = \"http://peer.example\""),
            "url",
            Problem::InvalidUrl {
                reason: "plain http is allowed only for loopback hosts".into(),
            },
        ),
        (
            peer("url = \"https://user:pw@peer.example\""),
            "url",
            Problem::InvalidUrl {
                reason: "credentials in the URL are not allowed".into(),
            },
        ),
    ];
    for (text, field, expected) in cases {
        assert_eq!(problem(&text), (field.to_string(), expected), "{text}");
    }
    let bad_name = format!(
        "{TARGETS}\n[[peer]]\nname = \"org/a\"\nkey = \"{}\"\nexports = [\"payments\"]\n",
        broker_key(KeyAlg::Ed25519)
    );
    assert_eq!(
        problem(&bad_name),
        ("name".into(), Problem::InvalidPeerName)
    );
    let witness_key = format!(
        "{TARGETS}\n[[peer]]\nname = \"org-a\"\nkey = \"{}\"\nexports = [\"payments\"]\n",
        broker_key(KeyAlg::CosignatureV1)
    );
    assert!(matches!(
        problem(&witness_key),
        (f, Problem::InvalidPeerKey { .. }) if f == "key"
    ));
    let garbage = format!(
        "{TARGETS}\n[[peer]]\nname = \"org-a\"\nkey = \"nope\"\nexports = [\"payments\"]\n"
    );
    assert!(matches!(problem(&garbage), (f, Problem::InvalidPeerKey { .. }) if f == "key"));
    let twice = format!(
        "{}\n[[peer]]\nname = \"org-a\"\nkey = \"{}\"\nexports = [\"refunds\"]\n",
        peer("exports = [\"payments\"]"),
        broker_key(KeyAlg::Ed25519)
    );
    assert!(matches!(problem(&twice), (f, Problem::DuplicateName { .. }) if f == "name"));
    let unknown_field = peer("exports = [\"payments\"]\nimports = []");
    assert!(matches!(
        parse(&unknown_field),
        Err(ConfigError::Syntax { .. })
    ));
}

#[test]
fn the_export_policy_version_moves_with_what_is_exported_and_how() {
    let version = |text: &str| parse(text).unwrap().export_policy_version("org-a").unwrap();
    let base = version(&peer("exports = [\"payments\"]"));
    assert!(base.starts_with("blake3:"), "{base}");
    // Stable: order of the list and formatting do not matter.
    assert_eq!(base, version(&peer("exports = [ \"payments\" ]")));
    assert_eq!(
        version(&peer("exports = [\"payments\", \"refunds\"]")),
        version(&peer("exports = [\"refunds\", \"payments\"]"))
    );
    // What the peer may call changes it.
    assert_ne!(
        base,
        version(&peer("exports = [\"payments\", \"refunds\"]"))
    );
    // So does a change to an exported target's configuration...
    let stricter = peer("exports = [\"payments\"]")
        .replace("methods = [\"GET\", \"POST\"]", "methods = [\"GET\"]");
    assert_ne!(base, version(&stricter));
    // ...but not a change to a target it does not export.
    let other = peer("exports = [\"payments\"]").replace(
        "base_url = \"https://api.example.test/refunds\"",
        "base_url = \"https://api.example.test/refunds2\"",
    );
    assert_eq!(base, version(&other));
    assert_eq!(
        parse(&peer("exports = [\"payments\"]"))
            .unwrap()
            .export_policy_version("org-z"),
        None
    );
}

#[test]
fn a_called_peer_defaults_to_no_local_approval_and_seed_002_budgets() {
    let config = parse(&peer("url = \"https://postern.org-a.example\"")).unwrap();
    let p = config.peer("org-a").unwrap();
    assert_eq!(
        p.approval,
        ApprovalMode::None,
        "the peer's approver decides"
    );
    assert_eq!(p.timeout, std::time::Duration::from_secs(60));
    assert_eq!(
        (p.attempts.transient_budget, p.attempts.unknown_budget),
        (5, 3)
    );
    assert_eq!(p.attempts.base_backoff_ms, 500);
}

#[test]
fn approval_timeout_and_budgets_can_be_set_and_are_range_checked() {
    let config = parse(&peer(
        "url = \"https://postern.org-a.example\"\napproval = \"per_call\"\ntimeout_ms = 2000\ntransient_retries = 9\nunknown_retries = 1\nbackoff_ms = 10\nmax_backoff_ms = 40",
    ))
    .unwrap();
    let p = config.peer("org-a").unwrap();
    assert_eq!(p.approval, ApprovalMode::PerCall);
    assert_eq!(p.timeout, std::time::Duration::from_millis(2000));
    assert_eq!(
        (p.attempts.transient_budget, p.attempts.unknown_budget),
        (9, 1)
    );
    assert_eq!(
        (p.attempts.base_backoff_ms, p.attempts.max_backoff_ms),
        (10, 40)
    );
    for (fields, field) in [
        ("timeout_ms = 0", "timeout_ms"),
        ("transient_retries = 21", "transient_retries"),
        ("unknown_retries = 99", "unknown_retries"),
        ("backoff_ms = 0", "backoff_ms"),
        ("backoff_ms = 100\nmax_backoff_ms = 50", "max_backoff_ms"),
    ] {
        let text = peer(&format!(
            "url = \"https://postern.org-a.example\"\n{fields}"
        ));
        let (got, problem) = problem(&text);
        assert_eq!(got, field, "{fields}");
        assert!(
            matches!(problem, Problem::InvalidPeerSetting { .. }),
            "{problem:?}"
        );
    }
}

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Drives the real `postern` binary: help texts, `config check`, the read-only journal
//! commands (`log`, `stats`, `audit verify`) and, when a Secret Service is reachable
//! (`DBUS_SESSION_BUS_ADDRESS` set), `vault` and a signed `audit verify`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use postern_broker::action::ConfigSnapshot;
use postern_broker::clock::{Clock, ManualClock, SystemClock};
use postern_broker::config::TargetVersion;
use postern_broker::contract::{Code, ConfidenceSource, Outcome, Phase, RemoteContract, Retry};
use postern_broker::invocation::Recorder;
use postern_broker::journal::events::{Channel, OperationFacts, ResultFacts};
use postern_broker::journal::{Journal, JournalOptions, NewInvocation, ResultToStore, Settle};
use postern_broker::vault::{CredentialId, Keychain, KeychainBackend, Vault, VersionTag};
use rusqlite::Connection;
use serde_json::Value;

const FP: &str = "blake3:00000000000000000000000000000000000000000000000000000000000000aa";

fn postern<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    postern_with_stdin(args, None)
}

fn postern_with_stdin<S: AsRef<std::ffi::OsStr>>(args: &[S], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_postern"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(bytes) = stdin {
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn all_output(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

fn dir_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A random-enough suffix for keychain service names, so parallel or earlier runs
/// never collide.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n: u64 = std::process::id() as u64 * 1_000_000_007 + nanos as u64;
    format!("{prefix}-{n:x}")
}

fn has_secret_service() -> bool {
    std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some_and(|v| !v.is_empty())
}

// ---------------------------------------------------------------------------------------
// Help
// ---------------------------------------------------------------------------------------

#[test]
fn every_subcommand_help_shows_an_example() {
    let commands: &[&[&str]] = &[
        &[],
        &["daemon"],
        &["mcp"],
        &["audit"],
        &["audit", "verify"],
        &["log"],
        &["stats"],
        &["vault"],
        &["vault", "set"],
        &["vault", "list"],
        &["vault", "rm"],
        &["config"],
        &["config", "check"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let out = postern(&args);
        assert!(out.status.success(), "{args:?}: {}", all_output(&out));
        let text = stdout(&out);
        assert!(
            text.contains("Example"),
            "{args:?} help has no example:\n{text}"
        );
        assert!(text.contains("postern "), "{args:?}:\n{text}");
    }
}

#[test]
fn vault_set_has_no_way_to_pass_the_secret_as_an_argument() {
    let help = stdout(&postern(&["vault", "set", "--help"]));
    for flag in ["--secret", "--value", "--token", "--password"] {
        assert!(!help.contains(flag), "{flag} in:\n{help}");
    }
    let out = postern(&["vault", "set", "k", "hunter2"]);
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
}

// ---------------------------------------------------------------------------------------
// config check
// ---------------------------------------------------------------------------------------

const GOOD_CONFIG: &str = r#"
[[http]]
name = "payments"
base_url = "https://api.example.test/v1"
methods = ["GET", "POST"]
credential = "payments-key"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "per_call"
idempotent_methods = ["GET"]
timeout_ms = 30000

[http.idempotency]
header = "Idempotency-Key"
scope = "payments.create"
retention = "24h"

[[ssh]]
name = "web1"
host = "127.0.0.1"
port = 2222
user = "deploy"
credential = "web1-key"
approval = "session"
"#;

#[test]
fn config_check_lists_the_targets_of_a_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("targets.toml");
    std::fs::write(&file, GOOD_CONFIG).unwrap();
    let out = postern(&["config", "check", dir_str(&file)]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let text = stdout(&out);
    assert!(text.contains("2 targets"), "{text}");
    let payments = text.lines().find(|l| l.contains("payments")).unwrap();
    assert!(
        payments.contains("https://api.example.test/v1"),
        "{payments}"
    );
    assert!(payments.contains("per_call"), "{payments}");
    let web1 = text.lines().find(|l| l.contains("web1")).unwrap();
    assert!(web1.contains("deploy@127.0.0.1:2222"), "{web1}");
    assert!(web1.contains("session"), "{web1}");
    // The version digest the broker binds into fingerprints.
    let config = postern_broker::config::Config::load(&file).unwrap();
    assert!(
        payments.contains(config.http[0].version().as_str()),
        "{payments}"
    );
    assert!(web1.contains(config.ssh[0].version().as_str()), "{web1}");
}

#[test]
fn config_check_names_file_target_and_field_of_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    let bad = GOOD_CONFIG.replace("https://api.example.test/v1", "http://api.example.test/v1");
    std::fs::write(&file, bad).unwrap();
    let out = postern(&["config", "check", dir_str(&file)]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    let err = stderr(&out);
    assert!(err.contains(dir_str(&file)), "{err}");
    assert!(err.contains("[[http]] \"payments\""), "{err}");
    assert!(err.contains("base_url"), "{err}");
    assert!(err.contains("loopback"), "{err}");
}

// Regression: issue 10
#[test]
fn config_check_warns_about_an_unpinned_host_key_and_still_passes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("targets.toml");
    std::fs::write(&file, GOOD_CONFIG).unwrap();
    let out = postern(&["config", "check", dir_str(&file)]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(stdout(&out).contains("2 targets"), "{}", stdout(&out));
    let err = stderr(&out);
    let warning = err
        .lines()
        .find(|l| l.starts_with("warning: "))
        .unwrap_or_else(|| panic!("no warning on stderr: {err}"));
    assert!(warning.contains(dir_str(&file)), "{warning}");
    assert!(warning.contains("[[ssh]] \"web1\""), "{warning}");
    assert!(warning.contains("`host_key`"), "{warning}");
    assert!(warning.contains("HOST_KEY_UNKNOWN"), "{warning}");
    assert!(
        !stdout(&out).contains("warning"),
        "warnings go to stderr only"
    );

    // Pinned: nothing to warn about.
    let pinned = GOOD_CONFIG.replace(
        "approval = \"session\"",
        "approval = \"session\"\nhost_key = \"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f\"",
    );
    std::fs::write(&file, pinned).unwrap();
    let out = postern(&["config", "check", dir_str(&file)]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

// Regression: issue 10
#[test]
fn config_check_refuses_targets_the_broker_could_not_use() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("targets.toml");
    let missing_ca = dir.path().join("certs/ca.pem");
    let cases = [
        (
            "the idempotency header is the injection header",
            GOOD_CONFIG.replace("header = \"Idempotency-Key\"", "header = \"authorization\""),
            "idempotency.header",
            "the header the credential is injected into".to_string(),
        ),
        (
            "an idempotent method that is not allowed",
            GOOD_CONFIG.replace(
                "idempotent_methods = [\"GET\"]",
                "idempotent_methods = [\"GET\", \"DELETE\"]",
            ),
            "idempotent_methods[1]",
            "`DELETE` is not listed in `methods`".to_string(),
        ),
        (
            "a ca_file that does not exist",
            GOOD_CONFIG.replace(
                "timeout_ms = 30000",
                "timeout_ms = 30000\nca_file = \"certs/ca.pem\"",
            ),
            "ca_file",
            format!("{}: cannot read", missing_ca.display()),
        ),
        (
            "the credential in a broker-owned header",
            GOOD_CONFIG.replace("header = \"Authorization\"", "header = \"Expect\""),
            "inject.header",
            "owned by the broker".to_string(),
        ),
    ];
    let total = cases.len();
    let mut wrong = Vec::new();
    for (case, text, field, detail) in cases {
        std::fs::write(&file, text).unwrap();
        let out = postern(&["config", "check", dir_str(&file)]);
        let err = stderr(&out);
        let named = err.contains(dir_str(&file))
            && err.contains("[[http]] \"payments\"")
            && err.contains(&format!("field `{field}`"))
            && err.contains(&detail);
        if out.status.code() != Some(1) || !named {
            wrong.push(format!(
                "{case}: exit {:?}: {}",
                out.status.code(),
                all_output(&out)
            ));
        }
    }
    println!(
        "config check: {}/{total} unusable targets refused",
        total - wrong.len()
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn config_check_of_a_missing_file_fails() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("none.toml");
    let out = postern(&["config", "check", dir_str(&file)]);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert!(stderr(&out).contains("none.toml"));
}

// ---------------------------------------------------------------------------------------
// Read-only journal commands
// ---------------------------------------------------------------------------------------

#[test]
fn read_only_commands_on_a_missing_data_dir_exit_2_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let commands: &[&[&str]] = &[
        &["log"],
        &["log", "--json"],
        &["stats"],
        &["audit", "verify"],
    ];
    for command in commands {
        for data_dir in [&missing, &empty] {
            let mut args = command.to_vec();
            args.extend(["--data-dir", dir_str(data_dir)]);
            let out = postern(&args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", all_output(&out));
            assert!(
                all_output(&out).contains("journal.db"),
                "{args:?}: {}",
                all_output(&out)
            );
        }
        assert!(!missing.exists(), "{command:?} created the data dir");
        assert_eq!(
            std::fs::read_dir(&empty).unwrap().count(),
            0,
            "{command:?} created a file"
        );
    }
}

#[test]
fn log_rejects_unknown_filter_values_listing_the_allowed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir_str(dir.path());
    let out = postern(&["log", "--data-dir", data, "--phase", "bogus"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for phase in Phase::ALL {
        assert!(err.contains(phase.as_str()), "{err}");
    }

    let out = postern(&["log", "--data-dir", data, "--outcome", "maybe"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for outcome in Outcome::ALL {
        assert!(err.contains(outcome.as_str()), "{err}");
    }

    let out = postern(&["log", "--data-dir", data, "--code", "NOT_A_CODE"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("REMOTE_OUTCOME_UNKNOWN"), "{err}");
    assert!(err.contains("DNS_FAILED"), "{err}");

    let out = postern(&["log", "--data-dir", data, "--since", "last tuesday"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("RFC 3339"), "{}", stderr(&out));
}

fn open_journal(db: &Path, clock: &ManualClock, key: ed25519_dalek::SigningKey) -> Journal {
    Journal::open(db, JournalOptions::new(Arc::new(clock.clone()), key)).unwrap()
}

fn accept(journal: &Journal, id: &str, target: &str, session: Option<&str>) -> Recorder {
    Recorder::accept(
        journal,
        NewInvocation {
            invocation_id: id.into(),
            channel: Channel::Http,
            target: target.into(),
            summary: format!("POST https://{target}.example.test/v1/{id}"),
            session: session.map(str::to_string),
            idempotency_key: None,
            parent: None,
        },
    )
    .unwrap()
}

/// Preflight, credential and attempt 1's lease.
fn make_ready(rec: &mut Recorder, target: &str) {
    rec.preflight(
        FP,
        ConfigSnapshot {
            target_id: target.into(),
            target_version: TargetVersion::from_digest([3u8; 32]),
            credential_id: "payments-key".into(),
            credential_version: "v1-abcdef01".into(),
            injection_mode: "header:authorization".into(),
            idempotency_key: None,
        },
        OperationFacts {
            idempotent: false,
            remote_contract: RemoteContract::None,
            idempotency: None,
            reconcile_configured: false,
            source_query: None,
            batch: None,
            retry_budget: 1,
            peer: None,
        },
    )
    .unwrap();
    rec.credential_authorized("payments-key", "v1-abcdef01")
        .unwrap();
    rec.start_attempt("cli-test", 60_000).unwrap();
}

/// Three invocations, an hour apart, the last one accepted now:
/// `inv_done` (payments, s-1, committed), `inv_dns` (search, s-2, DNS failure before
/// dispatch) and `inv_unknown` (payments, s-1, dispatched without a response).
fn populate(journal: &Journal, clock: &ManualClock) {
    let mut rec = accept(journal, "inv_done", "payments", Some("s-1"));
    make_ready(&mut rec, "payments");
    rec.dispatch_started(FP, Some("conn-1".into()), None)
        .unwrap();
    rec.request_sent(true, true).unwrap();
    rec.response_started(Some(201), None).unwrap();
    rec.response_complete("blake3:response").unwrap();
    rec.commit_result(
        ResultToStore {
            meta: serde_json::json!({"status": 201}),
            streams: vec![("body".into(), b"created".to_vec())],
        },
        Settle {
            outcome: Outcome::Committed,
            code: None,
            retry: Retry::Never,
            facts: ResultFacts {
                http_status: Some(201),
                ..Default::default()
            },
            confidence: ConfidenceSource::RemoteResponse,
            redactions: 0,
        },
    )
    .unwrap();
    rec.delivered().unwrap();
    clock.advance_ms(3_600_000);

    let mut rec = accept(journal, "inv_dns", "search", Some("s-2"));
    make_ready(&mut rec, "search");
    rec.fail(
        Phase::ConnectionSetup,
        Code::DnsFailed,
        Retry::Backoff,
        "search.example.test does not resolve",
    )
    .unwrap();
    clock.advance_ms(3_600_000);

    let mut rec = accept(journal, "inv_unknown", "payments", Some("s-1"));
    make_ready(&mut rec, "payments");
    rec.dispatch_started(FP, None, None).unwrap();
    rec.request_sent(true, true).unwrap();
}

/// A closed journal in a fresh data dir, with times ending now.
fn journal_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let now = SystemClock.now_ms();
    let clock = ManualClock::new(now - 2 * 3_600_000);
    let journal = open_journal(
        &dir.path().join("journal.db"),
        &clock,
        ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]),
    );
    populate(&journal, &clock);
    journal.close().unwrap();
    dir
}

fn json_lines(o: &Output) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn log_json_prints_one_object_per_invocation_newest_first() {
    let dir = journal_dir();
    let data = dir_str(dir.path());
    let out = postern(&["log", "--data-dir", data, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let rows = json_lines(&out);
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["inv_unknown", "inv_dns", "inv_done"]);

    let unknown = &rows[0];
    assert_eq!(unknown["phase"], "remote_execution");
    assert_eq!(unknown["outcome"], "unknown");
    assert_eq!(unknown["code"], "REMOTE_OUTCOME_UNKNOWN");
    assert_eq!(unknown["session"], "s-1");
    assert_eq!(unknown["target"], "payments");
    assert_eq!(
        unknown["summary"],
        "POST https://payments.example.test/v1/inv_unknown"
    );
    assert!(unknown["retry"].is_string());
    assert!(unknown["accepted_at_ms"].is_i64());
    assert!(unknown["accepted_at"].as_str().unwrap().ends_with('Z'));

    let dns = &rows[1];
    assert_eq!(dns["phase"], "connection_setup");
    assert_eq!(dns["outcome"], "not_attempted");
    assert_eq!(dns["retry"], "backoff");
    assert_eq!(dns["code"], "DNS_FAILED");

    let done = &rows[2];
    assert_eq!(done["outcome"], "committed");
    assert_eq!(done["code"], Value::Null);
}

#[test]
fn log_filters_and_limits() {
    let dir = journal_dir();
    let data = dir_str(dir.path());
    let ids = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["log", "--data-dir", data, "--json"];
        args.extend(extra);
        let out = postern(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{extra:?}: {}",
            all_output(&out)
        );
        json_lines(&out)
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&["--session", "s-1"]), ["inv_unknown", "inv_done"]);
    assert_eq!(ids(&["--target", "search"]), ["inv_dns"]);
    assert_eq!(ids(&["--outcome", "unknown"]), ["inv_unknown"]);
    assert_eq!(ids(&["--phase", "connection_setup"]), ["inv_dns"]);
    assert_eq!(ids(&["--code", "DNS_FAILED"]), ["inv_dns"]);
    assert_eq!(ids(&["--code", "dns_failed"]), ["inv_dns"]);
    assert_eq!(ids(&["--limit", "1"]), ["inv_unknown"]);
    assert_eq!(
        ids(&["--outcome", "committed", "--limit", "1"]),
        ["inv_done"]
    );
    // Relative: the last 90 minutes hold the two newest.
    assert_eq!(ids(&["--since", "90m"]), ["inv_unknown", "inv_dns"]);
    assert_eq!(ids(&["--since", "3h"]).len(), 3);
    // Absolute: a time after everything.
    assert!(ids(&["--since", "2999-01-01T00:00:00Z"]).is_empty());
}

#[test]
fn log_text_is_a_table() {
    let dir = journal_dir();
    let out = postern(&["log", "--data-dir", dir_str(dir.path())]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    for column in [
        "ID", "ACCEPTED", "SESSION", "TARGET", "PHASE", "OUTCOME", "RETRY", "CODE",
    ] {
        assert!(header.contains(column), "{header}");
    }
    let first = lines.next().unwrap();
    assert!(first.starts_with("inv_unknown"), "{text}");
    assert!(first.contains("REMOTE_OUTCOME_UNKNOWN"), "{first}");
    assert!(text.contains("DNS_FAILED"));
}

#[test]
fn log_and_stats_do_not_modify_the_journal() {
    let dir = journal_dir();
    let db = dir.path().join("journal.db");
    let before = std::fs::read(&db).unwrap();
    let data = dir_str(dir.path());
    assert!(postern(&["log", "--data-dir", data]).status.success());
    assert!(postern(&["stats", "--data-dir", data]).status.success());
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn stats_keep_phase_and_outcome_separate() {
    let dir = journal_dir();
    let data = dir_str(dir.path());
    let out = postern(&["stats", "--data-dir", data, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let stats: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(stats["invocations"], 3);
    // A committed result stays in remote_execution: the phase is where the broker
    // stopped, the outcome what it knows. Counted apart, neither hides the other.
    assert_eq!(stats["by_phase"]["result_delivery"], 0);
    assert_eq!(stats["by_phase"]["connection_setup"], 1);
    assert_eq!(stats["by_phase"]["remote_execution"], 2);
    assert_eq!(stats["by_phase"]["validation"], 0);
    assert_eq!(stats["by_outcome"]["committed"], 1);
    assert_eq!(stats["by_outcome"]["not_attempted"], 1);
    assert_eq!(stats["by_outcome"]["unknown"], 1);
    assert_eq!(stats["by_outcome"]["rejected"], 0);
    assert_eq!(stats["by_code"]["DNS_FAILED"], 1);
    assert_eq!(stats["by_code"]["REMOTE_OUTCOME_UNKNOWN"], 1);

    let out = postern(&["stats", "--data-dir", data]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    // Two separate tables, each listing every value.
    let phase_at = text.find("PHASE").unwrap();
    let outcome_at = text.find("OUTCOME").unwrap();
    assert!(phase_at < outcome_at, "{text}");
    let phase_table = &text[phase_at..outcome_at];
    let outcome_table = &text[outcome_at..];
    for phase in Phase::ALL {
        assert!(phase_table.contains(phase.as_str()), "{text}");
    }
    for outcome in Outcome::ALL {
        assert!(!phase_table.contains(&format!("\n{} ", outcome.as_str())));
        assert!(outcome_table.contains(outcome.as_str()), "{text}");
    }
    assert!(text.contains("invocations: 3"), "{text}");
    assert!(text.contains("DNS_FAILED"), "{text}");
}

#[test]
fn audit_verify_without_a_recorded_key_exits_2_and_creates_none() {
    let dir = journal_dir();
    let data = dir_str(dir.path());
    let db = dir.path().join("journal.db");
    let before = std::fs::read(&db).unwrap();
    // Even a keychain service that does not exist is never reached: the metadata says
    // there is no key.
    let service = unique("postern-test");
    let out = postern(&[
        "audit",
        "verify",
        "--data-dir",
        data,
        "--keychain-service",
        &service,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
    assert!(
        stderr(&out).contains("postern-audit-signing"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "the journal was written"
    );

    let out = postern(&["audit", "verify", "--data-dir", data, "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["ok"], false);
}

// ---------------------------------------------------------------------------------------
// With a Secret Service: vault and signed audit verification
// ---------------------------------------------------------------------------------------

/// Removes what a test stored under its keychain service, even if it fails midway.
struct Cleanup {
    data_dir: PathBuf,
    service: String,
    ids: Vec<&'static str>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let db = self.data_dir.join("journal.db");
        let Ok(keychain) = Keychain::new(KeychainBackend::SecretService, &self.service) else {
            return;
        };
        let Ok(vault) = Vault::open(keychain, &db) else {
            return;
        };
        for id in &self.ids {
            let _ = vault.remove(id);
        }
    }
}

#[test]
fn vault_set_list_rotate_and_remove() {
    if !has_secret_service() {
        eprintln!("skipped: no DBUS_SESSION_BUS_ADDRESS (no Secret Service)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let data = dir_str(&data_dir);
    let service = unique("postern-test");
    let _cleanup = Cleanup {
        data_dir: data_dir.clone(),
        service: service.clone(),
        ids: vec!["payments-key"],
    };
    let with = |args: &[&'static str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--data-dir".into(), data.to_string()]);
        all.extend(["--keychain-service".into(), service.clone()]);
        all
    };

    let secret = "s3cr3t-Zq8w-token";
    let out = postern_with_stdin(
        &with(&["vault", "set", "payments-key"]),
        Some(format!("{secret}\n").as_bytes()),
    );
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let text = all_output(&out);
    assert!(!text.contains(secret), "the secret was printed: {text}");
    assert!(
        text.contains("payments-key") && text.contains("token"),
        "{text}"
    );
    let v1 = text
        .split_whitespace()
        .find(|w| w.starts_with("v1-"))
        .unwrap_or_else(|| panic!("no version tag in {text}"))
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();

    // Exactly one trailing newline was stripped.
    let keychain = Keychain::new(KeychainBackend::SecretService, &service).unwrap();
    let stored = keychain
        .get(
            &CredentialId::new("payments-key").unwrap(),
            &VersionTag::parse(&v1).unwrap(),
        )
        .unwrap();
    assert_eq!(stored.expose(), secret.as_bytes());

    let out = postern(&with(&["vault", "list"]));
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let listing = stdout(&out);
    let row = listing
        .lines()
        .find(|l| l.starts_with("payments-key"))
        .unwrap();
    assert!(
        row.contains(&v1) && row.contains("token") && row.contains("never"),
        "{row}"
    );
    assert!(!all_output(&out).contains(secret));

    // Rotation: a new version tag, and the listing follows.
    let out = postern_with_stdin(
        &with(&["vault", "set", "payments-key"]),
        Some(b"second-secret"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(!all_output(&out).contains("second-secret"));
    let out = postern(&with(&["vault", "list", "--json"]));
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1);
    let v2 = rows[0]["version"].as_str().unwrap();
    assert!(v2.starts_with("v2-"), "{v2}");
    assert_ne!(v2, v1);
    assert_eq!(rows[0]["kind"], "token");

    // A kind change is refused, not silently applied.
    let out = postern_with_stdin(
        &with(&["vault", "set", "payments-key", "--kind", "ssh_key"]),
        Some(b"key"),
    );
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));

    let out = postern(&with(&["vault", "rm", "payments-key"]));
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let out = postern(&with(&["vault", "list", "--json"]));
    assert!(json_lines(&out).is_empty());
    let out = postern(&with(&["vault", "rm", "payments-key"]));
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
}

#[test]
fn vault_set_from_file_and_empty_secret() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let data = dir_str(&data_dir);
    // Empty stdin is refused before anything is touched, keychain or disk.
    let out = postern_with_stdin(&["vault", "set", "k", "--data-dir", data], Some(b"\n"));
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert!(!data_dir.exists());

    if !has_secret_service() {
        eprintln!("skipped the keychain part: no DBUS_SESSION_BUS_ADDRESS");
        return;
    }
    let service = unique("postern-test");
    let _cleanup = Cleanup {
        data_dir: data_dir.clone(),
        service: service.clone(),
        ids: vec!["web1-key"],
    };
    let key_file = dir.path().join("id_test");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
        .arg(&key_file)
        .status()
        .unwrap();
    assert!(made.success());
    let key = std::fs::read_to_string(&key_file).unwrap();
    let body = key.lines().nth(1).unwrap().to_string();
    let out = postern(&[
        "vault",
        "set",
        "web1-key",
        "--kind",
        "ssh_key",
        "--from-file",
        dir_str(&key_file),
        "--data-dir",
        data,
        "--keychain-service",
        &service,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(
        !all_output(&out).contains(&body),
        "the private key is never printed"
    );
    let out = postern(&[
        "vault",
        "list",
        "--data-dir",
        data,
        "--keychain-service",
        &service,
    ]);
    let row = stdout(&out);
    let row = row.lines().find(|l| l.starts_with("web1-key")).unwrap();
    assert!(row.contains("ssh_key") && row.contains("v1-"), "{row}");
}

/// A journal of the usual invocations, signed with an audit key kept in a keychain
/// service of its own (removed with the returned cleanup).
fn signed_journal() -> (tempfile::TempDir, String, Cleanup) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("journal.db");
    let service = unique("postern-test");
    let cleanup = Cleanup {
        data_dir: dir.path().to_path_buf(),
        service: service.clone(),
        ids: vec![postern_broker::audit::AUDIT_KEY_ID],
    };
    let now = SystemClock.now_ms();
    let key = {
        let vault = Vault::open(
            Keychain::new(KeychainBackend::SecretService, &service).unwrap(),
            &db,
        )
        .unwrap();
        postern_broker::audit::signing_key_from_vault(&vault, now).unwrap()
    };
    let clock = ManualClock::new(now - 2 * 3_600_000);
    let journal = open_journal(&db, &clock, key);
    populate(&journal, &clock);
    journal.close().unwrap();
    (dir, service, cleanup)
}

#[test]
fn audit_verify_passes_then_reports_the_tampered_sequence() {
    if !has_secret_service() {
        eprintln!("skipped: no DBUS_SESSION_BUS_ADDRESS (no Secret Service)");
        return;
    }
    let (dir, service, _cleanup) = signed_journal();
    let db = dir.path().join("journal.db");

    let data = dir_str(dir.path());
    let verify = |json: bool| {
        let mut args = vec![
            "audit",
            "verify",
            "--data-dir",
            data,
            "--keychain-service",
            &service,
        ];
        if json {
            args.push("--json");
        }
        postern(&args)
    };
    let out = verify(false);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let events: i64 = Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "verified: {events} events, through sequence {events}, every one signed"
        )),
        "{text}"
    );
    let report: Value = serde_json::from_str(stdout(&verify(true)).trim()).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["events"], events);

    // Alter one recorded event: inv_dns's acceptance, mid-chain.
    let conn = Connection::open(&db).unwrap();
    let seq: i64 = conn
        .query_row(
            "SELECT min(seq) FROM events WHERE invocation_id = 'inv_dns'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(seq > 1 && seq < events);
    let changed = conn
        .execute(
            "UPDATE events SET body = replace(body, 'search', 'sEarch') WHERE seq = ?1",
            [seq],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);

    let out = verify(false);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert!(
        stdout(&out).contains(&format!("audit FAILED at sequence {seq}: hash_mismatch")),
        "{}",
        all_output(&out)
    );
    let out = verify(true);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["first_bad_seq"], seq);
    assert_eq!(report["kind"], "hash_mismatch");

    // The wrong keychain service is "cannot verify", never "verified" and never a new key.
    let out = postern(&[
        "audit",
        "verify",
        "--data-dir",
        data,
        "--keychain-service",
        &unique("postern-test-other"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
}

#[test]
fn audit_verify_with_the_public_key_alone_needs_no_keychain_and_still_catches_a_rewrite() {
    if !has_secret_service() {
        eprintln!("skipped: no DBUS_SESSION_BUS_ADDRESS (no Secret Service)");
        return;
    }
    let (dir, service, _cleanup) = signed_journal();
    let db = dir.path().join("journal.db");
    let printed = postern(&[
        "audit",
        "key",
        "--data-dir",
        dir_str(dir.path()),
        "--keychain-service",
        &service,
        "--json",
    ]);
    let vkey = serde_json::from_str::<Value>(stdout(&printed).trim()).unwrap()["key"]
        .as_str()
        .unwrap()
        .to_string();

    // A copy of the journal elsewhere, checked with no keychain reachable at all.
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(&db, copy.path().join("journal.db")).unwrap();
    let verify = |key: &str| {
        Command::new(env!("CARGO_BIN_EXE_postern"))
            .args(["audit", "verify", "--data-dir"])
            .arg(copy.path())
            .args(["--key", key])
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env("XDG_STATE_HOME", copy.path().join("state"))
            .output()
            .unwrap()
    };
    let out = verify(&vkey);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(
        stdout(&out).contains("every one signed"),
        "{}",
        all_output(&out)
    );
    assert!(
        stdout(&out).contains(
            "assurance: checked against the public key given; how its private half is kept \
             is not known here; no witness's cosignature was checked"
        ),
        "{}",
        all_output(&out)
    );

    // A key for another journal is refused by its name.
    let other = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]).verifying_key();
    let foreign = postern_broker::transparency::note::VerifierKey::new(
        &postern_broker::audit::log_origin(&other),
        postern_broker::transparency::note::KeyAlg::Ed25519,
        other,
    )
    .unwrap()
    .encode();
    let out = verify(&foreign);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    // A verifier key whose name is not its own journal's: refused before reading.
    let renamed = vkey.replacen(vkey.split('+').next().unwrap(), "someone.else/log", 1);
    let out = verify(&renamed);
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));

    // The copy rewritten: the public key alone finds it.
    let conn = Connection::open(copy.path().join("journal.db")).unwrap();
    let changed = conn
        .execute(
            "UPDATE events SET body = replace(body, 'search', 'sEarch') WHERE seq = \
             (SELECT min(seq) FROM events WHERE invocation_id = 'inv_dns')",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);
    let out = verify(&vkey);
    assert_eq!(out.status.code(), Some(1), "{}", all_output(&out));
    assert!(
        stdout(&out).contains("audit FAILED"),
        "{}",
        all_output(&out)
    );
}

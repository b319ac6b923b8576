//! The console's commands through Tauri's mock runtime, over a real broker (journal on
//! disk, credentials in the test session's gnome-keyring, HTTP against the adversarial
//! test server on 127.0.0.1). Each test has its own data dir and keychain service.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{INVOKE_KEY, MockRuntime, mock_builder, mock_context, noop_assets};
use tauri::webview::InvokeRequest;
use tauri::{App, WebviewWindow, WebviewWindowBuilder};

use postern_broker::channel::http::{HttpOutcome, HttpRequest};
use postern_broker::contract::{Code, Outcome, Retry};
use postern_broker::invocation::CallContext;
use postern_broker::provenance::{self, SessionOpened};
use postern_desktop::app::{Args, start, with_console};
use postern_desktop::console::Console;
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::files_containing;
use postern_tests::fixture::test_service;

const CANARY: &str = "canary-console-secret-7f3a9c";

struct Fixture {
    dir: tempfile::TempDir,
    console: Arc<Console>,
    _app: App<MockRuntime>,
    main: WebviewWindow<MockRuntime>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // The keychain entries live in the test session's throwaway keyring, under this
        // test's own service name; remove what the test stored anyway.
        for c in self.console.credentials().unwrap_or_default() {
            let _ = self.console.remove_credential(&c.id);
        }
    }
}

impl Fixture {
    fn invoke_from(
        &self,
        window: &WebviewWindow<MockRuntime>,
        cmd: &str,
        args: Value,
    ) -> Result<Value, Value> {
        tauri::test::get_ipc_response(
            window,
            // The app's one command carries every operator command.
            InvokeRequest {
                cmd: "operator".into(),
                callback: CallbackFn(0),
                error: CallbackFn(1),
                url: "tauri://localhost".parse().unwrap(),
                body: InvokeBody::Json(json!({"request": {"command": cmd, "args": args}})),
                headers: Default::default(),
                invoke_key: INVOKE_KEY.to_string(),
            },
        )
        .map(|b| b.deserialize::<Value>().unwrap())
    }

    fn invoke(&self, cmd: &str, args: Value) -> Result<Value, Value> {
        self.invoke_from(&self.main, cmd, args)
    }

    fn ok(&self, cmd: &str, args: Value) -> Value {
        self.invoke(cmd, args)
            .unwrap_or_else(|e| panic!("{cmd} failed: {e}"))
    }

    fn config_path(&self) -> std::path::PathBuf {
        self.dir.path().join("postern.toml")
    }

    /// An agent's HTTP call through the broker, as an MCP session would make it.
    fn call(&self, request: HttpRequest) -> tauri::async_runtime::JoinHandle<HttpOutcome> {
        let broker = self.console.engine.clone();
        let approver = self.console.approvals.clone();
        tauri::async_runtime::spawn(async move {
            let ctx = CallContext {
                session: Some("sess_test_1".into()),
                approver: Some(approver),
                ..Default::default()
            };
            broker.http().execute(request, &ctx).await
        })
    }

    /// Answers `card` through `answer_approval` with the fingerprint it shows.
    fn answer(&self, card: &Value, decision: &str) -> Value {
        self.ok(
            "answer_approval",
            json!({"invocationId": card["invocation_id"], "fingerprint": card["fingerprint"], "cardDigest": card["card_digest"], "decision": decision}),
        )
    }

    /// Waits for one pending card through `list_approvals`.
    fn card(&self) -> Value {
        for _ in 0..300 {
            let cards = self.ok("list_approvals", json!({}));
            if let Some(card) = cards.as_array().and_then(|c| c.first()) {
                return card.clone();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no approval card appeared");
    }
}

fn target(base_url: &str, approval: &str, extra: &str) -> String {
    format!(
        r#"[[http]]
name = "api"
base_url = "{base_url}/v1"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "{approval}"
{extra}
"#
    )
}

fn fixture(config: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("postern.toml"), config).unwrap();
    fixture_in(dir, &test_service())
}

/// A console over the data dir `dir` (its targets file already written) and the
/// keychain service `service`: a second call over the same pair is a restart.
fn fixture_in(dir: tempfile::TempDir, service: &str) -> Fixture {
    let started = start(&Args::in_dir(dir.path(), service)).unwrap();
    let console = started.console;
    let app = with_console(mock_builder(), console.clone())
        .build(mock_context(noop_assets()))
        .unwrap();
    let main = WebviewWindowBuilder::new(&app, "main", Default::default())
        .build()
        .unwrap();
    Fixture {
        dir,
        console,
        _app: app,
        main,
    }
}

fn server(behavior: Behavior) -> Adversary {
    tauri::async_runtime::block_on(Adversary::start(behavior)).unwrap()
}

fn store_key(f: &Fixture) {
    f.ok(
        "set_credential",
        json!({"credential": {"id": "api-key", "kind": "token", "secret": CANARY, "passphrase": null}}),
    );
}

/// No file under `dir` holds the canary.
fn assert_canary_absent(dir: &Path) {
    let leaked = files_containing(dir, CANARY.as_bytes());
    assert!(leaked.is_empty(), "the secret leaked into {leaked:?}");
}

#[test]
fn an_empty_vault_opens_to_onboarding_and_a_stored_secret_never_comes_back() {
    let f = fixture("");
    let overview = f.ok("overview", json!({}));
    assert_eq!(overview["vault_empty"], true);
    assert_eq!(overview["targets"], 0);

    let stored = f.ok(
        "set_credential",
        json!({"credential": {"id": "api-key", "kind": "token", "secret": CANARY, "passphrase": null}}),
    );
    assert_eq!(stored["id"], "api-key");
    assert_eq!(stored["kind"], "token");
    let first_version = stored["version"].as_str().unwrap().to_string();
    assert!(!stored.to_string().contains(CANARY));

    let overview = f.ok("overview", json!({}));
    assert_eq!(overview["vault_empty"], false);
    let listed = f.ok("list_credentials", json!({}));
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert!(!listed.to_string().contains(CANARY));

    // Rotation is a new version; the old value is never returned either.
    let rotated = f.ok(
        "set_credential",
        json!({"credential": {"id": "api-key", "kind": "token", "secret": "another-value", "passphrase": null}}),
    );
    assert_ne!(rotated["version"].as_str().unwrap(), first_version);
    assert!(rotated["rotated_at_ms"].is_number());
    assert_canary_absent(f.dir.path());

    f.ok("remove_credential", json!({"id": "api-key"}));
    assert_eq!(f.ok("overview", json!({}))["vault_empty"], true);
}

#[test]
fn bad_credential_input_is_a_typed_error_naming_the_field() {
    let f = fixture("");
    for (kind, secret, field) in [
        ("token", "", "secret"),
        ("cookie", "x", "kind"),
        ("ssh_key", "not a key", "secret"),
    ] {
        let err = f
            .invoke(
                "set_credential",
                json!({"credential": {"id": "k", "kind": kind, "secret": secret, "passphrase": null}}),
            )
            .unwrap_err();
        assert_eq!(err["code"], "INVALID_INPUT", "{kind}: {err}");
        assert_eq!(err["field"], field, "{kind}: {err}");
    }
    let audit_key = f
        .invoke(
            "remove_credential",
            json!({"id": postern_broker::audit::AUDIT_KEY_ID}),
        )
        .unwrap_err();
    assert_eq!(audit_key["field"], "id");
    assert!(
        f.ok("list_credentials", json!({}))
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn approving_a_card_sends_exactly_that_fingerprint() {
    let srv = server(Behavior::ok_json("{\"ok\":true}"));
    let f = fixture(&target(&srv.base_url(), "per_call", ""));
    store_key(&f);
    let call = f.call(HttpRequest {
        url: srv.url("/v1/items"),
        method: "POST".into(),
        body: b"{\"amount\":5}\x1b[2J\xe2\x80\xae".to_vec(),
        ..Default::default()
    });
    let card = f.card();
    assert_eq!(card["target"], "api");
    assert_eq!(card["method"], "POST");
    assert_eq!(card["credential_id"], "api-key");
    assert_eq!(card["mode"], "per_call");
    assert_eq!(card["injection_mode"], "header:authorization");
    // Control and bidi characters are shown escaped, never raw.
    let body = card["body"]["text"].as_str().unwrap();
    assert_eq!(body, "{\"amount\":5}\\x1b[2J\\u{202e}");
    assert_eq!(card["body"]["size"], 19);
    assert!(card["expires_at_ms"].as_i64() > card["requested_at_ms"].as_i64());
    assert_eq!(srv.requests().len(), 0, "nothing is sent before the answer");

    f.answer(&card, "approve");
    let out = tauri::async_runtime::block_on(call).unwrap();
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");
    assert_eq!(srv.requests().len(), 1);
    assert!(
        f.ok("list_approvals", json!({}))
            .as_array()
            .unwrap()
            .is_empty()
    );
    let detail = f.ok(
        "invocation_detail",
        json!({"invocationId": out.invocation_id}),
    );
    let kinds: Vec<&str> = detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"APPROVAL_GRANTED") && kinds.contains(&"RESULT_COMMITTED"));
    assert_canary_absent(f.dir.path());
}

#[test]
fn denying_a_card_stops_the_request_for_good() {
    let srv = server(Behavior::ok_json("{}"));
    let f = fixture(&target(&srv.base_url(), "per_call", ""));
    store_key(&f);
    let call = f.call(HttpRequest {
        url: srv.url("/v1/items"),
        method: "GET".into(),
        ..Default::default()
    });
    let card = f.card();
    f.answer(&card, "deny");
    let out = tauri::async_runtime::block_on(call).unwrap();
    let env = out.error.unwrap();
    assert_eq!(
        (env.error.code, env.error.retry, env.error.outcome),
        (Code::ApprovalDenied, Retry::Never, Outcome::NotAttempted)
    );
    assert!(srv.requests().is_empty());
    // A second answer for the same card is refused: it is no longer pending.
    let again = f
        .invoke(
            "answer_approval",
            json!({"invocationId": card["invocation_id"], "fingerprint": card["fingerprint"], "cardDigest": card["card_digest"], "decision": "approve"}),
        )
        .unwrap_err();
    assert_eq!(again["code"], "NOT_PENDING");
}

#[test]
fn a_target_edited_under_a_pending_card_is_refused_as_a_fingerprint_mismatch() {
    let srv = server(Behavior::ok_json("{}"));
    let f = fixture(&target(&srv.base_url(), "per_call", ""));
    store_key(&f);
    let call = f.call(HttpRequest {
        url: srv.url("/v1/items"),
        method: "GET".into(),
        ..Default::default()
    });
    let card = f.card();
    let targets = f.ok("list_targets", json!({}));
    let api = &targets["targets"][0];
    let old_version = api["version"].as_str().unwrap().to_string();
    let edited = api["toml"]
        .as_str()
        .unwrap()
        .replace("methods = [\"GET\", \"POST\"]", "methods = [\"GET\"]");
    let saved = f.ok(
        "update_target",
        json!({"edit": {"name": "api", "toml": edited}}),
    );
    assert_ne!(saved["version"].as_str().unwrap(), old_version);
    assert!(
        std::fs::read_to_string(f.config_path())
            .unwrap()
            .contains("methods = [\"GET\"]")
    );

    f.answer(&card, "approve");
    let out = tauri::async_runtime::block_on(call).unwrap();
    let env = out.error.unwrap();
    assert_eq!(env.error.code, Code::FingerprintMismatch, "{env:?}");
    assert_eq!(env.error.outcome, Outcome::NotAttempted);
    assert!(srv.requests().is_empty());
}

#[test]
fn an_invalid_target_edit_leaves_the_file_byte_for_byte_unchanged() {
    let f = fixture(&target("http://127.0.0.1:9", "none", ""));
    let before = std::fs::read(f.config_path()).unwrap();
    for (toml, why) in [
        (
            "[[http]]\nname = \"api\"\nbase_url = \"not a url\"\n",
            "invalid url",
        ),
        ("[[http]\nname = ", "syntax"),
        ("[[http]]\nname = \"other\"\n", "rename"),
        (
            "[[http]]\nname = \"api\"\n[[ssh]]\nname = \"x\"\n",
            "two tables",
        ),
    ] {
        let err = f
            .invoke(
                "update_target",
                json!({"edit": {"name": "api", "toml": toml}}),
            )
            .unwrap_err();
        assert_eq!(err["code"], "CONFIG_INVALID", "{why}: {err}");
        assert_eq!(err["field"], "toml");
        assert_eq!(std::fs::read(f.config_path()).unwrap(), before, "{why}");
    }
}

#[test]
fn activity_pages_by_keyset_and_filters_on_the_server() {
    let srv = server(Behavior::ok_json("{}"));
    let f = fixture(&target(
        &srv.base_url(),
        "none",
        "idempotent_methods = [\"GET\"]",
    ));
    store_key(&f);
    for i in 0..7 {
        let out = tauri::async_runtime::block_on(f.call(HttpRequest {
            url: srv.url(&format!("/v1/items/{i}")),
            method: "GET".into(),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(out.outcome, Outcome::Committed);
    }
    // One refused before anything was sent.
    let refused = tauri::async_runtime::block_on(f.call(HttpRequest {
        url: "http://127.0.0.1:1/elsewhere".into(),
        method: "GET".into(),
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(refused.outcome, Outcome::NotAttempted);

    let first = f.ok(
        "query_activity",
        json!({"filter": {}, "beforeSeq": null, "limit": 3}),
    );
    let rows = first["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["outcome"], "not_attempted", "newest first");
    let next = first["next_before_seq"].as_i64().unwrap();
    let second = f.ok(
        "query_activity",
        json!({"filter": {}, "beforeSeq": next, "limit": 3}),
    );
    let second_rows = second["rows"].as_array().unwrap();
    assert_eq!(second_rows.len(), 3);
    assert!(second_rows[0]["accepted_seq"].as_i64().unwrap() < next);

    let text = f.ok(
        "query_activity",
        json!({"filter": {"text": "items/4"}, "beforeSeq": null, "limit": 50}),
    );
    assert_eq!(text["rows"].as_array().unwrap().len(), 1);
    assert_eq!(text["next_before_seq"], Value::Null);
    let committed = f.ok(
        "query_activity",
        json!({"filter": {"outcome": "committed", "target": "api"}, "beforeSeq": null, "limit": 50}),
    );
    assert_eq!(committed["rows"].as_array().unwrap().len(), 7);

    let bad = f
        .invoke(
            "query_activity",
            json!({"filter": {"phase": "teleport"}, "beforeSeq": null, "limit": 5}),
        )
        .unwrap_err();
    assert_eq!(
        (bad["code"].as_str(), bad["field"].as_str()),
        (Some("INVALID_INPUT"), Some("phase"))
    );
    let unknown_field = f.invoke(
        "query_activity",
        json!({"filter": {"colour": "red"}, "beforeSeq": null, "limit": 5}),
    );
    assert!(unknown_field.is_err(), "unknown filter fields are refused");

    // Sessions and the timeline see the same invocations.
    let sessions = f.ok("list_sessions", json!({}));
    assert_eq!(sessions[0]["session"], "sess_test_1");
    assert_eq!(sessions[0]["invocations"], 8);
    let timeline = f.ok("session_timeline", json!({"session": "sess_test_1"}));
    let timeline = timeline.as_array().unwrap();
    assert_eq!(timeline.len(), 8);
    let steps: Vec<&str> = timeline[0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["step"].as_str().unwrap())
        .collect();
    for step in [
        "accepted",
        "validated",
        "authorized",
        "dispatched",
        "response",
        "committed",
    ] {
        assert!(steps.contains(&step), "{step} missing from {steps:?}");
    }
}

#[test]
fn exports_write_every_matching_row_as_jsonl_and_csv() {
    let srv = server(Behavior::ok_json("{}"));
    let f = fixture(&target(&srv.base_url(), "none", ""));
    store_key(&f);
    for i in 0..3 {
        tauri::async_runtime::block_on(f.call(HttpRequest {
            url: srv.url(&format!("/v1/x{i}")),
            method: "GET".into(),
            ..Default::default()
        }))
        .unwrap();
    }
    let exports = f.dir.path().join("exports");
    let jsonl = f
        .console
        .export(
            &Default::default(),
            postern_desktop::dto::ExportFormat::Jsonl,
            &exports,
        )
        .unwrap();
    assert_eq!(jsonl.rows, 3);
    let text = std::fs::read_to_string(&jsonl.path).unwrap();
    assert_eq!(text.lines().count(), 3);
    for line in text.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["target"], "api");
    }
    let csv = f
        .console
        .export(
            &Default::default(),
            postern_desktop::dto::ExportFormat::Csv,
            &exports,
        )
        .unwrap();
    let text = std::fs::read_to_string(&csv.path).unwrap();
    assert_eq!(text.lines().count(), 4, "header + 3 rows");
    assert!(text.starts_with("id,accepted_seq,"));
    let partial = std::fs::read_dir(&exports)
        .unwrap()
        .flatten()
        .any(|e| e.path().to_string_lossy().ends_with(".partial"));
    assert!(!partial, "no half-written export is left behind");
}

/// A POST the server applies and then closes on: the outcome is unknown. Returns its id.
fn unknown_payment(f: &Fixture, srv: &Adversary) -> String {
    let out = tauri::async_runtime::block_on(f.call(HttpRequest {
        url: srv.url("/v1/payments"),
        method: "POST".into(),
        body: b"{\"amount\":5}".to_vec(),
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(out.outcome, Outcome::Unknown, "{out:?}");
    out.invocation_id
}

#[test]
fn an_unknown_outcome_is_attested_without_rewriting_the_attempt() {
    let srv = server(Behavior::ApplyThenClose);
    let f = fixture(&target(&srv.base_url(), "none", ""));
    store_key(&f);
    let id = unknown_payment(&f, &srv);

    let pending = f.ok("needs_reconciliation", json!({}));
    let item = &pending[0];
    assert_eq!(item["row"]["id"], id.as_str());
    assert_eq!(item["unsettled"], true);
    assert_eq!(item["can_query"], false);
    assert!(
        item["does_not_prove"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.as_str().unwrap().contains("applied"))
    );
    let query = f
        .invoke("run_reconcile_query", json!({"invocationId": id}))
        .unwrap_err();
    assert_eq!(query["code"], "NO_RECONCILE_QUERY");

    let no_note = f
        .invoke(
            "attest_outcome",
            json!({"attestation": {"invocation_id": id, "settlement": "committed", "note": "  "}}),
        )
        .unwrap_err();
    assert_eq!(no_note["field"], "note");
    let events_before = f.console.engine.journal().events(&id).unwrap();

    let settled = f.ok(
        "attest_outcome",
        json!({"attestation": {"invocation_id": id, "settlement": "committed", "note": "payment pay_1 visible in the dashboard"}}),
    );
    assert_eq!(settled["unsettled"], false);
    assert_eq!(settled["settlement"]["source"], "operator_attested");
    assert_eq!(settled["settlement"]["settlement"], "committed");
    assert!(
        settled["settlement"]["by"]
            .as_str()
            .unwrap()
            .starts_with("console:")
    );
    assert_eq!(settled["row"]["outcome"], "committed");
    assert_eq!(settled["row"]["code"], "RECONCILED_COMMITTED");

    // The original events are untouched; one RECONCILED was appended.
    let events_after = f.console.engine.journal().events(&id).unwrap();
    assert_eq!(&events_after[..events_before.len()], &events_before[..]);
    assert_eq!(events_after.len(), events_before.len() + 1);
    assert!(
        f.ok("needs_reconciliation", json!({}))
            .as_array()
            .unwrap()
            .is_empty()
    );

    // A second attestation is refused; the agent's retry reflects the settlement.
    let twice = f
        .invoke(
            "attest_outcome",
            json!({"attestation": {"invocation_id": id, "settlement": "not_applied", "note": "x"}}),
        )
        .unwrap_err();
    assert_eq!(twice["code"], "NOT_UNKNOWN");
    let retried =
        tauri::async_runtime::block_on(f.console.engine.http().retry(&id, &CallContext::default()));
    assert_eq!(retried.outcome, Outcome::Committed, "{retried:?}");
    assert_eq!(srv.effects(), 1, "never applied twice");
}

#[test]
fn the_integrity_banner_reports_verification_and_the_first_bad_sequence() {
    let srv = server(Behavior::ok_json("{}"));
    let f = fixture(&target(&srv.base_url(), "none", ""));
    store_key(&f);
    tauri::async_runtime::block_on(f.call(HttpRequest {
        url: srv.url("/v1/a"),
        method: "GET".into(),
        ..Default::default()
    }))
    .unwrap();
    let state = f.ok("integrity", json!({"recheck": true}));
    assert_eq!(state["state"], "verified", "{state}");
    let through = state["through_seq"].as_u64().unwrap();
    assert!(through >= 5);
    // Verified means signed: every commit carried a checkpoint.
    assert!(state["checkpoints"].as_u64().unwrap() >= 1, "{state}");
    assert_eq!(state["unsigned_events"], 0);
    // And it says what that proves: a keychain key, no witness.
    let assurance = state["assurance"].as_str().unwrap_or_default();
    assert!(assurance.contains("could read and re-sign with"), "{state}");
    assert!(assurance.contains("no witness's cosignature"), "{state}");
    assert_eq!(state["witnesses"], 0);
    assert_eq!(
        f.ok("integrity", json!({"recheck": false}))["state"],
        "verified"
    );

    // Checkpoints removed (rows and the witness file): counted, never "verified".
    let db = f.console.engine.journal().path().to_path_buf();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("DELETE FROM checkpoints", []).unwrap();
    drop(conn);
    std::fs::remove_file(postern_broker::audit::witness_path(&db)).unwrap();
    // And the anchor outside the data dir, which may hold an earlier checkpoint.
    if let Some(anchor) = postern_broker::audit::default_anchor(f.dir.path()) {
        let _ = std::fs::remove_file(anchor);
    }
    let state = f.ok("integrity", json!({"recheck": true}));
    assert_eq!(state["state"], "unsigned", "{state}");
    assert_eq!(state["unsigned_events"].as_u64(), Some(through), "{state}");
    assert_eq!(state["first_bad_seq"], 1, "{state}");

    // Tamper with one event's body on disk.
    let conn = rusqlite::Connection::open(f.console.engine.journal().path()).unwrap();
    conn.execute(
        "UPDATE events SET body = replace(body, '/v1/a', '/v1/b') WHERE seq = 1",
        [],
    )
    .unwrap();
    drop(conn);
    let state = f.ok("integrity", json!({"recheck": true}));
    assert_eq!(state["state"], "failed", "{state}");
    assert_eq!(state["first_bad_seq"], 1);
    assert!(state["failure"].as_str().unwrap().contains('1'));
}

#[test]
fn commands_are_granted_to_the_main_window_only() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("postern.toml"), "").unwrap();
    let started = start(&Args::in_dir(dir.path(), &test_service())).unwrap();
    // The real context: the capability files and CSP as shipped.
    let app = with_console(mock_builder(), started.console.clone())
        .build(tauri::generate_context!("../tauri.conf.json"))
        .unwrap();
    let main = WebviewWindowBuilder::new(&app, "main", Default::default())
        .build()
        .unwrap();
    let other = WebviewWindowBuilder::new(&app, "other", Default::default())
        .build()
        .unwrap();
    // The app's one command carries every operator command.
    let request = |cmd: &str| InvokeRequest {
        cmd: "operator".into(),
        callback: CallbackFn(0),
        error: CallbackFn(1),
        url: "tauri://localhost".parse().unwrap(),
        body: InvokeBody::Json(json!({"request": {"command": cmd, "args": {}}})),
        headers: Default::default(),
        invoke_key: INVOKE_KEY.to_string(),
    };
    assert!(tauri::test::get_ipc_response(&main, request("overview")).is_ok());
    for cmd in ["overview", "list_approvals", "list_credentials"] {
        let refused = tauri::test::get_ipc_response(&other, request(cmd));
        assert!(refused.is_err(), "{cmd} was allowed from another window");
    }
}

#[test]
fn the_configured_reconcile_query_settles_an_unknown_outcome_as_remote_query() {
    let srv = server(Behavior::ApplyThenCloseWithLookup);
    let reconcile = "[http.reconcile]\nmethod = \"GET\"\npath = \"/lookup\"\n\
                     committed_status = [200]\nnot_applied_status = [404]\n";
    let f = fixture(&target(&srv.base_url(), "none", reconcile));
    store_key(&f);
    let id = unknown_payment(&f, &srv);
    let pending = f.ok("needs_reconciliation", json!({}));
    assert_eq!(pending[0]["can_query"], true);

    let settled = f.ok("run_reconcile_query", json!({"invocationId": id}));
    assert_eq!(settled["settlement"]["source"], "remote_query");
    assert_eq!(settled["settlement"]["settlement"], "committed");
    assert_eq!(settled["row"]["code"], "RECONCILED_COMMITTED");
    assert_eq!(srv.effects(), 1, "the query applies nothing");
    assert!(
        f.ok("needs_reconciliation", json!({}))
            .as_array()
            .unwrap()
            .is_empty()
    );
    // Running it again is refused: nothing is unknown any more.
    let again = f
        .invoke("run_reconcile_query", json!({"invocationId": id}))
        .unwrap_err();
    assert_eq!(again["code"], "NOT_UNKNOWN");
}

#[test]
fn a_new_target_is_added_to_the_config_file_and_served_at_once() {
    let f = fixture("# my targets\n");
    let toml = "[[http]]\nname = \"new-api\"\nbase_url = \"https://api.example.test/\"\n\
                methods = [\"GET\"]\ncredential = \"api-key\"\n\
                inject = { header = \"Authorization\", format = \"Bearer {secret}\" }\n\
                approval = \"per_call\"\n";
    let added = f.ok(
        "update_target",
        json!({"edit": {"name": "new-api", "toml": toml}}),
    );
    assert_eq!(added["name"], "new-api");
    assert_eq!(added["approval"], "per_call");
    let text = std::fs::read_to_string(f.config_path()).unwrap();
    assert!(
        text.starts_with("# my targets\n"),
        "comments are kept: {text}"
    );
    assert!(
        f.console
            .engine
            .config()
            .current()
            .http_target("new-api")
            .is_some()
    );
    assert_eq!(f.ok("overview", json!({}))["targets"], 1);
    // The previous file is kept for the record.
    let history: Vec<_> = std::fs::read_dir(f.dir.path().join("config-history"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(history.len(), 1);
    assert_eq!(
        std::fs::read_to_string(history[0].path()).unwrap(),
        "# my targets\n"
    );
}

/// Waits up to 10 s for a payload on `rx` that satisfies `ok`.
fn wait_for_event(rx: &std::sync::mpsc::Receiver<Value>, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(v) if ok(&v) => return v,
            Ok(_) => {}
            Err(_) => panic!("no matching event arrived"),
        }
    }
}

#[test]
fn the_webview_is_told_of_new_cards_journal_growth_and_integrity() {
    use tauri::{Listener, Manager};
    let srv = server(Behavior::ok_json("{}"));
    let f = fixture(&target(&srv.base_url(), "per_call", ""));
    store_key(&f);
    let handle = f._app.app_handle().clone();
    let (tx, rx) = std::sync::mpsc::channel::<(String, Value)>();
    for name in ["approvals-changed", "journal-changed", "integrity-changed"] {
        let tx = tx.clone();
        handle.listen_any(name, move |event| {
            let payload: Value = serde_json::from_str(event.payload()).unwrap_or(Value::Null);
            let _ = tx.send((name.to_string(), payload));
        });
    }
    let (approvals_tx, approvals) = std::sync::mpsc::channel();
    let (journal_tx, journal) = std::sync::mpsc::channel();
    let (integrity_tx, integrity) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for (name, payload) in rx {
            let _ = match name.as_str() {
                "approvals-changed" => approvals_tx.send(payload),
                "journal-changed" => journal_tx.send(payload),
                _ => integrity_tx.send(payload),
            };
        }
    });
    tauri::async_runtime::spawn(postern_desktop::app::watch_approvals(
        handle.clone(),
        f.console.clone(),
    ));
    tauri::async_runtime::spawn(postern_desktop::app::watch_journal(
        handle,
        f.console.clone(),
    ));

    // At start: an empty journal (never called verified), and the empty pending list.
    let state = wait_for_event(&integrity, |v| v["state"] == "empty");
    assert!(state["through_seq"].is_number());
    wait_for_event(&approvals, |v| {
        v["pending"].as_array().is_some_and(|p| p.is_empty())
    });

    let call = f.call(HttpRequest {
        url: srv.url("/v1/items"),
        method: "GET".into(),
        ..Default::default()
    });
    let changed = wait_for_event(&approvals, |v| {
        v["pending"].as_array().is_some_and(|p| p.len() == 1)
    });
    let card = &changed["pending"][0];
    assert_eq!(card["target"], "api");
    let seq_before = wait_for_event(&journal, |v| v["last_seq"].as_u64() > Some(0))["last_seq"]
        .as_u64()
        .unwrap();
    f.answer(card, "approve");
    wait_for_event(&approvals, |v| {
        v["pending"].as_array().is_some_and(|p| p.is_empty())
    });
    assert_eq!(
        tauri::async_runtime::block_on(call).unwrap().outcome,
        Outcome::Committed
    );
    wait_for_event(&journal, |v| v["last_seq"].as_u64() > Some(seq_before));
    // The banner catches up with the grown journal.
    wait_for_event(&integrity, |v| {
        v["state"] == "verified" && v["through_seq"].as_u64() > Some(seq_before)
    });
}

#[test]
fn ssh_cards_show_the_host_key_then_the_escaped_command_and_approving_pins_the_key() {
    use postern_broker::channel::ssh::SshRequest;
    use postern_tests::ssh_fixture::Sshd;
    assert!(
        Sshd::available(),
        "the SSH tests need /usr/sbin/sshd (scripts/test.sh installs it)"
    );
    let sshd = Sshd::start().unwrap();
    let config = format!(
        "[[ssh]]\nname = \"box\"\nhost = \"127.0.0.1\"\nport = {}\nuser = \"{}\"\n\
         credential = \"box-key\"\napproval = \"per_call\"\ntimeout_ms = 15000\n",
        sshd.port,
        Sshd::user()
    );
    let f = fixture(&config);
    // The key goes in through the console, as an operator pastes it.
    let stored = f.ok(
        "set_credential",
        json!({"credential": {"id": "box-key", "kind": "ssh_key", "secret": sshd.user_ed25519.private, "passphrase": null}}),
    );
    assert_eq!(stored["kind"], "ssh_key");
    let run = |command: &str| {
        let broker = f.console.engine.clone();
        let approver = f.console.approvals.clone();
        let request = SshRequest {
            host: "box".into(),
            command: command.into(),
            stdin: None,
            timeout_ms: None,
        };
        tauri::async_runtime::spawn(async move {
            let ctx = CallContext {
                session: Some("sess_test_ssh".into()),
                approver: Some(approver),
                ..Default::default()
            };
            broker.ssh().execute(request, &ctx).await
        })
    };

    // First connection: the per-call card, then the host-key card.
    let first = run("echo first");
    let card = f.card();
    assert_eq!(card["mode"], "per_call");
    assert_eq!(card["command"], "echo first");
    f.answer(&card, "approve");
    let host_card = f.card();
    assert_eq!(host_card["mode"], "host_key");
    let destination = format!("{}@127.0.0.1:{}", Sshd::user(), sshd.port);
    assert_eq!(host_card["ssh_destination"], destination.as_str());
    let shown_key = host_card["host_key"].as_str().unwrap();
    assert!(shown_key.starts_with("SHA256:"), "{shown_key}");
    f.answer(&host_card, "approve");
    let first = tauri::async_runtime::block_on(first).unwrap();
    assert_eq!(first.outcome, Outcome::NotAttempted, "{first:?}");
    let text = std::fs::read_to_string(f.config_path()).unwrap();
    assert!(text.contains(&sshd.host_key), "the approved key is pinned");

    // Pinned now: only the per-call card, with control characters shown escaped.
    let second = run("printf 'ok\\n'; echo \u{1b}[2J");
    let card = f.card();
    assert_eq!(card["mode"], "per_call");
    assert_eq!(card["command"], "printf 'ok\\\\n'; echo \\x1b[2J");
    f.answer(&card, "approve");
    let second = tauri::async_runtime::block_on(second).unwrap();
    assert_eq!(second.outcome, Outcome::Committed, "{second:?}");
}

/// The console reads who acted and which card was answered from the journal, so both
/// survive a restart of the broker on the same data dir.
#[test]
fn who_acted_and_the_card_answered_are_read_from_the_journal_after_a_restart() {
    let srv = server(Behavior::ok_json("{\"ok\":true}"));
    let service = test_service();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("postern.toml"),
        target(&srv.base_url(), "per_call", ""),
    )
    .unwrap();
    let mut f = fixture_in(dir, &service);
    store_key(&f);
    // What the MCP server records when an agent's bridge connects; this test process
    // plays the agent of session `sess_test_1` (the session `Fixture::call` uses).
    let me = std::process::id();
    let ticks = provenance::observe_process(me, None).unwrap().start_ticks;
    let opened = SessionOpened::observe("sess_test_1", me, ticks, &[], me, None).unwrap();
    provenance::record_session(f.console.engine.journal(), opened.clone()).unwrap();
    // Another connection that never asked for anything.
    let idle = SessionOpened {
        session: "sess_idle".into(),
        ..opened
    };
    provenance::record_session(f.console.engine.journal(), idle).unwrap();
    let exe = std::env::current_exe().unwrap();
    let exe_blake3 = blake3::hash(&std::fs::read(&exe).unwrap())
        .to_hex()
        .to_string();

    let call = f.call(HttpRequest {
        url: srv.url("/v1/items"),
        method: "POST".into(),
        body: b"{\"amount\":5}".to_vec(),
        ..Default::default()
    });
    let card = f.card();
    assert_eq!(
        card["recorded_agent"]["executable_blake3"],
        exe_blake3.as_str()
    );
    assert_eq!(card["recorded_agent"]["pid"], me);
    let digest = card["card_digest"].as_str().unwrap().to_string();
    assert_eq!(digest.len(), 64);
    // An answer naming another card is refused, and the card keeps waiting.
    let refused = f
        .invoke(
            "answer_approval",
            json!({"invocationId": card["invocation_id"], "fingerprint": card["fingerprint"], "cardDigest": "0".repeat(64), "decision": "approve"}),
        )
        .unwrap_err();
    assert_eq!(refused["code"], "CARD_CHANGED");
    assert_eq!(refused["field"], "card_digest");
    assert_eq!(f.card()["card_digest"], digest.as_str());
    f.answer(&card, "approve");
    let out = tauri::async_runtime::block_on(call).unwrap();
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");

    let check = |detail: &Value| {
        let approval = &detail["approval"];
        assert_eq!(approval["card_digest"], digest.as_str(), "{detail}");
        assert_eq!(approval["answered_card_digest"], digest.as_str());
        assert_eq!(approval["answer"], "granted");
        assert_eq!(approval["matched"], true);
        assert_eq!(approval["card_intact"], true);
        assert_eq!(detail["agent"]["executable"], exe.to_str().unwrap());
        assert_eq!(detail["agent"]["executable_blake3"], exe_blake3.as_str());
    };
    check(&f.ok(
        "invocation_detail",
        json!({"invocationId": out.invocation_id}),
    ));

    // Restart: the first broker's writer is closed, a new console opens the same dir.
    f.console.engine.journal().clone().close().unwrap();
    let dir = std::mem::replace(&mut f.dir, tempfile::tempdir().unwrap());
    drop(f);
    let g = fixture_in(dir, &service);
    let sessions = g.ok("list_sessions", json!({}));
    let session = sessions
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session"] == "sess_test_1")
        .unwrap();
    assert!(
        session["agent"].is_null(),
        "not live in this run: {session}"
    );
    assert_eq!(
        session["recorded"]["executable_blake3"],
        exe_blake3.as_str()
    );
    assert_eq!(session["recorded"]["pid"], me);
    assert_eq!(
        session["recorded"]["cwd"],
        std::env::current_dir().unwrap().to_str().unwrap()
    );
    let timeline = g.ok("session_timeline", json!({"session": "sess_test_1"}));
    let timeline = timeline.as_array().unwrap();
    assert_eq!(timeline.len(), 1);
    check(&timeline[0]);
    // Session records are not invocations: the activity lists only the call.
    let page = g.ok(
        "query_activity",
        json!({"filter": {}, "beforeSeq": null, "limit": 50}),
    );
    assert_eq!(page["rows"].as_array().unwrap().len(), 1);
    assert_eq!(
        g.ok("integrity", json!({"recheck": true}))["state"],
        "verified"
    );
}

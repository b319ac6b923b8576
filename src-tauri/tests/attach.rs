//! The console attached to a broker it does not run: the same Tauri commands, through an
//! operator socket served by a broker with the file keychain (as `postern daemon` runs
//! privilege-separated), driven through Tauri's mock runtime.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{INVOKE_KEY, MockRuntime, mock_builder, mock_context, noop_assets};
use tauri::webview::{InvokeRequest, WebviewWindow};
use tauri::{App, WebviewWindowBuilder};

use postern_broker::approvals::Approvals;
use postern_broker::channel::http::HttpRequest;
use postern_broker::clock::SystemClock;
use postern_broker::contract::Outcome;
use postern_broker::invocation::CallContext;
use postern_console::console::{Console, Mode, Paths};
use postern_console::operator::{OperatorClient, OperatorServer, bind_operator, serve_operator};
use postern_desktop::app::with_backend;
use postern_desktop::commands::Backend;
use postern_mcp::server::Sessions;
use postern_mcp::{DaemonArgs, KeychainChoice};
use postern_tests::adversary::{Adversary, Behavior};

const CANARY: &str = "canary-attached-console-2b81";

struct Attached {
    _dir: tempfile::TempDir,
    console: Arc<Console>,
    _app: App<MockRuntime>,
    main: WebviewWindow<MockRuntime>,
}

impl Attached {
    fn invoke(&self, cmd: &str, args: Value) -> Result<Value, Value> {
        tauri::test::get_ipc_response(
            &self.main,
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

    fn ok(&self, cmd: &str, args: Value) -> Value {
        self.invoke(cmd, args)
            .unwrap_or_else(|e| panic!("{cmd} failed: {e}"))
    }
}

fn attached(base_url: &str) -> Attached {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("postern.toml");
    std::fs::write(
        &config,
        format!(
            r#"[[http]]
name = "api"
base_url = "{base_url}/v1"
methods = ["GET"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "per_call"
"#
        ),
    )
    .unwrap();
    let key = dir.path().join("vault.key");
    std::fs::write(&key, [5u8; 32]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let data_dir = dir.path().join("data");
    let args = DaemonArgs {
        data_dir: data_dir.clone(),
        config: config.clone(),
        socket: None,
        keychain: KeychainChoice::File,
        service: "postern".into(),
        vault_key_file: Some(key),
        anchor: Some(dir.path().join("anchor.checkpoint")),
    };
    let approvals = Arc::new(Approvals::new(
        Duration::from_secs(20),
        Arc::new(SystemClock),
    ));
    let broker = postern_console::headless::open_broker(&args, Some(approvals.clone())).unwrap();
    let console = Arc::new(
        Console::new(
            broker,
            Arc::new(Sessions::default()),
            approvals,
            Paths {
                data_dir: data_dir.clone(),
                config,
                socket: data_dir.join("run/postern.sock"),
                keychain: "file".into(),
            },
        )
        .with_mode(Mode::PrivilegeSeparated),
    );
    let socket = data_dir.join("run/operator.sock");
    let server = Arc::new(OperatorServer::new(console.clone(), None).unwrap());
    let listener = tauri::async_runtime::block_on(bind_operator(&socket, None)).unwrap();
    tauri::async_runtime::spawn(serve_operator(server, listener, std::future::pending()));
    let backend = Arc::new(Backend::Attached(OperatorClient::new(socket)));
    let app = with_backend(mock_builder(), backend)
        .build(mock_context(noop_assets()))
        .unwrap();
    let main = WebviewWindowBuilder::new(&app, "main", Default::default())
        .build()
        .unwrap();
    Attached {
        _dir: dir,
        console,
        _app: app,
        main,
    }
}

#[test]
fn an_attached_console_stores_a_credential_and_approves_over_the_operator_socket() {
    let srv = tauri::async_runtime::block_on(Adversary::start(Behavior::ok_json("{}"))).unwrap();
    let a = attached(&srv.base_url());
    let card = a.ok(
        "set_credential",
        json!({"credential": {"id": "api-key", "kind": "token", "secret": CANARY}}),
    );
    assert_eq!(card["id"], "api-key");
    assert!(!card.to_string().contains(CANARY));
    let overview = a.ok("overview", json!({}));
    assert_eq!(overview["mode"], "privilege_separated");
    assert_eq!(overview["keychain"], "file");
    assert_eq!(overview["credentials"], 1);

    // An agent's call waits for the attached console's answer.
    let broker = a.console.engine.clone();
    let approver = a.console.approvals.clone();
    let call = tauri::async_runtime::spawn(async move {
        let ctx = CallContext {
            session: Some("sess_attached_1".into()),
            approver: Some(approver),
            ..Default::default()
        };
        broker
            .http()
            .execute(
                HttpRequest {
                    url: format!("{}/v1/items", srv.base_url()),
                    method: "GET".into(),
                    ..Default::default()
                },
                &ctx,
            )
            .await
    });
    let mut card = Value::Null;
    for _ in 0..300 {
        let cards = a.ok("list_approvals", json!({}));
        if let Some(c) = cards.as_array().and_then(|c| c.first()) {
            card = c.clone();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!card.is_null(), "no approval card appeared");
    a.ok(
        "answer_approval",
        json!({"invocationId": card["invocation_id"], "fingerprint": card["fingerprint"], "cardDigest": card["card_digest"], "decision": "approve"}),
    );
    let out = tauri::async_runtime::block_on(call).unwrap();
    assert!(out.error.is_none(), "{:?}", out.error);
    assert_eq!(out.outcome, Outcome::Committed);
    // The journal records the approval as the operator socket's peer, by user name.
    let detail = a.ok(
        "invocation_detail",
        json!({"invocationId": card["invocation_id"]}),
    );
    let approved = detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "APPROVAL_GRANTED")
        .unwrap_or_else(|| panic!("no APPROVAL_GRANTED in {detail}"));
    assert!(
        approved["detail"].as_str().unwrap().contains("operator:"),
        "the approver is named: {approved}"
    );

    // Typed errors cross the socket unchanged.
    let err = a
        .invoke(
            "answer_approval",
            json!({"invocationId": card["invocation_id"], "fingerprint": card["fingerprint"], "cardDigest": card["card_digest"], "decision": "approve"}),
        )
        .unwrap_err();
    assert_eq!(err["code"], "NOT_PENDING", "{err}");
    let err = a
        .invoke(
            "query_activity",
            json!({"filter": {"phase": "nonsense"}, "beforeSeq": null, "limit": 5}),
        )
        .unwrap_err();
    assert_eq!(err["code"], "INVALID_INPUT", "{err}");
    assert_eq!(err["field"], "phase");
}

#[test]
fn an_attached_console_whose_broker_is_gone_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let app = with_backend(
        mock_builder(),
        Arc::new(Backend::Attached(OperatorClient::new(
            dir.path().join("operator.sock"),
        ))),
    )
    .build(mock_context(noop_assets()))
    .unwrap();
    let main = WebviewWindowBuilder::new(&app, "main", Default::default())
        .build()
        .unwrap();
    let err = tauri::test::get_ipc_response(
        &main,
        InvokeRequest {
            cmd: "operator".into(),
            callback: CallbackFn(0),
            error: CallbackFn(1),
            url: "tauri://localhost".parse().unwrap(),
            body: InvokeBody::Json(json!({"request": {"command": "overview"}})),
            headers: Default::default(),
            invoke_key: INVOKE_KEY.to_string(),
        },
    )
    .unwrap_err();
    let err: Value = serde_json::from_value(err).unwrap();
    assert_eq!(err["code"], "OPERATOR_UNREACHABLE", "{err}");
}

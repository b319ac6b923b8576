//! End to end: the real console (this crate's binary, with the built UI) under Xvfb,
//! driven through tauri-driver and WebKitWebDriver, while this test acts as an agent
//! through `postern mcp` against the adversarial HTTP server.
//!
//! `scripts/test.sh` starts Xvfb and tauri-driver and sets `TAURI_DRIVER_URL`; the test
//! fails (rather than passing vacuously) when they are not there. The console runs with
//! WebKit's accelerated compositing on here (`scripts/with-display.sh` says why); the
//! tray test drives the console as shipped. Screenshots of every
//! screen go to `test-output/e2e/` (or `$POSTERN_TEST_OUTPUT/e2e`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use rmcp::model::CallToolResult;
use rmcp::service::RoleClient;
use serde_json::{Value, json};

use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, structured};
use postern_tests::files_containing;
use postern_tests::fixture::test_service;

const APP: &str = env!("CARGO_BIN_EXE_postern-console");
const CANARY: &str = "pstn-e2e-canary-93d1";
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The `postern` binary built beside this test (the workspace builds it for its own tests).
fn postern_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let bin = dir.join("postern");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build -p postern-cli)",
        bin.display()
    );
    bin
}

fn output_dir() -> PathBuf {
    let base = std::env::var_os("POSTERN_TEST_OUTPUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../test-output"));
    let dir = base.join("e2e");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A minimal W3C WebDriver client.
struct Driver {
    http: reqwest::Client,
    base: String,
    session: String,
}

impl Driver {
    async fn start(base: &str, args: Vec<String>) -> Driver {
        let http = reqwest::Client::new();
        let response: Value = http
            .post(format!("{base}/session"))
            .json(&json!({
                "capabilities": {"alwaysMatch": {
                    "browserName": "wry",
                    "tauri:options": {"application": APP, "args": args}
                }}
            }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = response["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {response}"))
            .to_string();
        Driver {
            http,
            base: base.to_string(),
            session,
        }
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        request.send().await.unwrap().json().await.unwrap()
    }

    async fn find_all(&self, css: &str) -> Vec<String> {
        let v = self
            .send(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v["value"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits up to 20 s for an element matching `css`.
    async fn wait(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(e) = self.find_all(css).await.into_iter().next() {
                return e;
            }
            if Instant::now() > deadline {
                let source = self.source().await;
                panic!("no element {css} appeared; page:\n{source}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until nothing matches `css`.
    async fn wait_gone(&self, css: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.find_all(css).await.is_empty() {
            assert!(Instant::now() < deadline, "{css} did not go away");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn click(&self, css: &str) {
        let e = self.wait(css).await;
        let v = self
            .send(
                reqwest::Method::POST,
                &format!("/element/{e}/click"),
                Some(json!({})),
            )
            .await;
        assert!(v["value"].is_null(), "click {css}: {v}");
    }

    /// Types `text` as keystrokes (a newline is the Enter key).
    async fn type_into(&self, css: &str, text: &str) {
        let text = text.replace('\n', "\u{E007}");
        let text = text.as_str();
        let e = self.wait(css).await;
        self.send(
            reqwest::Method::POST,
            &format!("/element/{e}/clear"),
            Some(json!({})),
        )
        .await;
        let v = self
            .send(
                reqwest::Method::POST,
                &format!("/element/{e}/value"),
                Some(json!({"text": text})),
            )
            .await;
        assert!(v["value"].is_null(), "type into {css}: {v}");
    }

    async fn text(&self, css: &str) -> String {
        let e = self.wait(css).await;
        let v = self
            .send(reqwest::Method::GET, &format!("/element/{e}/text"), None)
            .await;
        v["value"].as_str().unwrap_or_default().to_string()
    }

    async fn source(&self) -> String {
        let v = self.send(reqwest::Method::GET, "/source", None).await;
        v["value"].as_str().unwrap_or_default().to_string()
    }

    async fn screenshot(&self, name: &str) {
        let v = self.send(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v["value"].as_str().unwrap_or_default())
            .unwrap();
        assert!(
            png.starts_with(b"\x89PNG"),
            "screenshot {name} is not a PNG"
        );
        std::fs::write(output_dir().join(format!("{name}.png")), png).unwrap();
    }

    async fn quit(&self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
    }
}

async fn call(client: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> CallToolResult {
    agent::call(client, tool, args).await.unwrap()
}

fn code(result: &CallToolResult) -> String {
    let v = structured(result);
    v["error"]["code"]
        .as_str()
        .or_else(|| v["code"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn config(ok: &str, pay: &str) -> String {
    format!(
        r#"[[http]]
name = "api"
base_url = "{ok}/v1"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "per_call"
idempotent_methods = ["GET"]

[[http]]
name = "pay"
base_url = "{pay}/pay"
methods = ["POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
timeout_ms = 5000
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_approves_denies_and_attests_from_the_real_console() {
    let driver_url = std::env::var("TAURI_DRIVER_URL").unwrap_or_else(|_| {
        panic!(
            "TAURI_DRIVER_URL is not set: run the tests with ./scripts/test.sh, which starts \
             Xvfb and tauri-driver"
        )
    });
    let ok = Adversary::start(Behavior::ok_json("{\"ok\":true}"))
        .await
        .unwrap();
    let pay = Adversary::start(Behavior::ApplyThenClose).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("postern.toml");
    std::fs::write(&config_path, config(&ok.base_url(), &pay.base_url())).unwrap();
    let socket = dir.path().join("run").join("postern.sock");
    let driver = Driver::start(
        &driver_url,
        vec![
            "--data-dir".into(),
            dir.path().display().to_string(),
            "--config".into(),
            config_path.display().to_string(),
            "--keychain-service".into(),
            test_service(),
        ],
    )
    .await;

    // First run: the vault is empty, so the console opens to onboarding.
    driver.wait("[data-testid=onboarding]").await;
    driver.screenshot("01-onboarding").await;
    driver.click("[data-testid=onboarding-skip]").await;

    // Store the credential through the console; it is never shown again.
    driver.click("[data-testid=nav-credentials]").await;
    driver.type_into("[data-testid=cred-id]", "api-key").await;
    driver.type_into("[data-testid=cred-secret]", CANARY).await;
    driver.click("[data-testid=cred-submit]").await;
    driver
        .wait("[data-testid=credential][data-id=api-key]")
        .await;
    driver.screenshot("02-credentials").await;
    assert!(!driver.source().await.contains(CANARY));

    let client = agent::connect(&postern_bin(), &socket).await.unwrap();
    driver.click("[data-testid=nav-approvals]").await;

    // 1. Approved by a click: the call completes.
    let first = {
        let c = client.clone();
        let url = ok.url("/v1/items");
        tokio::spawn(
            async move { call(&c, "http_request", json!({"url": url, "method": "GET"})).await },
        )
    };
    driver.wait("[data-testid=approval-card]").await;
    driver.screenshot("03-approval-card").await;
    let shown = driver.text("[data-testid=approval-card]").await;
    assert!(
        shown.contains("api-key") && shown.contains("/v1/items"),
        "{shown}"
    );
    driver
        .click("[data-testid=approval-card] [data-testid=approve]")
        .await;
    let first = first.await.unwrap();
    assert!(first.is_error != Some(true), "{first:?}");
    assert_eq!(ok.requests().len(), 1);
    driver.wait_gone("[data-testid=approval-card]").await;

    // 2. Denied (with Escape, the keyboard path): APPROVAL_DENIED, nothing sent.
    let second = {
        let c = client.clone();
        let url = ok.url("/v1/items/2");
        tokio::spawn(
            async move { call(&c, "http_request", json!({"url": url, "method": "GET"})).await },
        )
    };
    let card = driver.wait("[data-testid=approval-card]").await;
    driver
        .send(
            reqwest::Method::POST,
            &format!("/element/{card}/value"),
            Some(json!({"text": "\u{E00C}"})),
        )
        .await;
    let second = second.await.unwrap();
    assert_eq!(code(&second), "APPROVAL_DENIED", "{second:?}");
    assert_eq!(ok.requests().len(), 1);
    driver.wait_gone("[data-testid=approval-card]").await;

    // 3. The target changes under a pending card: approving it is refused.
    let third = {
        let c = client.clone();
        let url = ok.url("/v1/items/3");
        tokio::spawn(
            async move { call(&c, "http_request", json!({"url": url, "method": "GET"})).await },
        )
    };
    driver.wait("[data-testid=approval-card]").await;
    driver.click("[data-testid=nav-targets]").await;
    driver
        .click("[data-testid=target][data-name=api] [data-testid=edit-target]")
        .await;
    let edited = format!(
        "[[http]]\nname = \"api\"\nbase_url = \"{}/v1\"\nmethods = [\"GET\"]\ncredential = \
         \"api-key\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" \
         }}\napproval = \"per_call\"\nidempotent_methods = [\"GET\"]\n",
        ok.base_url()
    );
    driver.type_into("[data-testid=target-toml]", &edited).await;
    driver.click("[data-testid=save-target]").await;
    driver.wait("[data-testid=target-saved]").await;
    assert!(
        std::fs::read_to_string(&config_path)
            .unwrap()
            .contains("\nmethods = [\"GET\"]\n"),
        "the target edit was not written"
    );
    driver.screenshot("04-targets").await;
    driver.click("[data-testid=nav-approvals]").await;
    driver
        .click("[data-testid=approval-card] [data-testid=approve]")
        .await;
    let third = third.await.unwrap();
    assert_eq!(code(&third), "FINGERPRINT_MISMATCH", "{third:?}");
    assert_eq!(ok.requests().len(), 1, "nothing was sent");

    // 4. Applied, then the connection closed: unknown. The operator attests it.
    let fourth = call(
        &client,
        "http_request",
        json!({"url": pay.url("/pay/charge"), "method": "POST", "body": "{\"amount\":5}"}),
    )
    .await;
    assert_eq!(code(&fourth), "REMOTE_OUTCOME_UNKNOWN", "{fourth:?}");
    let fourth = structured(&fourth);
    let id = fourth["invocation_id"]
        .as_str()
        .or_else(|| fourth["error"]["invocation_id"].as_str())
        .unwrap()
        .to_string();
    driver.click("[data-testid=nav-reconcile]").await;
    let item = format!("[data-testid=recon-item][data-invocation='{id}']");
    driver.wait(&item).await;
    driver
        .click(&format!(
            "{item} [data-testid=attest-settlement] [value=committed]"
        ))
        .await;
    driver
        .type_into(
            &format!("{item} [data-testid=attest-note]"),
            "charge visible in the provider dashboard",
        )
        .await;
    driver.screenshot("05-reconcile").await;
    driver
        .click(&format!("{item} [data-testid=attest-submit]"))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let retried = call(&client, "retry_invocation", json!({"invocation_id": id})).await;
        let v = structured(&retried);
        if v.to_string().contains("RECONCILED_COMMITTED") {
            assert_eq!(pay.effects(), 1, "never applied twice");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "retry never reflected the attestation: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The remaining screens, for the record.
    driver.click("[data-testid=nav-sessions]").await;
    driver.click("[data-testid=session-item]").await;
    driver.wait("[data-testid=timeline-invocation]").await;
    driver.screenshot("06-sessions").await;
    driver.click("[data-testid=nav-activity]").await;
    driver.wait("[data-testid=activity-row]").await;
    driver.screenshot("07-activity").await;
    // The banner re-verifies the whole file after changes: it ends verified through
    // the journal's newest events, not the empty journal it saw at start.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let banner = driver.text("[data-testid=integrity-banner]").await;
        if banner.contains("verified through sequence") && !banner.contains("sequence 0 ") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the banner never caught up: {banner}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    driver
        .wait("[data-testid=integrity-banner][data-state=verified]")
        .await;

    assert!(!driver.source().await.contains(CANARY));
    driver.quit().await;
    let _ = client.cancel().await;
    let leaked = files_containing(dir.path(), CANARY.as_bytes());
    assert!(leaked.is_empty(), "the secret leaked into {leaked:?}");
}

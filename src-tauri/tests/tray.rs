//! The console as a desktop app: the real binary under the X display `scripts/test.sh`
//! starts, on a private session bus where this test plays the desktop. It owns
//! `org.freedesktop.Notifications` (and records every Notify call) and
//! `org.kde.StatusNotifierWatcher` (a tray host: the app's indicator registers with it,
//! and the test reads the item's label and clicks its D-Bus menu as a panel would), and
//! closes the window with WM_DELETE_WINDOW as a window manager would.
//!
//! It checks: a desktop notification per new approval card, without the secret; the
//! waiting count in the tray; Pause agents refusing agent calls with AGENTS_PAUSED until
//! Resume; closing the window ends it and its WebKit web process while the broker goes
//! on serving, Open builds it again, and so does starting the console again (which then
//! exits); a start at login makes no window until Open; Start at login writes and
//! removes the autostart entry; Quit ends the app.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use zbus::zvariant::{OwnedValue, Value as ZValue};

use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, structured};
use postern_tests::desktop::{Desktop, Process, Window, has_web_process, private_bus};
use postern_tests::fixture::test_service;

const APP: &str = env!("CARGO_BIN_EXE_postern-console");
const CANARY: &str = "pstn-tray-canary-4be1";

/// The `postern` binary built beside this test.
fn postern_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join("postern");
    assert!(bin.exists(), "{} is missing: build it first", bin.display());
    bin
}

/// One entry of the item's D-Bus menu (com.canonical.dbusmenu).
#[derive(Debug, Clone)]
struct Entry {
    id: i32,
    label: String,
    toggle_state: Option<i32>,
}

/// A dbusmenu layout node: id, properties, children (each a variant holding a node).
type Layout = (i32, HashMap<String, OwnedValue>, Vec<OwnedValue>);

fn entries((id, props, children): Layout, out: &mut Vec<Entry>) {
    let label = props
        .get("label")
        .and_then(|v| String::try_from(v.try_clone().ok()?).ok())
        .unwrap_or_default();
    let toggle_state = props
        .get("toggle-state")
        .and_then(|v| i32::try_from(v.try_clone().ok()?).ok());
    out.push(Entry {
        id,
        label,
        toggle_state,
    });
    for child in children {
        if let Ok(node) = Layout::try_from(child) {
            entries(node, out);
        }
    }
}

/// The tray as the desktop sees it: the app's registered indicator.
struct TrayView {
    bus: zbus::Connection,
    name: String,
    path: String,
}

impl TrayView {
    async fn item(&self) -> zbus::Proxy<'static> {
        zbus::Proxy::new(
            &self.bus,
            self.name.clone(),
            self.path.clone(),
            "org.kde.StatusNotifierItem",
        )
        .await
        .unwrap()
    }

    /// The label beside the icon (where the waiting count goes).
    async fn label(&self) -> String {
        self.item()
            .await
            .get_property::<String>("XAyatanaLabel")
            .await
            .unwrap_or_default()
    }

    async fn menu(&self) -> zbus::Proxy<'static> {
        let path: zbus::zvariant::OwnedObjectPath =
            self.item().await.get_property("Menu").await.unwrap();
        zbus::Proxy::new(
            &self.bus,
            self.name.clone(),
            path.to_string(),
            "com.canonical.dbusmenu",
        )
        .await
        .unwrap()
    }

    async fn entries(&self) -> Vec<Entry> {
        let menu = self.menu().await;
        let reply = menu
            .call_method("GetLayout", &(0i32, -1i32, Vec::<String>::new()))
            .await
            .unwrap();
        let (_revision, root): (u32, Layout) = reply.body().deserialize().unwrap();
        let mut out = Vec::new();
        entries(root, &mut out);
        out
    }

    async fn entry(&self, label: &str) -> Option<Entry> {
        self.entries().await.into_iter().find(|e| e.label == label)
    }

    /// Clicks the menu entry labelled `label`, as a panel does.
    async fn click(&self, label: &str) {
        let entry = self
            .entry(label)
            .await
            .unwrap_or_else(|| panic!("no menu entry {label:?}"));
        self.menu()
            .await
            .call_method("Event", &(entry.id, "clicked", ZValue::from(0i32), 0u32))
            .await
            .unwrap();
    }

    /// Waits up to 20 s for the menu to hold an entry `label`.
    async fn wait_for_entry(&self, label: &str) {
        self.wait_until(&format!("the entry {label:?}"), async |t: &TrayView| {
            t.entry(label).await.is_some()
        })
        .await;
    }

    /// Waits up to 20 s for `check` to hold.
    async fn wait_until<F: AsyncFn(&TrayView) -> bool>(&self, what: &str, check: F) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !check(self).await {
            assert!(
                Instant::now() < deadline,
                "the tray never showed {what}: label {:?}, menu {:?}",
                self.label().await,
                self.entries().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The app's main window, waiting up to 20 s for it to appear.
fn find_window(pid: u32) -> Window {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(window) = Window::try_find(pid).unwrap() {
            return window;
        }
        assert!(
            Instant::now() < deadline,
            "no window named Postern for pid {pid}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits up to 20 s for `window` to be shown or hidden.
fn wait_mapped(window: &Window, mapped: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while window.mapped() != mapped {
        assert!(
            Instant::now() < deadline,
            "the window never became {}",
            if mapped { "visible" } else { "hidden" }
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits up to 20 s for `window` to be gone from the display (destroyed, not hidden).
fn wait_destroyed(window: &Window) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while window.exists() {
        assert!(
            Instant::now() < deadline,
            "closing left the window on the display"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits up to 20 s until `pid` has (or no longer has) a WebKit web process: the page's
/// renderer, which holds most of an open console's memory.
fn wait_web_process(pid: u32, running: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while has_web_process(pid) != running {
        assert!(
            Instant::now() < deadline,
            "the web process never {}",
            if running { "started" } else { "ended" }
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn config(ok: &str) -> String {
    format!(
        r#"[[http]]
name = "api"
base_url = "{ok}/v1"
methods = ["GET"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "per_call"

[[http]]
name = "open"
base_url = "{ok}/open"
methods = ["GET"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
"#
    )
}

fn code(v: &Value) -> String {
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tray_counts_approvals_pauses_agents_and_keeps_serving_with_the_window_closed() {
    assert!(
        std::env::var_os("DISPLAY").is_some(),
        "DISPLAY is not set: run the tests with ./scripts/test.sh, which starts Xvfb"
    );
    let ok = Adversary::start(Behavior::ok_json("{\"ok\":true}"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config_home = dir.path().join("config");
    std::fs::create_dir_all(&data).unwrap();
    let config_path = data.join("postern.toml");
    std::fs::write(&config_path, config(&ok.base_url())).unwrap();
    let service = test_service();
    let keychain = ["--keychain", "keyutils", "--keychain-service", &service];

    // The credential, stored before the console starts (kernel keyring: the private
    // bus has no Secret Service).
    let set = postern_tests::run_with_stdin(
        Command::new(postern_bin())
            .args(["vault", "set", "api-key", "--data-dir"])
            .arg(&data)
            .args(keychain),
        CANARY.as_bytes(),
    )
    .unwrap();
    assert!(set.status.success(), "{set:?}");

    // The desktop: a private bus with a notification server and a tray host.
    let (_bus_daemon, address) = private_bus().unwrap();
    let desktop = Desktop::serve(&address).await.unwrap();

    let socket = data.join("run").join("postern.sock");
    let app = Process(
        Command::new(APP)
            .arg("--data-dir")
            .arg(&data)
            .arg("--config")
            .arg(&config_path)
            .args(keychain)
            .args(["--approval-timeout", "4"])
            .env("DBUS_SESSION_BUS_ADDRESS", &address)
            .env("XDG_CONFIG_HOME", &config_home)
            .env("NO_AT_BRIDGE", "1")
            .env("GTK_A11Y", "none")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let pid = app.0.id();

    // The app's indicator registers with the tray host.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (name, path) = loop {
        if let Some(item) = desktop.first_item() {
            break item;
        }
        assert!(
            Instant::now() < deadline,
            "the app never registered a tray item"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let tray = TrayView {
        bus: desktop.connection.clone(),
        name,
        path,
    };
    tray.wait_until("the idle status", async |t: &TrayView| {
        t.entry("No approvals waiting").await.is_some()
    })
    .await;
    assert_eq!(tray.label().await, "");
    for label in [
        "Open Postern",
        "Pause agents",
        "Start at login",
        "Quit Postern",
    ] {
        assert!(
            tray.entry(label).await.is_some(),
            "no {label:?} in the menu"
        );
    }
    let window = find_window(pid);
    wait_mapped(&window, true);
    // The shipped webview settings WebKit reads from the environment: the console
    // executed itself again with them, under the same process id.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        environ
            .split(|&b| b == 0)
            .any(|v| v == b"WEBKIT_DISABLE_DMABUF_RENDERER=1"),
        "the console runs without its webview environment"
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the agent socket never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = agent::connect(&postern_bin(), &socket).await.unwrap();

    // 1. A card: one notification (summary and what is asked, never the secret), and
    //    the count in the tray. Nobody answers; it times out.
    let waiting = {
        let c = client.clone();
        let url = ok.url("/v1/items");
        tokio::spawn(async move {
            agent::call(&c, "http_request", json!({"url": url, "method": "GET"}))
                .await
                .unwrap()
        })
    };
    tray.wait_until("one waiting approval", async |t: &TrayView| {
        t.label().await == "1" && t.entry("1 approval waiting").await.is_some()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let notice = loop {
        if let Some(n) = desktop.notices().first().cloned() {
            break n;
        }
        assert!(Instant::now() < deadline, "no desktop notification arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(notice.summary, "Postern: approval needed", "{notice:?}");
    assert!(
        notice.body.contains("api") && notice.body.contains("/v1/items"),
        "{notice:?}"
    );
    assert!(!notice.app_name.is_empty(), "{notice:?}");
    let timed_out = structured(&waiting.await.unwrap());
    assert_eq!(code(&timed_out), "APPROVAL_TIMEOUT", "{timed_out}");
    tray.wait_until("no waiting approval", async |t: &TrayView| {
        t.label().await.is_empty() && t.entry("No approvals waiting").await.is_some()
    })
    .await;
    assert_eq!(desktop.notices().len(), 1, "one notification per card");
    assert!(
        ok.requests().is_empty(),
        "nothing was sent without approval"
    );

    // 2. Pause agents: a call is refused with AGENTS_PAUSED, nothing is sent or
    //    recorded; reading still works. Resume: calls run again.
    tray.click("Pause agents").await;
    tray.wait_until("agents paused", async |t: &TrayView| {
        t.entry("Resume agents").await.is_some()
            && t.entry("No approvals waiting · agents paused")
                .await
                .is_some()
    })
    .await;
    let get = async |path: &str| {
        agent::call(
            &client,
            "http_request",
            json!({"url": ok.url(path), "method": "GET"}),
        )
        .await
        .unwrap()
    };
    let refused = structured(&get("/open/a").await);
    assert_eq!(code(&refused), "AGENTS_PAUSED", "{refused}");
    assert_eq!(refused["error"]["outcome"], "not_attempted");
    assert_eq!(refused["error"]["retry"], "backoff");
    assert!(refused["invocation_id"].is_null(), "nothing was recorded");
    assert!(ok.requests().is_empty(), "nothing was sent while paused");
    let listed = agent::call(&client, "list_targets", json!({}))
        .await
        .unwrap();
    assert!(listed.is_error != Some(true), "{listed:?}");
    tray.click("Resume agents").await;
    tray.wait_for_entry("Pause agents").await;
    let ran = get("/open/b").await;
    assert!(ran.is_error != Some(true), "{ran:?}");
    assert_eq!(ok.requests().len(), 1);

    // The page itself, as shipped (WebKit without accelerated compositing), takes a
    // person's click: its Pause agents button (at the foot of the 1180x780 window's
    // sidebar) pauses agents, and the tray follows.
    window.click_at(104, 754).unwrap();
    tray.wait_for_entry("Resume agents").await;
    tray.click("Resume agents").await;
    tray.wait_for_entry("Pause agents").await;

    // 3. Closing the window ends it and its web process (the memory an open console
    //    holds); the broker goes on serving; Open builds the window again.
    wait_web_process(pid, true);
    window.close().unwrap();
    wait_destroyed(&window);
    wait_web_process(pid, false);
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok(),
        "the app ended when its window closed"
    );
    let served = get("/open/c").await;
    assert!(served.is_error != Some(true), "{served:?}");
    assert_eq!(ok.requests().len(), 2);
    tray.click("Open Postern").await;
    let window = find_window(pid);
    wait_mapped(&window, true);
    wait_web_process(pid, true);

    // Starting the console again (its menu entry) shows this one's window and exits,
    // rather than opening a second broker on the same journal.
    window.close().unwrap();
    wait_destroyed(&window);
    let second = Command::new(APP)
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(&config_path)
        .args(keychain)
        .env("DBUS_SESSION_BUS_ADDRESS", &address)
        .env("XDG_CONFIG_HOME", &config_home)
        .env("NO_AT_BRIDGE", "1")
        .env("GTK_A11Y", "none")
        .output()
        .unwrap();
    assert!(second.status.success(), "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("already running"),
        "{second:?}"
    );
    let window = find_window(pid);
    wait_mapped(&window, true);

    // 4. Start at login writes the autostart entry (this console, in the tray, with its
    //    options); clicking again removes it.
    let entry = config_home.join("autostart/postern-console.desktop");
    tray.click("Start at login").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !entry.exists() {
        assert!(Instant::now() < deadline, "no autostart entry was written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = std::fs::read_to_string(&entry).unwrap();
    let exec = text
        .lines()
        .find_map(|l| l.strip_prefix("Exec="))
        .unwrap()
        .to_string();
    assert!(exec.starts_with(APP), "{exec}");
    assert!(exec.contains(" --background"), "{exec}");
    assert!(
        exec.contains(&format!("--data-dir {}", data.display())),
        "{exec}"
    );
    tray.wait_until("start at login checked", async |t: &TrayView| {
        t.entry("Start at login")
            .await
            .is_some_and(|e| e.toggle_state == Some(1))
    })
    .await;
    tray.click("Start at login").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while entry.exists() {
        assert!(Instant::now() < deadline, "the autostart entry stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 5. Quit ends the app (and with it the broker and its socket).
    let _ = client.cancel().await;
    tray.click("Quit Postern").await;
    let mut app = app;
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = app.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "Quit did not end the app");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "the agent socket outlived the app");
    assert!(
        desktop
            .notices()
            .iter()
            .all(|n| !n.body.contains(CANARY) && !n.summary.contains(CANARY)),
        "a notification carried the secret"
    );
}

#[test]
fn the_autostart_option_writes_and_removes_the_entry_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data dir");
    let run = |action: &str| {
        Command::new(APP)
            .args(["--autostart", action, "--data-dir"])
            .arg(&data)
            .env("XDG_CONFIG_HOME", dir.path())
            .output()
            .unwrap()
    };
    let out = run("enable");
    assert!(out.status.success(), "{out:?}");
    let entry = dir.path().join("autostart/postern-console.desktop");
    let text = std::fs::read_to_string(&entry).unwrap();
    assert!(
        text.contains(&format!(
            "\nExec={APP} --background --data-dir \"{}\"\n",
            data.display()
        )),
        "{text}"
    );
    assert!(
        !data.exists(),
        "enabling starts nothing and makes no data dir"
    );
    let out = run("disable");
    assert!(out.status.success(), "{out:?}");
    assert!(!entry.exists());
    let again = run("disable");
    assert!(again.status.success(), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to remove"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_at_login_stays_in_the_tray_until_opened() {
    assert!(
        std::env::var_os("DISPLAY").is_some(),
        "DISPLAY is not set: run the tests with ./scripts/test.sh, which starts Xvfb"
    );
    let dir = tempfile::tempdir().unwrap();
    let (_bus_daemon, address) = private_bus().unwrap();
    let desktop = Desktop::serve(&address).await.unwrap();
    let service = test_service();
    let app = Process(
        Command::new(APP)
            .arg("--background")
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--keychain", "keyutils", "--keychain-service", &service])
            .env("DBUS_SESSION_BUS_ADDRESS", &address)
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .env("NO_AT_BRIDGE", "1")
            .env("GTK_A11Y", "none")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let (name, path) = loop {
        if let Some(item) = desktop.first_item() {
            break item;
        }
        assert!(Instant::now() < deadline, "no tray item registered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let socket = dir.path().join("run/postern.sock");
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the broker never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The broker serves, and there is no window (nor a web process to render one)
    // until Open.
    let pid = app.0.id();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        Window::try_find(pid).unwrap().is_none(),
        "a background start made the window"
    );
    assert!(
        !has_web_process(pid),
        "a background start started a web process"
    );
    let tray = TrayView {
        bus: desktop.connection.clone(),
        name,
        path,
    };
    tray.click("Open Postern").await;
    wait_mapped(&find_window(pid), true);
    wait_web_process(pid, true);
}

//! The console as a desktop app: the real binary under the X display `scripts/test.sh`
//! starts, on a private session bus where this test plays the desktop. It owns
//! `org.freedesktop.Notifications` (and records every Notify call) and
//! `org.kde.StatusNotifierWatcher` (a tray host: the app's indicator registers with it,
//! and the test reads the item's label and clicks its D-Bus menu as a panel would), and
//! closes the window with WM_DELETE_WINDOW as a window manager would.
//!
//! It checks: a desktop notification per new approval card, without the secret; the
//! waiting count in the tray; Pause agents refusing agent calls with AGENTS_PAUSED until
//! Resume; closing the window hides it while the broker goes on serving, Open shows it,
//! and so does starting the console again (which then exits); Start at login writes and
//! removes the autostart entry; Quit ends the app.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use zbus::zvariant::{OwnedValue, Value as ZValue};

use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, structured};
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

/// A child process killed (by PID) on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A private session bus for the app and this test.
fn private_bus() -> (Process, String) {
    let mut child = Command::new("dbus-daemon")
        .args(["--session", "--nofork", "--print-address=1"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("dbus-daemon (package dbus-daemon / dbus)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line.trim().to_string();
    assert!(address.starts_with("unix:"), "dbus-daemon said {line:?}");
    (Process(child), address)
}

#[derive(Debug, Clone)]
struct Notice {
    app_name: String,
    summary: String,
    body: String,
}

/// `org.freedesktop.Notifications`, recording what it is asked to show.
struct Notifications {
    seen: Arc<Mutex<Vec<Notice>>>,
}

#[zbus::interface(name = "org.freedesktop.Notifications")]
impl Notifications {
    fn get_capabilities(&self) -> Vec<String> {
        vec!["body".into()]
    }

    #[allow(clippy::too_many_arguments)]
    fn notify(
        &self,
        app_name: String,
        _replaces_id: u32,
        _app_icon: String,
        summary: String,
        body: String,
        _actions: Vec<String>,
        _hints: HashMap<String, OwnedValue>,
        _expire_timeout: i32,
    ) -> u32 {
        let mut seen = self.seen.lock().unwrap();
        seen.push(Notice {
            app_name,
            summary,
            body,
        });
        seen.len() as u32
    }

    fn close_notification(&self, _id: u32) {}

    fn get_server_information(&self) -> (String, String, String, String) {
        (
            "postern-test".into(),
            "postern".into(),
            "1".into(),
            "1.2".into(),
        )
    }
}

/// `org.kde.StatusNotifierWatcher` with a host registered: a tray that shows icons.
/// The desktop's side of a private session bus: a notification server and a tray host
/// (StatusNotifierWatcher), and what reached each.
struct Desktop {
    connection: zbus::Connection,
    notices: Arc<Mutex<Vec<Notice>>>,
    items: Arc<Mutex<Vec<(String, String)>>>,
}

impl Desktop {
    async fn serve(address: &str) -> Desktop {
        let notices = Arc::new(Mutex::new(Vec::new()));
        let items = Arc::new(Mutex::new(Vec::new()));
        let connection = zbus::connection::Builder::address(address)
            .unwrap()
            .serve_at(
                "/org/freedesktop/Notifications",
                Notifications {
                    seen: notices.clone(),
                },
            )
            .unwrap()
            .serve_at(
                "/StatusNotifierWatcher",
                Watcher {
                    items: items.clone(),
                },
            )
            .unwrap()
            .name("org.freedesktop.Notifications")
            .unwrap()
            .name("org.kde.StatusNotifierWatcher")
            .unwrap()
            .build()
            .await
            .unwrap();
        Desktop {
            connection,
            notices,
            items,
        }
    }
}

struct Watcher {
    /// (bus name, object path) of each registered item.
    items: Arc<Mutex<Vec<(String, String)>>>,
}

#[zbus::interface(name = "org.kde.StatusNotifierWatcher")]
impl Watcher {
    fn register_status_notifier_item(
        &self,
        service: String,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) {
        let sender = header.sender().map(|s| s.to_string()).unwrap_or_default();
        // An item names its object path (libayatana-appindicator) or its bus name.
        let item = if service.starts_with('/') {
            (sender, service)
        } else {
            (service, "/StatusNotifierItem".to_string())
        };
        self.items.lock().unwrap().push(item);
    }

    fn register_status_notifier_host(&self, _service: String) {}

    #[zbus(property)]
    fn registered_status_notifier_items(&self) -> Vec<String> {
        self.items
            .lock()
            .unwrap()
            .iter()
            .map(|(name, path)| format!("{name}{path}"))
            .collect()
    }

    #[zbus(property)]
    fn is_status_notifier_host_registered(&self) -> bool {
        true
    }

    #[zbus(property)]
    fn protocol_version(&self) -> i32 {
        0
    }
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

/// The app's main window on the X display, found by its process id, driven as a
/// window manager would.
struct Window {
    conn: x11rb::rust_connection::RustConnection,
    window: u32,
}

impl Window {
    fn find(pid: u32) -> Window {
        use x11rb::connection::Connection;
        use x11rb::protocol::xproto::{AtomEnum, ConnectionExt};
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (conn, screen) = x11rb::connect(None).expect("an X display ($DISPLAY)");
            let root = conn.setup().roots[screen].root;
            let atom = |name: &[u8]| conn.intern_atom(false, name).unwrap().reply().unwrap().atom;
            let (pid_atom, utf8, net_name) = (
                atom(b"_NET_WM_PID"),
                atom(b"UTF8_STRING"),
                atom(b"_NET_WM_NAME"),
            );
            let children = conn.query_tree(root).unwrap().reply().unwrap().children;
            let found = children.into_iter().find(|&w| {
                let owner = conn
                    .get_property(false, w, pid_atom, AtomEnum::CARDINAL, 0, 1)
                    .unwrap()
                    .reply()
                    .ok()
                    .and_then(|p| p.value32().and_then(|mut v| v.next()));
                let name = conn
                    .get_property(false, w, net_name, utf8, 0, 64)
                    .unwrap()
                    .reply()
                    .map(|p| p.value)
                    .unwrap_or_default();
                owner == Some(pid) && name == b"Postern"
            });
            if let Some(window) = found {
                return Window { conn, window };
            }
            assert!(
                Instant::now() < deadline,
                "no window named Postern for pid {pid}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn mapped(&self) -> bool {
        use x11rb::protocol::xproto::{ConnectionExt, MapState};
        self.conn
            .get_window_attributes(self.window)
            .unwrap()
            .reply()
            .map(|a| a.map_state == MapState::VIEWABLE)
            .unwrap_or(false)
    }

    fn wait_mapped(&self, mapped: bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.mapped() != mapped {
            assert!(
                Instant::now() < deadline,
                "the window never became {}",
                if mapped { "visible" } else { "hidden" }
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A real mouse click (XTEST) at `(x, y)` inside the window: input as a person's
    /// pointer gives it, through the X server, GTK and WebKit.
    fn click_at(&self, x: i16, y: i16) {
        use x11rb::connection::Connection;
        use x11rb::protocol::xproto::{
            BUTTON_PRESS_EVENT, BUTTON_RELEASE_EVENT, ConnectionExt, MOTION_NOTIFY_EVENT,
        };
        use x11rb::protocol::xtest::ConnectionExt as _;
        let root = self.conn.setup().roots[0].root;
        let at = self
            .conn
            .translate_coordinates(self.window, root, x, y)
            .unwrap()
            .reply()
            .unwrap();
        let (rx, ry) = (at.dst_x, at.dst_y);
        for (kind, detail) in [
            (MOTION_NOTIFY_EVENT, 0),
            (BUTTON_PRESS_EVENT, 1),
            (BUTTON_RELEASE_EVENT, 1),
        ] {
            self.conn
                .xtest_fake_input(kind, detail, 0, root, rx, ry, 0)
                .unwrap();
            self.conn.flush().unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// WM_DELETE_WINDOW (ICCCM 4.2.8.1): what the title bar's close button sends.
    fn close(&self) {
        use x11rb::connection::Connection;
        use x11rb::protocol::xproto::{ClientMessageEvent, ConnectionExt, EventMask};
        let atom = |name: &[u8]| {
            self.conn
                .intern_atom(false, name)
                .unwrap()
                .reply()
                .unwrap()
                .atom
        };
        let event = ClientMessageEvent::new(
            32,
            self.window,
            atom(b"WM_PROTOCOLS"),
            [atom(b"WM_DELETE_WINDOW"), 0, 0, 0, 0],
        );
        self.conn
            .send_event(false, self.window, EventMask::NO_EVENT, event)
            .unwrap();
        self.conn.flush().unwrap();
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
    let (_bus_daemon, address) = private_bus();
    let Desktop {
        connection: desktop,
        notices,
        items,
    } = Desktop::serve(&address).await;

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
        if let Some(item) = items.lock().unwrap().first().cloned() {
            break item;
        }
        assert!(
            Instant::now() < deadline,
            "the app never registered a tray item"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let tray = TrayView {
        bus: desktop.clone(),
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
    let window = Window::find(pid);
    window.wait_mapped(true);

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
        if let Some(n) = notices.lock().unwrap().first().cloned() {
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
    assert_eq!(
        notices.lock().unwrap().len(),
        1,
        "one notification per card"
    );
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
    window.click_at(104, 754);
    tray.wait_for_entry("Resume agents").await;
    tray.click("Resume agents").await;
    tray.wait_for_entry("Pause agents").await;

    // 3. Closing the window hides it; the broker goes on serving; Open shows it again.
    window.close();
    window.wait_mapped(false);
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok(),
        "the app ended when its window closed"
    );
    let served = get("/open/c").await;
    assert!(served.is_error != Some(true), "{served:?}");
    assert_eq!(ok.requests().len(), 2);
    tray.click("Open Postern").await;
    window.wait_mapped(true);

    // Starting the console again (its menu entry) shows this one's window and exits,
    // rather than opening a second broker on the same journal.
    window.close();
    window.wait_mapped(false);
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
    window.wait_mapped(true);

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
    let notices = notices.lock().unwrap();
    assert!(
        notices
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
    let (_bus_daemon, address) = private_bus();
    let Desktop {
        connection: desktop,
        items,
        ..
    } = Desktop::serve(&address).await;
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
        if let Some(item) = items.lock().unwrap().first().cloned() {
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
    // The broker serves, and the window stays hidden until Open.
    let window = Window::find(app.0.id());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!window.mapped(), "a background start showed the window");
    let tray = TrayView {
        bus: desktop.clone(),
        name,
        path,
    };
    tray.click("Open Postern").await;
    window.wait_mapped(true);
}

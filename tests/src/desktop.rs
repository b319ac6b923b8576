//! The desktop around the console, for its tests and its memory benchmark: a private
//! session bus on which this side owns `org.freedesktop.Notifications` (recording every
//! Notify call) and `org.kde.StatusNotifierWatcher` (a tray host the app's indicator
//! registers with); the console's X window, driven as a window manager and a person's
//! pointer would; and the processes the console started, with their memory.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{AtomEnum, ClientMessageEvent, ConnectionExt, EventMask, MapState};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;
use zbus::zvariant::OwnedValue;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A child process killed (by PID) on drop.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a private session bus; its process and address.
pub fn private_bus() -> Result<(Process, String), Error> {
    let mut child = Command::new("dbus-daemon")
        .args(["--session", "--nofork", "--print-address=1"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("dbus-daemon (package dbus-daemon / dbus): {e}"))?;
    let stdout = child.stdout.take().ok_or("dbus-daemon has no stdout")?;
    let process = Process(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let address = line.trim().to_string();
    if !address.starts_with("unix:") {
        return Err(format!("dbus-daemon said {line:?}").into());
    }
    Ok((process, address))
}

/// One desktop notification as the server received it.
#[derive(Debug, Clone)]
pub struct Notice {
    pub app_name: String,
    pub summary: String,
    pub body: String,
}

/// What the desktop saw, shared with the bus's handlers.
type Shared<T> = Arc<Mutex<Vec<T>>>;

fn lock<T>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `org.freedesktop.Notifications`, recording what it is asked to show.
struct Notifications {
    seen: Shared<Notice>,
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
        let mut seen = lock(&self.seen);
        seen.push(Notice {
            app_name,
            summary,
            body,
        });
        u32::try_from(seen.len()).unwrap_or(u32::MAX)
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
struct Watcher {
    /// (bus name, object path) of each registered item.
    items: Shared<(String, String)>,
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
        lock(&self.items).push(item);
    }

    fn register_status_notifier_host(&self, _service: String) {}

    #[zbus(property)]
    fn registered_status_notifier_items(&self) -> Vec<String> {
        lock(&self.items)
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

/// The desktop's side of a private session bus: a notification server and a tray host,
/// and what reached each.
pub struct Desktop {
    pub connection: zbus::Connection,
    notices: Shared<Notice>,
    /// (bus name, object path) of each tray item registered.
    items: Shared<(String, String)>,
}

impl Desktop {
    /// Serves the notification server and the tray host on the bus at `address`.
    pub async fn serve(address: &str) -> zbus::Result<Desktop> {
        let notices = Arc::new(Mutex::new(Vec::new()));
        let items = Arc::new(Mutex::new(Vec::new()));
        let connection = zbus::connection::Builder::address(address)?
            .serve_at(
                "/org/freedesktop/Notifications",
                Notifications {
                    seen: notices.clone(),
                },
            )?
            .serve_at(
                "/StatusNotifierWatcher",
                Watcher {
                    items: items.clone(),
                },
            )?
            .name("org.freedesktop.Notifications")?
            .name("org.kde.StatusNotifierWatcher")?
            .build()
            .await?;
        Ok(Desktop {
            connection,
            notices,
            items,
        })
    }

    /// The first tray item registered, if one has been.
    pub fn first_item(&self) -> Option<(String, String)> {
        lock(&self.items).first().cloned()
    }

    /// Every notification received so far.
    pub fn notices(&self) -> Vec<Notice> {
        lock(&self.notices).clone()
    }
}

/// The console's main window on the X display, found by its process id.
pub struct Window {
    conn: RustConnection,
    window: u32,
}

impl Window {
    /// The top-level window named Postern that `pid` owns, if there is one now.
    pub fn try_find(pid: u32) -> Result<Option<Window>, Error> {
        let (conn, screen) = x11rb::connect(None)?;
        let root = conn
            .setup()
            .roots
            .get(screen)
            .ok_or("the X display has no such screen")?
            .root;
        let pid_atom = atom(&conn, b"_NET_WM_PID")?;
        let utf8 = atom(&conn, b"UTF8_STRING")?;
        let net_name = atom(&conn, b"_NET_WM_NAME")?;
        let children = conn.query_tree(root)?.reply()?.children;
        for w in children {
            let owner = conn
                .get_property(false, w, pid_atom, AtomEnum::CARDINAL, 0, 1)?
                .reply()
                .ok()
                .and_then(|p| p.value32().and_then(|mut v| v.next()));
            let name = conn
                .get_property(false, w, net_name, utf8, 0, 64)?
                .reply()
                .map(|p| p.value)
                .unwrap_or_default();
            if owner == Some(pid) && name == b"Postern" {
                return Ok(Some(Window { conn, window: w }));
            }
        }
        Ok(None)
    }

    /// Whether the window is shown (mapped and viewable).
    pub fn mapped(&self) -> bool {
        self.attributes()
            .is_some_and(|a| a.map_state == MapState::VIEWABLE)
    }

    /// Whether the window still exists on the display (hidden or not).
    pub fn exists(&self) -> bool {
        self.attributes().is_some()
    }

    fn attributes(&self) -> Option<x11rb::protocol::xproto::GetWindowAttributesReply> {
        self.conn
            .get_window_attributes(self.window)
            .ok()?
            .reply()
            .ok()
    }

    /// A real mouse click (XTEST) at `(x, y)` inside the window: input as a person's
    /// pointer gives it, through the X server, GTK and WebKit.
    pub fn click_at(&self, x: i16, y: i16) -> Result<(), Error> {
        use x11rb::protocol::xproto::{
            BUTTON_PRESS_EVENT, BUTTON_RELEASE_EVENT, MOTION_NOTIFY_EVENT,
        };
        let root = self
            .conn
            .setup()
            .roots
            .first()
            .ok_or("the X display has no screen")?
            .root;
        let at = self
            .conn
            .translate_coordinates(self.window, root, x, y)?
            .reply()?;
        for (kind, detail) in [
            (MOTION_NOTIFY_EVENT, 0),
            (BUTTON_PRESS_EVENT, 1),
            (BUTTON_RELEASE_EVENT, 1),
        ] {
            self.conn
                .xtest_fake_input(kind, detail, 0, root, at.dst_x, at.dst_y, 0)?;
            self.conn.flush()?;
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(())
    }

    /// WM_DELETE_WINDOW (ICCCM 4.2.8.1): what the title bar's close button sends.
    pub fn close(&self) -> Result<(), Error> {
        let event = ClientMessageEvent::new(
            32,
            self.window,
            atom(&self.conn, b"WM_PROTOCOLS")?,
            [atom(&self.conn, b"WM_DELETE_WINDOW")?, 0, 0, 0, 0],
        );
        self.conn
            .send_event(false, self.window, EventMask::NO_EVENT, event)?;
        self.conn.flush()?;
        Ok(())
    }
}

fn atom(conn: &RustConnection, name: &[u8]) -> Result<u32, Error> {
    Ok(conn.intern_atom(false, name)?.reply()?.atom)
}

/// The process ids of `pid`'s descendants (WebKit's web and network processes for the
/// console), children before their own children.
pub fn descendants(pid: u32) -> Vec<u32> {
    let children: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    let mut all = Vec::new();
    for child in children {
        all.push(child);
        all.extend(descendants(child));
    }
    all
}

/// A process's short name (`/proc/PID/comm`, at most 15 bytes).
pub fn name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default()
}

/// Whether `pid` has a WebKit web process (the page's renderer) among its descendants.
pub fn has_web_process(pid: u32) -> bool {
    descendants(pid)
        .into_iter()
        .any(|p| name(p).starts_with("WebKitWebProces"))
}

/// A process's proportional set size in KiB (`/proc/PID/smaps_rollup`), 0 once it is gone.
pub fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix("Pss:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

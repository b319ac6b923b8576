//! One console per data dir in a desktop session. Starting the console again (its menu
//! entry clicked while it sits in the tray) shows the running console's window and
//! exits, instead of opening a second broker on the same journal. The running console
//! owns a session-bus name made from its data dir (or the socket it attaches to) and
//! answers `Show` on it.

use std::sync::{Arc, OnceLock};

use tauri::{AppHandle, Wry};

use crate::tray;

const INTERFACE: &str = "dev.postern.Console";
const PATH: &str = "/dev/postern/Console";

/// The bus name of the console for `key` (its data dir or attach socket).
pub fn bus_name(key: &str) -> String {
    let digest = blake3::hash(key.as_bytes()).to_hex();
    format!("{INTERFACE}.i{}", &digest[..24])
}

/// Whether this process is the console for its key.
pub enum Claim {
    /// This is the only one: keep the connection for the life of the process and hand
    /// it the app once it runs.
    First(Instance),
    /// Another console runs for the same key and was asked to show its window.
    Shown,
    /// No session bus (or it refused): run without the check.
    Unknown(String),
}

/// The running console's end: its bus name and what `Show` reaches.
pub struct Instance {
    #[cfg(target_os = "linux")]
    _bus: zbus::blocking::Connection,
    app: Arc<OnceLock<AppHandle<Wry>>>,
}

impl Instance {
    /// From now on `Show` shows `app`'s main window.
    pub fn serve(&self, app: AppHandle<Wry>) {
        let _ = self.app.set(app);
    }
}

#[cfg(target_os = "linux")]
struct Shower {
    app: Arc<OnceLock<AppHandle<Wry>>>,
}

#[cfg(target_os = "linux")]
#[zbus::interface(name = "dev.postern.Console")]
impl Shower {
    /// Shows the main window (a second start of the console asks for this).
    fn show(&self) {
        if let Some(app) = self.app.get() {
            tray::show_main(app);
        }
    }
}

/// Elsewhere there is no session bus to ask: every start runs.
#[cfg(not(target_os = "linux"))]
pub fn claim(_key: &str) -> Claim {
    let _ = (INTERFACE, PATH, tray::show_main::<Wry>);
    Claim::Unknown("no session bus on this platform".into())
}

/// Claims the console's bus name for `key`, or asks its owner to show its window.
#[cfg(target_os = "linux")]
pub fn claim(key: &str) -> Claim {
    let name = bus_name(key);
    let app = Arc::new(OnceLock::new());
    let claimed = || -> zbus::Result<Option<zbus::blocking::Connection>> {
        let bus = zbus::blocking::Connection::session()?;
        bus.object_server().at(PATH, Shower { app: app.clone() })?;
        let flags = zbus::fdo::RequestNameFlags::DoNotQueue.into();
        match bus.request_name_with_flags(name.as_str(), flags) {
            Ok(zbus::fdo::RequestNameReply::PrimaryOwner)
            | Ok(zbus::fdo::RequestNameReply::AlreadyOwner) => Ok(Some(bus)),
            Ok(_) | Err(zbus::Error::NameTaken) => {
                bus.call_method(Some(name.as_str()), PATH, Some(INTERFACE), "Show", &())?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    };
    match claimed() {
        Ok(Some(bus)) => Claim::First(Instance { _bus: bus, app }),
        Ok(None) => Claim::Shown,
        Err(e) => Claim::Unknown(e.to_string()),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn each_data_dir_has_its_own_valid_bus_name() {
        let a = bus_name("/home/ada/.local/share/postern");
        let b = bus_name("/home/ada/other");
        assert_ne!(a, b);
        assert_eq!(a, bus_name("/home/ada/.local/share/postern"));
        // A bus name element may not start with a digit: the `i` prefix keeps it valid.
        assert!(
            zbus::names::WellKnownName::try_from(a.as_str()).is_ok(),
            "{a}"
        );
    }
}

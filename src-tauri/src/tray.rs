//! The tray icon: how many approvals wait (the label beside the icon, a dot on the icon,
//! the first line of the menu), and a menu to open the window, pause or resume agents,
//! start at login, and quit. With a tray shown, closing the window ends it (and with it
//! the webview and WebKit's processes, most of the console's memory) while the broker
//! goes on serving agents; Open builds it again; Quit ends both.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuEvent, MenuItem, PredefinedMenuItem};
use tauri::tray::{TrayIcon, TrayIconBuilder};
use tauri::{AppHandle, Emitter, Manager, Runtime};

use crate::autostart::Autostart;
use crate::commands::Backend;
use crate::dto::{AgentPauseState, PAUSE_CHANGED};
use crate::webview;
use postern_console::protocol::{OperatorCommand, PauseAgentsArgs, ResumeAgentsArgs};

/// Menu item ids (what the tray's D-Bus menu exposes, and what tests click).
pub const OPEN: &str = "open";
pub const PAUSE: &str = "pause";
pub const AUTOSTART: &str = "autostart";
pub const QUIT: &str = "quit";
const STATUS: &str = "status";

/// What the tray shows, and what its menu acts on.
pub struct Tray<R: Runtime> {
    icon: TrayIcon<R>,
    status: MenuItem<R>,
    pause: MenuItem<R>,
    autostart: CheckMenuItem<R>,
    plain: Option<Image<'static>>,
    badged: Option<Image<'static>>,
    state: Mutex<Shown>,
    /// Where the tray library writes its icon files (removed at exit).
    icon_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shown {
    pending: Option<usize>,
    paused: bool,
}

/// What starting at login runs: this console's own command line, in the tray.
#[derive(Debug, Clone)]
pub struct LoginCommand(pub Vec<String>);

/// The menu's first line.
pub fn status_text(pending: usize, paused: bool) -> String {
    let waiting = match pending {
        0 => "No approvals waiting".to_string(),
        1 => "1 approval waiting".to_string(),
        n => format!("{n} approvals waiting"),
    };
    if paused {
        format!("{waiting} · agents paused")
    } else {
        waiting
    }
}

/// `icon` with a red dot in its top-right corner: approvals are waiting (the count is
/// in the label, which not every tray shows).
fn badge(icon: &Image<'_>) -> Image<'static> {
    let (w, h) = (icon.width() as usize, icon.height() as usize);
    let mut rgba = icon.rgba().to_vec();
    let r = (w.min(h) as f64 * 0.22).max(2.0);
    let (cx, cy) = (w as f64 - r - 1.0, r + 1.0);
    for y in 0..h {
        for x in 0..w {
            let (dx, dy) = (x as f64 + 0.5 - cx, y as f64 + 0.5 - cy);
            let d = (dx * dx + dy * dy).sqrt();
            let i = (y * w + x) * 4;
            if d <= r && i + 3 < rgba.len() {
                let ring = d > r - (r * 0.2).max(1.0);
                let color: [u8; 4] = if ring {
                    [255, 255, 255, 255]
                } else {
                    [220, 38, 38, 255]
                };
                rgba[i..i + 4].copy_from_slice(&color);
            }
        }
    }
    Image::new_owned(rgba, w as u32, h as u32)
}

impl<R: Runtime> Tray<R> {
    /// Builds the tray icon and its menu.
    pub fn build(app: &AppHandle<R>, login: Option<&LoginCommand>) -> tauri::Result<Tray<R>> {
        let status = MenuItem::with_id(app, STATUS, status_text(0, false), false, None::<&str>)?;
        let open = MenuItem::with_id(app, OPEN, "Open Postern", true, None::<&str>)?;
        let pause = MenuItem::with_id(app, PAUSE, "Pause agents", true, None::<&str>)?;
        let enabled = Autostart::from_env().is_ok_and(|a| a.is_enabled());
        let autostart = CheckMenuItem::with_id(
            app,
            AUTOSTART,
            "Start at login",
            login.is_some(),
            enabled,
            None::<&str>,
        )?;
        let quit = MenuItem::with_id(app, QUIT, "Quit Postern", true, None::<&str>)?;
        let menu = Menu::with_items(
            app,
            &[
                &status,
                &PredefinedMenuItem::separator(app)?,
                &open,
                &pause,
                &autostart,
                &PredefinedMenuItem::separator(app)?,
                &quit,
            ],
        )?;
        let plain = app.default_window_icon().map(|i| i.clone().to_owned());
        let badged = plain.as_ref().map(badge);
        // Its own directory: the library names icon files by tray id, which every
        // Postern console shares.
        let icon_dir = std::env::temp_dir().join(format!("postern-tray-{}", std::process::id()));
        let mut builder = TrayIconBuilder::with_id("postern")
            .menu(&menu)
            .tooltip("Postern")
            .temp_dir_path(&icon_dir);
        if let Some(icon) = plain.clone() {
            builder = builder.icon(icon);
        }
        let icon = builder.build(app)?;
        Ok(Tray {
            icon,
            status,
            pause,
            autostart,
            plain,
            badged,
            state: Mutex::new(Shown {
                pending: None,
                paused: false,
            }),
            icon_dir,
        })
    }

    /// Shows `pending` waiting approvals.
    pub fn set_pending(&self, pending: usize) {
        let Some(now) = self.update(|s| s.pending = Some(pending)) else {
            return;
        };
        let label = (pending > 0).then(|| pending.to_string());
        let _ = self.icon.set_title(label.as_deref());
        let _ = self.icon.set_tooltip(Some(format!(
            "Postern: {}",
            status_text(pending, now.paused)
        )));
        let icon = if pending > 0 {
            self.badged.clone()
        } else {
            self.plain.clone()
        };
        if icon.is_some() {
            let _ = self.icon.set_icon(icon);
        }
    }

    /// Shows whether agents are paused.
    pub fn set_paused(&self, paused: bool) {
        if self.update(|s| s.paused = paused).is_none() {
            return;
        }
        let _ = self.pause.set_text(if paused {
            "Resume agents"
        } else {
            "Pause agents"
        });
    }

    /// Whether the menu last showed agents as paused.
    pub fn paused(&self) -> bool {
        self.state.lock().map(|s| s.paused).unwrap_or(false)
    }

    /// Applies `change`; the new state when it changed anything (the status line is
    /// redrawn then).
    fn update(&self, change: impl FnOnce(&mut Shown)) -> Option<Shown> {
        let mut state = self.state.lock().ok()?;
        let before = *state;
        change(&mut state);
        if *state == before {
            return None;
        }
        let now = *state;
        drop(state);
        let _ = self
            .status
            .set_text(status_text(now.pending.unwrap_or(0), now.paused));
        Some(now)
    }

    /// Removes the icon files the tray library wrote.
    pub fn clean_up(&self) {
        let _ = std::fs::remove_dir_all(&self.icon_dir);
    }
}

/// Shows the main window and brings it forward, building it again if closing it (to the
/// tray) ended it.
pub fn show_main<R: Runtime>(app: &AppHandle<R>) {
    let window = match app.get_webview_window(webview::MAIN) {
        Some(window) => window,
        None => match webview::open_main(app) {
            Ok(window) => window,
            Err(e) => {
                eprintln!("postern-console: opening the window: {e}");
                return;
            }
        },
    };
    let _ = window.unminimize();
    let _ = window.show();
    let _ = window.set_focus();
}

/// What a click in the tray's menu does.
pub fn on_menu_event<R: Runtime>(
    app: &AppHandle<R>,
    event: MenuEvent,
    backend: &Arc<Backend>,
    login: Option<&LoginCommand>,
) {
    let Some(tray) = app.try_state::<Tray<R>>() else {
        return;
    };
    match event.id().as_ref() {
        OPEN => show_main(app),
        PAUSE => {
            let command = if tray.paused() {
                OperatorCommand::ResumeAgents(ResumeAgentsArgs {})
            } else {
                OperatorCommand::PauseAgents(PauseAgentsArgs {})
            };
            let (app, backend) = (app.clone(), backend.clone());
            tauri::async_runtime::spawn(async move {
                let name = command.name();
                match backend.run(command, None).await {
                    Ok(state) => {
                        if let Ok(state) = serde_json::from_value::<AgentPauseState>(state) {
                            pause_changed(&app, state.paused);
                        }
                    }
                    Err(e) => eprintln!("postern-console: {name}: {}", e.message),
                }
            });
        }
        AUTOSTART => {
            let result = Autostart::from_env()
                .map_err(|e| e.to_string())
                .and_then(|a| {
                    if a.is_enabled() {
                        a.disable().map(|_| ()).map_err(|e| e.to_string())
                    } else {
                        match login {
                            Some(LoginCommand(command)) => {
                                a.enable(command).map(|_| ()).map_err(|e| e.to_string())
                            }
                            None => Err("this console cannot name its own program".into()),
                        }
                    }
                });
            if let Err(e) = result {
                eprintln!("postern-console: start at login: {e}");
            }
            let enabled = Autostart::from_env().is_ok_and(|a| a.is_enabled());
            let _ = tray.autostart.set_checked(enabled);
        }
        QUIT => app.exit(0),
        _ => {}
    }
}

/// Tells the tray and the webview that agents were paused or resumed.
pub fn pause_changed<R: Runtime>(app: &AppHandle<R>, paused: bool) {
    if let Some(tray) = app.try_state::<Tray<R>>() {
        tray.set_paused(paused);
    }
    let _ = app.emit(PAUSE_CHANGED, AgentPauseState { paused });
}

/// Shows `pending` waiting approvals in the tray, if there is one.
pub fn approvals_changed<R: Runtime>(app: &AppHandle<R>, pending: usize) {
    if let Some(tray) = app.try_state::<Tray<R>>() {
        tray.set_pending(pending);
    }
}

/// Whether a tray shows this app's icon, so a closed window can be opened again from it.
/// On freedesktop systems that is a StatusNotifierWatcher on the session bus with a host
/// registered (GNOME without an AppIndicator extension has none: closing the window
/// then quits, as it would without a tray).
#[cfg(target_os = "linux")]
pub fn tray_is_shown() -> bool {
    let shown = || -> zbus::Result<bool> {
        let bus = zbus::blocking::Connection::session()?;
        let watcher = zbus::blocking::Proxy::new(
            &bus,
            "org.kde.StatusNotifierWatcher",
            "/StatusNotifierWatcher",
            "org.kde.StatusNotifierWatcher",
        )?;
        watcher.get_property::<bool>("IsStatusNotifierHostRegistered")
    };
    shown().unwrap_or(false)
}

/// Elsewhere the system tray is always there.
#[cfg(not(target_os = "linux"))]
pub fn tray_is_shown() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_counts_and_says_when_agents_are_paused() {
        assert_eq!(status_text(0, false), "No approvals waiting");
        assert_eq!(status_text(1, false), "1 approval waiting");
        assert_eq!(status_text(3, true), "3 approvals waiting · agents paused");
    }

    #[test]
    fn the_badge_paints_a_dot_in_the_top_right_corner_only() {
        let (w, h) = (32u32, 32u32);
        let icon = Image::new_owned(vec![0u8; (w * h * 4) as usize], w, h);
        let badged = badge(&icon);
        let px = |x: u32, y: u32| {
            let i = ((y * w + x) * 4) as usize;
            badged.rgba()[i..i + 4].to_vec()
        };
        assert_eq!(
            px(w - 8, 7),
            vec![220, 38, 38, 255],
            "the dot's centre is red"
        );
        assert_eq!(px(2, h - 3), vec![0, 0, 0, 0], "the rest is untouched");
        assert_eq!(px(2, 2), vec![0, 0, 0, 0]);
    }
}

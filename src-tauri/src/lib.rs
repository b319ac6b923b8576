//! The Postern desktop console: the same broker `postern daemon` runs, in-process, with
//! this window as its approval console.
//!
//! # Layout
//! - [`console`]: what every command does, against the broker types (the
//!   `postern-console` crate, shared with the daemon).
//! - [`commands`]: the Tauri commands, thin wrappers over [`console::Console`].
//! - [`dto`]: the IPC types; [`bindings`] generates their TypeScript.
//! - [`app`]: startup: arguments, the broker, the agent socket, background watchers.
//! - [`tray`]: the tray icon (waiting approvals; open, pause agents, start at login,
//!   quit) and closing the window to it.
//! - [`autostart`]: the XDG autostart entry behind "start at login".
//! - [`instance`]: one console per data dir in a session; a second start shows the
//!   running one's window.
//! - [`webview`]: the webview settings that keep the idle console small.

pub mod app;
pub mod autostart;
pub mod bindings;
pub mod commands;
pub mod commands_list;
pub mod instance;
pub mod tray;
pub mod webview;

/// The operator logic and its IPC types live in `postern-console`, shared with the
/// daemon's operator socket.
pub use postern_console::{console, dto};

/// Runs the console; returns the process exit code.
pub fn main_entry() -> i32 {
    app::main_entry()
}

//! The Postern desktop console: the same broker `postern daemon` runs, in-process, with
//! this window as its approval console.
//!
//! # Layout
//! - [`console`]: what every command does, against the broker types (testable without
//!   a window).
//! - [`commands`]: the Tauri commands, thin wrappers over [`console::Console`].
//! - [`dto`]: the IPC types; [`bindings`] generates their TypeScript.
//! - [`app`]: startup: arguments, the broker, the agent socket, background watchers.

pub mod app;
pub mod bindings;
pub mod commands;
pub mod commands_list;
pub mod console;
pub mod dto;

/// Runs the console; returns the process exit code.
pub fn main_entry() -> i32 {
    app::main_entry()
}

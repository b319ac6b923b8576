//! The desktop's one Tauri command, `operator`: the webview sends a typed operator
//! command ([`OperatorCommand`], declared once in `postern_console::protocol`), and it
//! goes to the console's dispatcher through a [`Backend`]: in-process (the broker runs
//! inside this app) or attached (the broker runs as its own user and this window reaches
//! it over the operator socket). The command is in `commands_list.rs`, gets an
//! `allow-operator` permission, and is granted to the main window only
//! (`capabilities/main-window.json`).
//!
//! None of this is reachable by an agent: agents speak MCP on the agent socket, which
//! has no tool to approve, reveal a secret, read the audit log or change configuration.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use tauri::{AppHandle, Manager, Runtime, State};

use postern_console::console::Console;
use postern_console::dispatch::{Caller, handle};
use postern_console::dto::*;
use postern_console::operator::OperatorClient;
use postern_console::protocol::{OperatorCommand, WireCommand};

/// Where the console's commands go.
pub enum Backend {
    /// The broker runs in this process.
    InProcess(Arc<Console>),
    /// The broker runs elsewhere (as its own system user); commands go over its
    /// operator socket.
    Attached(OperatorClient),
}

impl Backend {
    /// Runs `command`; `export_dir` is where an in-process export writes (an attached
    /// broker writes into its own data dir).
    pub async fn run(
        &self,
        command: OperatorCommand,
        export_dir: Option<PathBuf>,
    ) -> Result<Value, CommandError> {
        match self {
            Backend::InProcess(console) => {
                let mut caller = Caller::local(console);
                if let Some(dir) = export_dir {
                    caller.export_dir = dir;
                }
                handle(console, &caller, command).await
            }
            Backend::Attached(client) => client.run(&command).await,
        }
    }
}

type BackendState<'a> = State<'a, Arc<Backend>>;

/// Every operator command from the webview, checked into its typed form (a bad one is
/// the same typed error the operator socket gives). An export goes to the user's
/// downloads folder when there is one.
#[tauri::command]
pub async fn operator<R: Runtime>(
    app: AppHandle<R>,
    backend: BackendState<'_>,
    request: WireCommand,
) -> Result<Value, CommandError> {
    let request = request.parse()?;
    let dir = match request {
        OperatorCommand::ExportActivity(_) => app.path().download_dir().ok().filter(|d| d.is_dir()),
        _ => None,
    };
    backend.run(request, dir).await
}

/// Registers the command; the list must match `commands_list.rs` (tested).
#[macro_export]
macro_rules! console_handlers {
    () => {
        tauri::generate_handler![$crate::commands::operator]
    };
}

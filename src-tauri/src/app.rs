//! Startup: arguments, the in-process broker with this window as its approver, the
//! agent socket, and the watchers that push changes to the webview.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tauri::{Emitter, Manager, Runtime};
use tauri_plugin_notification::NotificationExt;

use postern_broker::approvals::Approvals;
use postern_broker::clock::SystemClock;
use postern_mcp::server::Sessions;
use postern_mcp::{DaemonArgs, KeychainChoice, daemon};

use postern_console::operator::OperatorClient;
use postern_console::protocol::{IntegrityArgs, ListApprovalsArgs, OperatorCommand, OverviewArgs};
use serde_json::json;

use crate::autostart::Autostart;
use crate::commands::Backend;
use crate::console::{Console, Paths};
use crate::dto::{
    APPROVALS_CHANGED, ApprovalsChanged, INTEGRITY_CHANGED, JOURNAL_CHANGED, JournalChanged,
};
use crate::instance;
use crate::tray::{self, LoginCommand, Tray};
use crate::webview;

/// `postern-console`: the desktop console. Every option has a default; a plain start
/// uses the same data dir, config and socket as `postern daemon`.
#[derive(Debug, Clone, Parser)]
#[command(name = "postern-console", version, about)]
pub struct Args {
    /// Journal, vault metadata and socket live here [default: $XDG_DATA_HOME/postern].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The targets file [default: DATA_DIR/postern.toml, created empty if missing].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The socket agents reach through `postern mcp` [default: DATA_DIR/run/postern.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Where credentials live: `native` is this platform's own keychain (the Secret
    /// Service on Linux, the login keychain on macOS, the Credential Manager on Windows).
    #[arg(long, value_enum, default_value = "native")]
    pub keychain: Keychain,
    /// Keychain service name (tests use their own).
    #[arg(long, default_value = "postern")]
    pub keychain_service: String,
    /// How long a request waits for an answer, in seconds.
    #[arg(long, default_value_t = 300)]
    pub approval_timeout: u64,
    /// Attach to a privilege-separated broker (`postern daemon` running as its own
    /// user) through its operator socket, instead of running the broker in this
    /// process. The other options are then the daemon's business and are ignored.
    #[arg(long, value_name = "SOCKET")]
    pub attach: Option<PathBuf>,
    /// Start in the tray, without opening the window (what starting at login does). The
    /// window opens anyway when no tray shows the icon.
    #[arg(long)]
    pub background: bool,
    /// Write (`enable`) or remove (`disable`) the XDG autostart entry that starts this
    /// console in the tray at login, with the other options given here; then exit.
    #[arg(long, value_enum, value_name = "ACTION")]
    pub autostart: Option<AutostartAction>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AutostartAction {
    Enable,
    Disable,
}

impl Args {
    /// A console over `data_dir` with its targets file inside it and the Secret Service
    /// keychain under `service` (tests and benchmarks use their own service names).
    pub fn in_dir(data_dir: &std::path::Path, service: &str) -> Args {
        Args {
            data_dir: Some(data_dir.to_path_buf()),
            config: Some(data_dir.join("postern.toml")),
            socket: None,
            keychain: Keychain::SecretService,
            keychain_service: service.to_string(),
            approval_timeout: 20,
            attach: None,
            background: false,
            autostart: None,
        }
    }

    /// What starting at login runs: this program in the tray, with the options given
    /// here that are not their defaults. `None` when the program cannot name itself.
    pub fn login_command(&self) -> Option<LoginCommand> {
        let exe = std::env::current_exe().ok()?;
        let mut command = vec![exe.to_str()?.to_string(), "--background".to_string()];
        let mut path = |flag: &str, value: &Option<PathBuf>| -> Option<()> {
            if let Some(value) = value {
                let absolute = std::path::absolute(value).ok()?;
                command.push(flag.to_string());
                command.push(absolute.to_str()?.to_string());
            }
            Some(())
        };
        if self.attach.is_some() {
            path("--attach", &self.attach)?;
            return Some(LoginCommand(command));
        }
        path("--data-dir", &self.data_dir)?;
        path("--config", &self.config)?;
        path("--socket", &self.socket)?;
        match self.keychain {
            Keychain::Native => {}
            Keychain::SecretService => {
                command.extend(["--keychain".to_string(), "secret-service".to_string()]);
            }
            Keychain::Keyutils => {
                command.extend(["--keychain".to_string(), "keyutils".to_string()]);
            }
        }
        if self.keychain_service != "postern" {
            command.extend([
                "--keychain-service".to_string(),
                self.keychain_service.clone(),
            ]);
        }
        if self.approval_timeout != 300 {
            command.extend([
                "--approval-timeout".to_string(),
                self.approval_timeout.to_string(),
            ]);
        }
        Some(LoginCommand(command))
    }
}

/// `--autostart enable|disable`: writes or removes the entry; the exit code.
fn autostart_command(args: &Args, action: AutostartAction) -> i32 {
    let autostart = match Autostart::from_env() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("postern-console: {e}");
            return 1;
        }
    };
    let result = match action {
        AutostartAction::Enable => match args.login_command() {
            Some(LoginCommand(command)) => autostart
                .enable(&command)
                .map(|path| format!("starts at login: {}", path.display())),
            None => {
                eprintln!("postern-console: cannot name this program's path");
                return 1;
            }
        },
        AutostartAction::Disable => autostart.disable().map(|removed| {
            if removed {
                format!(
                    "no longer starts at login: removed {}",
                    autostart.entry().display()
                )
            } else {
                "did not start at login: nothing to remove".to_string()
            }
        }),
    };
    match result {
        Ok(message) => {
            println!("{message}");
            0
        }
        Err(e) => {
            eprintln!("postern-console: {e}");
            1
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Keychain {
    Native,
    SecretService,
    Keyutils,
}

/// Everything startup decided, before any window exists.
pub struct Started {
    pub console: Arc<Console>,
    pub daemon_args: DaemonArgs,
}

/// Opens the broker (creating the data dir and an empty targets file on first run).
pub fn start(args: &Args) -> Result<Started, String> {
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(postern_mcp::default_data_dir);
    std::fs::create_dir_all(&data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let config = match args.config.clone() {
        Some(config) => {
            if !config.exists() {
                std::fs::write(&config, postern_console::headless::EMPTY_CONFIG)
                    .map_err(|e| format!("{}: {e}", config.display()))?;
            }
            config
        }
        None => postern_console::headless::default_config(&data_dir)
            .map_err(|e| format!("{}: {e}", data_dir.display()))?,
    };
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| postern_mcp::default_socket(&data_dir));
    let keychain = match args.keychain {
        Keychain::Native => KeychainChoice::platform_default(),
        Keychain::SecretService => KeychainChoice::SecretService,
        Keychain::Keyutils => KeychainChoice::Keyutils,
    };
    let daemon_args = DaemonArgs {
        data_dir: data_dir.clone(),
        config: config.clone(),
        socket: Some(socket.clone()),
        keychain,
        service: args.keychain_service.clone(),
        anchor: None,
        vault_key_file: None,
    };
    let approvals = Arc::new(Approvals::new(
        Duration::from_secs(args.approval_timeout.max(1)),
        Arc::new(SystemClock),
    ));
    let engine = postern_console::headless::open_broker(&daemon_args, Some(approvals.clone()))
        .map_err(|e| e.to_string())?;
    let console = Arc::new(Console::new(
        engine,
        Arc::new(Sessions::default()),
        approvals,
        Paths {
            data_dir,
            config,
            socket,
            keychain: keychain.as_str().into(),
        },
    ));
    Ok(Started {
        console,
        daemon_args,
    })
}

/// `builder` with the console's state and every command; generic so the tests can use
/// Tauri's mock runtime.
pub fn with_console<R: Runtime>(
    builder: tauri::Builder<R>,
    console: Arc<Console>,
) -> tauri::Builder<R> {
    with_backend(builder, Arc::new(Backend::InProcess(console)))
}

/// `builder` with `backend` behind every command.
pub fn with_backend<R: Runtime>(
    builder: tauri::Builder<R>,
    backend: Arc<Backend>,
) -> tauri::Builder<R> {
    builder
        .manage(backend)
        .invoke_handler(crate::console_handlers!())
}

/// A desktop notification (and a request for attention) for each card not seen before;
/// `seen` keeps only the cards still pending.
fn notify_new_cards<R: Runtime>(
    app: &tauri::AppHandle<R>,
    pending: &[(String, String)],
    seen: &mut HashSet<String>,
) {
    for (id, body) in pending {
        if seen.insert(id.clone()) {
            // Without the notification plugin (tests) or a notification daemon (a
            // bare X server) the card still appears; neither is an error.
            if app
                .try_state::<tauri_plugin_notification::Notification<R>>()
                .is_some()
            {
                let _ = app
                    .notification()
                    .builder()
                    .title("Postern: approval needed")
                    .body(body)
                    .show();
            }
            if let Some(window) = app.get_webview_window(webview::MAIN) {
                let _ =
                    window.request_user_attention(Some(tauri::UserAttentionType::Informational));
            }
        }
    }
    seen.retain(|id| pending.iter().any(|(p, _)| p == id));
}

/// What a notification says about one card.
fn card_notice(mode: &str, target: &str, summary: &str) -> String {
    match mode {
        "host_key" => format!("First connection to {target}: check its host key"),
        _ => format!("{target} wants {summary}"),
    }
}

/// Pushes approval changes to the webview, with a desktop notification per new request.
pub async fn watch_approvals<R: Runtime>(app: tauri::AppHandle<R>, console: Arc<Console>) {
    let mut changes = console.approvals.subscribe();
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        let pending = console.approval_cards();
        let notices: Vec<(String, String)> = pending
            .iter()
            .map(|c| {
                (
                    c.invocation_id.clone(),
                    card_notice(&c.mode, &c.target, &c.summary),
                )
            })
            .collect();
        notify_new_cards(&app, &notices, &mut seen);
        tray::approvals_changed(&app, pending.len());
        let _ = app.emit(APPROVALS_CHANGED, ApprovalsChanged { pending });
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Follows the operator's pause of agent calls into the tray and the webview.
pub async fn watch_pause<R: Runtime>(app: tauri::AppHandle<R>, console: Arc<Console>) {
    let mut pause = console.engine.pause().subscribe();
    loop {
        let paused = *pause.borrow_and_update();
        tray::pause_changed(&app, paused);
        if pause.changed().await.is_err() {
            return;
        }
    }
}

/// Tells the webview when the journal grows, so open views refresh, and keeps the
/// integrity banner current: the whole file is re-verified at start and every minute,
/// and what is new is verified after changes (at most every second, and never more than
/// a tenth of the time).
pub async fn watch_journal<R: Runtime>(app: tauri::AppHandle<R>, console: Arc<Console>) {
    let mut last_seen = 0u64;
    let mut verified_seq = None::<u64>;
    let mut verified_at = None::<std::time::Instant>;
    let mut verify_cost = Duration::ZERO;
    loop {
        let seq = console.last_seq().ok();
        if let Some(seq) = seq
            && seq != last_seen
        {
            last_seen = seq;
            let _ = app.emit(JOURNAL_CHANGED, JournalChanged { last_seq: seq });
        }
        let since = verified_at.map(|t| t.elapsed());
        let spacing = (verify_cost * 10).max(Duration::from_secs(1));
        let due = match since {
            None => true,
            Some(since) => {
                since >= Duration::from_secs(60) || (seq != verified_seq && since >= spacing)
            }
        };
        if due {
            let c = console.clone();
            let started = std::time::Instant::now();
            // A full check at start and every minute; in between, only what is new.
            let full = since.is_none_or(|s| s >= Duration::from_secs(60));
            let check = move || {
                if full {
                    c.verify_now()
                } else {
                    c.verify_incremental()
                }
            };
            if let Ok(state) = tauri::async_runtime::spawn_blocking(check).await {
                let _ = app.emit(INTEGRITY_CHANGED, state);
            }
            verify_cost = started.elapsed();
            verified_at = Some(std::time::Instant::now());
            verified_seq = seq;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The attached console's watcher: the broker is another process, so its changes are
/// polled over the operator socket (every second) and pushed to the webview as the same
/// events the in-process watchers send. The journal is re-verified (by the broker) at
/// start, after changes at most every five seconds, and every minute.
pub async fn watch_attached<R: Runtime>(app: tauri::AppHandle<R>, backend: Arc<Backend>) {
    let mut last_seq = None::<u64>;
    let mut pending_count = None::<u64>;
    let mut paused = None::<bool>;
    let mut seen: HashSet<String> = HashSet::new();
    let mut verified: Option<(std::time::Instant, u64)> = None;
    loop {
        if let Ok(overview) = backend
            .run(OperatorCommand::Overview(OverviewArgs {}), None)
            .await
        {
            let seq = overview["last_seq"].as_u64().unwrap_or(0);
            let pending = overview["pending_approvals"].as_u64().unwrap_or(0);
            let agents_paused = overview["agents_paused"].as_bool().unwrap_or(false);
            if paused != Some(agents_paused) {
                tray::pause_changed(&app, agents_paused);
                paused = Some(agents_paused);
            }
            if last_seq != Some(seq) {
                let _ = app.emit(JOURNAL_CHANGED, JournalChanged { last_seq: seq });
            }
            if (last_seq != Some(seq) || pending_count != Some(pending))
                && let Ok(cards) = backend
                    .run(OperatorCommand::ListApprovals(ListApprovalsArgs {}), None)
                    .await
            {
                let notices: Vec<(String, String)> = cards
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|c| {
                        let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                        (
                            text("invocation_id"),
                            card_notice(&text("mode"), &text("target"), &text("summary")),
                        )
                    })
                    .collect();
                notify_new_cards(&app, &notices, &mut seen);
                tray::approvals_changed(&app, notices.len());
                let _ = app.emit(APPROVALS_CHANGED, json!({ "pending": cards }));
            }
            last_seq = Some(seq);
            pending_count = Some(pending);
            let due = match verified {
                None => true,
                Some((at, through)) => {
                    at.elapsed() >= Duration::from_secs(60)
                        || (through != seq && at.elapsed() >= Duration::from_secs(5))
                }
            };
            if due
                && let Ok(state) = backend
                    .run(
                        OperatorCommand::Integrity(IntegrityArgs { recheck: true }),
                        None,
                    )
                    .await
            {
                let _ = app.emit(INTEGRITY_CHANGED, state);
                verified = Some((std::time::Instant::now(), seq));
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The tray (when one can be made), and the main window, unless the console starts in
/// the tray (`--background`) and a tray shows the icon to open it from.
fn setup_desktop<R: Runtime>(
    app: &tauri::AppHandle<R>,
    backend: Arc<Backend>,
    login: Option<LoginCommand>,
    background: bool,
) -> tauri::Result<()> {
    match Tray::build(app, login.as_ref()) {
        Ok(tray) => {
            app.manage(tray);
            app.on_menu_event(move |app, event| {
                tray::on_menu_event(app, event, &backend, login.as_ref())
            });
        }
        // No tray library (or no display for one): the window is the console, and
        // closing it quits as before.
        Err(e) => eprintln!("postern-console: no tray icon: {e}"),
    }
    if !(background && in_tray(app)) {
        webview::open_main(app)?;
    }
    Ok(())
}

/// Whether the app has a tray icon that a desktop shows, to open the window from.
fn in_tray<R: Runtime>(app: &tauri::AppHandle<R>) -> bool {
    app.try_state::<Tray<R>>().is_some() && tray::tray_is_shown()
}

/// With a tray shown, closing the window does not end the app: the window and its
/// webview go (WebKit's processes with them, most of the console's idle memory) and the
/// broker goes on serving; Open in the tray builds the window again. Without a tray,
/// closing the last window ends the app as usual. An explicit exit (Quit, a signal)
/// always ends it.
fn keep_serving_in_tray<R: Runtime>(app: &tauri::AppHandle<R>, event: &tauri::RunEvent) {
    if let tauri::RunEvent::ExitRequested {
        code: None, api, ..
    } = event
        && in_tray(app)
    {
        api.prevent_exit();
    }
}

/// SIGTERM/SIGINT end the app the same way closing the window does, so the journal signs
/// its final checkpoint.
fn exit_on_termination<R: Runtime>(app: &tauri::AppHandle<R>) {
    let exit = app.clone();
    tauri::async_runtime::spawn(async move {
        if let Ok(mut terminate) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = terminate.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
            exit.exit(0);
        }
    });
}

/// What every exit does: the tray's icon files go.
fn on_exit<R: Runtime>(app: &tauri::AppHandle<R>) {
    if let Some(tray) = app.try_state::<Tray<R>>() {
        tray.clean_up();
    }
}

/// This console's claim on its data dir (or attach socket) in the desktop session; the
/// exit code when another console has it (and was asked to show its window).
fn claim_instance(args: &Args) -> Result<Option<instance::Instance>, i32> {
    let key = match (&args.attach, &args.data_dir) {
        (Some(socket), _) => format!("attach:{}", absolute(socket).display()),
        (None, Some(dir)) => absolute(dir).display().to_string(),
        (None, None) => absolute(&postern_mcp::default_data_dir())
            .display()
            .to_string(),
    };
    match instance::claim(&key) {
        instance::Claim::First(instance) => Ok(Some(instance)),
        instance::Claim::Shown => {
            eprintln!("postern-console: already running for {key}; showed its window");
            Err(0)
        }
        instance::Claim::Unknown(e) => {
            eprintln!("postern-console: cannot check for another console on the session bus: {e}");
            Ok(None)
        }
    }
}

/// `path` made absolute and, when it exists, without symlinks.
fn absolute(path: &std::path::Path) -> PathBuf {
    path.canonicalize()
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// From now on a second start shows this app's window.
fn serve_instance(app: &tauri::AppHandle<tauri::Wry>, instance: Option<instance::Instance>) {
    if let Some(instance) = instance {
        instance.serve(app.clone());
        app.manage(instance);
    }
}

/// The console attached to a broker's operator socket: no broker in this process.
fn main_attached(args: &Args, socket: PathBuf, instance: Option<instance::Instance>) -> i32 {
    let backend = Arc::new(Backend::Attached(OperatorClient::new(socket.clone())));
    let login = args.login_command();
    let background = args.background;
    let app = with_backend(tauri::Builder::<tauri::Wry>::new(), backend.clone())
        .plugin(tauri_plugin_notification::init())
        .setup(move |app| {
            setup_desktop(app.handle(), backend.clone(), login, background)?;
            serve_instance(app.handle(), instance);
            eprintln!(
                "postern-console: attached to the broker's operator socket {}",
                socket.display()
            );
            let handle = app.handle().clone();
            exit_on_termination(&handle);
            tauri::async_runtime::spawn(watch_attached(handle, backend.clone()));
            Ok(())
        })
        .build(tauri::generate_context!("../tauri.conf.json"));
    match app {
        Ok(app) => {
            app.run(|app, event| {
                keep_serving_in_tray(app, &event);
                if let tauri::RunEvent::Exit = event {
                    on_exit(app);
                }
            });
            0
        }
        Err(e) => {
            eprintln!("postern-console: {e}");
            1
        }
    }
}

/// Serves `postern shield` on the control socket beside the agent socket, in the
/// background; a console that cannot bind it says so and runs without shields.
async fn serve_shields(
    agents: &postern_broker::AgentApi,
    sessions: &Arc<postern_mcp::server::Sessions>,
    socket: &std::path::Path,
    setup: daemon::shield::ShieldSetup,
) {
    match daemon::shield::bind_control(socket).await {
        Ok(listener) => {
            tauri::async_runtime::spawn(daemon::shield::serve_control(
                agents.clone(),
                sessions.clone(),
                setup,
                listener,
                std::future::pending(),
            ));
        }
        Err(e) => eprintln!("postern-console: shield socket (postern shield): {e}"),
    }
}

/// Runs the console; returns the process exit code.
pub fn main_entry() -> i32 {
    let args = Args::parse();
    if let Some(action) = args.autostart {
        return autostart_command(&args, action);
    }
    webview::reexec_with_environment();
    // Before any secret is read: no same-user process may read this one's memory (the
    // webview's own processes are separate and never hold one).
    if let Err(e) = postern_broker::platform::harden_process() {
        eprintln!("postern-console: warning: this process could not be made non-dumpable ({e})");
    }
    let instance = match claim_instance(&args) {
        Ok(instance) => instance,
        Err(code) => return code,
    };
    if let Some(socket) = args.attach.clone() {
        return main_attached(&args, socket, instance);
    }
    let started = match start(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("postern-console: {e}");
            return 1;
        }
    };
    let console = started.console.clone();
    let socket = started.console.paths.socket.clone();
    let daemon_args = started.daemon_args.clone();
    let trace_startup = std::env::var_os("POSTERN_STARTUP_TRACE").is_some();
    let login = args.login_command();
    let background = args.background;
    let backend = Arc::new(Backend::InProcess(console.clone()));
    let app = with_backend(tauri::Builder::<tauri::Wry>::new(), backend.clone())
        .plugin(tauri_plugin_notification::init())
        .on_page_load(move |webview, payload| {
            // For the startup benchmark: when the main page has loaded (the UI mounts
            // synchronously from its module script), print the wall-clock time.
            if trace_startup
                && webview.label() == "main"
                && matches!(payload.event(), tauri::webview::PageLoadEvent::Finished)
            {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0);
                eprintln!("postern-console: page-loaded-epoch-ms={now}");
            }
        })
        .setup(move |app| {
            let handle = app.handle().clone();
            setup_desktop(&handle, backend.clone(), login, background)?;
            serve_instance(&handle, instance);
            let agents = console.engine.agent();
            let sessions = console.sessions.clone();
            let socket = socket.clone();
            let shields = daemon::shield::ShieldSetup::for_daemon(&daemon_args, &socket, None);
            tauri::async_runtime::spawn(async move {
                match daemon::bind(&socket).await {
                    Ok(listener) => {
                        eprintln!("postern-console: agents connect on {}", socket.display());
                        serve_shields(&agents, &sessions, &socket, shields).await;
                        daemon::serve(agents, sessions, listener, std::future::pending()).await;
                    }
                    Err(e) => eprintln!("postern-console: agent socket: {e}"),
                }
            });
            exit_on_termination(&handle);
            tauri::async_runtime::spawn(watch_approvals(handle.clone(), console.clone()));
            tauri::async_runtime::spawn(watch_pause(handle.clone(), console.clone()));
            tauri::async_runtime::spawn(watch_journal(handle, console.clone()));
            tauri::async_runtime::spawn(console.engine.witnessing().clone().run());
            Ok(())
        })
        .build(tauri::generate_context!("../tauri.conf.json"));
    let app = match app {
        Ok(app) => app,
        Err(e) => {
            eprintln!("postern-console: {e}");
            return 1;
        }
    };
    let journal = started.console.engine.journal().clone();
    let socket = started.daemon_args.socket.clone();
    app.run(move |app, event| {
        keep_serving_in_tray(app, &event);
        if let tauri::RunEvent::Exit = event {
            on_exit(app);
            if let Some(socket) = &socket {
                let _ = std::fs::remove_file(socket);
                let _ = std::fs::remove_file(daemon::shield::control_socket(socket));
            }
            // A clean exit signs a final audit checkpoint.
            if let Err(e) = journal.clone().close() {
                eprintln!("postern-console: closing the journal: {e}");
            }
        }
    });
    0
}

//! The console's idle memory with its window open, after the window was closed to the
//! tray, and when started in the tray (`--background`): PSS summed over the app and the
//! processes it started (WebKit's), on a private session bus where this program plays
//! the desktop (a tray host, so the console keeps serving with its window closed) under
//! the X display the caller set up.
//!
//! Usage: `console_tray_memory PATH-TO-CONSOLE [RUNS]` (default 3 runs); prints a
//! Markdown table of the medians.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (app, runs) = match args.as_slice() {
        [app] => (app.clone(), 3),
        [app, runs] => match runs.parse::<usize>() {
            Ok(n) if n > 0 => (app.clone(), n),
            _ => return usage(),
        },
        _ => return usage(),
    };
    match measure::all(&app, runs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("console_tray_memory: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: console_tray_memory PATH-TO-CONSOLE [RUNS]");
    ExitCode::from(2)
}

#[cfg(target_os = "linux")]
mod measure {
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use postern_tests::desktop::{
        Desktop, Process, Window, descendants, has_web_process, name, private_bus, pss_kib,
    };

    type Error = Box<dyn std::error::Error + Send + Sync>;

    /// How long the console idles before each reading.
    const SETTLE: Duration = Duration::from_secs(10);

    /// PSS in KiB: the app alone, and the app with everything it started.
    #[derive(Debug, Clone, Copy, Default)]
    struct Reading {
        app: u64,
        total: u64,
        processes: usize,
    }

    fn read(pid: u32) -> Reading {
        let others = descendants(pid);
        let app = pss_kib(pid);
        Reading {
            app,
            total: app + others.iter().map(|&p| pss_kib(p)).sum::<u64>(),
            processes: 1 + others.len(),
        }
    }

    fn wait(what: &str, mut done: impl FnMut() -> bool) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            if Instant::now() > deadline {
                return Err(format!("timed out waiting for {what}").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn start(app: &str, data: &Path, bus: &str, background: bool) -> Result<Process, Error> {
        let mut command = Command::new(app);
        if background {
            command.arg("--background");
        }
        let child = command
            .arg("--data-dir")
            .arg(data)
            .args(["--keychain", "keyutils"])
            .args(["--keychain-service", "postern-memory-bench"])
            .env("DBUS_SESSION_BUS_ADDRESS", bus)
            .env("XDG_CONFIG_HOME", data.join("config"))
            .env("NO_AT_BRIDGE", "1")
            .env("GTK_A11Y", "none")
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Process(child))
    }

    /// One run: (window open, closed to the tray, started in the tray).
    fn run(app: &str, runtime: &tokio::runtime::Runtime) -> Result<[Reading; 3], Error> {
        let (_bus, address) = private_bus()?;
        let desktop = runtime.block_on(Desktop::serve(&address))?;

        let dir = tempfile::tempdir()?;
        let console = start(app, dir.path(), &address, false)?;
        let pid = console.0.id();
        wait("the tray item", || desktop.first_item().is_some())?;
        let mut window = None;
        wait("the window", || {
            window = Window::try_find(pid).ok().flatten();
            window.as_ref().is_some_and(Window::mapped) && has_web_process(pid)
        })?;
        std::thread::sleep(SETTLE);
        let open = read(pid);
        let window = window.ok_or("no window")?;
        window.close()?;
        wait("the window to close", || {
            !window.exists() && !has_web_process(pid)
        })?;
        std::thread::sleep(SETTLE);
        let closed = read(pid);
        eprintln!(
            "  closed to the tray, processes left: {:?}",
            descendants(pid).into_iter().map(name).collect::<Vec<_>>()
        );
        drop(console);

        let dir = tempfile::tempdir()?;
        let (_bus, address) = private_bus()?;
        let desktop = runtime.block_on(Desktop::serve(&address))?;
        let console = start(app, dir.path(), &address, true)?;
        let pid = console.0.id();
        wait("the tray item", || desktop.first_item().is_some())?;
        wait("the agent socket", || {
            dir.path().join("run/postern.sock").exists()
        })?;
        std::thread::sleep(SETTLE);
        let background = read(pid);
        Ok([open, closed, background])
    }

    fn median(mut values: Vec<u64>) -> u64 {
        values.sort_unstable();
        values.get(values.len() / 2).copied().unwrap_or(0)
    }

    pub fn all(app: &str, runs: usize) -> Result<(), Error> {
        let runtime = tokio::runtime::Runtime::new()?;
        let mut readings = Vec::new();
        for n in 1..=runs {
            let r = run(app, &runtime)?;
            eprintln!(
                "run {n}: open {} MiB, closed to the tray {} MiB, started in the tray {} MiB",
                r[0].total / 1024,
                r[1].total / 1024,
                r[2].total / 1024
            );
            readings.push(r);
        }
        println!("| state | total PSS MiB | app | processes |");
        println!("|---|---|---|---|");
        for (i, label) in [
            "window open",
            "window closed to the tray",
            "started in the tray (--background), never opened",
        ]
        .into_iter()
        .enumerate()
        {
            let of = |f: fn(&Reading) -> u64| median(readings.iter().map(|r| f(&r[i])).collect());
            println!(
                "| {label} | {} | {} | {} |",
                of(|r| r.total) / 1024,
                of(|r| r.app) / 1024,
                of(|r| r.processes as u64)
            );
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
mod measure {
    pub fn all(_app: &str, _runs: usize) -> Result<(), String> {
        Err("measures a Linux desktop session (a session bus and an X display)".into())
    }
}

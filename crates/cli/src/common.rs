//! What the operator commands share: the exit-code convention, data directory and
//! keychain selection, read-only journal access and plain-text tables.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use postern_broker::journal::schema::{APPLICATION_ID, SCHEMA_VERSION};
use postern_broker::vault::{Keychain, KeychainBackend};
use rusqlite::{Connection, OpenFlags};

/// Exit status: the command ran and reports a failed check (audit broken, config
/// invalid, an operation refused).
pub const EXIT_FAILED: u8 = 1;
/// Exit status: the command could not run (no journal, unreadable file, usage error).
pub const EXIT_UNAVAILABLE: u8 = 2;

/// A command that did not succeed: the exit status and what to tell the operator.
#[derive(Debug)]
pub struct Failure {
    pub status: u8,
    pub message: String,
    /// Printed on stdout instead of `message` on stderr when `--json` was asked for.
    pub json: Option<serde_json::Value>,
}

impl Failure {
    pub fn failed(message: impl Into<String>) -> Self {
        Failure {
            status: EXIT_FAILED,
            message: message.into(),
            json: None,
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Failure {
            status: EXIT_UNAVAILABLE,
            message: message.into(),
            json: None,
        }
    }

    /// A failure whose report was already printed.
    pub fn silent(status: u8) -> Self {
        Failure {
            status,
            message: String::new(),
            json: None,
        }
    }

    /// Also reports the failure as a JSON object when `json` is set.
    pub fn with_json(mut self, json: bool, error: &str) -> Self {
        if json {
            self.json = Some(serde_json::json!({
                "ok": false,
                "error": error,
                "message": self.message,
            }));
        }
        self
    }

    pub fn report(self) -> ExitCode {
        match &self.json {
            Some(value) => println!("{value}"),
            None if self.message.is_empty() => {}
            None => eprintln!("postern: {}", self.message),
        }
        ExitCode::from(self.status)
    }
}

pub type Outcome = Result<(), Failure>;

/// `$XDG_DATA_HOME/postern`, else `$HOME/.local/share/postern`. Relative values are
/// ignored, as the XDG base directory specification asks.
pub fn default_data_dir() -> PathBuf {
    postern_mcp::default_data_dir()
}

/// The journal database inside a data directory.
pub fn journal_path(data_dir: &Path) -> PathBuf {
    data_dir.join("journal.db")
}

/// The data directory a command was given, or the default one.
pub fn data_dir_or_default(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(default_data_dir)
}

/// Opens an existing journal read-only, without creating or migrating anything.
/// Refuses a missing file, a file that is not a Postern journal and a newer schema.
pub fn open_journal_read_only(data_dir: &Path) -> Result<(PathBuf, Connection), Failure> {
    let db = journal_path(data_dir);
    if !db.is_file() {
        return Err(Failure::unavailable(format!(
            "no journal at {} (is --data-dir right? the daemon creates it on first start)",
            db.display()
        )));
    }
    let unreadable =
        |e: &dyn std::fmt::Display| Failure::unavailable(format!("{}: {e}", db.display()));
    let conn = Connection::open_with_flags(
        &db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| unreadable(&e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| unreadable(&e))?;
    let pragma = |name: &str| -> Result<i64, Failure> {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
            .map_err(|e| unreadable(&format!("not a readable Postern journal ({e})")))
    };
    let app_id = pragma("application_id")?;
    let version = pragma("user_version")?;
    if app_id != APPLICATION_ID {
        return Err(Failure::unavailable(format!(
            "{} is not a Postern journal",
            db.display()
        )));
    }
    if version > SCHEMA_VERSION {
        return Err(Failure::unavailable(format!(
            "{} has schema version {version}, newer than this build supports \
             ({SCHEMA_VERSION}); upgrade postern",
            db.display()
        )));
    }
    Ok((db, conn))
}

/// The keychain the command line chose: `--keychain`, `--keychain-service` and
/// `--vault-key-file`.
pub struct KeychainSpec<'a> {
    pub backend: KeychainBackend,
    pub service: &'a str,
    /// The `file` keychain's key [default: systemd's credential directory].
    pub vault_key_file: Option<&'a Path>,
}

/// The chosen keychain backend under its service name. The `file` keychain lives in
/// `data_dir` and needs its key.
pub fn keychain(spec: &KeychainSpec<'_>, data_dir: &Path) -> Result<Keychain, Failure> {
    let service = spec.service;
    let named = |e| Failure::unavailable(format!("keychain service name `{service}`: {e}"));
    if spec.backend == KeychainBackend::File {
        let key = postern_broker::sealed_store::load_key(spec.vault_key_file)
            .map_err(|e| Failure::unavailable(e.to_string()))?;
        return Keychain::file(data_dir, &key, service).map_err(named);
    }
    Keychain::new(spec.backend, service).map_err(named)
}

/// The current time in unix milliseconds.
pub fn now_ms() -> i64 {
    use postern_broker::clock::{Clock, SystemClock};
    SystemClock.now_ms()
}

/// Makes text recorded from agents' requests safe to print on a terminal: control
/// characters (escape sequences, newlines) are shown escaped, never interpreted.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A listing: with `--json` one object a line, else `empty` when there is nothing to
/// list, else a table of `headers`.
pub fn print_listing<T>(
    items: &[T],
    json: bool,
    as_json: impl Fn(&T) -> serde_json::Value,
    empty: &str,
    headers: &[&str],
    as_row: impl Fn(&T) -> Vec<String>,
) {
    if json {
        for item in items {
            println!("{}", as_json(item));
        }
    } else if items.is_empty() {
        println!("{empty}");
    } else {
        let rows: Vec<Vec<String>> = items.iter().map(as_row).collect();
        print_table(headers, &rows);
    }
}

/// A left-aligned plain-text table; the last column is not padded.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == widths.len() {
                out.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        println!("{}", out.trim_end());
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

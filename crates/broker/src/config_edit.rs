//! Edits to the targets file that the broker itself makes (pinning an SSH host key after
//! a first-seen approval, or on the operator's command). The file stays the source of
//! truth: it is edited in place (comments and layout kept with `toml_edit`), the edited
//! text is validated before it replaces the original with a rename, and the result is a
//! new configuration version. An operator's edit keeps the previous file in
//! `DATA_DIR/config-history/` ([`keep_previous`]).

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, value};

use crate::config::Config;
use crate::ssh_keys::fingerprint_of_public;

/// Why a pin was not written. The file is unchanged in every case.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("{file}: no target named `{target}`")]
    NoTarget { file: String, target: String },
    #[error("`{target}` already pins a different host key ({pinned}); nothing was changed")]
    AlreadyPinned { target: String, pinned: String },
    #[error("{0}")]
    Key(String),
    #[error("{file}: {detail}; nothing was changed")]
    Edit { file: String, detail: String },
}

/// What a pin did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned {
    /// The same key was already pinned.
    Unchanged { version: String },
    /// The key is pinned; the target has a new version.
    Changed {
        fingerprint: String,
        old_version: String,
        new_version: String,
    },
}

/// Pins `key` (`<algo> <base64>`) as `host_key` of the `[[ssh]]` target `target`.
pub fn pin_host_key(
    file: &Path,
    target: &str,
    key: &str,
    replace: bool,
) -> Result<(Pinned, Config), PinError> {
    let before = Config::load(file)?;
    let Some(current) = before.ssh_target(target) else {
        return Err(PinError::NoTarget {
            file: file.display().to_string(),
            target: target.into(),
        });
    };
    let fingerprint = fingerprint_of_public(key).map_err(|e| PinError::Key(e.to_string()))?;
    let old_version = current.version().to_string();
    if let Some(pinned) = &current.host_key {
        if pinned == key {
            return Ok((
                Pinned::Unchanged {
                    version: old_version,
                },
                before,
            ));
        }
        if !replace {
            let pinned =
                fingerprint_of_public(pinned).unwrap_or_else(|_| "an unreadable key".into());
            return Err(PinError::AlreadyPinned {
                target: target.into(),
                pinned,
            });
        }
    }
    let mut doc = read_doc(file)?;
    let tables = doc
        .get_mut("ssh")
        .and_then(|item| item.as_array_of_tables_mut())
        .ok_or_else(|| edit_error(file, "no [[ssh]] tables"))?;
    let mut found = 0usize;
    for table in tables.iter_mut() {
        if table.get("name").and_then(|v| v.as_str()) == Some(target) {
            table.insert("host_key", value(key));
            found += 1;
        }
    }
    if found != 1 {
        return Err(edit_error(
            file,
            format!("expected one [[ssh]] table named `{target}`, found {found}"),
        ));
    }
    let after = replace_validated(file, &doc.to_string())?;
    let new_version = after
        .ssh_target(target)
        .map(|t| t.version().to_string())
        .ok_or_else(|| edit_error(file, format!("`{target}` vanished after the edit")))?;
    Ok((
        Pinned::Changed {
            fingerprint,
            old_version,
            new_version,
        },
        after,
    ))
}

/// Writes `text` beside `file`, validates it as a targets file, and only then renames it
/// over `file` (fsyncing the directory). On any failure `file` is unchanged.
fn replace_validated(file: &Path, text: &str) -> Result<Config, PinError> {
    let tmp = temp_path(file);
    write_temp(&tmp, text.as_bytes(), file).map_err(|e| edit_error(file, e))?;
    // Validate the edited file before it replaces the original.
    if let Err(e) = Config::load(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(edit_error(
            file,
            format!("the edited file does not validate ({e})"),
        ));
    }
    if let Err(e) = std::fs::rename(&tmp, file) {
        let _ = std::fs::remove_file(&tmp);
        return Err(edit_error(file, format!("cannot replace it: {e}")));
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = crate::platform::sync_dir(dir);
    }
    Ok(Config::load(file)?)
}

/// One target's table as written in the targets file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetText {
    pub name: String,
    /// The `[[http]]`/`[[ssh]]` table with its sub-tables, comments kept.
    pub text: String,
}

fn edit_error(file: &Path, detail: impl std::fmt::Display) -> PinError {
    PinError::Edit {
        file: file.display().to_string(),
        detail: detail.to_string(),
    }
}

fn parse_doc(file: &Path, text: &str) -> Result<DocumentMut, PinError> {
    text.parse()
        .map_err(|e: toml_edit::TomlError| edit_error(file, e))
}

/// The targets file, parsed with its comments and layout.
fn read_doc(file: &Path) -> Result<DocumentMut, PinError> {
    let text = std::fs::read_to_string(file).map_err(|e| edit_error(file, e))?;
    parse_doc(file, &text)
}

/// The table of one array-of-tables entry as standalone TOML text.
fn table_text(channel: &str, table: &toml_edit::Table) -> String {
    let mut array = toml_edit::ArrayOfTables::new();
    array.push(table.clone());
    let mut doc = DocumentMut::new();
    doc.insert(channel, toml_edit::Item::ArrayOfTables(array));
    doc.to_string().trim().to_string()
}

/// Every target's table text, in file order.
pub fn target_texts(file: &Path) -> Result<Vec<TargetText>, PinError> {
    let doc = read_doc(file)?;
    let mut out = Vec::new();
    for channel in ["http", "ssh"] {
        if let Some(tables) = doc.get(channel).and_then(|i| i.as_array_of_tables()) {
            for table in tables.iter() {
                let name = table.get("name").and_then(|v| v.as_str()).unwrap_or("");
                out.push(TargetText {
                    name: name.to_string(),
                    text: table_text(channel, table),
                });
            }
        }
    }
    Ok(out)
}

const ONE_TABLE: &str = "the new text must be exactly one [[http]] or [[ssh]] table";

/// Replaces the table of target `name` with `new_text` (one `[[http]]` or `[[ssh]]`
/// table of the same name, sub-tables included), or adds it when no target has that
/// name. The whole edited file is validated (names stay unique across sections) before
/// it replaces the original; the returned config is the new version.
pub fn replace_target(file: &Path, name: &str, new_text: &str) -> Result<Config, PinError> {
    let mut doc = read_doc(file)?;
    let replacement = parse_doc(file, new_text).map_err(|e| match e {
        PinError::Edit { detail, .. } => edit_error(file, format!("the new table: {detail}")),
        other => other,
    })?;
    let keys: Vec<&str> = replacement.iter().map(|(k, _)| k).collect();
    let [channel] = keys.as_slice() else {
        return Err(edit_error(file, ONE_TABLE));
    };
    let channel = *channel;
    let new_table = replacement
        .get(channel)
        .and_then(|i| i.as_array_of_tables())
        .filter(|a| a.len() == 1)
        .and_then(|a| a.get(0))
        .ok_or_else(|| edit_error(file, ONE_TABLE))?;
    if new_table.get("name").and_then(|v| v.as_str()) != Some(name) {
        return Err(edit_error(
            file,
            format!(
                "the new table must keep `name = \"{name}\"` (renaming a target is a new target)"
            ),
        ));
    }
    let mut new_table = new_table.clone();
    if doc.get(channel).is_none() {
        // In a file of comments only, the comments are the document's trailing text;
        // keep them above the first table rather than letting them drift below it.
        if doc.iter().next().is_none() {
            let comments = doc.trailing().as_str().unwrap_or_default().to_string();
            doc.set_trailing("");
            new_table.decor_mut().set_prefix(comments);
        }
        doc.insert(
            channel,
            toml_edit::Item::ArrayOfTables(toml_edit::ArrayOfTables::new()),
        );
    }
    let tables = doc
        .get_mut(channel)
        .and_then(|item| item.as_array_of_tables_mut())
        .ok_or_else(|| edit_error(file, format!("`{channel}` is not an array of tables")))?;
    let matching: Vec<usize> = tables
        .iter()
        .enumerate()
        .filter(|(_, t)| t.get("name").and_then(|v| v.as_str()) == Some(name))
        .map(|(i, _)| i)
        .collect();
    match matching.as_slice() {
        // A new target goes at the end of its section.
        [] => tables.push(new_table),
        [index] => {
            if let Some(slot) = tables.get_mut(*index) {
                *slot = new_table;
            }
        }
        _ => {
            return Err(edit_error(
                file,
                format!("more than one [[{channel}]] table is named `{name}`"),
            ));
        }
    }
    replace_validated(file, &doc.to_string())
}

/// Why an operator's target edit was not made. The file is unchanged in every case.
#[derive(Debug, thiserror::Error)]
pub enum TargetEditError {
    /// The targets file could not be read (to keep it before the edit).
    #[error("{0}")]
    Unreadable(std::io::Error),
    /// The edit was refused: the new table, or the file with it, does not validate.
    #[error("{0}")]
    Invalid(PinError),
}

/// What an operator's target edit did.
#[derive(Debug)]
pub struct TargetEdited {
    /// The configuration the edited file loads to: the new version.
    pub config: Config,
    /// Where the previous file was kept, or why it was not. Failing to keep it does not
    /// undo the edit.
    pub kept: std::io::Result<PathBuf>,
}

/// An operator's edit of one target: [`replace_target`] on `file`, keeping the previous
/// file in `DATA_DIR/config-history/` ([`keep_previous`]).
///
/// # Errors
///
/// [`TargetEditError::Unreadable`] if the file cannot be read, [`TargetEditError::Invalid`]
/// if [`replace_target`] refuses the edit.
pub fn edit_target(
    file: &Path,
    data_dir: &Path,
    name: &str,
    new_text: &str,
    now_ms: i64,
) -> Result<TargetEdited, TargetEditError> {
    let previous = std::fs::read(file).map_err(TargetEditError::Unreadable)?;
    let config = replace_target(file, name, new_text).map_err(TargetEditError::Invalid)?;
    let kept = keep_previous(data_dir, name, &previous, now_ms);
    Ok(TargetEdited { config, kept })
}

/// The directory of the data dir where previous targets files are kept.
pub const HISTORY_DIR: &str = "config-history";

/// Keeps `previous`, the targets file as it was before target `target` was edited, in
/// `DATA_DIR/config-history/` as `<now_ms>-before-<target>.toml` (the directory is made
/// when missing). Returns the path written.
///
/// # Errors
///
/// The I/O error that stopped the directory or the file from being written.
pub fn keep_previous(
    data_dir: &Path,
    target: &str,
    previous: &[u8],
    now_ms: i64,
) -> std::io::Result<PathBuf> {
    let history = data_dir.join(HISTORY_DIR);
    std::fs::create_dir_all(&history)?;
    let path = history.join(format!("{now_ms}-before-{target}.toml"));
    std::fs::write(&path, previous)?;
    Ok(path)
}

/// `<dir>/.<name>.tmp-<pid>`: beside the file, so the rename stays on one filesystem.
fn temp_path(file: &Path) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "targets.toml".into());
    file.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// The temporary file gets the original's mode (0600 if it has none to copy); on
/// Windows it inherits its directory's ACL, as the original did.
fn write_temp(tmp: &Path, bytes: &[u8], original: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let mode = std::fs::metadata(original)
        .ok()
        .and_then(|m| crate::platform::mode_of(&m))
        .unwrap_or(0o600);
    let result = (|| {
        let mut f = crate::platform::create_mode(
            std::fs::OpenOptions::new().write(true).create_new(true),
            mode,
        )
        .open(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

//! Edits to the targets file that the broker itself makes (pinning an SSH host key after
//! a first-seen approval, or on the operator's command). The file stays the source of
//! truth: it is edited in place (comments and layout kept with `toml_edit`), the edited
//! text is validated before it replaces the original with a rename, and the result is a
//! new configuration version.

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, value};

use crate::channel::ssh_keys::fingerprint_of_public;
use crate::config::Config;

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
    let edit_error = |detail: String| PinError::Edit {
        file: file.display().to_string(),
        detail,
    };
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
    let text = std::fs::read_to_string(file).map_err(|e| edit_error(e.to_string()))?;
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| edit_error(e.to_string()))?;
    let tables = doc
        .get_mut("ssh")
        .and_then(|item| item.as_array_of_tables_mut())
        .ok_or_else(|| edit_error("no [[ssh]] tables".into()))?;
    let mut found = 0usize;
    for table in tables.iter_mut() {
        if table.get("name").and_then(|v| v.as_str()) == Some(target) {
            table.insert("host_key", value(key));
            found += 1;
        }
    }
    if found != 1 {
        return Err(edit_error(format!(
            "expected one [[ssh]] table named `{target}`, found {found}"
        )));
    }
    let after = replace_validated(file, &doc.to_string())?;
    let new_version = after
        .ssh_target(target)
        .map(|t| t.version().to_string())
        .ok_or_else(|| edit_error(format!("`{target}` vanished after the edit")))?;
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
    let edit_error = |detail: String| PinError::Edit {
        file: file.display().to_string(),
        detail,
    };
    let tmp = temp_path(file);
    write_temp(&tmp, text.as_bytes(), file).map_err(|e| edit_error(e.to_string()))?;
    // Validate the edited file before it replaces the original.
    if let Err(e) = Config::load(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(edit_error(format!(
            "the edited file does not validate ({e})"
        )));
    }
    if let Err(e) = std::fs::rename(&tmp, file) {
        let _ = std::fs::remove_file(&tmp);
        return Err(edit_error(format!("cannot replace it: {e}")));
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(Config::load(file)?)
}

/// One target's table as written in the targets file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetText {
    /// `http` or `ssh`.
    pub channel: &'static str,
    pub name: String,
    /// The `[[http]]`/`[[ssh]]` table with its sub-tables, comments kept.
    pub text: String,
}

fn parse_doc(file: &Path, text: &str) -> Result<DocumentMut, PinError> {
    text.parse()
        .map_err(|e: toml_edit::TomlError| PinError::Edit {
            file: file.display().to_string(),
            detail: e.to_string(),
        })
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
    let text = std::fs::read_to_string(file).map_err(|e| PinError::Edit {
        file: file.display().to_string(),
        detail: e.to_string(),
    })?;
    let doc = parse_doc(file, &text)?;
    let mut out = Vec::new();
    for channel in ["http", "ssh"] {
        if let Some(tables) = doc.get(channel).and_then(|i| i.as_array_of_tables()) {
            for table in tables.iter() {
                let name = table.get("name").and_then(|v| v.as_str()).unwrap_or("");
                out.push(TargetText {
                    channel,
                    name: name.to_string(),
                    text: table_text(channel, table),
                });
            }
        }
    }
    Ok(out)
}

/// Replaces the table of target `name` with `new_text` (one `[[http]]` or `[[ssh]]`
/// table of the same name, sub-tables included), or adds it when no target has that
/// name. The whole edited file is validated (names stay unique across sections) before
/// it replaces the original; the returned config is the new version.
pub fn replace_target(file: &Path, name: &str, new_text: &str) -> Result<Config, PinError> {
    let edit_error = |detail: String| PinError::Edit {
        file: file.display().to_string(),
        detail,
    };
    let text = std::fs::read_to_string(file).map_err(|e| edit_error(e.to_string()))?;
    let mut doc = parse_doc(file, &text)?;
    let replacement = parse_doc(file, new_text).map_err(|e| match e {
        PinError::Edit { detail, .. } => edit_error(format!("the new table: {detail}")),
        other => other,
    })?;
    let keys: Vec<&str> = replacement.iter().map(|(k, _)| k).collect();
    let [channel] = keys.as_slice() else {
        return Err(edit_error(
            "the new text must be exactly one [[http]] or [[ssh]] table".into(),
        ));
    };
    let channel = *channel;
    let new_table = replacement
        .get(channel)
        .and_then(|i| i.as_array_of_tables())
        .filter(|a| a.len() == 1)
        .and_then(|a| a.get(0))
        .ok_or_else(|| {
            edit_error("the new text must be exactly one [[http]] or [[ssh]] table".into())
        })?;
    if new_table.get("name").and_then(|v| v.as_str()) != Some(name) {
        return Err(edit_error(format!(
            "the new table must keep `name = \"{name}\"` (renaming a target is a new target)"
        )));
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
        .ok_or_else(|| edit_error(format!("`{channel}` is not an array of tables")))?;
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
            return Err(edit_error(format!(
                "more than one [[{channel}]] table is named `{name}`"
            )));
        }
    }
    replace_validated(file, &doc.to_string())
}

/// `<dir>/.<name>.tmp-<pid>`: beside the file, so the rename stays on one filesystem.
fn temp_path(file: &Path) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "targets.toml".into());
    file.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

fn write_temp(tmp: &Path, bytes: &[u8], original: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mode = std::fs::metadata(original)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o600);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

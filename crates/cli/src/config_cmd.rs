//! `postern config check`: validates a targets file the way the broker loads it.
//! `postern config pin-host-key`: pins an `[[ssh]]` target's `host_key`.

use std::path::{Path, PathBuf};

use postern_broker::channel::ssh_keys::{
    fingerprint_of_public, host_key_from_known_hosts_line, normalize_public_key,
};
use postern_broker::config::Config;
use toml_edit::{DocumentMut, value};

use crate::common::{self, Failure, print_table};

pub fn check(file: &Path) -> common::Outcome {
    // The error already names the file, the target and the field.
    let config = Config::load(file).map_err(|e| Failure::failed(e.to_string()))?;
    let count = config.http.len() + config.ssh.len();
    println!(
        "{}: OK, {count} target{}",
        file.display(),
        if count == 1 { "" } else { "s" }
    );
    if count == 0 {
        return Ok(());
    }
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(count);
    for t in &config.http {
        rows.push(vec![
            "http".into(),
            t.name.clone(),
            t.base_url.to_string(),
            t.approval.as_str().into(),
            t.credential.to_string(),
            t.version().to_string(),
        ]);
    }
    for t in &config.ssh {
        rows.push(vec![
            "ssh".into(),
            t.name.clone(),
            if t.host.contains(':') {
                format!("{}@[{}]:{}", t.user, t.host, t.port)
            } else {
                format!("{}@{}:{}", t.user, t.host, t.port)
            },
            t.approval.as_str().into(),
            t.credential.to_string(),
            t.version().to_string(),
        ]);
    }
    println!();
    print_table(
        &[
            "KIND",
            "NAME",
            "ADDRESS",
            "APPROVAL",
            "CREDENTIAL",
            "VERSION",
        ],
        &rows,
    );
    Ok(())
}

/// Where `config pin-host-key` takes the key from.
pub enum PinSource {
    /// An OpenSSH `known_hosts` line; it must match the target's host and port.
    KnownHostsLine(String),
    /// `<algo> <base64> [comment]`.
    Key(String),
}

/// Pins `host_key` in the `[[ssh]]` target `target` of `file`: edited in place
/// (formatting and comments kept), validated, then swapped in with a rename.
pub fn pin_host_key(
    file: &Path,
    target: &str,
    source: &PinSource,
    replace: bool,
) -> common::Outcome {
    let before = Config::load(file).map_err(|e| Failure::failed(e.to_string()))?;
    let Some(current) = before.ssh_target(target) else {
        return Err(Failure::failed(format!(
            "{}: no [[ssh]] target named `{target}`",
            file.display()
        )));
    };
    let key = match source {
        PinSource::KnownHostsLine(line) => {
            host_key_from_known_hosts_line(line, &current.host, current.port)
        }
        PinSource::Key(line) => normalize_public_key(line),
    }
    .map_err(|e| Failure::failed(e.to_string()))?;
    let fingerprint = fingerprint_of_public(&key).map_err(|e| Failure::failed(e.to_string()))?;
    let old_version = current.version();
    if let Some(pinned) = &current.host_key {
        if *pinned == key {
            println!(
                "`{target}` already pins this host key ({fingerprint}); version {old_version}, unchanged"
            );
            return Ok(());
        }
        if !replace {
            let old_fp =
                fingerprint_of_public(pinned).unwrap_or_else(|_| "an unreadable key".into());
            return Err(Failure::failed(format!(
                "`{target}` already pins a different host key ({old_fp}); pass --replace to \
                 pin {fingerprint} instead. Nothing was changed"
            )));
        }
    }

    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::unavailable(format!("cannot read {}: {e}", file.display())))?;
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e| Failure::failed(format!("{}: {e}", file.display())))?;
    let tables = doc
        .get_mut("ssh")
        .and_then(|item| item.as_array_of_tables_mut())
        .ok_or_else(|| Failure::failed(format!("{}: no [[ssh]] tables", file.display())))?;
    let mut found = 0usize;
    for table in tables.iter_mut() {
        if table.get("name").and_then(|v| v.as_str()) == Some(target) {
            table.insert("host_key", value(key.as_str()));
            found += 1;
        }
    }
    if found != 1 {
        return Err(Failure::failed(format!(
            "{}: expected one [[ssh]] table with name = \"{target}\", found {found}",
            file.display()
        )));
    }

    let tmp = temp_path(file);
    write_temp(&tmp, doc.to_string().as_bytes(), file)?;
    // Validate the edited file before it replaces the original.
    if let Err(e) = Config::load(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Failure::failed(format!(
            "the edited file does not validate ({e}); {} was not changed",
            file.display()
        )));
    }
    if let Err(e) = std::fs::rename(&tmp, file) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Failure::unavailable(format!(
            "cannot replace {}: {e}",
            file.display()
        )));
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }

    let after = Config::load(file).map_err(|e| Failure::failed(e.to_string()))?;
    let new_version = after
        .ssh_target(target)
        .map(|t| t.version().to_string())
        .ok_or_else(|| Failure::failed(format!("`{target}` vanished from {}", file.display())))?;
    println!("pinned host key for `{target}`: {fingerprint}");
    println!("version {old_version} -> {new_version}");
    Ok(())
}

/// `<dir>/.<name>.tmp-<pid>`: beside the file, so the rename stays on one filesystem.
fn temp_path(file: &Path) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "targets.toml".into());
    file.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

fn write_temp(tmp: &Path, bytes: &[u8], original: &Path) -> Result<(), Failure> {
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
    result.map_err(|e| {
        let _ = std::fs::remove_file(tmp);
        Failure::unavailable(format!("cannot write {}: {e}", tmp.display()))
    })
}

//! `postern config check`: validates a targets file the way the broker loads it.
//! `postern config pin-host-key`: pins an `[[ssh]]` target's `host_key`.

use std::path::Path;

use postern_broker::config::Config;
use postern_broker::config_edit::{PinError, Pinned, pin_host_key};
use postern_broker::ssh_keys::{
    fingerprint_of_public, host_key_from_known_hosts_line, normalize_public_key,
};

use crate::common::{self, Failure, print_table};

pub fn check(file: &Path) -> common::Outcome {
    // The error already names the file, the target and the field.
    let config = Config::load(file).map_err(|e| Failure::failed(e.to_string()))?;
    // Warnings go to stderr and do not fail the check: the file loads as it is.
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
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
pub fn pin_host_key_command(
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
    match pin_host_key(file, target, &key, replace) {
        Ok((Pinned::Unchanged { version }, _)) => {
            println!(
                "`{target}` already pins this host key ({fingerprint}); version {version}, unchanged"
            );
            Ok(())
        }
        Ok((
            Pinned::Changed {
                fingerprint,
                old_version,
                new_version,
            },
            _,
        )) => {
            println!("pinned host key for `{target}`: {fingerprint}");
            println!("version {old_version} -> {new_version}");
            Ok(())
        }
        Err(PinError::AlreadyPinned { pinned, .. }) => Err(Failure::failed(format!(
            "`{target}` already pins a different host key ({pinned}); pass --replace to \
             pin {fingerprint} instead. Nothing was changed"
        ))),
        Err(PinError::Edit { file: f, detail }) => Err(Failure::unavailable(format!(
            "{f}: {detail}; nothing was changed"
        ))),
        Err(e) => Err(Failure::failed(e.to_string())),
    }
}

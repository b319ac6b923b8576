//! Linux: process facts from /proc, supplementary groups, the XDG base directories.

use std::path::{Path, PathBuf};

pub(super) use super::unix::{
    create_owner_only_dir_all, current_user, default_endpoint, file_identity, file_mode,
    file_stamp, free_bytes, mode_of, owner_only_dir, protect_dir, sibling_endpoint,
};

fn proc_dir(pid: u32) -> PathBuf {
    Path::new("/proc").join(pid.to_string())
}

fn link(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()
        .map(|p| p.display().to_string())
}

pub(super) fn process_start(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(proc_dir(pid).join("stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or ')': the
    // fields after the last ')' are positional.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ')': state is field 3, ppid field 4, starttime field 22 (1-based overall).
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

pub(super) fn process_executable(pid: u32) -> Option<String> {
    link(&proc_dir(pid).join("exe"))
}

pub(super) fn process_image(pid: u32) -> Option<PathBuf> {
    Some(proc_dir(pid).join("exe"))
}

pub(super) fn process_cwd(pid: u32) -> Option<String> {
    link(&proc_dir(pid).join("cwd"))
}

pub(super) fn process_command(pid: u32) -> String {
    let raw = std::fs::read(proc_dir(pid).join("cmdline")).unwrap_or_default();
    super::unix::shown_command(
        raw.split(|b| *b == 0)
            .map(|part| String::from_utf8_lossy(part).into_owned()),
    )
}

/// The effective uid (`/proc/PID/status`, `Uid:` field 2).
pub(super) fn process_uid(pid: u32) -> Option<u32> {
    std::fs::read_to_string(proc_dir(pid).join("status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|uid| uid.parse().ok())
}

pub(super) fn process_sid(_pid: u32) -> Option<String> {
    None
}

/// The supplementary groups of process `pid` (`/proc/PID/status`, `Groups:`); empty
/// when they cannot be read.
pub fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(proc_dir(pid).join("status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("Groups:").map(|rest| {
                    rest.split_whitespace()
                        .filter_map(|g| g.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

/// Boot time (unix seconds) from `/proc/stat`.
fn boot_time_s() -> Option<i64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|s| s.trim().parse().ok())
}

pub(super) fn start_to_unix_ms(start_ticks: u64) -> Option<i64> {
    let hz = Some(rustix::param::clock_ticks_per_second()).filter(|hz| *hz > 0)?;
    let since_boot_ms = i64::try_from(start_ticks.checked_mul(1000)? / hz).ok()?;
    boot_time_s()?.checked_mul(1000)?.checked_add(since_boot_ms)
}

pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

pub(super) fn default_data_dir() -> PathBuf {
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(xdg) = absolute("XDG_DATA_HOME") {
        return xdg.join("postern");
    }
    match absolute("HOME") {
        Some(home) => home.join(".local").join("share").join("postern"),
        // No home directory at all: a relative directory is the only honest answer,
        // and every message names the path it used.
        None => PathBuf::from(".postern"),
    }
}

pub(super) fn anchor_dir() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })?;
    Some(state.join("postern/anchors"))
}

//! macOS: process facts from libproc (`proc_pidinfo`, `proc_pidpath`) and the
//! `KERN_PROCARGS2` sysctl, directories from `dirs`. There is no /proc: nothing here
//! reads it.
//!
//! The unsafe blocks are the libc calls themselves; each hands the kernel a buffer it
//! owns, of the size it says, and reads back only what the kernel reported writing.

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};

pub(super) use super::unix::{
    create_owner_only_dir_all, current_user, default_endpoint, file_identity, file_mode,
    file_stamp, free_bytes, mode_of, owner_only_dir, protect_dir, sibling_endpoint,
};

/// `proc_pidinfo(PROC_PIDTBSDINFO)`: parent, start time, effective uid.
#[allow(unsafe_code)]
fn bsd_info(pid: u32) -> Option<libc::proc_bsdinfo> {
    let pid = c_int::try_from(pid).ok()?;
    let size = c_int::try_from(std::mem::size_of::<libc::proc_bsdinfo>()).ok()?;
    // SAFETY: proc_bsdinfo is plain integers and byte arrays; all zeroes is a valid value.
    let mut info: libc::proc_bsdinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a live, writable proc_bsdinfo of exactly `size` bytes.
    let written = unsafe {
        libc::proc_pidinfo(
            pid,
            libc::PROC_PIDTBSDINFO,
            0,
            (&raw mut info).cast::<c_void>(),
            size,
        )
    };
    (written == size).then_some(info)
}

pub(super) fn process_start(pid: u32) -> Option<(u32, u64)> {
    let info = bsd_info(pid)?;
    let start = info
        .pbi_start_tvsec
        .checked_mul(1_000_000)?
        .checked_add(info.pbi_start_tvusec)?;
    Some((info.pbi_ppid, start))
}

#[allow(unsafe_code)]
pub(super) fn process_executable(pid: u32) -> Option<String> {
    let pid = c_int::try_from(pid).ok()?;
    let mut buf = vec![0u8; usize::try_from(libc::PROC_PIDPATHINFO_MAXSIZE).ok()?];
    let size = u32::try_from(buf.len()).ok()?;
    // SAFETY: `buf` is a live, writable buffer of `size` bytes.
    let written = unsafe { libc::proc_pidpath(pid, buf.as_mut_ptr().cast::<c_void>(), size) };
    let len = usize::try_from(written).ok().filter(|n| *n > 0)?;
    buf.truncate(len);
    Some(String::from_utf8_lossy(&buf).into_owned())
}

pub(super) fn process_image(pid: u32) -> Option<PathBuf> {
    process_executable(pid).map(PathBuf::from)
}

#[allow(unsafe_code)]
pub(super) fn process_cwd(pid: u32) -> Option<String> {
    let pid = c_int::try_from(pid).ok()?;
    let size = c_int::try_from(std::mem::size_of::<libc::proc_vnodepathinfo>()).ok()?;
    // SAFETY: proc_vnodepathinfo is plain integers and byte arrays; all zeroes is valid.
    let mut info: libc::proc_vnodepathinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a live, writable proc_vnodepathinfo of exactly `size` bytes.
    let written = unsafe {
        libc::proc_pidinfo(
            pid,
            libc::PROC_PIDVNODEPATHINFO,
            0,
            (&raw mut info).cast::<c_void>(),
            size,
        )
    };
    if written != size {
        return None;
    }
    // The path is MAXPATHLEN bytes, NUL-terminated (libc splits the array in 32 rows).
    let bytes: Vec<u8> = info
        .pvi_cdir
        .vip_path
        .iter()
        .flatten()
        .map(|c| c.to_ne_bytes()[0])
        .take_while(|b| *b != 0)
        .collect();
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

/// The `KERN_PROCARGS2` buffer of `pid`: argc, the executable path, then the arguments.
/// Only the process's own user (or root) may read it.
#[allow(unsafe_code)]
fn procargs(pid: u32) -> Option<Vec<u8>> {
    let pid = c_int::try_from(pid).ok()?;
    let mut argmax: c_int = 0;
    let mut size = std::mem::size_of::<c_int>();
    let mut mib = [libc::CTL_KERN, libc::KERN_ARGMAX];
    // SAFETY: `mib` names two levels; `argmax` is a writable c_int and `size` its size.
    let ok = unsafe {
        libc::sysctl(
            mib.as_mut_ptr(),
            2,
            (&raw mut argmax).cast::<c_void>(),
            &raw mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    if ok != 0 {
        return None;
    }
    let mut buf = vec![0u8; usize::try_from(argmax).ok().filter(|n| *n > 0)?];
    let mut size = buf.len();
    let mut mib = [libc::CTL_KERN, libc::KERN_PROCARGS2, pid];
    // SAFETY: `mib` names three levels; `buf` is writable for `size` bytes, and the
    // kernel sets `size` to what it wrote.
    let ok = unsafe {
        libc::sysctl(
            mib.as_mut_ptr(),
            3,
            buf.as_mut_ptr().cast::<c_void>(),
            &raw mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    if ok != 0 {
        return None;
    }
    buf.truncate(size);
    Some(buf)
}

/// The arguments in a `KERN_PROCARGS2` buffer: a native-endian argc, the executable
/// path and its NUL padding, then argc NUL-terminated strings (the environment follows,
/// and is never read).
fn arguments(buf: &[u8]) -> Option<Vec<String>> {
    let argc = usize::try_from(i32::from_ne_bytes(buf.get(..4)?.try_into().ok()?)).ok()?;
    let rest = buf.get(4..)?;
    let path_end = rest.iter().position(|b| *b == 0)?;
    let rest = &rest[path_end..];
    let start = rest.iter().position(|b| *b != 0)?;
    Some(
        rest[start..]
            .split(|b| *b == 0)
            .take(argc)
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect(),
    )
}

pub(super) fn process_command(pid: u32) -> String {
    super::unix::shown_command(
        procargs(pid)
            .as_deref()
            .and_then(arguments)
            .unwrap_or_default(),
    )
}

pub(super) fn process_uid(pid: u32) -> Option<u32> {
    bsd_info(pid).map(|info| info.pbi_uid)
}

pub(super) fn process_sid(_pid: u32) -> Option<String> {
    None
}

pub(super) fn start_to_unix_ms(start_us: u64) -> Option<i64> {
    i64::try_from(start_us / 1000).ok()
}

pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let dir = std::fs::File::open(dir)?;
    // std asks for F_FULLFSYNC, which not every filesystem takes on a directory; plain
    // fsync still orders the directory's metadata.
    match dir.sync_all() {
        Ok(()) => Ok(()),
        Err(_) => rustix::fs::fsync(&dir).map_err(std::io::Error::from),
    }
}

pub(super) fn default_data_dir() -> PathBuf {
    dirs::data_dir().map_or_else(|| PathBuf::from(".postern"), |d| d.join("postern"))
}

pub(super) fn anchor_dir() -> Option<PathBuf> {
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(state).join("postern/anchors"));
    }
    dirs::data_dir().map(|d| d.join("postern-anchors"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn procargs_arguments_skip_the_path_and_its_padding_and_stop_at_argc() {
        let mut buf = 2i32.to_ne_bytes().to_vec();
        buf.extend_from_slice(b"/usr/bin/agent\0\0\0\0agent\0--flag\0HOME=/Users/a\0");
        assert_eq!(arguments(&buf).unwrap(), vec!["agent", "--flag"]);
        assert!(arguments(&[1, 0]).is_none());
    }

    #[test]
    fn this_process_is_described() {
        let me = std::process::id();
        let (ppid, start) = process_start(me).unwrap();
        assert_eq!(ppid, std::os::unix::process::parent_id());
        assert!(start_to_unix_ms(start).unwrap() > 1_600_000_000_000);
        assert!(process_executable(me).unwrap().starts_with('/'));
        assert_eq!(process_uid(me), Some(rustix::process::geteuid().as_raw()));
        assert_eq!(
            process_cwd(me).map(PathBuf::from),
            std::env::current_dir()
                .ok()
                .and_then(|d| d.canonicalize().ok())
        );
        assert!(!process_command(me).is_empty());
    }
}

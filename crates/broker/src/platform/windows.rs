//! Windows: named pipes (tokio), users as SIDs read from process tokens, process facts
//! from a toolhelp snapshot and the process handle, owner-only DACLs, free space, and
//! directories from `dirs`.
//!
//! # The pipe and who may use it
//! A pipe's name is global to the machine, so whoever creates a name first serves it.
//! The broker creates its pipe with `FILE_FLAG_FIRST_PIPE_INSTANCE` (it refuses to join
//! a name someone else holds) and rejects remote clients; every later instance is created
//! by the broker itself while an earlier one still holds the name. The pipe keeps the
//! default security descriptor (full control for this user, SYSTEM and Administrators,
//! read-only for Everyone), so another user cannot open it for writing; the broker
//! still checks each client's user (GetNamedPipeClientProcessId, then that process's
//! token), and [`connect`] checks the server's user the same way
//! (GetNamedPipeServerProcessId), so a bridge never talks to a pipe another user
//! squatted; and a client opens the pipe for identification only (tokio's default
//! security QoS), so no server can impersonate it. A pid names a process only while it runs: a client that exits between
//! connecting and the check, its pid taken by another process in that instant, would be
//! judged by the newcomer's user; a process that is gone fails the check.
//!
//! # Files
//! Windows has no mode bits. Each directory Postern creates gets a protected DACL that
//! grants this user and SYSTEM full control, inherited by everything created in it; a
//! file is protected by its directory. Directories that already exist keep their ACL,
//! and no file's ACL is checked (there is no mode to compare), which the README says.
//!
//! The unsafe blocks are the Win32 calls themselves; each passes buffers it owns with
//! their true sizes, checks the result before reading what was written, and hands every
//! handle and allocation to an owner that releases it.

use std::ffi::{OsStr, OsString, c_void};
use std::io;
use std::os::windows::ffi::{OsStrExt, OsStringExt};
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle, RawHandle};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::net::windows::named_pipe::{ClientOptions, NamedPipeServer, ServerOptions};
use windows_sys::Win32::Foundation::{
    ERROR_PIPE_BUSY, ERROR_SUCCESS, FILETIME, HANDLE, INVALID_HANDLE_VALUE, LocalFree, STILL_ACTIVE,
};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW,
    ConvertStringSidToSidW, SDDL_REVISION_1, SE_FILE_OBJECT, SetNamedSecurityInfoW,
};
use windows_sys::Win32::Security::{
    ACL, DACL_SECURITY_INFORMATION, GetSecurityDescriptorDacl, GetTokenInformation,
    LookupAccountSidW, PROTECTED_DACL_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR, PSID,
    SID_NAME_USE, TOKEN_QUERY, TOKEN_USER, TokenUser,
};
use windows_sys::Win32::Storage::FileSystem::GetDiskFreeSpaceExW;
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, PROCESSENTRY32W, Process32FirstW, Process32NextW, TH32CS_SNAPPROCESS,
};
use windows_sys::Win32::System::Pipes::{GetNamedPipeClientProcessId, GetNamedPipeServerProcessId};
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, GetExitCodeProcess, GetProcessTimes, OpenProcess, OpenProcessToken,
    PROCESS_NAME_WIN32, PROCESS_QUERY_LIMITED_INFORMATION, QueryFullProcessImageNameW,
};

use super::{Accepted, Connected, PeerCred, UserId};

/// The read half of an accepted connection.
pub type AcceptedRead = tokio::io::ReadHalf<NamedPipeServer>;
/// The write half of an accepted connection.
pub type AcceptedWrite = tokio::io::WriteHalf<NamedPipeServer>;

/// The prefix every local pipe name has.
const PIPE_PREFIX: &str = r"\\.\pipe\";

/// How long [`connect`] waits while every instance of the pipe is busy (the moment
/// between the broker accepting a client and creating the next instance).
const BUSY_WAIT: Duration = Duration::from_secs(2);

/// Whether `path` is a local pipe name, `\\.\pipe\NAME`.
pub fn is_pipe_name(path: &Path) -> bool {
    let text = path.as_os_str().to_string_lossy();
    text.len() > PIPE_PREFIX.len()
        && text
            .get(..PIPE_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(PIPE_PREFIX))
}

fn not_a_pipe(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is not a named pipe name: on Windows the broker's endpoint is \\\\.\\pipe\\NAME",
            path.display()
        ),
    )
}

fn wide(s: &OsStr) -> Vec<u16> {
    s.encode_wide().chain(std::iter::once(0)).collect()
}

/// A NUL-terminated UTF-16 string the system allocated.
///
/// # Safety
/// `p` must point to a readable, NUL-terminated UTF-16 string.
#[allow(unsafe_code)]
unsafe fn from_wide_ptr(p: *const u16) -> String {
    let mut len = 0;
    // SAFETY: the caller promises a NUL terminator; every index read is before it.
    while unsafe { *p.add(len) } != 0 {
        len += 1;
    }
    // SAFETY: `len` u16s from `p` were just read.
    String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(p, len) })
}

/// Memory the system allocated with LocalAlloc, freed on drop.
struct LocalBox(*mut c_void);

impl Drop for LocalBox {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from a function documented to LocalAlloc it, and
            // is freed once.
            unsafe { LocalFree(self.0) };
        }
    }
}

/// Takes ownership of a handle a Win32 call returned; `None` for a null or invalid one.
#[allow(unsafe_code)]
fn owned(handle: HANDLE) -> Option<OwnedHandle> {
    if handle.is_null() || handle == INVALID_HANDLE_VALUE {
        return None;
    }
    // SAFETY: a valid handle that nothing else owns or closes.
    Some(unsafe { OwnedHandle::from_raw_handle(handle as RawHandle) })
}

fn raw(handle: &impl AsRawHandle) -> HANDLE {
    handle.as_raw_handle() as HANDLE
}

#[allow(unsafe_code)]
fn open_process(pid: u32) -> Option<OwnedHandle> {
    // SAFETY: plain call; the result is checked by `owned`.
    owned(unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) })
}

/// The string form of `sid`.
#[allow(unsafe_code)]
fn sid_string(sid: PSID) -> io::Result<String> {
    let mut text: *mut u16 = std::ptr::null_mut();
    // SAFETY: `sid` is a valid SID; `text` receives a LocalAlloc'd string.
    if unsafe { ConvertSidToStringSidW(sid, &raw mut text) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let text = LocalBox(text.cast());
    // SAFETY: ConvertSidToStringSidW wrote a NUL-terminated string.
    Ok(unsafe { from_wide_ptr(text.0.cast()) })
}

/// The user SID of the token of `process` (a process handle with query access).
#[allow(unsafe_code)]
fn token_user(process: HANDLE) -> io::Result<String> {
    let mut token: HANDLE = std::ptr::null_mut();
    // SAFETY: `process` is a live process handle; `token` receives a new handle.
    if unsafe { OpenProcessToken(process, TOKEN_QUERY, &raw mut token) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let token = owned(token).ok_or_else(io::Error::last_os_error)?;
    let mut len = 0u32;
    // SAFETY: a size query: no buffer, `len` receives the size needed.
    unsafe {
        GetTokenInformation(
            raw(&token),
            TokenUser,
            std::ptr::null_mut(),
            0,
            &raw mut len,
        )
    };
    if len == 0 {
        return Err(io::Error::last_os_error());
    }
    // u64s, so the TOKEN_USER at its start is aligned.
    let mut buf = vec![0u64; usize::try_from(len).unwrap_or(usize::MAX).div_ceil(8)];
    // SAFETY: `buf` is writable for at least `len` bytes.
    let ok = unsafe {
        GetTokenInformation(
            raw(&token),
            TokenUser,
            buf.as_mut_ptr().cast(),
            len,
            &raw mut len,
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: GetTokenInformation(TokenUser) wrote a TOKEN_USER at the buffer's start,
    // whose SID points into the same buffer, alive until this function returns.
    let user = unsafe { &*buf.as_ptr().cast::<TOKEN_USER>() };
    sid_string(user.User.Sid)
}

#[allow(unsafe_code)]
pub(super) fn current_user() -> io::Result<UserId> {
    // SAFETY: the pseudo-handle of this process; it needs no closing.
    token_user(unsafe { GetCurrentProcess() }).map(UserId::Sid)
}

/// The user process `pid` runs as.
fn user_of(pid: u32) -> io::Result<UserId> {
    let process = open_process(pid).ok_or_else(io::Error::last_os_error)?;
    token_user(raw(&process)).map(UserId::Sid)
}

/// `DOMAIN\name` of `user`, if the system knows it.
#[allow(unsafe_code)]
pub fn user_name(user: &UserId) -> Option<String> {
    let UserId::Sid(sid) = user else { return None };
    let text = wide(OsStr::new(sid));
    let mut psid: PSID = std::ptr::null_mut();
    // SAFETY: `text` is NUL-terminated; `psid` receives a LocalAlloc'd SID.
    if unsafe { ConvertStringSidToSidW(text.as_ptr(), &raw mut psid) } == 0 {
        return None;
    }
    let psid = LocalBox(psid);
    let mut name = vec![0u16; 256];
    let mut domain = vec![0u16; 256];
    let mut name_len = u32::try_from(name.len()).ok()?;
    let mut domain_len = u32::try_from(domain.len()).ok()?;
    let mut kind: SID_NAME_USE = 0;
    // SAFETY: both buffers are writable for the lengths given; the lengths come back
    // as the characters written, without the NUL.
    let ok = unsafe {
        LookupAccountSidW(
            std::ptr::null(),
            psid.0,
            name.as_mut_ptr(),
            &raw mut name_len,
            domain.as_mut_ptr(),
            &raw mut domain_len,
            &raw mut kind,
        )
    };
    if ok == 0 {
        return None;
    }
    name.truncate(usize::try_from(name_len).ok()?);
    domain.truncate(usize::try_from(domain_len).ok()?);
    let name = String::from_utf16_lossy(&name);
    Some(if domain.is_empty() {
        name
    } else {
        format!("{}\\{name}", String::from_utf16_lossy(&domain))
    })
}

// ----- the local endpoint ----------------------------------------------------------------

fn server(name: &OsStr, first: bool) -> io::Result<NamedPipeServer> {
    ServerOptions::new()
        .first_pipe_instance(first)
        .reject_remote_clients(true)
        .create(name)
}

/// A bound local endpoint: a named pipe, with one instance always waiting for the next
/// client.
#[derive(Debug)]
pub struct Listener {
    name: OsString,
    next: NamedPipeServer,
}

impl Listener {
    /// Creates the first instance of the pipe `name` (`\\.\pipe\NAME`), refusing a name
    /// that already exists (ERROR_ACCESS_DENIED: whoever holds it, even this user).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a name that is not a pipe name; the operating system's.
    pub fn bind(name: &Path) -> io::Result<Listener> {
        if !is_pipe_name(name) {
            return Err(not_a_pipe(name));
        }
        let next = server(name.as_os_str(), true)?;
        Ok(Listener {
            name: name.as_os_str().to_owned(),
            next,
        })
    }

    /// The next connection. Cancel safe: a waiting instance stays waiting.
    ///
    /// # Errors
    ///
    /// The operating system's.
    pub async fn accept(&mut self) -> io::Result<Accepted> {
        if let Err(e) = self.next.connect().await {
            // This instance cannot take a client any more: a new one takes its place
            // (created first, so the name is never without an instance of ours).
            if let Ok(fresh) = server(&self.name, false) {
                self.next = fresh;
            }
            return Err(e);
        }
        match server(&self.name, false) {
            Ok(fresh) => Ok(std::mem::replace(&mut self.next, fresh)),
            Err(e) => {
                // Not served: the client sees its connection end, and this instance
                // waits again.
                let _ = self.next.disconnect();
                Err(e)
            }
        }
    }
}

/// Connects to the pipe `name`, waiting a moment while every instance is busy, and
/// only to a server running as this user.
///
/// # Errors
///
/// `NotFound` when no broker serves the name; `PermissionDenied` when another user's
/// process serves it (or this user may not open it); `InvalidInput` for a name that is
/// not a pipe name; the operating system's otherwise.
#[allow(unsafe_code)]
pub async fn connect(name: &Path) -> io::Result<Connected> {
    if !is_pipe_name(name) {
        return Err(not_a_pipe(name));
    }
    let deadline = Instant::now() + BUSY_WAIT;
    let client = loop {
        match ClientOptions::new().open(name) {
            Ok(client) => break client,
            Err(e)
                if e.raw_os_error() == i32::try_from(ERROR_PIPE_BUSY).ok()
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let mut pid = 0u32;
    // SAFETY: `client` is a live pipe handle; `pid` is writable.
    if unsafe { GetNamedPipeServerProcessId(raw(&client), &raw mut pid) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let me = current_user()?;
    let server_user = user_of(pid)?;
    if server_user != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by {server_user}, not by this user ({me}); refusing to talk to it",
                name.display()
            ),
        ));
    }
    Ok(client)
}

/// Completes when the process is asked to stop other than by Ctrl-C: Ctrl-Break, its
/// console closing, or the system shutting down. The handlers are registered when this
/// is called.
///
/// # Errors
///
/// The operating system's, when a handler cannot be registered.
pub fn termination() -> io::Result<impl Future<Output = ()>> {
    use tokio::signal::windows;
    let mut brk = windows::ctrl_break()?;
    let mut close = windows::ctrl_close()?;
    let mut shutdown = windows::ctrl_shutdown()?;
    Ok(async move {
        tokio::select! {
            _ = brk.recv() => {},
            _ = close.recv() => {},
            _ = shutdown.recv() => {},
        }
    })
}

/// Splits an accepted connection into halves that can move to separate tasks.
pub fn split(stream: Accepted) -> (AcceptedRead, AcceptedWrite) {
    tokio::io::split(stream)
}

/// Who is on the other end of `stream`: the client process and its token's user.
///
/// # Errors
///
/// The operating system's, when the client process is gone or cannot be queried.
#[allow(unsafe_code)]
pub fn peer_of(stream: &Accepted) -> io::Result<PeerCred> {
    let mut pid = 0u32;
    // SAFETY: `stream` is a live, connected pipe handle; `pid` is writable.
    if unsafe { GetNamedPipeClientProcessId(raw(stream), &raw mut pid) } == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        user: user_of(pid)?,
        gid: None,
        pid: Some(pid),
    })
}

/// The pipe name is derived from the data dir's absolute path as written, lowercased
/// (Windows paths ignore case), without touching the disk: the daemon derives it before
/// it creates the data dir, and the bridge after, and both must get the same name.
pub(super) fn default_endpoint(data_dir: &Path) -> PathBuf {
    let absolute = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let key = absolute.to_string_lossy().to_lowercase();
    let hash = blake3::hash(key.as_bytes());
    PathBuf::from(format!("{PIPE_PREFIX}postern-{}", &hash.to_hex()[..16]))
}

pub(super) fn sibling_endpoint(endpoint: &Path, name: &str) -> PathBuf {
    let stem = Path::new(name)
        .file_stem()
        .map_or_else(|| name.to_string(), |s| s.to_string_lossy().into_owned());
    let mut pipe = endpoint.as_os_str().to_owned();
    pipe.push(format!("-{stem}"));
    PathBuf::from(pipe)
}

// ----- processes ---------------------------------------------------------------------------

fn filetime(ft: &FILETIME) -> u64 {
    (u64::from(ft.dwHighDateTime) << 32) | u64::from(ft.dwLowDateTime)
}

/// Creation time (FILETIME) of a running process; `None` once it has exited.
#[allow(unsafe_code)]
fn running_since(process: &OwnedHandle) -> Option<u64> {
    let mut code = 0u32;
    // SAFETY: a live process handle with query access; `code` is writable.
    if unsafe { GetExitCodeProcess(raw(process), &raw mut code) } == 0
        || i32::try_from(code).ok() != Some(STILL_ACTIVE)
    {
        return None;
    }
    let zero = || FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    let (mut created, mut exited, mut kernel, mut user) = (zero(), zero(), zero(), zero());
    // SAFETY: four writable FILETIMEs.
    let ok = unsafe {
        GetProcessTimes(
            raw(process),
            &raw mut created,
            &raw mut exited,
            &raw mut kernel,
            &raw mut user,
        )
    };
    (ok != 0).then(|| filetime(&created))
}

/// The parent pid the system recorded for `pid` (a toolhelp snapshot).
#[allow(unsafe_code)]
fn recorded_parent(pid: u32) -> Option<u32> {
    // SAFETY: plain call; the result is checked by `owned`.
    let snapshot = owned(unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPPROCESS, 0) })?;
    // SAFETY: PROCESSENTRY32W is integers and a u16 array; all zeroes is valid.
    let mut entry: PROCESSENTRY32W = unsafe { std::mem::zeroed() };
    entry.dwSize = u32::try_from(std::mem::size_of::<PROCESSENTRY32W>()).ok()?;
    // SAFETY: a live snapshot handle; `entry` is writable and its dwSize set.
    let mut more = unsafe { Process32FirstW(raw(&snapshot), &raw mut entry) } != 0;
    while more {
        if entry.th32ProcessID == pid {
            return Some(entry.th32ParentProcessID);
        }
        // SAFETY: as above.
        more = unsafe { Process32NextW(raw(&snapshot), &raw mut entry) } != 0;
    }
    None
}

pub(super) fn process_start(pid: u32) -> Option<(u32, u64)> {
    let process = open_process(pid)?;
    let start = running_since(&process)?;
    // Windows does not re-parent orphans: the recorded parent pid may since name a
    // younger process, which is then not this one's parent.
    let ppid = recorded_parent(pid)
        .filter(|ppid| *ppid != 0)
        .filter(|ppid| {
            open_process(*ppid)
                .and_then(|parent| running_since(&parent))
                .is_some_and(|parent_start| parent_start <= start)
        })
        .unwrap_or(0);
    Some((ppid, start))
}

#[allow(unsafe_code)]
pub(super) fn process_executable(pid: u32) -> Option<String> {
    let process = open_process(pid)?;
    let mut buf = vec![0u16; 32 * 1024];
    let mut len = u32::try_from(buf.len()).ok()?;
    // SAFETY: `buf` is writable for `len` u16s; `len` comes back as the characters
    // written, without the NUL.
    let ok = unsafe {
        QueryFullProcessImageNameW(
            raw(&process),
            PROCESS_NAME_WIN32,
            buf.as_mut_ptr(),
            &raw mut len,
        )
    };
    if ok == 0 {
        return None;
    }
    buf.truncate(usize::try_from(len).ok()?);
    Some(
        PathBuf::from(OsString::from_wide(&buf))
            .display()
            .to_string(),
    )
}

pub(super) fn process_image(pid: u32) -> Option<PathBuf> {
    process_executable(pid).map(PathBuf::from)
}

/// Not exposed: reading it means reading the other process's memory.
pub(super) fn process_cwd(_pid: u32) -> Option<String> {
    None
}

/// Not exposed, for the same reason as the current directory.
pub(super) fn process_command(_pid: u32) -> String {
    String::new()
}

pub(super) fn process_uid(_pid: u32) -> Option<u32> {
    None
}

pub(super) fn process_sid(pid: u32) -> Option<String> {
    match user_of(pid) {
        Ok(UserId::Sid(sid)) => Some(sid),
        _ => None,
    }
}

/// FILETIME (100 ns since 1601-01-01) to unix milliseconds.
pub(super) fn start_to_unix_ms(start: u64) -> Option<i64> {
    const UNIX_EPOCH_AS_FILETIME_MS: i64 = 11_644_473_600_000;
    i64::try_from(start / 10_000)
        .ok()?
        .checked_sub(UNIX_EPOCH_AS_FILETIME_MS)
}

// ----- files -------------------------------------------------------------------------------

/// Nothing to set on the builder: [`protect_dir`] protects what it created.
pub(super) fn owner_only_dir(builder: &mut std::fs::DirBuilder) -> &mut std::fs::DirBuilder {
    builder
}

/// Nothing to set: a new file inherits its directory's DACL.
pub(super) fn file_mode(
    options: &mut std::fs::OpenOptions,
    _mode: u32,
) -> &mut std::fs::OpenOptions {
    options
}

#[allow(unsafe_code)]
pub(super) fn protect_dir(dir: &Path) -> io::Result<()> {
    let UserId::Sid(me) = current_user()? else {
        return Err(io::Error::other("this process's user has no SID"));
    };
    // P: protected (nothing inherited from above); OICI: inherited by files and
    // directories created inside; FA: full access; SY: SYSTEM.
    let sddl = wide(OsStr::new(&format!(
        "D:P(A;OICI;FA;;;{me})(A;OICI;FA;;;SY)"
    )));
    let mut descriptor: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: `sddl` is NUL-terminated; `descriptor` receives a LocalAlloc'd descriptor.
    let ok = unsafe {
        ConvertStringSecurityDescriptorToSecurityDescriptorW(
            sddl.as_ptr(),
            SDDL_REVISION_1,
            &raw mut descriptor,
            std::ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    let descriptor = LocalBox(descriptor);
    let (mut present, mut defaulted) = (0, 0);
    let mut dacl: *mut ACL = std::ptr::null_mut();
    // SAFETY: a valid descriptor; the DACL pointer points into it, which lives on.
    let ok = unsafe {
        GetSecurityDescriptorDacl(
            descriptor.0,
            &raw mut present,
            &raw mut dacl,
            &raw mut defaulted,
        )
    };
    if ok == 0 || present == 0 || dacl.is_null() {
        return Err(io::Error::last_os_error());
    }
    let path = wide(dir.as_os_str());
    // SAFETY: `path` is NUL-terminated; `dacl` is valid while `descriptor` lives.
    let status = unsafe {
        SetNamedSecurityInfoW(
            path.as_ptr(),
            SE_FILE_OBJECT,
            DACL_SECURITY_INFORMATION | PROTECTED_DACL_SECURITY_INFORMATION,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            dacl,
            std::ptr::null(),
        )
    };
    if status != ERROR_SUCCESS {
        return Err(io::Error::from_raw_os_error(
            i32::try_from(status).unwrap_or(i32::MAX),
        ));
    }
    Ok(())
}

pub(super) fn create_owner_only_dir_all(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut level = Some(dir);
    while let Some(l) = level.filter(|l| !l.as_os_str().is_empty() && !l.exists()) {
        missing.push(l.to_path_buf());
        level = l.parent();
    }
    std::fs::create_dir_all(dir)?;
    for level in missing.iter().rev() {
        protect_dir(level)?;
    }
    Ok(())
}

/// No stamp: std exposes no change time here (see [`super::file_stamp`]).
pub(super) fn file_stamp(_meta: &std::fs::Metadata) -> Option<super::FileStamp> {
    None
}

pub(super) fn file_identity(_meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

pub(super) fn mode_of(_meta: &std::fs::Metadata) -> Option<u32> {
    None
}

/// Nothing to do: NTFS journals its metadata, and std cannot open a directory to flush.
pub(super) fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

#[allow(unsafe_code)]
pub(super) fn free_bytes(dir: &Path) -> Option<u64> {
    let path = wide(dir.as_os_str());
    let mut available = 0u64;
    // SAFETY: `path` is NUL-terminated; `available` is writable; the others may be null.
    let ok = unsafe {
        GetDiskFreeSpaceExW(
            path.as_ptr(),
            &raw mut available,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    (ok != 0).then_some(available)
}

// ----- directories ---------------------------------------------------------------------------

pub(super) fn default_data_dir() -> PathBuf {
    dirs::data_local_dir().map_or_else(|| PathBuf::from(".postern"), |d| d.join("postern"))
}

pub(super) fn anchor_dir() -> Option<PathBuf> {
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(state).join("postern").join("anchors"));
    }
    dirs::data_dir().map(|d| d.join("postern").join("anchors"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pipe_names_are_recognised_and_paths_are_not() {
        assert!(is_pipe_name(Path::new(r"\\.\pipe\postern-0123")));
        assert!(is_pipe_name(Path::new(r"\\.\PIPE\x")));
        assert!(!is_pipe_name(Path::new(r"\\.\pipe\")));
        assert!(!is_pipe_name(Path::new(r"C:\postern\run\postern.sock")));
    }

    #[test]
    fn the_operator_pipe_sits_beside_the_agent_pipe() {
        let agent = default_endpoint(Path::new(r"C:\no\such\dir"));
        assert!(is_pipe_name(&agent));
        // The same name before and after the data dir exists, in any letter case.
        assert_eq!(agent, default_endpoint(Path::new(r"c:\No\Such\Dir")));
        let dir = std::env::temp_dir().join(format!("postern-endpoint-{}", std::process::id()));
        let before = default_endpoint(&dir);
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(before, default_endpoint(&dir));
        std::fs::remove_dir(&dir).unwrap();
        let operator = sibling_endpoint(&agent, "operator.sock");
        assert_eq!(
            operator.as_os_str().to_string_lossy(),
            format!("{}-operator", agent.display())
        );
    }

    #[test]
    fn this_process_is_described_by_its_token_and_times() {
        let me = std::process::id();
        let (_, start) = process_start(me).unwrap();
        let now_ms = i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
        let started = start_to_unix_ms(start).unwrap();
        assert!(started <= now_ms && started > now_ms - 3_600_000);
        let exe = process_executable(me).unwrap();
        assert_eq!(
            Path::new(&exe).canonicalize().unwrap(),
            std::env::current_exe().unwrap().canonicalize().unwrap()
        );
        assert_eq!(process_sid(me).map(UserId::Sid), current_user().ok());
    }

    #[test]
    fn a_process_that_exited_is_gone() {
        let mut child = std::process::Command::new("cmd")
            .args(["/C", "exit 0"])
            .spawn()
            .unwrap();
        let pid = child.id();
        child.wait().unwrap();
        drop(child);
        assert!(process_start(pid).is_none());
    }

    #[tokio::test]
    async fn a_pipe_serves_this_user_and_names_the_client() {
        let name = PathBuf::from(format!(r"\\.\pipe\postern-test-{}", std::process::id()));
        let mut listener = Listener::bind(&name).unwrap();
        // The name is taken: a second broker cannot join it.
        assert!(Listener::bind(&name).is_err());
        let client = tokio::spawn({
            let name = name.clone();
            async move { connect(&name).await }
        });
        let accepted = listener.accept().await.unwrap();
        let _client = client.await.unwrap().unwrap();
        let peer = peer_of(&accepted).unwrap();
        assert_eq!(peer.pid, Some(std::process::id()));
        assert_eq!(peer.user, current_user().unwrap());
    }

    #[test]
    fn a_protected_directory_keeps_working_for_its_owner() {
        let base = std::env::temp_dir().join(format!("postern-acl-{}", std::process::id()));
        let dir = base.join("a").join("b");
        create_owner_only_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"x").unwrap();
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"x");
        std::fs::remove_dir_all(&base).unwrap();
    }
}

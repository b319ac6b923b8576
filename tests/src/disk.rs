//! A full disk on demand: a small tmpfs a test mounts (as root) and fills.

use std::io::{self, Write};
use std::path::Path;
use std::process::Command;

/// A tmpfs mounted on a fresh directory, unmounted on drop. [`Tmpfs::mount`] gives
/// `None` where mounting is not permitted: the test then says so and passes without
/// checking anything (CI runs as root).
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=`), mode 0700.
    pub fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs here (needs root)");
            return None;
        }
        Some(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a task still holding a file open must not keep the mount behind.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes `path` until the filesystem says it is full (ENOSPC).
///
/// # Errors
///
/// Any write error other than ENOSPC.
pub fn fill(path: &Path) -> io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    let block = vec![0xA5u8; 64 * 1024];
    loop {
        if let Err(e) = f.write_all(&block) {
            if e.raw_os_error() != Some(28) {
                return Err(e);
            }
            break;
        }
    }
    // Whatever is left is smaller than a block: take it byte by byte.
    while f.write_all(&[0xA5]).is_ok() {}
    Ok(())
}

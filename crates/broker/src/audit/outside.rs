//! Records of the journal kept outside its tables, which the verifier checks it against:
//! the witness file beside the database, the anchor outside the data directory, and tree
//! heads witnesses cosigned. The journal writer writes the witness file and the anchor
//! ([`write_checkpoint_file`](super::write_checkpoint_file)); this only finds and reads
//! them.

use std::path::{Path, PathBuf};

use super::Checkpoint;

/// Where the broker keeps the anchor of the journal in `data_dir` unless told otherwise:
/// `$XDG_STATE_HOME/postern/anchors/` (or `~/.local/state/...`; the macOS and Windows
/// places are [`crate::platform::anchor_dir`]'s), one file per data dir, named by a hash
/// of its canonical path. Outside the data dir, so deleting or replacing that directory
/// does not take the anchor with it.
pub fn default_anchor(data_dir: &Path) -> Option<PathBuf> {
    let anchors = crate::platform::anchor_dir()?;
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let name = blake3::hash(canonical.as_os_str().as_encoded_bytes());
    Some(anchors.join(format!("{}.checkpoint", &name.to_hex()[..16])))
}

/// A tree head held outside the journal (by a witness that cosigned it, say): the
/// journal must still contain a tree of that size with that root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeHead {
    pub size: u64,
    pub root: [u8; 32],
    /// Who holds it, for the message.
    pub source: String,
    /// The witness that cosigned it, when one did.
    pub witness: Option<String>,
}

/// What `verify_file` checks the journal against besides its own tables.
#[derive(Debug, Clone, Default)]
pub struct Outside {
    /// The anchor file kept outside the data directory (see
    /// [`write_checkpoint_file`](super::write_checkpoint_file)).
    pub anchor: Option<PathBuf>,
    /// Tree heads witnesses cosigned.
    pub heads: Vec<TreeHead>,
}

/// A checkpoint file (the witness file or the anchor) as the writer left it; `None` when
/// there is none.
pub(super) fn read_checkpoint_file(path: &Path) -> Result<Option<Checkpoint>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("checkpoint file {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("checkpoint file {}: {e}", path.display())),
    }
}

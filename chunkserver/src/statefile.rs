//! Small files in the chunkserver's `state_dir` that must survive a crash whole (`node.uuid`,
//! `fence`, `cluster`): written to a temporary file, fsynced, renamed into place and the
//! directory fsynced, so a reader finds the old contents or the new, never a torn file.

use std::io::Write;
use std::path::Path;

use cairn_common::{CairnError, Result};

/// Replace `path` with `contents`, durably.
pub fn write(path: &Path, contents: &str) -> Result<()> {
    let ctx = |e: std::io::Error| CairnError::from_io(&format!("cannot write {}", path.display()), &e);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(ctx)?;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(ctx)?;
    file.write_all(contents.as_bytes()).map_err(ctx)?;
    file.sync_all().map_err(ctx)?;
    std::fs::rename(&tmp, path).map_err(ctx)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(ctx)
}

/// The trimmed contents of `path`, or `None` when there is no such file.
pub fn read(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CairnError::from_io(&format!("cannot read {}", path.display()), &e)),
    }
}

//! Whether an inode lies inside a subtree: what access rules with a `subtree` ask of every
//! inode a limited client names (`docs/ARCHITECTURE.md`, "Subtree rules").

use cairn_common::{CairnError, ErrorKind, Result, ROOT_INO};

use super::Namespace;

impl Namespace {
    /// Whether inode `ino` is directory `top` or lies below it: a directory through its parent
    /// chain, anything else through the directories of its names (any one inside will do). A
    /// non-directory whose names' directories were never recorded cannot be placed: refused,
    /// with what to do about it.
    pub fn inside(&self, ino: u64, top: u64) -> Result<bool> {
        self.inside_here(ino, top).map_err(|e| match e.kind() {
            ErrorKind::CrossDevice => CairnError::new(
                ErrorKind::PermissionDenied,
                format!("inode {ino} cannot be placed in this client's subtree here: {}", e.message()),
            ),
            _ => e,
        })
    }

    fn inside_here(&self, ino: u64, top: u64) -> Result<bool> {
        if ino == top || top == ROOT_INO {
            return Ok(true);
        }
        let inode = self.inode(ino)?;
        if inode.is_dir() {
            return self.is_ancestor_here(top, ino);
        }
        if !inode.names_known() {
            return Err(CairnError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "inode {ino} was made before the metaserver recorded where files are named, so \
                     it cannot tell whether it lies in this client's subtree; `cairn fsck --repair` \
                     records it"
                ),
            ));
        }
        let mut dirs: Vec<u64> = inode.name_dirs().collect();
        dirs.sort_unstable();
        dirs.dedup();
        // One name inside is enough; a name whose ancestry leaves this group cannot be placed.
        let mut unplaced = None;
        for dir in dirs {
            match self.is_ancestor_here(top, dir) {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(e) if e.kind() == ErrorKind::CrossDevice => unplaced = Some(e),
                Err(e) => return Err(e),
            }
        }
        unplaced.map_or(Ok(false), Err)
    }

    /// The directory at absolute `path` (`/a/b`), by lookups from the root.
    pub fn resolve_dir(&self, path: &str) -> Result<u64> {
        let mut ino = ROOT_INO;
        for name in path.split('/').filter(|c| !c.is_empty()) {
            ino = self.lookup(ino, name.as_bytes())?.ino;
        }
        if !self.inode(ino)?.is_dir() {
            return Err(CairnError::new(ErrorKind::NotDir, format!("{path} is not a directory")));
        }
        Ok(ino)
    }
}

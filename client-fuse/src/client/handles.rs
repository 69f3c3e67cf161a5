//! The files open on this client and the handles on them: each inode open here has one
//! [`OpenFile`] shared by all its handles (two descriptors of one file see each other's
//! writes), counted so the last release commits and forgets it. An open's answer may predate a
//! commit or a release of this client that raced with it; registering it refuses such an
//! answer, and the open asks again.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cairn_common::{CairnError, Layout, Result};
use cairn_proto as p;

use super::{need, Client};
use crate::file::OpenFile;
use crate::stripe::Geometry;

/// An inode open on this client: its open file and the handles counted on it.
pub(super) struct Opened {
    pub(super) file: Arc<OpenFile>,
    pub(super) handles: usize,
    /// The newest generation among the opens counted in `handles` (see
    /// [`Releases`](super::session::Releases)).
    pub(super) generation: u64,
}

impl Client {
    pub(super) fn open_file(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.files.lock().get(&ino).map(|o| o.file.clone())
    }

    pub(super) fn handle_file(&self, fh: u64) -> Result<Arc<OpenFile>> {
        self.handle(fh).map(|(_, file)| file)
    }

    /// The inode and open file behind handle `fh`.
    pub(super) fn handle(&self, fh: u64) -> Result<(u64, Arc<OpenFile>)> {
        let ino = *self
            .handles
            .lock()
            .get(&fh)
            .ok_or_else(|| CairnError::invalid(format!("bad file handle {fh}")))?;
        let file =
            self.open_file(ino).ok_or_else(|| CairnError::invalid(format!("file handle {fh} is closed")))?;
        Ok((ino, file))
    }

    /// Count a handle on the file, creating its [`OpenFile`] from `info` and `stripes` or, with
    /// `refresh`, updating the existing one. With `epoch_then` (the inode's change counter
    /// before the open was sent), an answer that predates a commit of this client is refused:
    /// `None`, nothing registered.
    pub(super) async fn register_open(
        &self,
        info: p::FileInfo,
        stripes: Vec<p::StripeInfo>,
        refresh: bool,
        epoch_then: Option<u64>,
        generation: u64,
    ) -> Result<Option<u64>> {
        let attr = need(info.attr)?;
        let layout = Layout::try_from(&info.layout.ok_or_else(|| CairnError::internal("no layout"))?)?;
        if info.placement.len() != layout.width() as usize {
            return Err(CairnError::corrupt(format!(
                "inode {}: placement has {} nodes for {layout}",
                attr.ino,
                info.placement.len()
            )));
        }
        let epoch = self.epoch(attr.ino);
        let stale = |now: u64| epoch_then.is_some_and(|then| then != now);
        let existing = {
            let mut files = self.files.lock();
            match files.get_mut(&attr.ino) {
                Some(o) => {
                    o.handles += 1;
                    o.generation = o.generation.max(generation);
                    Some(o.file.clone())
                }
                // A commit advances the counter before its file leaves `files`, so checking
                // under this lock catches every commit the answer may have missed.
                None if stale(epoch.load(Ordering::Acquire)) => return Ok(None),
                // A release covering this open was queued since (another open of the file
                // registered and closed first): the metaserver may not count this open any more.
                // Asked again, the open gets a newer generation than any release so far.
                None if refresh && self.releases.released(attr.ino).load(Ordering::Acquire) >= generation => {
                    return Ok(None)
                }
                None => {
                    let geo = Geometry { ino: attr.ino, layout, placement: info.placement };
                    let file = Arc::new(OpenFile::new(geo, attr.size, stripes.clone(), &self.readahead));
                    files.insert(attr.ino, Opened { file, handles: 1, generation });
                    None
                }
            }
        };
        if let (Some(file), true) = (existing, refresh) {
            let then = epoch_then.unwrap_or_else(|| epoch.load(Ordering::Acquire));
            if !file.refresh(attr.size, stripes, epoch, then).await {
                self.drop_handle(attr.ino);
                return Ok(None);
            }
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, attr.ino);
        Ok(Some(fh))
    }

    /// Undo the handle count of a registration that was refused.
    pub(super) fn drop_handle(&self, ino: u64) {
        let mut files = self.files.lock();
        if let Some(o) = files.get_mut(&ino) {
            if o.handles > 1 {
                o.handles -= 1;
            } else {
                files.remove(&ino);
            }
        }
    }
}

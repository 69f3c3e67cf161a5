//! [`Client`]: the filesystem as a library. Namespace operations go to the metaserver; file
//! data goes through [`OpenFile`] to the chunkservers. Each inode open on this client has one
//! `OpenFile` shared by all its handles, so two descriptors of one file see each other's
//! writes; the last release commits and forgets it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, Layout, Result};
use cairn_proto as p;
use parking_lot::Mutex;

use crate::dir::DirHandle;
use crate::file::{OpenFile, Versions};
use crate::meta::MetaConn;
use crate::nodes::Nodes;
use crate::stripe::Geometry;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long the kernel may cache attributes and directory entries.
    pub attr_ttl: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { attr_ttl: Duration::from_secs(1) }
    }
}

struct Opened {
    file: Arc<OpenFile>,
    handles: usize,
}

pub struct Client {
    pub meta: MetaConn,
    nodes: Arc<Nodes>,
    pub options: ClientOptions,
    versions: Versions,
    next_fh: AtomicU64,
    files: Mutex<HashMap<u64, Opened>>,
    handles: Mutex<HashMap<u64, u64>>,
    dirs: Mutex<HashMap<u64, Arc<DirHandle>>>,
    /// (mtime, size) of each inode when this client last opened it, for FOPEN_KEEP_CACHE.
    seen: Mutex<HashMap<u64, (i64, u32, u64)>>,
}

impl Client {
    /// Register with the metaserver (which hands out the id that makes stripe versions unique).
    pub async fn new(meta: MetaConn, options: ClientOptions) -> Result<Client> {
        let client_id = meta.register_client(p::Empty {}).await?.client_id;
        let nodes = Arc::new(Nodes::new(meta.clone()));
        nodes.refresh().await?;
        Ok(Client {
            meta,
            nodes,
            options,
            versions: Versions::new(client_id),
            next_fh: AtomicU64::new(1),
            files: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
        })
    }

    fn open_file(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.files.lock().get(&ino).map(|o| o.file.clone())
    }

    fn handle_file(&self, fh: u64) -> Result<Arc<OpenFile>> {
        let ino = *self
            .handles
            .lock()
            .get(&fh)
            .ok_or_else(|| CairnError::invalid(format!("bad file handle {fh}")))?;
        self.open_file(ino).ok_or_else(|| CairnError::invalid(format!("file handle {fh} is closed")))
    }

    /// Overlay what this client knows and the metaserver does not yet: the size of a file with
    /// writes not yet committed.
    async fn local_view(&self, mut attr: p::Attr) -> p::Attr {
        if let Some(file) = self.open_file(attr.ino) {
            if file.has_unflushed().await {
                attr.size = file.size().await;
            }
        }
        attr
    }

    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<p::Attr> {
        let attr = self.meta.lookup(p::LookupRequest { parent, name: name.to_vec() }).await?.attr;
        Ok(self.local_view(need(attr)?).await)
    }

    pub async fn getattr(&self, ino: u64) -> Result<p::Attr> {
        let attr = self.meta.get_attr(p::InoRequest { ino }).await?.attr;
        Ok(self.local_view(need(attr)?).await)
    }

    pub async fn setattr(&self, req: p::SetAttrRequest) -> Result<p::Attr> {
        let ino = req.ino;
        let file = self.open_file(ino);
        if let (Some(file), Some(_)) = (&file, req.size) {
            // Truncation acts on committed stripes: publish buffered writes first.
            file.flush(&self.nodes, &self.meta, &self.versions).await?;
        }
        let size = req.size;
        let attr = need(self.meta.set_attr(req).await?.attr)?;
        if let (Some(file), Some(size)) = (file, size) {
            file.truncated(size).await;
        }
        Ok(self.local_view(attr).await)
    }

    pub async fn create(&self, req: p::CreateRequest, open: bool) -> Result<(p::Attr, u64)> {
        let reply = self.meta.create(req).await?;
        let info = reply.file.ok_or_else(|| CairnError::internal("create: no file info"))?;
        let attr = need(info.attr)?;
        if !open {
            return Ok((attr, 0));
        }
        if !reply.created {
            // O_CREAT without O_EXCL on an existing file: an ordinary open.
            let (fh, _) = self.open(attr.ino, false).await?;
            return Ok((self.local_view(attr).await, fh));
        }
        let fh = self.register_open(info, Vec::new(), false).await?;
        Ok((attr, fh))
    }

    pub async fn mkdir(&self, req: p::MkdirRequest) -> Result<p::Attr> {
        need(self.meta.mkdir(req).await?.attr)
    }

    pub async fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.meta.unlink(p::RemoveRequest { parent, name: name.to_vec() }).await.map(|_| ())
    }

    pub async fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.meta.rmdir(p::RemoveRequest { parent, name: name.to_vec() }).await.map(|_| ())
    }

    pub async fn rename(&self, req: p::RenameRequest) -> Result<()> {
        self.meta.rename(req).await.map(|_| ())
    }

    pub async fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<p::Attr> {
        let attr =
            self.meta.link(p::LinkRequest { ino, new_parent, new_name: new_name.to_vec() }).await?.attr;
        Ok(self.local_view(need(attr)?).await)
    }

    pub async fn symlink(&self, req: p::SymlinkRequest) -> Result<p::Attr> {
        need(self.meta.symlink(req).await?.attr)
    }

    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        Ok(self.meta.readlink(p::InoRequest { ino }).await?.target)
    }

    /// Open a regular file: fetch its layout, placement and stripe records (close-to-open:
    /// every open sees the newest commit). Returns the handle and whether the kernel may keep
    /// its page cache (the file did not change since this client last opened it).
    pub async fn open(&self, ino: u64, truncate: bool) -> Result<(u64, bool)> {
        let reply = self.meta.open(p::InoRequest { ino }).await?;
        let info = reply.file.ok_or_else(|| CairnError::internal("open: no file info"))?;
        let attr = need(info.attr)?;
        let mut stripes = reply.stripes;
        let mut more = reply.more;
        while more {
            let from = stripes.last().map_or(0, |s| s.index + 1);
            let page = self.meta.list_stripes(p::ListStripesRequest { ino, from, limit: 4096 }).await?;
            stripes.extend(page.stripes);
            more = page.more;
        }
        let mtime = attr.mtime.unwrap_or_default();
        let stamp = (mtime.sec, mtime.nsec, attr.size);
        let keep_cache = !truncate && self.seen.lock().insert(ino, stamp) == Some(stamp);
        let fh = self.register_open(info, stripes, true).await?;
        Ok((fh, keep_cache))
    }

    async fn register_open(
        &self,
        info: p::FileInfo,
        stripes: Vec<p::StripeInfo>,
        refresh: bool,
    ) -> Result<u64> {
        let attr = need(info.attr)?;
        let layout = Layout::try_from(&info.layout.ok_or_else(|| CairnError::internal("no layout"))?)?;
        if info.placement.len() != layout.width() as usize {
            return Err(CairnError::corrupt(format!(
                "inode {}: placement has {} nodes for {layout}",
                attr.ino,
                info.placement.len()
            )));
        }
        let existing = {
            let mut files = self.files.lock();
            match files.get_mut(&attr.ino) {
                Some(o) => {
                    o.handles += 1;
                    Some(o.file.clone())
                }
                None => {
                    let geo = Geometry { ino: attr.ino, layout, placement: info.placement };
                    let file = Arc::new(OpenFile::new(geo, attr.size, stripes.clone()));
                    files.insert(attr.ino, Opened { file, handles: 1 });
                    None
                }
            }
        };
        if let (Some(file), true) = (existing, refresh) {
            file.refresh(attr.size, stripes).await;
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, attr.ino);
        Ok(fh)
    }

    pub async fn read(&self, fh: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.handle_file(fh)?.read(&self.nodes, offset, len).await
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.handle_file(fh)?.write(&self.nodes, &self.versions, offset, data).await
    }

    /// Write out buffered data and commit it (close, fsync).
    pub async fn flush(&self, fh: u64) -> Result<()> {
        let file = self.handle_file(fh)?;
        file.flush(&self.nodes, &self.meta, &self.versions).await.map(|_| ())
    }

    /// Close a handle: commit, and forget the file when it was the last handle.
    pub async fn release(&self, fh: u64) -> Result<()> {
        let result = self.flush(fh).await;
        let Some(ino) = self.handles.lock().remove(&fh) else {
            return result;
        };
        let last = {
            let mut files = self.files.lock();
            match files.get_mut(&ino) {
                Some(o) if o.handles > 1 => {
                    o.handles -= 1;
                    None
                }
                Some(_) => files.remove(&ino).map(|o| o.file),
                None => None,
            }
        };
        if let (Some(file), Err(e)) = (last, &result) {
            tracing::warn!(ino, "last close failed ({e}); discarding what could not be committed");
            file.abandon(&self.nodes).await;
        }
        result
    }

    pub async fn statfs(&self) -> Result<p::StatFsReply> {
        self.meta.stat_fs(p::Empty {}).await
    }

    pub async fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        Ok(self.meta.get_xattr(p::XattrRequest { ino, name: name.to_vec() }).await?.value)
    }

    pub async fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        let req = p::SetXattrRequest { ino, name: name.to_vec(), value: value.to_vec(), flags };
        self.meta.set_xattr(req).await.map(|_| ())
    }

    pub async fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        Ok(self.meta.list_xattr(p::InoRequest { ino }).await?.names)
    }

    pub async fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.meta.remove_xattr(p::XattrRequest { ino, name: name.to_vec() }).await.map(|_| ())
    }

    pub fn opendir(&self, ino: u64) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().insert(fh, Arc::new(DirHandle::new(ino)));
        fh
    }

    pub fn dir_handle(&self, fh: u64) -> Result<Arc<DirHandle>> {
        self.dirs
            .lock()
            .get(&fh)
            .cloned()
            .ok_or_else(|| CairnError::invalid(format!("bad directory handle {fh}")))
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }
}

fn need(attr: Option<p::Attr>) -> Result<p::Attr> {
    attr.ok_or_else(|| CairnError::internal("metaserver reply without attributes"))
}

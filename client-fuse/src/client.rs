//! [`Client`]: the filesystem as a library. Namespace operations go to the metaserver; file
//! data goes through [`OpenFile`] to the chunkservers. Each inode open on this client has one
//! `OpenFile` shared by all its handles, so two descriptors of one file see each other's
//! writes; the last release commits and forgets it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto as p;
use parking_lot::Mutex;

use crate::background::Background;
use crate::dir::DirHandle;
use crate::file::{Changes, Versions};
use crate::meta::{MetaApi, MetaConn};
use crate::nodes::{MetaDirectory, Nodes};
use crate::readahead::Readahead;

mod attr_cache;
mod handles;
mod session;
#[cfg(test)]
mod tests;
mod write_back;

use attr_cache::AttrCache;
use handles::Opened;
use session::{session_heartbeat, Releases};

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long the kernel may cache attributes and directory entries.
    pub attr_ttl: Duration,
    /// Bytes of verified shard blocks kept for random readers (0: no block cache).
    pub block_cache_bytes: usize,
    /// Write-back: an open file's changes are committed in the background once the oldest of
    /// them is this old, so a writer that never closes (or a client that dies) loses at most
    /// about this much. Zero: only close and fsync commit.
    pub commit_interval: Duration,
    /// How long a create, write or read that finds fewer chunkservers answering than a stripe
    /// needs (`k+1` to write, `k` to read) waits for them, retrying, before it fails with EIO.
    /// Zero: fail at once.
    pub write_wait: Duration,
    /// What a close guarantees (docs/ARCHITECTURE.md, "Durability").
    pub durability: Durability,
    /// The most a sequential reader of one file may have fetched ahead, bytes; the mount as a
    /// whole reads ahead at most eight times this (docs/ARCHITECTURE.md, "Read-ahead").
    pub readahead_bytes: u64,
}

/// What a close guarantees. `Close` (HDFS's hflush): the file's shards are on every
/// chunkserver (in its page cache, on disk within its flush interval) and its commit is in the
/// metaserver's durable log; `fsync` makes them durable on disk (hsync). `Fsync`: every shard
/// write is on disk before it is answered, so a close is as durable as an fsync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    #[default]
    Close,
    Fsync,
}

impl std::str::FromStr for Durability {
    type Err = CairnError;
    fn from_str(s: &str) -> Result<Durability> {
        match s {
            "close" => Ok(Durability::Close),
            "fsync" => Ok(Durability::Fsync),
            _ => Err(CairnError::invalid(format!("durability {s:?}: close or fsync"))),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Close => "close",
            Durability::Fsync => "fsync",
        })
    }
}

/// The commit interval unless told otherwise, in milliseconds (ext4 commits its journal every
/// 5 seconds by default).
pub const DEFAULT_COMMIT_INTERVAL_MS: u64 = 5000;

/// How long I/O waits for chunkservers unless told otherwise, in milliseconds: long enough for
/// a chunkserver restart or a network blip, short enough that a job sees a real outage.
pub const DEFAULT_WRITE_WAIT_MS: u64 = 60_000;

/// The block cache's size unless told otherwise: 1 GiB, or a sixteenth of the machine's memory
/// when that is less.
pub fn default_block_cache_mib() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let ram_mib = if pages > 0 && page > 0 { (pages as u64 * page as u64) >> 20 } else { 0 };
    (ram_mib / 16).min(1024)
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            attr_ttl: Duration::from_secs(1),
            block_cache_bytes: (default_block_cache_mib() << 20) as usize,
            commit_interval: Duration::from_millis(DEFAULT_COMMIT_INTERVAL_MS),
            write_wait: Duration::from_millis(DEFAULT_WRITE_WAIT_MS),
            durability: Durability::default(),
            readahead_bytes: crate::readahead::DEFAULT_READAHEAD_MIB << 20,
        }
    }
}

/// What an open tells the FUSE layer.
pub struct OpenOutcome {
    pub fh: u64,
    /// The file did not change since this client last opened it: the kernel may keep its pages.
    pub keep_cache: bool,
    /// The file changed since this client last saw it: the kernel's cached attributes are stale.
    pub changed: bool,
}

pub struct Client {
    pub meta: Arc<dyn MetaApi>,
    /// The metaserver's access rules let this client change nothing.
    pub read_only: bool,
    /// The directory the metaserver's access rules limit this client to, shown as the mount's
    /// root (0: the namespace's root).
    pub root: u64,
    nodes: Arc<Nodes>,
    pub options: ClientOptions,
    readahead: Arc<Readahead>,
    versions: Versions,
    next_fh: AtomicU64,
    files: Arc<Mutex<HashMap<u64, Opened>>>,
    /// Inodes on which this client took locks, with the lock owners, so a close releases them
    /// without asking the metaserver on every close.
    lock_owners: Mutex<HashMap<u64, HashSet<u64>>>,
    client_id: u32,
    handles: Mutex<HashMap<u64, u64>>,
    dirs: Mutex<HashMap<u64, Arc<DirHandle>>>,
    /// (mtime, size) of each inode when this client last opened it, for FOPEN_KEEP_CACHE.
    seen: Mutex<HashMap<u64, (i64, u32, u64)>>,
    /// Absent xattrs and directories as this client's changes left them, for `attr_ttl`.
    cache: AttrCache,
    /// Commits and truncations by this client, numbered in `commits`; per inode (hashed into
    /// [`EPOCH_BUCKETS`]) the number of its latest one, advanced while the file's lock is held.
    /// A request reads the counter before asking the metaserver; if the inode changed before
    /// the answer is applied, the answer may predate this client's own commit (one process
    /// closing the file while another opens it) and is asked for again, rather than bringing
    /// back stripes or an end of file this client already replaced.
    epochs: Vec<AtomicU64>,
    commits: AtomicU64,
    releases: Arc<Releases>,
    /// The session heartbeat, the release batches and the write-back: stopped with the client.
    background: Background,
}

impl Drop for Client {
    /// The background tasks stop (their `Background` is dropped next); releases still queued
    /// are sent from a last task of their own, so the metaserver need not wait for the session
    /// lease to learn of them.
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            if !self.releases.pending.lock().is_empty() {
                let releases = self.releases.clone();
                runtime.spawn(async move { releases.flush().await });
            }
        }
    }
}

const EPOCH_BUCKETS: usize = 1024;
/// Opens retried because a commit of this client raced with them, before giving up.
const OPEN_ATTEMPTS: usize = 16;

impl Client {
    /// Register with the metaserver (which hands out the id that makes stripe versions unique)
    /// and start the session heartbeat, the release batches and the write-back, all stopped
    /// once the client is dropped.
    pub async fn new(meta: MetaConn, options: ClientOptions) -> Result<Arc<Client>> {
        let meta: Arc<dyn MetaApi> = Arc::new(meta);
        let directory = Arc::new(MetaDirectory::new(meta.clone())?);
        Client::start(meta, Nodes::with_directory(directory, options.block_cache_bytes), options).await
    }

    /// [`Client::new`] over any metaserver and chunkservers (the unit tests' fakes).
    pub(crate) async fn start(
        meta: Arc<dyn MetaApi>,
        nodes: Nodes,
        options: ClientOptions,
    ) -> Result<Arc<Client>> {
        let registered = meta.register_client(p::Empty {}).await?;
        let (client_id, read_only, root) = (registered.client_id, registered.read_only, registered.root);
        meta.set_client(client_id.into());
        let nodes = Arc::new(nodes.with_wait(options.write_wait).with_durability(options.durability));
        nodes.refresh().await?;
        let files: Arc<Mutex<HashMap<u64, Opened>>> = Arc::new(Mutex::new(HashMap::new()));
        let background = Background::default();
        background.spawn(session_heartbeat(meta.clone(), client_id, files.clone()));
        let releases = Arc::new(Releases::new(meta.clone(), client_id));
        background.spawn(releases.clone().run());
        let client = Arc::new(Client {
            meta,
            read_only,
            root,
            nodes,
            readahead: Readahead::new(options.readahead_bytes),
            cache: AttrCache::new(options.attr_ttl),
            options,
            versions: Versions::new(client_id),
            next_fh: AtomicU64::new(1),
            files,
            lock_owners: Mutex::new(HashMap::new()),
            client_id,
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            epochs: (0..EPOCH_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            commits: AtomicU64::new(0),
            releases,
            background,
        });
        if !client.options.commit_interval.is_zero() {
            client.background.spawn(write_back::run(Arc::downgrade(&client)));
        }
        Ok(client)
    }

    fn epoch(&self, ino: u64) -> &AtomicU64 {
        &self.epochs[(ino % EPOCH_BUCKETS as u64) as usize]
    }

    fn changes(&self, ino: u64) -> Changes<'_> {
        Changes { inode: self.epoch(ino), any: &self.commits }
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

    /// Attributes from the metaserver may predate a commit this client made while the request
    /// was out (one process closes the file while another stats or appends to it); handed to
    /// the kernel, such a size would move its end of file back and an `O_APPEND` write would
    /// land on data already written. So when a commit of this client went out meanwhile, ask
    /// again.
    pub async fn lookup(&self, parent: u64, name: &[u8], caller: &p::Caller) -> Result<p::Attr> {
        for attempt in 1.. {
            // The inode is known only from the answer: note where the sequence of changes was.
            let before = self.commits.load(Ordering::Acquire);
            let req = p::LookupRequest { parent, name: name.to_vec(), caller: Some(caller.clone()) };
            let attr = need(self.meta.lookup(req).await?.attr)?;
            // After local_view: it waits for a flush in progress, which advances the counter.
            let attr = self.local_view(attr).await;
            if attempt < OPEN_ATTEMPTS && self.epoch(attr.ino).load(Ordering::Acquire) > before {
                continue;
            }
            return Ok(attr);
        }
        unreachable!("the loop returns")
    }

    pub async fn getattr(&self, ino: u64) -> Result<p::Attr> {
        if let Some(attr) = self.cache.dir(ino) {
            return Ok(attr);
        }
        for attempt in 1.. {
            let epoch = self.epoch(ino).load(Ordering::Acquire);
            let attr = need(self.meta.get_attr(p::InoRequest { ino }).await?.attr)?;
            let attr = self.local_view(attr).await;
            if attempt < OPEN_ATTEMPTS && self.epoch(ino).load(Ordering::Acquire) != epoch {
                continue;
            }
            return Ok(attr);
        }
        unreachable!("the loop returns")
    }

    pub async fn setattr(&self, req: p::SetAttrRequest) -> Result<p::Attr> {
        let ino = req.ino;
        self.cache.dir_changed(ino, None);
        let file = self.open_file(ino);
        if let (Some(file), Some(_)) = (&file, req.size) {
            // Truncation acts on committed stripes: publish buffered writes first.
            file.flush(&self.nodes, &*self.meta, &self.versions, self.changes(ino), false).await?;
        }
        let size = req.size;
        let before = self.commits.load(Ordering::Acquire);
        let set = self.meta.set_attr(req).await;
        if size.is_some() {
            self.changes(ino).bump();
        }
        let attr = need(set?.attr)?;
        if let (Some(file), Some(size)) = (file, size) {
            file.truncated(size).await;
        }
        let attr = self.local_view(attr).await;
        // Another commit of this client went out meanwhile (see `lookup`): its size may be
        // newer than the one in this answer.
        if self.commits.load(Ordering::Acquire) != before + u64::from(size.is_some()) {
            return self.getattr(ino).await;
        }
        Ok(attr)
    }

    /// Create (and with `open`, open) a file. A non-exclusive create that finds the name taken
    /// (another client created it after the kernel's lookup) opens the existing file, and
    /// `truncate` (O_TRUNC) then empties it, as open(2) would.
    pub async fn create(
        &self,
        mut req: p::CreateRequest,
        open: bool,
        truncate: bool,
        access: u32,
    ) -> Result<(p::Attr, u64)> {
        req.client_id = self.client_id;
        req.open = open;
        let generation = self.releases.next_generation();
        req.generation = generation;
        let parent = req.parent;
        // Placing a new file needs k+1 chunkservers up: wait for them like a write does. The
        // metaserver refuses before creating anything, so trying again is safe.
        let reply = self
            .nodes
            .waiting("create", || {
                let mut req = req.clone();
                req.avoid_nodes = self.nodes.suspects();
                self.meta.create(req)
            })
            .await?;
        // A new file's token reads and writes, and so does its renewal.
        let ino = reply.file.as_ref().and_then(|f| f.attr.as_ref()).map_or(0, |a| a.ino);
        self.nodes
            .keep_capability(reply.cap, p::CapabilityRequest { ino, access: 6, caller: req.caller.clone() });
        let info = reply.file.ok_or_else(|| CairnError::internal("create: no file info"))?;
        let attr = need(info.attr)?;
        if reply.created {
            self.cache.dir_changed(parent, reply.parent);
            // No xattrs yet (the kernel asks for `security.capability` before the first write).
            self.cache.note_absent(attr.ino, b"");
        }
        if !open {
            return Ok((attr, 0));
        }
        if !reply.created {
            // O_CREAT without O_EXCL on an existing file: an ordinary open.
            let caller = req.caller.clone().unwrap_or_default();
            let opened = self.open(attr.ino, truncate, access, &caller).await?;
            let attr = if truncate && attr.size > 0 {
                let empty = p::SetAttrRequest {
                    ino: attr.ino,
                    size: Some(0),
                    by_handle: true,
                    caller: req.caller.clone(),
                    ..Default::default()
                };
                self.setattr(empty).await?
            } else {
                attr
            };
            return Ok((self.local_view(attr).await, opened.fh));
        }
        // A new inode: no commit of this client can have raced with its creation.
        let fh = self
            .register_open(info, Vec::new(), false, None, generation)
            .await?
            .ok_or_else(|| CairnError::internal("create: registration refused"))?;
        Ok((attr, fh))
    }

    pub async fn mkdir(&self, req: p::MkdirRequest) -> Result<p::Attr> {
        let parent = req.parent;
        let reply = self.meta.mkdir(req).await;
        self.cache.dir_changed(parent, reply.as_ref().ok().and_then(|r| r.parent));
        need(reply?.attr)
    }

    pub async fn unlink(&self, parent: u64, name: &[u8], caller: &p::Caller) -> Result<()> {
        let req = p::RemoveRequest { parent, name: name.to_vec(), caller: Some(caller.clone()), once: None };
        let reply = self.meta.unlink(req).await;
        self.cache.dir_changed(parent, reply.as_ref().ok().and_then(|r| r.parent));
        reply.map(|_| ())
    }

    pub async fn rmdir(&self, parent: u64, name: &[u8], caller: &p::Caller) -> Result<()> {
        let req = p::RemoveRequest { parent, name: name.to_vec(), caller: Some(caller.clone()), once: None };
        let reply = self.meta.rmdir(req).await;
        // The removed directory's noted attributes (if any) must go too; its inode is not known
        // here.
        self.cache.dirs_changed_but(&[]);
        self.cache.dir_changed(parent, reply.as_ref().ok().and_then(|r| r.parent));
        reply.map(|_| ())
    }

    pub async fn rename(&self, req: p::RenameRequest) -> Result<()> {
        let (parent, new_parent) = (req.parent, req.new_parent);
        let reply = self.meta.rename(req).await;
        // A directory renamed (or replaced) changed too, and its inode is not known here.
        self.cache.dirs_changed_but(&[]);
        if let Ok(r) = &reply {
            self.cache.dir_changed(parent, r.parent);
            self.cache.dir_changed(new_parent, r.new_parent);
        }
        reply.map(|_| ())
    }

    pub async fn link(
        &self,
        ino: u64,
        new_parent: u64,
        new_name: &[u8],
        caller: &p::Caller,
    ) -> Result<p::Attr> {
        let req = p::LinkRequest {
            ino,
            new_parent,
            new_name: new_name.to_vec(),
            caller: Some(caller.clone()),
            once: None,
        };
        let reply = self.meta.link(req).await;
        self.cache.dir_changed(new_parent, reply.as_ref().ok().and_then(|r| r.parent));
        Ok(self.local_view(need(reply?.attr)?).await)
    }

    pub async fn symlink(&self, req: p::SymlinkRequest) -> Result<p::Attr> {
        let parent = req.parent;
        let reply = self.meta.symlink(req).await;
        self.cache.dir_changed(parent, reply.as_ref().ok().and_then(|r| r.parent));
        need(reply?.attr)
    }

    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        Ok(self.meta.readlink(p::InoRequest { ino }).await?.target)
    }

    /// Open a regular file: fetch its layout, placement and stripe records (close-to-open:
    /// every open sees the newest commit).
    /// `access`: what the open asks of the file (`OpenRequest.access`).
    pub async fn open(
        &self,
        ino: u64,
        truncate: bool,
        access: u32,
        caller: &p::Caller,
    ) -> Result<OpenOutcome> {
        for attempt in 1.. {
            let epoch = self.epoch(ino).load(Ordering::Acquire);
            let generation = self.releases.next_generation();
            let req = p::OpenRequest {
                ino,
                client_id: self.client_id,
                generation,
                access,
                caller: Some(caller.clone()),
            };
            let reply = self.meta.open(req).await?;
            self.nodes.keep_capability(
                reply.cap,
                p::CapabilityRequest { ino, access, caller: Some(caller.clone()) },
            );
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
            // After the last try, take the answer anyway: an open file keeps its newer state.
            let check = (attempt < OPEN_ATTEMPTS).then_some(epoch);
            let Some(fh) = self.register_open(info, stripes, true, check, generation).await? else {
                tracing::debug!(
                    ino,
                    attempt,
                    "open raced with a commit or release of this client; asking again"
                );
                continue;
            };
            let mtime = attr.mtime.unwrap_or_default();
            let stamp = (mtime.sec, mtime.nsec, attr.size);
            let previous = self.seen.lock().insert(ino, stamp);
            let keep_cache = !truncate && previous == Some(stamp);
            return Ok(OpenOutcome { fh, keep_cache, changed: previous.is_some_and(|p| p != stamp) });
        }
        unreachable!("the loop returns")
    }

    pub async fn read(&self, fh: u64, offset: u64, len: u32) -> Result<bytes::Bytes> {
        self.handle_file(fh)?.read(&self.nodes, offset, len).await
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.handle_file(fh)?.write(&self.nodes, &self.versions, offset, data).await
    }

    /// Write out buffered data and commit it (close, fsync).
    pub async fn flush(&self, fh: u64) -> Result<()> {
        let (ino, file) = self.handle(fh)?;
        file.flush(&self.nodes, &*self.meta, &self.versions, self.changes(ino), false).await.map(|_| ())
    }

    /// fsync(2): write out what is buffered, have the file's chunkservers put its shards on
    /// disk, and commit (a commit is durable at the metaserver, with every namespace change
    /// before it); with nothing to commit, ask the metaserver to make its changes so far
    /// durable (the file's create, a chmod, a rename into place).
    pub async fn fsync(&self, fh: u64) -> Result<()> {
        let (ino, file) = self.handle(fh)?;
        match file.flush(&self.nodes, &*self.meta, &self.versions, self.changes(ino), true).await? {
            Some(_) => Ok(()),
            None => self.sync_namespace().await,
        }
    }

    /// fsync(2) of a directory: every namespace change so far is made durable.
    pub async fn sync_namespace(&self) -> Result<()> {
        self.meta.sync(p::Empty {}).await.map(|_| ())
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
                Some(_) => {
                    let o = files.remove(&ino).expect("present");
                    // Under the lock, so an open registering next sees it (`register_open`).
                    self.releases.released(ino).fetch_max(o.generation, Ordering::AcqRel);
                    Some((o.file, o.generation))
                }
                None => None,
            }
        };
        if let Some((file, generation)) = last {
            if let Err(e) = &result {
                tracing::warn!(ino, "last close failed ({e}); discarding what could not be committed");
                file.abandon(&*self.meta, &self.nodes).await;
            }
            // The metaserver drops our locks on the file, and frees it if it was unlinked.
            let locked = self.lock_owners.lock().remove(&ino).is_some();
            self.releases.release(ino, generation, locked).await;
        }
        result
    }

    /// Send the releases still queued (at unmount).
    pub async fn flush_releases(&self) {
        self.releases.flush().await;
    }

    /// fallocate(2). Mode 0 (posix_fallocate) extends the file to `offset + length` if it is
    /// shorter; space is not reserved ahead (shards are written on demand), so what it
    /// guarantees is the size, not that a later write cannot hit ENOSPC. Other modes
    /// (punch hole, collapse, zero range) are EOPNOTSUPP, which tools handle by falling back.
    pub async fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
        caller: &p::Caller,
    ) -> Result<()> {
        if mode != 0 {
            return Err(CairnError::new(ErrorKind::NotSupported, format!("fallocate mode {mode:#x}")));
        }
        let end = offset
            .checked_add(length)
            .ok_or_else(|| CairnError::new(ErrorKind::TooBig, "offset + length overflows"))?;
        let size = self.getattr(ino).await?.size;
        // Through the open file (fallocate(2) takes a descriptor).
        let mut req =
            p::SetAttrRequest { ino, by_handle: true, caller: Some(caller.clone()), ..Default::default() };
        if end > size {
            req.size = Some(end);
        } else {
            req.ctime = Some(cairn_common::time::now());
        }
        self.setattr(req).await.map(|_| ())
    }

    /// F_GETLK: the first conflicting lock, or `None`.
    pub async fn getlk(
        &self,
        ino: u64,
        owner: u64,
        range: (u64, u64),
        typ: u32,
        pid: u32,
    ) -> Result<Option<p::LockReply>> {
        let req = lock_request(self.client_id, ino, owner, range, typ, pid, true);
        let reply = self.meta.lock(req).await?;
        Ok((!reply.granted).then_some(reply))
    }

    /// F_SETLK / F_SETLKW (`wait`): take, change or drop a lock. A waiting request polls until
    /// the lock is free, and gives up with EINTR if the waiting process is gone.
    pub async fn setlk(
        &self,
        ino: u64,
        owner: u64,
        range: (u64, u64),
        typ: u32,
        pid: u32,
        wait: bool,
    ) -> Result<()> {
        let mut delay = Duration::from_millis(5);
        loop {
            let req = lock_request(self.client_id, ino, owner, range, typ, pid, false);
            if self.meta.lock(req).await?.granted {
                if typ != libc::F_UNLCK as u32 {
                    self.lock_owners.lock().entry(ino).or_default().insert(owner);
                }
                return Ok(());
            }
            if !wait {
                return Err(CairnError::new(ErrorKind::WouldBlock, "lock held by another owner"));
            }
            if pid != 0 && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return Err(CairnError::new(ErrorKind::Interrupted, "waiting process is gone"));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    /// Drop every lock `owner` holds on `ino` (close of a descriptor), if it holds any.
    pub async fn unlock_owner(&self, ino: u64, owner: u64) -> Result<()> {
        let held = self.lock_owners.lock().get_mut(&ino).is_some_and(|owners| owners.remove(&owner));
        if held {
            let req = lock_request(self.client_id, ino, owner, (0, u64::MAX), libc::F_UNLCK as u32, 0, false);
            self.meta.lock(req).await?;
        }
        Ok(())
    }

    pub async fn statfs(&self) -> Result<p::StatFsReply> {
        self.meta.stat_fs(p::Empty {}).await
    }

    pub async fn getxattr(&self, ino: u64, name: &[u8], caller: &p::Caller) -> Result<Vec<u8>> {
        if self.cache.xattr_absent(ino, name) {
            return Err(CairnError::new(ErrorKind::NoData, "no such xattr"));
        }
        let req = p::XattrRequest { ino, name: name.to_vec(), caller: Some(caller.clone()), once: None };
        match self.meta.get_xattr(req).await {
            Ok(reply) => Ok(reply.value),
            Err(e) => {
                // `trusted.*` are hidden from all but root: absent for this caller only.
                let hidden = name.starts_with(b"trusted.") && caller.uid != 0;
                if e.kind() == ErrorKind::NoData && !hidden {
                    self.cache.note_absent(ino, name);
                }
                Err(e)
            }
        }
    }

    pub async fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        caller: &p::Caller,
    ) -> Result<()> {
        let req = p::SetXattrRequest {
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
            caller: Some(caller.clone()),
            once: None,
        };
        let result = self.meta.set_xattr(req).await.map(|_| ());
        // After the change (a lookup racing with it may have found the name still absent).
        self.cache.xattrs_changed(ino);
        result
    }

    pub async fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        Ok(self.meta.list_xattr(p::InoRequest { ino }).await?.names)
    }

    pub async fn removexattr(&self, ino: u64, name: &[u8], caller: &p::Caller) -> Result<()> {
        let req = p::XattrRequest { ino, name: name.to_vec(), caller: Some(caller.clone()), once: None };
        let result = self.meta.remove_xattr(req).await.map(|_| ());
        self.cache.xattrs_changed(ino);
        result
    }

    /// A directory handle; its pages are read as `caller` (the opendir's), whose permission
    /// to list it the metaserver checks at the first page.
    pub fn opendir(&self, ino: u64, caller: p::Caller) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().insert(fh, Arc::new(DirHandle::new(ino, caller)));
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

fn lock_request(
    client_id: u32,
    ino: u64,
    owner: u64,
    range: (u64, u64),
    typ: u32,
    pid: u32,
    test: bool,
) -> p::LockRequest {
    p::LockRequest { client_id, ino, owner, pid, start: range.0, end: range.1, typ, test }
}

fn need(attr: Option<p::Attr>) -> Result<p::Attr> {
    attr.ok_or_else(|| CairnError::internal("metaserver reply without attributes"))
}

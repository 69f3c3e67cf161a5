//! The FUSE adapter. Callbacks are thin: each copies its arguments into a future that calls the
//! [`Client`] and turns `Result<T, CairnError>` into `reply.*`, with the one errno mapping of
//! `cairn_common::ErrorKind`. The future is polled once on the FUSE thread and, if it has to
//! wait (a server's answer, a lock), continues as a task on the tokio runtime, so the FUSE
//! threads never wait on the network.

use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cairn_common::{CairnError, Result};
use cairn_proto as p;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};

use crate::caller::{access_of, Callers};
use crate::{connect_meta, Client, ClientOptions};

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    pub meta: String,
    pub mountpoint: PathBuf,
    /// FUSE request-reading threads.
    pub threads: usize,
    pub attr_ttl: Duration,
    /// Bytes of the client's block cache for random readers (0: none).
    pub block_cache_bytes: usize,
    /// Let other users than the mounting one use the mount (root only).
    pub allow_other: bool,
    /// Serve Prometheus metrics at `http://ADDR/metrics`.
    pub metrics: Option<String>,
    /// Mount read-only: the kernel refuses every change with EROFS.
    pub read_only: bool,
    /// Honour setuid/setgid bits when the mount's files are executed (off by default: any
    /// client host's root, or anyone who can act as root on one, could otherwise plant a
    /// setuid-root binary that runs as root on every other host mounting the cluster).
    pub suid: bool,
    /// Let device nodes on the mount be opened as devices (off by default, for the same reason).
    pub dev: bool,
    /// Let the mount's files be executed (on by default).
    pub exec: bool,
    /// Write-back: how old an open file's oldest uncommitted change may get before it is
    /// committed in the background (zero: only close and fsync commit).
    pub commit_interval: Duration,
    /// How long I/O waits for chunkservers when too few answer (zero: fail at once).
    pub write_wait: Duration,
    /// What a close guarantees.
    pub durability: crate::Durability,
    /// The most a sequential reader of one file may have fetched ahead, bytes.
    pub readahead_bytes: u64,
}

/// Connect to the metaserver and serve the mount until it is unmounted (`umount`, or SIGINT /
/// SIGTERM to this process, which unmount cleanly).
pub fn mount(opts: MountOptions) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("cairn-client")
        .enable_all()
        .build()
        .map_err(|e| CairnError::io(format!("tokio runtime: {e}")))?;
    if !opts.mountpoint.is_dir() {
        return Err(CairnError::invalid(format!(
            "mount point {} is not a directory",
            opts.mountpoint.display()
        )));
    }
    let client = rt.block_on(async {
        if let Some(listen) = &opts.metrics {
            cairn_net::metrics::serve(listen)?;
        }
        let meta = connect_meta(&opts.meta).await?;
        Client::new(
            meta,
            ClientOptions {
                attr_ttl: opts.attr_ttl,
                block_cache_bytes: opts.block_cache_bytes,
                commit_interval: opts.commit_interval,
                write_wait: opts.write_wait,
                durability: opts.durability,
                readahead_bytes: opts.readahead_bytes,
            },
        )
        .await
    })?;
    let notifier = Arc::new(std::sync::OnceLock::new());
    let fs = CairnFs {
        client: client.clone(),
        notifier: notifier.clone(),
        rt: rt.handle().clone(),
        ttl: opts.attr_ttl,
        callers: Callers::default(),
        root: client.root,
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("cairn:{}", opts.meta)),
        MountOption::Subtype("cairn".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        if opts.dev { MountOption::Dev } else { MountOption::NoDev },
        if opts.suid { MountOption::Suid } else { MountOption::NoSuid },
        if opts.exec { MountOption::Exec } else { MountOption::NoExec },
    ];
    if opts.read_only || client.read_only {
        if !opts.read_only {
            tracing::info!("mounted read-only: the metaserver's access rules let this client change nothing");
        }
        config.mount_options.push(MountOption::RO);
    }
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let mut session = fuser::Session::new(fs, &opts.mountpoint, &config)
        .map_err(|e| CairnError::from_io(&format!("mount {}", opts.mountpoint.display()), &e))?;
    let _ = notifier.set(session.notifier());
    let mut unmounter = session.unmount_callable();
    rt.spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received, unmounting");
        if let Err(e) = unmounter.unmount() {
            tracing::warn!("unmount: {e}");
        }
    });
    tracing::info!(mountpoint = %opts.mountpoint.display(), meta = %opts.meta, "mounted");
    let served = session.run().map_err(|e| CairnError::from_io("fuse session", &e));
    rt.block_on(client.flush_releases());
    served?;
    tracing::info!("unmounted");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

struct CairnFs {
    client: Arc<Client>,
    /// Set once the session exists; used to invalidate stale kernel attributes.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    rt: tokio::runtime::Handle,
    ttl: Duration,
    /// The groups of the processes behind requests (the kernel sends none).
    callers: Callers,
    /// The metaserver's inode shown as this mount's root (0: its root): the subtree its
    /// access rule limits this client to.
    root: u64,
}

impl CairnFs {
    /// The metaserver's inode for the kernel's `ino` (the mount's root is the subtree's).
    fn meta(&self, ino: INodeNo) -> INodeNo {
        if ino == INodeNo::ROOT && self.root != 0 {
            INodeNo(self.root)
        } else {
            ino
        }
    }

    /// Who `req` is made for, as the metaserver checks it.
    fn caller(&self, req: &Request) -> p::Caller {
        self.callers.of(req.uid(), req.gid(), req.pid())
    }
}

fn errno(e: &CairnError) -> Errno {
    Errno::from_i32(e.errno())
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn to_fuse(a: &p::Attr) -> FileAttr {
    let t =
        |ts: &Option<p::Timespec>| ts.as_ref().map_or(SystemTime::UNIX_EPOCH, cairn_common::time::to_system);
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: t(&a.atime),
        mtime: t(&a.mtime),
        ctime: t(&a.ctime),
        crtime: t(&a.crtime),
        kind: kind_of(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 1 << 20,
        flags: 0,
    }
}

fn time_arg(t: Option<TimeOrNow>) -> (Option<p::Timespec>, bool) {
    match t {
        None => (None, false),
        Some(TimeOrNow::Now) => (None, true),
        Some(TimeOrNow::SpecificTime(st)) => (Some(cairn_common::time::from_system(st)), false),
    }
}

impl CairnFs {
    /// Run a request's work, counted and timed as `op`: polled once here, on the FUSE thread,
    /// and handed to the runtime only if it has to wait. Work the client answers from memory
    /// (a cached attribute, a flush of a clean file, a queued release, a write into a stripe
    /// buffer) is replied to without waking a runtime thread, and a request to a server is sent
    /// from here, so only its answer wakes the runtime. On a VM where waking an idle vCPU costs
    /// tens of microseconds, each wake saved is most of a cached operation's time.
    fn spawn<F>(&self, op: &'static str, f: impl FnOnce(Arc<Client>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let work = f(self.client.clone());
        let started = std::time::Instant::now();
        let mut task = Box::pin(async move {
            work.await;
            metrics::counter!(crate::metrics::FUSE_OPS, "op" => op).increment(1);
            metrics::histogram!(crate::metrics::FUSE_SECONDS, "op" => op)
                .record(started.elapsed().as_secs_f64());
        });
        // The runtime's context (I/O driver, timers, spawn) for the first poll. A future left
        // pending has registered the no-op waker; the runtime polls it again at once when it is
        // spawned, with its own waker, so no wake-up is lost.
        let _context = self.rt.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if task.as_mut().poll(&mut cx).is_pending() {
            metrics::counter!(crate::metrics::FUSE_DEFERRED, "op" => op).increment(1);
            self.rt.spawn(task);
        }
    }
}

/// Attributes of the metaserver's `root` (the mount's subtree) are the mount root's, inode 1.
fn as_mounted(root: u64, mut attr: FileAttr) -> FileAttr {
    if attr.ino.0 == root {
        attr.ino = INodeNo::ROOT;
    }
    attr
}

/// Reply helpers usable from spawned tasks.
fn reply_entry(ttl: Duration, reply: ReplyEntry, r: Result<p::Attr>) {
    match r {
        Ok(a) => reply.entry(&ttl, &to_fuse(&a), Generation(0)),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_xattr(reply: ReplyXattr, size: u32, r: Result<Vec<u8>>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(&e)),
    }
}

impl Filesystem for CairnFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20).or_else(|max| config.set_max_readahead(max));
        let _ = config.set_max_background(64);
        for flag in [
            InitFlags::FUSE_ASYNC_DIO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_POSIX_LOCKS,
            InitFlags::FUSE_FLOCK_LOCKS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let parent = self.meta(parent);
        let name = name.as_bytes().to_vec();
        let ttl = self.ttl;
        let caller = self.caller(req);
        self.spawn(
            "lookup",
            |c| async move { reply_entry(ttl, reply, c.lookup(parent.0, &name, &caller).await) },
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ino = self.meta(ino);
        let (ttl, root) = (self.ttl, self.root);
        self.spawn("getattr", |c| async move {
            match c.getattr(ino.0).await {
                Ok(a) => reply.attr(&ttl, &as_mounted(root, to_fuse(&a))),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let ino = self.meta(ino);
        let (atime, atime_now) = time_arg(atime);
        let (mtime, mtime_now) = time_arg(mtime);
        let req = p::SetAttrRequest {
            ino: ino.0,
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            atime_now,
            mtime_now,
            ctime: ctime.map(cairn_common::time::from_system),
            by_handle: fh.is_some(),
            caller: Some(self.caller(req)),
            once: None,
        };
        let (ttl, root) = (self.ttl, self.root);
        self.spawn("setattr", |c| async move {
            match c.setattr(req).await {
                Ok(a) => reply.attr(&ttl, &as_mounted(root, to_fuse(&a))),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let ino = self.meta(ino);
        self.spawn("readlink", |c| async move {
            match c.readlink(ino.0).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let parent = self.meta(parent);
        let req = p::CreateRequest {
            parent: parent.0,
            name: name.as_bytes().to_vec(),
            mode: mode & !(umask & 0o7777),
            uid: req.uid(),
            gid: req.gid(),
            rdev,
            exclusive: true,
            caller: Some(self.caller(req)),
            ..Default::default()
        };
        let ttl = self.ttl;
        self.spawn("mknod", |c| async move {
            reply_entry(ttl, reply, c.create(req, false, false, 0).await.map(|(a, _)| a))
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let parent = self.meta(parent);
        let req = p::MkdirRequest {
            parent: parent.0,
            name: name.as_bytes().to_vec(),
            mode: mode & !umask & 0o7777,
            uid: req.uid(),
            gid: req.gid(),
            caller: Some(self.caller(req)),
            once: None,
        };
        let ttl = self.ttl;
        self.spawn("mkdir", |c| async move { reply_entry(ttl, reply, c.mkdir(req).await) });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let parent = self.meta(parent);
        let name = name.as_bytes().to_vec();
        let caller = self.caller(req);
        self.spawn("unlink", |c| async move { reply_empty(reply, c.unlink(parent.0, &name, &caller).await) });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let parent = self.meta(parent);
        let name = name.as_bytes().to_vec();
        let caller = self.caller(req);
        self.spawn("rmdir", |c| async move { reply_empty(reply, c.rmdir(parent.0, &name, &caller).await) });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let parent = self.meta(parent);
        let req = p::SymlinkRequest {
            parent: parent.0,
            name: link_name.as_bytes().to_vec(),
            target: target.as_os_str().as_bytes().to_vec(),
            uid: req.uid(),
            gid: req.gid(),
            caller: Some(self.caller(req)),
            once: None,
        };
        let ttl = self.ttl;
        self.spawn("symlink", |c| async move { reply_entry(ttl, reply, c.symlink(req).await) });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let parent = self.meta(parent);
        let newparent = self.meta(newparent);
        let req = p::RenameRequest {
            parent: parent.0,
            name: name.as_bytes().to_vec(),
            new_parent: newparent.0,
            new_name: newname.as_bytes().to_vec(),
            flags: flags.bits(),
            caller: Some(self.caller(req)),
            once: None,
        };
        self.spawn("rename", |c| async move { reply_empty(reply, c.rename(req).await) });
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let ino = self.meta(ino);
        let newparent = self.meta(newparent);
        let name = newname.as_bytes().to_vec();
        let ttl = self.ttl;
        let caller = self.caller(req);
        self.spawn("link", |c| async move {
            reply_entry(ttl, reply, c.link(ino.0, newparent.0, &name, &caller).await)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let ino = self.meta(ino);
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let notifier = self.notifier.clone();
        let caller = self.caller(req);
        self.spawn("open", |c| async move {
            match c.open(ino.0, truncate, access_of(flags.0), &caller).await {
                Ok(o) => {
                    if o.changed {
                        // Close-to-open: another client committed since we last looked, so the
                        // kernel's cached size and times must go before this open returns.
                        if let Some(n) = notifier.get() {
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                    }
                    let flags = if o.keep_cache { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
                    reply.opened(FileHandle(o.fh), flags)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn("read", |c| async move {
            match c.read(fh.0, offset, size).await {
                Ok(data) => {
                    metrics::counter!(crate::metrics::READ_BYTES).increment(data.len() as u64);
                    reply.data(&data)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.spawn("write", |c| async move {
            match c.write(fh.0, offset, &data).await {
                Ok(()) => {
                    metrics::counter!(crate::metrics::WRITTEN_BYTES).increment(data.len() as u64);
                    reply.written(data.len() as u32)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        let ino = self.meta(ino);
        self.spawn("flush", |c| async move {
            // close(2) of any descriptor drops the process's POSIX locks on the file.
            let unlocked = c.unlock_owner(ino.0, lock_owner.0).await;
            reply_empty(reply, c.flush(fh.0).await.and(unlocked))
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let ino = self.meta(ino);
        self.spawn("release", |c| async move {
            // The last close of an open file description drops its flock lock.
            let unlocked = match lock_owner {
                Some(owner) => c.unlock_owner(ino.0, owner.0).await,
                None => Ok(()),
            };
            reply_empty(reply, c.release(fh.0).await.and(unlocked))
        });
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let ino = self.meta(ino);
        let caller = self.caller(req);
        self.spawn("fallocate", |c| async move {
            reply_empty(reply, c.fallocate(ino.0, offset, length, mode, &caller).await)
        });
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let ino = self.meta(ino);
        self.spawn("getlk", |c| async move {
            match c.getlk(ino.0, lock_owner.0, (start, end), typ as u32, pid).await {
                Ok(None) => reply.locked(start, end, libc::F_UNLCK, pid),
                Ok(Some(l)) => reply.locked(l.start, l.end, l.typ as i32, l.pid),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let ino = self.meta(ino);
        self.spawn("setlk", |c| async move {
            reply_empty(reply, c.setlk(ino.0, lock_owner.0, (start, end), typ as u32, pid, sleep).await)
        });
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.spawn("fsync", |c| async move { reply_empty(reply, c.fsync(fh.0).await) });
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.spawn("fsyncdir", |c| async move { reply_empty(reply, c.sync_namespace().await) });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let ino = self.meta(ino);
        reply.opened(FileHandle(self.client.opendir(ino.0, self.caller(req))), FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.spawn("readdir", |c| async move {
            let result = async {
                let dir = c.dir_handle(fh.0)?;
                let mut pos = offset;
                if pos == 0 {
                    if reply.add(ino, 1, FileType::Directory, ".") {
                        return Ok(());
                    }
                    pos = 1;
                }
                if pos == 1 {
                    if reply.add(ino, 2, FileType::Directory, "..") {
                        return Ok(());
                    }
                    pos = 2;
                }
                dir.fill(&*c.meta, pos - 2, |j, e| {
                    reply.add(INodeNo(e.ino), j + 3, kind_of(e.mode), OsStr::from_bytes(&e.name))
                })
                .await
            }
            .await;
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.client.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn("statfs", |c| async move {
            match c.statfs().await {
                Ok(s) => {
                    let bs = s.block_size.max(512) as u64;
                    let free_inodes = 1u64 << 32;
                    reply.statfs(
                        s.usable_capacity / bs,
                        s.usable_free / bs,
                        s.usable_free / bs,
                        s.files + free_inodes,
                        free_inodes,
                        bs as u32,
                        s.name_max,
                        bs as u32,
                    )
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let ino = self.meta(ino);
        let (name, value) = (name.as_bytes().to_vec(), value.to_vec());
        let caller = self.caller(req);
        self.spawn("setxattr", |c| async move {
            reply_empty(reply, c.setxattr(ino.0, &name, &value, flags as u32, &caller).await)
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let ino = self.meta(ino);
        let name = name.as_bytes().to_vec();
        let caller = self.caller(req);
        self.spawn("getxattr", |c| async move {
            reply_xattr(reply, size, c.getxattr(ino.0, &name, &caller).await)
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let ino = self.meta(ino);
        self.spawn("listxattr", |c| async move {
            let list = c.listxattr(ino.0).await.map(|names| {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                buf
            });
            reply_xattr(reply, size, list)
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let ino = self.meta(ino);
        let name = name.as_bytes().to_vec();
        let caller = self.caller(req);
        self.spawn("removexattr", |c| async move {
            reply_empty(reply, c.removexattr(ino.0, &name, &caller).await)
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let parent = self.meta(parent);
        let req = p::CreateRequest {
            parent: parent.0,
            name: name.as_bytes().to_vec(),
            mode: (mode & !(umask & 0o7777)) | libc::S_IFREG,
            uid: req.uid(),
            gid: req.gid(),
            rdev: 0,
            exclusive: flags & libc::O_EXCL != 0,
            caller: Some(self.caller(req)),
            ..Default::default()
        };
        let ttl = self.ttl;
        let truncate = flags & libc::O_TRUNC != 0;
        self.spawn("create", |c| async move {
            match c.create(req, true, truncate, access_of(flags)).await {
                Ok((a, fh)) => {
                    reply.created(&ttl, &to_fuse(&a), Generation(0), FileHandle(fh), FopenFlags::empty())
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}

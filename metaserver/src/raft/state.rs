//! The Raft state machine: the namespace's column families in a RocksDB (`{raft dir}/sm`), plus
//! [`Cf::Raft`] with the last applied log id and membership, written in the same `WriteBatch` as
//! the effects of the entries applied, and the metadata group the data belongs to (so a backup
//! is restored only into a replica of its group). Written without sync: the log is the durable record, and
//! a state machine left behind by a crash is brought forward by re-applying from the log.
//!
//! Snapshots (`{raft dir}/snapshots/*.snap`) are RocksDB checkpoints packed into one file:
//! magic `CAIRNSNP`, format 1, the snapshot's meta (length u32 and JSON), the file count (u32),
//! then per file its name (length u16, bytes), size (u64) and bytes. The applied log id and
//! membership in the meta are read from the checkpoint itself, so they describe exactly its
//! contents while applies go on. Installing one unpacks it into `sm.new`, writes the marker
//! `sm.install`, moves `sm` aside and `sm.new` into place; a crash before the marker drops
//! `sm.new` at the next open, a crash after it finishes the swap (see [`SmStore::open`]).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::config::SyncMode;
use cairn_common::{CairnError, Result};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, StorageIOError};
use parking_lot::{Mutex, RwLock};

use super::{io_error, Applied, Entry, LogId, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use crate::store::{Batch, Cf, MetaStore, Op, RocksStore};

const APPLIED: &[u8] = b"applied";
const MEMBERSHIP: &[u8] = b"membership";
/// The metadata group whose state this is (decimal), so a backup says whose it is: written when
/// a replica opens its state machine and when a backup is restored. Absent (a state machine or
/// backup from before groups had numbers, or a lone metaserver's): group 0.
const GROUP: &[u8] = b"group";
const MAGIC: &[u8; 8] = b"CAIRNSNP";
const FORMAT: u8 = 1;
/// Bounds that reject a damaged or hostile snapshot header before anything is allocated.
const MAX_META: u32 = 16 << 20;
const MAX_FILES: u32 = 1_000_000;

/// The state machine's database, swapped whole when a snapshot is installed. Shared by the
/// state machine, its snapshot builders and (next) the store the namespace reads through.
pub struct SmStore {
    dir: PathBuf,
    db: RwLock<Option<Arc<RocksStore>>>,
    /// The newest snapshot on disk and its meta.
    current: Mutex<Option<(SnapshotMeta, PathBuf)>>,
    /// Makes the names of temporary files unique within this process.
    seq: AtomicU64,
    /// The metadata group this replica belongs to (its directory's stamp, `raft/group`).
    group: u32,
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn remove_dir_if_present(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn io_context<'a>(what: &str, path: &'a Path) -> impl FnOnce(io::Error) -> CairnError + 'a {
    let what = what.to_string();
    move |e| CairnError::from_io(&format!("{what} {}", path.display()), &e)
}

impl SmStore {
    /// Open the state machine in `raft_dir`, finishing or dropping a snapshot install a crash
    /// interrupted, and find the newest snapshot.
    pub fn open(raft_dir: &Path) -> Result<SmStore> {
        fs::create_dir_all(raft_dir.join("snapshots")).map_err(io_context("cannot create", raft_dir))?;
        let store = SmStore {
            dir: raft_dir.to_path_buf(),
            db: RwLock::new(None),
            current: Mutex::new(None),
            seq: AtomicU64::new(0),
            // Unstamped: group 0, as a directory stamped before groups had numbers.
            group: super::node::stamped_group(raft_dir)?.unwrap_or(0),
        };
        if store.marker().exists() {
            tracing::warn!(dir = %raft_dir.display(), "finishing a snapshot install that was interrupted");
            store.finish_swap().map_err(io_context("cannot finish the snapshot install in", raft_dir))?;
        } else {
            // `sm.restoring`: a restore (`cairn meta restore`) that did not finish.
            for stale in [store.sm_new(), store.sm_old(), raft_dir.join("sm.restoring")] {
                remove_dir_if_present(&stale).map_err(io_context("cannot remove", &stale))?;
            }
        }
        *store.db.write() = Some(Arc::new(RocksStore::open_state_machine(&store.sm())?));
        store.keep_group()?;
        store.find_snapshots()?;
        Ok(store)
    }

    /// Record this replica's group in the state machine where it is not yet (one made before
    /// groups had numbers, or installed from such a leader's snapshot); refuse one that names
    /// another group.
    fn keep_group(&self) -> Result<()> {
        let db = self.current();
        match group_in(&*db)? {
            Some(held) if held != self.group => Err(CairnError::corrupt(format!(
                "the state machine in {} holds metadata group {held}'s data, but the directory is stamped \
                 group {}: the replica's data directory is damaged",
                self.dir.display(),
                self.group
            ))),
            Some(_) => Ok(()),
            None => {
                let mut batch = Batch::new();
                batch.put(Cf::Raft, GROUP, self.group.to_string().into_bytes());
                db.write(batch)
            }
        }
    }

    fn sm(&self) -> PathBuf {
        self.dir.join("sm")
    }

    fn sm_new(&self) -> PathBuf {
        self.dir.join("sm.new")
    }

    fn sm_old(&self) -> PathBuf {
        self.dir.join("sm.old")
    }

    fn marker(&self) -> PathBuf {
        self.dir.join("sm.install")
    }

    fn snapshots(&self) -> PathBuf {
        self.dir.join("snapshots")
    }

    fn unique(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The state machine's database as it is now.
    pub fn current(&self) -> Arc<RocksStore> {
        self.db.read().clone().expect("the state machine is open except while a snapshot is swapped in")
    }

    /// The last applied log id and membership, as `store` holds them.
    fn applied_in(store: &dyn MetaStore) -> Result<(Option<LogId>, StoredMembership)> {
        let applied = match store.get(Cf::Raft, APPLIED)? {
            Some(bytes) => Some(
                serde_json::from_slice(&bytes)
                    .map_err(|e| CairnError::io(format!("Raft applied log id: {e}")))?,
            ),
            None => None,
        };
        let membership = match store.get(Cf::Raft, MEMBERSHIP)? {
            Some(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| CairnError::io(format!("Raft membership: {e}")))?
            }
            None => StoredMembership::default(),
        };
        Ok((applied, membership))
    }

    /// Keep the newest snapshot file (by its last log id) and delete the others and any
    /// leftovers of interrupted builds and transfers.
    fn find_snapshots(&self) -> Result<()> {
        let dir = self.snapshots();
        let mut newest: Option<(SnapshotMeta, PathBuf)> = None;
        let mut others = Vec::new();
        for item in fs::read_dir(&dir).map_err(io_context("cannot list", &dir))? {
            let path = item.map_err(io_context("cannot list", &dir))?.path();
            if path.extension().is_some_and(|e| e == "snap") {
                match read_header(&mut BufReader::new(
                    File::open(&path).map_err(io_context("cannot open", &path))?,
                )) {
                    Ok(meta) => {
                        if newest.as_ref().is_none_or(|(m, _)| meta.last_log_id > m.last_log_id) {
                            others.extend(newest.replace((meta, path)).map(|(_, p)| p));
                        } else {
                            others.push(path);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), "dropping an unreadable snapshot: {e}");
                        others.push(path);
                    }
                }
            } else {
                others.push(path);
            }
        }
        for path in others {
            let _ = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        }
        *self.current.lock() = newest;
        Ok(())
    }

    /// Steps of the swap after the marker: `sm` → `sm.old`, `sm.new` → `sm`, then the marker
    /// and `sm.old` go. Each step is skipped when a previous try already did it.
    fn finish_swap(&self) -> io::Result<()> {
        let (sm, new, old) = (self.sm(), self.sm_new(), self.sm_old());
        if new.exists() {
            if sm.exists() {
                fs::rename(&sm, &old)?;
            }
            fs::rename(&new, &sm)?;
            fsync_dir(&self.dir)?;
        }
        fs::remove_file(self.marker())?;
        fsync_dir(&self.dir)?;
        remove_dir_if_present(&old)
    }

    /// Replace the database with the one unpacked in `sm.new`.
    fn swap_in(&self, meta: &SnapshotMeta) -> Result<()> {
        remove_dir_if_present(&self.sm_old()).map_err(io_context("cannot remove", &self.sm_old()))?;
        let marker = self.marker();
        let json =
            serde_json::to_vec(meta).map_err(|e| CairnError::internal(format!("snapshot meta: {e}")))?;
        (|| -> io::Result<()> {
            let mut f = File::create(&marker)?;
            f.write_all(&json)?;
            f.sync_all()?;
            fsync_dir(&self.dir)
        })()
        .map_err(io_context("cannot write", &marker))?;
        let mut slot = self.db.write();
        if let Some(old) = slot.take() {
            close(old);
        }
        let swapped = self.finish_swap().map_err(io_context("cannot swap the snapshot into", &self.dir));
        // Whatever happened, open a state machine again (the old one if the swap did not get
        // that far): one left closed would fail every later apply.
        let reopen = if self.sm().exists() { self.sm() } else { self.sm_old() };
        *slot = Some(Arc::new(RocksStore::open_state_machine(&reopen)?));
        drop(slot);
        swapped?;
        self.keep_group()
    }
}

/// The group a state machine (or an unpacked backup) says it holds; `None` when it does not say.
fn group_in(store: &dyn MetaStore) -> Result<Option<u32>> {
    let Some(bytes) = store.get(Cf::Raft, GROUP)? else { return Ok(None) };
    let group = std::str::from_utf8(&bytes).ok().and_then(|t| t.parse().ok());
    group.map(Some).ok_or_else(|| CairnError::corrupt(format!("the state machine's group reads {bytes:?}")))
}

/// Drop the last reference to `store` (closing the database), waiting for the users of other
/// references (a snapshot build reading it) to finish.
fn close(mut store: Arc<RocksStore>) {
    let started = Instant::now();
    let mut warned = Duration::ZERO;
    loop {
        match Arc::try_unwrap(store) {
            Ok(db) => return drop(db),
            Err(shared) => store = shared,
        }
        if started.elapsed() > warned + Duration::from_secs(10) {
            warned = started.elapsed();
            tracing::warn!("snapshot install waits for the state machine's other users ({warned:?})");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn write_u32(w: &mut impl Write, v: u32) -> io::Result<()> {
    w.write_all(&v.to_be_bytes())
}

fn read_array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut buf = [0; N];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Pack the checkpoint in `dir` with `meta` into the snapshot file `out`, synced.
fn pack(dir: &Path, meta: &SnapshotMeta, out: &Path) -> io::Result<()> {
    let mut files = Vec::new();
    for item in fs::read_dir(dir)? {
        let item = item?;
        if !item.file_type()?.is_file() {
            return Err(invalid(format!("checkpoint holds {}, which is not a file", item.path().display())));
        }
        files.push(item.file_name().into_string().map_err(|n| invalid(format!("file name {n:?}")))?);
    }
    files.sort();
    let mut w = BufWriter::new(File::create(out)?);
    w.write_all(MAGIC)?;
    w.write_all(&[FORMAT])?;
    let json = serde_json::to_vec(meta).map_err(io::Error::other)?;
    write_u32(&mut w, json.len() as u32)?;
    w.write_all(&json)?;
    write_u32(&mut w, files.len() as u32)?;
    for name in files {
        let mut f = File::open(dir.join(&name))?;
        let size = f.metadata()?.len();
        w.write_all(&(name.len() as u16).to_be_bytes())?;
        w.write_all(name.as_bytes())?;
        w.write_all(&size.to_be_bytes())?;
        if io::copy(&mut (&mut f).take(size), &mut w)? != size {
            return Err(invalid(format!("{name} shrank while being packed")));
        }
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()
}

fn read_header(r: &mut impl Read) -> io::Result<SnapshotMeta> {
    if &read_array::<8>(r)? != MAGIC {
        return Err(invalid("not a Cairn snapshot (wrong magic)"));
    }
    let [format] = read_array::<1>(r)?;
    if format != FORMAT {
        return Err(invalid(format!("snapshot format {format} (this build reads format {FORMAT})")));
    }
    let len = u32::from_be_bytes(read_array(r)?);
    if len > MAX_META {
        return Err(invalid(format!("snapshot meta of {len} bytes")));
    }
    let mut json = vec![0; len as usize];
    r.read_exact(&mut json)?;
    serde_json::from_slice(&json).map_err(|e| invalid(format!("snapshot meta: {e}")))
}

/// A name a snapshot may carry: one plain file name of a RocksDB checkpoint.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Unpack the snapshot read by `r` into the new directory `into` (synced); its meta.
fn unpack(r: &mut impl Read, into: &Path) -> io::Result<SnapshotMeta> {
    let meta = read_header(r)?;
    let count = u32::from_be_bytes(read_array(r)?);
    if count > MAX_FILES {
        return Err(invalid(format!("snapshot claims {count} files")));
    }
    remove_dir_if_present(into)?;
    fs::create_dir_all(into)?;
    for _ in 0..count {
        let len = u16::from_be_bytes(read_array(r)?) as usize;
        let mut name = vec![0; len];
        r.read_exact(&mut name)?;
        let name = String::from_utf8(name).map_err(|_| invalid("snapshot file name is not UTF-8"))?;
        if !plain_name(&name) {
            return Err(invalid(format!("snapshot file name {name:?} is not a plain file name")));
        }
        let size = u64::from_be_bytes(read_array(r)?);
        let mut f = fs::OpenOptions::new().write(true).create_new(true).open(into.join(&name))?;
        if io::copy(&mut r.take(size), &mut f)? != size {
            return Err(invalid(format!("snapshot truncated in {name}")));
        }
        f.sync_all()?;
    }
    if r.read(&mut [0])? != 0 {
        return Err(invalid("bytes after the snapshot's last file"));
    }
    fsync_dir(into)?;
    Ok(meta)
}

fn snapshot_error(e: impl std::fmt::Display) -> StorageError {
    io_error(|e| StorageIOError::write_snapshot(None, e), e)
}

fn read_error(e: impl std::fmt::Display) -> StorageError {
    io_error(StorageIOError::read_state_machine, e)
}

/// The state machine openraft drives.
pub struct StateMachine {
    store: Arc<SmStore>,
}

impl StateMachine {
    pub fn open(raft_dir: &Path) -> Result<StateMachine> {
        Ok(StateMachine { store: Arc::new(SmStore::open(raft_dir)?) })
    }

    /// The database and its snapshots, shared.
    pub fn store(&self) -> &Arc<SmStore> {
        &self.store
    }
}

/// Builds snapshots of the state machine (also while it applies entries).
pub struct SnapshotBuilder {
    store: Arc<SmStore>,
}

impl SnapshotBuilder {
    /// Checkpoint, read the applied state from the checkpoint, pack, and make the packed file
    /// the current snapshot (the older ones are deleted; a transfer that has one open keeps
    /// reading it).
    fn build(store: &SmStore) -> Result<(SnapshotMeta, PathBuf)> {
        let dir = store.snapshots();
        let (meta, path) = pack_checkpoint(store, |meta| dir.join(format!("{}.snap", meta.snapshot_id)))?;
        snapshot_taken(&path, "built");
        store.make_current(meta.clone(), path.clone());
        Ok((meta, path))
    }
}

/// Checkpoint the state machine, read the applied state from the checkpoint and pack it into
/// the file `name` gives (written beside as `.part`, renamed when complete, and synced).
fn pack_checkpoint(
    store: &SmStore,
    name: impl FnOnce(&SnapshotMeta) -> PathBuf,
) -> Result<(SnapshotMeta, PathBuf)> {
    let checkpoint = store.snapshots().join(format!("checkpoint-{}", store.unique()));
    remove_dir_if_present(&checkpoint).map_err(io_context("cannot remove", &checkpoint))?;
    store.current().checkpoint(&checkpoint)?;
    let result = (|| -> Result<(SnapshotMeta, PathBuf)> {
        let (last_log_id, last_membership) = SmStore::applied_in(&RocksStore::open_read_only(&checkpoint)?)?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let (term, node, index) =
            last_log_id.map_or((0, 0, 0), |id| (id.leader_id.term, id.leader_id.node_id, id.index));
        let snapshot_id = format!("{term}-{node}-{index}-{stamp}-{}", store.unique());
        let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id };
        let path = name(&meta);
        let part = path.with_extension("part");
        pack(&checkpoint, &meta, &part).map_err(io_context("cannot write the snapshot", &part))?;
        fs::rename(&part, &path).map_err(io_context("cannot rename", &part))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        fsync_dir(dir).map_err(io_context("cannot fsync", dir))?;
        Ok((meta, path))
    })();
    let _ = fs::remove_dir_all(&checkpoint);
    result
}

/// Pack a consistent copy of the state machine (a backup: the snapshot format, not made this
/// replica's snapshot) and return it open, with its meta and size. The file is already
/// unlinked: it goes when closed, whatever happens to the transfer. Blocks.
pub fn pack_copy(store: &SmStore) -> Result<(SnapshotMeta, File, u64)> {
    let out = store.snapshots().join(format!("backup-{}.backup", store.unique()));
    let (meta, path) = pack_checkpoint(store, |_| out)?;
    let opened = File::open(&path).and_then(|f| Ok((f.metadata()?.len(), f)));
    let _ = fs::remove_file(&path);
    let (size, file) = opened.map_err(io_context("cannot open", &path))?;
    Ok((meta, file, size))
}

/// A lone metaserver's backup: a checkpoint of its namespace store packed in the same format
/// (no Raft state: applied index 0), returned open and already unlinked, with its size. The
/// checkpoint is made beside the store's directory (hard links: the same filesystem). Blocks.
pub fn pack_lone(store: &dyn crate::store::MetaStore) -> Result<(File, u64)> {
    let db = store.dir().ok_or_else(|| {
        CairnError::new(cairn_common::ErrorKind::NotSupported, "this metadata store has no directory")
    })?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let scratch = db.with_extension(format!("backup-{}-{n}", std::process::id()));
    remove_dir_if_present(&scratch).map_err(io_context("cannot remove", &scratch))?;
    fs::create_dir_all(&scratch).map_err(io_context("cannot create", &scratch))?;
    let result = (|| -> Result<(File, u64)> {
        let checkpoint = scratch.join("checkpoint");
        store.checkpoint_into(&checkpoint)?;
        let meta = SnapshotMeta {
            last_log_id: None,
            last_membership: StoredMembership::default(),
            snapshot_id: format!("lone-{}", std::process::id()),
        };
        let out = scratch.join("namespace.backup");
        pack(&checkpoint, &meta, &out).map_err(io_context("cannot write the backup", &out))?;
        let file = File::open(&out).map_err(io_context("cannot open", &out))?;
        let size = file.metadata().map_err(io_context("cannot read", &out))?.len();
        Ok((file, size))
    })();
    let _ = fs::remove_dir_all(&scratch);
    result
}

impl SmStore {
    /// Make `path` the current snapshot and delete the previous one.
    fn make_current(&self, meta: SnapshotMeta, path: PathBuf) {
        let mut current = self.current.lock();
        if current.as_ref().is_some_and(|(m, _)| m.last_log_id > meta.last_log_id) {
            // A newer one was installed meanwhile.
            let _ = fs::remove_file(&path);
            return;
        }
        if let Some((_, old)) = current.replace((meta, path.clone())) {
            if old != path {
                let _ = fs::remove_file(old);
            }
        }
    }
}

/// Unpack the backup `file` (a packed state machine, [`pack_copy`]) as the database `db`, which
/// must not exist: with `group` (this replica's id and every member's id and address), as the
/// state machine of a new Raft group whose only entry so far is that membership, at the
/// backup's applied index (term 0: before any election of the new group); without, as a lone
/// metaserver's namespace (the Raft state dropped). `into` is the metadata group restored into
/// (0 for a lone metaserver): a backup of another group is refused. Returns the backup's
/// applied index.
pub fn restore(
    file: &Path,
    db: &Path,
    group: Option<(u64, &BTreeMap<u64, String>)>,
    into: u32,
) -> Result<u64> {
    if db.exists() {
        return Err(CairnError::invalid(format!(
            "{} exists: restoring only makes a new database",
            db.display()
        )));
    }
    let part = db.with_extension("restoring");
    remove_dir_if_present(&part).map_err(io_context("cannot remove", &part))?;
    let unpacked = (|| -> Result<u64> {
        let mut reader = BufReader::new(File::open(file).map_err(io_context("cannot open", file))?);
        let meta = unpack(&mut reader, &part).map_err(|e| {
            CairnError::invalid(format!("{} is not a whole Cairn metadata backup: {e}", file.display()))
        })?;
        let index = meta.last_log_id.map_or(0, |id| id.index);
        {
            let store = RocksStore::open(&part, SyncMode::Always)?;
            let from = group_in(&store)?.unwrap_or(0);
            if from != into {
                return Err(CairnError::invalid(format!(
                    "{} is a backup of metadata group {from}: restore it into a replica of group {from} \
                     (group = {from} in its meta.toml), not of group {into}",
                    file.display()
                )));
            }
            let mut batch = Batch::new();
            match group {
                Some((id, members)) => {
                    batch.put(Cf::Raft, GROUP, into.to_string().into_bytes());
                    let log_id = LogId::new(openraft::CommittedLeaderId::new(0, id), index.max(1));
                    let voters: std::collections::BTreeSet<u64> = members.keys().copied().collect();
                    let nodes: BTreeMap<u64, openraft::BasicNode> =
                        members.iter().map(|(id, addr)| (*id, openraft::BasicNode::new(addr))).collect();
                    let membership =
                        StoredMembership::new(Some(log_id), openraft::Membership::new(vec![voters], nodes));
                    let json = |e: serde_json::Error| CairnError::internal(format!("Raft state: {e}"));
                    batch.put(Cf::Raft, APPLIED, serde_json::to_vec(&log_id).map_err(json)?);
                    batch.put(Cf::Raft, MEMBERSHIP, serde_json::to_vec(&membership).map_err(json)?);
                }
                None => {
                    batch.delete(Cf::Raft, APPLIED);
                    batch.delete(Cf::Raft, MEMBERSHIP);
                    batch.delete(Cf::Raft, GROUP);
                }
            }
            crate::namespace::prepare_restored(&store, &mut batch)?;
            if into == 0 {
                crate::groups::prepare_restored(&store, &mut batch)?;
            } else {
                crate::groups::forget_on_restore(&mut batch);
            }
            store.write(batch)?;
        }
        Ok(index)
    })();
    let index = match unpacked {
        Ok(index) => index,
        Err(e) => {
            let _ = fs::remove_dir_all(&part);
            return Err(e);
        }
    };
    fs::rename(&part, db).map_err(io_context("cannot rename", &part))?;
    let parent = db.parent().unwrap_or(Path::new("."));
    fsync_dir(parent).map_err(io_context("cannot fsync", parent))?;
    Ok(index)
}

/// Count a snapshot built or installed and publish its size.
fn snapshot_taken(path: &Path, how: &'static str) {
    metrics::counter!(crate::metrics::RAFT_SNAPSHOTS, "how" => how).increment(1);
    if let Ok(meta) = fs::metadata(path) {
        metrics::gauge!(crate::metrics::RAFT_SNAPSHOT_BYTES).set(meta.len() as f64);
    }
}

async fn open_snapshot(
    meta: SnapshotMeta,
    path: &Path,
) -> std::result::Result<Snapshot<TypeConfig>, StorageError> {
    let file =
        tokio::fs::File::open(path).await.map_err(|e| read_error(format!("{}: {e}", path.display())))?;
    Ok(Snapshot { meta, snapshot: Box::new(file) })
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> std::result::Result<Snapshot<TypeConfig>, StorageError> {
        let store = self.store.clone();
        let (meta, path) = tokio::task::spawn_blocking(move || SnapshotBuilder::build(&store))
            .await
            .map_err(snapshot_error)?
            .map_err(snapshot_error)?;
        open_snapshot(meta, &path).await
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> std::result::Result<(Option<LogId>, StoredMembership), StorageError> {
        SmStore::applied_in(&*self.store.current()).map_err(read_error)
    }

    async fn apply<I>(&mut self, entries: I) -> std::result::Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let mut batch = Batch::new();
        let mut last = None;
        let mut membership = None;
        let mut applied = Vec::new();
        for entry in entries {
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(command) => {
                    for op in command.ops {
                        let (Op::Put { cf, .. } | Op::Delete { cf, .. }) = &op;
                        if *cf == Cf::Raft {
                            let cause = "an entry writes the Raft state's own column family";
                            return Err(StorageIOError::apply(
                                entry.log_id,
                                openraft::AnyError::error(cause),
                            )
                            .into());
                        }
                        batch.push(op);
                    }
                }
                EntryPayload::Membership(m) => {
                    membership = Some(StoredMembership::new(Some(entry.log_id), m))
                }
            }
            last = Some(entry.log_id);
            applied.push(Applied);
        }
        let write_error = |e: &dyn std::fmt::Display| io_error(StorageIOError::write_state_machine, e);
        if let Some(id) = last {
            batch.put(Cf::Raft, APPLIED, serde_json::to_vec(&id).map_err(|e| write_error(&e))?);
        }
        if let Some(m) = membership {
            batch.put(Cf::Raft, MEMBERSHIP, serde_json::to_vec(&m).map_err(|e| write_error(&e))?);
        }
        self.store.current().write(batch).map_err(|e| write_error(&e))?;
        Ok(applied)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { store: self.store.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> std::result::Result<Box<tokio::fs::File>, StorageError> {
        let path = self.store.snapshots().join(format!("incoming-{}.part", self.store.unique()));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await
            .map_err(|e| snapshot_error(format!("{}: {e}", path.display())))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> std::result::Result<(), StorageError> {
        let mut file = snapshot.into_std().await;
        let store = self.store.clone();
        let meta = meta.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let dir = store.snapshots();
            // Keep the received file as this replica's current snapshot, then unpack it.
            let path = dir.join(format!("received-{}.snap", store.unique()));
            (|| -> io::Result<()> {
                file.seek(SeekFrom::Start(0))?;
                let mut out = File::create(&path)?;
                io::copy(&mut file, &mut out)?;
                out.sync_all()
            })()
            .map_err(io_context("cannot store the received snapshot as", &path))?;
            let mut reader = BufReader::new(File::open(&path).map_err(io_context("cannot open", &path))?);
            let unpacked = unpack(&mut reader, &store.sm_new());
            let unpacked = unpacked.map_err(|e| {
                let _ = fs::remove_file(&path);
                CairnError::io(format!("received snapshot {}: {e}", meta.snapshot_id))
            })?;
            if unpacked != meta {
                let _ = fs::remove_file(&path);
                return Err(CairnError::io(format!(
                    "received snapshot says it is {:?}, Raft says {:?}",
                    unpacked.snapshot_id, meta.snapshot_id
                )));
            }
            store.swap_in(&meta)?;
            snapshot_taken(&path, "installed");
            store.make_current(meta, path);
            // Drop the parts of transfers that ended.
            for item in fs::read_dir(&dir).map_err(io_context("cannot list", &dir))?.flatten() {
                if item.file_name().to_string_lossy().starts_with("incoming-") {
                    let _ = fs::remove_file(item.path());
                }
            }
            Ok(())
        })
        .await
        .map_err(snapshot_error)?
        .map_err(snapshot_error)
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> std::result::Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let current = self.store.current.lock().clone();
        match current {
            Some((meta, path)) => open_snapshot(meta, &path).await.map(Some),
            None => Ok(None),
        }
    }
}

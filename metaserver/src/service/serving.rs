//! The service's state and how a request reaches it: the constructors, what serves (a lone
//! metaserver's namespace, or a replica's while it leads), changes done once, and where a
//! request runs (inline, or on the blocking pool when it waits for the disk).

use std::sync::Arc;

use cairn_common::{CairnError, Result};
use cairn_net::capability::Signer;
use cairn_net::channels::Channels;
use parking_lot::RwLock;
use tonic::Status;

use super::{MetaService, Serving};
use crate::access::Access;
use crate::cluster::Cluster;
use crate::namespace::{once, Namespace};
use crate::raft::node::RaftNode;
use crate::repair::Repair;
use crate::store::Change;

impl MetaService {
    pub fn new(ns: Arc<Namespace>, cluster: Arc<Cluster>) -> MetaService {
        MetaService {
            serving: RwLock::new(Some(Arc::new(Serving { ns, cluster, repair: None }))),
            raft: std::sync::OnceLock::new(),
            replicated: false,
            caps: Signer::new(),
            channels: confirm_channels(),
            access: Access::none(),
            caps_generation: Default::default(),
            held_map: RwLock::new(None),
            groups_changed: Default::default(),
        }
    }

    /// Hold clients to these access rules.
    pub fn with_access(mut self, access: Arc<Access>) -> MetaService {
        self.caps_generation = access.generation().into();
        self.access = access;
        self
    }

    /// Serve `RepairNow` and `Reconcile` with this repair (the one running in the background).
    pub fn with_repair(self, repair: Arc<Repair>) -> MetaService {
        let serving = self.serving.read().as_ref().map(|s| (s.ns.clone(), s.cluster.clone()));
        if let Some((ns, cluster)) = serving {
            *self.serving.write() = Some(Arc::new(Serving { ns, cluster, repair: Some(repair) }));
        }
        self
    }

    /// A replica's service: it answers the other replicas at once and clients once [`serve`]
    /// gave it a namespace (when it became leader).
    ///
    /// [`serve`]: MetaService::serve
    pub fn replicated(raft: Arc<RaftNode>) -> MetaService {
        MetaService {
            serving: RwLock::new(None),
            raft: std::sync::OnceLock::from(raft),
            replicated: true,
            caps: Signer::new(),
            channels: confirm_channels(),
            access: Access::none(),
            caps_generation: Default::default(),
            held_map: RwLock::new(None),
            groups_changed: Default::default(),
        }
    }

    /// A replica's service before its Raft node has started (the listener must answer the
    /// other replicas while they elect a leader): [`set_raft`](MetaService::set_raft) follows.
    pub fn replicated_pending() -> MetaService {
        MetaService {
            serving: RwLock::new(None),
            raft: std::sync::OnceLock::new(),
            replicated: true,
            caps: Signer::new(),
            channels: confirm_channels(),
            access: Access::none(),
            caps_generation: Default::default(),
            held_map: RwLock::new(None),
            groups_changed: Default::default(),
        }
    }

    pub fn set_raft(&self, raft: Arc<RaftNode>) {
        self.caps.set_group(raft.group());
        let _ = self.raft.set(raft);
    }

    /// Start (`Some`) or stop (`None`) answering clients.
    /// Each leadership signs shard capabilities with a key of its own: chunkservers retire the
    /// keys a newer leadership does not send (`capability::Verifier::learn_from_leader`).
    pub fn serve(&self, serving: Option<Serving>) {
        if serving.is_some() {
            self.caps.new_key();
        }
        *self.serving.write() = serving.map(Arc::new);
    }

    /// Serve the namespace of this group's slots (one other than 0) while `held` is still the
    /// map this leadership holds: a leadership that ended meanwhile (its `stop` let go of the map
    /// first) never starts serving again. Answers whether it serves. No new signing key: the
    /// one the leadership started with ([`MetaService::hold_map`]) is the one its fences have
    /// been sending chunkservers, so its capabilities pass from the first.
    pub fn serve_slots(&self, held: &Arc<crate::groups::Groups>, serving: Serving) -> bool {
        let current = self.held_map.read();
        if !current.as_ref().is_some_and(|c| Arc::ptr_eq(c, held)) {
            return false;
        }
        *self.serving.write() = Some(Arc::new(serving));
        true
    }

    /// Start (`Some`) or stop (`None`) holding the group map of this group, one other than 0,
    /// while it leads (`lib.rs` `lead`): group 0's leader shares it ([`MetaService::share_group_map`]).
    pub fn hold_map(&self, groups: Option<Arc<crate::groups::Groups>>) {
        if groups.is_some() {
            self.caps.new_key();
        }
        *self.held_map.write() = groups;
    }

    pub(super) fn serving(&self) -> Result<Arc<Serving>, Status> {
        if let Some(s) = self.serving.read().as_ref() {
            match self.raft.get() {
                Some(raft) if !raft.holds_lease() => {
                    return Err(CairnError::new(
                        cairn_common::ErrorKind::NotLeader,
                        "this metaserver's leadership was not confirmed by a majority lately",
                    )
                    .into())
                }
                _ => return Ok(s.clone()),
            }
        }
        Err(match self.raft.get() {
            Some(raft) if raft.group() != 0 && raft.is_leader() => not_serving_yet(raft.group()),
            Some(raft) => raft.not_leader(),
            None => CairnError::new(cairn_common::ErrorKind::NotLeader, "this metaserver is starting"),
        }
        .into())
    }

    /// What serves the cluster's state — the chunkservers' registry and heartbeats, the group
    /// map's changes, repairs, fsck, capacity: group 0's. A replica of another group answers
    /// `WrongGroup` at once (`docs/ARCHITECTURE.md`, "Several metadata groups").
    pub(super) fn zero(&self) -> Result<Arc<Serving>, Status> {
        match self.raft.get() {
            Some(raft) if raft.group() != 0 => Err(cluster_is_group_zero(raft.group()).into()),
            _ => self.serving(),
        }
    }

    /// [`MetaService::run_serving`] on group 0's cluster state ([`MetaService::zero`]).
    pub(super) async fn run_zero<T, F>(&self, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Serving) -> Result<T> + Send + 'static,
    {
        self.zero()?;
        self.run_serving(f).await
    }

    pub(super) fn ns(&self) -> Result<Arc<Namespace>, Status> {
        Ok(self.serving()?.ns.clone())
    }

    pub(super) fn cluster(&self) -> Result<Arc<Cluster>, Status> {
        Ok(self.serving()?.cluster.clone())
    }

    /// Whether the change a client sends again (`once`) was done by an earlier try: then the
    /// caller answers from what that try left (`namespace/once.rs`).
    pub(super) fn done_before(&self, once: Option<(u64, u64)>) -> Result<bool, Status> {
        match once {
            Some((client, seq)) => self.read(|ns| ns.once_done(client, seq)),
            None => Ok(false),
        }
    }

    /// A change a client may send again (`once`, see `namespace/once.rs`): answered by
    /// `replay` (from what the first try left) when an earlier try was applied, whether that is
    /// found before this one runs or after it failed (an earlier try still in flight, whose locks
    /// this one waited for, may have been applied meanwhile: this one then fails with EEXIST or
    /// ENOENT, which is not the answer).
    pub(super) async fn once_change<T, F>(
        &self,
        once: Option<(u64, u64)>,
        change: F,
        replay: impl Fn(&Namespace) -> Result<T>,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Namespace) -> Result<T> + Send + 'static,
    {
        self.once_change_on(once, false, change, replay).await
    }

    /// [`MetaService::once_change`], on the blocking pool when `on_blocking_pool` (a change
    /// that always waits for the disk, like a commit).
    pub(super) async fn once_change_on<T, F>(
        &self,
        once: Option<(u64, u64)>,
        on_blocking_pool: bool,
        change: F,
        replay: impl Fn(&Namespace) -> Result<T>,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Namespace) -> Result<T> + Send + 'static,
    {
        if self.done_before(once)? {
            return self.read(|ns| replay(ns));
        }
        let run = move |ns: &Namespace| once::scope(once, || change(ns));
        let inline = self.ns()?.store().changes_inline();
        let result = if on_blocking_pool && !inline { self.run(run).await } else { self.change(run).await };
        match result {
            Err(e) if once.is_some() && self.done_before(once)? => {
                tracing::debug!("a change sent again failed after its first try was applied: {e}");
                self.read(|ns| replay(ns))
            }
            result => result,
        }
    }

    pub(super) fn raft(&self) -> Result<&Arc<RaftNode>, Status> {
        self.raft.get().ok_or_else(|| {
            if self.replicated {
                CairnError::unavailable("this metaserver replica is starting").into()
            } else {
                CairnError::new(cairn_common::ErrorKind::NotSupported, "this metaserver is not replicated")
                    .into()
            }
        })
    }

    pub(super) fn repair(&self) -> Result<Arc<Repair>, Status> {
        self.serving()?
            .repair
            .clone()
            .ok_or_else(|| CairnError::unavailable("this metaserver runs no repair").into())
    }

    /// A point read (lookup, getattr, xattr, open, release): inline on the request's task. These touch a key
    /// or two that RocksDB nearly always has in its memtable or block cache, and the hand-off
    /// to the blocking pool costs more than the read (measured: `bench/mdbench.py` stat rate).
    pub(super) fn read<T>(&self, f: impl FnOnce(&Namespace) -> Result<T>) -> Result<T, Status> {
        f(&*self.ns()?).map_err(Status::from)
    }

    /// A namespace change that does not wait for the disk (the store's sync mode is not
    /// `Always`; changes the application asked to be durable go through [`MetaService::run`]):
    /// inline, like a read, since appending to the WAL through the kernel costs less than the
    /// hand-off to the blocking pool and back (two thread wake-ups). With `Always` it runs on the
    /// blocking pool, so a WAL fsync never stalls a runtime worker.
    pub(super) async fn change<T, F>(&self, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Namespace) -> Result<T> + Send + 'static,
    {
        let ns = self.ns()?;
        if ns.store().changes_inline() {
            return inline_change(&ns, f).await;
        }
        if ns.store().syncs_every_write() {
            self.run(f).await
        } else {
            f(&ns).map_err(Status::from)
        }
    }

    pub(super) async fn run<T, F>(&self, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Namespace) -> Result<T> + Send + 'static,
    {
        self.run_serving(move |serving| f(&serving.ns)).await
    }

    /// Work on the cluster state (the registry, client ids) on the blocking pool: its changes
    /// are written, like the namespace's.
    pub(super) async fn run_serving<T, F>(&self, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Serving) -> Result<T> + Send + 'static,
    {
        let serving = self.serving()?;
        match tokio::task::spawn_blocking(move || f(&serving)).await {
            Ok(result) => result.map_err(Status::from),
            Err(e) => Err(CairnError::internal(format!("request failed: {e}")).into()),
        }
    }
}

/// A change of a store that answers writes once proposed (`MetaStore::changes_inline`): run on
/// the request's task, its locks held only while it runs, then the wait for what it wrote or
/// read awaited without holding a thread — no hand-off to the blocking pool and back.
async fn inline_change<T>(ns: &Namespace, f: impl FnOnce(&Namespace) -> Result<T>) -> Result<T, Status> {
    let change = Change::open(&**ns.store());
    let out = f(ns);
    change.close_async().await?;
    out.map_err(Status::from)
}

/// What a replica of a group other than 0 answers a request for the cluster's state, which
/// group 0 holds.
fn cluster_is_group_zero(group: u32) -> CairnError {
    CairnError::new(
        cairn_common::ErrorKind::WrongGroup,
        format!(
            "this metaserver is a replica of metadata group {group}, and the cluster's state \
             (chunkservers, the group map, repairs, fsck) is group 0's: ask group 0's metaservers"
        ),
    )
}

/// What the leader of a group other than 0 answers before it serves its slots: it opens them
/// once group 0's leader shared the cluster's identity with it (`lib.rs`, `ServeSlots`).
fn not_serving_yet(group: u32) -> CairnError {
    CairnError::unavailable(format!(
        "this metaserver leads metadata group {group} but does not serve its namespace slots yet: \
         group 0's leader has not shared the cluster's identity with it"
    ))
}

fn confirm_channels() -> Channels {
    Channels::new(std::time::Duration::from_secs(2), std::time::Duration::from_secs(10))
}

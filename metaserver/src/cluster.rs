//! The cluster around the namespace: the chunkserver registry, client sessions, client ids,
//! the repair's state and the group map. The namespace (`namespace/`) holds files and directories only and asks
//! the cluster for what it does not decide itself through [`Surroundings`]: where a new file's
//! shards go, what the chunkservers hold, which files clients have open, and a note that a
//! commit left a stripe degraded.
//!
//! Like the namespace, a cluster is opened per leadership (a lone metaserver's start, a new
//! leader's term) over the same store: what it keeps in memory (liveness, sessions, locks, repair
//! progress) is rebuilt, not replicated (`docs/ARCHITECTURE.md`, "Per item of in-memory state").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Layout, Result};
use parking_lot::Mutex;

use crate::groups::Groups;
use crate::registry::Registry;
use crate::repair_state::RepairState;
use crate::schema::{self, counter, Counter};
use crate::sessions::Sessions;
use crate::store::{Batch, Cf, MetaStore};

/// What the namespace needs from the cluster around it ([`Cluster`] is the real one).
pub trait Surroundings: Send + Sync {
    /// The chunkservers a new file of `layout` is placed on, none of `avoid` when possible.
    fn place(&self, layout: &Layout, avoid: &[u32]) -> Result<Vec<u32>>;
    /// How many chunkservers are active (not draining or removed).
    fn active_chunkservers(&self) -> usize;
    /// Raw capacity and free bytes over the chunkservers that are up.
    fn capacity(&self) -> (u64, u64);
    /// Whether some client holds `ino` open.
    fn is_open(&self, ino: u64) -> bool;
    /// A commit recorded missing shards: the repair should look.
    fn note_degraded(&self);
}

/// The registry, the client sessions and ids, and the repair's state of one serving metaserver.
pub struct Cluster {
    store: Arc<dyn MetaStore>,
    registry: Arc<Registry>,
    sessions: Arc<Sessions>,
    next_client: Mutex<u64>,
    degraded_hint: AtomicBool,
    repair_state: Mutex<RepairState>,
    groups: Arc<Groups>,
}

impl Cluster {
    /// Open the cluster state kept in `store` (the registry's records, the next client id);
    /// a node silent for `node_timeout` is down, a client silent for `client_lease` loses its
    /// open files and locks.
    pub fn open(
        store: Arc<dyn MetaStore>,
        node_timeout: Duration,
        client_lease: Duration,
    ) -> Result<Arc<Cluster>> {
        let groups = Arc::new(Groups::open(store.clone())?);
        Cluster::open_with_groups(store, groups, node_timeout, client_lease)
    }

    /// [`Cluster::open`], with the group map already opened over `store` (a group other than
    /// 0 holds the one its leadership keeps up to date).
    pub fn open_with_groups(
        store: Arc<dyn MetaStore>,
        groups: Arc<Groups>,
        node_timeout: Duration,
        client_lease: Duration,
    ) -> Result<Arc<Cluster>> {
        let registry = Arc::new(Registry::open(store.clone(), node_timeout)?);
        let next_client = crate::schema::read_counter(&*store, counter::NEXT_CLIENT)?.unwrap_or(1);
        Ok(Arc::new(Cluster {
            groups,
            store,
            registry,
            sessions: Arc::new(Sessions::new(client_lease)),
            next_client: Mutex::new(next_client),
            degraded_hint: AtomicBool::new(false),
            repair_state: Mutex::new(Default::default()),
        }))
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.sessions
    }

    /// The metadata groups and which owns each namespace slot (group 0's cluster state).
    pub fn groups(&self) -> &Groups {
        &self.groups
    }

    /// A new client id, never handed out before.
    pub fn register_client(&self) -> Result<u32> {
        let mut next = self.next_client.lock();
        let id =
            u32::try_from(*next).map_err(|_| CairnError::new(ErrorKind::NoSpace, "no client ids left"))?;
        let mut batch = Batch::new();
        batch.put(Cf::Counters, counter::NEXT_CLIENT, schema::encode(&Counter { value: *next + 1 }));
        // Durable: a client id prefixes its stripe versions and must never be handed out twice.
        batch.set_durable();
        self.store.write(batch)?;
        *next += 1;
        Ok(id)
    }

    /// True if a commit recorded missing shards since the last call (the repair then scans).
    pub fn take_degraded_hint(&self) -> bool {
        self.degraded_hint.swap(false, Ordering::Relaxed)
    }

    pub fn repair_state(&self) -> &Mutex<RepairState> {
        &self.repair_state
    }
}

impl Surroundings for Cluster {
    fn place(&self, layout: &Layout, avoid: &[u32]) -> Result<Vec<u32>> {
        self.registry.place_avoiding(layout, avoid)
    }

    fn active_chunkservers(&self) -> usize {
        self.registry.nodes().iter().filter(|n| n.state == "active").count()
    }

    fn capacity(&self) -> (u64, u64) {
        self.registry.capacity()
    }

    fn is_open(&self, ino: u64) -> bool {
        self.sessions.is_open(ino)
    }

    fn note_degraded(&self) {
        self.degraded_hint.store(true, Ordering::Relaxed);
    }
}

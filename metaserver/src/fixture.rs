//! A namespace with its cluster state, as a serving metaserver holds them, for the crate's
//! tests: it reads as the namespace and reaches the cluster's registry, sessions and client ids.

use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{Layout, Result};

use crate::cluster::Cluster;
use crate::namespace::{Namespace, DEFAULT_CLIENT_LEASE};
use crate::registry::Registry;
use crate::repair_state::RepairState;
use crate::sessions::Sessions;
use crate::store::{MemoryStore, MetaStore};

pub struct Fixture {
    pub ns: Arc<Namespace>,
    pub cluster: Arc<Cluster>,
}

impl Fixture {
    /// Over `store`: nodes time out after a minute, clients after `lease`.
    pub fn open_with_lease(store: Arc<dyn MetaStore>, layout: Layout, lease: Duration) -> Fixture {
        let (ns, cluster) =
            Namespace::open_with_cluster(store, layout, Duration::from_secs(60), lease).unwrap();
        Fixture { ns: Arc::new(ns), cluster }
    }

    pub fn open(store: Arc<dyn MetaStore>, layout: Layout) -> Fixture {
        Fixture::open_with_lease(store, layout, DEFAULT_CLIENT_LEASE)
    }

    pub fn memory(layout: Layout) -> Fixture {
        Fixture::open(Arc::new(MemoryStore::new()), layout)
    }

    pub fn memory_with_lease(layout: Layout, lease: Duration) -> Fixture {
        Fixture::open_with_lease(Arc::new(MemoryStore::new()), layout, lease)
    }

    pub fn rocks(path: &Path, layout: Layout) -> Fixture {
        let (ns, cluster) = Namespace::open_rocks(
            path,
            cairn_common::config::SyncMode::Commit,
            layout,
            Duration::from_secs(60),
            DEFAULT_CLIENT_LEASE,
        )
        .unwrap();
        Fixture { ns: Arc::new(ns), cluster }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        self.cluster.registry()
    }

    pub fn sessions(&self) -> &Arc<Sessions> {
        self.cluster.sessions()
    }

    pub fn register_client(&self) -> Result<u32> {
        self.cluster.register_client()
    }

    pub fn repair_state(&self) -> &parking_lot::Mutex<RepairState> {
        self.cluster.repair_state()
    }
}

impl Deref for Fixture {
    type Target = Namespace;

    fn deref(&self) -> &Namespace {
        &self.ns
    }
}

//! The chunkserver registry and placement.
//!
//! A chunkserver registers with a stable uuid and gets a node id, persisted in `Cf::Nodes` so
//! it keeps that id across restarts of either side. Liveness is in memory only: a node is up
//! while its last heartbeat (registration counts as one) is younger than the node timeout, so
//! after a metaserver restart every node is known but down until it heartbeats again.
//!
//! Placement gives a new file `k+m` distinct nodes: up nodes first, taken round-robin from a
//! rotating cursor so files spread evenly; down nodes fill the rest only when at least `k+1`
//! are up (the client writes their shards as missing).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, ErrorKind, Layout, Result};
use cairn_proto::{NodeInfo, TierUsage};
use parking_lot::Mutex;

use crate::schema::{self, counter, Counter, Node};
use crate::store::{Batch, Cf, MetaStore};

/// Longest uuid and address accepted from a chunkserver.
const MAX_UUID: usize = 128;
const MAX_ADDR: usize = 256;
/// Most tiers one chunkserver may report.
const MAX_TIERS: usize = 64;

#[derive(Clone, Debug)]
struct NodeState {
    uuid: String,
    addr: String,
    last_heartbeat: Option<Instant>,
    tiers: Vec<TierUsage>,
    pid: u32,
}

struct Inner {
    nodes: BTreeMap<u32, NodeState>,
    by_uuid: HashMap<String, u32>,
    next_id: u32,
    cursor: usize,
}

/// Everything the metaserver knows about chunkservers.
pub struct Registry {
    store: Arc<dyn MetaStore>,
    timeout: Duration,
    inner: Mutex<Inner>,
}

/// A node as the garbage collector and statfs need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddr {
    pub id: u32,
    pub addr: String,
    pub up: bool,
}

fn check_tiers(tiers: &[TierUsage]) -> Result<()> {
    if tiers.len() > MAX_TIERS {
        return Err(CairnError::invalid(format!("{} tiers reported, at most {MAX_TIERS}", tiers.len())));
    }
    Ok(())
}

fn check_addr(addr: &str) -> Result<()> {
    if addr.is_empty() || addr.len() > MAX_ADDR || !addr.contains(':') || addr.chars().any(char::is_control) {
        return Err(CairnError::invalid(format!("chunkserver address {addr:?} is not host:port")));
    }
    Ok(())
}

impl Registry {
    /// Load the known nodes from the store; all start down.
    pub fn open(store: Arc<dyn MetaStore>, timeout: Duration) -> Result<Registry> {
        let mut nodes = BTreeMap::new();
        let mut by_uuid = HashMap::new();
        for (key, value) in store.scan(Cf::Nodes, &[], &[], usize::MAX)? {
            let id = schema::node_of(&key)?;
            let node: Node = schema::decode("node", &value)?;
            by_uuid.insert(node.uuid.clone(), id);
            nodes.insert(
                id,
                NodeState {
                    uuid: node.uuid,
                    addr: node.addr,
                    last_heartbeat: None,
                    tiers: Vec::new(),
                    pid: 0,
                },
            );
        }
        let next_id = match store.get(Cf::Counters, counter::NEXT_NODE)? {
            Some(v) => schema::decode::<Counter>("node counter", &v)?.value as u32,
            None => 1,
        };
        let next_id = next_id.max(nodes.keys().next_back().map_or(1, |id| id + 1));
        Ok(Registry { store, timeout, inner: Mutex::new(Inner { nodes, by_uuid, next_id, cursor: 0 }) })
    }

    fn is_up(&self, n: &NodeState, now: Instant) -> bool {
        n.last_heartbeat.is_some_and(|t| now.saturating_duration_since(t) < self.timeout)
    }

    /// Register a chunkserver: the same id for a known uuid (its address updated), else a new
    /// one. Registration counts as a heartbeat.
    pub fn register(&self, uuid: &str, addr: &str, tiers: Vec<TierUsage>, pid: u32) -> Result<u32> {
        if uuid.is_empty() || uuid.len() > MAX_UUID || uuid.chars().any(char::is_control) {
            return Err(CairnError::invalid(format!("chunkserver uuid {uuid:?} is empty or too long")));
        }
        check_addr(addr)?;
        check_tiers(&tiers)?;
        let mut inner = self.inner.lock();
        let known = inner.by_uuid.get(uuid).copied();
        let id = match known {
            Some(id) => id,
            None => {
                let id = inner.next_id;
                if id == u32::MAX {
                    return Err(CairnError::new(ErrorKind::NoSpace, "no node ids left"));
                }
                id
            }
        };
        let changed = inner.nodes.get(&id).is_none_or(|n| n.addr != addr);
        if changed {
            let mut batch = Batch::new();
            batch.put(
                Cf::Nodes,
                schema::node_key(id),
                schema::encode(&Node { uuid: uuid.into(), addr: addr.into() }),
            );
            if known.is_none() {
                batch.put(
                    Cf::Counters,
                    counter::NEXT_NODE,
                    schema::encode(&Counter { value: id as u64 + 1 }),
                );
            }
            self.store.write(batch)?;
        }
        if known.is_none() {
            inner.next_id = id + 1;
            inner.by_uuid.insert(uuid.to_string(), id);
        }
        inner.nodes.insert(
            id,
            NodeState {
                uuid: uuid.into(),
                addr: addr.into(),
                last_heartbeat: Some(Instant::now()),
                tiers,
                pid,
            },
        );
        Ok(id)
    }

    /// Record a heartbeat. An unknown id is `NotFound`: the chunkserver then registers again.
    pub fn heartbeat(&self, id: u32, addr: &str, tiers: Vec<TierUsage>, pid: u32) -> Result<()> {
        check_tiers(&tiers)?;
        if !addr.is_empty() {
            check_addr(addr)?;
        }
        let mut inner = self.inner.lock();
        let node =
            inner.nodes.get_mut(&id).ok_or_else(|| CairnError::not_found(format!("unknown node id {id}")))?;
        if !addr.is_empty() && node.addr != addr {
            let record = Node { uuid: node.uuid.clone(), addr: addr.into() };
            let mut batch = Batch::new();
            batch.put(Cf::Nodes, schema::node_key(id), schema::encode(&record));
            self.store.write(batch)?;
            node.addr = addr.into();
        }
        node.last_heartbeat = Some(Instant::now());
        node.tiers = tiers;
        node.pid = pid;
        Ok(())
    }

    /// A placement group of `k+m` distinct nodes for a new file.
    pub fn place(&self, layout: &Layout) -> Result<Vec<u32>> {
        let width = layout.width() as usize;
        let needed = (layout.k as usize + 1).min(width);
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let (up, down): (Vec<u32>, Vec<u32>) = {
            let (up, down): (Vec<_>, Vec<_>) = inner.nodes.iter().partition(|(_, n)| self.is_up(n, now));
            (up.into_iter().map(|(id, _)| *id).collect(), down.into_iter().map(|(id, _)| *id).collect())
        };
        if up.len() < needed {
            return Err(CairnError::unavailable(format!(
                "need at least {needed} chunkservers up for a {}+{} layout, {} are",
                layout.k,
                layout.m,
                up.len()
            )));
        }
        if up.len() + down.len() < width {
            return Err(CairnError::unavailable(format!(
                "need {width} chunkservers for a {}+{} layout, {} are known",
                layout.k,
                layout.m,
                up.len() + down.len()
            )));
        }
        let start = inner.cursor % up.len();
        inner.cursor = inner.cursor.wrapping_add(1);
        let mut group: Vec<u32> = up.iter().cycle().skip(start).take(width.min(up.len())).copied().collect();
        if group.len() < width {
            let dstart = start % down.len().max(1);
            group.extend(down.iter().cycle().skip(dstart).take(width - group.len()));
        }
        Ok(group)
    }

    /// Every known node, by id.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let now = Instant::now();
        let inner = self.inner.lock();
        inner
            .nodes
            .iter()
            .map(|(id, n)| NodeInfo {
                id: *id,
                addr: n.addr.clone(),
                up: self.is_up(n, now),
                last_heartbeat_ms_ago: n
                    .last_heartbeat
                    .map_or(u64::MAX, |t| now.saturating_duration_since(t).as_millis() as u64),
                tiers: n.tiers.clone(),
                pid: n.pid,
            })
            .collect()
    }

    /// Id, address and liveness of a node, if it exists.
    pub fn node(&self, id: u32) -> Option<NodeAddr> {
        let now = Instant::now();
        let inner = self.inner.lock();
        inner.nodes.get(&id).map(|n| NodeAddr { id, addr: n.addr.clone(), up: self.is_up(n, now) })
    }

    /// Raw capacity and free bytes summed over the tiers of the up nodes.
    pub fn capacity(&self) -> (u64, u64) {
        let now = Instant::now();
        let inner = self.inner.lock();
        let mut capacity = 0u64;
        let mut free = 0u64;
        for n in inner.nodes.values().filter(|n| self.is_up(n, now)) {
            for t in &n.tiers {
                capacity = capacity.saturating_add(t.capacity);
                free = free.saturating_add(t.free);
            }
        }
        (capacity, free)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn registry(store: Arc<dyn MetaStore>) -> Registry {
        Registry::open(store, Duration::from_secs(60)).unwrap()
    }

    #[test]
    fn ids_are_stable_per_uuid_and_survive_restart() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let r = registry(store.clone());
        let a = r.register("uuid-a", "127.0.0.1:1", vec![], 10).unwrap();
        let b = r.register("uuid-b", "127.0.0.1:2", vec![], 11).unwrap();
        assert_ne!(a, b);
        assert_eq!(r.register("uuid-a", "127.0.0.1:3", vec![], 12).unwrap(), a);
        assert_eq!(r.node(a).unwrap().addr, "127.0.0.1:3");
        assert!(r.register("", "127.0.0.1:1", vec![], 1).is_err());
        assert!(r.register("x", "nocolon", vec![], 1).is_err());

        let r2 = registry(store);
        let nodes = r2.nodes();
        assert_eq!(nodes.len(), 2);
        assert!(nodes.iter().all(|n| !n.up), "known but down after restart");
        assert_eq!(r2.node(a).unwrap().addr, "127.0.0.1:3");
        let c = r2.register("uuid-c", "127.0.0.1:4", vec![], 1).unwrap();
        assert!(c != a && c != b);
        assert_eq!(r2.heartbeat(999, "", vec![], 1).unwrap_err().kind(), ErrorKind::NotFound);
        r2.heartbeat(a, "", vec![], 5).unwrap();
        assert!(r2.node(a).unwrap().up);
    }

    #[test]
    fn placement_spreads_and_degrades() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let layout = Layout::new(2, 1, 4096).unwrap();
        let r = registry(store.clone());
        assert_eq!(r.place(&layout).unwrap_err().kind(), ErrorKind::Unavailable);
        for i in 0..6 {
            r.register(&format!("n{i}"), &format!("127.0.0.1:{}", 100 + i), vec![], 0).unwrap();
        }
        let mut counts = HashMap::new();
        for _ in 0..60 {
            let g = r.place(&layout).unwrap();
            let mut d = g.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 3, "distinct nodes: {g:?}");
            for n in g {
                *counts.entry(n).or_insert(0) += 1;
            }
        }
        assert_eq!(counts.len(), 6);
        assert!(counts.values().all(|&c| c == 30), "{counts:?}");

        // After a restart only heartbeating nodes are up: 3 up (k+1) → filled with down nodes.
        let r = registry(store);
        let err = r.place(&layout).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(err.message().contains("need at least 3"), "{err}");
        r.heartbeat(1, "", vec![], 0).unwrap();
        r.heartbeat(2, "", vec![], 0).unwrap();
        assert_eq!(r.place(&layout).unwrap_err().kind(), ErrorKind::Unavailable);
        r.heartbeat(3, "", vec![], 0).unwrap();
        let g = r.place(&layout).unwrap();
        assert_eq!(g.len(), 3);
        let mut s = g.clone();
        s.sort();
        assert_eq!(s, vec![1, 2, 3]);
        let wide = Layout::new(3, 2, 4096).unwrap();
        r.heartbeat(4, "", vec![], 0).unwrap();
        let g = r.place(&wide).unwrap();
        assert_eq!(g.len(), 5);
        assert_eq!(g.iter().filter(|n| r.node(**n).unwrap().up).count(), 4);
    }

    #[test]
    fn capacity_counts_up_nodes_only() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let r = registry(store.clone());
        let tier = TierUsage { name: "ssd".into(), capacity: 100, free: 40, ..Default::default() };
        r.register("a", "h:1", vec![tier.clone(), tier.clone()], 0).unwrap();
        assert_eq!(r.capacity(), (200, 80));
        assert_eq!(registry(store).capacity(), (0, 0));
    }
}

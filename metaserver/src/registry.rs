//! The chunkserver registry and placement.
//!
//! A chunkserver registers with a stable uuid and gets a node id, persisted in `Cf::Nodes` so
//! it keeps that id across restarts of either side. Liveness is in memory only: a node is up
//! while its last heartbeat (registration counts as one) is younger than the node timeout, so
//! after a metaserver restart every node is known but down until it heartbeats again.
//!
//! Placement gives a new file `k+m` distinct nodes: up nodes first, taken round-robin from a
//! rotating cursor so files spread evenly; down nodes fill the rest only when at least `k+1`
//! are up (the client writes their shards as missing). Draining nodes and nodes whose disks
//! are (nearly) full get no new files.
//!
//! Lifecycle: a node is active, draining (the repair moves its shards elsewhere while it keeps
//! serving) or removed. A removed node's record stays as a tombstone so the same uuid cannot
//! quietly register again; its shards are forgotten (the garbage collector drops them).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, ErrorKind, Layout, Result};
use cairn_proto::{NodeInfo, TierUsage};
use parking_lot::Mutex;

use crate::schema::{self, counter, Counter, Node, NODE_ACTIVE, NODE_DRAINING, NODE_REMOVED};
use crate::store::{Batch, Cf, MetaStore};

/// Longest uuid and address accepted from a chunkserver.
const MAX_UUID: usize = 128;
const MAX_ADDR: usize = 256;
/// Most tiers one chunkserver may report.
const MAX_TIERS: usize = 64;
/// A node with less free space than this (or than 8 units of the layout) gets no new files.
pub const FULL_BELOW_BYTES: u64 = 16 << 20;

#[derive(Clone, Debug)]
struct NodeState {
    uuid: String,
    addr: String,
    last_heartbeat: Option<Instant>,
    tiers: Vec<TierUsage>,
    pid: u32,
    state: u32,
    /// See [`Node::cert`].
    cert: String,
    /// When the certificate it heartbeats with expires (0: unknown).
    cert_not_after: i64,
}

impl NodeState {
    /// The persisted record of this node.
    fn record(&self) -> Node {
        Node { uuid: self.uuid.clone(), addr: self.addr.clone(), state: self.state, cert: self.cert.clone() }
    }

    /// Refuse a chunkserver whose certificate is not the one the node registered with.
    fn check_cert(&self, id: u32, cert: &str) -> Result<()> {
        if self.cert.is_empty() || self.cert == cert {
            return Ok(());
        }
        Err(CairnError::new(
            ErrorKind::PermissionDenied,
            format!(
                "node {id} (chunkserver {}) belongs to the certificate {:?}; this caller's is {cert:?}",
                self.uuid, self.cert
            ),
        ))
    }

    fn free(&self) -> u64 {
        self.tiers.iter().map(|t| t.free).sum()
    }

    /// Milliseconds since the last heartbeat (`u64::MAX`: never heard from).
    fn heartbeat_ms_ago(&self, now: Instant) -> u64 {
        self.last_heartbeat.map_or(u64::MAX, |t| now.saturating_duration_since(t).as_millis() as u64)
    }

    /// Reports tiers and has less than `below` bytes free in all of them together.
    fn is_full(&self, below: u64) -> bool {
        !self.tiers.is_empty() && self.free() < below
    }
}

/// The name of a node state, as `cairn status` shows it.
pub fn state_name(state: u32) -> &'static str {
    match state {
        NODE_ACTIVE => "active",
        NODE_DRAINING => "draining",
        NODE_REMOVED => "removed",
        _ => "unknown",
    }
}

struct Inner {
    nodes: BTreeMap<u32, NodeState>,
    by_uuid: HashMap<String, u32>,
    /// Uuids of removed nodes, which may not register again.
    removed: HashMap<String, u32>,
    next_id: u32,
    cursor: usize,
}

/// Everything the metaserver knows about chunkservers.
pub struct Registry {
    store: Arc<dyn MetaStore>,
    timeout: Duration,
    inner: Mutex<Inner>,
    /// Group 0's list was taken at least once ([`Registry::mirror`]).
    mirrored: std::sync::atomic::AtomicBool,
}

/// A node as the garbage collector and statfs need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddr {
    pub id: u32,
    pub addr: String,
    pub up: bool,
}

/// What the repair needs to know of a node.
#[derive(Clone, Debug)]
pub struct NodeHealth {
    pub id: u32,
    pub addr: String,
    pub up: bool,
    pub last_heartbeat_ms_ago: u64,
    pub draining: bool,
    pub free: u64,
    /// Less than [`FULL_BELOW_BYTES`] free.
    pub full: bool,
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
        let mut removed = HashMap::new();
        let mut last_id = 0;
        for (key, value) in store.scan(Cf::Nodes, &[], &[], usize::MAX)? {
            let id = schema::node_of(&key)?;
            last_id = last_id.max(id);
            let node: Node = schema::decode("node", &value)?;
            if node.state == NODE_REMOVED {
                removed.insert(node.uuid, id);
                continue;
            }
            by_uuid.insert(node.uuid.clone(), id);
            nodes.insert(
                id,
                NodeState {
                    uuid: node.uuid,
                    addr: node.addr,
                    last_heartbeat: None,
                    tiers: Vec::new(),
                    pid: 0,
                    state: node.state,
                    cert: node.cert,
                    cert_not_after: 0,
                },
            );
        }
        let next_id = match store.get(Cf::Counters, counter::NEXT_NODE)? {
            Some(v) => schema::decode::<Counter>("node counter", &v)?.value as u32,
            None => 1,
        };
        let next_id = next_id.max(last_id + 1);
        Ok(Registry {
            store,
            timeout,
            inner: Mutex::new(Inner { nodes, by_uuid, removed, next_id, cursor: 0 }),
            mirrored: Default::default(),
        })
    }

    /// Take the chunkservers group 0's leader lists (`ListNodes`) as this registry's, in a
    /// group other than 0, which places its stripes and sends its deletes to them: under group
    /// 0's node ids, in memory only (the group's leader refreshes it every second; a node group
    /// 0 no longer lists is forgotten), up as group 0 last heard from it.
    pub fn mirror(&self, nodes: &[NodeInfo]) {
        let now = Instant::now();
        let timeout_ms = self.timeout.as_millis() as u64;
        let state = |name: &str| if name == state_name(NODE_DRAINING) { NODE_DRAINING } else { NODE_ACTIVE };
        let mut inner = self.inner.lock();
        let previous: BTreeMap<u32, Option<Instant>> =
            inner.nodes.iter().map(|(id, n)| (*id, n.last_heartbeat)).collect();
        let mirrored = nodes.iter().map(|n| {
            // A node down is down here too (heard from at least a timeout ago), and for as long
            // as group 0 says: the repair rebuilds what it held once that is long enough. One
            // group 0 has not heard from since its leader started (a new leader) keeps what this
            // group saw before, or is taken as just down: never as down for ever, which would
            // have this group's repair rebuild every node's shards after each failover there.
            let heard = if n.up {
                now.checked_sub(Duration::from_millis(n.last_heartbeat_ms_ago))
            } else if n.last_heartbeat_ms_ago == u64::MAX {
                previous.get(&n.id).copied().flatten().or_else(|| now.checked_sub(self.timeout))
            } else {
                now.checked_sub(Duration::from_millis(n.last_heartbeat_ms_ago.max(timeout_ms)))
            };
            let node = NodeState {
                uuid: String::new(),
                addr: n.addr.clone(),
                last_heartbeat: if n.up { Some(heard.unwrap_or(now)) } else { heard },
                tiers: n.tiers.clone(),
                pid: n.pid,
                state: state(&n.state),
                cert: String::new(),
                cert_not_after: n.cert_not_after,
            };
            (n.id, node)
        });
        inner.nodes = mirrored.collect();
        self.mirrored.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether [`Registry::mirror`] took group 0's list at least once: before that, a group
    /// other than 0 knows no chunkserver (and its GC, which drops deletes queued for nodes it
    /// does not know, waits).
    pub fn mirrored(&self) -> bool {
        self.mirrored.load(std::sync::atomic::Ordering::Acquire)
    }

    fn is_up(&self, n: &NodeState, now: Instant) -> bool {
        n.last_heartbeat.is_some_and(|t| now.saturating_duration_since(t) < self.timeout)
    }

    /// Register a chunkserver: the same id for a known uuid (its address updated), else a new
    /// one. Registration counts as a heartbeat. `cert` is the caller's certificate name (empty
    /// without TLS): a known node registers again only with its own.
    pub fn register(
        &self,
        uuid: &str,
        addr: &str,
        tiers: Vec<TierUsage>,
        pid: u32,
        cert: &str,
    ) -> Result<u32> {
        if uuid.is_empty() || uuid.len() > MAX_UUID || uuid.chars().any(char::is_control) {
            return Err(CairnError::invalid(format!("chunkserver uuid {uuid:?} is empty or too long")));
        }
        check_addr(addr)?;
        check_tiers(&tiers)?;
        let mut inner = self.inner.lock();
        if let Some(id) = inner.removed.get(uuid) {
            return Err(CairnError::new(
                ErrorKind::NotPermitted,
                format!(
                    "chunkserver {uuid} was node {id}, which was removed from the cluster; \
                     to add this machine again, start it with an empty data directory"
                ),
            ));
        }
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
        if let Some(node) = inner.nodes.get(&id) {
            node.check_cert(id, cert)?;
        }
        let changed = inner.nodes.get(&id).is_none_or(|n| n.addr != addr || n.cert != cert);
        let state = inner.nodes.get(&id).map_or(NODE_ACTIVE, |n| n.state);
        if changed {
            let mut batch = Batch::new();
            batch.put(
                Cf::Nodes,
                schema::node_key(id),
                schema::encode(&Node { uuid: uuid.into(), addr: addr.into(), state, cert: cert.into() }),
            );
            if known.is_none() {
                batch.put(
                    Cf::Counters,
                    counter::NEXT_NODE,
                    schema::encode(&Counter { value: id as u64 + 1 }),
                );
            }
            batch.set_durable();
            self.store.write(batch)?;
        }
        let cert_not_after = inner.nodes.get(&id).map_or(0, |n| n.cert_not_after);
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
                state,
                cert: cert.into(),
                cert_not_after,
            },
        );
        Ok(id)
    }

    /// Record when the certificate node `id` heartbeats with expires.
    pub fn set_cert_expiry(&self, id: u32, not_after: i64) {
        if let Some(node) = self.inner.lock().nodes.get_mut(&id) {
            node.cert_not_after = not_after;
        }
    }

    /// Record a heartbeat from the caller with the certificate `cert` (empty without TLS),
    /// which must be the node's. An unknown id is `NotFound`: the chunkserver then registers
    /// again.
    pub fn heartbeat(&self, id: u32, addr: &str, tiers: Vec<TierUsage>, pid: u32, cert: &str) -> Result<()> {
        check_tiers(&tiers)?;
        if !addr.is_empty() {
            check_addr(addr)?;
        }
        let mut inner = self.inner.lock();
        let node =
            inner.nodes.get_mut(&id).ok_or_else(|| CairnError::not_found(format!("unknown node id {id}")))?;
        node.check_cert(id, cert)?;
        if !addr.is_empty() && node.addr != addr {
            let record = Node { addr: addr.into(), ..node.record() };
            let mut batch = Batch::new();
            batch.put(Cf::Nodes, schema::node_key(id), schema::encode(&record));
            batch.set_durable();
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
        self.place_avoiding(layout, &[])
    }

    /// [`Registry::place`], leaving out the nodes in `avoid` (ones a client could not reach)
    /// when enough others are up.
    pub fn place_avoiding(&self, layout: &Layout, avoid: &[u32]) -> Result<Vec<u32>> {
        let width = layout.width() as usize;
        let needed = (layout.k as usize + 1).min(width);
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let full_below = FULL_BELOW_BYTES.max(layout.unit as u64 * 8);
        let (up, down): (Vec<u32>, Vec<u32>) = {
            let eligible = inner.nodes.iter().filter(|(_, n)| n.state == NODE_ACTIVE);
            let (up, down): (Vec<_>, Vec<_>) = eligible.partition(|(_, n)| self.is_up(n, now));
            (
                up.into_iter().filter(|(_, n)| !n.is_full(full_below)).map(|(id, _)| *id).collect(),
                down.into_iter().map(|(id, _)| *id).collect(),
            )
        };
        if up.len() < needed {
            let full = inner
                .nodes
                .values()
                .filter(|n| n.state == NODE_ACTIVE && self.is_up(n, now) && n.is_full(full_below))
                .count();
            let message = format!(
                "need at least {needed} chunkservers up with free space for a {}+{} layout, {} are \
                 ({full} up but full)",
                layout.k,
                layout.m,
                up.len()
            );
            // Nodes are there but out of room: that is a full filesystem to the application.
            // Nodes down: a client may wait for them (its `write_wait_ms`).
            let kind = if up.len() + full >= needed { ErrorKind::NoSpace } else { ErrorKind::TooFewNodes };
            return Err(CairnError::new(kind, message));
        }
        if up.len() + down.len() < width {
            return Err(CairnError::unavailable(format!(
                "need {width} chunkservers for a {}+{} layout, {} are known",
                layout.k,
                layout.m,
                up.len() + down.len()
            )));
        }
        // Prefer nodes heard from lately (one that stopped answering a moment ago is still "up"
        // until the node timeout, but a new file placed on it would start out degraded), and
        // nodes the client can reach: up nodes in rotated order, stably sorted by those two.
        let fresh_within = (self.timeout / 3).min(Duration::from_secs(3));
        let start = inner.cursor % up.len();
        inner.cursor = inner.cursor.wrapping_add(1);
        let mut ranked: Vec<u32> = up.iter().cycle().skip(start).take(up.len()).copied().collect();
        ranked.sort_by_key(|id| {
            let quiet = inner.nodes[id]
                .last_heartbeat
                .is_none_or(|t| now.saturating_duration_since(t) >= fresh_within);
            (avoid.contains(id), quiet)
        });
        let mut group: Vec<u32> = ranked.into_iter().take(width).collect();
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
                last_heartbeat_ms_ago: n.heartbeat_ms_ago(now),
                tiers: n.tiers.clone(),
                pid: n.pid,
                state: state_name(n.state).into(),
                shards_left: 0,
                rebuild_in_ms: None,
                full: n.is_full(FULL_BELOW_BYTES),
                cert_not_after: n.cert_not_after,
            })
            .collect()
    }

    /// Every known node as the repair sees it.
    pub fn health(&self) -> Vec<NodeHealth> {
        let now = Instant::now();
        let inner = self.inner.lock();
        inner
            .nodes
            .iter()
            .map(|(id, n)| NodeHealth {
                id: *id,
                addr: n.addr.clone(),
                up: self.is_up(n, now),
                last_heartbeat_ms_ago: n.heartbeat_ms_ago(now),
                draining: n.state == NODE_DRAINING,
                free: n.free(),
                full: n.is_full(FULL_BELOW_BYTES),
            })
            .collect()
    }

    /// Set a node active or draining.
    pub fn set_state(&self, id: u32, state: u32) -> Result<NodeInfo> {
        if state != NODE_ACTIVE && state != NODE_DRAINING {
            return Err(CairnError::invalid(format!("node state {state}")));
        }
        {
            let mut inner = self.inner.lock();
            let node = inner
                .nodes
                .get_mut(&id)
                .ok_or_else(|| CairnError::not_found(format!("no chunkserver with id {id}")))?;
            if node.state != state {
                let record = Node { state, ..node.record() };
                let mut batch = Batch::new();
                batch.put(Cf::Nodes, schema::node_key(id), schema::encode(&record));
                batch.set_durable();
                self.store.write(batch)?;
                node.state = state;
            }
        }
        tracing::info!(node = id, state = state_name(state), "node state changed");
        Ok(self.nodes().into_iter().find(|n| n.id == id).expect("node exists"))
    }

    /// Forget node `id` (the caller has checked that no file needs it). Its record stays as a
    /// tombstone so its uuid cannot register again.
    pub fn remove(&self, id: u32) -> Result<()> {
        let mut inner = self.inner.lock();
        let node = inner
            .nodes
            .get(&id)
            .ok_or_else(|| CairnError::not_found(format!("no chunkserver with id {id}")))?;
        let record = Node { state: NODE_REMOVED, ..node.record() };
        let mut batch = Batch::new();
        batch.put(Cf::Nodes, schema::node_key(id), schema::encode(&record));
        batch.set_durable();
        self.store.write(batch)?;
        let uuid = record.uuid;
        inner.nodes.remove(&id);
        inner.by_uuid.remove(&uuid);
        inner.removed.insert(uuid, id);
        tracing::info!(node = id, "node removed");
        Ok(())
    }

    /// Id, address and liveness of a node, if it exists.
    pub fn node(&self, id: u32) -> Option<NodeAddr> {
        let now = Instant::now();
        let inner = self.inner.lock();
        inner.nodes.get(&id).map(|n| NodeAddr { id, addr: n.addr.clone(), up: self.is_up(n, now) })
    }

    /// Raw capacity and free bytes of the up nodes' tiers, each filesystem once.
    pub fn capacity(&self) -> (u64, u64) {
        let now = Instant::now();
        let inner = self.inner.lock();
        let up = inner.nodes.values().filter(|n| self.is_up(n, now));
        cairn_common::space::raw_space(up.flat_map(|n| &n.tiers))
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
        let a = r.register("uuid-a", "127.0.0.1:1", vec![], 10, "").unwrap();
        let b = r.register("uuid-b", "127.0.0.1:2", vec![], 11, "").unwrap();
        assert_ne!(a, b);
        assert_eq!(r.register("uuid-a", "127.0.0.1:3", vec![], 12, "").unwrap(), a);
        assert_eq!(r.node(a).unwrap().addr, "127.0.0.1:3");
        assert!(r.register("", "127.0.0.1:1", vec![], 1, "").is_err());
        assert!(r.register("x", "nocolon", vec![], 1, "").is_err());

        let r2 = registry(store);
        let nodes = r2.nodes();
        assert_eq!(nodes.len(), 2);
        assert!(nodes.iter().all(|n| !n.up), "known but down after restart");
        assert_eq!(r2.node(a).unwrap().addr, "127.0.0.1:3");
        let c = r2.register("uuid-c", "127.0.0.1:4", vec![], 1, "").unwrap();
        assert!(c != a && c != b);
        assert_eq!(r2.heartbeat(999, "", vec![], 1, "").unwrap_err().kind(), ErrorKind::NotFound);
        r2.heartbeat(a, "", vec![], 5, "").unwrap();
        assert!(r2.node(a).unwrap().up);
    }

    #[test]
    fn a_node_belongs_to_the_certificate_it_registered_with() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let r = registry(store.clone());
        let a = r.register("uuid-a", "127.0.0.1:1", vec![], 10, "chunk-1").unwrap();
        r.heartbeat(a, "127.0.0.1:1", vec![], 10, "chunk-1").unwrap();
        // Another chunkserver's certificate can neither heartbeat for it (and move its address)
        // nor register as it.
        let e = r.heartbeat(a, "10.9.9.9:1", vec![], 10, "chunk-2").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        assert!(e.message().contains("chunk-1") && e.message().contains("chunk-2"), "{e}");
        let e = r.register("uuid-a", "10.9.9.9:1", vec![], 10, "chunk-2").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        assert_eq!(r.node(a).unwrap().addr, "127.0.0.1:1");
        // The binding survives a restart; a node registered without TLS is bound at its next
        // registration with a certificate.
        let r = registry(store);
        assert_eq!(
            r.heartbeat(a, "", vec![], 10, "chunk-2").unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
        r.heartbeat(a, "", vec![], 10, "chunk-1").unwrap();
        let b = r.register("uuid-b", "127.0.0.1:2", vec![], 11, "").unwrap();
        r.register("uuid-b", "127.0.0.1:2", vec![], 11, "chunk-9").unwrap();
        assert_eq!(
            r.heartbeat(b, "", vec![], 11, "chunk-1").unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
    }

    /// Another group's registry is group 0's list as it last read it: group 0's ids, up and
    /// draining as group 0 says, nothing written, a node no longer listed gone.
    #[test]
    fn a_mirrored_registry_places_on_group_zeros_nodes() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let r = registry(store.clone());
        let node = |id: u32, up: bool, state: &str| NodeInfo {
            id,
            addr: format!("10.0.0.{id}:9500"),
            up,
            last_heartbeat_ms_ago: if up { 300 } else { 120_000 },
            state: state.into(),
            ..Default::default()
        };
        let listed = [
            node(7, true, "active"),
            node(8, true, "active"),
            node(9, true, "draining"),
            node(10, false, "active"),
        ];
        assert!(!r.mirrored());
        r.mirror(&listed);
        assert!(r.mirrored());
        assert!(store.scan(Cf::Nodes, &[], &[], usize::MAX).unwrap().is_empty(), "nothing written");
        let seen: Vec<(u32, bool, String)> = r.nodes().into_iter().map(|n| (n.id, n.up, n.state)).collect();
        assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [7, 8, 9, 10]);
        assert_eq!((seen[2].1, seen[2].2.as_str(), seen[3].1), (true, "draining", false));
        let layout = Layout::new(1, 1, 4096).unwrap();
        for _ in 0..10 {
            let mut placed = r.place(&layout).unwrap();
            placed.sort_unstable();
            assert_eq!(placed, [7, 8], "only the active nodes that are up");
        }
        r.mirror(&listed[..1]);
        assert_eq!(r.place(&layout).unwrap_err().kind(), ErrorKind::TooFewNodes);
        assert_eq!(r.nodes().len(), 1);

        // Down for 2 minutes stays so; a node group 0's new leader has not heard from yet
        // (u64::MAX) keeps when this group last saw it, or is taken as just down — never as
        // down for ever (this group's repair would rebuild its shards at once).
        let never = |id: u32| NodeInfo { last_heartbeat_ms_ago: u64::MAX, ..node(id, false, "active") };
        r.mirror(&[node(7, true, "active"), node(10, false, "active")]);
        r.mirror(&[never(7), node(10, false, "active"), never(11)]);
        let age = |id: u32| r.nodes().into_iter().find(|n| n.id == id).unwrap().last_heartbeat_ms_ago;
        assert!(age(7) < 5_000, "{}", age(7));
        assert!((120_000..130_000).contains(&age(10)), "{}", age(10));
        assert!(age(11) < 130_000, "{}", age(11));
    }

    #[test]
    fn placement_spreads_and_degrades() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let layout = Layout::new(2, 1, 4096).unwrap();
        let r = registry(store.clone());
        assert_eq!(r.place(&layout).unwrap_err().kind(), ErrorKind::TooFewNodes);
        for i in 0..6 {
            r.register(&format!("n{i}"), &format!("127.0.0.1:{}", 100 + i), vec![], 0, "").unwrap();
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
        assert_eq!(err.kind(), ErrorKind::TooFewNodes);
        assert!(err.message().contains("need at least 3"), "{err}");
        r.heartbeat(1, "", vec![], 0, "").unwrap();
        r.heartbeat(2, "", vec![], 0, "").unwrap();
        assert_eq!(r.place(&layout).unwrap_err().kind(), ErrorKind::TooFewNodes);
        r.heartbeat(3, "", vec![], 0, "").unwrap();
        let g = r.place(&layout).unwrap();
        assert_eq!(g.len(), 3);
        let mut s = g.clone();
        s.sort();
        assert_eq!(s, vec![1, 2, 3]);
        let wide = Layout::new(3, 2, 4096).unwrap();
        r.heartbeat(4, "", vec![], 0, "").unwrap();
        let g = r.place(&wide).unwrap();
        assert_eq!(g.len(), 5);
        assert_eq!(g.iter().filter(|n| r.node(**n).unwrap().up).count(), 4);
    }

    #[test]
    fn full_and_draining_nodes_get_no_new_files_and_removed_ones_stay_out() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let layout = Layout::new(2, 1, 4096).unwrap();
        let r = registry(store.clone());
        let roomy = TierUsage { name: "ssd".into(), capacity: 1 << 40, free: 1 << 39, ..Default::default() };
        let full = TierUsage { free: FULL_BELOW_BYTES - 1, ..roomy.clone() };
        for i in 0..5 {
            r.register(&format!("n{i}"), &format!("127.0.0.1:{}", 100 + i), vec![roomy.clone()], 0, "")
                .unwrap();
        }
        r.heartbeat(1, "", vec![full.clone()], 0, "").unwrap();
        r.set_state(2, NODE_DRAINING).unwrap();
        for _ in 0..20 {
            let g = r.place(&layout).unwrap();
            assert!(!g.contains(&1) && !g.contains(&2), "{g:?}");
        }
        assert_eq!(r.nodes().iter().find(|n| n.id == 2).unwrap().state, "draining");
        // Everything full: a full filesystem, not an outage.
        for id in 3..=5 {
            r.heartbeat(id, "", vec![full.clone()], 0, "").unwrap();
        }
        r.set_state(2, NODE_ACTIVE).unwrap();
        r.heartbeat(2, "", vec![full.clone()], 0, "").unwrap();
        assert_eq!(r.place(&layout).unwrap_err().kind(), ErrorKind::NoSpace);

        r.remove(5).unwrap();
        assert!(r.node(5).is_none());
        assert_eq!(r.nodes().len(), 4);
        let err = r.register("n4", "127.0.0.1:104", vec![], 0, "").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotPermitted);
        assert!(err.message().contains("removed"), "{err}");
        // After a restart: still removed, the drain state persisted, and new ids never reuse 5.
        r.set_state(3, NODE_DRAINING).unwrap();
        let r = registry(store);
        assert!(r.node(5).is_none());
        assert_eq!(
            r.register("n4", "127.0.0.1:104", vec![], 0, "").unwrap_err().kind(),
            ErrorKind::NotPermitted
        );
        assert_eq!(r.nodes().iter().find(|n| n.id == 3).unwrap().state, "draining");
        assert_eq!(r.register("new", "127.0.0.1:200", vec![], 0, "").unwrap(), 6);
    }

    #[test]
    fn new_files_avoid_nodes_that_went_quiet() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let layout = Layout::new(2, 1, 4096).unwrap();
        // Node timeout 6 s: a node is preferred while heard from within the last 2 s.
        let r = Registry::open(store, Duration::from_secs(6)).unwrap();
        for i in 0..5 {
            r.register(&format!("n{i}"), &format!("127.0.0.1:{}", 100 + i), vec![], 0, "").unwrap();
        }
        std::thread::sleep(Duration::from_millis(2100));
        for id in [1, 2, 3] {
            r.heartbeat(id, "", vec![], 0, "").unwrap();
        }
        // Nodes 4 and 5 are still up, but quiet: three fresh nodes are enough for 2+1.
        for _ in 0..10 {
            let g = r.place(&layout).unwrap();
            assert!(!g.contains(&4) && !g.contains(&5), "{g:?}");
        }
        // A wider layout takes the quiet ones too rather than fail.
        let g = r.place(&Layout::new(3, 1, 4096).unwrap()).unwrap();
        assert_eq!(g.len(), 4);
        // Nodes a client could not reach are left out while enough others are fresh.
        for _ in 0..10 {
            let g = r.place_avoiding(&Layout::new(1, 1, 4096).unwrap(), &[1]).unwrap();
            assert!(!g.contains(&1), "{g:?}");
        }
    }

    #[test]
    fn capacity_counts_up_nodes_only() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let r = registry(store.clone());
        let tier = TierUsage { name: "ssd".into(), capacity: 100, free: 40, ..Default::default() };
        r.register("a", "h:1", vec![tier.clone(), tier.clone()], 0, "").unwrap();
        assert_eq!(r.capacity(), (200, 80));
        assert_eq!(registry(store).capacity(), (0, 0));
    }
}

//! The group map (`docs/ARCHITECTURE.md`, "Several metadata groups"): the metadata groups other
//! than 0 with their replicas, which group owns each namespace slot, and a version raised by
//! every change. One record in group 0's cluster state (`counters/group_map`), each change one
//! write (one Raft entry on a replica), changes serialized by this leadership's lock.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_common::config::{parse_replicas, MAX_GROUPS};
use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto::{GroupMap, MetaGroup};
use parking_lot::Mutex;

use crate::schema;
use crate::store::{Batch, Cf, MetaStore};

/// The namespace's slots: an inode number's top 12 bits.
pub const SLOTS: usize = MAX_GROUPS as usize;

/// The key of the group map in the counters column family (a [`GroupMap`], not a `Counter`).
const KEY: &[u8] = b"group_map";

/// The group map of one serving group 0.
pub struct Groups {
    store: Arc<dyn MetaStore>,
    /// Held across a change's read and write: two changes never start from the same version.
    changing: Mutex<()>,
    /// What the leader's last round of questions found wrong with each group other than 0 (no
    /// leader, no majority, replicas not answering; `service/groups.rs`): absent while a group
    /// is well. Health reports read it, so they never wait on other groups.
    health: Mutex<BTreeMap<u32, String>>,
}

impl Groups {
    pub fn open(store: Arc<dyn MetaStore>) -> Groups {
        Groups { store, changing: Mutex::new(()), health: Mutex::new(BTreeMap::new()) }
    }

    /// Keep what the latest round of questions found wrong, by group.
    pub fn set_health(&self, problems: BTreeMap<u32, String>) {
        *self.health.lock() = problems;
    }

    /// The problems the latest round found, of the groups still in the map.
    pub fn health(&self) -> Result<Vec<String>> {
        let map = self.map()?;
        let health = self.health.lock();
        Ok(map.groups.iter().filter_map(|g| health.get(&g.group).cloned()).collect())
    }

    /// The stored map: the groups other than 0, by number, and the slots (empty while every
    /// slot is group 0's). Version 0, no groups, before the first change.
    pub fn map(&self) -> Result<GroupMap> {
        match self.store.get(Cf::Counters, KEY)? {
            Some(bytes) => schema::decode("group map", &bytes),
            None => Ok(GroupMap::default()),
        }
    }

    /// Add `group` with its replicas (already checked to answer as that group's: see the
    /// service), and say whether the map changed. The same group with the same replicas again
    /// changes nothing; another group of that number, or one sharing an address with another
    /// group (`taken`: group 0's replicas included), is refused.
    pub fn add(&self, group: &MetaGroup, taken: &[String]) -> Result<(GroupMap, bool)> {
        let replicas = check_form(group)?;
        let _changing = self.changing.lock();
        let mut map = self.map()?;
        if let Some(known) = map.groups.iter().find(|g| g.group == group.group) {
            if parse_replicas(&known.replicas)? == replicas {
                return Ok((map, false));
            }
            return Err(CairnError::new(
                ErrorKind::Exists,
                format!(
                    "metadata group {} is already known, with replicas {}: remove it first",
                    group.group,
                    known.replicas.join(",")
                ),
            ));
        }
        let others = map.groups.iter().flat_map(|g| g.replicas.iter().map(move |r| (g.group, r)));
        for (other, r) in others.chain(taken.iter().map(|r| (0, r))) {
            let addr = replica_addr(r);
            if replicas.values().any(|a| a == addr) {
                return Err(CairnError::new(
                    ErrorKind::Exists,
                    format!("{addr} is a replica of metadata group {other}: one process is one replica of one group"),
                ));
            }
        }
        map.groups.push(MetaGroup {
            group: group.group,
            replicas: replicas.iter().map(|(id, addr)| format!("{id}={addr}")).collect(),
        });
        map.groups.sort_by_key(|g| g.group);
        Ok((self.write(map)?, true))
    }

    /// Forget `group`, which must own no slots. Forgetting one not known changes nothing.
    pub fn remove(&self, group: u32) -> Result<GroupMap> {
        if group == 0 {
            return Err(CairnError::invalid("metadata group 0 holds the root and the cluster: it stays"));
        }
        let _changing = self.changing.lock();
        let mut map = self.map()?;
        if !map.groups.iter().any(|g| g.group == group) {
            return Ok(map);
        }
        let owned = map.slots.iter().filter(|g| **g == group).count();
        if owned > 0 {
            return Err(CairnError::new(
                ErrorKind::NotEmpty,
                format!(
                    "metadata group {group} owns {owned} namespace slots: move them to other groups first"
                ),
            ));
        }
        map.groups.retain(|g| g.group != group);
        self.write(map)
    }

    fn write(&self, mut map: GroupMap) -> Result<GroupMap> {
        map.version += 1;
        let mut batch = Batch::new();
        batch.put(Cf::Counters, KEY, schema::encode(&map));
        // Every process caches the map by its version: a version handed out must never be
        // handed out again with other contents.
        batch.set_durable();
        self.store.write(batch)?;
        Ok(map)
    }
}

/// The address of a replica as a group map names it (`ID=HOST:PORT`).
pub fn replica_addr(replica: &str) -> &str {
    replica.split_once('=').map_or(replica, |(_, addr)| addr).trim()
}

/// The group that owns `slot` in `map`.
pub fn owner(map: &GroupMap, slot: usize) -> u32 {
    map.slots.get(slot).copied().unwrap_or(0)
}

/// How many slots each group owns (every group of the map, 0 included, listed).
pub fn slot_counts(map: &GroupMap) -> BTreeMap<u32, usize> {
    let mut counts: BTreeMap<u32, usize> = map.groups.iter().map(|g| (g.group, 0)).collect();
    counts.insert(0, 0);
    for slot in 0..SLOTS {
        *counts.entry(owner(map, slot)).or_default() += 1;
    }
    counts
}

/// A group to add, as a request names it: a number other than 0 within range, and its
/// replicas well formed. Returns them by id.
pub fn check_form(group: &MetaGroup) -> Result<BTreeMap<u64, String>> {
    if group.group == 0 || group.group >= MAX_GROUPS {
        return Err(CairnError::invalid(format!(
            "metadata group {}: a group to add is numbered 1 to {}",
            group.group,
            MAX_GROUPS - 1
        )));
    }
    let replicas = parse_replicas(&group.replicas)?;
    if replicas.is_empty() {
        return Err(CairnError::invalid(format!("metadata group {}: name its replicas", group.group)));
    }
    Ok(replicas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn group(n: u32, addrs: &[&str]) -> MetaGroup {
        MetaGroup {
            group: n,
            replicas: addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect(),
        }
    }

    #[test]
    fn groups_are_added_once_and_removed_and_each_change_raises_the_version() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let groups = Groups::open(store.clone());
        assert_eq!(groups.map().unwrap(), GroupMap::default());
        let zero = vec!["1=10.0.0.1:9400".to_string()];
        let one = group(1, &["10.0.1.1:9400", "10.0.1.2:9400", "10.0.1.3:9400"]);
        let (map, changed) = groups.add(&one, &zero).unwrap();
        assert_eq!((map.version, map.groups.len(), changed), (1, 1, true));
        // Sent again (an answer lost): nothing changes.
        assert_eq!(groups.add(&one, &zero).unwrap(), (map, false));
        let e = groups.add(&group(1, &["10.0.9.9:9400"]), &zero).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Exists, "{e}");
        let e = groups.add(&group(2, &["10.0.1.2:9400"]), &zero).unwrap_err();
        assert!(e.message().contains("replica of metadata group 1"), "{e}");
        let e = groups.add(&group(2, &["10.0.0.1:9400"]), &zero).unwrap_err();
        assert!(e.message().contains("replica of metadata group 0"), "{e}");
        for bad in [group(0, &["10.0.2.1:9400"]), group(MAX_GROUPS, &["10.0.2.1:9400"]), group(2, &[])] {
            assert_eq!(groups.add(&bad, &zero).unwrap_err().kind(), ErrorKind::InvalidArgument, "{bad:?}");
        }
        let (map, _) = groups.add(&group(3, &["10.0.3.1:9400"]), &zero).unwrap();
        assert_eq!(map.groups.iter().map(|g| g.group).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(slot_counts(&map), BTreeMap::from([(0, SLOTS), (1, 0), (3, 0)]));
        // Reopened (a new leadership): the same map.
        assert_eq!(Groups::open(store.clone()).map().unwrap(), map);

        assert_eq!(groups.remove(0).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let map = groups.remove(1).unwrap();
        assert_eq!((map.version, map.groups.len()), (3, 1));
        assert_eq!(groups.remove(1).unwrap().version, 3, "removing one not known changes nothing");

        // A group that owns slots stays.
        let mut owning = groups.map().unwrap();
        owning.slots = vec![0; SLOTS];
        owning.slots[7] = 3;
        let owning = groups.write(owning).unwrap();
        assert_eq!(owner(&owning, 7), 3);
        assert_eq!(groups.remove(3).unwrap_err().kind(), ErrorKind::NotEmpty);
    }
}

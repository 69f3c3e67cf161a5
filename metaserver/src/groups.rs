//! The group map (`docs/ARCHITECTURE.md`, "Several metadata groups"): the metadata groups other
//! than 0 with their replicas, which group owns each namespace slot, and a version raised by
//! every change. One record in group 0's cluster state (`counters/group_map`), each change one
//! write (one Raft entry on a replica), changes serialized by this leadership's lock.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_common::config::{parse_replicas, MAX_GROUPS};
use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto::{GroupMap, MetaGroup};
use parking_lot::{Mutex, RwLock};

use crate::schema;
use crate::store::{Batch, Cf, MetaStore};

/// The namespace's slots: an inode number's top 12 bits.
pub const SLOTS: usize = MAX_GROUPS as usize;

/// The key of the group map in the counters column family (a [`GroupMap`], not a `Counter`).
const KEY: &[u8] = b"group_map";

/// The promises of the groups giving up slots in one move: each group's slots, all made under
/// the map at `version`.
#[derive(Debug, Default)]
pub struct Promised {
    pub version: u64,
    pub slots: BTreeMap<u32, Vec<u32>>,
    /// Where each slot's owner had numbered it up to (`ReleaseSlots`): the map keeps it as the
    /// slot's floor.
    pub reserved_ends: BTreeMap<u32, u64>,
}

/// Whether `map` lets `slots` move to `to`, as far as group 0 can tell alone: named, numbered,
/// not slot 0, `to` in the map, none of group 0's holding records (`holds`). Checked before
/// other groups are asked to promise theirs (a move refused after would leave their promises
/// standing until the next map change), and again when the move is written.
pub fn check_move(map: &GroupMap, slots: &[u32], to: u32, holds: impl Fn(u32) -> Result<bool>) -> Result<()> {
    if slots.is_empty() {
        return Err(CairnError::invalid("name the namespace slots to move"));
    }
    if to != 0 && !map.groups.iter().any(|g| g.group == to) {
        return Err(CairnError::new(
            ErrorKind::NotFound,
            format!("metadata group {to} is not in the group map: add it first (cairn meta groups add)"),
        ));
    }
    for &slot in slots {
        if slot as usize >= SLOTS {
            return Err(CairnError::invalid(format!(
                "namespace slot {slot}: slots are numbered 0 to {}",
                SLOTS - 1
            )));
        }
        if slot == 0 {
            return Err(CairnError::invalid(
                "namespace slot 0 holds the root directory and every inode made before groups: it stays in metadata group 0",
            ));
        }
        if owner(map, slot as usize) == 0 && to != 0 && holds(slot)? {
            return Err(CairnError::new(
                ErrorKind::NotEmpty,
                format!(
                    "namespace slot {slot} holds records in metadata group 0: moving a slot's records is not built yet, only empty slots move"
                ),
            ));
        }
    }
    Ok(())
}

/// Of `slots`, those a group other than 0 owns in `map` that would leave it for `to`, by owner:
/// each owner must promise to number nothing more in them first (`MoveSlots`).
pub fn leaving(map: &GroupMap, slots: &[u32], to: u32) -> BTreeMap<u32, Vec<u32>> {
    let mut leaving = BTreeMap::<u32, Vec<u32>>::new();
    for &slot in slots {
        let owner = map.slots.get(slot as usize).copied().unwrap_or(0);
        if owner != 0 && owner != to {
            leaving.entry(owner).or_default().push(slot);
        }
    }
    leaving
}

/// The group map of one serving group 0.
pub struct Groups {
    store: Arc<dyn MetaStore>,
    /// Held across a change's read and write: two changes never start from the same version.
    changing: Mutex<()>,
    /// What the leader's last round of questions found wrong with each group other than 0 (no
    /// leader, no majority, replicas not answering; `service/groups.rs`): absent while a group
    /// is well. Health reports read it, so they never wait on other groups.
    health: Mutex<BTreeMap<u32, String>>,
    /// Each other group's repair as its leader last reported it (the same round).
    repairs: Mutex<BTreeMap<u32, cairn_proto::GroupRepair>>,
    /// The slots' owners as last read or written: every request's slot check reads them. Only
    /// the serving leader (or lone metaserver) writes the map, through [`Groups::write`].
    owners: RwLock<Arc<Owners>>,
}

/// Which group owns each slot, and the map version that says so.
#[derive(Default)]
struct Owners {
    version: u64,
    /// Empty: every slot is group 0's.
    slots: Vec<u32>,
    /// Where slots that left a group other than 0 had been numbered up to.
    floors: BTreeMap<u32, u64>,
    /// New directories spread over the groups (`GroupMap.spread_dirs`).
    spread_dirs: bool,
}

impl Owners {
    fn of(map: &GroupMap) -> Arc<Owners> {
        let slots = if map.slots.iter().all(|g| *g == 0) { Vec::new() } else { map.slots.clone() };
        Arc::new(Owners {
            version: map.version,
            slots,
            floors: map.floors.clone(),
            spread_dirs: map.spread_dirs,
        })
    }
}

impl Groups {
    pub fn open(store: Arc<dyn MetaStore>) -> Result<Groups> {
        let groups = Groups {
            store,
            changing: Mutex::new(()),
            health: Mutex::new(BTreeMap::new()),
            repairs: Mutex::new(BTreeMap::new()),
            owners: RwLock::new(Arc::default()),
        };
        *groups.owners.write() = Owners::of(&groups.map()?);
        Ok(groups)
    }

    /// Open the map a group other than 0 holds, for one leadership of it: with the
    /// leadership's namespace epoch, raised and written (durably) here, which its `Fence`
    /// messages carry to chunkservers.
    pub fn open_leadership(store: Arc<dyn MetaStore>) -> Result<(Groups, u64)> {
        let mut batch = Batch::new();
        let epoch = crate::namespace::next_epoch(&*store, &mut batch)?;
        batch.set_durable();
        store.write(batch)?;
        Ok((Groups::open(store)?, epoch))
    }

    /// The store the map is kept in: a leadership's namespace opens over the same one (a
    /// replica's next store retires the earlier ones).
    pub fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    /// The cluster id this group holds (group 0's, once shared), if any.
    pub fn cluster_id(&self) -> Result<Option<String>> {
        let id = self.store.get(Cf::Counters, schema::counter::CLUSTER_ID)?;
        Ok(id.map(|id| String::from_utf8_lossy(&id).into_owned()))
    }

    /// The version of the map held.
    pub fn version(&self) -> u64 {
        self.owners.read().version
    }

    /// Keep `map`, shared by group 0's leader with this group (one other than 0), and the
    /// cluster's identity: written (one durable write, with the id the first time) only when
    /// it differs from the map held and its version is not older, so what a group holds never
    /// goes back. A map of another cluster than the one this group holds is refused. Answers
    /// the map held after.
    pub fn adopt(&self, map: GroupMap, cluster_id: &str) -> Result<GroupMap> {
        if !cairn_common::ids::is_id(cluster_id) {
            return Err(CairnError::invalid(format!("{cluster_id:?} is not a cluster id (32 hex digits)")));
        }
        if !(map.slots.is_empty() || map.slots.len() == SLOTS) || map.slots.iter().any(|g| *g >= MAX_GROUPS) {
            return Err(CairnError::invalid(format!(
                "a group map names {} slots (or none), each a group below {MAX_GROUPS}",
                SLOTS
            )));
        }
        let _changing = self.changing.lock();
        let held_id = self.store.get(Cf::Counters, schema::counter::CLUSTER_ID)?;
        if let Some(held) = held_id.as_deref().filter(|held| *held != cluster_id.as_bytes()) {
            return Err(CairnError::invalid(format!(
                "this metadata group belongs to cluster {}, and the group map offered is of cluster {cluster_id}",
                String::from_utf8_lossy(held)
            )));
        }
        let held = self.map()?;
        // The same version may come with other replicas of group 0 (its Raft membership, not
        // part of the versioned record, changed): kept, so this group can still reach it.
        if map.version < held.version || map == held {
            return Ok(held);
        }
        let mut batch = Batch::new();
        batch.put(Cf::Counters, KEY, schema::encode(&map));
        if held_id.is_none() {
            batch.put(Cf::Counters, schema::counter::CLUSTER_ID, cluster_id.as_bytes().to_vec());
        }
        batch.set_durable();
        self.store.write(batch)?;
        *self.owners.write() = Owners::of(&map);
        Ok(map)
    }

    /// The first number a new owner of `slot` may hand out there (0: anything of the slot):
    /// where the groups it left had numbered it up to.
    pub fn floor(&self, slot: u32) -> u64 {
        self.owners.read().floors.get(&slot).copied().unwrap_or(0)
    }

    /// The slots `group` owns, in order.
    pub fn slots_of(&self, group: u32) -> Vec<u32> {
        let owners = self.owners.read();
        if owners.slots.is_empty() {
            return if group == 0 { (0..SLOTS as u32).collect() } else { Vec::new() };
        }
        (0..SLOTS as u32).filter(|s| owners.slots[*s as usize] == group).collect()
    }

    /// The group owning inode `ino`'s slot, and the map version that says so.
    pub fn owner_of(&self, ino: u64) -> (u32, u64) {
        let owners = self.owners.read();
        let slot = cairn_common::ids::slot_of(ino) as usize;
        (owners.slots.get(slot).copied().unwrap_or(0), owners.version)
    }

    /// Give `slots` to `to` (0 or a group of the map), answering the map and whether it
    /// changed. Only empty slots move (`docs/ARCHITECTURE.md`, "Several metadata groups":
    /// moving a slot's records is not built): `holds(slot)` says whether group 0 has records in
    /// one of its slots. Slots of another group move only as `promised` (that group's promise to
    /// number nothing more in them, given once they held nothing, under this map's version),
    /// and keep, as their floor, where that group had numbered them up to. Slot 0 holds the
    /// root and every inode made so far and never moves. Slots already `to`'s are left as they
    /// are.
    pub fn move_empty_slots(
        &self,
        slots: &[u32],
        to: u32,
        promised: Option<&Promised>,
        holds: impl Fn(u32) -> Result<bool>,
    ) -> Result<(GroupMap, bool)> {
        let _changing = self.changing.lock();
        let mut map = self.map()?;
        check_move(&map, slots, to, holds)?;
        // Slots of other groups move only under the map their owners promised them under, and
        // only those: what is leaving is read from this map, under this lock.
        let leaving = leaving(&map, slots, to);
        let floors = promised.map(|p| p.reserved_ends.clone()).unwrap_or_default();
        let kept = |p: &Promised| p.version == map.version && p.slots == leaving;
        if !leaving.is_empty() && !promised.is_some_and(kept) {
            return Err(CairnError::new(
                ErrorKind::Interrupted,
                format!(
                    "the group map is at version {}, and the groups giving up slots promised under another: ask them again",
                    map.version
                ),
            ));
        }
        let mut owners = if map.slots.is_empty() { vec![0; SLOTS] } else { map.slots.clone() };
        let mut changed = false;
        for &slot in slots {
            let owner = &mut owners[slot as usize];
            changed |= *owner != to;
            *owner = to;
        }
        if !changed {
            return Ok((map, false));
        }
        // The next owner of a slot leaving a group numbers from where that group had reserved.
        for slot in leaving.values().flatten() {
            if let Some(end) = floors.get(slot).copied().filter(|end| *end > 0) {
                let floor = map.floors.entry(*slot).or_default();
                *floor = (*floor).max(end);
            }
        }
        map.slots = if owners.iter().all(|g| *g == 0) { Vec::new() } else { owners };
        Ok((self.write(map)?, true))
    }

    /// Turn the spreading of new directories over the groups on or off: one map change (none
    /// when it already is so). Answers the map and whether it changed.
    pub fn set_spread_dirs(&self, on: bool) -> Result<(GroupMap, bool)> {
        let _changing = self.changing.lock();
        let mut map = self.map()?;
        if map.spread_dirs == on {
            return Ok((map, false));
        }
        map.spread_dirs = on;
        Ok((self.write(map)?, true))
    }

    /// The group a new directory `name` under `parent` goes to: the parent's group (`own`)
    /// unless the map spreads directories; then the owner of a slot picked by a hash of both,
    /// so each group gets a share of new directories in proportion to its slots.
    pub fn dir_group(&self, own: u32, parent: u64, name: &[u8]) -> u32 {
        let owners = self.owners.read();
        if !owners.spread_dirs || owners.slots.is_empty() {
            return own;
        }
        // FNV-1a, seeded apart from the hash a group picks its own slot with (`inos.rs`).
        let pick = [b'd']
            .iter()
            .chain(&parent.to_be_bytes())
            .chain(name)
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
        owners.slots[(pick % SLOTS as u64) as usize]
    }

    /// Keep what the latest round of questions found wrong, by group.
    pub fn set_health(&self, problems: BTreeMap<u32, String>) {
        *self.health.lock() = problems;
    }

    /// What each group's leader last said of its repair (a group without a leader keeps its
    /// last report until it has one again).
    pub fn set_repairs(&self, repairs: BTreeMap<u32, cairn_proto::GroupRepair>) {
        let mut held = self.repairs.lock();
        held.extend(repairs);
    }

    /// The repairs of the groups still in the map, as last reported (`None`: not yet).
    pub fn repairs(&self) -> Result<Vec<(u32, Option<cairn_proto::GroupRepair>)>> {
        let map = self.map()?;
        let held = self.repairs.lock();
        Ok(map.groups.iter().map(|g| (g.group, held.get(&g.group).cloned())).collect())
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
        *self.owners.write() = Owners::of(&map);
        Ok(map)
    }
}

/// Map versions a restore of group 0 skips: more than the lost changes since the backup can
/// have handed out, so no version other groups or chunkservers hold comes back with other
/// contents.
pub const RESTORE_VERSION_GAP: u64 = 1 << 20;

/// Prepare group 0's map just restored from a backup (in `store`, not serving): its version
/// jumps by [`RESTORE_VERSION_GAP`], so the next map it shares is newer than any the lost
/// changes handed out. Nothing is written when it has no map.
pub fn prepare_restored(store: &dyn MetaStore, batch: &mut Batch) -> Result<()> {
    let Some(bytes) = store.get(Cf::Counters, KEY)? else { return Ok(()) };
    let mut map: GroupMap = schema::decode("group map", &bytes)?;
    map.version += RESTORE_VERSION_GAP;
    batch.put(Cf::Counters, KEY, schema::encode(&map));
    Ok(())
}

/// A group other than 0 restored from a backup forgets the map it held then (put in `batch`):
/// slots may have moved since, and it must not number in one it no longer owns. It serves its
/// slots again once group 0's leader shares the current map (within 5 s); its cluster id stays.
pub fn forget_on_restore(batch: &mut Batch) {
    batch.delete(Cf::Counters, KEY);
}

/// fsck's check of the map against the data (`CheckNamespace`): every slot the map gives to
/// another group must hold no records in `store` (group 0's). One problem per slot that does;
/// none is repaired (nothing here moves a slot's records).
pub fn misplaced_slots(groups: &Groups, store: &dyn MetaStore) -> Result<Vec<String>> {
    let map = groups.map()?;
    let mut problems = Vec::new();
    for slot in 0..SLOTS {
        let group = owner(&map, slot);
        if group != 0 && slot_holds_records(store, slot as u32)? {
            problems.push(format!(
                "namespace slot {slot} holds records in metadata group 0, and the group map (version {}) gives it to group {group}: they cannot be reached (not repaired)",
                map.version
            ));
        }
    }
    Ok(problems)
}

/// Whether `store` (group 0's) has any record of an inode in `slot`: every column family keyed
/// by an inode number first, over the slot's range of numbers.
pub fn slot_holds_records(store: &dyn MetaStore, slot: u32) -> Result<bool> {
    let shift = cairn_common::ids::SLOT_SHIFT;
    let start = (slot as u64) << shift;
    let end = schema::prefix_end(start | ((1u64 << shift) - 1));
    for cf in [Cf::Inodes, Cf::Dentries, Cf::Xattrs, Cf::Symlinks, Cf::Stripes, Cf::Orphans] {
        if !store.scan(cf, &schema::ino_key(start), &end, 1)?.is_empty() {
            return Ok(true);
        }
    }
    // A directory prepared for another group's mkdir and not yet decided (`txn.rs`): its inode
    // is in its record until then.
    for (_, value) in store.scan(Cf::Txns, &[], &[], usize::MAX)? {
        let record: schema::TxnRecord = schema::decode("transaction", &value)?;
        if record.role == schema::TXN_PARTICIPANT
            && record.inode.is_some_and(|i| cairn_common::ids::slot_of(i.ino) == slot)
        {
            return Ok(true);
        }
    }
    Ok(false)
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
        let groups = Groups::open(store.clone()).unwrap();
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
        assert_eq!(Groups::open(store.clone()).unwrap().map().unwrap(), map);

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

    #[test]
    fn only_empty_slots_move_and_each_move_raises_the_version_and_the_owners_requests_read() {
        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let groups = Groups::open(store.clone()).unwrap();
        let zero = vec!["1=10.0.0.1:9400".to_string()];
        groups.add(&group(1, &["10.0.1.1:9400"]), &zero).unwrap();
        groups.add(&group(2, &["10.0.2.1:9400"]), &zero).unwrap();
        let in_slot = |slot: u64, n: u64| (slot << cairn_common::ids::SLOT_SHIFT) | n;
        assert_eq!(groups.owner_of(in_slot(5, 1)), (0, 2));

        // Group 0 has an inode in slot 9 and an xattr of one in the last slot.
        let mut batch = Batch::new();
        batch.put(Cf::Inodes, schema::ino_key(in_slot(9, 77)), b"x".to_vec());
        batch.put(Cf::Xattrs, schema::xattr_key(in_slot(4095, 3), b"user.a"), b"x".to_vec());
        store.write(batch).unwrap();
        let holds = |slot| slot_holds_records(&*store, slot);
        assert!(holds(9).unwrap() && holds(4095).unwrap());
        assert!(!holds(8).unwrap() && !holds(10).unwrap() && !holds(4094).unwrap());

        let (map, changed) = groups.move_empty_slots(&[5, 6, 7, 8], 1, None, holds).unwrap();
        assert!(changed);
        assert_eq!((map.version, owner(&map, 5), owner(&map, 8), owner(&map, 9)), (3, 1, 1, 0));
        assert_eq!(groups.owner_of(in_slot(5, 1)), (1, 3));
        assert_eq!(groups.owner_of(in_slot(0, 1)), (0, 3));
        // Again (an answer lost): nothing changes.
        assert_eq!(groups.move_empty_slots(&[5, 6], 1, None, holds).unwrap(), (map.clone(), false));

        for (slots, to, kind) in [
            (vec![9], 1, ErrorKind::NotEmpty),
            (vec![4095], 2, ErrorKind::NotEmpty),
            (vec![0], 1, ErrorKind::InvalidArgument),
            (vec![4096], 1, ErrorKind::InvalidArgument),
            (vec![], 1, ErrorKind::InvalidArgument),
            (vec![10], 3, ErrorKind::NotFound),
        ] {
            let e = groups.move_empty_slots(&slots, to, None, holds).unwrap_err();
            assert_eq!(e.kind(), kind, "{slots:?} to {to}: {e}");
        }
        // A refused move changes none of its slots, also those before the refused one.
        let e = groups.move_empty_slots(&[10, 9], 2, None, holds).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotEmpty);
        assert_eq!(groups.map().unwrap(), map);

        // From one group to another, and back to 0, each under the map version its owners
        // promised them under; a group owning slots stays in the map.
        assert_eq!(leaving(&map, &[5, 7, 9], 2), BTreeMap::from([(1, vec![5, 7])]));
        let promised = |version, slots: &[u32]| Promised {
            version,
            slots: BTreeMap::from([(1, slots.to_vec())]),
            reserved_ends: slots.iter().map(|s| (*s, in_slot(u64::from(*s), 1000))).collect(),
        };
        for wrong in [None, Some(promised(2, &[7, 8])), Some(promised(3, &[7]))] {
            let e = groups.move_empty_slots(&[7, 8], 2, wrong.as_ref(), holds).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Interrupted, "{wrong:?}: {e}");
        }
        let (map, _) = groups.move_empty_slots(&[7, 8], 2, Some(&promised(3, &[7, 8])), holds).unwrap();
        assert_eq!(slot_counts(&map), BTreeMap::from([(0, SLOTS - 4), (1, 2), (2, 2)]));
        assert_eq!(groups.remove(2).unwrap_err().kind(), ErrorKind::NotEmpty);
        assert_eq!(
            (groups.floor(7), groups.floor(8), groups.floor(5)),
            (in_slot(7, 1000), in_slot(8, 1000), 0)
        );
        let back = Promised {
            version: 4,
            slots: BTreeMap::from([(1, vec![5, 6]), (2, vec![7, 8])]),
            reserved_ends: BTreeMap::from([(7, in_slot(7, 10)), (8, in_slot(8, 2000))]),
        };
        let (map, _) = groups.move_empty_slots(&[5, 6, 7, 8], 0, Some(&back), holds).unwrap();
        assert!(map.slots.is_empty(), "every slot group 0's again is stored as no list");
        assert_eq!(groups.floor(7), in_slot(7, 1000), "floors only rise");
        assert_eq!(groups.floor(8), in_slot(8, 2000));
        assert_eq!((groups.owner_of(in_slot(7, 1)), map.version), ((0, 5), 5));
        // A new leadership reads the owners from the store.
        groups.move_empty_slots(&[100], 2, None, holds).unwrap();
        assert_eq!(Groups::open(store.clone()).unwrap().owner_of(in_slot(100, 9)), (2, 6));

        // fsck: records in a slot given away (planted here: a move refuses such a slot) are a
        // problem; those in group 0's own slots are not.
        assert!(misplaced_slots(&groups, &*store).unwrap().is_empty());
        let mut batch = Batch::new();
        batch.put(Cf::Stripes, schema::stripe_key(in_slot(100, 4), 0), b"x".to_vec());
        store.write(batch).unwrap();
        let found = misplaced_slots(&groups, &*store).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("namespace slot 100 holds records in metadata group 0"), "{found:?}");
        assert!(found[0].contains("gives it to group 2"), "{found:?}");
    }

    #[test]
    fn another_group_keeps_the_newest_map_it_is_shared_and_only_its_clusters() {
        let zero: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let group0 = Groups::open(zero.clone()).unwrap();
        group0.add(&group(1, &["10.0.1.1:9400"]), &["1=10.0.0.1:9400".to_string()]).unwrap();
        let (moved, _) = group0.move_empty_slots(&[3, 4], 1, None, |_| Ok(false)).unwrap();
        let id = "0123456789abcdef0123456789abcdef";

        let store: Arc<dyn MetaStore> = Arc::new(MemoryStore::new());
        let one = Groups::open(store.clone()).unwrap();
        let in_slot_3 = 3 << cairn_common::ids::SLOT_SHIFT;
        assert_eq!((one.version(), one.owner_of(in_slot_3)), (0, (0, 0)));
        assert_eq!(one.adopt(moved.clone(), id).unwrap(), moved);
        assert_eq!(one.owner_of(in_slot_3), (1, 2));
        let cluster_id = store.get(Cf::Counters, schema::counter::CLUSTER_ID).unwrap();
        assert_eq!(cluster_id.as_deref(), Some(id.as_bytes()));
        // An older map (a deposed leader of group 0, a message overtaken) changes nothing.
        let older = GroupMap { version: 1, ..moved.clone() };
        assert_eq!(one.adopt(older, id).unwrap(), moved);
        // The same version with group 0's replicas changed (they are not part of the version).
        let mut moved = moved;
        moved.groups.insert(0, group(0, &["10.0.0.9:9400"]));
        assert_eq!(one.adopt(moved.clone(), id).unwrap(), moved);
        assert_eq!(one.map().unwrap(), moved);

        // Group 0 restored from a backup: its map's version jumps past any handed out since.
        let mut batch = Batch::new();
        prepare_restored(&*zero, &mut batch).unwrap();
        zero.write(batch).unwrap();
        let restored = Groups::open(zero.clone()).unwrap().map().unwrap();
        assert_eq!(restored.version, 2 + RESTORE_VERSION_GAP);
        let mut batch = Batch::new();
        prepare_restored(&*Arc::new(MemoryStore::new()), &mut batch).unwrap();
        assert!(batch.is_empty(), "no map, nothing to raise");
        // Another cluster's map, or a malformed one, is refused.
        let newer = GroupMap { version: 9, ..moved.clone() };
        let e = one.adopt(newer.clone(), "ffffffffffffffffffffffffffffffff").unwrap_err();
        assert!(e.message().contains("belongs to cluster 0123"), "{e}");
        for bad_id in ["", "xyz", "0123456789abcdef0123456789abcdeg"] {
            assert!(one.adopt(newer.clone(), bad_id).is_err(), "{bad_id:?}");
        }
        let short = GroupMap { slots: vec![1; 10], ..newer.clone() };
        assert!(one.adopt(short, id).is_err());
        assert_eq!(Groups::open(store).unwrap().map().unwrap(), moved, "kept, and nothing else");
    }
}

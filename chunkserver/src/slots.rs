//! Which metadata group owns each namespace slot (an inode number's top 12 bits), as group 0's
//! group map says (`docs/ARCHITECTURE.md`, "Several metadata groups"): a group's capabilities
//! and deletes count only for inodes in its own slots. Kept in memory, fetched from group 0
//! when a heartbeat reply names a newer map version than the one held; until the first fetch
//! every slot is group 0's, which refuses nothing group 0 may do and everything of another
//! group.

use cairn_common::ids::slot_of;
use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto::GroupMap;
use parking_lot::RwLock;

#[derive(Default)]
pub struct Slots {
    /// The map version held and the owners in slot order (empty: every slot is group 0's).
    owners: RwLock<(u64, Vec<u32>)>,
    /// Heartbeats that confirmed the map held is group 0's current one (or fetched it).
    confirmed: std::sync::atomic::AtomicU64,
}

impl Slots {
    /// How many heartbeats confirmed the map so far.
    pub fn confirmations(&self) -> u64 {
        self.confirmed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A heartbeat found the map held current (after fetching a newer one where it was not).
    pub fn confirm(&self) {
        self.confirmed.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// The version of the map held (0 before the first).
    pub fn version(&self) -> u64 {
        self.owners.read().0
    }

    /// Keep `map` if it is newer than the one held.
    pub fn update(&self, map: &GroupMap) {
        let mut owners = self.owners.write();
        if map.version > owners.0 {
            *owners = (map.version, map.slots.clone());
            tracing::info!(version = map.version, "learned the group map");
        }
    }

    /// The group owning inode `ino`'s slot.
    pub fn owner(&self, ino: u64) -> u32 {
        self.owners.read().1.get(slot_of(ino) as usize).copied().unwrap_or(0)
    }

    /// Refuse `what` (a delete or capability of metadata group `group`) for inode `ino` when
    /// `ino`'s slot is another group's.
    pub fn check(&self, group: u32, ino: u64, what: &str) -> Result<()> {
        let owner = self.owner(ino);
        if owner == group {
            return Ok(());
        }
        Err(CairnError::new(
            ErrorKind::PermissionDenied,
            format!(
                "{what} of inode {ino} from metadata group {group} refused: its namespace slot {} is \
                 group {owner}'s (group map version {})",
                slot_of(ino),
                self.version()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_may_act_only_on_inodes_in_its_slots_and_maps_only_go_forward() {
        let slots = Slots::default();
        let in_slot = |slot: u64| (slot << cairn_common::ids::SLOT_SHIFT) | 9;
        assert_eq!(slots.owner(in_slot(5)), 0);
        slots.check(0, in_slot(5), "delete").unwrap();
        let e = slots.check(1, in_slot(5), "delete").unwrap_err();
        assert!(e.message().contains("slot 5 is group 0's (group map version 0)"), "{e}");
        let mut owners = vec![0; 4096];
        owners[5] = 1;
        slots.update(&GroupMap { version: 3, slots: owners, ..Default::default() });
        slots.check(1, in_slot(5), "delete").unwrap();
        assert_eq!(slots.check(0, in_slot(5), "delete").unwrap_err().kind(), ErrorKind::PermissionDenied);
        slots.check(0, in_slot(0), "delete").unwrap();
        // An older map (an answer overtaken) changes nothing.
        slots.update(&GroupMap { version: 2, ..Default::default() });
        assert_eq!((slots.version(), slots.owner(in_slot(5))), (3, 1));
    }
}

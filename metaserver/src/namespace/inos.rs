//! Handing out inode numbers (`docs/ARCHITECTURE.md`, "Numbering in a group other than 0, and slots leaving it").
//!
//! Each namespace slot has a counter of its own: numbers are handed out from blocks reserved
//! (durably) in the group's counters before use, and the next block is reserved in the
//! background once half of the current one is handed out, so no change waits for that write
//! while it holds its locks. Group 0 numbers in slot 0 only (`counters/ino_reserved`, as
//! before slots existed); another group in the slots its map gives it (`ino_reserved/<slot>`),
//! except those it promised to give up ([`Slots::release`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_common::ids::{slot_of, SLOT_SHIFT};
use cairn_common::{CairnError, ErrorKind, Result};
use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};

use crate::groups::Groups;
use crate::schema::{self, counter, read_counter, Counter};
use crate::store::{Batch, Cf, Change, MetaStore};

/// Inode numbers reserved per counter write.
pub(super) const INO_BLOCK: u64 = 1024;

/// The key of the slots a group promised group 0 to give up (`slot u32 ‖ map version u64`,
/// big-endian, each; not a `Counter`).
const RELEASING: &[u8] = b"slots_releasing";

/// The prefix of the slots' counters other than slot 0's (`ino_reserved/<slot>`).
const SLOT_PREFIX: &[u8] = b"ino_reserved/";
/// How far restores moved the first number of a slot not yet numbered in.
const SLOT_GAP: &[u8] = b"ino_slot_gap";

fn slot_key(slot: u32) -> Vec<u8> {
    [SLOT_PREFIX, slot.to_string().as_bytes()].concat()
}

/// A restored group numbers `gap` on in every slot (what the changes lost after the backup
/// handed out is never handed out again), put in `batch`: each counter kept moves on, and a
/// slot not yet numbered in starts `gap` later. Answers the ranges skipped in the slots with
/// counters.
pub(super) fn prepare_restored(
    store: &dyn MetaStore,
    batch: &mut Batch,
    gap: u64,
) -> Result<Vec<(u64, u64)>> {
    let mut skipped = Vec::new();
    let end = [SLOT_PREFIX, &[0xff]].concat();
    for (key, value) in store.scan(Cf::Counters, SLOT_PREFIX, &end, usize::MAX)? {
        let from = schema::decode::<Counter>("counter", &value)?.value;
        let to = from.saturating_add(gap);
        batch.put(Cf::Counters, key, schema::encode(&Counter { value: to }));
        skipped.push((from, to));
    }
    let moved = read_counter(store, SLOT_GAP)?.unwrap_or(0).saturating_add(gap);
    batch.put(Cf::Counters, SLOT_GAP, schema::encode(&Counter { value: moved }));
    Ok(skipped)
}

/// How far ahead of the map a group holds a promise's version may be.
const MAX_VERSION_AHEAD: u64 = 1 << 21;

/// The first number of slot `slot` (not 0) that this group's store has not reserved: its
/// counter, or the slot's first number past the gaps restores left, and at least `floor`.
fn first_free(store: &dyn MetaStore, slot: u32, floor: u64) -> Result<u64> {
    let gap = read_counter(store, SLOT_GAP)?.unwrap_or(0);
    let first = (((u64::from(slot) << SLOT_SHIFT) | 1) + gap).max(floor);
    Ok(read_counter(store, &slot_key(slot))?.unwrap_or(first).max(first))
}

/// The counter of one slot.
pub(super) struct Inos {
    /// Where its reserved end is kept.
    key: Vec<u8>,
    slot: u32,
    alloc: Mutex<InoAlloc>,
    /// Signalled when a background reservation ends.
    reserved: Condvar,
}

struct InoAlloc {
    next: u64,
    reserved_end: u64,
    /// A reservation of the next block is being written in the background.
    reserving: bool,
}

/// Reserve inode numbers up to `end` under `key` (durable before any of them is handed out:
/// numbers never repeat, also across restarts).
fn reserve(store: &dyn MetaStore, key: &[u8], end: u64) -> Result<()> {
    let mut batch = Batch::new();
    batch.put(Cf::Counters, key, schema::encode(&Counter { value: end }));
    batch.set_durable();
    store.write(batch)
}

impl Inos {
    /// Slot 0's counter, handing out `next` onwards with numbers up to `reserved_end` reserved.
    pub(super) fn slot_zero(next: u64, reserved_end: u64) -> Arc<Inos> {
        Inos::new(counter::INO_RESERVED.to_vec(), 0, next, reserved_end)
    }

    /// A counter of other numbers handed out the same way (kept under `key`, from `next` on),
    /// such as transaction sequences: below 2^52.
    pub(super) fn counter(key: Vec<u8>, next: u64) -> Arc<Inos> {
        Inos::new(key, 0, next, next)
    }

    fn new(key: Vec<u8>, slot: u32, next: u64, reserved_end: u64) -> Arc<Inos> {
        Arc::new(Inos {
            key,
            slot,
            alloc: Mutex::new(InoAlloc { next, reserved_end, reserving: false }),
            reserved: Condvar::new(),
        })
    }

    /// The counter of slot `slot` (not 0) as `store` keeps it: numbers from the reserved end
    /// on (those below may have been handed out), from the slot's first number the first time —
    /// past the gaps restores left ([`prepare_restored`]) and the `floor` where the groups the
    /// slot left had numbered it up to (the group map's).
    fn open(store: &dyn MetaStore, slot: u32, floor: u64) -> Result<Arc<Inos>> {
        let next = first_free(store, slot, floor)?;
        Ok(Inos::new(slot_key(slot), slot, next, next))
    }

    /// Hand out nothing below `floor` (a slot that came back with the floor another group left).
    fn raise_to(&self, floor: u64) {
        let mut a = self.alloc.lock();
        // At or past the reserved end, the next number reserves a block from there.
        a.next = a.next.max(floor);
    }

    /// The end of the reserved numbers: none from here on was handed out.
    pub(super) fn reserved_end(&self) -> u64 {
        self.alloc.lock().reserved_end
    }

    /// A new inode number of this slot, never handed out before (also across restarts).
    pub(super) fn next(self: &Arc<Self>, store: &Arc<dyn MetaStore>) -> Result<u64> {
        let mut a = self.alloc.lock();
        while a.next >= a.reserved_end {
            if a.reserving {
                self.reserved.wait(&mut a);
                continue;
            }
            // The block ran out before the next one was reserved (the background write
            // failed, or is slower than the creates, or this is the slot's first): reserve here.
            let end = a
                .next
                .checked_add(INO_BLOCK)
                .ok_or_else(|| CairnError::new(ErrorKind::NoSpace, "no inode numbers left"))?;
            reserve(&**store, &self.key, end)?;
            a.reserved_end = end;
        }
        let ino = a.next;
        // Past a slot's numbers a number would name the next slot, held by whichever group
        // owns it.
        if slot_of(ino) != self.slot {
            return Err(CairnError::new(
                ErrorKind::NoSpace,
                format!("no inode numbers left: namespace slot {}'s 2^52 are used up", self.slot),
            ));
        }
        a.next += 1;
        if !a.reserving && a.reserved_end - a.next <= INO_BLOCK / 2 {
            if let Some(end) = a.reserved_end.checked_add(INO_BLOCK) {
                a.reserving = true;
                let (inos, store) = (self.clone(), store.clone());
                let started = std::thread::Builder::new().name("ino-reserve".into()).spawn(move || {
                    let written = reserve(&*store, &inos.key, end);
                    let mut a = inos.alloc.lock();
                    a.reserving = false;
                    match written {
                        // Only ever up: nothing else reserves while this one runs.
                        Ok(()) => a.reserved_end = a.reserved_end.max(end),
                        Err(e) => tracing::warn!("reserving inode numbers ahead: {e} (reserved when needed)"),
                    }
                    inos.reserved.notify_all();
                });
                if started.is_err() {
                    a.reserving = false;
                }
            }
        }
        Ok(ino)
    }
}

/// The slots a group other than 0 numbers new inodes in: those its map gives it, less those
/// it promised to give up.
pub(super) struct Slots {
    group: u32,
    /// The map this group's leader holds (group 0 shares every change).
    map: Arc<Groups>,
    counters: Mutex<BTreeMap<u32, Arc<Inos>>>,
    /// Shared by every change that numbers an inode here, from choosing the number until its
    /// write is proposed; taken whole by a promise to give slots up, so none is in flight.
    gate: RwLock<()>,
    /// Slots promised to group 0, each with the map version the promise was made under: in
    /// force while the map held is not newer (a newer map either moved the slot or was made
    /// without this promise, which group 0 then asks for again).
    releasing: Mutex<BTreeMap<u32, u64>>,
}

/// A number chosen for a new inode, and the gate held until its change is proposed.
pub(super) struct Numbered<'a> {
    pub ino: u64,
    _gate: Option<RwLockReadGuard<'a, ()>>,
}

impl Numbered<'_> {
    /// A number of slot 0, whose slot never moves: no gate.
    pub(super) fn ungated(ino: u64) -> Numbered<'static> {
        Numbered { ino, _gate: None }
    }
}

impl Slots {
    pub(super) fn open(store: &dyn MetaStore, group: u32, map: Arc<Groups>) -> Result<Slots> {
        let raw = store.get(Cf::Counters, RELEASING)?.unwrap_or_default();
        if raw.len() % 12 != 0 {
            return Err(CairnError::corrupt(format!(
                "counters/{} is not a list of (slot, version): the metadata is damaged",
                String::from_utf8_lossy(RELEASING)
            )));
        }
        let releasing = raw
            .chunks(12)
            .map(|c| {
                (
                    u32::from_be_bytes(c[..4].try_into().unwrap()),
                    u64::from_be_bytes(c[4..].try_into().unwrap()),
                )
            })
            .collect();
        Ok(Slots {
            group,
            map,
            counters: Mutex::new(BTreeMap::new()),
            gate: RwLock::new(()),
            releasing: Mutex::new(releasing),
        })
    }

    /// The group map these slots are numbered by.
    pub(super) fn map(&self) -> &Arc<Groups> {
        &self.map
    }

    /// The slots new inodes may go to now.
    fn open_slots(&self) -> Vec<u32> {
        let held = self.map.version();
        let releasing = self.releasing.lock();
        let in_force = |slot: &u32| releasing.get(slot).is_some_and(|promised| held <= *promised);
        self.map.slots_of(self.group).into_iter().filter(|s| !in_force(s)).collect()
    }

    /// A number for a new inode under `parent` named `name`: a directory in one of this
    /// group's open slots chosen by a hash of both (a group's directories spread over its
    /// slots), anything else in its parent's slot.
    pub(super) fn number(
        &self,
        store: &Arc<dyn MetaStore>,
        parent: u64,
        name: &[u8],
        is_dir: bool,
    ) -> Result<Numbered<'_>> {
        let gate = self.gate.read();
        let open = self.open_slots();
        let slot = if is_dir {
            if open.is_empty() {
                return Err(CairnError::new(
                    ErrorKind::NoSpace,
                    format!("metadata group {} owns no namespace slots to create in", self.group),
                ));
            }
            // FNV-1a: any spread will do (the leader picks before proposing; nothing recomputes it).
            let pick =
                parent.to_be_bytes().iter().chain(name).fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
                });
            open[(pick % open.len() as u64) as usize]
        } else {
            let slot = slot_of(parent);
            if !open.contains(&slot) {
                return Err(CairnError::wrong_group(
                    format!("namespace slot {slot} is leaving metadata group {}", self.group),
                    self.map.version(),
                ));
            }
            slot
        };
        let floor = self.map.floor(slot);
        let inos = {
            let mut counters = self.counters.lock();
            match counters.get(&slot) {
                Some(inos) => inos.clone(),
                None => counters.entry(slot).or_insert(Inos::open(&**store, slot, floor)?).clone(),
            }
        };
        inos.raise_to(floor);
        Ok(Numbered { ino: inos.next(store)?, _gate: Some(gate) })
    }

    /// Promise group 0, whose map is at `version`, to number nothing more in `slots` — once no
    /// change numbering here is in flight and none of them holds a record (read through what
    /// this leader proposed and has not applied): `NotEmpty` otherwise, and nothing promised.
    /// One durable write. Group 0 then moves them only while its map is still at `version`.
    /// Answers, for each slot, the first number this group had not reserved there (0: none),
    /// which the map keeps so a later owner never hands out a number twice.
    pub(super) fn release(&self, store: &dyn MetaStore, slots: &[u32], version: u64) -> Result<Vec<u64>> {
        if let Some(bad) = slots.iter().find(|s| **s as usize >= crate::groups::SLOTS) {
            return Err(CairnError::invalid(format!(
                "namespace slot {bad}: slots are numbered 0 to {}",
                crate::groups::SLOTS - 1
            )));
        }
        let whole = self.gate.write();
        let held = self.map.version();
        if held > version {
            // Group 0 changed its map since it asked: it asks again under the new one.
            return Err(CairnError::new(
                ErrorKind::Interrupted,
                format!(
                    "group 0's map version {version} is older than the version {held} metadata group {} holds",
                    self.group
                ),
            ));
        }
        // A promise lasts until a newer map: one far ahead of what this group holds would keep
        // the slots from it for good (a restore of group 0 jumps 2^20 versions ahead).
        if version > held.saturating_add(MAX_VERSION_AHEAD) {
            return Err(CairnError::invalid(format!(
                "a promise under group map version {version}, far ahead of the version {held} metadata group {} holds",
                self.group
            )));
        }
        let change = Change::open(store);
        for &slot in slots {
            if crate::groups::slot_holds_records(store, slot)? {
                return Err(CairnError::new(
                    ErrorKind::NotEmpty,
                    format!(
                        "namespace slot {slot} holds records of metadata group {}: it cannot move",
                        self.group
                    ),
                ));
            }
        }
        let mut releasing = self.releasing.lock();
        let mut promised: BTreeMap<u32, u64> =
            releasing.iter().filter(|(_, v)| held <= **v).map(|(s, v)| (*s, *v)).collect();
        promised.extend(slots.iter().map(|s| (*s, version)));
        let mut raw = Vec::with_capacity(promised.len() * 12);
        for (slot, v) in &promised {
            raw.extend_from_slice(&slot.to_be_bytes());
            raw.extend_from_slice(&v.to_be_bytes());
        }
        let mut batch = Batch::new();
        batch.put(Cf::Counters, RELEASING, raw);
        batch.set_durable();
        store.write(batch)?;
        // Kept from the proposal on (should the commit fail, keeping it is the careful side);
        // the gate is let go before the wait for the commit, so creates do not wait for it.
        *releasing = promised;
        drop(releasing);
        // Where each slot was numbered up to (reserved here, or where numbering would start:
        // past restores' gaps and the floor the map gave it); its counter is dropped, so a
        // slot that comes back starts from its stored end and the map's floor.
        let mut counters = self.counters.lock();
        let ends = slots
            .iter()
            .map(|slot| {
                let cached = counters.remove(slot).map(|inos| inos.reserved_end()).unwrap_or(0);
                Ok(cached.max(first_free(store, *slot, self.map.floor(*slot))?))
            })
            .collect::<Result<Vec<u64>>>()?;
        drop(counters);
        drop(whole);
        change.close()?;
        Ok(ends)
    }
}

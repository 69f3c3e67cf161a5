//! Namespace consistency check (`cairn fsck`). Every operation is one atomic batch, so a crash
//! cannot leave the namespace half-changed; this check proves it after the fact, and repairs
//! what a bug or a damaged database could leave behind:
//!
//! - an entry whose parent is not a directory, or whose child inode is gone → entry removed;
//! - an entry whose recorded type differs from its inode's → entry rewritten;
//! - a regular file, symlink or special file whose link count differs from its entries → fixed;
//! - a directory whose link count is not 2 + its subdirectories, or whose parent pointer is not
//!   the directory holding its entry → fixed;
//! - a non-directory whose recorded name directories (`parent`, `links`) differ from the
//!   directories of its entries (or are unknown: made before they were tracked) → rewritten;
//! - an inode no entry names (and not an open unlinked file) → linked into `/lost+found` as
//!   `#INO`, so no data is thrown away;
//! - stripe records, xattrs or symlink targets of missing inodes, orphan marks of linked or
//!   missing inodes → removed;
//! - statistics counters that differ from the recount → rewritten.
//!
//! The scan reads the whole namespace into memory (a few dozen bytes per inode and entry). A
//! repair acts only on problems that two consecutive scans both found, so an operation that
//! ran between two reads of one scan is not mistaken for damage; it is meant for a quiet
//! cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cairn_common::{CairnError, Result, ROOT_INO};

use super::{stats_key, Namespace, NewEntry, STATS_SHARDS};
use crate::schema::{self, Dentry, Inode, Stats, S_IFDIR};
use crate::store::{Batch, Cf, StoreView};

/// Name of the directory that receives unreachable inodes.
pub const LOST_FOUND: &[u8] = b"lost+found";

/// One inconsistency, with what is needed to repair it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    EntryInNonDirectory {
        parent: u64,
        name: Vec<u8>,
    },
    DanglingEntry {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
    },
    EntryKind {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
        kind: u32,
    },
    LinkCount {
        ino: u64,
        nlink: u32,
        want: u32,
    },
    DirParent {
        ino: u64,
        parent: u64,
        want: u64,
    },
    /// `dirs`: as recorded (empty: unknown); `want`: from the entries; both sorted.
    NameDirs {
        ino: u64,
        dirs: Vec<u64>,
        want: Vec<u64>,
    },
    Unreachable {
        ino: u64,
    },
    StrayRecord {
        cf: &'static str,
        key: Vec<u8>,
    },
    Stats {
        stored: StatsView,
        counted: StatsView,
    },
}

/// Statistics as plain numbers (comparable, printable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct StatsView {
    pub files: i64,
    pub directories: i64,
    pub inodes: i64,
    pub logical_bytes: i64,
}

impl From<Stats> for StatsView {
    fn from(s: Stats) -> Self {
        StatsView {
            files: s.files,
            directories: s.directories,
            inodes: s.inodes,
            logical_bytes: s.logical_bytes,
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |n: &[u8]| String::from_utf8_lossy(n).into_owned();
        match self {
            Problem::EntryInNonDirectory { parent, name: n } => {
                write!(f, "entry {:?} is in inode {parent}, which is not a directory", name(n))
            }
            Problem::DanglingEntry { parent, name: n, ino } => {
                write!(f, "entry {:?} in directory {parent} names inode {ino}, which does not exist", name(n))
            }
            Problem::EntryKind { parent, name: n, ino, kind } => write!(
                f,
                "entry {:?} in directory {parent} records type {kind:o} for inode {ino} of another type",
                name(n)
            ),
            Problem::LinkCount { ino, nlink, want } => {
                write!(f, "inode {ino} has link count {nlink}, its entries say {want}")
            }
            Problem::DirParent { ino, parent, want } => {
                write!(f, "directory {ino} points to parent {parent}, but its entry is in {want}")
            }
            Problem::NameDirs { ino, dirs, want } if dirs.is_empty() => write!(
                f,
                "inode {ino} does not record the directories of its names (made before they were \
                 tracked; subtree-limited clients are refused it), its entries are in {want:?}"
            ),
            Problem::NameDirs { ino, dirs, want } => {
                write!(f, "inode {ino} records names in directories {dirs:?}, its entries are in {want:?}")
            }
            Problem::Unreachable { ino } => write!(f, "inode {ino} is not named by any entry"),
            Problem::StrayRecord { cf, key } => write!(f, "{cf} record {} has no inode", hex(key)),
            Problem::Stats { stored, counted } => {
                write!(f, "statistics say {stored:?}, the namespace holds {counted:?}")
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a check found (and, with repair, fixed).
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub inodes: u64,
    pub dentries: u64,
    pub stripes: u64,
    pub problems: Vec<Problem>,
    pub repaired: u64,
    /// Entries here naming an inode another metadata group holds: (parent, name, inode, the
    /// entry's file type).
    pub remote_entries: Vec<(u64, Vec<u8>, u64, u32)>,
    /// Directories here whose parent another metadata group holds: (inode, parent).
    pub away_dirs: Vec<(u64, u64)>,
    /// Names of files here in directories another metadata group holds, as each file lists
    /// them: (inode, directory), once per name.
    pub away_names: Vec<(u64, u64)>,
    /// Files a change across groups not finished here is changing (names, link counts): not
    /// matched across groups until every side has decided.
    pub changing: Vec<u64>,
}

impl Namespace {
    /// Check the whole namespace; with `repair`, fix what two consecutive scans both found.
    pub fn check(&self, repair: bool) -> Result<CheckReport> {
        let first = self.scan_problems()?;
        if !repair || first.problems.is_empty() {
            return Ok(first);
        }
        let second = self.scan_problems()?;
        let confirmed: Vec<Problem> =
            second.problems.iter().filter(|p| first.problems.contains(p)).cloned().collect();
        let mut repaired = 0;
        for problem in &confirmed {
            match self.repair_problem(problem) {
                Ok(()) => repaired += 1,
                Err(e) => tracing::warn!("fsck: cannot repair \"{problem}\": {e}"),
            }
        }
        tracing::warn!(found = first.problems.len(), repaired, "namespace check repaired problems");
        Ok(CheckReport { repaired, ..first })
    }

    /// What is wrong, read from one consistent view of the store: a change made during the
    /// scan (a create, a rename) cannot look like a dangling entry or a wrong link count.
    fn scan_problems(&self) -> Result<CheckReport> {
        let mut found = None;
        self.store.with_view(&mut |view| {
            found = Some(self.scan_problems_in(view)?);
            Ok(())
        })?;
        found.ok_or_else(|| CairnError::internal("namespace check: the view was never read"))
    }

    fn scan_problems_in(&self, view: &dyn StoreView) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        let mut problems = Vec::new();
        let mut inodes: BTreeMap<u64, Inode> = BTreeMap::new();
        for (_, value) in view.scan(Cf::Inodes, &[], &[], usize::MAX)? {
            let inode: Inode = schema::decode("inode", &value)?;
            inodes.insert(inode.ino, inode);
        }
        report.inodes = inodes.len() as u64;
        let orphans: BTreeSet<u64> = view
            .scan(Cf::Orphans, &[], &[], usize::MAX)?
            .into_iter()
            .filter_map(|(k, _)| k.try_into().ok().map(u64::from_be_bytes))
            .collect();

        // Transactions across groups this group decided and has not yet seen taken by the
        // other side: their entries' other halves are on their way (not matched by fsck).
        let mut deciding = BTreeSet::new();
        // Files whose names or link counts a change across groups is changing: their names
        // elsewhere are not matched until it is decided on every side.
        let mut changing = BTreeSet::new();
        for (_, value) in view.scan(Cf::Txns, &[], &[], usize::MAX)? {
            let record: crate::schema::TxnRecord = schema::decode("transaction", &value)?;
            for e in &record.effects {
                changing.extend([e.ino, e.replaced].into_iter().filter(|i| *i != 0));
            }
            if record.role == crate::schema::TXN_COORDINATOR && record.state == crate::schema::TXN_COMMITTED {
                deciding.insert((record.parent, record.name));
            }
        }
        report.changing = changing.into_iter().collect();

        // Entries: who names whom.
        let mut refs: HashMap<u64, u32> = HashMap::new();
        let mut subdirs: HashMap<u64, u32> = HashMap::new();
        let mut dir_entry_parent: HashMap<u64, u64> = HashMap::new();
        let mut name_dirs: HashMap<u64, Vec<u64>> = HashMap::new();
        for (key, value) in view.scan(Cf::Dentries, &[], &[], usize::MAX)? {
            report.dentries += 1;
            let parent = u64::from_be_bytes(key[..8].try_into().expect("dentry keys have 8-byte prefixes"));
            let name = schema::name_of(&key).to_vec();
            let dentry: Dentry = schema::decode("dentry", &value)?;
            if dentry.is_pending() {
                // A cross-group mkdir not decided yet (`txn.rs`): its recovery finishes it.
                continue;
            }
            if !inodes.get(&parent).is_some_and(|p| p.is_dir()) {
                problems.push(Problem::EntryInNonDirectory { parent, name });
                continue;
            }
            if !self.holds_ino(dentry.ino) {
                // An inode another group holds (a directory made by a mkdir across groups, a
                // file renamed or linked here): that group checks it, and fsck across groups
                // matches the two halves; a directory's entry counts in this parent's links.
                if dentry.kind == crate::schema::S_IFDIR {
                    *subdirs.entry(parent).or_default() += 1;
                }
                // A directory being removed, or just made and its decision on its way, is not
                // matched; a file's entry always is (fsck across groups leaves out the files a
                // change is changing in any group: `changing`).
                let dir = dentry.kind == crate::schema::S_IFDIR;
                if !dir || (!dentry.is_removing() && !deciding.contains(&(parent, name.clone()))) {
                    report.remote_entries.push((parent, name, dentry.ino, dentry.kind));
                }
                continue;
            }
            let Some(child) = inodes.get(&dentry.ino) else {
                problems.push(Problem::DanglingEntry { parent, name, ino: dentry.ino });
                continue;
            };
            if child.kind() != dentry.kind {
                problems.push(Problem::EntryKind { parent, name, ino: dentry.ino, kind: dentry.kind });
            }
            *refs.entry(dentry.ino).or_default() += 1;
            if child.is_dir() {
                *subdirs.entry(parent).or_default() += 1;
                dir_entry_parent.insert(dentry.ino, parent);
            } else {
                name_dirs.entry(dentry.ino).or_default().push(parent);
            }
        }

        let mut counted = Stats::default();
        for (&ino, inode) in &inodes {
            counted.inodes += 1;
            let named = refs.get(&ino).copied().unwrap_or(0);
            if inode.is_dir() {
                counted.directories += 1;
                let want = 2 + subdirs.get(&ino).copied().unwrap_or(0);
                if inode.nlink != want {
                    problems.push(Problem::LinkCount { ino, nlink: inode.nlink, want });
                }
                // A directory whose parent is another group's is named there (a mkdir across
                // groups): fsck across groups checks that entry.
                // Not one an rmdir across groups is removing (its entry may be gone already),
                // nor one a rename across groups is moving (its parent is in flux).
                let settled = inode.removing.is_empty() && inode.moving.is_empty();
                if ino != ROOT_INO && !self.holds_ino(inode.parent) && settled {
                    report.away_dirs.push((ino, inode.parent));
                }
                if ino != ROOT_INO && self.holds_ino(inode.parent) && inode.moving.is_empty() {
                    match dir_entry_parent.get(&ino) {
                        None => problems.push(Problem::Unreachable { ino }),
                        Some(&want) if inode.parent != want => {
                            problems.push(Problem::DirParent { ino, parent: inode.parent, want })
                        }
                        Some(_) => {}
                    }
                }
                continue;
            }
            if inode.is_reg() {
                counted.files += 1;
                counted.logical_bytes += inode.size as i64;
            }
            // Names in directories other groups hold, as the file lists them: counted in its
            // links, matched with those groups' entries by fsck across groups.
            // (An unlinked file, nlink 0, keeps its last name's directory only as a hint.)
            let away: Vec<u64> = if inode.names_known() && inode.nlink > 0 {
                inode.name_dirs().filter(|d| *d != 0 && !self.holds_ino(*d)).collect()
            } else {
                Vec::new()
            };
            report.away_names.extend(away.iter().map(|d| (ino, *d)));
            let named_anywhere = named + away.len() as u32;
            if named_anywhere == 0 && orphans.contains(&ino) {
                continue;
            }
            if named_anywhere == 0 {
                problems.push(Problem::Unreachable { ino });
            } else if inode.nlink != named_anywhere {
                problems.push(Problem::LinkCount { ino, nlink: inode.nlink, want: named_anywhere });
            }
            if let Some(want) = name_dirs.get_mut(&ino) {
                want.sort_unstable();
                let mut dirs: Vec<u64> = if inode.names_known() {
                    inode.name_dirs().filter(|d| self.holds_ino(*d)).collect()
                } else {
                    Vec::new()
                };
                dirs.sort_unstable();
                if dirs != *want {
                    problems.push(Problem::NameDirs { ino, dirs, want: want.clone() });
                }
            }
        }
        for ino in &orphans {
            if !inodes.contains_key(ino) || refs.contains_key(ino) {
                problems.push(Problem::StrayRecord { cf: "orphans", key: schema::ino_key(*ino) });
            }
        }
        // Records keyed by an inode that does not exist.
        for cf in [Cf::Stripes, Cf::Xattrs, Cf::Symlinks] {
            for (key, _) in view.scan(cf, &[], &[], usize::MAX)? {
                if cf == Cf::Stripes {
                    report.stripes += 1;
                }
                let ino = u64::from_be_bytes(key[..8].try_into().expect("keys start with an inode"));
                let owner_ok = match cf {
                    Cf::Stripes => inodes.get(&ino).is_some_and(|i| i.is_reg()),
                    Cf::Symlinks => inodes.get(&ino).is_some_and(|i| i.is_symlink()),
                    _ => inodes.contains_key(&ino),
                };
                if !owner_ok {
                    problems.push(Problem::StrayRecord { cf: cf.name(), key });
                }
            }
        }
        // The counts as stored in the same view (every change writes its stats shard in its
        // own batch), not the live ones, which may already include a later change.
        let mut stored = Stats::default();
        for shard in 0..STATS_SHARDS {
            if let Some(v) = view.get(Cf::Counters, &stats_key(shard))? {
                stored.add(&schema::decode::<Stats>("stats", &v)?);
            }
        }
        if stored != counted {
            problems.push(Problem::Stats { stored: stored.into(), counted: counted.into() });
        }
        problems.sort();
        report.problems = problems;
        Ok(report)
    }

    fn repair_problem(&self, problem: &Problem) -> Result<()> {
        match problem {
            Problem::EntryInNonDirectory { parent, name } | Problem::DanglingEntry { parent, name, .. } => {
                let mut batch = Batch::new();
                batch.delete(Cf::Dentries, schema::dentry_key(*parent, name));
                self.store.write(batch)
            }
            Problem::EntryKind { parent, name, ino, .. } => self.locked(
                || vec![*parent, *ino],
                || {
                    let kind = self.inode(*ino)?.kind();
                    let mut batch = Batch::new();
                    batch.put(
                        Cf::Dentries,
                        schema::dentry_key(*parent, name),
                        schema::encode(&Dentry::new(*ino, kind)),
                    );
                    self.store.write(batch)
                },
            ),
            Problem::LinkCount { ino, want, .. } => self.locked(
                || vec![*ino],
                || {
                    let mut tx = self.tx();
                    tx.get(*ino)?.nlink = *want;
                    tx.commit()
                },
            ),
            Problem::DirParent { ino, want, .. } => self.locked(
                || vec![*ino],
                || {
                    let mut tx = self.tx();
                    tx.get(*ino)?.parent = *want;
                    tx.commit()
                },
            ),
            Problem::NameDirs { ino, want, .. } => self.locked(
                || vec![*ino],
                || {
                    let mut tx = self.tx();
                    let inode = tx.get(*ino)?;
                    // Names in other groups' directories are not this group's to judge: kept.
                    let away: Vec<u64> = if inode.names_known() {
                        inode.name_dirs().filter(|d| *d != 0 && !self.holds_ino(*d)).collect()
                    } else {
                        Vec::new()
                    };
                    let all: Vec<u64> = want.iter().copied().chain(away).collect();
                    if let Some((first, rest)) = all.split_first() {
                        (inode.parent, inode.links) = (*first, rest.to_vec());
                    }
                    tx.commit()
                },
            ),
            Problem::Unreachable { ino } => self.link_lost(*ino),
            Problem::StrayRecord { cf, key } => {
                let cf = crate::store::Cf::named(cf).expect("a known family");
                let mut batch = Batch::new();
                batch.delete(cf, key.clone());
                self.store.write(batch)
            }
            Problem::Stats { counted, .. } => {
                let mut batch = Batch::new();
                let total = Stats {
                    files: counted.files,
                    directories: counted.directories,
                    logical_bytes: counted.logical_bytes,
                    inodes: counted.inodes,
                };
                // Hold every shard while they are rewritten, so no commit interleaves.
                let mut guards: Vec<_> = self.stats.iter().map(|s| s.lock()).collect();
                for (i, _) in guards.iter().enumerate() {
                    let value = if i == 0 { total } else { Stats::default() };
                    batch.put(Cf::Counters, stats_key(i), schema::encode(&value));
                }
                self.store.write(batch)?;
                for (i, g) in guards.iter_mut().enumerate() {
                    **g = if i == 0 { total } else { Stats::default() };
                }
                Ok(())
            }
        }
    }

    /// Name inode `ino` `#INO` in `/lost+found` (created if needed).
    fn link_lost(&self, ino: u64) -> Result<()> {
        let lost = match self.dentry(ROOT_INO, LOST_FOUND)? {
            Some(d) => d.ino,
            None => {
                let new = NewEntry { parent: ROOT_INO, name: LOST_FOUND, mode: 0o700, uid: 0, gid: 0 };
                self.mkdir(&new)?.ino
            }
        };
        let name = format!("#{ino}").into_bytes();
        self.locked(
            || vec![lost, ino],
            || {
                if self.stored_dentry(lost, &name)?.is_some() {
                    return Ok(());
                }
                let mut tx = self.tx();
                let inode = tx.get(ino)?;
                let kind = inode.kind();
                if kind == S_IFDIR {
                    inode.parent = lost;
                    tx.get(lost)?.nlink += 1;
                } else {
                    inode.nlink = 1;
                    (inode.parent, inode.links) = (lost, Vec::new());
                    tx.batch.delete(Cf::Orphans, schema::ino_key(ino));
                }
                tx.put_dentry(lost, &name, ino, kind);
                tx.commit()
            },
        )
    }
}

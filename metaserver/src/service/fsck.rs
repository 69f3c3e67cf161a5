//! `CheckNamespace` over every metadata group: group 0's leader checks its own namespace, asks
//! each other group's leader for its own check (`own_group`), and matches the two halves of
//! every directory made across groups — the entry in its parent's group, the directory in its
//! own — and of every file's name in another group's directory (`docs/ARCHITECTURE.md`,
//! "Several metadata groups"); a mismatch is reported only when a second round finds it too.

use std::collections::BTreeMap;
use std::time::Duration;

use cairn_common::Result;
use cairn_proto::{AwayDir, AwayName, CheckNamespaceReply, CheckNamespaceRequest, GroupMap, RemoteEntry};
use tonic::Status;

use super::MetaService;
use crate::groups;
use crate::schema::S_IFDIR;

/// How long group 0's leader waits for another group's check (a whole namespace's scan).
const CHECK_TIMEOUT: Duration = Duration::from_secs(1800);

fn reply_of(report: crate::namespace::CheckReport, more: Vec<String>) -> CheckNamespaceReply {
    CheckNamespaceReply {
        inodes: report.inodes,
        dentries: report.dentries,
        stripes: report.stripes,
        problems: report.problems.iter().map(|p| p.to_string()).chain(more).collect(),
        repaired: report.repaired,
        remote_entries: report
            .remote_entries
            .into_iter()
            .map(|(parent, name, ino, kind)| RemoteEntry { parent, name, ino, kind })
            .collect(),
        away_dirs: report.away_dirs.into_iter().map(|(ino, parent)| AwayDir { ino, parent }).collect(),
        away_names: report.away_names.into_iter().map(|(ino, dir)| AwayName { ino, dir }).collect(),
        changing: report.changing,
    }
}

/// The problems of directories made across groups, from each group's half: an entry naming a
/// directory that its group does not hold under that parent, and a directory whose parent's
/// group names it nowhere. `owner` says which group holds an inode.
pub(crate) fn unmatched(
    checked: &BTreeMap<u32, CheckNamespaceReply>,
    owner: impl Fn(u64) -> u32,
) -> Vec<String> {
    let mut away: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for (group, reply) in checked {
        for dir in &reply.away_dirs {
            away.insert(dir.ino, (*group, dir.parent));
        }
    }
    // Each file's names in other groups' directories, as the file lists them: (inode,
    // directory) → how many.
    // Files (and directories) a change not finished in some group is changing are not judged.
    let changing: std::collections::BTreeSet<u64> =
        checked.values().flat_map(|r| r.changing.iter().copied()).collect();
    let mut owed: BTreeMap<(u64, u64), (u32, usize)> = BTreeMap::new();
    for (group, reply) in checked {
        for name in reply.away_names.iter().filter(|n| !changing.contains(&n.ino)) {
            owed.entry((name.ino, name.dir)).or_insert((*group, 0)).1 += 1;
        }
    }
    let mut named: BTreeMap<u64, u64> = BTreeMap::new();
    let mut problems = Vec::new();
    for (group, reply) in checked {
        let files = reply.remote_entries.iter().filter(|e| e.kind != 0 && e.kind != S_IFDIR);
        for entry in files.filter(|e| !changing.contains(&e.ino)) {
            let there = owner(entry.ino);
            match owed.get_mut(&(entry.ino, entry.parent)) {
                Some((_, n)) if *n > 0 => *n -= 1,
                _ if checked.contains_key(&there) => problems.push(format!(
                    "entry {:?} in directory {} (group {group}) names file {}, which group {there} does not \
                     hold with a name there",
                    String::from_utf8_lossy(&entry.name),
                    entry.parent,
                    entry.ino
                )),
                _ => {}
            }
        }
    }
    for ((ino, dir), (group, left)) in owed {
        if left > 0 && checked.contains_key(&owner(dir)) {
            problems.push(format!(
                "file {ino} (group {group}) counts {left} name(s) in directory {dir} of group {}, which names \
                 it fewer times",
                owner(dir)
            ));
        }
    }
    // Directories a rename not finished in some group is moving are not judged either.
    away.retain(|ino, _| !changing.contains(ino));
    for (group, reply) in checked {
        let dirs = reply.remote_entries.iter().filter(|e| e.kind == 0 || e.kind == S_IFDIR);
        for entry in dirs.filter(|e| !changing.contains(&e.ino)) {
            let name = String::from_utf8_lossy(&entry.name);
            let there = owner(entry.ino);
            match away.get(&entry.ino) {
                Some((_, parent)) if *parent == entry.parent => {
                    named.insert(entry.ino, entry.parent);
                }
                Some((_, parent)) => problems.push(format!(
                    "entry {:?} in directory {} (group {group}) names directory {}, whose parent is {parent} in group {there}",
                    name, entry.parent, entry.ino
                )),
                // Its group's half is reported missing only when that group answered.
                None if checked.contains_key(&there) => problems.push(format!(
                    "entry {:?} in directory {} (group {group}) names directory {}, which group {there} does not hold",
                    name, entry.parent, entry.ino
                )),
                None => {}
            }
        }
    }
    for (ino, (group, parent)) in away {
        if named.get(&ino) != Some(&parent) && checked.contains_key(&owner(parent)) {
            problems.push(format!(
                "directory {ino} (group {group}) has its parent {parent} in group {}, whose entries do not name it",
                owner(parent)
            ));
        }
    }
    problems
}

impl MetaService {
    /// `CheckNamespace`: this group's own check (`own_group`), or, on group 0, every group's
    /// and the match of their halves.
    pub(super) async fn check_namespace(
        &self,
        req: CheckNamespaceRequest,
    ) -> Result<CheckNamespaceReply, Status> {
        let repair = req.repair;
        // A group other than 0 asked for the whole check answers `WrongGroup` (`run_zero`).
        if req.own_group {
            let report = self
                .run(move |ns| {
                    let report = ns.check(repair)?;
                    if repair {
                        ns.store().sync()?;
                    }
                    Ok(report)
                })
                .await?;
            return Ok(reply_of(report, Vec::new()));
        }
        let (report, misplaced, map) = self
            .run_zero(move |s| {
                let report = s.ns.check(repair)?;
                if repair {
                    s.ns.store().sync()?;
                }
                let misplaced = groups::misplaced_slots(s.cluster.groups(), &**s.ns.store())?;
                Ok((report, misplaced, s.cluster.groups().map()?))
            })
            .await?;
        let mut total = reply_of(report, misplaced);
        if map.groups.is_empty() {
            total.remote_entries.clear();
            total.away_dirs.clear();
            total.away_names.clear();
            total.changing.clear();
            return Ok(total);
        }
        let mut checked = BTreeMap::new();
        for group in map.groups.iter().map(|g| g.group).filter(|g| *g != 0) {
            match self.check_of(&map, group, repair).await {
                Ok(reply) => {
                    total.inodes += reply.inodes;
                    total.dentries += reply.dentries;
                    total.stripes += reply.stripes;
                    total.repaired += reply.repaired;
                    total.problems.extend(reply.problems.iter().map(|p| format!("group {group}: {p}")));
                    checked.insert(group, reply);
                }
                Err(e) => total.problems.push(format!("group {group} could not be checked: {e}")),
            }
        }
        let own = CheckNamespaceReply {
            remote_entries: std::mem::take(&mut total.remote_entries),
            away_dirs: std::mem::take(&mut total.away_dirs),
            away_names: std::mem::take(&mut total.away_names),
            changing: std::mem::take(&mut total.changing),
            ..Default::default()
        };
        checked.insert(0, own);
        let serving = self.zero()?;
        let owner = |ino| serving.cluster.groups().owner_of(ino).0;
        let found = unmatched(&checked, owner);
        if found.is_empty() {
            return Ok(total);
        }
        // Each group was scanned at its own moment: a change made between two groups' scans
        // shows as a mismatch. Only what a second round of every group's halves finds again
        // is reported.
        let again = self.halves(&map).await?;
        let confirmed = unmatched(&again, owner);
        total.problems.extend(found.into_iter().filter(|p| confirmed.contains(p)));
        Ok(total)
    }

    /// Every group's halves of what spans groups, scanned again (no repair): group 0's and
    /// each other group's that answers.
    async fn halves(&self, map: &GroupMap) -> Result<BTreeMap<u32, CheckNamespaceReply>, Status> {
        let own = self.run_zero(|s| s.ns.check(false)).await?;
        let mut checked = BTreeMap::from([(0, reply_of(own, Vec::new()))]);
        for group in map.groups.iter().map(|g| g.group).filter(|g| *g != 0) {
            if let Ok(reply) = self.check_of(map, group, false).await {
                checked.insert(group, reply);
            }
        }
        Ok(checked)
    }

    /// Group `group`'s own check, asked of its leader among the replicas `map` names.
    async fn check_of(&self, map: &GroupMap, group: u32, repair: bool) -> Result<CheckNamespaceReply> {
        let req = CheckNamespaceRequest { repair, own_group: true };
        let client = |addr: &str| self.channels.meta(addr);
        super::groups::on_group_leader(client, map, group, CHECK_TIMEOUT, |mut c| async move {
            c.check_namespace(req).await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(parent: u64, name: &str, ino: u64) -> RemoteEntry {
        RemoteEntry { parent, name: name.into(), ino, kind: S_IFDIR }
    }

    /// Each directory made across groups needs both halves: the entry in its parent's group
    /// and the directory, under that parent, in its own; a group that did not answer is not
    /// blamed for its half.
    #[test]
    fn both_halves_of_a_directory_across_groups_must_match() {
        let in_slot = |slot: u64, n: u64| (slot << cairn_common::ids::SLOT_SHIFT) | n;
        let owner = |ino: u64| if cairn_common::ids::slot_of(ino) == 0 { 0 } else { 1 };
        let (d, e, lost) = (in_slot(5, 1), in_slot(5, 2), in_slot(5, 3));
        let mut checked = BTreeMap::new();
        checked.insert(
            0,
            CheckNamespaceReply {
                remote_entries: vec![entry(1, "d", d), entry(1, "e", e), entry(1, "lost", lost)],
                away_dirs: vec![AwayDir { ino: 9, parent: d }],
                ..Default::default()
            },
        );
        checked.insert(
            1,
            CheckNamespaceReply {
                remote_entries: vec![entry(d, "sub", 9)],
                away_dirs: vec![
                    AwayDir { ino: d, parent: 1 },
                    AwayDir { ino: e, parent: 7 },
                    AwayDir { ino: in_slot(5, 4), parent: 1 },
                ],
                ..Default::default()
            },
        );
        let problems = unmatched(&checked, owner);
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].contains("\"e\"") && problems[0].contains("whose parent is 7"), "{problems:#?}");
        assert!(problems[1].contains("\"lost\"") && problems[1].contains("does not hold"), "{problems:#?}");
        assert!(problems.iter().any(|p| p.starts_with(&format!("directory {e} "))), "{problems:#?}");
        assert!(
            problems.iter().any(|p| p.starts_with(&format!("directory {} ", in_slot(5, 4)))),
            "{problems:#?}"
        );
        // A rename not finished in group 1 is moving e (its record lists it): its halves may
        // disagree meanwhile, and are not judged.
        checked.get_mut(&1).unwrap().changing = vec![e];
        let problems = unmatched(&checked, owner);
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems.iter().all(|p| !p.contains(&format!(" {e}"))), "{problems:#?}");
        checked.get_mut(&1).unwrap().changing.clear();
        // Group 1 did not answer: only group 0's own half is judged, and nothing of it is blamed.
        checked.remove(&1);
        assert!(unmatched(&checked, owner).iter().all(|p| !p.contains("does not hold")));
    }

    /// A file named in another group's directory: each entry needs a name the file lists in
    /// that directory (two links, two names), and each listed name an entry.
    #[test]
    fn a_files_names_in_other_groups_must_match_its_entries() {
        let in_slot = |slot: u64, n: u64| (slot << cairn_common::ids::SLOT_SHIFT) | n;
        let owner = |ino: u64| if cairn_common::ids::slot_of(ino) == 0 { 0 } else { 1 };
        let (d, f, g, h) = (in_slot(5, 1), 20, 21, 22);
        let file = |name: &str, ino: u64| RemoteEntry { parent: d, name: name.into(), ino, kind: 0o100000 };
        let mut checked = BTreeMap::new();
        checked.insert(
            0,
            CheckNamespaceReply {
                away_names: vec![
                    AwayName { ino: f, dir: d },
                    AwayName { ino: f, dir: d },
                    AwayName { ino: g, dir: d },
                    AwayName { ino: h, dir: d },
                ],
                ..Default::default()
            },
        );
        checked.insert(
            1,
            CheckNamespaceReply {
                remote_entries: vec![file("f1", f), file("f2", f), file("g", g), file("lost", 23)],
                ..Default::default()
            },
        );
        let problems = unmatched(&checked, owner);
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems[0].contains("\"lost\"") && problems[0].contains("names file 23"), "{problems:#?}");
        assert!(problems[1].starts_with(&format!("file {h} ")), "{problems:#?}");
        // A change not finished in group 1 is changing file 23 and h: neither is judged.
        checked.get_mut(&1).unwrap().changing = vec![23, h];
        assert!(unmatched(&checked, owner).is_empty());
        // Group 0 did not answer: its files' entries are not blamed.
        checked.get_mut(&1).unwrap().changing.clear();
        checked.remove(&0);
        assert!(unmatched(&checked, owner).is_empty());
    }
}

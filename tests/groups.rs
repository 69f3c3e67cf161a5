//! Changes across metadata groups under `kill -9` (`cairn up --meta-groups 2`, directories
//! spread over both groups): a rename and a link whose names and files are in different
//! groups, with the leader of the coordinating group, then of the participating one, killed
//! at each step of the two-phase commit (`CAIRN_CRASH_AT`). Afterwards the change happened
//! entirely or not at all, the mount still serves every file, and fsck across groups is
//! clean. The steps' effects without processes are `metaserver/src/namespace/tests_change.rs`.

mod support;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use support::{eventually, fsck_clean, restart_server, Cluster, KillOnDrop};

/// A cluster of two groups (`cairn up --meta-groups 2`: half the slots group 1's and
/// directories spread), whose
/// metaservers kill themselves at `step` (once, the first to reach it); with a directory of
/// group 0 and one of group 1 under the root.
struct Split {
    cluster: Cluster,
    crashed: PathBuf,
    _crash: tempfile::TempDir,
    zero: PathBuf,
    one: PathBuf,
}

impl Split {
    fn start(step: &str) -> Split {
        Split::start_with(step, 6, &[])
    }

    /// [`Split::start`] with `chunkservers` and `extra` arguments to `cairn up`.
    fn start_with(step: &str, chunkservers: u32, extra: &[&str]) -> Split {
        let crash = tempfile::tempdir().unwrap();
        let crashed = crash.path().join("crashed");
        let env = [("CAIRN_CRASH_AT", step), ("CAIRN_CRASH_ONCE", crashed.to_str().unwrap())];
        let args = [&["--meta-replicas", "3", "--meta-groups", "2"][..], extra].concat();
        let cluster = Cluster::start_env(chunkservers, "4+2", 64, &args, &env);
        // `cairn up` cut a new cluster's slots in two and spread directories, and said ready
        // once group 1's leader held that map.
        let (_, map) = support::cli_json(&cluster, &["meta", "groups"]);
        assert_eq!(map["spread_dirs"], true, "{map}");
        assert!(map["groups"]
            .as_array()
            .is_some_and(|g| g.iter().all(|g| g["map_version"] == map["version"])));
        let slots: Vec<u64> =
            map["groups"].as_array().unwrap().iter().map(|g| g["slots"].as_u64().unwrap()).collect();
        assert_eq!(slots, [2048, 2048], "{map}");
        let (mut zero, mut one) = (None, None);
        for i in 0..64 {
            let dir = cluster.mnt.join(format!("d{i}"));
            fs::create_dir(&dir).unwrap();
            let slot = fs::metadata(&dir).unwrap().ino() >> 52;
            if slot == 0 {
                zero.get_or_insert(dir);
            } else {
                one.get_or_insert(dir);
            }
            if zero.is_some() && one.is_some() {
                break;
            }
        }
        let (zero, one) = (zero.expect("a directory of group 0"), one.expect("a directory of group 1"));
        Split { cluster, crashed, _crash: crash, zero, one }
    }

    /// The metaserver that killed itself, started again as an operator would.
    fn restart_crashed(&self) -> KillOnDrop {
        eventually(30, "a metaserver reached the crash point", || self.crashed.exists());
        let alive = |pid: u32| {
            fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| !s.contains("State:\tZ"))
        };
        let mut dead: Vec<String> = Vec::new();
        eventually(10, "the metaserver that crashed is gone", || {
            dead = self
                .cluster
                .nodes
                .iter()
                .filter(|n| n.role == "meta" && !alive(n.pid))
                .map(|n| n.id.clone())
                .collect();
            dead.len() == 1
        });
        KillOnDrop(Some(restart_server(&self.cluster, "meta", &format!("meta-{}", dead[0]))))
    }
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

/// A rename out of a group 1 directory into a group 0 one, with group 1's leader (the
/// coordinator) killed after each of its steps: the mount's retry succeeds (answered from the
/// first try where that committed), and exactly one of the two names holds the file, with its
/// bytes and number.
#[test]
fn a_rename_across_groups_survives_its_coordinators_crash_at_each_step() {
    for step in ["change-begun", "change-asked", "change-prepared", "change-committed"] {
        let split = Split::start(step);
        let (from, to) = (split.one.join("f"), split.zero.join("f"));
        fs::write(&from, step).unwrap();
        let ino = fs::metadata(&from).unwrap().ino();
        let renamed = fs::rename(&from, &to);
        let _back = split.restart_crashed();
        eventually(60, "the rename is decided on both sides", || {
            let cluster = &split.cluster;
            exists(&from) != exists(&to) && cluster.cli(&["fsck"]).status.code() == Some(0)
        });
        let now = if exists(&to) { &to } else { &from };
        assert_eq!(
            (fs::read_to_string(now).unwrap(), fs::metadata(now).unwrap().ino()),
            (step.to_string(), ino)
        );
        // The mount rides through the coordinator's failover: no error reaches the caller.
        assert!(renamed.is_ok(), "{step}: {renamed:?}");
        assert!(exists(&to), "{step}: the rename answered success, so it happened");
        println!("{step}: rename {renamed:?}, the file is at {now:?}");
        fsck_clean(&split.cluster);
    }
}

/// A link of a group 0 file into a group 1 directory, with group 0's leader (the participant,
/// which counts the link) killed after its prepare and after its decision: afterwards the new
/// name is there with a link count of 2 (the mount's retry finds the link done, or makes it).
#[test]
fn a_link_across_groups_survives_its_participants_crash_at_each_step() {
    for step in ["change-participant-prepared", "change-participant-decided"] {
        let split = Split::start(step);
        let (file, link) = (split.zero.join("g"), split.one.join("g"));
        fs::write(&file, step).unwrap();
        let linked = fs::hard_link(&file, &link);
        let _back = split.restart_crashed();
        eventually(60, "the link is decided on both sides", || {
            let nlink = fs::metadata(&file).map(|m| m.nlink()).unwrap_or(0);
            nlink == if exists(&link) { 2 } else { 1 }
                && split.cluster.cli(&["fsck"]).status.code() == Some(0)
        });
        if exists(&link) {
            assert_eq!(fs::read_to_string(&link).unwrap(), step);
            assert_eq!(fs::metadata(&link).unwrap().ino(), fs::metadata(&file).unwrap().ino());
        }
        // The mount rides through the participant's failover: no error reaches the caller.
        assert!(linked.is_ok(), "{step}: {linked:?}");
        assert!(exists(&link), "{step}: the link answered success, so it happened");
        println!("{step}: link {linked:?}, the name is {}", if exists(&link) { "there" } else { "absent" });
        // The file goes with its last name, wherever it is.
        fs::remove_file(&file).unwrap();
        if exists(&link) {
            fs::remove_file(&link).unwrap();
        }
        fsck_clean(&split.cluster);
    }
}

/// Directories renamed across groups on the mount: a tree moved between directories of the
/// two groups keeps every file, a move into its own subtree is refused (`EINVAL`) wherever
/// the walk goes, a directory replaces an empty one; then a move with the coordinator's leader
/// killed once every group prepared, and once it committed: the mount's retry finishes it,
/// and fsck across groups is clean throughout.
#[test]
fn directories_move_across_groups() {
    for step in ["change-prepared", "change-committed"] {
        let split = Split::start(step);
        // A tree of a few levels, its directories spread over both groups.
        let top = split.zero.join("top");
        let mut leaf = top.clone();
        for level in 0..4 {
            leaf = leaf.join(format!("l{level}"));
        }
        fs::create_dir_all(&leaf).unwrap();
        fs::write(leaf.join("f"), step).unwrap();
        // The first move meets the crash: the mount's retries carry it through.
        let moved = split.one.join("top");
        let renamed = fs::rename(&top, &moved);
        let _back = split.restart_crashed();
        assert!(renamed.is_ok(), "{step}: {renamed:?}");
        let leaf = moved.join("l0/l1/l2/l3");
        // A retry answered from the commit's record may come back before the new name's group
        // took the decision (the crashed coordinator's next leader sends it within seconds).
        eventually(60, "the move is decided on both sides", || {
            fs::read_to_string(leaf.join("f")).is_ok_and(|text| text == step)
                && split.cluster.cli(&["fsck"]).status.code() == Some(0)
        });
        assert!(!exists(&top));
        // Into its own subtree: refused, nothing moved.
        let looped = fs::rename(&moved, leaf.join("top"));
        assert_eq!(looped.as_ref().map_err(|e| e.raw_os_error()), Err(Some(libc::EINVAL)), "{step}");
        let looped = fs::rename(moved.join("l0"), leaf.join("l0"));
        assert_eq!(looped.as_ref().map_err(|e| e.raw_os_error()), Err(Some(libc::EINVAL)), "{step}");
        // Over empty directories of either group (the one whose parent's group holds it, and
        // another), and back out to the root.
        let empties: Vec<PathBuf> = (0..8).map(|i| split.zero.join(format!("e{i}"))).collect();
        for e in &empties {
            fs::create_dir(e).unwrap();
        }
        let groups: Vec<bool> = empties.iter().map(|e| fs::metadata(e).unwrap().ino() >> 52 == 0).collect();
        assert!(groups.contains(&true) && groups.contains(&false), "{groups:?}");
        for pair in empties.windows(2) {
            fs::rename(&pair[0], &pair[1]).unwrap();
        }
        let empty = empties.last().unwrap();
        fs::rename(moved.join("l0/l1"), empty).unwrap();
        assert_eq!(fs::read_to_string(empty.join("l2/l3/f")).unwrap(), step);
        fs::rename(empty, split.cluster.mnt.join("back")).unwrap();
        assert_eq!(fs::read_to_string(split.cluster.mnt.join("back/l2/l3/f")).unwrap(), step);
        assert_eq!(fs::metadata(split.cluster.mnt.join("back")).unwrap().nlink(), 3);
        fsck_clean(&split.cluster);
    }
}

/// Files in a directory of group 1: a shard a client finds damaged is rewritten (the report
/// handed from group 0 to group 1), and after two chunkservers die group 1's repair rebuilds
/// their shards on the survivors (their placement moves off the dead nodes; `cairn status`
/// counts it, and a node group 1 places files on is not removed), so two more can die and
/// every byte still reads.
#[test]
fn a_groups_files_are_rebuilt_by_its_own_repair() {
    let split = Split::start_with("none", 8, &["--rebuild-after-ms", "2000"]);
    let mut files = Vec::new();
    for i in 0..6usize {
        let data: Vec<u8> = (0..200_000 + i * 77_777).map(|b| (b * 31 + i) as u8).collect();
        let path = split.one.join(format!("f{i}"));
        fs::write(&path, &data).unwrap();
        files.push((path, data));
    }
    let info = |path: &Path| support::cli_json(&split.cluster, &["info", path.to_str().unwrap()]).1;
    let slot = |p: &Path| fs::metadata(p).unwrap().ino() >> 52;
    assert!(files.iter().all(|(path, _)| slot(path) != 0), "the files are group 1's (slots 1-2047)");

    // A damaged shard, found by a client's read: the report goes to group 0, which hands it to
    // group 1; group 1 confirms it with the chunkserver and its repair rewrites the shard.
    let prefix = format!("{:016x}-{:012x}-{:02x}-", fs::metadata(&files[0].0).unwrap().ino(), 0, 1);
    let shard = split
        .cluster
        .shard_files()
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix));
    let shard = shard.expect("the shard file");
    let pristine = fs::read(&shard).unwrap();
    let mut bad = pristine.clone();
    let at = bad.len() - 100;
    bad[at] ^= 0x55;
    fs::write(&shard, bad).unwrap();
    let reader = support::Mount::new(&split.cluster, "reader");
    let name = files[0].0.strip_prefix(&split.cluster.mnt).unwrap();
    assert!(fs::read(reader.dir.join(name)).unwrap() == files[0].1, "read around the damage");
    eventually(60, "group 1's repair rewrote the damaged shard", || {
        fs::read(&shard).is_ok_and(|b| b == pristine)
    });
    drop(reader);
    let chunks: Vec<&support::Node> = split.cluster.nodes.iter().filter(|n| n.role == "chunk").collect();
    support::kill9(chunks[0].pid);
    support::kill9(chunks[1].pid);
    let dead: Vec<u64> = chunks[..2].iter().map(|n| n.id.parse().unwrap()).collect();
    eventually(180, "group 1's repair moved every file off the dead chunkservers", || {
        files.iter().all(|(path, _)| {
            let info = info(path);
            info["degraded_stripes"] == 0
                && info["placement"].as_array().is_some_and(|nodes| {
                    nodes.len() == 6
                        && nodes.iter().all(|n| n["node"].as_u64().is_some_and(|id| !dead.contains(&id)))
                })
        })
    });
    // `cairn status` (group 0's) counts group 1's rebuild: every file is group 1's.
    eventually(15, "status counts group 1's rebuilt shards", || {
        let (_, st) = support::cli_json(&split.cluster, &["status"]);
        st["repair"]["shards_rebuilt"].as_u64().is_some_and(|n| n > 0)
            && st["repair"]["degraded_stripes"] == 0
    });
    // Nor is a drained-looking node removed while group 1 still places files on it.
    let holding = info(&files[0].0)["placement"][0]["node"].as_u64().unwrap().to_string();
    let out = split.cluster.cli(&["node", "remove", &holding]);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && said.contains("still holds shards of"), "{said}");
    support::kill9(chunks[2].pid);
    support::kill9(chunks[3].pid);
    for (path, data) in &files {
        assert!(fs::read(path).unwrap() == *data, "{}", path.display());
    }
}

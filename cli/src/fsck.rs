//! `cairn scrub PATH|--all` and `cairn fsck [--repair]`: check that every stripe of every file
//! is whole, on demand.
//!
//! Both walk the tree through the metaserver (`tree.rs`), then ask each chunkserver about the
//! shards the stripe records say it holds (`CheckShards`; with verification every block is read
//! and checked against its BLAKE3 checksum). A stripe is healthy when every stored shard is
//! there and intact, degraded when up to `m` are missing, corrupt or on a chunkserver that is
//! down, and unrecoverable beyond that. Repair reports the damaged shards to the metaserver
//! (which marks them missing), runs a repair pass right away (`RepairNow`) and checks the
//! degraded files again, so the report says what was actually repaired.
//!
//! `scrub` always verifies and repairs. `fsck` also checks the namespace (`CheckNamespace`) and
//! looks for shards no file references (`Reconcile`, a dry run unless `--repair`); it repairs
//! only with `--repair`. The exit status follows e2fsck: 0 clean, 1 problems found and all
//! repaired, 4 problems left, 8 the check itself failed. Unreferenced shards are reported but
//! are not damage: they do not change the status.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_client::MetaConn;
use cairn_common::content::HASH_LEN;
use cairn_common::{CairnError, Result};
use cairn_proto as p;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::admin::human;
use crate::tree::{batch_len, chunk_client, open_file, resolve, walk, Opened};

/// Most shards, and most bytes, per CheckShards request.
const BATCH_SHARDS: usize = 256;
const BATCH_BYTES: u64 = 256 << 20;

pub const EXIT_CLEAN: u8 = 0;
pub const EXIT_REPAIRED: u8 = 1;
pub const EXIT_PROBLEMS_LEFT: u8 = 4;

pub struct Options {
    /// A tree to check; `None` is the whole namespace.
    pub path: Option<PathBuf>,
    pub meta: Option<String>,
    /// Read every block and check it against its checksum (otherwise: presence and length).
    pub verify: bool,
    pub repair: bool,
    /// With `repair`: also delete shards of inode numbers the namespace never handed out.
    pub delete_foreign: bool,
    /// `fsck`: also the namespace and unreferenced shards.
    pub fsck: bool,
    pub json: bool,
}

/// One shard to check.
#[derive(Clone)]
struct Shard {
    file: usize,
    stripe: usize,
    id: p::ShardId,
    bytes: u64,
    /// Its content hash from the stripe record (a data shard; empty when the record has none).
    content: Vec<u8>,
}

/// Shards of one stripe found damaged or unavailable (bit i = shard index i).
#[derive(Clone, Copy, Default)]
struct Masks {
    damaged: u32,
    unavailable: u32,
}

/// What a check of a set of files found.
#[derive(Default)]
struct Found {
    masks: HashMap<(usize, usize), Masks>,
    damaged: Vec<p::ShardId>,
    corrupt: u64,
    missing: u64,
    unavailable: u64,
    checked: u64,
    bytes: u64,
    errors: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Health {
    Healthy,
    Degraded,
    Unrecoverable,
}

fn health(f: &Opened, stripe: usize, m: Option<&Masks>) -> Health {
    let s = &f.stripes[stripe];
    let m = m.copied().unwrap_or_default();
    let lost = (s.missing | m.damaged | m.unavailable).count_ones();
    if lost == 0 {
        Health::Healthy
    } else if lost > f.layout.m {
        Health::Unrecoverable
    } else {
        Health::Degraded
    }
}

pub async fn run(opts: Options) -> Result<u8> {
    let started = Instant::now();
    let (meta, components, shown) = match &opts.path {
        Some(path) => resolve(path, opts.meta.clone())?,
        None => (opts.meta.clone().unwrap_or_else(|| "127.0.0.1:9400".into()), Vec::new(), "/".into()),
    };
    let command = if opts.fsck { "fsck" } else { "scrub" };
    let conn = cairn_client::connect_meta_with_timeout(&meta, Duration::from_secs(24 * 3600)).await?;
    let bar = if opts.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    };
    bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("template"));
    bar.enable_steady_tick(Duration::from_millis(120));

    let namespace = if opts.fsck {
        bar.set_message("checking the namespace");
        Some(conn.check_namespace(p::CheckNamespaceRequest { repair: opts.repair, own_group: false }).await?)
    } else {
        None
    };

    let mut files = Vec::new();
    let count = std::cell::Cell::new(0usize);
    let directories = walk(
        &conn,
        &components,
        |f| {
            count.set(count.get() + 1);
            files.push(f);
        },
        || bar.set_message(format!("walking {shown}: {} files", count.get())),
    )
    .await?;
    let stripes: u64 = files.iter().map(|f| f.stripes.len() as u64).sum();

    let nodes = node_addrs(&conn).await?;
    let all: Vec<usize> = (0..files.len()).collect();
    let found = check(&files, &all, &nodes, opts.verify, &bar).await;
    let before: Vec<(usize, usize, Health)> = tally(&files, &found);
    let degraded_before = before.iter().filter(|(_, _, h)| *h == Health::Degraded).count() as u64;
    let unrecoverable_before = before.iter().filter(|(_, _, h)| *h == Health::Unrecoverable).count() as u64;

    // Repair: report, heal now, look again at the files that had damage.
    let mut after = before.clone();
    let mut repair_error = None;
    if opts.repair && (!found.damaged.is_empty() || degraded_before + unrecoverable_before > 0) {
        bar.set_message(format!("repairing: {} damaged shards reported", found.damaged.len()));
        let healed = async {
            for chunk in found.damaged.chunks(10_000) {
                conn.report_damaged(p::ReportDamagedRequest { ids: chunk.to_vec(), confirm: false }).await?;
            }
            conn.repair_now(p::Empty {}).await?;
            Ok::<_, CairnError>(())
        }
        .await;
        if let Err(e) = healed {
            repair_error = Some(e.message().to_string());
        }
        let mut sick: Vec<usize> =
            before.iter().filter(|(_, _, h)| *h != Health::Healthy).map(|(f, _, _)| *f).collect();
        sick.dedup();
        let client_id = conn.register_client(p::Empty {}).await?.client_id;
        for &f in &sick {
            match open_file(&conn, client_id, files[f].ino, files[f].path.clone()).await {
                Ok(o) => files[f] = o,
                // Removed meanwhile: nothing left to repair.
                Err(e) if e.kind() == cairn_common::ErrorKind::NotFound => files[f].stripes.clear(),
                Err(e) => repair_error = Some(e.message().to_string()),
            }
        }
        let again = check(&files, &sick, &nodes, opts.verify, &bar).await;
        let rechecked = tally(&files, &again);
        after.retain(|(f, _, _)| !sick.contains(f));
        after.extend(rechecked.into_iter().filter(|(f, _, _)| sick.contains(f)));
    }
    let degraded_after = after.iter().filter(|(_, _, h)| *h == Health::Degraded).count() as u64;
    let unrecoverable: BTreeMap<String, u64> = after
        .iter()
        .filter(|(_, _, h)| *h == Health::Unrecoverable)
        .fold(BTreeMap::new(), |mut acc, (f, _, _)| {
            *acc.entry(files[*f].path.clone()).or_default() += 1;
            acc
        });
    let unrecoverable_after: u64 = unrecoverable.values().sum();
    let repaired =
        (degraded_before + unrecoverable_before).saturating_sub(degraded_after + unrecoverable_after);

    let leftover = if opts.fsck {
        bar.set_message("looking for shards no file references");
        let req =
            p::ReconcileRequest { dry_run: !opts.repair, delete_foreign: opts.repair && opts.delete_foreign };
        Some(conn.reconcile(req).await?)
    } else {
        None
    };
    bar.finish_and_clear();

    let ns_problems = namespace.as_ref().map_or(0, |n| n.problems.len() as u64);
    let ns_left = namespace.as_ref().map_or(0, |n| ns_problems.saturating_sub(n.repaired));
    // Unreferenced shards are wasted space, not damage: reported, deleted with --repair (and by
    // the metaserver's own reconciliation), but they do not make a filesystem unclean.
    let found_any = ns_problems + degraded_before + unrecoverable_before + found.damaged.len() as u64 > 0;
    let left = ns_left + degraded_after + unrecoverable_after > 0 || repair_error.is_some();
    let exit = match (found_any, left) {
        (false, false) => EXIT_CLEAN,
        (true, false) => EXIT_REPAIRED,
        _ => EXIT_PROBLEMS_LEFT,
    };
    let healthy = stripes - degraded_after - unrecoverable_after;
    let seconds = started.elapsed().as_secs_f64();

    if opts.json {
        let out = json!({
            "command": command, "path": shown, "files": files.len(), "directories": directories,
            "stripes": stripes, "healthy": healthy, "degraded": degraded_after,
            "degraded_found": degraded_before, "repaired": repaired,
            "unrecoverable": unrecoverable_after,
            "unrecoverable_files": unrecoverable.keys().collect::<Vec<_>>(),
            "shards_checked": found.checked, "bytes_verified": if opts.verify { found.bytes } else { 0 },
            "shards_damaged": found.damaged.len(), "shards_corrupt": found.corrupt,
            "shards_missing": found.missing, "shards_unavailable": found.unavailable,
            "errors": found.errors, "repair_error": repair_error,
            "namespace": namespace.as_ref().map(|n| json!({
                "inodes": n.inodes, "entries": n.dentries, "stripe_records": n.stripes,
                "problems": n.problems, "repaired": n.repaired,
            })),
            "unreferenced_shards": leftover.as_ref().map(|r| json!({
                "checked": r.checked, "stale": r.stale, "stale_bytes": r.stale_bytes,
                "deleted": r.deleted, "errors": r.errors, "foreign": r.foreign,
                "foreign_bytes": r.foreign_bytes, "foreign_nodes": r.foreign_nodes,
            })),
            "seconds": seconds, "exit": exit,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(exit);
    }
    println!(
        "{command} {shown}: {} files in {directories} directories, {stripes} stripes, {} shards{} in {seconds:.1} s",
        files.len(),
        found.checked,
        if opts.verify { format!(" ({} verified)", human(found.bytes)) } else { String::new() },
    );
    if let Some(n) = &namespace {
        if n.problems.is_empty() {
            println!(
                "  namespace: {} inodes, {} entries, {} stripe records: clean",
                n.inodes, n.dentries, n.stripes
            );
        } else {
            println!(
                "  namespace: {} inodes, {} entries: {} problems, {} repaired",
                n.inodes,
                n.dentries,
                n.problems.len(),
                n.repaired
            );
            for problem in &n.problems {
                println!("    {problem}");
            }
        }
    }
    println!(
        "  stripes: {healthy} healthy, {degraded_after} degraded, {unrecoverable_after} unrecoverable{}",
        if opts.repair { format!(" ({repaired} repaired)") } else { String::new() }
    );
    if found.checked > 0 || !found.damaged.is_empty() {
        println!(
            "  shards: {} corrupt, {} missing, {} on unavailable chunkservers",
            found.corrupt, found.missing, found.unavailable
        );
    }
    for (path, n) in &unrecoverable {
        println!("  UNRECOVERABLE {path} ({n} stripes with more than m shards gone)");
    }
    for e in &found.errors {
        println!("  {e}");
    }
    if let Some(e) = &repair_error {
        println!("  repair failed: {e}");
    }
    if let Some(r) = &leftover {
        if r.stale > 0 {
            println!(
                "  unreferenced shards: {} ({}), {}",
                r.stale,
                human(r.stale_bytes),
                if opts.repair {
                    format!("{} deleted", r.deleted)
                } else {
                    "not data; the metaserver deletes them, or run with --repair".into()
                }
            );
        }
        if r.foreign > 0 {
            let on: Vec<String> = r.foreign_nodes.iter().map(u32::to_string).collect();
            println!(
                "  FOREIGN shards: {} ({}) on chunkservers {} belong to inode numbers this namespace \
                 never handed out: is the metaserver running on an older backup or another copy of \
                 its data directory? {}",
                r.foreign,
                human(r.foreign_bytes),
                on.join(", "),
                if opts.repair && opts.delete_foreign {
                    "Deleted, as asked (--delete-foreign).".to_string()
                } else {
                    "They are kept; `cairn fsck --repair --delete-foreign` deletes them once you are \
                     sure they are not data."
                        .to_string()
                }
            );
        }
        for e in &r.errors {
            println!("  {e}");
        }
    }
    if degraded_after > 0 && !opts.repair {
        println!("  run with --repair to rebuild the damaged shards now");
    }
    println!(
        "  result: {}",
        match exit {
            EXIT_CLEAN => "clean",
            EXIT_REPAIRED => "problems found, all repaired",
            _ => "PROBLEMS LEFT",
        }
    );
    Ok(exit)
}

async fn node_addrs(conn: &MetaConn) -> Result<HashMap<u32, (String, bool)>> {
    Ok(conn.list_nodes(p::Empty {}).await?.nodes.into_iter().map(|n| (n.id, (n.addr, n.up))).collect())
}

/// Classify every stripe of the files named in `found`'s scope.
fn tally(files: &[Opened], found: &Found) -> Vec<(usize, usize, Health)> {
    let mut out = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        for si in 0..f.stripes.len() {
            let h = health(f, si, found.masks.get(&(fi, si)));
            out.push((fi, si, h));
        }
    }
    out
}

/// Check the shards of `which` files on their chunkservers, all chunkservers at once.
async fn check(
    files: &[Opened],
    which: &[usize],
    nodes: &HashMap<u32, (String, bool)>,
    verify: bool,
    bar: &ProgressBar,
) -> Found {
    let mut by_node: BTreeMap<u32, Vec<Shard>> = BTreeMap::new();
    let mut total = 0u64;
    for &fi in which {
        let f = &files[fi];
        let stripe_pos: HashMap<u64, usize> =
            f.stripes.iter().enumerate().map(|(i, s)| (s.index, i)).collect();
        for (s, index, node, bytes) in f.shards() {
            let id = p::ShardId { ino: f.ino, stripe: s.index, index, version: s.version };
            let at = index as usize * HASH_LEN;
            let content = s.hashes.get(at..at + HASH_LEN).map_or_else(Vec::new, <[u8]>::to_vec);
            by_node.entry(node).or_default().push(Shard {
                file: fi,
                stripe: stripe_pos[&s.index],
                id,
                bytes,
                content,
            });
            total += bytes;
        }
    }
    bar.set_length(total);
    bar.set_position(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}",
        )
        .expect("template"),
    );
    bar.set_message(if verify { "verifying shards" } else { "checking shards" });
    let found = Arc::new(std::sync::Mutex::new(Found::default()));
    let tasks = by_node.into_iter().map(|(node, shards)| {
        let found = found.clone();
        let addr = nodes.get(&node).cloned();
        async move { check_node(node, addr, shards, verify, bar, &found).await }
    });
    futures::future::join_all(tasks).await;
    Arc::try_unwrap(found).ok().and_then(|m| m.into_inner().ok()).unwrap_or_default()
}

async fn check_node(
    node: u32,
    addr: Option<(String, bool)>,
    shards: Vec<Shard>,
    verify: bool,
    bar: &ProgressBar,
    found: &std::sync::Mutex<Found>,
) {
    let unavailable = |shards: &[Shard], why: String| {
        let mut f = found.lock().expect("not poisoned");
        for s in shards {
            f.masks.entry((s.file, s.stripe)).or_default().unavailable |= 1 << s.id.index;
            f.unavailable += 1;
        }
        f.errors.push(why);
        bar.inc(shards.iter().map(|s| s.bytes).sum());
    };
    let client = match addr {
        None => return unavailable(&shards, format!("chunkserver {node} is not registered")),
        Some((addr, false)) => return unavailable(&shards, format!("chunkserver {node} ({addr}) is down")),
        Some((addr, true)) => chunk_client(&addr),
    };
    let mut client = match client {
        Ok(c) => c,
        Err(e) => return unavailable(&shards, format!("chunkserver {node}: {}", e.message())),
    };
    let mut rest = &shards[..];
    while !rest.is_empty() {
        let n = batch_len(rest, BATCH_SHARDS, BATCH_BYTES, |s| s.bytes);
        let bytes: u64 = rest[..n].iter().map(|s| s.bytes).sum();
        let (batch, after) = rest.split_at(n);
        rest = after;
        let req = p::CheckShardsRequest {
            ids: batch.iter().map(|s| s.id).collect(),
            verify,
            hashes: batch.iter().map(|s| s.content.clone()).collect(),
        };
        match client.check_shards(req).await {
            Ok(reply) => {
                let results = reply.into_inner().results;
                let mut f = found.lock().expect("not poisoned");
                for (s, r) in batch.iter().zip(&results) {
                    f.checked += 1;
                    f.bytes += s.bytes;
                    let masks = f.masks.entry((s.file, s.stripe)).or_default();
                    match p::ShardState::try_from(r.state).unwrap_or(p::ShardState::ShardUnreadable) {
                        p::ShardState::ShardOk => {}
                        p::ShardState::ShardMissing | p::ShardState::ShardCorrupt => {
                            masks.damaged |= 1 << s.id.index;
                            if r.state == p::ShardState::ShardCorrupt as i32 {
                                f.corrupt += 1;
                            } else {
                                f.missing += 1;
                            }
                            f.damaged.push(s.id);
                        }
                        p::ShardState::ShardUnreadable => {
                            masks.unavailable |= 1 << s.id.index;
                            f.unavailable += 1;
                            f.errors.push(format!("chunkserver {node}: {}", r.error));
                        }
                    }
                }
                drop(f);
                bar.inc(bytes);
            }
            Err(status) => {
                let e = CairnError::from(status);
                unavailable(&rest_with(batch, rest), format!("chunkserver {node}: {}", e.message()));
                return;
            }
        }
    }
}

fn rest_with(batch: &[Shard], rest: &[Shard]) -> Vec<Shard> {
    batch.iter().chain(rest).cloned().collect()
}

#[cfg(test)]
mod tests {
    use cairn_common::Layout;

    use super::*;

    #[test]
    fn stripes_are_healthy_degraded_or_unrecoverable() {
        let layout = Layout::new(4, 2, 4096).unwrap();
        let stripe = |missing| p::StripeInfo {
            index: 0,
            version: 1,
            len: 16384,
            written_len: 16384,
            missing,
            ..Default::default()
        };
        let f = Opened {
            ino: 5,
            path: "/f".into(),
            layout,
            placement: vec![1, 2, 3, 4, 5, 6],
            stripes: vec![stripe(0), stripe(1 << 2)],
        };
        assert_eq!(health(&f, 0, None), Health::Healthy);
        assert_eq!(health(&f, 1, None), Health::Degraded);
        let m = Masks { damaged: 1, unavailable: 1 << 5 };
        assert_eq!(health(&f, 0, Some(&m)), Health::Degraded);
        // Written degraded, then two more gone: three of six, more than m.
        assert_eq!(health(&f, 1, Some(&m)), Health::Unrecoverable);
    }
}

//! `cairn warmup PATH`: pull every shard of a file or directory tree into the SSD tier before a
//! job reads it. `cairn warmup --status PATH`: how much of it is on the SSD tier now (asks each
//! chunkserver where the shards are, moves nothing).
//!
//! The walk (`tree.rs`) goes through the metaserver only, so it works without a mount and never
//! reads file data. From each file's layout, placement and stripe records it derives the shard
//! ids and the chunkserver of each, leaving out shards a degraded write never stored
//! (`missing`) and empty data shards. Then it sends `Promote`
//! requests, in small batches so progress shows, to all chunkservers at once. A shard that does
//! not fit makes room by demoting least recently used shards that are neither pinned nor part
//! of this warmup (one random session id in every request); `--no-evict` uses free space only.
//! A chunkserver whose SSD tier is full even then stops there (the others go on), and the
//! command fails with a summary that says so. `--pin` also pins the files on their
//! chunkservers (the mover never demotes them, later warmups never evict them), `--unpin`
//! undoes it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto as p;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::admin::human;
use crate::tree::{batch_len, chunk_client, resolve, walk, Opened};

/// Most shards, and most bytes, in one `Promote` request: small enough that the progress bar
/// moves and a full SSD stops a node soon after it filled.
const BATCH_SHARDS: usize = 64;
const BATCH_BYTES: u64 = 64 << 20;

/// One shard to promote.
struct Shard {
    id: p::ShardId,
    bytes: u64,
    file: usize,
}

/// What the walk found.
#[derive(Default)]
struct Plan {
    files: usize,
    directories: usize,
    /// Shards per chunkserver id.
    shards: BTreeMap<u32, Vec<Shard>>,
    /// Shards left per file, so the progress can count finished files.
    per_file: Vec<u64>,
    bytes: u64,
}

/// How `cairn warmup` may make room.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Demote other (least recently used, unpinned) shards when the SSD tier is full.
    pub evict: bool,
    /// Pin the tree on SSD.
    pub pin: bool,
}

/// What the promotion did on one chunkserver.
#[derive(Default)]
struct NodeOutcome {
    shards: u64,
    promoted: u64,
    promoted_bytes: u64,
    /// Other shards demoted to make room.
    evicted: u64,
    evicted_bytes: u64,
    already: u64,
    missing: u64,
    /// Shards of batches that failed or were never sent.
    not_promoted: u64,
    error: Option<CairnError>,
}

pub async fn warmup(path: &Path, meta: Option<String>, opts: Options, as_json: bool) -> Result<()> {
    let (meta_addr, components, shown) = resolve(path, meta)?;
    let conn = cairn_client::connect_meta(&meta_addr).await?;
    let started = Instant::now();
    let bar = if as_json {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    };
    bar.set_style(ProgressStyle::with_template("{spinner} walking {msg}").expect("template"));
    bar.enable_steady_tick(Duration::from_millis(120));
    let mut plan = Plan::default();
    let (files, bytes) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0u64));
    let directories = walk(
        &conn,
        &components,
        |f| {
            files.set(files.get() + 1);
            bytes.set(bytes.get() + f.shards().map(|(_, _, _, b)| b).sum::<u64>());
            add_file(&mut plan, f);
        },
        || bar.set_message(format!("{shown}: {} files, {}", files.get(), human(bytes.get()))),
    )
    .await?;
    plan.directories = directories;
    let walked = started.elapsed();

    let total_shards: u64 = plan.shards.values().map(|s| s.len() as u64).sum();
    bar.set_length(plan.bytes);
    bar.set_position(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}",
        )
        .expect("template"),
    );
    let files_done = Arc::new(AtomicU64::new(0));
    let empty_files = plan.per_file.iter().filter(|&&n| n == 0).count() as u64;
    files_done.fetch_add(empty_files, Ordering::Relaxed);
    bar.set_message(format!("files {}/{}", empty_files, plan.files));

    let addrs: HashMap<u32, (String, bool)> =
        conn.list_nodes(p::Empty {}).await?.nodes.into_iter().map(|n| (n.id, (n.addr, n.up))).collect();
    let left: Arc<Vec<AtomicU64>> = Arc::new(plan.per_file.iter().map(|&n| AtomicU64::new(n)).collect());
    let promote_started = Instant::now();
    // Every request of this run carries it: what the run promoted is never evicted for it.
    let session = rand::random::<u64>() | 1;
    let tasks = plan.shards.into_iter().map(|(node, shards)| {
        let addr = addrs.get(&node).cloned();
        let (bar, left, files_done, files) = (bar.clone(), left.clone(), files_done.clone(), plan.files);
        async move {
            let request = p::PromoteRequest { ids: Vec::new(), no_evict: !opts.evict, session };
            let outcome =
                promote_node(node, addr, shards, request, opts.pin, &bar, &left, &files_done, files).await;
            (node, outcome)
        }
    });
    let outcomes: Vec<(u32, NodeOutcome)> = futures::future::join_all(tasks).await;
    bar.finish_and_clear();
    let elapsed = started.elapsed();
    let promote_secs = promote_started.elapsed().as_secs_f64();

    let sum = |f: fn(&NodeOutcome) -> u64| outcomes.iter().map(|(_, o)| f(o)).sum::<u64>();
    let (promoted, promoted_bytes) = (sum(|o| o.promoted), sum(|o| o.promoted_bytes));
    let (already, missing, not_promoted) = (sum(|o| o.already), sum(|o| o.missing), sum(|o| o.not_promoted));
    let (evicted, evicted_bytes) = (sum(|o| o.evicted), sum(|o| o.evicted_bytes));
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|(node, o)| {
            let e = o.error.as_ref()?;
            let addr = addrs.get(node).map(|(a, _)| a.as_str()).unwrap_or("?");
            Some(format!("chunkserver {node} ({addr}): {}", e.message()))
        })
        .collect();
    let full = outcomes.iter().any(|(_, o)| o.error.as_ref().is_some_and(|e| e.kind() == ErrorKind::NoSpace));

    if as_json {
        let nodes: Vec<_> = outcomes
            .iter()
            .map(|(node, o)| {
                json!({
                    "node": node, "addr": addrs.get(node).map(|(a, _)| a.clone()),
                    "shards": o.shards, "promoted": o.promoted, "promoted_bytes": o.promoted_bytes,
                    "already": o.already, "missing": o.missing, "not_promoted": o.not_promoted,
                    "evicted": o.evicted, "evicted_bytes": o.evicted_bytes,
                    "error": o.error.as_ref().map(|e| e.message().to_string()),
                    "no_space": o.error.as_ref().is_some_and(|e| e.kind() == ErrorKind::NoSpace),
                })
            })
            .collect();
        let out = json!({
            "path": shown, "files": plan.files, "directories": plan.directories,
            "shards": total_shards, "bytes": plan.bytes,
            "promoted": promoted, "promoted_bytes": promoted_bytes, "already": already,
            "missing": missing, "not_promoted": not_promoted,
            "evicted": evicted, "evicted_bytes": evicted_bytes, "pinned": opts.pin,
            "seconds": elapsed.as_secs_f64(), "walk_seconds": walked.as_secs_f64(),
            "ok": failures.is_empty(), "ssd_full": full, "nodes": nodes,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
    } else {
        let rate = if promote_secs > 0.0 { promoted_bytes as f64 / promote_secs } else { 0.0 };
        println!(
            "warmup {shown}: {} files in {} directories, {} in {total_shards} shards, {:.1} s",
            plan.files,
            plan.directories,
            human(plan.bytes),
            elapsed.as_secs_f64(),
        );
        println!(
            "  promoted {promoted} shards ({} at {}/s), {already} already on SSD, {missing} missing{}",
            human(promoted_bytes),
            human(rate as u64),
            if not_promoted > 0 { format!(", {not_promoted} NOT promoted") } else { String::new() }
        );
        if evicted > 0 {
            println!("  made room by demoting {evicted} other shards ({}) to HDD", human(evicted_bytes));
        }
        if opts.pin {
            println!("  pinned: stays on SSD until `cairn warmup --unpin {shown}`");
        }
        for f in &failures {
            println!("  {f}");
        }
    }
    if failures.is_empty() {
        return Ok(());
    }
    let kind = if full { ErrorKind::NoSpace } else { ErrorKind::Io };
    let what = if full && opts.evict {
        "the SSD tier of a chunkserver is full even after demoting other data (what is left there \
         is pinned or part of this warmup: unpin something, raise ssd_capacity, or warm up less)"
    } else if full {
        "the SSD tier of a chunkserver is full (drop --no-evict to demote other data, raise ssd_capacity, \
         or warm up less)"
    } else {
        "some shards could not be promoted"
    };
    Err(CairnError::new(kind, format!("warmup of {shown}: {not_promoted} shards not promoted: {what}")))
}

/// Shards asked about in one `CheckShards` request.
const STATUS_BATCH: usize = 4096;

/// Where one chunkserver keeps the tree's shards.
#[derive(Default)]
struct Placement {
    shards: u64,
    ssd: u64,
    ssd_bytes: u64,
    hdd: u64,
    hdd_bytes: u64,
    missing: u64,
    /// Shards of pinned files, and their bytes.
    pinned: u64,
    pinned_bytes: u64,
    /// Shards that could not be asked about (node down or unreachable).
    unknown: u64,
    error: Option<String>,
}

/// The tree at `path` walked without a progress bar: its path inside Cairn, its shards per
/// chunkserver, and the chunkservers' addresses.
async fn walk_quietly(path: &Path, meta: Option<String>) -> Result<(String, Plan, HashMap<u32, String>)> {
    let (meta_addr, components, shown) = resolve(path, meta)?;
    let conn = cairn_client::connect_meta(&meta_addr).await?;
    let mut plan = Plan::default();
    plan.directories = walk(&conn, &components, |f| add_file(&mut plan, f), || {}).await?;
    let addrs = conn.list_nodes(p::Empty {}).await?.nodes.into_iter().map(|n| (n.id, n.addr)).collect();
    Ok((shown, plan, addrs))
}

/// `cairn warmup --status PATH`: how many of the tree's shards (and bytes) are on the SSD tier.
pub async fn status(path: &Path, meta: Option<String>, as_json: bool) -> Result<()> {
    let (shown, plan, addrs) = walk_quietly(path, meta).await?;
    let tasks = plan.shards.iter().map(|(node, shards)| {
        let addr = addrs.get(node).cloned();
        async move { (*node, placement_on(*node, addr, shards).await) }
    });
    let nodes: Vec<(u32, Placement)> = futures::future::join_all(tasks).await;
    let sum = |f: fn(&Placement) -> u64| nodes.iter().map(|(_, n)| f(n)).sum::<u64>();
    let (shards, ssd, ssd_bytes) = (sum(|n| n.shards), sum(|n| n.ssd), sum(|n| n.ssd_bytes));
    let (hdd, hdd_bytes, missing, unknown) =
        (sum(|n| n.hdd), sum(|n| n.hdd_bytes), sum(|n| n.missing), sum(|n| n.unknown));
    let (pinned, pinned_bytes) = (sum(|n| n.pinned), sum(|n| n.pinned_bytes));
    let share = if plan.bytes > 0 { ssd_bytes as f64 / plan.bytes as f64 } else { 1.0 };
    if as_json {
        let per_node: Vec<_> = nodes
            .iter()
            .map(|(node, n)| {
                json!({
                    "node": node, "addr": addrs.get(node), "shards": n.shards, "ssd": n.ssd,
                    "ssd_bytes": n.ssd_bytes, "hdd": n.hdd, "hdd_bytes": n.hdd_bytes,
                    "missing": n.missing, "unknown": n.unknown, "error": n.error,
                    "pinned": n.pinned, "pinned_bytes": n.pinned_bytes,
                })
            })
            .collect();
        let out = json!({
            "path": shown, "files": plan.files, "directories": plan.directories, "shards": shards,
            "bytes": plan.bytes, "ssd": ssd, "ssd_bytes": ssd_bytes, "hdd": hdd, "hdd_bytes": hdd_bytes,
            "missing": missing, "unknown": unknown, "ssd_share": share,
            "pinned": pinned, "pinned_bytes": pinned_bytes, "nodes": per_node,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
    } else {
        println!(
            "warmup status {shown}: {} files in {} directories, {} in {shards} shards",
            plan.files,
            plan.directories,
            human(plan.bytes)
        );
        println!(
            "  on SSD {ssd} shards ({}, {:.0}%), on HDD {hdd} ({}){}{}",
            human(ssd_bytes),
            share * 100.0,
            human(hdd_bytes),
            if missing > 0 { format!(", {missing} missing") } else { String::new() },
            if unknown > 0 {
                format!(", {unknown} on chunkservers that did not answer")
            } else {
                String::new()
            },
        );
        println!("  pinned {pinned} shards ({})", human(pinned_bytes));
        for (node, n) in &nodes {
            let addr = addrs.get(node).map_or("?", |a| a.as_str());
            match &n.error {
                Some(e) => println!("  node {node} ({addr}): {e}"),
                None => println!("  node {node} ({addr}): {} on SSD, {} on HDD", n.ssd, n.hdd),
            }
        }
    }
    Ok(())
}

/// `cairn warmup --unpin PATH`: unpin the tree's files on every chunkserver holding their
/// shards. Moves nothing: the mover demotes them again when they go cold.
pub async fn unpin(path: &Path, meta: Option<String>, as_json: bool) -> Result<()> {
    let (shown, plan, addrs) = walk_quietly(path, meta).await?;
    let tasks = plan.shards.iter().map(|(node, shards)| {
        let inos = inodes(shards);
        let addr = addrs.get(node).cloned();
        async move {
            let asked = async {
                let addr = addr.ok_or_else(|| {
                    CairnError::unavailable(format!("chunkserver {node} is not registered"))
                })?;
                pin_on(&mut chunk_client(&addr)?, &inos, true).await
            };
            (*node, asked.await)
        }
    });
    let outcomes: Vec<(u32, Result<u64>)> = futures::future::join_all(tasks).await;
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|(node, r)| r.as_ref().err().map(|e| format!("chunkserver {node}: {}", e.message())))
        .collect();
    let unpinned: u64 = outcomes.iter().filter_map(|(_, r)| r.as_ref().ok()).sum();
    if as_json {
        let out = json!({
            "path": shown, "files": plan.files, "chunkservers": outcomes.len(),
            "unpinned": unpinned, "errors": failures,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
    } else {
        println!(
            "unpin {shown}: {} files, {unpinned} pins removed on {} chunkservers",
            plan.files,
            outcomes.len()
        );
        for f in &failures {
            println!("  {f}");
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CairnError::unavailable(format!(
            "unpin of {shown}: {} chunkservers did not answer; run it again once they are up",
            failures.len()
        )))
    }
}

/// Ask chunkserver `node` where each of `shards` is.
async fn placement_on(node: u32, addr: Option<String>, shards: &[Shard]) -> Placement {
    let mut out = Placement { shards: shards.len() as u64, ..Placement::default() };
    let asked = async {
        let addr =
            addr.ok_or_else(|| CairnError::unavailable(format!("chunkserver {node} is not registered")))?;
        let mut client = chunk_client(&addr)?;
        for batch in shards.chunks(STATUS_BATCH) {
            let ids = batch.iter().map(|s| s.id).collect();
            let reply = client
                .check_shards(p::CheckShardsRequest { ids, verify: false, hashes: Vec::new() })
                .await
                .map_err(CairnError::from)?
                .into_inner();
            for (shard, result) in batch.iter().zip(reply.results) {
                if result.pinned {
                    (out.pinned, out.pinned_bytes) = (out.pinned + 1, out.pinned_bytes + shard.bytes);
                }
                match result.tier.as_str() {
                    "ssd" => (out.ssd, out.ssd_bytes) = (out.ssd + 1, out.ssd_bytes + shard.bytes),
                    "hdd" => (out.hdd, out.hdd_bytes) = (out.hdd + 1, out.hdd_bytes + shard.bytes),
                    _ => out.missing += 1,
                }
            }
        }
        Ok::<(), CairnError>(())
    }
    .await;
    if let Err(e) = asked {
        out.unknown = out.shards - out.ssd - out.hdd - out.missing;
        out.error = Some(e.message().to_string());
    }
    out
}

fn add_file(plan: &mut Plan, f: Opened) {
    let file = plan.files;
    plan.files += 1;
    let mut count = 0;
    for (s, index, node, bytes) in f.shards() {
        let id = p::ShardId { ino: f.ino, stripe: s.index, index, version: s.version };
        plan.shards.entry(node).or_default().push(Shard { id, bytes, file });
        plan.bytes += bytes;
        count += 1;
    }
    plan.per_file.push(count);
}

/// Inodes per `Pin` request (each saves the chunkserver's pin set once).
const PIN_BATCH: usize = 50_000;

/// Pin (or with `unpin`, unpin) `inos` on a chunkserver, in a few large requests; how many
/// changed.
async fn pin_on(
    client: &mut cairn_proto::chunk_client::ChunkClient<tonic::transport::Channel>,
    inos: &[u64],
    unpin: bool,
) -> Result<u64> {
    let mut changed = 0;
    for batch in inos.chunks(PIN_BATCH) {
        let req = p::PinRequest { inos: batch.to_vec(), unpin };
        changed += client.pin(req).await.map_err(CairnError::from)?.into_inner().changed as u64;
    }
    Ok(changed)
}

/// The distinct inodes of `shards`.
fn inodes(shards: &[Shard]) -> Vec<u64> {
    let mut inos: Vec<u64> = shards.iter().map(|s| s.id.ino).collect();
    inos.sort_unstable();
    inos.dedup();
    inos
}

/// Promote one chunkserver's shards (after pinning their files, with `pin`), batch by batch
/// (each a copy of `request` with its ids), until done or the first error.
#[allow(clippy::too_many_arguments)]
async fn promote_node(
    node: u32,
    addr: Option<(String, bool)>,
    shards: Vec<Shard>,
    request: p::PromoteRequest,
    pin: bool,
    bar: &ProgressBar,
    left: &[AtomicU64],
    files_done: &AtomicU64,
    files: usize,
) -> NodeOutcome {
    let mut out = NodeOutcome { shards: shards.len() as u64, ..NodeOutcome::default() };
    let client = match addr {
        None => Err(CairnError::unavailable(format!("chunkserver {node} is not registered"))),
        Some((_, false)) => Err(CairnError::unavailable(format!("chunkserver {node} is down"))),
        Some((addr, true)) => chunk_client(&addr),
    };
    let mut client = match client {
        Ok(c) => c,
        Err(e) => {
            out.not_promoted = out.shards;
            out.error = Some(e);
            return out;
        }
    };
    if pin {
        if let Err(e) = pin_on(&mut client, &inodes(&shards), false).await {
            out.not_promoted = out.shards;
            out.error = Some(e);
            return out;
        }
    }
    let mut rest = &shards[..];
    while !rest.is_empty() {
        let n = batch_len(rest, BATCH_SHARDS, BATCH_BYTES, |s| s.bytes);
        let bytes: u64 = rest[..n].iter().map(|s| s.bytes).sum();
        let (batch, after) = rest.split_at(n);
        rest = after;
        let req = p::PromoteRequest { ids: batch.iter().map(|s| s.id).collect(), ..request.clone() };
        match client.promote(req).await {
            Ok(reply) => {
                let r = reply.into_inner();
                out.promoted += r.promoted as u64;
                out.already += r.already as u64;
                out.missing += r.missing as u64;
                out.promoted_bytes += r.bytes;
                out.evicted += r.evicted as u64;
                out.evicted_bytes += r.evicted_bytes;
                if !r.error.is_empty() {
                    // Stopped early: the reply counts what it did before.
                    let kind = if r.no_space { ErrorKind::NoSpace } else { ErrorKind::Io };
                    out.not_promoted = r.not_looked_at as u64 + rest.len() as u64;
                    out.error = Some(CairnError::new(kind, r.error));
                    return out;
                }
            }
            Err(status) => {
                out.not_promoted = (batch.len() + rest.len()) as u64;
                out.error = Some(CairnError::from(status));
                return out;
            }
        }
        bar.inc(bytes);
        for s in batch {
            if left[s.file].fetch_sub(1, Ordering::Relaxed) == 1 {
                let done = files_done.fetch_add(1, Ordering::Relaxed) + 1;
                bar.set_message(format!("files {done}/{files}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use cairn_common::Layout;

    use super::*;

    #[test]
    fn shards_skip_missing_and_empty_ones() {
        let layout = Layout::new(4, 2, 4096).unwrap();
        let mut plan = Plan::default();
        let stripes = vec![
            // One byte: data shard 0 plus two parity shards.
            p::StripeInfo { index: 0, version: 7, len: 1, written_len: 1, ..Default::default() },
            // A full stripe whose shard 5 was never stored.
            p::StripeInfo {
                index: 1,
                version: 8,
                len: 4 * 4096,
                written_len: 4 * 4096,
                missing: 1 << 5,
                ..Default::default()
            },
        ];
        let placement = vec![10, 11, 12, 13, 14, 15];
        add_file(&mut plan, Opened { ino: 9, path: "/f".into(), layout, placement, stripes });
        let all: Vec<(u32, u64, u32)> = plan
            .shards
            .iter()
            .flat_map(|(node, s)| s.iter().map(move |s| (*node, s.id.stripe, s.id.index)))
            .collect();
        assert_eq!(all.len(), 3 + 5);
        // Stripe 1 is rotated by one: shard i lives on placement[(1 + i) % 6].
        assert!(all.contains(&(12, 1, 1)));
        assert!(!all.contains(&(10, 1, 5)));
        assert!(all.contains(&(10, 0, 0)) && all.contains(&(14, 0, 4)) && all.contains(&(15, 0, 5)));
        assert_eq!(plan.bytes, 1 + 2 + 2 + 4 * 4096 + 4096);
        assert_eq!(plan.per_file, vec![8]);
    }
}

//! Admin commands that read cluster state from the metaserver: `cairn df` and `cairn status`.

use cairn_common::{CairnError, Result};
use cairn_proto as p;
use serde_json::json;

pub use cairn_common::units::human_bytes as human;

async fn cluster(meta: &str) -> Result<p::ClusterStatusReply> {
    cairn_client::connect_meta(meta).await?.cluster_status(p::Empty {}).await
}

/// A tier's share of its node's shard reads (`None` when the node served none).
fn hit_ratio(tier_reads: u64, node_reads: u64) -> Option<f64> {
    (node_reads > 0).then(|| tier_reads as f64 / node_reads as f64)
}

pub async fn df(meta: &str, as_json: bool) -> Result<()> {
    let status = cluster(meta).await?;
    let layout = status.default_layout.ok_or_else(|| CairnError::internal("no layout in status"))?;
    let (k, m) = (layout.k as u64, layout.m as u64);
    // A filesystem several tiers share (chunkservers on one disk) counts once, at the first up
    // row on it; rows are numbered from 1 in the order printed.
    let (raw_capacity, raw_free) =
        cairn_common::space::raw_space(status.nodes.iter().filter(|n| n.up).flat_map(|n| &n.tiers));
    let row_numbers: Vec<(bool, &p::TierUsage)> =
        status.nodes.iter().flat_map(|n| n.tiers.iter().map(move |t| (n.up, t))).collect();
    let up_rows: Vec<usize> = (0..row_numbers.len()).filter(|&i| row_numbers[i].0).collect();
    let up_tiers: Vec<&p::TierUsage> = up_rows.iter().map(|&i| row_numbers[i].1).collect();
    let mut shared_rows = vec![None; row_numbers.len()];
    for (j, first) in cairn_common::space::shared_with(&up_tiers).into_iter().enumerate() {
        shared_rows[up_rows[j]] = first.map(|f| up_rows[f]);
    }
    let mut shared = shared_rows.into_iter();
    let mut used = 0;
    let (mut reads, mut ssd_reads, mut promotions, mut demotions) = (0, 0, 0, 0);
    let mut rows = Vec::new();
    for n in &status.nodes {
        let node_reads: u64 = n.tiers.iter().map(|t| t.reads).sum();
        reads += node_reads;
        for t in &n.tiers {
            let shared_with = shared.next().flatten();
            used += t.used;
            if t.name == "ssd" {
                ssd_reads += t.reads;
                // A move counts in both its directories; count it once, on the SSD side.
                promotions += t.promotions;
                demotions += t.demotions;
            }
            rows.push(json!({
                "node": n.id, "addr": n.addr, "up": n.up, "tier": t.name, "path": t.path,
                "capacity": t.capacity, "free": t.free, "used": t.used, "shards": t.shards,
                "reads": t.reads, "read_bytes": t.read_bytes,
                "hit_ratio": hit_ratio(t.reads, node_reads),
                "promotions": t.promotions, "demotions": t.demotions,
                "fs_id": t.fs_id, "shared_with_row": shared_with.map(|r| r + 1),
            }));
        }
    }
    let usable = |raw: u64| raw / (k + m) * k;
    if as_json {
        let out = json!({
            "ec": format!("{k}+{m}"), "unit": layout.unit,
            "raw_capacity": raw_capacity, "raw_free": raw_free, "raw_used": used,
            "usable_capacity": usable(raw_capacity), "usable_free": usable(raw_free),
            "logical_bytes": status.logical_bytes,
            "reads": reads, "ssd_hit_ratio": hit_ratio(ssd_reads, reads),
            "promotions": promotions, "demotions": demotions,
            "health": status.health,
            "stripes_by_margin": margins_json(&status.stripes_by_margin),
            "reduced_redundancy_bytes": status.reduced_redundancy_bytes,
            "reduced_stripes_by_margin": margins_json(&status.reduced_stripes_by_margin),
            "tiers": rows,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(());
    }
    println!(
        "{:>3} {:>4}  {:<21} {:<4} {:<4} {:>11} {:>10} {:>10} {:>7} {:>8} {:>6} {:>6} {:>6}  PATH",
        "ROW",
        "NODE",
        "ADDRESS",
        "UP",
        "TIER",
        "SIZE",
        "FREE",
        "USED",
        "SHARDS",
        "READS",
        "HIT",
        "PROMO",
        "DEMO"
    );
    let mut any_shared = false;
    for (i, r) in rows.iter().enumerate() {
        let hit = r["hit_ratio"].as_f64().map(|h| format!("{:.0}%", h * 100.0)).unwrap_or_else(|| "-".into());
        // "=3": the same filesystem as row 3, counted there.
        let size = match r["shared_with_row"].as_u64() {
            Some(row) => {
                any_shared = true;
                format!("={row} {}", human(r["capacity"].as_u64().unwrap_or(0)))
            }
            None => human(r["capacity"].as_u64().unwrap_or(0)),
        };
        println!(
            "{:>3} {:>4}  {:<21} {:<4} {:<4} {:>11} {:>10} {:>10} {:>7} {:>8} {:>6} {:>6} {:>6}  {}",
            i + 1,
            r["node"].as_u64().unwrap_or(0),
            r["addr"].as_str().unwrap_or(""),
            if r["up"].as_bool() == Some(true) { "yes" } else { "no" },
            r["tier"].as_str().unwrap_or(""),
            size,
            human(r["free"].as_u64().unwrap_or(0)),
            human(r["used"].as_u64().unwrap_or(0)),
            r["shards"].as_u64().unwrap_or(0),
            r["reads"].as_u64().unwrap_or(0),
            hit,
            r["promotions"].as_u64().unwrap_or(0),
            r["demotions"].as_u64().unwrap_or(0),
            r["path"].as_str().unwrap_or(""),
        );
    }
    println!();
    if any_shared {
        println!("=N: on the same filesystem as row N (same machine and device), counted once in the totals");
    }
    println!(
        "EC {k}+{m}: raw {} ({} free), usable {} ({} free) after {:.0}% parity overhead",
        human(raw_capacity),
        human(raw_free),
        human(usable(raw_capacity)),
        human(usable(raw_free)),
        m as f64 * 100.0 / k as f64
    );
    println!("stored {} of shards for {} of file data", human(used), human(status.logical_bytes));
    println!(
        "redundancy: {}; {} at reduced redundancy ({})",
        margins_line(&status.stripes_by_margin),
        human(status.reduced_redundancy_bytes),
        status.health
    );
    let hit = hit_ratio(ssd_reads, reads).map(|h| format!("{:.1}%", h * 100.0)).unwrap_or_else(|| "-".into());
    println!(
        "shard reads {reads}, served from SSD {hit}; {promotions} promotions, {demotions} demotions \
         (HIT: the tier's share of its node's reads; counters since each chunkserver started)"
    );
    Ok(())
}

/// `cairn status`'s exit status for a health word: 0 OK, 2 WARN, 3 ERR; 1 when the metaserver
/// reports none (it predates health reports: nothing to vouch for). An unknown word (a newer
/// metaserver) counts as WARN.
pub fn health_code(health: &str) -> u8 {
    match health {
        "HEALTH_OK" => 0,
        "HEALTH_ERR" => 3,
        "" => 1,
        _ => 2,
    }
}

/// `HEALTH_WARN: 2 chunkservers down (5, 6), …`.
pub fn health_line(status: &p::ClusterStatusReply) -> String {
    if status.health.is_empty() {
        "HEALTH_UNKNOWN: this metaserver does not report health (an older version)".to_string()
    } else if status.health_checks.is_empty() {
        status.health.clone()
    } else {
        format!("{}: {}", status.health, status.health_checks.join(", "))
    }
}

/// `stripes that can lose 0 more: 16, 1 more: 3, 2 more: 40`.
fn margins_line(by_margin: &[u64]) -> String {
    let parts: Vec<String> = by_margin.iter().enumerate().map(|(j, n)| format!("{j} more: {n}")).collect();
    format!("stripes that can lose {}", parts.join(", "))
}

fn margins_json(by_margin: &[u64]) -> serde_json::Value {
    by_margin
        .iter()
        .enumerate()
        .map(|(j, n)| (j.to_string(), json!(n)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Prints the cluster's state and returns the exit status for its health.
pub async fn status(meta: &str, as_json: bool) -> Result<u8> {
    let status = cluster(meta).await?;
    let code = health_code(&status.health);
    let up = status.nodes.iter().filter(|n| n.up).count();
    if as_json {
        let nodes: Vec<_> = status
            .nodes
            .iter()
            .map(|n| {
                json!({
                    "id": n.id, "addr": n.addr, "up": n.up, "pid": n.pid,
                    "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago, "state": n.state,
                    "shards_left": n.shards_left,
                    "shards": n.tiers.iter().map(|t| t.shards).sum::<u64>(),
                    "full": n.full, "rebuild_in_ms": n.rebuild_in_ms,
                    "cert_not_after": n.cert_not_after,
                })
            })
            .collect();
        let out = json!({
            "health": status.health, "health_checks": status.health_checks,
            "cluster_id": status.cluster_id, "nodes_up": up, "nodes_down": status.nodes.len() - up, "nodes": nodes,
            "files": status.files, "directories": status.directories,
            "logical_bytes": status.logical_bytes, "pending_gc": status.pending_gc,
            "repair": {
                "degraded_stripes": status.degraded_stripes, "bytes_to_rebuild": status.bytes_to_rebuild,
                "unrecoverable_stripes": status.unrecoverable_stripes,
                "unrecoverable_files": status.unrecoverable_files,
                "shards_rebuilt": status.shards_rebuilt, "bytes_rebuilt": status.bytes_rebuilt,
                "rate": status.rebuild_rate,
                "stale_shards_deleted": status.stale_shards_deleted,
                "stripes_by_margin": margins_json(&status.stripes_by_margin),
                "reduced_redundancy_bytes": status.reduced_redundancy_bytes,
                "reduced_stripes_by_margin": margins_json(&status.reduced_stripes_by_margin),
            },
            "tls": tls_json(),
            "meta_cert_not_after": status.meta_cert_not_after,
            "access_rules": status.access_rules,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(code);
    }
    println!("{}", health_line(&status));
    println!(
        "metaserver {meta} (cluster {}): {up} of {} chunkservers up",
        status.cluster_id,
        status.nodes.len()
    );
    println!(
        "{:>4}  {:<21} {:<5} {:<24} {:>8} {:>8} {:>16}",
        "NODE", "ADDRESS", "UP", "STATE", "SHARDS", "PID", "LAST HEARTBEAT"
    );
    for n in &status.nodes {
        let age = if n.last_heartbeat_ms_ago == u64::MAX {
            "never".to_string()
        } else {
            format!("{:.1} s ago", n.last_heartbeat_ms_ago as f64 / 1000.0)
        };
        let state = match (n.state.as_str(), n.rebuild_in_ms) {
            ("draining", _) => format!("draining ({} left)", n.shards_left),
            (_, Some(0)) => "down, rebuilding".to_string(),
            (_, Some(ms)) => format!(
                "down, rebuild in {}",
                cairn_common::units::human_duration(std::time::Duration::from_millis(ms))
            ),
            _ if n.full => format!("{} (full)", n.state),
            _ => n.state.clone(),
        };
        println!(
            "{:>4}  {:<21} {:<5} {:<24} {:>8} {:>8} {:>16}",
            n.id,
            n.addr,
            if n.up { "up" } else { "down" },
            state,
            n.tiers.iter().map(|t| t.shards).sum::<u64>(),
            n.pid,
            age
        );
    }
    println!(
        "files {}, directories {}, data {}, shard deletions pending {}",
        status.files,
        status.directories,
        human(status.logical_bytes),
        status.pending_gc
    );
    let eta = match status.rebuild_rate {
        0 => "unknown".to_string(),
        rate => format!("{} s", status.bytes_to_rebuild / rate),
    };
    println!(
        "repair: {} degraded stripes, {} to rebuild at {}/s (ETA {eta}); {} shards ({}) rebuilt since start",
        status.degraded_stripes,
        human(status.bytes_to_rebuild),
        human(status.rebuild_rate),
        status.shards_rebuilt,
        human(status.bytes_rebuilt)
    );
    println!(
        "redundancy: {}; {} at reduced redundancy",
        margins_line(&status.stripes_by_margin),
        human(status.reduced_redundancy_bytes)
    );
    if status.stale_shards_deleted > 0 {
        println!("unreferenced shards deleted since start: {}", status.stale_shards_deleted);
    }
    if status.unrecoverable_stripes > 0 {
        println!(
            "UNRECOVERABLE until nodes return: {} stripes, in inodes {:?}",
            status.unrecoverable_stripes, status.unrecoverable_files
        );
    }
    println!("{}", tls_line());
    if let Some(line) = server_certs_line(&status) {
        println!("{line}");
    }
    match status.access_rules.as_slice() {
        [] => println!("access rules: none (every client certificate may do what its role allows)"),
        rules => {
            println!("access rules (the first that names a client certificate applies):");
            for rule in rules {
                println!("  {rule}");
            }
        }
    }
    Ok(code)
}

/// When the servers' certificates expire: the metaserver's, and the chunkservers' soonest.
fn server_certs_line(status: &p::ClusterStatusReply) -> Option<String> {
    let days = |t: i64| (t - cairn_common::time::unix_secs()) / 86_400;
    let soonest = status.nodes.iter().filter(|n| n.cert_not_after != 0).min_by_key(|n| n.cert_not_after);
    let mut parts = Vec::new();
    if status.meta_cert_not_after != 0 {
        parts.push(format!("metaserver's expires in {} days", days(status.meta_cert_not_after)));
    }
    if let Some(n) = soonest {
        parts.push(format!("the chunkservers' soonest (node {}) in {} days", n.id, days(n.cert_not_after)));
    }
    (!parts.is_empty()).then(|| format!("server certificates: {}", parts.join(", ")))
}

/// Whether this command talked TLS, and when its certificate and the cluster CA expire (the
/// servers' own: `cairn_tls_certificate_expiry_timestamp_seconds` on each).
fn tls_line() -> String {
    match cairn_net::tls::identity() {
        None => "tls: none (plaintext)".to_string(),
        Some(id) => format!(
            "tls: mutual, as {:?} (roles {}); its certificate expires {} (in {} days), the cluster CA {} (in {} days)",
            id.cert.name,
            id.cert.roles,
            cairn_net::tls::format_time(id.cert.not_after),
            id.cert.expires_in() / 86_400,
            cairn_net::tls::format_time(id.ca.not_after),
            id.ca.expires_in() / 86_400
        ),
    }
}

fn tls_json() -> serde_json::Value {
    match cairn_net::tls::identity() {
        None => json!(null),
        Some(id) => json!({
            "name": id.cert.name, "roles": id.cert.roles.to_string(),
            "cert_not_after": id.cert.not_after, "ca_not_after": id.ca.not_after,
        }),
    }
}

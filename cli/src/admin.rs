//! Admin commands that read cluster state from the metaserver: `cairn df` and `cairn status`.

use cairn_common::{CairnError, Result};
use cairn_proto as p;
use serde_json::json;

fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

async fn cluster(meta: &str) -> Result<p::ClusterStatusReply> {
    cairn_client::connect_meta(meta).await?.cluster_status(p::Empty {}).await
}

pub async fn df(meta: &str, as_json: bool) -> Result<()> {
    let status = cluster(meta).await?;
    let layout = status.default_layout.ok_or_else(|| CairnError::internal("no layout in status"))?;
    let (k, m) = (layout.k as u64, layout.m as u64);
    let mut raw_capacity = 0;
    let mut raw_free = 0;
    let mut used = 0;
    let mut rows = Vec::new();
    for n in &status.nodes {
        for t in &n.tiers {
            if n.up {
                raw_capacity += t.capacity;
                raw_free += t.free;
            }
            used += t.used;
            rows.push(json!({
                "node": n.id, "addr": n.addr, "up": n.up, "tier": t.name, "path": t.path,
                "capacity": t.capacity, "free": t.free, "used": t.used, "shards": t.shards,
            }));
        }
    }
    let usable = |raw: u64| raw / (k + m) * k;
    if as_json {
        let out = json!({
            "ec": format!("{k}+{m}"), "unit": layout.unit,
            "raw_capacity": raw_capacity, "raw_free": raw_free, "raw_used": used,
            "usable_capacity": usable(raw_capacity), "usable_free": usable(raw_free),
            "logical_bytes": status.logical_bytes, "tiers": rows,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(());
    }
    println!(
        "{:>4}  {:<21} {:<4} {:<4} {:>10} {:>10} {:>10} {:>7}  PATH",
        "NODE", "ADDRESS", "UP", "TIER", "SIZE", "FREE", "USED", "SHARDS"
    );
    for r in &rows {
        println!(
            "{:>4}  {:<21} {:<4} {:<4} {:>10} {:>10} {:>10} {:>7}  {}",
            r["node"].as_u64().unwrap_or(0),
            r["addr"].as_str().unwrap_or(""),
            if r["up"].as_bool() == Some(true) { "yes" } else { "no" },
            r["tier"].as_str().unwrap_or(""),
            human(r["capacity"].as_u64().unwrap_or(0)),
            human(r["free"].as_u64().unwrap_or(0)),
            human(r["used"].as_u64().unwrap_or(0)),
            r["shards"].as_u64().unwrap_or(0),
            r["path"].as_str().unwrap_or(""),
        );
    }
    println!();
    println!(
        "EC {k}+{m}: raw {} ({} free), usable {} ({} free) after {:.0}% parity overhead",
        human(raw_capacity),
        human(raw_free),
        human(usable(raw_capacity)),
        human(usable(raw_free)),
        m as f64 * 100.0 / k as f64
    );
    println!("stored {} of shards for {} of file data", human(used), human(status.logical_bytes));
    Ok(())
}

pub async fn status(meta: &str, as_json: bool) -> Result<()> {
    let status = cluster(meta).await?;
    let up = status.nodes.iter().filter(|n| n.up).count();
    if as_json {
        let nodes: Vec<_> = status
            .nodes
            .iter()
            .map(|n| json!({"id": n.id, "addr": n.addr, "up": n.up, "pid": n.pid, "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago}))
            .collect();
        let out = json!({
            "nodes_up": up, "nodes_down": status.nodes.len() - up, "nodes": nodes,
            "files": status.files, "directories": status.directories,
            "logical_bytes": status.logical_bytes, "pending_gc": status.pending_gc,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(());
    }
    println!("metaserver {meta}: {up} of {} chunkservers up", status.nodes.len());
    println!("{:>4}  {:<21} {:<5} {:>8} {:>16}", "NODE", "ADDRESS", "STATE", "PID", "LAST HEARTBEAT");
    for n in &status.nodes {
        let age = if n.last_heartbeat_ms_ago == u64::MAX {
            "never".to_string()
        } else {
            format!("{:.1} s ago", n.last_heartbeat_ms_ago as f64 / 1000.0)
        };
        println!(
            "{:>4}  {:<21} {:<5} {:>8} {:>16}",
            n.id,
            n.addr,
            if n.up { "up" } else { "down" },
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
    Ok(())
}

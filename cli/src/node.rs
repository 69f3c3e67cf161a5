//! `cairn node list|drain|activate|remove`: the chunkserver lifecycle.
//!
//! Draining marks a node so that no new file is placed on it; the metaserver's repair then
//! moves every shard it holds to other nodes (copying from the node itself while it serves,
//! decoding from the others if it cannot) and switches each file's placement once its shards
//! are moved. `drain --wait` shows the progress until nothing is left. `remove` forgets a node
//! that no file needs any more (or, with `--force`, one that is dead: its shards are then
//! rebuilt from the other shards of each stripe).

use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto as p;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

fn node_json(n: &p::NodeInfo) -> serde_json::Value {
    json!({
        "id": n.id, "addr": n.addr, "up": n.up, "state": n.state, "shards_left": n.shards_left,
        "shards": n.tiers.iter().map(|t| t.shards).sum::<u64>(),
    })
}

pub async fn list(meta: &str, as_json: bool) -> Result<()> {
    let nodes = cairn_client::connect_meta(meta).await?.list_nodes(p::Empty {}).await?.nodes;
    if as_json {
        let out: Vec<_> = nodes.iter().map(node_json).collect();
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(());
    }
    println!("{:>4}  {:<21} {:<5} {:<9} {:>8}", "NODE", "ADDRESS", "UP", "STATE", "SHARDS");
    for n in &nodes {
        println!(
            "{:>4}  {:<21} {:<5} {:<9} {:>8}",
            n.id,
            n.addr,
            if n.up { "up" } else { "down" },
            n.state,
            n.tiers.iter().map(|t| t.shards).sum::<u64>()
        );
    }
    Ok(())
}

pub async fn drain(meta: &str, id: u32, wait: bool, as_json: bool) -> Result<()> {
    // A repair pass that moves shards may take long.
    let conn = cairn_client::connect_meta_with_timeout(meta, Duration::from_secs(24 * 3600)).await?;
    let node = conn.drain_node(p::NodeRequest { node: id, force: false }).await?.node.unwrap_or_default();
    if !wait {
        if as_json {
            println!("{}", serde_json::to_string_pretty(&node_json(&node)).expect("json"));
        } else {
            println!(
                "chunkserver {id} ({}) is draining: no new files go there, and the repair moves its \
                 shards away; follow it with `cairn status` or `cairn node drain {id} --wait`",
                node.addr
            );
        }
        return Ok(());
    }
    let bar = if as_json {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    };
    bar.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}").expect("template"));
    bar.enable_steady_tick(Duration::from_millis(120));
    // Wait for a pass that started after the drain and found nothing left on the node.
    let node = loop {
        let status = conn.repair_now(p::Empty {}).await?;
        let n = status
            .nodes
            .into_iter()
            .find(|n| n.id == id)
            .ok_or_else(|| CairnError::not_found(format!("chunkserver {id} is gone")))?;
        if n.state != "draining" {
            return Err(CairnError::new(
                ErrorKind::Interrupted,
                format!("chunkserver {id} is {} now; the drain was cancelled", n.state),
            ));
        }
        if n.shards_left == 0 {
            break n;
        }
        bar.set_message(format!("chunkserver {id}: {} shards still to move", n.shards_left));
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    bar.finish_and_clear();
    if as_json {
        println!("{}", serde_json::to_string_pretty(&node_json(&node)).expect("json"));
    } else {
        println!(
            "chunkserver {id} ({}) is drained: no file needs it; `cairn node remove {id}` forgets it",
            node.addr
        );
    }
    Ok(())
}

pub async fn activate(meta: &str, id: u32, as_json: bool) -> Result<()> {
    let conn = cairn_client::connect_meta(meta).await?;
    let node = conn.activate_node(p::NodeRequest { node: id, force: false }).await?.node.unwrap_or_default();
    if as_json {
        println!("{}", serde_json::json!({ "node": id, "addr": node.addr, "state": node.state }));
    } else {
        println!("chunkserver {id} ({}) is active: it takes new files again", node.addr);
    }
    Ok(())
}

pub async fn remove(meta: &str, id: u32, force: bool, as_json: bool) -> Result<()> {
    let conn = cairn_client::connect_meta(meta).await?;
    conn.remove_node(p::NodeRequest { node: id, force }).await?;
    if as_json {
        println!("{}", serde_json::json!({ "node": id, "state": "removed", "forced": force }));
    } else {
        println!(
            "chunkserver {id} removed{}",
            if force { "; shards it held are rebuilt on the other nodes" } else { "" }
        );
    }
    Ok(())
}

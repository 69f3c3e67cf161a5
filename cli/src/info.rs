//! `cairn info PATH` (where a file lives: inode, layout, stripes, the chunkservers holding its
//! shards) and `cairn layout get|set DIR` (the erasure-coding layout new files in a directory
//! get).

use std::collections::BTreeMap;
use std::path::Path;

use cairn_common::{CairnError, Layout, Result};
use cairn_proto as p;
use serde_json::{json, Value};

use crate::admin::human;
use crate::tree;
use cairn_client::caller::this_process;

const S_IFMT: u32 = 0o170000;

/// Stripes listed one by one in the human output (`--stripes` lists them all).
const STRIPES_SHOWN: usize = 8;

fn kind(mode: u32) -> &'static str {
    match mode & S_IFMT {
        0o040000 => "directory",
        0o100000 => "file",
        0o120000 => "symlink",
        0o020000 => "char device",
        0o060000 => "block device",
        0o010000 => "fifo",
        0o140000 => "socket",
        _ => "unknown",
    }
}

fn layout_json(l: &Layout) -> Value {
    json!({ "k": l.k, "m": l.m, "unit": l.unit, "stripe_bytes": l.stripe_bytes() })
}

/// Shard index as operators read it: data shards d0.., parity shards p0...
fn shard_name(layout: &Layout, index: u32) -> String {
    if index < layout.k {
        format!("d{index}")
    } else {
        format!("p{}", index - layout.k)
    }
}

pub async fn info(path: &Path, meta: Option<String>, all_stripes: bool, as_json: bool) -> Result<()> {
    let (meta, components, shown) = tree::resolve(path, meta)?;
    let conn = cairn_client::connect_meta(&meta).await?;
    let attr = tree::lookup(&conn, &components).await?;
    let mut out = json!({
        "path": shown, "ino": attr.ino, "type": kind(attr.mode), "size": attr.size,
        "mode": format!("{:04o}", attr.mode & 0o7777), "uid": attr.uid, "gid": attr.gid,
        "nlink": attr.nlink, "mtime": attr.mtime.as_ref().map_or(0, |t| t.sec),
    });
    let mut lines = vec![
        shown.clone(),
        format!("  inode      {}", attr.ino),
        format!("  type       {}", kind(attr.mode)),
        format!(
            "  mode       {:04o}  uid {}  gid {}  links {}",
            attr.mode & 0o7777,
            attr.uid,
            attr.gid,
            attr.nlink
        ),
    ];
    match attr.mode & S_IFMT {
        0o040000 => {
            let layout = layout_of(&conn, attr.ino).await?;
            out["layout"] = layout_json(&layout);
            lines.push(format!("  layout     {layout} (for files created here)"));
            let entries = count_entries(&conn, attr.ino).await?;
            out["entries"] = json!(entries);
            lines.push(format!("  entries    {entries}"));
        }
        0o100000 => {
            lines.push(format!("  size       {} ({} bytes)", human(attr.size), attr.size));
            let client_id = conn.register_client(p::Empty {}).await?.client_id;
            let file = tree::open_file(&conn, client_id, attr.ino, shown.clone()).await?;
            let nodes: BTreeMap<u32, p::NodeInfo> =
                conn.list_nodes(p::Empty {}).await?.nodes.into_iter().map(|n| (n.id, n)).collect();
            file_details(&file, &nodes, all_stripes, &mut out, &mut lines);
        }
        _ => lines.push(format!("  size       {} bytes", attr.size)),
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
    } else {
        println!("{}", lines.join("\n"));
    }
    Ok(())
}

fn file_details(
    file: &tree::Opened,
    nodes: &BTreeMap<u32, p::NodeInfo>,
    all_stripes: bool,
    out: &mut Value,
    lines: &mut Vec<String>,
) {
    let layout = file.layout;
    let node_json = |id: u32| match nodes.get(&id) {
        Some(n) => json!({ "node": id, "addr": n.addr, "up": n.up, "state": n.state }),
        None => json!({ "node": id, "addr": null, "up": false, "state": "unknown" }),
    };
    let node_line = |id: u32| match nodes.get(&id) {
        Some(n) => format!("{} {}{}", n.addr, if n.up { "up" } else { "DOWN" }, state_suffix(&n.state)),
        None => "unknown node".to_string(),
    };
    // Per node: shards and bytes it holds for this file.
    let mut per_node: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (_, _, node, bytes) in file.shards() {
        let e = per_node.entry(node).or_default();
        e.0 += 1;
        e.1 += bytes;
    }
    let degraded = file.stripes.iter().filter(|s| s.missing != 0).count();
    let stripes: Vec<Value> = file
        .stripes
        .iter()
        .map(|s| {
            let shards: Vec<Value> = (0..layout.width())
                .map(|i| {
                    let node = file.placement[layout.position(s.index, i)];
                    json!({
                        "index": i, "node": node, "bytes": layout.shard_len(i, s.written_len),
                        "stored": s.missing & (1 << i) == 0,
                    })
                })
                .collect();
            json!({ "index": s.index, "version": s.version, "len": s.len, "shards": shards })
        })
        .collect();
    out["layout"] = layout_json(&layout);
    out["stripes"] = json!(file.stripes.len());
    out["degraded_stripes"] = json!(degraded);
    out["placement"] = json!(file.placement.iter().map(|&n| node_json(n)).collect::<Vec<_>>());
    out["nodes"] = json!(per_node
        .iter()
        .map(|(&n, &(shards, bytes))| {
            let mut v = node_json(n);
            v["shards"] = json!(shards);
            v["bytes"] = json!(bytes);
            v
        })
        .collect::<Vec<_>>());
    out["stripe_list"] = json!(stripes);

    lines.push(format!("  layout     {layout} (stripe {})", human(layout.stripe_bytes())));
    lines.push(format!("  stripes    {} stored, {degraded} with shards missing", file.stripes.len()));
    lines.push("  shards by chunkserver".into());
    for (&n, &(shards, bytes)) in &per_node {
        lines.push(format!("    node {n:<4} {:<28} {shards} shards, {}", node_line(n), human(bytes)));
    }
    let shown = if all_stripes { file.stripes.len() } else { STRIPES_SHOWN.min(file.stripes.len()) };
    if shown > 0 {
        lines.push("  stripe     version  bytes      shard@node".into());
    }
    for s in &file.stripes[..shown] {
        let shards: Vec<String> = (0..layout.width())
            .map(|i| {
                let node = file.placement[layout.position(s.index, i)];
                let lost = if s.missing & (1 << i) != 0 { "!" } else { "" };
                format!("{}@{node}{lost}", shard_name(&layout, i))
            })
            .collect();
        lines.push(format!("    {:<8} {:<8} {:<10} {}", s.index, s.version, human(s.len), shards.join(" ")));
    }
    if shown < file.stripes.len() {
        lines.push(format!("    ... {} more (--stripes lists all)", file.stripes.len() - shown));
    }
}

fn state_suffix(state: &str) -> String {
    if state.is_empty() || state == "active" {
        String::new()
    } else {
        format!(", {state}")
    }
}

async fn layout_of(conn: &cairn_client::MetaConn, ino: u64) -> Result<Layout> {
    let reply = conn.get_layout(p::InoRequest { ino }).await?;
    Layout::try_from(&reply.layout.ok_or_else(|| CairnError::internal("GetLayout: no layout"))?)
}

async fn count_entries(conn: &cairn_client::MetaConn, ino: u64) -> Result<u64> {
    let mut after = Vec::new();
    let mut n = 0;
    loop {
        let page = conn
            .read_dir(p::ReadDirRequest {
                ino,
                after: after.clone(),
                limit: 4096,
                plus: false,
                caller: Some(this_process()),
            })
            .await?;
        n += page.entries.iter().filter(|e| e.name != b"." && e.name != b"..").count() as u64;
        match page.entries.last() {
            Some(last) if page.more => after = last.name.clone(),
            _ => return Ok(n),
        }
    }
}

/// Parse `K+M` (e.g. `4+2`, `8+3`) for clap, with `Layout::parse_ec`'s checks.
pub fn parse_ec(text: &str) -> std::result::Result<(u32, u32), String> {
    Layout::parse_ec(text).map(|l| (l.k, l.m)).map_err(|e| e.message().to_string())
}

pub async fn layout_get(path: &Path, meta: Option<String>, as_json: bool) -> Result<()> {
    let (meta, components, shown) = tree::resolve(path, meta)?;
    let conn = cairn_client::connect_meta(&meta).await?;
    let attr = tree::lookup(&conn, &components).await?;
    print_layout(&shown, &layout_of(&conn, attr.ino).await?, as_json);
    Ok(())
}

pub async fn layout_set(
    path: &Path,
    meta: Option<String>,
    ec: Option<(u32, u32)>,
    unit: Option<u64>,
    as_json: bool,
) -> Result<()> {
    let (meta, components, shown) = tree::resolve(path, meta)?;
    let conn = cairn_client::connect_meta(&meta).await?;
    let attr = tree::lookup(&conn, &components).await?;
    let old = layout_of(&conn, attr.ino).await?;
    let (k, m) = ec.unwrap_or((old.k, old.m));
    let unit = match unit {
        Some(u) => u32::try_from(u).map_err(|_| CairnError::invalid(format!("unit {u} is too large")))?,
        None => old.unit,
    };
    let layout = Layout::new(k, m, unit)?;
    let reply = conn.set_layout(p::SetLayoutRequest { ino: attr.ino, layout: Some(layout.into()) }).await?;
    let now = Layout::try_from(&reply.layout.ok_or_else(|| CairnError::internal("SetLayout: no layout"))?)?;
    print_layout(&shown, &now, as_json);
    Ok(())
}

fn print_layout(shown: &str, layout: &Layout, as_json: bool) {
    if as_json {
        let mut v = layout_json(layout);
        v["path"] = json!(shown);
        println!("{v}");
    } else {
        println!(
            "{shown}: ec {}+{} unit {} (stripe {})",
            layout.k,
            layout.m,
            human(layout.unit as u64),
            human(layout.stripe_bytes())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec_text_parses_or_says_why_not() {
        assert_eq!(parse_ec("4+2"), Ok((4, 2)));
        assert_eq!(parse_ec(" 8 + 3 "), Ok((8, 3)));
        assert!(parse_ec("4x2").unwrap_err().contains("K+M"));
        assert!(parse_ec("a+2").unwrap_err().contains("K is not"));
        assert!(parse_ec("0+2").unwrap_err().contains("k must be"), "the layout's own limits apply");
    }

    #[test]
    fn shards_are_named_data_then_parity() {
        let l = Layout::new(4, 2, 4096).unwrap();
        let names: Vec<String> = (0..6).map(|i| shard_name(&l, i)).collect();
        assert_eq!(names, ["d0", "d1", "d2", "d3", "p0", "p1"]);
    }
}

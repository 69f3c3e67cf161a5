//! `cairn meta status`, `add`, `remove`, `backup`, `groups`: every metaserver replica's view of the Raft
//! group — its state, term, the leader it knows, how far its log and state machine are, its last
//! snapshot — asked of each replica directly (so one that is cut off shows as such, not as the
//! leader's idea of it).
//!
//! Exit status: 0 when one leader is known to every replica that answers and all of them
//! answer, 2 when a leader serves but some replica does not answer or lags (or the replicas'
//! `raft_election_ms` differ), 3 when no leader is known (the namespace cannot change), 1 when
//! the command itself failed.

use std::time::Duration;

use cairn_common::{CairnError, Result};
use cairn_net::channels::Channels;
use cairn_net::failover::Failover;
use cairn_proto as p;
use serde_json::json;

/// A replica more than this many entries behind the leader counts as lagging.
const LAG: u64 = 1000;

pub async fn status(meta: &str, as_json: bool) -> Result<u8> {
    let addrs = Failover::parse(meta)?.addrs();
    let channels = Channels::new(Duration::from_secs(2), Duration::from_secs(5));
    let mut rows: Vec<(String, std::result::Result<p::RaftStatusReply, String>)> = Vec::new();
    let mut addrs = addrs;
    let mut next = 0;
    while next < addrs.len() {
        let addr = addrs[next].clone();
        next += 1;
        let answer = match channels.meta(&addr) {
            Ok(mut client) => client
                .raft_status(p::Empty {})
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.message().to_string()),
            Err(e) => Err(e.message().to_string()),
        };
        // Members the list does not name (added since) are asked too.
        if let Ok(status) = &answer {
            for member in &status.members {
                if !addrs.contains(&member.addr) {
                    addrs.push(member.addr.clone());
                }
            }
        }
        rows.push((addr, answer));
    }
    let answered: Vec<&p::RaftStatusReply> = rows.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
    let leaders: Vec<&&p::RaftStatusReply> = answered.iter().filter(|s| s.state == "leader").collect();
    // The leader of the highest term is the one that counts (an old one may not know yet).
    let leader = leaders.iter().max_by_key(|s| s.term).map(|s| (**s).clone());
    let single = answered.iter().any(|s| s.state == "single");
    let lead_index = leader.as_ref().map_or(0, |l| l.last_log_index);
    // A replica that does not answer is named by the others' member lists.
    let id_of =
        |addr: &str| answered.iter().flat_map(|s| s.members.iter()).find(|m| m.addr == addr).map(|m| m.id);
    let lagging = answered.iter().filter(|s| lead_index.saturating_sub(s.applied_index) > LAG).count();
    // Replicas whose Raft timing differs from the others': the read lease assumes it alike.
    let mut elections: Vec<u64> = answered
        .iter()
        .filter(|s| s.state != "single" && s.state != "starting")
        .map(|s| s.election_ms)
        .collect();
    elections.sort_unstable();
    elections.dedup();
    let mismatched = elections.len() > 1;
    let code = if single {
        0
    } else if leader.is_none() {
        3
    } else if answered.len() < rows.len() || lagging > 0 || mismatched {
        2
    } else {
        0
    };
    if as_json {
        let replicas: Vec<_> = rows
            .iter()
            .map(|(addr, r)| match r {
                Ok(s) => json!({
                    "addr": addr, "id": s.id, "state": s.state, "term": s.term, "leader": s.leader,
                    "leader_addr": s.leader_addr, "last_log_index": s.last_log_index,
                    "applied_index": s.applied_index, "snapshot_index": s.snapshot_index,
                    "lag": lead_index.saturating_sub(s.applied_index), "cluster": s.cluster,
                    "group": s.group, "election_ms": s.election_ms,
                    "members": s.members.iter().map(|m| json!({"id": m.id, "addr": m.addr, "voter": m.voter, "matched": m.matched})).collect::<Vec<_>>(),
                }),
                Err(e) => json!({"addr": addr, "id": id_of(addr), "error": e}),
            })
            .collect();
        let out = json!({
            "leader": leader.as_ref().map(|l| l.id),
            "leader_addr": leader.as_ref().map(|l| l.leader_addr.clone()),
            "term": leader.as_ref().map(|l| l.term),
            "election_ms_differ": mismatched,
            "replicas": replicas,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(code);
    }
    match (&leader, single) {
        (_, true) => println!("a lone metaserver (not replicated)"),
        (Some(l), _) if l.group != 0 => println!(
            "leader: replica {} at {}, term {} (metadata group {})",
            l.id, l.leader_addr, l.term, l.group
        ),
        (Some(l), _) => println!("leader: replica {} at {}, term {}", l.id, l.leader_addr, l.term),
        (None, _) => {
            println!("NO LEADER: the namespace cannot change until a majority of replicas elect one")
        }
    }
    if mismatched {
        println!(
            "WARNING: the replicas' raft_election_ms differ ({elections:?}): set them alike, the leader's \
             read lease assumes it"
        );
    }
    println!(
        "{:>3}  {:<22} {:<10} {:>5} {:>7} {:>10} {:>10} {:>8} {:>10}",
        "ID", "ADDRESS", "STATE", "TERM", "LEADER", "LOG", "APPLIED", "LAG", "SNAPSHOT"
    );
    for (addr, r) in &rows {
        match r {
            Ok(s) => println!(
                "{:>3}  {:<22} {:<10} {:>5} {:>7} {:>10} {:>10} {:>8} {:>10}",
                s.id,
                addr,
                s.state,
                s.term,
                if s.leader == 0 { "-".to_string() } else { s.leader.to_string() },
                s.last_log_index,
                s.applied_index,
                lead_index.saturating_sub(s.applied_index),
                s.snapshot_index
            ),
            Err(e) => {
                let id = id_of(addr).map_or("?".to_string(), |id| id.to_string());
                println!("{id:>3}  {addr:<22} {:<10} {e}", "no answer")
            }
        }
    }
    Ok(code)
}

/// `cairn meta add ID ADDR`: make the replica `id` (started with an empty data directory and
/// this cluster's settings) a voting member, once it has caught up.
pub async fn add(meta: &str, id: u64, addr: &str, wait: Duration) -> Result<()> {
    let request = p::RaftMemberRequest { id, addr: addr.to_string(), wait_ms: wait.as_millis() as u64 };
    let status = on_leader(meta, wait + Duration::from_secs(30), |mut client| {
        let request = request.clone();
        async move { client.raft_add_member(request).await }
    })
    .await?;
    println!("replica {id} at {addr} is a voting member");
    print_members(&status);
    Ok(())
}

/// `cairn meta remove ID`: the replica `id` stops voting and receiving entries.
pub async fn remove(meta: &str, id: u64) -> Result<()> {
    let request = p::RaftMemberRequest { id, ..Default::default() };
    let status = on_leader(meta, Duration::from_secs(60), |mut client| {
        let request = request.clone();
        async move { client.raft_remove_member(request).await }
    })
    .await?;
    println!("replica {id} was removed: stop its process; its data directory is no longer needed");
    print_members(&status);
    Ok(())
}

fn print_members(status: &p::RaftStatusReply) {
    println!("members now (as replica {}, leader {}, sees them):", status.id, status.leader);
    for m in &status.members {
        println!("  {:>3}  {:<22} {}", m.id, m.addr, if m.voter { "voter" } else { "learner" });
    }
}

/// Send `call` to the leader (following `NotLeader` through the list), waiting at most `wait`.
async fn on_leader<T, F, Fut>(meta: &str, wait: Duration, call: F) -> Result<T>
where
    F: Fn(p::meta_client::MetaClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    let failover = Failover::parse(meta)?.with_wait(Duration::from_secs(30));
    let channels = Channels::new(Duration::from_secs(2), wait);
    failover
        .call(|i| {
            let client = channels.meta(&failover.addr(i));
            let call = &call;
            async move { Ok(call(client?).await.map_err(CairnError::from)?.into_inner()) }
        })
        .await
}

/// `cairn meta backup DIR`: a consistent copy of the namespace, taken by the leader while it
/// serves, written to `DIR/cairn-meta-<applied index>-<unix time>.backup` (through a `.part`
/// file, synced, renamed when complete). Returns the file's path.
pub async fn backup(meta: &str, dir: &std::path::Path) -> Result<std::path::PathBuf> {
    use std::io::Write;
    use tokio_stream::StreamExt;
    std::fs::create_dir_all(dir)
        .map_err(|e| CairnError::from_io(&format!("cannot create {}", dir.display()), &e))?;
    let mut stream = on_leader(meta, Duration::from_secs(3600), |mut client| async move {
        client.raft_backup(p::Empty {}).await
    })
    .await?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let part = dir.join(format!("cairn-meta-{stamp}-{}.part", std::process::id()));
    let io = |what: &str, path: &std::path::Path| {
        let what = format!("{what} {}", path.display());
        move |e: std::io::Error| CairnError::from_io(&what, &e)
    };
    let mut out = std::io::BufWriter::new(std::fs::File::create(&part).map_err(io("cannot create", &part))?);
    let (mut index, mut total, mut written) = (0, 0, 0u64);
    let received = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(CairnError::from)?;
            if written == 0 {
                (index, total) = (chunk.applied_index, chunk.total_bytes);
            }
            out.write_all(&chunk.data).map_err(io("cannot write", &part))?;
            written += chunk.data.len() as u64;
        }
        if written == 0 || written != total {
            return Err(CairnError::unavailable(format!(
                "the backup stream ended after {written} of {total} bytes"
            )));
        }
        let file = out.into_inner().map_err(|e| CairnError::from_io("cannot write the backup", e.error()))?;
        file.sync_all().map_err(io("cannot sync", &part))
    }
    .await;
    if let Err(e) = received {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    let path = dir.join(format!("cairn-meta-{index}-{stamp}.backup"));
    std::fs::rename(&part, &path).map_err(io("cannot rename", &part))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("cannot sync", dir))?;
    println!("{} ({written} bytes, applied index {index})", path.display());
    Ok(path)
}

/// `cairn meta groups`: the group map (from group 0's leader) and each group's leader, asked
/// of its replicas. Exit 0 when every group has a leader, 3 when one has none.
pub async fn groups(meta: &str, as_json: bool) -> Result<u8> {
    let map = on_leader(meta, Duration::from_secs(30), |mut client| async move {
        client.get_group_map(p::Empty {}).await
    })
    .await?;
    let channels = Channels::new(Duration::from_secs(2), Duration::from_secs(5));
    let slots = cairn_meta::groups::slot_counts(&map);
    let mut rows = Vec::new();
    for g in &map.groups {
        let addrs: Vec<String> = if g.replicas.is_empty() {
            Failover::parse(meta)?.addrs()
        } else {
            g.replicas.iter().map(|r| cairn_meta::groups::replica_addr(r).to_string()).collect()
        };
        rows.push((g, group_leader(&channels, &addrs).await));
    }
    let code = if rows.iter().all(|(_, l)| l.is_some()) { 0 } else { 3 };
    if as_json {
        let groups: Vec<_> = rows
            .iter()
            .map(|(g, l)| {
                json!({
                    "group": g.group,
                    "replicas": g.replicas,
                    "slots": slots.get(&g.group).copied().unwrap_or(0),
                    "leader": l.as_ref().map(|l| l.id),
                    "leader_addr": l.as_ref().map(|l| l.leader_addr.clone()),
                    "term": l.as_ref().map(|l| l.term),
                    "map_version": l.as_ref().map(|l| l.map_version),
                })
            })
            .collect();
        let out = json!({"version": map.version, "spread_dirs": map.spread_dirs, "groups": groups});
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(code);
    }
    let spread =
        if map.spread_dirs { "spread over the groups by their slots" } else { "in their parent's group" };
    println!("group map version {}; new directories {spread}", map.version);
    println!("{:>5} {:>6} {:>5}  {:<32} REPLICAS", "GROUP", "SLOTS", "MAP", "LEADER");
    for (g, l) in &rows {
        // The map version the group's leader holds: behind the map's for a few seconds after
        // a change, until group 0's leader has shared it.
        let held =
            l.as_ref().filter(|l| l.state != "single").map_or("-".to_string(), |l| l.map_version.to_string());
        let leader = match l {
            Some(l) if l.state == "single" => "(not replicated)".to_string(),
            Some(l) => format!("{} at {}, term {}", l.id, l.leader_addr, l.term),
            None => "NONE".to_string(),
        };
        let replicas = if g.replicas.is_empty() { "-".to_string() } else { g.replicas.join(",") };
        println!(
            "{:>5} {:>6} {held:>5}  {:<32} {replicas}",
            g.group,
            slots.get(&g.group).copied().unwrap_or(0),
            leader
        );
    }
    Ok(code)
}

/// `cairn meta groups add GROUP REPLICAS`: register a running Raft group (each replica
/// `ID=HOST:PORT`) as a metadata group in group 0's map.
pub async fn add_group(meta: &str, group: u32, replicas: &str) -> Result<()> {
    let replicas: Vec<String> =
        replicas.split(',').map(|r| r.trim().to_string()).filter(|r| !r.is_empty()).collect();
    let map = register_group(meta, group, &replicas).await?;
    println!(
        "metadata group {group} is in the group map (version {}); it owns no namespace slots until slots move to it",
        map.version
    );
    Ok(())
}

/// Add metadata group `group` with `replicas` (each `ID=HOST:PORT`) to group 0's map.
pub async fn register_group(meta: &str, group: u32, replicas: &[String]) -> Result<p::GroupMap> {
    let request = p::MetaGroup { group, replicas: replicas.to_vec() };
    on_leader(meta, Duration::from_secs(60), |mut client| {
        let request = request.clone();
        async move { client.add_group(request).await }
    })
    .await
}

/// Give empty namespace `slots` to `group`: the map as it is after.
pub async fn give_slots(meta: &str, slots: Vec<u32>, group: u32) -> Result<p::GroupMap> {
    let request = p::MoveSlotsRequest { slots, group };
    on_leader(meta, Duration::from_secs(60), |mut client| {
        let request = request.clone();
        async move { client.move_slots(request).await }
    })
    .await
}

/// `cairn meta groups move SLOTS GROUP`: give empty namespace slots to a group.
pub async fn move_slots(meta: &str, slots: &str, group: u32) -> Result<()> {
    let request = p::MoveSlotsRequest { slots: parse_slots(slots)?, group };
    let map = give_slots(meta, request.slots.clone(), group).await?;
    let counts = cairn_meta::groups::slot_counts(&map);
    println!(
        "{} namespace slots are metadata group {group}'s (group map version {}); it owns {} in all",
        request.slots.len(),
        map.version,
        counts.get(&group).copied().unwrap_or(0)
    );
    Ok(())
}

/// Whether new directories spread over the groups: the map as it is after.
pub async fn set_spread(meta: &str, on: bool) -> Result<p::GroupMap> {
    let request = p::SpreadDirsRequest { on };
    on_leader(meta, Duration::from_secs(60), |mut client| async move { client.spread_dirs(request).await })
        .await
}

/// `cairn meta groups spread on|off`: whether new directories spread over the groups.
pub async fn spread_dirs(meta: &str, on: bool) -> Result<()> {
    let map = set_spread(meta, on).await?;
    let how = if on { "spread over the groups by their slots" } else { "made in their parent's group" };
    println!("new directories are {how} (group map version {})", map.version);
    Ok(())
}

/// Slots as `cairn meta groups move` takes them: comma-separated, each `N` or `N-M`.
fn parse_slots(text: &str) -> Result<Vec<u32>> {
    let bad = |part: &str| CairnError::invalid(format!("{part:?}: slots are N or N-M, comma-separated"));
    let mut slots = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (from, to) = part.split_once('-').unwrap_or((part, part));
        let from: u32 = from.trim().parse().map_err(|_| bad(part))?;
        let to: u32 = to.trim().parse().map_err(|_| bad(part))?;
        if from > to || to as usize >= cairn_meta::groups::SLOTS {
            return Err(CairnError::invalid(format!(
                "{part:?}: slots are numbered 0 to {}, lowest first",
                cairn_meta::groups::SLOTS - 1
            )));
        }
        slots.extend(from..=to);
    }
    if slots.is_empty() {
        return Err(CairnError::invalid("name the namespace slots to move"));
    }
    slots.sort_unstable();
    slots.dedup();
    Ok(slots)
}

/// The Raft status of the replica among `addrs` that answers as its group's leader (the one of
/// the highest term, should two), or a lone metaserver's.
async fn group_leader(channels: &Channels, addrs: &[String]) -> Option<p::RaftStatusReply> {
    let mut leader: Option<p::RaftStatusReply> = None;
    for addr in addrs {
        let Ok(mut client) = channels.meta(addr) else { continue };
        if let Ok(Ok(reply)) =
            tokio::time::timeout(Duration::from_secs(5), client.raft_status(p::Empty {})).await
        {
            let s = reply.into_inner();
            if (s.state == "leader" || s.state == "single") && leader.as_ref().is_none_or(|l| l.term < s.term)
            {
                leader = Some(s);
            }
        }
    }
    leader
}

/// Whether one of `replicas` (each `ID=HOST:PORT`) answers as its group's leader holding group
/// map `version` or a newer one.
pub async fn leader_holds(replicas: &[String], version: u64) -> bool {
    let channels = Channels::new(Duration::from_secs(2), Duration::from_secs(5));
    let addrs: Vec<String> =
        replicas.iter().map(|r| cairn_meta::groups::replica_addr(r).to_string()).collect();
    group_leader(&channels, &addrs).await.is_some_and(|s| s.map_version >= version)
}

/// `cairn meta groups remove GROUP`: forget a metadata group that owns no slots.
pub async fn remove_group(meta: &str, group: u32) -> Result<()> {
    let map = on_leader(meta, Duration::from_secs(60), |mut client| async move {
        client.remove_group(p::GroupRequest { group }).await
    })
    .await?;
    println!("metadata group {group} is not in the group map (version {})", map.version);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_slots;

    #[test]
    fn slots_are_numbers_and_ranges() {
        assert_eq!(parse_slots("1-3, 7,4095").unwrap(), vec![1, 2, 3, 7, 4095]);
        assert_eq!(parse_slots("7,1-3,2").unwrap(), vec![1, 2, 3, 7], "in order, each once");
        for bad in ["", ",", "a", "3-1", "1-4096", "5-", "-5", "1.5"] {
            assert!(parse_slots(bad).is_err(), "{bad:?}");
        }
    }
}

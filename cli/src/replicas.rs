//! `cairn meta status`: every metaserver replica's view of the Raft group — its state, term,
//! the leader it knows, how far its log and state machine are, its last snapshot — asked of
//! each replica directly (so one that is cut off shows as such, not as the leader's idea of it).
//!
//! Exit status: 0 when one leader is known to every replica that answers and all of them
//! answer, 2 when a leader serves but some replica does not answer or lags, 3 when no leader is
//! known (the namespace cannot change), 1 when the command itself failed.

use std::time::Duration;

use cairn_common::channels::Channels;
use cairn_common::failover::Failover;
use cairn_common::Result;
use cairn_proto as p;
use serde_json::json;

/// A replica more than this many entries behind the leader counts as lagging.
const LAG: u64 = 1000;

pub async fn status(meta: &str, as_json: bool) -> Result<u8> {
    let addrs = Failover::parse(meta)?.addrs().to_vec();
    let channels = Channels::new(Duration::from_secs(2), Duration::from_secs(5));
    let mut rows: Vec<(String, std::result::Result<p::RaftStatusReply, String>)> = Vec::new();
    for addr in &addrs {
        let answer = match channels.meta(addr) {
            Ok(mut client) => client
                .raft_status(p::Empty {})
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.message().to_string()),
            Err(e) => Err(e.message().to_string()),
        };
        rows.push((addr.clone(), answer));
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
    let code = if single {
        0
    } else if leader.is_none() {
        3
    } else if answered.len() < rows.len() || lagging > 0 {
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
                    "members": s.members.iter().map(|m| json!({"id": m.id, "addr": m.addr, "voter": m.voter, "matched": m.matched})).collect::<Vec<_>>(),
                }),
                Err(e) => json!({"addr": addr, "id": id_of(addr), "error": e}),
            })
            .collect();
        let out = json!({
            "leader": leader.as_ref().map(|l| l.id),
            "leader_addr": leader.as_ref().map(|l| l.leader_addr.clone()),
            "term": leader.as_ref().map(|l| l.term),
            "replicas": replicas,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return Ok(code);
    }
    match (&leader, single) {
        (_, true) => println!("a lone metaserver (not replicated)"),
        (Some(l), _) => println!("leader: replica {} at {}, term {}", l.id, l.leader_addr, l.term),
        (None, _) => {
            println!("NO LEADER: the namespace cannot change until a majority of replicas elect one")
        }
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

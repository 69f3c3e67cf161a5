//! The cluster's health in one line, the way `ceph health` reads: `HEALTH_OK`, `HEALTH_WARN`
//! or `HEALTH_ERR`, then what makes it so, worst first. Computed from the registry's view of
//! the chunkservers (live) and the last repair pass's count of stripes by how many more shards
//! each can lose, so a node that just went down shows at once and its stripes within a pass.

use std::time::Duration;

use cairn_common::units::{human_bytes as human, human_duration as duration};
use cairn_proto::NodeInfo;

use crate::cluster::Cluster;
use crate::repair_state::RepairState;
use crate::store::MetaStore;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warn,
    Err,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "HEALTH_OK",
            Level::Warn => "HEALTH_WARN",
            Level::Err => "HEALTH_ERR",
        }
    }

    /// 0, 1, 2: the value of the `cairn_health` gauge.
    pub fn gauge(self) -> f64 {
        self as u8 as f64
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub level: Level,
    /// One short phrase per problem, worst first.
    pub checks: Vec<String>,
}

impl Health {
    /// `HEALTH_WARN: 2 chunkservers down (5, 6), …`.
    pub fn line(&self) -> String {
        if self.checks.is_empty() {
            self.level.name().to_string()
        } else {
            format!("{}: {}", self.level.name(), self.checks.join(", "))
        }
    }
}

/// A TLS certificate this close to expiring is a warning.
const CERT_WARN_SECS: i64 = 30 * 86_400;

/// What leaves the metadata with fewer copies or leaders than it should have: this group's
/// replicas that do not answer its leader (`MetaStore::replication_problems`), then the other
/// metadata groups' troubles as the leader's last round of questions found them
/// (`Groups::health`), or that the group map cannot be read.
pub fn metadata_problems(store: &dyn MetaStore, cluster: &Cluster) -> Vec<String> {
    let mut problems = store.replication_problems();
    match cluster.groups().health() {
        Ok(groups) => problems.extend(groups),
        Err(e) => problems.push(format!("the metadata group map cannot be read: {e}")),
    }
    problems
}

/// `nodes` as `ClusterStatus` reports them (with `rebuild_in_ms` filled in for down nodes);
/// `durability_lost`: why the metadata store refuses changes, if it does; `replication`: what
/// leaves the metadata with fewer copies or leaders than it should have ([`metadata_problems`]);
/// `meta_cert_not_after`: when this metaserver's certificate expires (0: no TLS).
pub fn assess(
    nodes: &[NodeInfo],
    repair: &RepairState,
    durability_lost: Option<&str>,
    replication: &[String],
    meta_cert_not_after: i64,
) -> Health {
    let mut errors = Vec::new();
    let mut warnings = replication.to_vec();
    if let Some(reason) = durability_lost {
        errors.push(format!(
            "metadata store refuses changes ({reason}): restart the metaserver once its disk is fixed"
        ));
    }
    if repair.unrecoverable_stripes > 0 {
        errors.push(format!(
            "{} unreadable until chunkservers return (in {})",
            plural(repair.unrecoverable_stripes, "stripe"),
            plural(repair.unrecoverable_files.len() as u64, "file")
        ));
    }
    let down: Vec<&NodeInfo> = nodes.iter().filter(|n| !n.up).collect();
    if !down.is_empty() {
        warnings.push(format!("{} down ({})", plural(down.len() as u64, "chunkserver"), ids(&down)));
    }
    for (margin, &count) in repair.reduced_by_margin.iter().enumerate() {
        if count > 0 {
            let shards = if margin == 1 { "shard" } else { "shards" };
            warnings.push(format!("{} can lose {margin} more {shards}", plural(count, "stripe")));
        }
    }
    if repair.reduced_bytes > 0 {
        warnings.push(format!("{} at reduced redundancy", human(repair.reduced_bytes)));
    }
    let next_rebuild = down.iter().filter_map(|n| n.rebuild_in_ms).filter(|&ms| ms > 0).min();
    if let Some(ms) = next_rebuild {
        warnings.push(format!("rebuild starts in {}", duration(Duration::from_millis(ms))));
    }
    if repair.bytes_to_rebuild > 0 {
        warnings.push(format!("{} to rebuild", human(repair.bytes_to_rebuild)));
    }
    if repair.foreign_shards > 0 {
        let on: Vec<String> = repair.foreign_nodes.iter().map(u32::to_string).collect();
        warnings.push(format!(
            "{} of inodes this namespace never created, on chunkservers {} (kept: an older backup \
             of the namespace? see `cairn fsck`)",
            plural(repair.foreign_shards, "shard"),
            on.join(", ")
        ));
    }
    let full: Vec<&NodeInfo> = nodes.iter().filter(|n| n.up && n.full).collect();
    if !full.is_empty() {
        warnings.push(format!("{} full ({})", plural(full.len() as u64, "chunkserver"), ids(&full)));
    }
    warnings.extend(certificates(nodes, meta_cert_not_after, cairn_common::time::unix_secs()));
    let level = if !errors.is_empty() {
        Level::Err
    } else if !warnings.is_empty() {
        Level::Warn
    } else {
        Level::Ok
    };
    errors.extend(warnings);
    Health { level, checks: errors }
}

/// Warnings for certificates that expire within [`CERT_WARN_SECS`] of `now` (or have).
fn certificates(nodes: &[NodeInfo], meta_cert_not_after: i64, now: i64) -> Vec<String> {
    let soon = |t: i64| t != 0 && t - now < CERT_WARN_SECS;
    let when = |t: i64| match t - now {
        left if left <= 0 => "has expired".to_string(),
        left => format!("expires in {} days", left / 86_400),
    };
    let mut out = Vec::new();
    if soon(meta_cert_not_after) {
        out.push(format!("this metaserver's TLS certificate {}", when(meta_cert_not_after)));
    }
    let expiring: Vec<&NodeInfo> = nodes.iter().filter(|n| soon(n.cert_not_after)).collect();
    if let Some(first) = expiring.iter().min_by_key(|n| n.cert_not_after) {
        out.push(format!(
            "TLS certificates of {} ({}) expire within 30 days: the first {}",
            plural(expiring.len() as u64, "chunkserver"),
            ids(&expiring),
            when(first.cert_not_after)
        ));
    }
    out
}

fn plural(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn ids(nodes: &[&NodeInfo]) -> String {
    nodes.iter().map(|n| n.id.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32, up: bool, rebuild_in_ms: Option<u64>) -> NodeInfo {
        NodeInfo { id, up, rebuild_in_ms, ..Default::default() }
    }

    #[test]
    fn certificates_about_to_expire_are_warnings() {
        let now = 1_000_000_000;
        let with_cert = |id, days: i64| NodeInfo {
            id,
            up: true,
            cert_not_after: now + days * 86_400,
            ..Default::default()
        };
        let nodes =
            [with_cert(1, 200), with_cert(2, 12), with_cert(3, -1), NodeInfo { id: 4, ..Default::default() }];
        let checks = certificates(&nodes, now + 5 * 86_400, now);
        assert_eq!(
            checks,
            [
                "this metaserver's TLS certificate expires in 5 days",
                "TLS certificates of 2 chunkservers (2, 3) expire within 30 days: the first has expired",
            ]
        );
        assert!(certificates(&nodes[..1], 0, now).is_empty(), "no TLS, or far off: nothing");
    }

    #[test]
    fn healthy_is_ok_with_nothing_after_it() {
        let repair = RepairState { by_margin: vec![0, 0, 12], ..Default::default() };
        let h = assess(&[node(1, true, None), node(2, true, None)], &repair, None, &[], 0);
        assert_eq!(h.level, Level::Ok);
        assert_eq!(h.line(), "HEALTH_OK");
    }

    #[test]
    fn a_quiet_metaserver_replica_warns() {
        let repair = RepairState::default();
        let quiet = ["metaserver replica 2 (10.0.0.2:9400) has not answered the leader for 7 s".to_string()];
        let h = assess(&[node(1, true, None)], &repair, None, &quiet, 0);
        assert_eq!(h.level, Level::Warn);
        assert_eq!(h.line(), format!("HEALTH_WARN: {}", quiet[0]));
    }

    #[test]
    fn down_nodes_and_lost_redundancy_warn_with_counts_and_the_rebuild_time() {
        let repair = RepairState {
            by_margin: vec![16, 3, 40],
            reduced_by_margin: vec![16, 3],
            reduced_bytes: 3 << 20,
            ..Default::default()
        };
        let nodes = [node(1, true, None), node(5, false, Some(588_000)), node(6, false, Some(590_000))];
        let h = assess(&nodes, &repair, None, &[], 0);
        assert_eq!(h.level, Level::Warn);
        assert_eq!(
            h.line(),
            "HEALTH_WARN: 2 chunkservers down (5, 6), 16 stripes can lose 0 more shards, \
             3 stripes can lose 1 more shard, 3.0 MiB at reduced redundancy, rebuild starts in 9m48s"
        );
    }

    #[test]
    fn unreadable_stripes_are_an_error_and_come_first() {
        let repair = RepairState {
            unrecoverable_stripes: 3,
            unrecoverable_files: vec![7],
            bytes_to_rebuild: 1024,
            ..Default::default()
        };
        let mut full = node(2, true, None);
        full.full = true;
        let h = assess(&[node(1, false, Some(0)), full], &repair, None, &[], 0);
        assert_eq!(h.level, Level::Err);
        assert_eq!(
            h.line(),
            "HEALTH_ERR: 3 stripes unreadable until chunkservers return (in 1 file), \
             1 chunkserver down (1), 1.0 KiB to rebuild, 1 chunkserver full (2)"
        );
    }

    #[test]
    fn foreign_shards_warn_and_name_their_chunkservers() {
        let repair = RepairState { foreign_shards: 12, foreign_nodes: vec![2, 5], ..Default::default() };
        let h = assess(&[node(2, true, None), node(5, true, None)], &repair, None, &[], 0);
        assert_eq!(h.level, Level::Warn);
        assert!(
            h.line().starts_with(
                "HEALTH_WARN: 12 shards of inodes this namespace never created, on chunkservers 2, 5"
            ),
            "{}",
            h.line()
        );
    }

    #[test]
    fn a_store_that_lost_durability_is_an_error_before_anything_else() {
        let repair =
            RepairState { unrecoverable_stripes: 1, unrecoverable_files: vec![7], ..Default::default() };
        let h = assess(
            &[node(1, true, None)],
            &repair,
            Some("the group-commit fsync of the WAL failed: EIO"),
            &[],
            0,
        );
        assert_eq!(h.level, Level::Err);
        assert!(
            h.line().starts_with(
                "HEALTH_ERR: metadata store refuses changes (the group-commit fsync of the WAL failed: EIO)"
            ),
            "{}",
            h.line()
        );
        assert!(h.line().ends_with("(in 1 file)"), "{}", h.line());
    }
}

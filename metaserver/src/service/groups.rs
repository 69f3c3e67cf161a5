//! The group map as the service serves and changes it (`GetGroupMap`, `AddGroup`,
//! `RemoveGroup`; `groups.rs` keeps it): a group is added only once each replica named
//! answers as that replica of that group of this cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto::{GroupMap, MetaGroup};

use super::MetaService;
use crate::cluster::Cluster;
use crate::groups;
use crate::raft::network::GroupName;
use crate::raft::node::answers_as;

/// How long each replica of a group being added has to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long each replica of another group has to answer the leader's health question.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

impl MetaService {
    /// Group 0's replicas, as its Raft membership has them (none for a lone metaserver).
    fn group_zero(&self) -> MetaGroup {
        let replicas = match self.raft.get() {
            Some(raft) => raft.status().members.iter().map(|m| format!("{}={}", m.id, m.addr)).collect(),
            None => Vec::new(),
        };
        MetaGroup { group: 0, replicas }
    }

    /// The map as clients read it: group 0 first.
    pub(super) fn group_map(&self) -> Result<GroupMap, tonic::Status> {
        let mut map = self.serving()?.cluster.groups().map()?;
        map.groups.insert(0, self.group_zero());
        Ok(map)
    }

    pub(super) async fn add_group(&self, group: MetaGroup) -> Result<GroupMap, tonic::Status> {
        let replicas = groups::check_form(&group)?;
        let Some(raft) = self.raft.get() else {
            return Err(CairnError::new(
                ErrorKind::NotSupported,
                "this metaserver runs alone: metadata groups other than 0 need group 0 replicated \
                 (3 or 5 replicas)",
            )
            .into());
        };
        // Only group 0's leader keeps the map: ask nobody before that is known.
        self.serving()?;
        let wanted = GroupName::new(raft.cluster(), group.group);
        for (id, addr) in &replicas {
            self.check_replica(*id, addr, &wanted).await?;
        }
        let taken = self.group_zero().replicas;
        let added = group.clone();
        let (mut map, changed) = self.run_serving(move |s| s.cluster.groups().add(&added, &taken)).await?;
        if changed {
            tracing::info!(group = group.group, replicas = ?group.replicas, version = map.version, "added a metadata group");
        }
        map.groups.insert(0, self.group_zero());
        Ok(map)
    }

    pub(super) async fn remove_group(&self, group: u32) -> Result<GroupMap, tonic::Status> {
        let mut map = self.run_serving(move |s| s.cluster.groups().remove(group)).await?;
        map.groups.insert(0, self.group_zero());
        Ok(map)
    }

    pub(super) async fn move_slots(
        &self,
        req: cairn_proto::MoveSlotsRequest,
    ) -> Result<GroupMap, tonic::Status> {
        let (mut map, changed) = self
            .run_serving(move |s| {
                let store = s.ns.store().clone();
                s.cluster
                    .groups()
                    .move_empty_slots(&req.slots, req.group, |slot| groups::slot_holds_records(&*store, slot))
            })
            .await?;
        if changed {
            tracing::info!(version = map.version, counts = ?groups::slot_counts(&map), "moved namespace slots");
        }
        map.groups.insert(0, self.group_zero());
        Ok(map)
    }

    /// Ask every registered group (other than 0) how it is, every `every` while this replica
    /// serves `cluster`, and keep the answers there for `cairn status` and the health checks
    /// ([`crate::groups::Groups::health`]): a request never waits on another group's replicas.
    pub async fn watch_groups(self: Arc<Self>, cluster: Arc<Cluster>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match cluster.groups().map() {
                Ok(map) => cluster.groups().set_health(self.group_health(&map).await),
                Err(e) => tracing::warn!("reading the group map to ask its groups: {e}"),
            }
        }
    }

    /// What is wrong with each group of `map` that has no leader or replicas that do not
    /// answer. Every replica of every group is asked at once, each given [`HEALTH_TIMEOUT`], so
    /// a round takes about that long however many groups are down.
    async fn group_health(&self, map: &GroupMap) -> BTreeMap<u32, String> {
        let asked = map.groups.iter().map(|group| async move { (group.group, self.one_group(group).await) });
        futures::future::join_all(asked)
            .await
            .into_iter()
            .filter_map(|(g, problem)| problem.map(|p| (g, p)))
            .collect()
    }

    /// What is wrong with `group`, if anything.
    async fn one_group(&self, group: &MetaGroup) -> Option<String> {
        let addrs: Vec<&str> = group.replicas.iter().map(|r| groups::replica_addr(r)).collect();
        let asked = addrs.iter().map(|addr| async move {
            let mut client = self.channels.meta(addr).ok()?;
            let reply = tokio::time::timeout(HEALTH_TIMEOUT, client.raft_status(cairn_proto::Empty {}))
                .await
                .ok()?
                .ok()?
                .into_inner();
            (reply.group == group.group).then_some(reply.state == "leader")
        });
        let answers: Vec<Option<bool>> = futures::future::join_all(asked).await;
        let answering = answers.iter().filter(|a| a.is_some()).count();
        let (g, n) = (group.group, addrs.len());
        // A leader cut off from the others may still call itself one: a majority answering is
        // what lets the group change.
        if answering < n / 2 + 1 {
            Some(format!("metadata group {g} has lost its majority: {answering} of {n} replicas answer"))
        } else if !answers.contains(&Some(true)) {
            Some(format!("metadata group {g} has no leader"))
        } else if answering < n {
            Some(format!("metadata group {g}: {} of {n} replicas do not answer", n - answering))
        } else {
            None
        }
    }

    /// The replica at `addr` answers as replica `id` of `wanted`.
    async fn check_replica(&self, id: u64, addr: &str, wanted: &GroupName) -> Result<()> {
        let mut client = self.channels.meta(addr)?;
        let status = tokio::time::timeout(ASK_TIMEOUT, client.raft_status(cairn_proto::Empty {}))
            .await
            .map_err(|_| {
                CairnError::unavailable(format!(
                    "replica {id} of the group to add, at {addr}, does not answer"
                ))
            })?
            .map_err(|s| {
                CairnError::unavailable(format!(
                    "replica {id} of the group to add, at {addr}, does not answer: {}",
                    s.message()
                ))
            })?
            .into_inner();
        if status.state == "starting" {
            return Err(CairnError::unavailable(format!(
                "replica {id} of the group to add, at {addr}, is starting: try again"
            )));
        }
        answers_as(&status, addr, id, wanted)
    }
}

//! The group map as the service serves and changes it (`GetGroupMap`, `AddGroup`,
//! `RemoveGroup`; `groups.rs` keeps it): a group is added only once each replica named
//! answers as that replica of that group of this cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto::meta_client::MetaClient;
use cairn_proto::{GroupMap, MetaGroup, SharedGroupMap};
use tonic::transport::Channel;

use super::MetaService;
use crate::cluster::Cluster;
use crate::groups;
use crate::raft::network::GroupName;
use crate::raft::node::answers_as;

/// What group 0's leader found when it asked a group's replicas.
/// A leader as it answered: its address, and its repair.
type Leading = (String, Option<cairn_proto::GroupRepair>);

struct GroupSeen {
    /// What is wrong with the group, if anything.
    problem: Option<String>,
    /// The address of the replica that answered as its leader.
    leader: Option<String>,
    /// Its repair, as its leader reported it.
    repair: Option<cairn_proto::GroupRepair>,
}

/// How long each replica of a group being added has to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long each replica of another group has to answer the leader's health question.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// How long group 0's leader waits for another group's promise to give slots up.
const PROMISE_TIMEOUT: Duration = Duration::from_secs(5);

impl MetaService {
    /// Group 0's replicas, as its Raft membership has them (none for a lone metaserver).
    pub(super) fn group_zero(&self) -> MetaGroup {
        let replicas = match self.raft.get() {
            Some(raft) => raft.status().members.iter().map(|m| format!("{}={}", m.id, m.addr)).collect(),
            None => Vec::new(),
        };
        MetaGroup { group: 0, replicas }
    }

    /// The map as clients read it: group 0 first.
    pub(super) fn group_map(&self) -> Result<GroupMap, tonic::Status> {
        let mut map = self.zero()?.cluster.groups().map()?;
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
        self.zero()?;
        let wanted = GroupName::new(raft.cluster(), group.group);
        for (id, addr) in &replicas {
            self.check_replica(*id, addr, &wanted).await?;
        }
        let taken = self.group_zero().replicas;
        let added = group.clone();
        let (mut map, changed) = self.run_zero(move |s| s.cluster.groups().add(&added, &taken)).await?;
        if changed {
            tracing::info!(group = group.group, replicas = ?group.replicas, version = map.version, "added a metadata group");
            self.groups_changed.notify_one();
        }
        map.groups.insert(0, self.group_zero());
        Ok(map)
    }

    pub(super) async fn remove_group(&self, group: u32) -> Result<GroupMap, tonic::Status> {
        let mut map = self.run_zero(move |s| s.cluster.groups().remove(group)).await?;
        self.groups_changed.notify_one();
        map.groups.insert(0, self.group_zero());
        Ok(map)
    }

    /// Move slots to a group (`MoveSlots`): those another group owns only once it promised to
    /// number nothing more in them, under the map version the move is then written against
    /// (asked again, at most three times, when the map changed meanwhile).
    pub(super) async fn move_slots(
        &self,
        req: cairn_proto::MoveSlotsRequest,
    ) -> Result<GroupMap, tonic::Status> {
        let mut tries = 0;
        let (mut map, changed) = loop {
            let moved = async {
                let held = self.zero()?.cluster.groups().map()?;
                // What would refuse the move anyway is refused before anyone promises.
                let (map, asked) = (held.clone(), req.clone());
                self.run_zero(move |s| {
                    let store = s.ns.store().clone();
                    groups::check_move(&map, &asked.slots, asked.group, |slot| {
                        groups::slot_holds_records(&*store, slot)
                    })
                })
                .await?;
                let leaving = groups::leaving(&held, &req.slots, req.group);
                let mut reserved_ends = BTreeMap::new();
                for (owner, slots) in &leaving {
                    let ends = self.promise_of(&held, *owner, slots).await?;
                    reserved_ends.extend(slots.iter().copied().zip(ends));
                }
                let promised = groups::Promised { version: held.version, slots: leaving, reserved_ends };
                let req = req.clone();
                self.run_zero(move |s| {
                    let store = s.ns.store().clone();
                    let holds = |slot| groups::slot_holds_records(&*store, slot);
                    s.cluster.groups().move_empty_slots(&req.slots, req.group, Some(&promised), holds)
                })
                .await
                .map_err(CairnError::from)
            }
            .await;
            match moved {
                Err(e) if e.kind() == ErrorKind::Interrupted && tries < 3 => tries += 1,
                moved => break moved?,
            }
        };
        if changed {
            tracing::info!(version = map.version, counts = ?groups::slot_counts(&map), "moved namespace slots");
            self.groups_changed.notify_one();
        }
        map.groups.insert(0, self.group_zero());
        Ok(map)
    }

    /// Have the leader of `group` (another than 0; its replicas as `map`, at the version the
    /// move will be written against, names them) promise to number nothing more in `slots`.
    /// Answers where the group had numbered each slot up to.
    async fn promise_of(&self, map: &GroupMap, group: u32, slots: &[u32]) -> Result<Vec<u64>> {
        let req = cairn_proto::ReleaseSlotsRequest { slots: slots.to_vec(), map_version: map.version };
        let client = |addr: &str| self.channels.meta(addr);
        let asked = on_group_leader(client, map, group, PROMISE_TIMEOUT, |mut c| {
            let req = req.clone();
            async move { c.release_slots(req).await }
        })
        .await;
        let ends = match asked {
            Ok(reply) => reply.reserved_ends,
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                return Err(CairnError::unavailable(format!(
                    "slots {slots:?} leave metadata group {group} only once its leader promised to create \
                     nothing more in them, and none did ({})",
                    e.message()
                )))
            }
            Err(e) => return Err(e),
        };
        if ends.len() != slots.len() {
            return Err(CairnError::internal(format!(
                "metadata group {group}'s leader answered {} reserved ends for {} slots",
                ends.len(),
                slots.len()
            )));
        }
        Ok(ends)
    }

    /// Promise group 0's leader to number nothing more in some of this group's slots
    /// (`ReleaseSlots`; this group is one other than 0).
    pub(super) async fn release_slots(
        &self,
        req: cairn_proto::ReleaseSlotsRequest,
    ) -> Result<cairn_proto::ReleaseSlotsReply, tonic::Status> {
        if self.raft()?.group() == 0 {
            return Err(CairnError::invalid("metadata group 0's slots move by its own map changes").into());
        }
        let reserved_ends = self.run(move |ns| ns.release_slots(&req.slots, req.map_version)).await?;
        Ok(cairn_proto::ReleaseSlotsReply { reserved_ends })
    }

    /// The version of the group map this replica's group holds, while it leads (0 otherwise).
    pub(super) fn map_version(&self) -> u64 {
        if let Some(held) = self.held_map.read().as_ref() {
            return held.version();
        }
        match self.serving.read().as_ref() {
            Some(serving) if self.raft.get().is_some_and(|r| r.group() == 0) => {
                serving.cluster.groups().version()
            }
            _ => 0,
        }
    }

    /// Keep the map group 0's leader shares with this group's leader (`ShareGroupMap`).
    pub(super) async fn share_group_map(&self, shared: SharedGroupMap) -> Result<GroupMap, tonic::Status> {
        let Some(raft) = self.raft.get() else {
            return Err(CairnError::invalid(
                "this metaserver runs alone: it is metadata group 0 and keeps its own map",
            )
            .into());
        };
        if raft.group() == 0 {
            return Err(
                CairnError::invalid("metadata group 0 keeps the group map: it takes no other's").into()
            );
        }
        let map = shared.map.ok_or_else(|| CairnError::invalid("ShareGroupMap without a map"))?;
        let held = self.held_map.read().clone().ok_or_else(|| raft.not_leader())?;
        match tokio::task::spawn_blocking(move || held.adopt(map, &shared.cluster_id)).await {
            Ok(result) => Ok(result?),
            Err(e) => Err(CairnError::internal(format!("keeping the shared group map: {e}")).into()),
        }
    }

    /// While this replica leads a group other than 0 (`held`, its map, at namespace epoch
    /// `epoch`): every `every`, send each chunkserver group 0 lists a `Fence` with the epoch,
    /// the cluster's id and this leadership's capability keys, so its deletes pass and a
    /// deposed leader's are refused. Nothing is sent before group 0's leader has shared the map
    /// (the cluster's id and group 0's replicas come with it).
    pub async fn fence_chunkservers(self: Arc<Self>, held: Arc<groups::Groups>, epoch: u64, every: Duration) {
        let group = self.raft.get().map_or(0, |r| r.group());
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned = false;
        loop {
            tick.tick().await;
            let (map, cluster_id) = match (held.map(), held.cluster_id()) {
                (Ok(map), Ok(Some(id))) => (map, id),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!("reading the group map held: {}", e.message());
                    continue;
                }
                (Ok(_), Ok(None)) => continue,
            };
            let nodes = match self.nodes_of_group_zero(&map).await {
                Ok(nodes) => {
                    // This group places its stripes and sends its deletes on them too.
                    if let Some(serving) = self.serving.read().as_ref() {
                        serving.cluster.registry().mirror(&nodes);
                    }
                    nodes.into_iter().map(|n| n.addr).collect::<Vec<_>>()
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!("cannot fence chunkservers: {}", e.message());
                        warned = true;
                    }
                    continue;
                }
            };
            warned = false;
            let fence = cairn_proto::FenceRequest { group, epoch, cluster_id, cap_keys: self.caps.keys() };
            let channels = &self.channels;
            let sent = nodes.iter().map(|addr| {
                let fence = fence.clone();
                async move {
                    let mut client = channels.chunk(addr).ok()?;
                    match tokio::time::timeout(HEALTH_TIMEOUT, client.fence(fence)).await {
                        Ok(Err(e)) => tracing::debug!(%addr, "fencing a chunkserver: {}", e.message()),
                        Err(_) => tracing::debug!(%addr, "fencing a chunkserver: no answer"),
                        Ok(Ok(_)) => {}
                    }
                    Some(())
                }
            });
            futures::future::join_all(sent).await;
        }
    }

    /// The chunkservers, as group 0's leader lists them (its replicas from `map`).
    async fn nodes_of_group_zero(&self, map: &GroupMap) -> Result<Vec<cairn_proto::NodeInfo>> {
        let zero =
            map.groups.iter().find(|g| g.group == 0).map(|g| g.replicas.as_slice()).unwrap_or_default();
        let mut last = CairnError::unavailable("the group map names no replica of metadata group 0");
        for replica in zero {
            let addr = groups::replica_addr(replica);
            let Ok(mut client) = self.channels.meta(addr) else { continue };
            match tokio::time::timeout(HEALTH_TIMEOUT, client.list_nodes(cairn_proto::Empty {})).await {
                Ok(Ok(reply)) => return Ok(reply.into_inner().nodes),
                Ok(Err(status)) => last = CairnError::from(status),
                Err(_) => {
                    last = CairnError::unavailable(format!("group 0's replica at {addr} does not answer"))
                }
            }
        }
        Err(last)
    }

    /// While this replica serves `ns` and `cluster` as group 0's leader: every `every` (and at
    /// once after the map changed), ask every registered group (other than 0) how it is, keep
    /// the answers for `cairn status` and the health checks ([`crate::groups::Groups::health`]:
    /// a request never waits on another group's replicas), and share the map with each group's
    /// leader.
    pub async fn watch_groups(
        self: Arc<Self>,
        ns: Arc<crate::namespace::Namespace>,
        cluster: Arc<Cluster>,
        every: Duration,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.groups_changed.notified() => {}
            }
            // From the cluster this task serves, not through `serving()`: the task may start
            // before the service serves, or run on while the lease lapses for a moment.
            let mut map = match cluster.groups().map() {
                Ok(map) => map,
                Err(e) => {
                    tracing::warn!("reading the group map to ask its groups: {}", e.message());
                    continue;
                }
            };
            map.groups.insert(0, self.group_zero());
            let seen = self.ask_groups(&map).await;
            let repairs = seen.iter().filter_map(|(g, s)| Some((*g, s.repair.clone()?))).collect();
            cluster.groups().set_repairs(repairs);
            let shared = SharedGroupMap { map: Some(map.clone()), cluster_id: ns.cluster_id().to_string() };
            // Every round, not only to leaders behind: group 0's replicas (in the map shared,
            // outside its version) may have changed. A leader writes only what changed.
            let leaders = seen.iter().filter_map(|(g, s)| s.leader.as_ref().map(|addr| (*g, addr)));
            let this = &*self;
            let sharing = leaders.map(|(group, addr)| {
                let shared = shared.clone();
                async move { (group, this.share_with(addr, shared).await) }
            });
            let mut behind: BTreeMap<u32, String> = futures::future::join_all(sharing)
                .await
                .into_iter()
                .filter_map(|(group, result)| match result {
                    Ok(held) if held.version == map.version => None,
                    Ok(held) => Some((
                        group,
                        format!("holds group map version {}, and group 0's is {}", held.version, map.version),
                    )),
                    Err(e) => Some((group, format!("was not given the group map: {}", e.message()))),
                })
                .collect();
            // A group's own problem (no leader, no majority) says more than the map it lacks.
            let problems = seen
                .into_iter()
                .filter_map(|(g, s)| {
                    let lacking = behind.remove(&g).map(|why| format!("metadata group {g}'s leader {why}"));
                    s.problem.or(lacking).map(|p| (g, p))
                })
                .collect();
            cluster.groups().set_health(problems);
        }
    }

    /// On the leader of a group other than 0 serving its slots: its repair's last pass, which
    /// group 0's leader adds to the cluster's status.
    pub(super) fn group_repair(&self) -> Option<cairn_proto::GroupRepair> {
        let raft = self.raft.get()?;
        if raft.group() == 0 || !raft.is_leader() {
            return None;
        }
        let serving = self.serving().ok()?;
        serving.repair.as_ref()?;
        let summary = serving.cluster.repair_state().lock().summary();
        Some(summary)
    }

    /// Hand `shared` to the leader of another group at `addr`: the map it holds afterwards.
    async fn share_with(&self, addr: &str, shared: SharedGroupMap) -> Result<GroupMap> {
        let mut client = self.channels.meta(addr)?;
        match tokio::time::timeout(HEALTH_TIMEOUT, client.share_group_map(shared)).await {
            Ok(Ok(held)) => Ok(held.into_inner()),
            Ok(Err(status)) => Err(CairnError::from(status)),
            Err(_) => Err(CairnError::unavailable(format!("{addr} did not answer"))),
        }
    }

    /// How each group of `map` other than 0 is. Every replica of every group is asked at once,
    /// each given [`HEALTH_TIMEOUT`], so a round takes about that long however many groups are
    /// down.
    async fn ask_groups(&self, map: &GroupMap) -> BTreeMap<u32, GroupSeen> {
        let others = map.groups.iter().filter(|g| g.group != 0);
        let asked = others.map(|group| async move { (group.group, self.one_group(group).await) });
        futures::future::join_all(asked).await.into_iter().collect()
    }

    /// How `group` is: what is wrong with it, if anything, and its leader.
    async fn one_group(&self, group: &MetaGroup) -> GroupSeen {
        let addrs: Vec<&str> = group.replicas.iter().map(|r| groups::replica_addr(r)).collect();
        let asked = addrs.iter().map(|addr| async move {
            let mut client = self.channels.meta(addr).ok()?;
            let reply = tokio::time::timeout(HEALTH_TIMEOUT, client.raft_status(cairn_proto::Empty {}))
                .await
                .ok()?
                .ok()?
                .into_inner();
            (reply.group == group.group)
                .then_some((reply.state == "leader").then(|| (addr.to_string(), reply.repair)))
        });
        // Each replica: `None` (no answer), or whether it leads (its address and repair).
        let answers: Vec<Option<Option<Leading>>> = futures::future::join_all(asked).await;
        let answering = answers.iter().filter(|a| a.is_some()).count();
        let (leader, repair) = answers.into_iter().flatten().flatten().next().unzip();
        let repair = repair.flatten();
        let (g, n) = (group.group, addrs.len());
        // A leader cut off from the others may still call itself one: a majority answering is
        // what lets the group change.
        let problem = if answering < n / 2 + 1 {
            Some(format!("metadata group {g} has lost its majority: {answering} of {n} replicas answer"))
        } else if leader.is_none() {
            Some(format!("metadata group {g} has no leader"))
        } else if answering < n {
            Some(format!("metadata group {g}: {} of {n} replicas do not answer", n - answering))
        } else {
            None
        };
        GroupSeen { problem, leader, repair }
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

/// Ask the leader of metadata group `group` (its replicas as `map` names them, each reached
/// through `client`) with `call`, each replica given `timeout`: followers (`NotLeader`),
/// replicas without a leader yet (`Unavailable`) and replicas silent that long are passed
/// over; `Unavailable` when none answered as leader.
pub(super) async fn on_group_leader<T, C, F, Fut>(
    client: C,
    map: &GroupMap,
    group: u32,
    timeout: Duration,
    call: F,
) -> Result<T>
where
    C: Fn(&str) -> Result<MetaClient<Channel>>,
    F: Fn(MetaClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    let replicas = map.groups.iter().filter(|g| g.group == group).flat_map(|g| g.replicas.iter());
    let mut why = format!("the group map names no replicas of metadata group {group}");
    for replica in replicas {
        let addr = groups::replica_addr(replica);
        let answer = match client(addr) {
            Ok(c) => match tokio::time::timeout(timeout, call(c)).await {
                Ok(answer) => answer.map(|r| r.into_inner()).map_err(CairnError::from),
                Err(_) => Err(CairnError::unavailable(format!("{addr} did not answer within {timeout:?}"))),
            },
            Err(e) => Err(e),
        };
        match answer {
            Ok(reply) => return Ok(reply),
            Err(e) if matches!(e.kind(), ErrorKind::NotLeader | ErrorKind::Unavailable) => {
                why = format!("{addr}: {}", e.message())
            }
            Err(e) => return Err(e),
        }
    }
    Err(CairnError::unavailable(format!("no leader of metadata group {group} answered ({why})")))
}

//! One metaserver's replica of the Raft group: starting it, answering the other replicas, and
//! [`RaftStore`], the [`MetaStore`] the leader's namespace writes through.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, ErrorKind, Result};
use cairn_net::channels::Channels;
use cairn_proto::{RaftMember, RaftMessage, RaftStatusReply};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy};

use super::log::LogStore;
use super::network::{self, GroupName, Network};
use super::overlay::Overlay;
use super::proposals::{Gate, Pending};
use super::state::{SmStore, StateMachine};
use super::{NodeId, TypeConfig};
use crate::store::{Batch, Cf, MetaStore, Op, StoreView};

/// How one replica runs.
#[derive(Clone, Debug)]
pub struct RaftSettings {
    /// This replica's id in the group.
    pub id: NodeId,
    /// Every member's id and address, this one's included.
    pub members: BTreeMap<NodeId, String>,
    /// The cluster's id and the metadata group this replica belongs to (0: the one holding
    /// the root; see `docs/ARCHITECTURE.md`, "Several metadata groups"): messages and data
    /// directories of another cluster or group are refused.
    pub name: GroupName,
    /// `{data_dir}/raft`.
    pub dir: PathBuf,
    pub heartbeat: Duration,
    /// Elections start after this much silence from the leader (randomized up to twice it).
    pub election: Duration,
    /// How long a write waits to be committed before it fails (no quorum).
    pub write_timeout: Duration,
    /// Log entries between snapshots.
    pub snapshot_every: u64,
}

/// A member quiet this long (or twice the longest election timeout, if more) is reported by
/// the leader: a heartbeat goes out every `raft_heartbeat_ms`, so this is many missed ones.
pub const SILENT_AFTER: Duration = Duration::from_secs(3);

/// The file naming the cluster a data directory belongs to.
pub const CLUSTER_FILE: &str = "cluster";

/// The file naming the metadata group a data directory belongs to. A directory with a
/// [`CLUSTER_FILE`] but none was made before groups had numbers: it holds group 0.
pub const GROUP_FILE: &str = "group";

/// Present in a replica's Raft directory made by `cairn meta init --join`: it never founds a
/// group, it waits for the running one to catch it up.
pub const JOIN_FILE: &str = "join";

/// Whether the `RaftStatus` answer of the metaserver at `addr` says it is replica `id` of
/// `wanted` (cluster and metadata group): checked before a replica is founded with, added to
/// a group, or registered as a group. The error says what it is instead.
pub fn answers_as(status: &RaftStatusReply, addr: &str, id: NodeId, wanted: &GroupName) -> Result<()> {
    if status.state == "single" {
        return Err(CairnError::invalid(format!("{addr} is a metaserver that is not replicated")));
    }
    if status.id != id || *status.cluster != *wanted.cluster || status.group != wanted.group {
        return Err(CairnError::invalid(format!(
            "the replica at {addr} is replica {} of {}, not replica {id} of {wanted}",
            status.id,
            GroupName::new(&status.cluster, status.group)
        )));
    }
    Ok(())
}

/// Refuse a data directory of another cluster or group; stamp a new one with both.
pub fn stamp_dir(dir: &Path, name: &GroupName) -> Result<()> {
    let made_before_groups = check_cluster_dir(dir, &name.cluster)?;
    check_group_dir(dir, name.group, made_before_groups)
}

/// The group the Raft directory `dir` is stamped with (`raft/group`), if it is.
pub fn stamped_group(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join(GROUP_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u32>().map(Some).map_err(|_| {
            CairnError::corrupt(format!(
                "{} reads {:?}, not a group number: the replica's data directory is damaged",
                path.display(),
                text.trim()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CairnError::from_io(&format!("cannot read {}", path.display()), &e)),
    }
}

/// Whether the directory was stamped before (by a build that may have known no groups).
fn check_cluster_dir(dir: &Path, cluster: &str) -> Result<bool> {
    let path = dir.join(CLUSTER_FILE);
    match std::fs::read_to_string(&path) {
        Ok(found) if found.trim() == cluster => Ok(true),
        Ok(found) => Err(CairnError::invalid(format!(
            "{} belongs to cluster {:?}, not {cluster:?}: refusing to start on another cluster's data \
             (point data_dir elsewhere, or set cluster to {:?})",
            dir.display(),
            found.trim(),
            found.trim()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)
                .map_err(|e| CairnError::from_io(&format!("cannot create {}", dir.display()), &e))?;
            std::fs::write(&path, format!("{cluster}\n"))
                .map_err(|e| CairnError::from_io(&format!("cannot write {}", path.display()), &e))?;
            Ok(false)
        }
        Err(e) => Err(CairnError::from_io(&format!("cannot read {}", path.display()), &e)),
    }
}

fn check_group_dir(dir: &Path, group: u32, stamped_before: bool) -> Result<()> {
    let path = dir.join(GROUP_FILE);
    let found = match stamped_group(dir)? {
        Some(found) => found,
        // Stamped by a build before groups: that directory holds group 0.
        None if stamped_before => 0,
        None => group,
    };
    if found != group {
        return Err(CairnError::invalid(format!(
            "{} holds metadata group {found}, not {group}: refusing to start on another group's data \
             (point data_dir elsewhere, or set group to {found})",
            dir.display()
        )));
    }
    if !path.exists() {
        std::fs::write(&path, format!("{group}\n"))
            .map_err(|e| CairnError::from_io(&format!("cannot write {}", path.display()), &e))?;
    }
    Ok(())
}

pub struct RaftNode {
    pub raft: Raft<TypeConfig>,
    settings: RaftSettings,
    /// When the other replicas last answered this one's appends.
    heard: Arc<network::Heard>,
    sm: Arc<SmStore>,
    /// The runtime openraft's tasks (the core, replication, storage) run on, apart from the
    /// server's: a request that blocks a server thread (waiting for a lock another request
    /// holds while its change is being committed) must never keep the commit from happening.
    /// Shut down in the background when the node is dropped.
    _runtime: RaftRuntime,
    raft_handle: tokio::runtime::Handle,
    /// Changes to propose, grouped into entries by the task of `proposals.rs`.
    proposals: tokio::sync::mpsc::UnboundedSender<Pending>,
    /// Which store may still write: each namespace opened as leader writes through a store of
    /// one generation; retiring it ([`RaftNode::retire_stores`]) refuses its later writes and
    /// waits for those in flight, so two namespaces (each with its own locks and counters in
    /// memory) never write side by side. A generation one of whose writes failed writes no
    /// more (its namespace's memory may not match the store), and the namespace is reopened.
    gate: Arc<Gate>,
    /// Until when (nanoseconds after `started`) this replica may answer as leader without
    /// asking the others: see [`RaftNode::holds_lease`].
    lease_until: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
    /// How long a lease lasts after the last time a majority acknowledged this leader.
    lease: Duration,
    /// No vote is granted until this long after start (the longest election timeout).
    vote_after: Duration,
}

/// What the other members of a group still to be founded say about themselves.
enum Others {
    /// Every other member answers as a pristine replica of this cluster.
    Pristine,
    /// This member has a group's data.
    Running(NodeId),
    /// This member does not answer yet or is starting (no reason), or answers as something the
    /// group cannot be founded with (the reason).
    NotYet(NodeId, Option<String>),
}

fn not_leader(leader: Option<&BasicNode>) -> CairnError {
    cairn_net::failover::not_leader(leader.map(|node| node.addr.as_str()))
}

impl RaftNode {
    /// Open this replica's log and state machine and join the group. The member with the
    /// lowest id makes a pristine group (every member's data directory new) by proposing the
    /// first membership; the others wait to hear from a leader.
    pub async fn start(settings: RaftSettings) -> Result<Arc<RaftNode>> {
        if !settings.members.contains_key(&settings.id) {
            return Err(CairnError::invalid(format!(
                "raft id {} is not among the members {:?}",
                settings.id,
                settings.members.keys().collect::<Vec<_>>()
            )));
        }
        let dir = settings.dir.clone();
        let stamp = settings.name.clone();
        let (log, sm) = tokio::task::spawn_blocking(move || -> Result<_> {
            stamp_dir(&dir, &stamp)?;
            Ok((LogStore::open(&dir)?, StateMachine::open(&dir)?))
        })
        .await
        .map_err(|e| CairnError::internal(format!("opening the Raft storage: {e}")))??;
        let store = sm.store().clone();
        let heartbeat = settings.heartbeat.as_millis().max(10) as u64;
        let election = settings.election.as_millis() as u64;
        let config = openraft::Config {
            cluster_name: settings.name.cluster.to_string(),
            heartbeat_interval: heartbeat,
            election_timeout_min: election.max(heartbeat * 3),
            election_timeout_max: election.max(heartbeat * 3) * 2,
            install_snapshot_timeout: 10_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(settings.snapshot_every),
            max_in_snapshot_log_to_keep: settings.snapshot_every / 5,
            purge_batch_size: 1,
            ..Default::default()
        }
        .validate()
        .map_err(|e| CairnError::invalid(format!("Raft settings: {e}")))?;
        // Raft's own connections, made (and so driven) on the Raft runtime below.
        let network = Network::new(
            Arc::new(Channels::new(Duration::from_secs(1), Duration::from_secs(30))),
            settings.name.clone(),
        );
        let heard = network.heard();
        let runtime = RaftRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("raft")
                .enable_all()
                .build()
                .map_err(|e| CairnError::internal(format!("starting the Raft runtime: {e}")))?,
        ));
        let handle = runtime.0.as_ref().expect("just built").handle().clone();
        let id = settings.id;
        let raft = handle
            .spawn(async move { Raft::new(id, Arc::new(config), network, log, sm).await })
            .await
            .map_err(|e| CairnError::internal(format!("starting Raft: {e}")))?
            .map_err(|e| CairnError::internal(format!("starting Raft: {e}")))?;
        let (proposals, queue) = tokio::sync::mpsc::unbounded_channel();
        let gate = Arc::new(Gate::default());
        handle.spawn(super::proposals::run(
            raft.clone(),
            queue,
            settings.write_timeout,
            gate.clone(),
            not_leader,
        ));
        let node = Arc::new(RaftNode {
            raft,
            settings,
            heard,
            sm: store,
            raft_handle: handle,
            proposals,
            _runtime: runtime,
            gate,
            lease_until: std::sync::atomic::AtomicU64::new(0),
            started: std::time::Instant::now(),
            lease: Duration::from_millis(election.max(heartbeat * 3)),
            vote_after: Duration::from_millis(election.max(heartbeat * 3) * 2),
        });
        // On the Raft runtime: a lease computed late (a starved server thread) would be too long.
        node.raft_handle.spawn(watch(Arc::downgrade(&node)));
        tokio::spawn(RaftNode::bootstrap(
            Arc::downgrade(&node),
            Channels::new(Duration::from_secs(1), Duration::from_secs(5)),
        ));
        Ok(node)
    }

    /// Found the group (propose the first membership) when this is the lowest member, nothing
    /// was ever stored here, and every other member answers as a pristine replica of this
    /// cluster. A member that does not answer yet, or is still starting, is asked again shortly:
    /// it may hold a running group's data (a restored backup, a replica whose disk survived) that
    /// a group founded without it would contradict. Stops when a member reports a running group
    /// (this replica then waits to be caught up) or this replica is part of one.
    async fn bootstrap(node: std::sync::Weak<RaftNode>, channels: Channels) {
        let mut waiting_logged = false;
        let mut wrong_logged: Option<String> = None;
        loop {
            let Some(node) = node.upgrade() else { return };
            let lowest = *node.settings.members.keys().next().expect("members include this one");
            let initialized = node.raft.is_initialized().await.unwrap_or(true);
            if lowest != node.settings.id || initialized {
                return;
            }
            if node.settings.dir.join(JOIN_FILE).exists() {
                tracing::info!("made to join a running group: waiting to be caught up, never founding one");
                return;
            }
            match node.others(&channels).await {
                Others::Running(member) => {
                    tracing::warn!(
                        member,
                        "this replica's Raft data is new but the group already runs: waiting to be caught up"
                    );
                    return;
                }
                Others::Pristine => {
                    let members: BTreeMap<NodeId, BasicNode> =
                        node.settings.members.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
                    match node.raft.initialize(members).await {
                        Ok(()) => {
                            tracing::info!(members = ?node.settings.members, "founded the metadata Raft group")
                        }
                        Err(e) => tracing::info!("Raft group already initialized: {e}"),
                    }
                    return;
                }
                Others::NotYet(member, None) => {
                    if !waiting_logged {
                        tracing::info!(member, "founding the group waits for every member to answer");
                        waiting_logged = true;
                    }
                }
                Others::NotYet(member, Some(why)) => {
                    if wrong_logged.as_ref() != Some(&why) {
                        tracing::error!(member, "{why}: the group is not founded until that is mended");
                        wrong_logged = Some(why);
                    }
                }
            }
            drop(node);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// What the other members say about themselves.
    async fn others(&self, channels: &Channels) -> Others {
        for (id, addr) in &self.settings.members {
            if *id == self.settings.id {
                continue;
            }
            let Ok(mut client) = channels.meta(addr) else { return Others::NotYet(*id, None) };
            let asked =
                tokio::time::timeout(Duration::from_secs(1), client.raft_status(cairn_proto::Empty {})).await;
            let Ok(Ok(reply)) = asked else { return Others::NotYet(*id, None) };
            let status = reply.into_inner();
            if status.state == "starting" {
                return Others::NotYet(*id, None);
            }
            if let Err(e) = answers_as(&status, addr, *id, &self.settings.name) {
                return Others::NotYet(*id, Some(e.message().to_string()));
            }
            let election = self.settings.election.as_millis() as u64;
            if status.election_ms != election {
                return Others::NotYet(
                    *id,
                    Some(format!(
                        "the members' raft_election_ms differ (this one {election}, replica {id} {})",
                        status.election_ms
                    )),
                );
            }
            if status.term > 0 || !status.members.is_empty() || status.applied_index > 0 {
                return Others::Running(*id);
            }
        }
        Others::Pristine
    }

    pub fn id(&self) -> NodeId {
        self.settings.id
    }

    pub fn cluster(&self) -> &str {
        &self.settings.name.cluster
    }

    /// The metadata group this replica belongs to.
    pub fn group(&self) -> u32 {
        self.settings.name.group
    }

    /// Whether this replica leads right now (by its own knowledge).
    pub fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.settings.id)
    }

    /// The error a request to a replica that does not lead gets.
    pub fn not_leader(&self) -> CairnError {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader.and_then(|id| m.membership_config.membership().get_node(&id).cloned());
        not_leader(leader.as_ref())
    }

    /// Whether this replica leads and a majority acknowledged it within the lease (the
    /// shortest election timeout, half the longest): no other replica can have been elected
    /// since, because a follower refuses every vote for the longest election timeout after the
    /// last heartbeat it had from this one (openraft's leader lease), and that heartbeat was
    /// sent before the acknowledgement this lease counts from. Reads are answered only while this holds, so a leader cut off from the others (or
    /// frozen and thawed) stops answering before anyone else can lead: no stale read.
    pub fn holds_lease(&self) -> bool {
        (self.started.elapsed().as_nanos() as u64) < self.lease_until.load(Ordering::Acquire)
            && self.is_leader()
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// On the leader: each other member that has not answered its appends (heartbeats
    /// included) for [`SILENT_AFTER`] or longer, as "replica ID (ADDR) has not answered the
    /// leader for N s". Empty on a follower, and when every member answers.
    pub fn silent_members(&self) -> Vec<String> {
        if !self.is_leader() {
            return Vec::new();
        }
        let (term, members) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            let nodes: Vec<(NodeId, String)> = m
                .membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != self.settings.id)
                .map(|(id, node)| (*id, node.addr.clone()))
                .collect();
            (m.current_term, nodes)
        };
        let after = SILENT_AFTER.max(self.vote_after * 2);
        self.heard
            .silent(term, members.iter().map(|(id, _)| *id), after)
            .into_iter()
            .map(|(id, quiet)| {
                let addr = members.iter().find(|(m, _)| *m == id).map_or("", |(_, a)| a.as_str());
                format!(
                    "metaserver replica {id} ({addr}) has not answered the leader for {} s",
                    quiet.as_secs()
                )
            })
            .collect()
    }

    /// Take (and clear) the mark a failed write left.
    pub fn take_poisoned(&self) -> bool {
        self.gate.take_poisoned()
    }

    /// A store for a namespace opened now: it reads this replica's state machine and writes
    /// through Raft until retired.
    ///
    /// Each store gets a generation of its own: taking it retires every earlier store (after
    /// their writes in flight), including one whose namespace failed to open after a write of
    /// it failed. Blocks: call off the async threads.
    pub fn store(self: &Arc<Self>) -> Arc<RaftStore> {
        let generation = self.gate.next_generation();
        self.drain();
        Arc::new(RaftStore { node: self.clone(), generation, overlay: Arc::new(Overlay::default()) })
    }

    /// Let no store handed out so far write again, once the writes they have in flight are
    /// done (blocks: call off the async threads).
    pub fn retire_stores(&self) {
        self.gate.next_generation();
        self.drain();
    }

    /// Wait for every change proposed so far to be answered: each is within its write
    /// timeout of reaching the proposer, and the proposer answers a retired store's at once.
    fn drain(&self) {
        if !self.gate.wait_drained(self.settings.write_timeout * 3) {
            tracing::warn!("changes of a retired namespace are still unanswered after three write timeouts");
        }
    }

    pub fn status(&self) -> RaftStatusReply {
        let m = self.raft.metrics().borrow().clone();
        let state = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        let membership = m.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let matched = |id: &NodeId| {
            m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map_or(0, |log_id| log_id.index)
        };
        let members = membership
            .nodes()
            .map(|(id, node)| RaftMember {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
                matched: matched(id),
            })
            .collect();
        let leader = m.current_leader.unwrap_or(0);
        RaftStatusReply {
            id: self.settings.id,
            state: state.into(),
            term: m.current_term,
            leader,
            leader_addr: membership.get_node(&leader).map(|n| n.addr.clone()).unwrap_or_default(),
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |id| id.index),
            snapshot_index: m.snapshot.map_or(0, |id| id.index),
            members,
            cluster: self.settings.name.cluster.to_string(),
            election_ms: self.settings.election.as_millis() as u64,
            group: self.settings.name.group,
            // The service adds them (the map and the repair are not the Raft node's).
            map_version: 0,
            repair: None,
        }
    }

    /// Add the replica `id` at `addr` to the group (on the leader): it must answer as a
    /// starting or following replica of this cluster with that id; it follows as a learner
    /// until it has caught up (at most `wait`), then votes. Adding a voter already there with
    /// the same address does nothing.
    pub async fn add_member(&self, id: NodeId, addr: &str, wait: Duration) -> Result<()> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        if let Some(node) = membership.get_node(&id) {
            if node.addr != addr {
                return Err(CairnError::new(
                    ErrorKind::Exists,
                    format!("replica {id} is already a member, at {}: remove it first", node.addr),
                ));
            }
            if membership.voter_ids().any(|v| v == id) {
                return Ok(());
            }
        }
        if let Some((other, _)) = membership.nodes().find(|(other, node)| **other != id && node.addr == addr)
        {
            return Err(CairnError::new(
                ErrorKind::Exists,
                format!("{addr} is already the address of replica {other}"),
            ));
        }
        let channels = Channels::new(Duration::from_secs(2), Duration::from_secs(5));
        let mut client = channels.meta(addr)?;
        let status = tokio::time::timeout(Duration::from_secs(5), client.raft_status(cairn_proto::Empty {}))
            .await
            .map_err(|_| CairnError::invalid(format!("the replica to add at {addr} does not answer")))?
            .map_err(|s| CairnError::invalid(format!("the replica to add at {addr}: {}", s.message())))?
            .into_inner();
        answers_as(&status, addr, id, &self.settings.name)?;
        let election = self.settings.election.as_millis() as u64;
        if status.election_ms != election {
            return Err(CairnError::invalid(format!(
                "the replica at {addr} has raft_election_ms = {}, the group {election}: the replicas' \
                 Raft settings must be alike (the leader's read lease depends on it)",
                status.election_ms
            )));
        }
        let api = |e: &dyn std::fmt::Display| CairnError::unavailable(format!("adding replica {id}: {e}"));
        match tokio::time::timeout(wait, self.raft.add_learner(id, BasicNode::new(addr), true)).await {
            Err(_) => {
                return Err(CairnError::new(
                    ErrorKind::WouldBlock,
                    format!(
                    "replica {id} at {addr} did not catch up within {wait:?}: it stays a learner (no vote); \
                     try again, or remove it"
                ),
                ))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                return Err(not_leader(f.leader_node.as_ref()))
            }
            Ok(Err(e)) => return Err(api(&e)),
            Ok(Ok(_)) => {}
        }
        self.change_members(openraft::ChangeMembers::AddVoterIds([id].into())).await
    }

    /// Remove the replica `id` from the group (on the leader): it stops voting and gets no
    /// more entries. Removing one that is not a member does nothing (a repeated request). The
    /// last voter cannot be removed. A leader that removes itself steps down once the change is
    /// committed, and the others elect a new one.
    pub async fn remove_member(&self, id: NodeId) -> Result<()> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        if membership.get_node(&id).is_none() {
            tracing::info!(id, "replica to remove is not a member (removed already?)");
            return Ok(());
        }
        if membership.voter_ids().all(|v| v == id) {
            return Err(CairnError::invalid("the last voting replica cannot be removed"));
        }
        let change = if membership.voter_ids().any(|v| v == id) {
            openraft::ChangeMembers::RemoveVoters([id].into())
        } else {
            openraft::ChangeMembers::RemoveNodes([id].into())
        };
        self.change_members(change).await
    }

    /// Apply `change` to the membership openraft holds when it commits (not to a copy read
    /// earlier: two changes at once each keep the other's) and wait for it; nodes that are no
    /// longer voters are dropped.
    async fn change_members(&self, change: openraft::ChangeMembers<NodeId, BasicNode>) -> Result<()> {
        match tokio::time::timeout(self.settings.write_timeout, self.raft.change_membership(change, false)).await {
            Err(_) => Err(CairnError::unavailable(format!(
                "the membership change was not committed within {:?}: fewer than a majority of metaservers answer",
                self.settings.write_timeout
            ))),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(not_leader(f.leader_node.as_ref()))
            }
            Ok(Err(e)) => Err(CairnError::unavailable(format!("changing the members: {e}"))),
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// A consistent copy of this replica's state machine (the snapshot file format), taken as
    /// leader holding its lease, so it holds every change acknowledged before the call: the
    /// applied index it holds, the open (already unlinked) file and its size. Blocks: call off
    /// the async threads.
    pub fn backup(&self) -> Result<(u64, std::fs::File, u64)> {
        if !self.is_leader() || !self.holds_lease() {
            return Err(self.not_leader());
        }
        let (meta, file, size) = super::state::pack_copy(&self.sm)?;
        Ok((meta.last_log_id.map_or(0, |id| id.index), file, size))
    }

    /// Answer another replica's vote request. For the first longest election timeout after
    /// it starts, a replica grants no vote: it may have just been the one whose acknowledgement
    /// gave the leader its lease (a restarted replica does not remember when it last heard the
    /// leader), and an emptied one may have voted in the current term before.
    pub async fn handle_vote(&self, msg: RaftMessage) -> Result<RaftMessage> {
        network::check_group(&msg, &self.settings.name)?;
        if self.started.elapsed() < self.vote_after {
            return Err(CairnError::unavailable(
                "this metaserver replica has just started and grants no vote yet",
            ));
        }
        let reply = self.raft.vote(network::decode_plain(&msg)?).await;
        network::encode_plain(&reply, &self.settings.name)
    }

    /// Answer the leader's append-entries (or heartbeat).
    pub async fn handle_append(&self, msg: RaftMessage) -> Result<RaftMessage> {
        network::check_group(&msg, &self.settings.name)?;
        let reply = self.raft.append_entries(network::decode_append(&msg)?).await;
        network::encode_plain(&reply, &self.settings.name)
    }

    /// Take a chunk of a snapshot the leader sends.
    pub async fn handle_snapshot(&self, msg: RaftMessage) -> Result<RaftMessage> {
        network::check_group(&msg, &self.settings.name)?;
        let reply = self.raft.install_snapshot(network::decode_snapshot(msg)?).await;
        network::encode_plain(&reply, &self.settings.name)
    }

    /// Wait until this replica, as leader, has applied every entry in its log: everything
    /// committed before (the blank entry of its term included) and anything an earlier
    /// namespace proposed that is still to commit (a leader restarted in its own term finds
    /// such entries in its log, computed by the process that died). A namespace opened after
    /// this reads what every earlier write left; only its own writes come after.
    pub async fn caught_up(&self) -> Result<()> {
        self.raft.ensure_linearizable().await.map_err(|e| match e.forward_to_leader() {
            Some(f) => not_leader(f.leader_node.as_ref()),
            None => CairnError::unavailable(format!("confirming leadership: {e}")),
        })?;
        let last = self.raft.metrics().borrow().last_log_index;
        self.raft
            .wait(Some(self.settings.write_timeout))
            .applied_index_at_least(last, "the leader applies its whole log")
            .await
            .map(|_| ())
            .map_err(|e| CairnError::unavailable(format!("applying the log before serving: {e}")))
    }

    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("stopping Raft: {e}");
        }
    }

    /// Propose `ops` for a store of `generation` through its `overlay`; the proposal's number
    /// there, which [`Overlay::wait`] waits for.
    fn propose(&self, generation: u64, overlay: &Arc<Overlay>, ops: Vec<Op>) -> Result<u64> {
        if self.gate.refuses(generation) {
            return Err(CairnError::new(
                ErrorKind::NotLeader,
                "this namespace was closed (leadership changed or a write failed); ask again",
            ));
        }
        let proposed = std::time::Instant::now();
        let sent = overlay.propose(ops, |seq, ops| {
            let (gate, overlay) = (self.gate.clone(), overlay.clone());
            let pending = Pending::new(ops, generation, &self.gate, move |result: Result<()>| {
                match &result {
                    Ok(()) => metrics::histogram!(crate::metrics::RAFT_COMMIT_SECONDS)
                        .record(proposed.elapsed().as_secs_f64()),
                    Err(_) => {
                        metrics::counter!(crate::metrics::RAFT_COMMIT_FAILURES).increment(1);
                        // Later changes of this namespace may have been computed from this
                        // one (under the locks it held, or through the overlay): refuse them.
                        gate.fail(generation);
                    }
                }
                overlay.settle(seq, result);
            });
            self.proposals.send(pending)
        })?;
        // A change the proposer never got is answered (as failed) when it is dropped here.
        sent.map_err(|_| CairnError::unavailable("this metaserver's Raft node is stopping"))
    }
}

/// The Raft runtime, shut down in the background when dropped (a runtime dropped on an async
/// thread, as when starting fails, would otherwise panic).
struct RaftRuntime(Option<tokio::runtime::Runtime>);

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Keep `lease_until` up to date from openraft's metrics (published whenever they change, so
/// after every acknowledgement by a majority): the lease ends `lease` after that
/// acknowledgement, or at once when this replica does not lead. Publish the Raft gauges too.
async fn watch(node: std::sync::Weak<RaftNode>) {
    if let Some(node) = node.upgrade() {
        metrics::gauge!(crate::metrics::RAFT_GROUP, "group" => node.settings.name.group.to_string()).set(1.0);
    }
    let Some(mut metrics) = node.upgrade().map(|n| n.raft.metrics()) else { return };
    let mut leader = None;
    let mut members = std::collections::BTreeSet::new();
    loop {
        {
            let Some(node) = node.upgrade() else { return };
            let m = metrics.borrow_and_update().clone();
            let now = node.started.elapsed();
            let leads = m.state == ServerState::Leader && m.current_leader == Some(node.settings.id);
            let until = match m.millis_since_quorum_ack {
                Some(ms) if leads => {
                    (now.saturating_sub(Duration::from_millis(ms)) + node.lease).as_nanos() as u64
                }
                _ => 0,
            };
            node.lease_until.store(until, Ordering::Release);
            publish(&m, leads, &mut leader, &mut members);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Set the `cairn_meta_raft_*` gauges from openraft's metrics; count a change of the known
/// leader (`leader` is the one seen last); zero the lag of members no longer in the group
/// (`members`: those published so far).
fn publish(
    m: &openraft::RaftMetrics<NodeId, BasicNode>,
    leads: bool,
    leader: &mut Option<NodeId>,
    members: &mut std::collections::BTreeSet<NodeId>,
) {
    use crate::metrics as names;
    if m.current_leader.is_some() && m.current_leader != *leader {
        metrics::counter!(names::RAFT_LEADER_CHANGES).increment(1);
    }
    if m.current_leader.is_some() {
        *leader = m.current_leader;
    }
    let last = m.last_log_index.unwrap_or(0);
    let applied = m.last_applied.map_or(0, |id| id.index);
    metrics::gauge!(names::RAFT_TERM).set(m.current_term as f64);
    metrics::gauge!(names::RAFT_IS_LEADER).set(if leads { 1.0 } else { 0.0 });
    metrics::gauge!(names::RAFT_LAST_LOG_INDEX).set(last as f64);
    metrics::gauge!(names::RAFT_APPLIED_INDEX).set(applied as f64);
    metrics::gauge!(names::RAFT_APPLY_LAG).set(last.saturating_sub(applied) as f64);
    metrics::gauge!(names::RAFT_SNAPSHOT_INDEX).set(m.snapshot.map_or(0, |id| id.index) as f64);
    let ack_age = match m.millis_since_quorum_ack {
        Some(ms) if leads => ms as f64,
        _ => -1.0,
    };
    metrics::gauge!(names::RAFT_QUORUM_ACK_AGE).set(ack_age);
    let now: std::collections::BTreeSet<NodeId> =
        m.membership_config.membership().nodes().map(|(id, _)| *id).collect();
    for gone in members.difference(&now) {
        metrics::gauge!(names::RAFT_MEMBER_LAG, "member" => gone.to_string()).set(0.0);
    }
    *members = now.clone();
    for id in now {
        // A follower does not know the others' logs: it publishes no lag rather than a stale one.
        let lag = match (leads, m.replication.as_ref().and_then(|r| r.get(&id))) {
            (true, Some(matched)) => last.saturating_sub(matched.as_ref().map_or(0, |l| l.index)) as f64,
            _ => 0.0,
        };
        metrics::gauge!(names::RAFT_MEMBER_LAG, "member" => id.to_string()).set(lag);
    }
}

/// The replicated [`MetaStore`]: reads from this replica's state machine (through the leader
/// overlay inside a change), writes proposed through Raft. A write outside a change returns
/// once applied here, so it waits for a majority's disks (`syncs_every_write`); inside a change
/// it returns once proposed, and the service awaits the change's end on the request's task
/// (`changes_inline`).
pub struct RaftStore {
    node: Arc<RaftNode>,
    generation: u64,
    /// Changes proposed and not yet applied, read through by the namespace's later changes.
    overlay: Arc<Overlay>,
}

impl RaftStore {
    fn wait_error(&self, e: CairnError) -> CairnError {
        // The caller stops waiting: whatever this namespace proposes after might be computed
        // from a change that is never committed.
        self.node.gate.fail(self.generation);
        e
    }
}

impl MetaStore for RaftStore {
    fn with_view(&self, f: &mut dyn FnMut(&dyn StoreView) -> Result<()>) -> Result<()> {
        self.node.sm.current().with_view(f)
    }

    fn replication_problems(&self) -> Vec<String> {
        self.node.silent_members()
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(proposed) = self.overlay.get(cf, key)? {
            return Ok(proposed);
        }
        self.node.sm.current().get(cf, key)
    }

    fn scan(&self, cf: Cf, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.overlay.scan(cf, start, end, limit, |limit| self.node.sm.current().scan(cf, start, end, limit))
    }

    fn write(&self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        if batch.ops().iter().any(|op| {
            matches!(
                op,
                crate::store::Op::Put { cf: Cf::Raft, .. } | crate::store::Op::Delete { cf: Cf::Raft, .. }
            )
        }) {
            return Err(CairnError::internal("a namespace write names the Raft state's column family"));
        }
        let seq = self.node.propose(self.generation, &self.overlay, batch.into_ops())?;
        if self.overlay.in_change() {
            // Waited for when the change ends, after its locks are let go.
            return Ok(());
        }
        let wait = || self.overlay.wait(seq, self.node.settings.write_timeout);
        tokio::task::block_in_place(wait).map_err(|e| self.wait_error(e))
    }

    fn begin_change(&self) {
        self.overlay.begin();
    }

    fn end_change(&self) -> Result<()> {
        let Some(seq) = self.overlay.end_take() else { return Ok(()) };
        let wait = || self.overlay.wait(seq, self.node.settings.write_timeout);
        tokio::task::block_in_place(wait).map_err(|e| self.wait_error(e))
    }

    fn changes_inline(&self) -> bool {
        true
    }

    fn end_change_async(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>> {
        let Some(seq) = self.overlay.end_take() else { return Box::pin(std::future::ready(Ok(()))) };
        let (overlay, node, generation) = (self.overlay.clone(), self.node.clone(), self.generation);
        Box::pin(async move {
            overlay.wait_async(seq, node.settings.write_timeout).await.inspect_err(|_| {
                // As `wait_error`: what this namespace proposes after might rest on it.
                node.gate.fail(generation);
            })
        })
    }

    fn abandon_change(&self) {
        self.overlay.abandon();
    }

    fn sync(&self) -> Result<()> {
        // Everything written is in a majority's synced logs already.
        Ok(())
    }

    fn syncs_every_write(&self) -> bool {
        true
    }

    fn properties(&self) -> Vec<(&'static str, u64)> {
        self.node.sm.current().properties()
    }
}

//! Changes across metadata groups as the service runs them (`namespace/txn.rs` holds both
//! sides' steps): the leaders of the groups involved reach each other over gRPC (`TxnPrepare`,
//! `TxnDecide`, `TxnOutcome`), a mkdir whose directory goes to another group runs on the
//! blocking pool (its steps wait for another group), and every leadership finishes what its
//! predecessors left ([`MetaService::finish_txns`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use cairn_common::{CairnError, Result};
use cairn_proto::meta_client::MetaClient;
use cairn_proto::{
    AttrReply, GroupMap, MkdirRequest, RemoveReply, RemoveRequest, TxnAncestryReply, TxnAncestryRequest,
    TxnDecideRequest, TxnOutcomeReply, TxnPrepareReply, TxnPrepareRequest,
};
use tonic::transport::Channel;
use tonic::Status;

use super::{attr_reply, check_ino, dir_after, looked_reply, once_of, MetaService};
use crate::groups;
use crate::namespace::txn::{self, Outcome, Peers, Prepare, TxnId};
use crate::namespace::{once, Climb, Looked, Namespace, NewEntry};
use crate::schema::{
    self, Inode, TxnEffect, TxnEffects, TXN_ABORTED, TXN_CHANGE, TXN_COMMITTED, TXN_PENDING,
};

/// How long a leader waits for another group's leader to answer one step.
const STEP_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a leadership looks for transactions left unfinished.
const FINISH_EVERY: Duration = Duration::from_secs(5);
/// A coordinator's record this much older than its last write is one nobody is working on any
/// more: a pending one is aborted (its mkdir gave up long before). Well above a whole exchange
/// with every step at its timeout. (A participant's asks its coordinator sooner:
/// `txn::exchange`'s `ASK_AFTER_SECS`.)
const STALE_SECS: i64 = 30;

fn id_of(id: TxnId) -> cairn_proto::TxnId {
    cairn_proto::TxnId { group: id.group, seq: id.seq }
}

fn id_from(id: Option<cairn_proto::TxnId>) -> Result<TxnId> {
    let id = id.ok_or_else(|| CairnError::invalid("a transaction request without its id"))?;
    Ok(TxnId { group: id.group, seq: id.seq })
}

/// The other groups' leaders, reached from a blocking thread: each call tries the group's
/// replicas as `map` names them until its leader answers.
pub(super) struct GroupPeers {
    map: GroupMap,
    /// A client for each replica the map names (channels connect on first use).
    clients: HashMap<String, MetaClient<Channel>>,
    runtime: tokio::runtime::Handle,
}

impl GroupPeers {
    fn ask<T, F, Fut>(&self, group: u32, call: F) -> Result<T>
    where
        F: Fn(MetaClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    {
        let client = |addr: &str| {
            self.clients
                .get(addr)
                .cloned()
                .ok_or_else(|| CairnError::unavailable(format!("no connection to {addr}")))
        };
        self.runtime.block_on(super::groups::on_group_leader(client, &self.map, group, STEP_TIMEOUT, call))
    }
}

impl Peers for GroupPeers {
    fn prepare(&self, group: u32, prepare: &Prepare) -> Result<Inode> {
        let req = TxnPrepareRequest {
            id: Some(id_of(prepare.id)),
            op: prepare.op,
            parent: prepare.parent,
            name: prepare.name.clone(),
            inode: schema::encode(&prepare.inode),
            effects: Vec::new(),
        };
        let reply = self.ask(group, |mut c| {
            let req = req.clone();
            async move { c.txn_prepare(req).await }
        })?;
        schema::decode("prepared directory", &reply.inode)
    }

    fn decide(&self, group: u32, id: TxnId, commit: bool) -> Result<()> {
        let req = TxnDecideRequest { id: Some(id_of(id)), commit };
        self.ask(group, |mut c| async move { c.txn_decide(req).await }).map(drop)
    }

    fn prepare_change(&self, group: u32, id: TxnId, effects: &[TxnEffect]) -> Result<Vec<TxnEffect>> {
        let req = TxnPrepareRequest {
            id: Some(id_of(id)),
            op: TXN_CHANGE,
            effects: schema::encode(&TxnEffects { effects: effects.to_vec() }),
            ..Default::default()
        };
        let reply = self.ask(group, |mut c| {
            let req = req.clone();
            async move { c.txn_prepare(req).await }
        })?;
        Ok(schema::decode::<TxnEffects>("prepared effects", &reply.effects)?.effects)
    }

    fn owner(&self, ino: u64) -> u32 {
        let slot = cairn_common::ids::slot_of(ino) as usize;
        self.map.slots.get(slot).copied().unwrap_or(0)
    }

    fn ancestry(&self, group: u32, id: TxnId, ino: u64, moved: u64) -> Result<Climb> {
        let req = TxnAncestryRequest { id: Some(id_of(id)), ino, moved };
        let reply = self.ask(group, |mut c| async move { c.txn_ancestry(req).await })?;
        Ok(match reply {
            TxnAncestryReply { found: true, .. } => Climb::Found,
            TxnAncestryReply { root: true, .. } => Climb::Root,
            TxnAncestryReply { next, .. } if next != 0 => Climb::Leaves(next),
            _ => {
                return Err(CairnError::invalid(format!(
                    "transaction {id}: an empty answer to its loop check"
                )))
            }
        })
    }

    fn outcome(&self, id: TxnId) -> Result<Outcome> {
        let reply = self.ask(id.group, |mut c| async move { c.txn_outcome(id_of(id)).await })?;
        match reply.state {
            TXN_PENDING => Ok(Outcome::Pending),
            TXN_COMMITTED => Ok(Outcome::Committed),
            TXN_ABORTED => Ok(Outcome::Aborted),
            other => Err(CairnError::invalid(format!("transaction {id}: an outcome {other}"))),
        }
    }
}

/// Reported shards of other groups' slots, by group.
pub(super) type DamageElsewhere = BTreeMap<u32, Vec<cairn_proto::ShardId>>;

impl GroupPeers {
    /// `ReportDamaged` of `ids` to `group`'s leader (`confirm`: a client reported them).
    fn report_damaged(
        &self,
        group: u32,
        ids: Vec<cairn_proto::ShardId>,
        confirm: bool,
    ) -> Result<Vec<cairn_proto::ShardId>> {
        let req = cairn_proto::ReportDamagedRequest { ids, confirm };
        let reply = self.ask(group, |mut c| {
            let req = req.clone();
            async move { c.report_damaged(req).await }
        })?;
        Ok(reply.missing)
    }
}

impl MetaService {
    /// Split reported shard `ids` into this group's and, on group 0's leader, those of each
    /// other group's slots (handed on by [`MetaService::damage_elsewhere`]); another group
    /// takes only its own (`WrongGroup`).
    pub(super) fn damage_by_group(
        &self,
        ids: Vec<cairn_common::ShardId>,
    ) -> Result<(Vec<cairn_common::ShardId>, DamageElsewhere), Status> {
        let serving = self.serving()?;
        let own = serving.ns.group();
        let (mut here, mut elsewhere) = (Vec::new(), DamageElsewhere::new());
        for id in ids {
            let (group, version) = serving.cluster.groups().owner_of(id.ino);
            if group == own {
                here.push(id);
            } else if own == 0 {
                elsewhere.entry(group).or_default().push(id.into());
            } else {
                return Err(CairnError::wrong_group(
                    format!(
                        "shard of inode {} is in namespace slot {}, which metadata group {group} owns: report \
                         it to group 0's metaservers",
                        id.ino,
                        cairn_common::ids::slot_of(id.ino)
                    ),
                    version,
                )
                .into());
            }
        }
        Ok((here, elsewhere))
    }

    /// Hand reported shard `ids` of `group`'s slots to its leader; answers those it counts
    /// missing.
    pub(super) async fn damage_elsewhere(
        &self,
        group: u32,
        ids: Vec<cairn_proto::ShardId>,
        confirm: bool,
    ) -> Result<Vec<cairn_proto::ShardId>, Status> {
        let peers = self.peers()?;
        tokio::task::spawn_blocking(move || peers.report_damaged(group, ids, confirm))
            .await
            .map_err(|e| CairnError::internal(format!("handing a damage report on: {e}")))?
            .map_err(Status::from)
    }

    /// The group map as this leader holds it, group 0's replicas included.
    fn txn_map(&self) -> Result<GroupMap, Status> {
        if let Some(held) = self.held_map.read().as_ref() {
            return Ok(held.map()?);
        }
        self.group_map()
    }

    pub(super) fn peers(&self) -> Result<GroupPeers, Status> {
        let map = self.txn_map()?;
        let mut clients = HashMap::new();
        for replica in map.groups.iter().flat_map(|g| g.replicas.iter()) {
            let addr = groups::replica_addr(replica);
            if let Ok(client) = self.channels.meta(addr) {
                clients.insert(addr.to_string(), client);
            }
        }
        Ok(GroupPeers { map, clients, runtime: tokio::runtime::Handle::current() })
    }

    /// The group a new directory under `parent` named `name` goes to (this one unless the map
    /// spreads directories).
    pub(super) fn dir_group(&self, parent: u64, name: &[u8]) -> Result<u32, Status> {
        let Some(raft) = self.raft.get() else { return Ok(0) };
        let own = raft.group();
        if let Some(held) = self.held_map.read().as_ref() {
            return Ok(held.dir_group(own, parent, name));
        }
        Ok(self.serving()?.cluster.groups().dir_group(own, parent, name))
    }

    /// mkdir of `r` with the directory in metadata group `group` (another than this one; `r`
    /// checked and its caller's rules applied), done once for its `once`: answers the
    /// directory and the parent as the change left it. A try sent again after the first was
    /// done is answered from what it left (the directory's number only: the client asks its
    /// group, `AttrReply.elsewhere`).
    pub(super) async fn mkdir_in(&self, group: u32, r: MkdirRequest) -> Result<AttrReply, Status> {
        let once = once_of(&r.once);
        let (parent, name) = (r.parent, r.name.clone());
        let replay = || {
            let (looked, after) =
                self.read(|ns| Ok((ns.lookup_entry(parent, &name)?, dir_after(ns, parent))))?;
            Ok(AttrReply { parent: after, ..looked_reply(looked) })
        };
        if self.done_before(once)? {
            return replay();
        }
        let peers = self.peers()?;
        let made = self
            .run(move |ns| {
                let entry = NewEntry { parent, name: &r.name, mode: r.mode, uid: r.uid, gid: r.gid };
                let made = once::scope(once, || txn::mkdir_across(ns, &peers, &entry, group))?;
                Ok((made.inode, dir_after(ns, parent)))
            })
            .await;
        match made {
            Ok((inode, after)) => Ok(AttrReply { parent: after, ..attr_reply(inode) }),
            // An earlier try was done meanwhile: answered from what it left.
            Err(_) if once.is_some() && self.done_before(once)? => replay(),
            Err(e) => Err(e),
        }
    }

    /// rmdir of `r` when its entry names a directory another metadata group holds (`None`:
    /// it does not; the caller removes it here), done once for its `once`: answers the parent
    /// as the change left it.
    pub(super) async fn rmdir_elsewhere(&self, r: &RemoveRequest) -> Result<Option<RemoveReply>, Status> {
        let parent = check_ino(r.parent)?;
        let Ok(Looked::Elsewhere { ino, .. }) = self.read(|ns| ns.lookup_entry(parent, &r.name)) else {
            return Ok(None);
        };
        let once = once_of(&r.once);
        let after = || Ok(Some(RemoveReply { parent: self.read(|ns| Ok(dir_after(ns, parent)))? }));
        if self.done_before(once)? {
            return after();
        }
        let (peers, group, name) = (self.peers()?, self.group_of(ino)?, r.name.clone());
        let removed = self
            .run(move |ns| {
                once::scope(once, || txn::rmdir_across(ns, &peers, (parent, &name), ino, group))?;
                Ok(dir_after(ns, parent))
            })
            .await;
        match removed {
            Ok(parent) => Ok(Some(RemoveReply { parent })),
            Err(_) if once.is_some() && self.done_before(once)? => after(),
            Err(e) => Err(e),
        }
    }

    /// The group holding inode `ino`, as this leader's map says.
    pub(super) fn group_of(&self, ino: u64) -> Result<u32, Status> {
        if let Some(held) = self.held_map.read().as_ref() {
            return Ok(held.owner_of(ino).0);
        }
        Ok(self.serving()?.cluster.groups().owner_of(ino).0)
    }

    /// Finish, every few seconds while this leadership serves `ns`, the transactions left
    /// unfinished here (`txn::recover`: what an earlier leadership was still preparing is
    /// aborted at once).
    pub(crate) async fn finish_txns(self: Arc<Self>, ns: Arc<Namespace>) {
        loop {
            let pass = match self.peers() {
                Ok(peers) => {
                    let ns = ns.clone();
                    tokio::task::spawn_blocking(move || txn::recover(&ns, &peers, STALE_SECS))
                        .await
                        .map_err(|e| CairnError::internal(e.to_string()))
                        .and_then(|r| r)
                }
                Err(e) => Err(CairnError::from(e)),
            };
            match pass {
                Ok(0) => {}
                Ok(left) => tracing::info!(left, "transactions across metadata groups not finished yet"),
                Err(e) => tracing::warn!("finishing transactions across metadata groups: {e}"),
            }
            tokio::time::sleep(FINISH_EVERY).await;
        }
    }

    pub(super) async fn txn_prepare(&self, req: TxnPrepareRequest) -> Result<TxnPrepareReply, Status> {
        let id = id_from(req.id)?;
        if req.op == TXN_CHANGE {
            let effects = schema::decode::<TxnEffects>("effects to prepare", &req.effects)?.effects;
            let prepared = self.run(move |ns| ns.txn_prepare_change(id, effects)).await?;
            return Ok(TxnPrepareReply {
                effects: schema::encode(&TxnEffects { effects: prepared }),
                ..Default::default()
            });
        }
        let prepare = Prepare {
            id,
            op: req.op,
            parent: req.parent,
            name: req.name,
            inode: schema::decode("directory to prepare", &req.inode)?,
        };
        let inode = self.run(move |ns| ns.txn_prepare(&prepare)).await?;
        Ok(TxnPrepareReply { inode: schema::encode(&inode), ..Default::default() })
    }

    pub(super) async fn txn_decide(&self, req: TxnDecideRequest) -> Result<(), Status> {
        let id = id_from(req.id)?;
        self.run(move |ns| ns.txn_decide(id, req.commit)).await
    }

    pub(super) async fn txn_ancestry(&self, req: TxnAncestryRequest) -> Result<TxnAncestryReply, Status> {
        let id = id_from(req.id)?;
        let (ino, moved) = (check_ino(req.ino)?, check_ino(req.moved)?);
        Ok(match self.run(move |ns| ns.climb(Some(id), ino, moved)).await? {
            Climb::Found => TxnAncestryReply { found: true, ..Default::default() },
            Climb::Root => TxnAncestryReply { root: true, ..Default::default() },
            Climb::Leaves(next) => TxnAncestryReply { next, ..Default::default() },
        })
    }

    pub(super) fn txn_outcome(&self, id: cairn_proto::TxnId) -> Result<TxnOutcomeReply, Status> {
        let id = id_from(Some(id))?;
        let state = match self.read(|ns| ns.txn_outcome(id))? {
            Outcome::Pending => TXN_PENDING,
            Outcome::Committed => TXN_COMMITTED,
            Outcome::Aborted => TXN_ABORTED,
        };
        Ok(TxnOutcomeReply { state })
    }

    /// Turn the spreading of new directories on or off (group 0's map), and share it.
    pub(super) async fn spread_dirs(&self, on: bool) -> Result<GroupMap, Status> {
        let (mut map, changed) = self.run_zero(move |s| s.cluster.groups().set_spread_dirs(on)).await?;
        if changed {
            tracing::info!(version = map.version, on, "spreading new directories over the metadata groups");
            self.groups_changed.notify_one();
        }
        map.groups.insert(0, self.group_zero());
        Ok(map)
    }
}

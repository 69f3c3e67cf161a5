//! The `Chunk` gRPC service: a thin layer over the [`ShardStore`]. It checks what arrives from
//! the network (ids present and valid, data no larger than a shard may be) and turns every error
//! into a `tonic::Status` through `From<CairnError>`, so the client sees the exact error kind.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cairn_common::content::HASH_LEN;
use cairn_common::ErrorKind;
use cairn_common::{CairnError, Result, ShardId};
use cairn_net::capability::{self, Refusal, Verifier};
use cairn_net::tls::Peer;
use cairn_proto::chunk_server::Chunk;
use cairn_proto::{
    Capability, CheckShardsReply, CheckShardsRequest, ChunkStatReply, DeleteShardsReply, DeleteShardsRequest,
    Empty, ListShardsReply, ListShardsRequest, PinReply, PinRequest, PromoteReply, PromoteRequest,
    ReadShardReply, ReadShardRequest, RebuildShardReply, RebuildShardRequest, ShardCheck, ShardEntry,
    ShardState, SyncShardsRequest, WriteShardReply, WriteShardRequest,
};
use tonic::{Request, Response, Status};

use crate::fence::Fence;
use crate::mover::{Mover, PromoteOptions};
use crate::shard::MAX_SHARD_BYTES;
use crate::store::{ReadCheck, ShardStore};

/// Most ids one DeleteShards request may carry.
pub const MAX_DELETE_IDS: usize = 100_000;
/// Most ids one Promote request may carry.
pub const MAX_PROMOTE_IDS: usize = 100_000;
/// Most shards one ListShards reply holds, and most ids one CheckShards request may carry.
pub const MAX_LIST_SHARDS: usize = 10_000;
pub const MAX_CHECK_IDS: usize = 10_000;
/// Shards verified at once by one CheckShards request.
const CHECK_CONCURRENCY: usize = 4;

/// The chunkserver's gRPC service.
pub struct ChunkService {
    store: Arc<ShardStore>,
    /// Tier moves of the store's shards: `Promote` and pins.
    mover: Arc<Mover>,
    /// The id the metaserver gave this node; 0 until registered.
    node_id: Arc<AtomicU32>,
    /// Refuses deletes from a deposed metaserver leader.
    fence: Arc<Fence>,
    /// Checks clients' shard capabilities with the keys the metaserver sent.
    caps: Arc<Verifier>,
}

impl ChunkService {
    pub fn new(
        store: Arc<ShardStore>,
        mover: Arc<Mover>,
        node_id: Arc<AtomicU32>,
        fence: Arc<Fence>,
        caps: Arc<Verifier>,
    ) -> ChunkService {
        ChunkService { store, mover, node_id, fence, caps }
    }

    /// Refuse `what` (`op` on inode `ino`'s shards) unless the caller needs no capability
    /// (servers, admins, a plaintext cluster) or `cap` grants it.
    async fn authorize(
        &self,
        peer: Option<&Peer>,
        cap: Option<&Capability>,
        what: &str,
        ino: u64,
        op: u32,
    ) -> Result<()> {
        if !capability::required_of(peer) {
            return Ok(());
        }
        let holder = peer.map_or("", |p| p.name.as_str());
        capability::enforce(self.caps.check_or_learn(cap, ino, op, holder).await, what, ino)?;
        // A group's capabilities count only for inodes in its own slots. Another owner here
        // may be this node's map being older than the metaserver's (slots just moved, or a
        // directory just made in another group): heartbeat early (at most once a second),
        // which fetches a newer map, and wait for the heartbeat after the one in flight (that
        // one may have been answered before the map changed) before refusing.
        let group = cap.map_or(0, |c| c.group);
        let slots = self.fence.slots();
        if slots.owner(ino) != group {
            let seen = slots.confirmations();
            self.caps.ask_for_news();
            let deadline = tokio::time::Instant::now() + SLOT_WAIT;
            while slots.owner(ino) != group
                && slots.confirmations() < seen + 2
                && tokio::time::Instant::now() < deadline
            {
                if slots.confirmations() > seen {
                    self.caps.ask_for_news();
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        self.fence.slots().check(group, ino, what)
    }
}

/// How long a capability for an inode whose slot this node's map gives another group waits
/// for a newer map (an early heartbeat comes at most a second after the last).
const SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The validated domain id of a request's shard id.
fn shard_id(id: Option<&cairn_proto::ShardId>) -> Result<ShardId> {
    let id = ShardId::from(id.ok_or_else(|| CairnError::invalid("request has no shard id"))?);
    id.validate()?;
    Ok(id)
}

#[tonic::async_trait]
impl Chunk for ChunkService {
    async fn write_shard(
        &self,
        request: Request<WriteShardRequest>,
    ) -> Result<Response<WriteShardReply>, Status> {
        let id = shard_id(request.get_ref().id.as_ref())?;
        let (peer, cap) = (request.extensions().get::<Peer>(), request.get_ref().cap.as_ref());
        self.authorize(peer, cap, "shard write", id.ino, capability::WRITE).await?;
        let req = request.into_inner();
        if req.data.len() > MAX_SHARD_BYTES {
            return Err(CairnError::invalid(format!(
                "shard {id}: {} bytes of data, more than the {MAX_SHARD_BYTES} a shard may hold",
                req.data.len()
            ))
            .into());
        }
        let tier = match req.buffered {
            true => self.store.write_buffered(id, req.data).await?,
            false => self.store.write(id, req.data).await?,
        };
        Ok(Response::new(WriteShardReply { tier: tier.as_str().into() }))
    }

    async fn fence(&self, request: Request<cairn_proto::FenceRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        if req.group == 0 || req.group >= cairn_common::config::MAX_GROUPS {
            return Err(CairnError::invalid(format!(
                "fence of metadata group {}: a group other than 0 (group 0's leader fences through heartbeats)",
                req.group
            ))
            .into());
        }
        if req.epoch == 0 || req.cluster_id.is_empty() {
            return Err(CairnError::invalid(
                "a fence names its cluster and its leadership's namespace epoch",
            )
            .into());
        }
        // The cluster check of a delete, and the same refusal of an older leadership: what
        // holds for its deletes holds for its keys.
        self.fence.admit(req.group, req.epoch, &req.cluster_id).await?;
        self.caps.learn_from_leader(req.group, &req.cap_keys, req.epoch);
        Ok(Response::new(Empty {}))
    }

    async fn sync_shards(&self, request: Request<SyncShardsRequest>) -> Result<Response<Empty>, Status> {
        let ino = request.get_ref().ino;
        let (peer, cap) = (request.extensions().get::<Peer>(), request.get_ref().cap.as_ref());
        self.authorize(peer, cap, "shard sync", ino, capability::WRITE).await?;
        self.store.sync_ino(ino).await?;
        Ok(Response::new(Empty {}))
    }

    async fn read_shard(
        &self,
        request: Request<ReadShardRequest>,
    ) -> Result<Response<ReadShardReply>, Status> {
        let id = shard_id(request.get_ref().id.as_ref())?;
        let (peer, cap) = (request.extensions().get::<Peer>(), request.get_ref().cap.as_ref());
        self.authorize(peer, cap, "shard read", id.ino, capability::READ).await?;
        let req = request.into_inner();
        let check = if req.want_tree {
            ReadCheck::Tree
        } else if req.reader_checks {
            ReadCheck::Reader
        } else {
            ReadCheck::Blocks
        };
        let read = self.store.read_as(id, req.offset, req.len, check).await?;
        Ok(Response::new(ReadShardReply {
            data: read.data,
            shard_len: read.data_len,
            tree: read.tree.unwrap_or_default(),
        }))
    }

    async fn delete_shards(
        &self,
        request: Request<DeleteShardsRequest>,
    ) -> Result<Response<DeleteShardsReply>, Status> {
        // The fence and cluster id are a metaserver's to send: they move this chunkserver's
        // fence, which every later metaserver delete must match. A mount deletes its own
        // leftovers without them.
        let peer = request.extensions().get::<Peer>().cloned();
        let from_meta = peer.as_ref().is_none_or(|p| p.roles.contains(cairn_net::tls::Role::Meta));
        let req = request.into_inner();
        if !from_meta && (req.fence != 0 || !req.cluster_id.is_empty()) {
            return Err(CairnError::new(
                ErrorKind::PermissionDenied,
                "only a metaserver's certificate may send a fence or cluster id with a delete",
            )
            .into());
        }
        if req.ids.len() > MAX_DELETE_IDS {
            return Err(CairnError::invalid(format!(
                "{} shard ids in one delete, at most {MAX_DELETE_IDS} allowed",
                req.ids.len()
            ))
            .into());
        }
        let ids = req.ids.iter().map(|id| shard_id(Some(id))).collect::<Result<Vec<_>>>()?;
        // A client deletes only its own leftovers, of the one file its capability names.
        let ino = req.cap.as_ref().map_or(0, |c| c.ino);
        if let Some(other) =
            ids.iter().find(|id| id.ino != ino).filter(|_| capability::required_of(peer.as_ref()))
        {
            return Err(capability::refused("shard delete", other.ino, Refusal::WrongInode).into());
        }
        self.authorize(peer.as_ref(), req.cap.as_ref(), "shard delete", ino, capability::WRITE).await?;
        // Only group 0 (whose fence older metaservers may leave out) deletes without a fence.
        if from_meta && req.group != 0 && req.fence == 0 {
            return Err(CairnError::invalid(format!(
                "a delete of metadata group {} names its leadership's fence",
                req.group
            ))
            .into());
        }
        // A metadata group deletes only shards of inodes in its own slots.
        if from_meta && req.fence != 0 {
            for id in &ids {
                self.fence.slots().check(req.group, id.ino, "shard delete")?;
            }
        }
        let _admitted = self.fence.admit(req.group, req.fence, &req.cluster_id).await?;
        let deleted = self.store.delete(&ids).await?;
        Ok(Response::new(DeleteShardsReply { deleted }))
    }

    async fn promote(&self, request: Request<PromoteRequest>) -> Result<Response<PromoteReply>, Status> {
        let req = request.into_inner();
        if req.ids.len() > MAX_PROMOTE_IDS {
            return Err(CairnError::invalid(format!(
                "{} shard ids in one promote, at most {MAX_PROMOTE_IDS} allowed",
                req.ids.len()
            ))
            .into());
        }
        let ids = req.ids.iter().map(|id| shard_id(Some(id))).collect::<Result<Vec<_>>>()?;
        let opts = PromoteOptions { evict: !req.no_evict, session: req.session };
        let done = self.mover.promote_with(&ids, opts).await?;
        Ok(Response::new(PromoteReply {
            promoted: done.promoted,
            already: done.already,
            missing: done.missing,
            bytes: done.bytes,
            evicted: done.evicted,
            evicted_bytes: done.evicted_bytes,
            error: done.stopped.as_ref().map(|e| e.message().to_string()).unwrap_or_default(),
            no_space: done.stopped.as_ref().is_some_and(|e| e.kind() == ErrorKind::NoSpace),
            not_looked_at: done.not_looked_at,
        }))
    }

    async fn pin(&self, request: Request<PinRequest>) -> Result<Response<PinReply>, Status> {
        let req = request.into_inner();
        if req.inos.len() > MAX_PROMOTE_IDS {
            return Err(CairnError::invalid(format!(
                "{} inodes in one pin request, at most {MAX_PROMOTE_IDS} allowed",
                req.inos.len()
            ))
            .into());
        }
        if let Some(&bad) = req.inos.iter().find(|&&ino| ino == 0) {
            return Err(CairnError::invalid(format!("inode {bad} cannot be pinned")).into());
        }
        let changed = if req.unpin {
            self.mover.pins().remove(req.inos).await?
        } else {
            self.mover.pins().add(req.inos).await?
        };
        Ok(Response::new(PinReply { changed: changed as u32 }))
    }

    async fn rebuild_shard(
        &self,
        request: Request<RebuildShardRequest>,
    ) -> Result<Response<RebuildShardReply>, Status> {
        let bytes = crate::rebuild::rebuild(&self.store, request.into_inner()).await?;
        Ok(Response::new(RebuildShardReply { bytes }))
    }

    async fn list_shards(
        &self,
        request: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsReply>, Status> {
        let req = request.into_inner();
        let after = req.after.as_ref().map(|id| shard_id(Some(id))).transpose()?;
        let limit = if req.limit == 0 { MAX_LIST_SHARDS } else { (req.limit as usize).min(MAX_LIST_SHARDS) };
        let store = self.store.clone();
        let (listed, more) = tokio::task::spawn_blocking(move || store.list(after, limit))
            .await
            .map_err(|e| CairnError::internal(format!("list shards: {e}")))?;
        let shards = listed
            .into_iter()
            .map(|(id, bytes, age_ms)| ShardEntry { id: Some(id.into()), bytes, age_ms })
            .collect();
        Ok(Response::new(ListShardsReply { shards, more }))
    }

    async fn check_shards(
        &self,
        request: Request<CheckShardsRequest>,
    ) -> Result<Response<CheckShardsReply>, Status> {
        use futures::stream::{self, StreamExt};
        let req = request.into_inner();
        if req.ids.len() > MAX_CHECK_IDS {
            return Err(CairnError::invalid(format!(
                "{} shard ids in one check, at most {MAX_CHECK_IDS} allowed",
                req.ids.len()
            ))
            .into());
        }
        let ids = req.ids.iter().map(|id| shard_id(Some(id))).collect::<Result<Vec<_>>>()?;
        if !req.hashes.is_empty() && req.hashes.len() != ids.len() {
            return Err(CairnError::invalid(format!(
                "{} content hashes for {} shard ids: one per id, or none",
                req.hashes.len(),
                ids.len()
            ))
            .into());
        }
        let mut contents = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            contents.push(match req.hashes.get(i).filter(|h| !h.is_empty()) {
                None => None,
                Some(h) => Some(<[u8; HASH_LEN]>::try_from(h.as_slice()).map_err(|_| {
                    CairnError::invalid(format!(
                        "shard {id}: a content hash has {} bytes, not {HASH_LEN}",
                        h.len()
                    ))
                })?),
            });
        }
        let verify = req.verify;
        let results = stream::iter(ids.into_iter().zip(contents))
            .map(|(id, content)| async move {
                let (state, error) = match self.store.check(id, verify, content).await {
                    Ok(()) => (ShardState::ShardOk, String::new()),
                    Err(e) if e.kind() == ErrorKind::NotFound => {
                        (ShardState::ShardMissing, e.message().into())
                    }
                    Err(e) if e.kind() == ErrorKind::Corrupt => {
                        (ShardState::ShardCorrupt, e.message().into())
                    }
                    Err(e) => (ShardState::ShardUnreadable, e.message().into()),
                };
                let tier = self.store.tier_of(&id).map_or(String::new(), |t| t.as_str().to_string());
                let pinned = self.mover.pins().contains(id.ino);
                ShardCheck { id: Some(id.into()), state: state as i32, error, tier, pinned }
            })
            .buffered(CHECK_CONCURRENCY)
            .collect()
            .await;
        Ok(Response::new(CheckShardsReply { results }))
    }

    async fn stat(&self, _request: Request<Empty>) -> Result<Response<ChunkStatReply>, Status> {
        Ok(Response::new(ChunkStatReply {
            node_id: self.node_id.load(Ordering::Relaxed),
            tiers: self.store.usage(),
        }))
    }
}

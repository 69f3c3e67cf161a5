//! The `Chunk` gRPC service: a thin layer over the [`ShardStore`]. It checks what arrives from
//! the network (ids present and valid, data no larger than a shard may be) and turns every error
//! into a `tonic::Status` through `From<CairnError>`, so the client sees the exact error kind.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cairn_common::{CairnError, Result, ShardId};
use cairn_proto::chunk_server::Chunk;
use cairn_proto::{
    ChunkStatReply, DeleteShardsReply, DeleteShardsRequest, Empty, PromoteReply, PromoteRequest,
    ReadShardReply, ReadShardRequest, RebuildShardReply, RebuildShardRequest, WriteShardReply,
    WriteShardRequest,
};
use tonic::{Request, Response, Status};

use crate::shard::MAX_SHARD_BYTES;
use crate::store::ShardStore;

/// Most ids one DeleteShards request may carry.
pub const MAX_DELETE_IDS: usize = 100_000;
/// Most ids one Promote request may carry.
pub const MAX_PROMOTE_IDS: usize = 100_000;

/// The chunkserver's gRPC service.
pub struct ChunkService {
    store: Arc<ShardStore>,
    /// The id the metaserver gave this node; 0 until registered.
    node_id: Arc<AtomicU32>,
}

impl ChunkService {
    pub fn new(store: Arc<ShardStore>, node_id: Arc<AtomicU32>) -> ChunkService {
        ChunkService { store, node_id }
    }
}

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
        let req = request.into_inner();
        let id = shard_id(req.id.as_ref())?;
        if req.data.len() > MAX_SHARD_BYTES {
            return Err(CairnError::invalid(format!(
                "shard {id}: {} bytes of data, more than the {MAX_SHARD_BYTES} a shard may hold",
                req.data.len()
            ))
            .into());
        }
        let tier = self.store.write(id, req.data).await?;
        Ok(Response::new(WriteShardReply { tier: tier.as_str().into() }))
    }

    async fn read_shard(
        &self,
        request: Request<ReadShardRequest>,
    ) -> Result<Response<ReadShardReply>, Status> {
        let req = request.into_inner();
        let id = shard_id(req.id.as_ref())?;
        let (data, shard_len) = self.store.read(id, req.offset, req.len).await?;
        Ok(Response::new(ReadShardReply { data, shard_len }))
    }

    async fn delete_shards(
        &self,
        request: Request<DeleteShardsRequest>,
    ) -> Result<Response<DeleteShardsReply>, Status> {
        let req = request.into_inner();
        if req.ids.len() > MAX_DELETE_IDS {
            return Err(CairnError::invalid(format!(
                "{} shard ids in one delete, at most {MAX_DELETE_IDS} allowed",
                req.ids.len()
            ))
            .into());
        }
        let ids = req.ids.iter().map(|id| shard_id(Some(id))).collect::<Result<Vec<_>>>()?;
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
        let done = self.store.promote(&ids).await?;
        Ok(Response::new(PromoteReply {
            promoted: done.promoted,
            already: done.already,
            missing: done.missing,
            bytes: done.bytes,
        }))
    }

    async fn rebuild_shard(
        &self,
        request: Request<RebuildShardRequest>,
    ) -> Result<Response<RebuildShardReply>, Status> {
        let bytes = crate::rebuild::rebuild(&self.store, request.into_inner()).await?;
        Ok(Response::new(RebuildShardReply { bytes }))
    }

    async fn stat(&self, _request: Request<Empty>) -> Result<Response<ChunkStatReply>, Status> {
        Ok(Response::new(ChunkStatReply {
            node_id: self.node_id.load(Ordering::Relaxed),
            tiers: self.store.usage(),
        }))
    }
}

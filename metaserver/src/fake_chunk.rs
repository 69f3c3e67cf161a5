//! A fake chunkserver on 127.0.0.1:0 for the metaserver's tests of its background work (the
//! garbage collector, the content audit).

use std::sync::Arc;

use parking_lot::Mutex;

use cairn_proto::chunk_server::{Chunk, ChunkServer};
use cairn_proto::*;
use tonic::{Request, Response, Status};

/// Records every shard id it is asked to delete; lists the shards in `held`; answers checks
/// with `ShardCorrupt` for the ids in `corrupt`, `ShardOk` for the others, and records them.
#[derive(Clone, Default)]
pub(crate) struct FakeChunk {
    pub(crate) deleted: Arc<Mutex<Vec<cairn_proto::ShardId>>>,
    /// The fence each delete carried.
    pub(crate) fences: Arc<Mutex<Vec<u64>>>,
    /// The metadata group each delete named.
    pub(crate) groups: Arc<Mutex<Vec<u32>>>,
    pub(crate) held: Arc<Mutex<Vec<ShardEntry>>>,
    pub(crate) corrupt: Arc<Mutex<Vec<cairn_proto::ShardId>>>,
    pub(crate) checks: Arc<Mutex<Vec<CheckShardsRequest>>>,
}

#[tonic::async_trait]
impl Chunk for FakeChunk {
    async fn write_shard(&self, _: Request<WriteShardRequest>) -> Result<Response<WriteShardReply>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn read_shard(&self, _: Request<ReadShardRequest>) -> Result<Response<ReadShardReply>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn delete_shards(
        &self,
        req: Request<DeleteShardsRequest>,
    ) -> Result<Response<DeleteShardsReply>, Status> {
        let req = req.into_inner();
        self.fences.lock().push(req.fence);
        self.groups.lock().push(req.group);
        let ids = req.ids;
        let n = ids.len() as u32;
        self.deleted.lock().extend(ids);
        Ok(Response::new(DeleteShardsReply { deleted: n }))
    }
    async fn stat(&self, _: Request<Empty>) -> Result<Response<ChunkStatReply>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn fence(&self, _: Request<cairn_proto::FenceRequest>) -> Result<Response<Empty>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn promote(&self, _: Request<PromoteRequest>) -> Result<Response<PromoteReply>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn rebuild_shard(
        &self,
        _: Request<RebuildShardRequest>,
    ) -> Result<Response<RebuildShardReply>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn list_shards(
        &self,
        req: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsReply>, Status> {
        // Two per page, to exercise paging.
        let after = req.into_inner().after.map(|id| cairn_common::ShardId::from(&id));
        let mut held = self.held.lock().clone();
        held.sort_by_key(|e| cairn_common::ShardId::from(e.id.as_ref().unwrap()));
        let rest: Vec<ShardEntry> = held
            .into_iter()
            .filter(|e| after.is_none_or(|a| cairn_common::ShardId::from(e.id.as_ref().unwrap()) > a))
            .collect();
        let more = rest.len() > 2;
        Ok(Response::new(ListShardsReply { shards: rest.into_iter().take(2).collect(), more }))
    }
    async fn check_shards(
        &self,
        req: Request<CheckShardsRequest>,
    ) -> Result<Response<CheckShardsReply>, Status> {
        let req = req.into_inner();
        let corrupt = self.corrupt.lock().clone();
        let results = req
            .ids
            .iter()
            .map(|id| ShardCheck {
                id: Some(*id),
                state: if corrupt.contains(id) { ShardState::ShardCorrupt } else { ShardState::ShardOk }
                    as i32,
                ..Default::default()
            })
            .collect();
        self.checks.lock().push(req);
        Ok(Response::new(CheckShardsReply { results }))
    }
    async fn pin(&self, _: Request<PinRequest>) -> Result<Response<PinReply>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn sync_shards(
        &self,
        _: Request<cairn_proto::SyncShardsRequest>,
    ) -> Result<Response<Empty>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

pub(crate) async fn fake_chunkserver() -> (String, FakeChunk) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = FakeChunk::default();
    let svc = ChunkServer::new(fake.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (addr, fake)
}

/// A closed port: connecting fails.
pub(crate) async fn dead_addr() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}

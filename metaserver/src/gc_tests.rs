//! The garbage collector against a fake chunkserver on 127.0.0.1:0.

use std::sync::Arc;

use cairn_common::{Layout, ROOT_INO};
use cairn_proto::chunk_server::{Chunk, ChunkServer};
use cairn_proto::*;
use tonic::{Request, Response, Status};

use super::*;
use crate::namespace::NewEntry;
use crate::schema::S_IFREG;

/// Records every shard id it is asked to delete.
#[derive(Clone, Default)]
struct FakeChunk {
    deleted: Arc<Mutex<Vec<cairn_proto::ShardId>>>,
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
        let ids = req.into_inner().ids;
        let n = ids.len() as u32;
        self.deleted.lock().extend(ids);
        Ok(Response::new(DeleteShardsReply { deleted: n }))
    }
    async fn stat(&self, _: Request<Empty>) -> Result<Response<ChunkStatReply>, Status> {
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
}

async fn fake_chunkserver() -> (String, FakeChunk) {
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
async fn dead_addr() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_on_up_nodes_and_keeps_the_rest() {
    let (addr, fake) = fake_chunkserver().await;
    let dead = dead_addr().await;
    let ns = Arc::new(Namespace::open_memory(Layout::new(2, 1, 4096).unwrap()).unwrap());
    let reg = ns.registry().clone();
    let a = reg.register("a", &addr, vec![], 0).unwrap();
    let b = reg.register("b", &addr, vec![], 0).unwrap();
    let c = reg.register("c", &dead, vec![], 0).unwrap();
    let new = NewEntry { parent: ROOT_INO, name: b"f", mode: S_IFREG | 0o644, uid: 0, gid: 0 };
    let f = ns.create(&new, 0, true).unwrap().0;
    let stripes: Vec<StripeInfo> =
        (0..3).map(|i| StripeInfo { index: i, version: 9, len: 10, written_len: 10, missing: 0 }).collect();
    ns.commit(f.ino, 3 * 8192, &stripes, None).unwrap();
    ns.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(ns.pending_gc().unwrap(), 9);

    let gc = Gc::new(ns.clone());
    let round = gc.run_once().await.unwrap();
    assert_eq!(round, GcRound { deleted: 6, dropped: 0, pending: 3 });
    let mut deleted = fake.deleted.lock().clone();
    deleted.sort_by_key(|s| (s.stripe, s.index));
    assert_eq!(deleted.len(), 6);
    let layout = f.layout();
    for s in &deleted {
        assert_eq!(s.ino, f.ino);
        assert_eq!(s.version, 9);
        let node = f.placement[layout.position(s.stripe, s.index)];
        assert!(node == a || node == b);
    }
    // The failing node's shards stay queued, round after round.
    assert_eq!(ns.pending_gc().unwrap(), 3);
    assert_eq!(gc.run_once().await.unwrap().pending, 3);
    assert_eq!(ns.pending_gc().unwrap(), 3);

    // Once the node comes back at a working address, they are deleted.
    reg.heartbeat(c, &addr, vec![], 0).unwrap();
    let round = gc.run_once().await.unwrap();
    assert_eq!(round, GcRound { deleted: 3, dropped: 0, pending: 0 });
    assert_eq!(ns.pending_gc().unwrap(), 0);
    assert_eq!(fake.deleted.lock().len(), 9);
    assert_eq!(gc.run_once().await.unwrap(), GcRound::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_of_unknown_nodes_are_dropped() {
    let ns = Arc::new(Namespace::open_memory(Layout::new(2, 1, 4096).unwrap()).unwrap());
    let mut batch = Batch::new();
    let entry = GcEntry { shards: vec![GcShard { node: 42, ino: 5, stripe: 0, index: 0, version: 1 }] };
    batch.put(Cf::Gc, schema::gc_key(0, 0), schema::encode(&entry));
    ns.store().write(batch).unwrap();
    let round = Gc::new(ns.clone()).run_once().await.unwrap();
    assert_eq!(round, GcRound { deleted: 0, dropped: 1, pending: 0 });
    assert_eq!(ns.pending_gc().unwrap(), 0);
}

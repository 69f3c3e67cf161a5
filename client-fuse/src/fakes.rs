//! Servers in memory for the client's unit tests: [`FakeChunk`], a chunkserver holding its
//! shards in a map (it can be taken down, refuse a stripe, or withhold a shard's tree), and
//! [`MemoryMeta`], the metaserver's own service over a namespace in memory, whose answers can
//! be held back to replay a race.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use cairn_common::{CairnError, ErrorKind, Layout, Result, ShardId};
use cairn_meta::{MetaService, Namespace};
use cairn_proto::meta_server::Meta;
use cairn_proto::{self as p, Capability};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tonic::Request;

use crate::file::FileMeta;
use crate::meta::{with_meta_rpcs, MetaApi};
use crate::nodes::{MetaDirectory, NodeDirectory, ShardApi};

/// One chunkserver: its shards in memory; while `down`, every request fails as unreachable.
#[derive(Default)]
pub(crate) struct FakeChunk {
    pub(crate) shards: Mutex<HashMap<ShardId, Bytes>>,
    pub(crate) down: AtomicBool,
    /// Writes of this stripe's shards fail (a full disk), while others go through.
    pub(crate) refused_stripe: Mutex<Option<u64>>,
    /// Answers without the tree even when asked (a format 1 shard, or a chunkserver hiding it).
    pub(crate) no_tree: AtomicBool,
    pub(crate) reads: AtomicU64,
}

fn unreachable() -> CairnError {
    CairnError::unavailable("connection refused (fake chunkserver down)")
}

impl ShardApi for FakeChunk {
    fn write_shard(&self, req: p::WriteShardRequest) -> BoxFuture<'_, Result<p::WriteShardReply>> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                return Err(unreachable());
            }
            let id = ShardId::from(req.id.as_ref().expect("shard id"));
            if *self.refused_stripe.lock() == Some(id.stripe) {
                return Err(CairnError::new(ErrorKind::NoSpace, "no room (fake chunkserver)"));
            }
            self.shards.lock().insert(id, req.data);
            Ok(p::WriteShardReply { tier: "ssd".into() })
        })
    }

    fn sync_shards(&self, _req: p::SyncShardsRequest) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                Err(unreachable())
            } else {
                Ok(())
            }
        })
    }

    fn read_shard(&self, req: p::ReadShardRequest) -> BoxFuture<'_, Result<p::ReadShardReply>> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                return Err(unreachable());
            }
            self.reads.fetch_add(1, Ordering::SeqCst);
            let id = ShardId::from(req.id.as_ref().expect("shard id"));
            let data =
                self.shards.lock().get(&id).cloned().ok_or_else(|| CairnError::not_found(format!("{id}")))?;
            let from = (req.offset as usize).min(data.len());
            let to = if req.len == 0 { data.len() } else { (from + req.len as usize).min(data.len()) };
            // As a chunkserver's format 2 shard: the tree of the bytes it holds, forged or not.
            let tree = if req.want_tree && !self.no_tree.load(Ordering::SeqCst) {
                Bytes::from(cairn_common::checksum::tree_blocks(&data).concat())
            } else {
                Bytes::new()
            };
            Ok(p::ReadShardReply { data: data.slice(from..to), shard_len: data.len() as u64, tree })
        })
    }

    fn delete_shards(&self, req: p::DeleteShardsRequest) -> BoxFuture<'_, Result<p::DeleteShardsReply>> {
        Box::pin(async move {
            let mut shards = self.shards.lock();
            let deleted = req.ids.iter().filter(|id| shards.remove(&ShardId::from(*id)).is_some()).count();
            Ok(p::DeleteShardsReply { deleted: deleted as u32 })
        })
    }
}

/// The metaserver's service over a namespace in memory, registered with `chunks` fake
/// chunkservers at addresses `fake:1`, `fake:2`, …; answers of a method can be held back
/// ([`MemoryMeta::hold`]).
pub(crate) struct MemoryMeta {
    service: MetaService,
    /// Per method, the next answer to hold until the test lets it go.
    holds: Mutex<HashMap<&'static str, Arc<Hold>>>,
}

/// One answer held back: `reached` once it is computed, delivered after `go`.
#[derive(Default)]
pub(crate) struct Hold {
    reached: Notify,
    go: Notify,
}

impl Hold {
    /// Wait until the held answer is computed (the server's state as of then is in it).
    pub(crate) async fn reached(&self) {
        self.reached.notified().await
    }

    /// Deliver the held answer.
    pub(crate) fn release(&self) {
        self.go.notify_one()
    }
}

impl MemoryMeta {
    pub(crate) async fn new(layout: Layout, chunks: usize) -> Arc<MemoryMeta> {
        let (ns, cluster) = Namespace::open_memory(layout).expect("a namespace in memory");
        let service = MetaService::new(Arc::new(ns), cluster);
        for n in 1..=chunks {
            let req = p::RegisterChunkRequest {
                uuid: format!("fake-{n}"),
                addr: format!("fake:{n}"),
                pid: 1,
                ..Default::default()
            };
            let id = service.register_chunk(Request::new(req)).await.expect("register").into_inner().node_id;
            assert_eq!(id as usize, n, "node ids in registration order");
            let beat = p::HeartbeatRequest { node_id: id, ..Default::default() };
            service.heartbeat(Request::new(beat)).await.expect("heartbeat");
        }
        Arc::new(MemoryMeta { service, holds: Mutex::default() })
    }

    /// Hold back the next answer to `method` (a [`MetaApi`] method's name): it is computed when
    /// asked, and delivered once the returned hold is released.
    pub(crate) fn hold(&self, method: &'static str) -> Arc<Hold> {
        let hold = Arc::new(Hold::default());
        self.holds.lock().insert(method, hold.clone());
        hold
    }

    /// The metaserver's attributes of `ino`, asked directly (never held).
    pub(crate) async fn get_attr_of(&self, ino: u64) -> Result<p::Attr> {
        let answer = Meta::get_attr(&self.service, Request::new(p::InoRequest { ino })).await;
        let reply = answer.map_err(CairnError::from)?.into_inner();
        reply.attr.ok_or_else(|| CairnError::internal("no attributes"))
    }

    async fn deliver<T>(&self, method: &'static str, answer: Result<T>) -> Result<T> {
        let hold = self.holds.lock().remove(method);
        if let Some(hold) = hold {
            hold.reached.notify_one();
            hold.go.notified().await;
        }
        answer
    }
}

macro_rules! served {
    ($($name:ident($req:ty) -> $reply:ty;)*) => {
        impl MetaApi for MemoryMeta {
            $(fn $name(&self, req: $req) -> BoxFuture<'_, Result<$reply>> {
                Box::pin(async move {
                    let answer = Meta::$name(&self.service, Request::new(req)).await;
                    let answer = answer.map(|r| r.into_inner()).map_err(CairnError::from);
                    self.deliver(stringify!($name), answer).await
                })
            })*

            /// Changes are not marked to be done once: nothing here resends them.
            fn set_client(&self, _client: u64) {}
        }
    };
}

with_meta_rpcs!(served);

impl FileMeta for MemoryMeta {
    fn commit(&self, req: p::CommitRequest) -> BoxFuture<'_, Result<p::AttrReply>> {
        Box::pin(async move {
            let answer = Meta::commit(&self.service, Request::new(req)).await;
            self.deliver("commit", answer.map(|r| r.into_inner()).map_err(CairnError::from)).await
        })
    }

    fn list_stripes(&self, req: p::ListStripesRequest) -> BoxFuture<'_, Result<p::ListStripesReply>> {
        Box::pin(async move {
            let answer = Meta::list_stripes(&self.service, Request::new(req)).await;
            self.deliver("list_stripes", answer.map(|r| r.into_inner()).map_err(CairnError::from)).await
        })
    }
}

/// The chunkservers a [`MemoryMeta`] knows, as fakes: node `n` is `chunks[n - 1]`. The node
/// map, capabilities and damage reports go to the metaserver as a mount's do.
pub(crate) struct FakeChunks {
    meta: MetaDirectory,
    chunks: Vec<Arc<FakeChunk>>,
}

impl FakeChunks {
    pub(crate) fn new(meta: Arc<MemoryMeta>, chunks: Vec<Arc<FakeChunk>>) -> FakeChunks {
        FakeChunks { meta: MetaDirectory::new(meta).expect("transport"), chunks }
    }
}

impl NodeDirectory for FakeChunks {
    fn list_nodes(&self) -> BoxFuture<'_, Result<Vec<(u32, String)>>> {
        self.meta.list_nodes()
    }

    fn grant_capability(&self, req: p::CapabilityRequest) -> BoxFuture<'_, Result<Capability>> {
        self.meta.grant_capability(req)
    }

    fn report_damaged(&self, ids: Vec<ShardId>) -> BoxFuture<'static, Result<()>> {
        self.meta.report_damaged(ids)
    }

    fn connect(&self, addr: &str) -> Result<Arc<dyn ShardApi>> {
        let n: usize = addr.trim_start_matches("fake:").parse().expect("a fake address");
        Ok(self.chunks[n - 1].clone())
    }
}

//! Chunkserver connections. The metaserver tells which node id lives at which address; the
//! client keeps a lazily connected pool of wire connections per node (or a tonic channel, with
//! `CAIRN_TRANSPORT=grpc`) and refreshes the map when it meets a node it does not know (a
//! chunkserver that joined or moved).
//!
//! A node that just failed a request with a timeout or a connection error is *suspect* for a
//! few seconds: reads go around it (reconstructing from the other shards) and writes record its
//! shard as missing without waiting, so a hung or partitioned chunkserver costs one timeout,
//! not one per request. After the suspect period the next request tries it again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_common::checksum::{hash_block, tree_block, tree_root, BlockHash, HASH_LEN};
use cairn_common::{CairnError, Result, ShardId, MAX_MESSAGE_BYTES};
use cairn_net::capability::{self, Held};
use cairn_net::connect::grpc_channel;
use cairn_net::tls::Role;
use cairn_net::wire::{self, WireClient};
use cairn_proto::chunk_client::ChunkClient;
use cairn_proto::{self as p, Capability};
use futures::future::BoxFuture;
use parking_lot::RwLock;
use tonic::transport::Channel;

use crate::blocks::{aligned, BlockCache, BLOCK};
use crate::meta::{MetaApi, Transport};

/// How long a node stays suspect after a timeout or a connection failure.
pub const SUSPECT_FOR: Duration = Duration::from_secs(5);
/// Deadline of one shard request (a write of a whole shard, or a read).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of connecting to a chunkserver.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One chunkserver's connections.
#[derive(Clone)]
enum ChunkConn {
    Wire(Arc<WireClient>),
    Grpc(ChunkClient<Channel>),
}

/// One chunkserver's shard requests: its wire or gRPC connection, or a fake in tests.
pub trait ShardApi: Send + Sync {
    fn write_shard(&self, req: p::WriteShardRequest) -> BoxFuture<'_, Result<p::WriteShardReply>>;
    fn sync_shards(&self, req: p::SyncShardsRequest) -> BoxFuture<'_, Result<()>>;
    fn read_shard(&self, req: p::ReadShardRequest) -> BoxFuture<'_, Result<p::ReadShardReply>>;
    fn delete_shards(&self, req: p::DeleteShardsRequest) -> BoxFuture<'_, Result<p::DeleteShardsReply>>;
}

impl ShardApi for ChunkConn {
    fn write_shard(&self, req: p::WriteShardRequest) -> BoxFuture<'_, Result<p::WriteShardReply>> {
        Box::pin(async move {
            match self {
                ChunkConn::Wire(c) => wire::chunk::write_shard(c, req).await,
                ChunkConn::Grpc(c) => {
                    c.clone().write_shard(req).await.map(|r| r.into_inner()).map_err(Into::into)
                }
            }
        })
    }

    fn sync_shards(&self, req: p::SyncShardsRequest) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            match self {
                ChunkConn::Wire(c) => wire::chunk::sync_shards(c, req).await.map(|_| ()),
                ChunkConn::Grpc(c) => c.clone().sync_shards(req).await.map(|_| ()).map_err(Into::into),
            }
        })
    }

    fn read_shard(&self, req: p::ReadShardRequest) -> BoxFuture<'_, Result<p::ReadShardReply>> {
        Box::pin(async move {
            match self {
                ChunkConn::Wire(c) => wire::chunk::read_shard(c, req).await,
                ChunkConn::Grpc(c) => {
                    c.clone().read_shard(req).await.map(|r| r.into_inner()).map_err(Into::into)
                }
            }
        })
    }

    fn delete_shards(&self, req: p::DeleteShardsRequest) -> BoxFuture<'_, Result<p::DeleteShardsReply>> {
        Box::pin(async move {
            match self {
                ChunkConn::Wire(c) => wire::chunk::delete_shards(c, req).await,
                ChunkConn::Grpc(c) => {
                    c.clone().delete_shards(req).await.map(|r| r.into_inner()).map_err(Into::into)
                }
            }
        })
    }
}

/// What [`Nodes`] needs from outside: where the chunkservers are, shard capabilities and
/// damage reports (the metaserver), and a connection to a chunkserver. [`MetaDirectory`] is
/// the real one; tests give a fake, so the file and stripe logic runs without servers.
pub trait NodeDirectory: Send + Sync {
    /// Every registered chunkserver: (node id, address).
    fn list_nodes(&self) -> BoxFuture<'_, Result<Vec<(u32, String)>>>;
    fn grant_capability(&self, req: p::CapabilityRequest) -> BoxFuture<'_, Result<Capability>>;
    /// Report shards corrupt or gone (the future owns what it needs: it runs detached).
    fn report_damaged(&self, ids: Vec<ShardId>) -> BoxFuture<'static, Result<()>>;
    fn connect(&self, addr: &str) -> Result<Arc<dyn ShardApi>>;
}

/// The metaserver's node map and the configured transport.
pub struct MetaDirectory {
    meta: Arc<dyn MetaApi>,
    transport: Transport,
}

impl MetaDirectory {
    pub fn new(meta: Arc<dyn MetaApi>) -> Result<MetaDirectory> {
        Ok(MetaDirectory { meta, transport: Transport::from_env()? })
    }
}

impl NodeDirectory for MetaDirectory {
    fn list_nodes(&self) -> BoxFuture<'_, Result<Vec<(u32, String)>>> {
        Box::pin(async move {
            let nodes = self.meta.list_nodes(p::Empty {}).await?.nodes;
            Ok(nodes.into_iter().map(|n| (n.id, n.addr)).collect())
        })
    }

    fn grant_capability(&self, req: p::CapabilityRequest) -> BoxFuture<'_, Result<Capability>> {
        Box::pin(self.meta.grant_capability(req))
    }

    fn report_damaged(&self, ids: Vec<ShardId>) -> BoxFuture<'static, Result<()>> {
        let meta = self.meta.clone();
        Box::pin(async move {
            let req =
                p::ReportDamagedRequest { ids: ids.into_iter().map(Into::into).collect(), confirm: false };
            meta.report_damaged(req).await.map(|_| ())
        })
    }

    fn connect(&self, addr: &str) -> Result<Arc<dyn ShardApi>> {
        Ok(Arc::new(match self.transport {
            Transport::Wire => ChunkConn::Wire(Arc::new(WireClient::new(
                addr,
                Role::Chunk,
                CONNECT_TIMEOUT,
                REQUEST_TIMEOUT,
            ))),
            Transport::Grpc => {
                let channel = grpc_channel(addr, Role::Chunk, CONNECT_TIMEOUT, REQUEST_TIMEOUT)
                    .map_err(|e| CairnError::invalid(format!("chunkserver address: {e}")))?;
                ChunkConn::Grpc(
                    ChunkClient::new(channel)
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
            }
        }))
    }
}

/// First and longest pause between tries while waiting for chunkservers.
const WAIT_FIRST_PAUSE: Duration = Duration::from_millis(100);
const WAIT_MAX_PAUSE: Duration = Duration::from_secs(2);

/// A chunkserver's address and its connection.
type Known = (String, Arc<dyn ShardApi>);

pub struct Nodes {
    directory: Arc<dyn NodeDirectory>,
    /// How long an operation that finds too few chunkservers answering waits for them.
    wait: Duration,
    chunks: RwLock<HashMap<u32, Known>>,
    refresh: tokio::sync::Mutex<()>,
    /// Nodes that failed to answer, and when.
    suspect: RwLock<HashMap<u32, Instant>>,
    /// Verified shard blocks kept for random readers.
    blocks: BlockCache,
    /// Shard capabilities by inode, from opens, creates and grants.
    caps: Held,
    /// Shard writes are answered from the chunkservers' page cache (`durability=close`).
    buffered: bool,
}

impl Nodes {
    /// Connections through `directory`, with a block cache of `cache_bytes` (0: none).
    pub fn with_directory(directory: Arc<dyn NodeDirectory>, cache_bytes: usize) -> Nodes {
        Nodes {
            directory,
            wait: Duration::ZERO,
            chunks: RwLock::new(HashMap::new()),
            refresh: tokio::sync::Mutex::new(()),
            suspect: RwLock::new(HashMap::new()),
            blocks: BlockCache::new(cache_bytes),
            caps: Held::default(),
            buffered: true,
        }
    }

    /// Write shards buffered (`Close`, the default) or durable (`Fsync`).
    pub fn with_durability(mut self, durability: crate::Durability) -> Nodes {
        self.buffered = durability == crate::Durability::Close;
        self
    }

    /// Whether shard writes are answered before they are on disk, so an fsync must ask the
    /// chunkservers to flush them ([`Nodes::sync_shards`]).
    pub fn buffered(&self) -> bool {
        self.buffered
    }

    /// Wait up to `wait` for chunkservers when too few answer (see [`Nodes::waiting`]).
    pub fn with_wait(mut self, wait: Duration) -> Nodes {
        self.wait = wait;
        self
    }

    /// Run `attempt` until it succeeds, fails with anything but
    /// [`ErrorKind::TooFewNodes`](cairn_common::ErrorKind::TooFewNodes), or the wait bound has
    /// passed (see [`NodeWait`]).
    pub async fn waiting<T, F, Fut>(&self, op: &'static str, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut wait = self.wait_for(op);
        loop {
            match attempt().await {
                Err(e) => wait.again(e).await?,
                Ok(v) => {
                    wait.succeeded();
                    return Ok(v);
                }
            }
        }
    }

    /// A wait for chunkservers, for an operation that retries by itself.
    pub fn wait_for(&self, op: &'static str) -> NodeWait {
        NodeWait { bound: self.wait, op, started: Instant::now(), pause: WAIT_FIRST_PAUSE, waited: false }
    }

    /// The node failed to answer within the last [`SUSPECT_FOR`].
    pub fn is_suspect(&self, node: u32) -> bool {
        self.suspect.read().get(&node).is_some_and(|t| t.elapsed() < SUSPECT_FOR)
    }

    /// Every node suspect right now.
    pub fn suspects(&self) -> Vec<u32> {
        self.suspect.read().iter().filter(|(_, t)| t.elapsed() < SUSPECT_FOR).map(|(n, _)| *n).collect()
    }

    /// `node` did not answer a read in time: go around it for a while.
    pub fn mark_slow(&self, node: u32) {
        if self.suspect.write().insert(node, Instant::now()).is_none() {
            tracing::warn!(node, "chunkserver slow to answer; going around it for {SUSPECT_FOR:?}");
        }
    }

    /// Note the outcome of a request to `node`: timeouts and unreachable nodes make it suspect,
    /// any answer clears it.
    fn note<T>(&self, node: u32, result: &Result<T>) {
        match result {
            Err(e) if e.kind() == cairn_common::ErrorKind::Unavailable => {
                if self.suspect.write().insert(node, Instant::now()).is_none() {
                    tracing::warn!(
                        node,
                        "chunkserver not answering; going around it for {SUSPECT_FOR:?}: {e}"
                    );
                }
            }
            _ => {
                if self.suspect.read().contains_key(&node) && self.suspect.write().remove(&node).is_some() {
                    tracing::info!(node, "chunkserver answers again");
                }
            }
        }
    }

    async fn client(&self, node: u32) -> Result<Arc<dyn ShardApi>> {
        if let Some((_, c)) = self.chunks.read().get(&node) {
            return Ok(c.clone());
        }
        self.refresh().await?;
        self.chunks
            .read()
            .get(&node)
            .map(|(_, c)| c.clone())
            .ok_or_else(|| CairnError::unavailable(format!("chunkserver {node} is not registered")))
    }

    /// Reload the node map from the metaserver (one caller at a time).
    pub async fn refresh(&self) -> Result<()> {
        let _guard = self.refresh.lock().await;
        let nodes = self.directory.list_nodes().await?;
        let mut map = self.chunks.write();
        for (id, addr) in nodes {
            if map.get(&id).is_some_and(|(known, _)| *known == addr) {
                continue;
            }
            let conn = self.directory.connect(&addr)?;
            map.insert(id, (addr, conn));
        }
        Ok(())
    }

    /// Keep the shard capability an open or a create answered with; `asked` renews it (the
    /// open's access and caller).
    pub fn keep_capability(&self, cap: Option<Capability>, asked: p::CapabilityRequest) {
        self.caps.keep(cap, asked);
    }

    /// The capability for inode `ino`'s shards: the one held, unless it runs out soon, or a
    /// new one from the metaserver.
    async fn capability(&self, ino: u64) -> Result<Capability> {
        if let Some(cap) = self.caps.fresh(ino) {
            return Ok(cap);
        }
        let asked = self.caps.renewal(ino);
        let cap = self.directory.grant_capability(asked.clone()).await?;
        self.caps.keep(Some(cap.clone()), asked);
        Ok(cap)
    }

    /// Run `request` with `cap` (the capability for `ino`, got before: failing to get one is
    /// the metaserver's trouble, not the chunkserver's), and once more with a new one if the
    /// chunkserver refused it (expired on its clock, or signed with a key it no longer has).
    async fn with_capability<T, F, Fut>(&self, ino: u64, cap: Capability, request: F) -> Result<T>
    where
        F: Fn(Capability) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        match request(cap).await {
            Err(e) if capability::is_refusal(&e) => {
                tracing::debug!(ino, "a chunkserver refused a shard capability, asking for a new one: {e}");
                self.caps.forget(ino);
                match self.capability(ino).await {
                    Ok(cap) => request(cap).await,
                    Err(_) => Err(e),
                }
            }
            other => other,
        }
    }

    pub async fn write_shard(&self, node: u32, id: ShardId, data: Bytes) -> Result<()> {
        let c = self.client(node).await?;
        let cap = self.capability(id.ino).await?;
        let result = self
            .with_capability(id.ino, cap, |cap| {
                let req = cairn_proto::WriteShardRequest {
                    id: Some(id.into()),
                    data: data.clone(),
                    cap: Some(cap),
                    buffered: self.buffered,
                };
                c.write_shard(req)
            })
            .await
            .map(|_| ())
            .map_err(|e| node_error(node, e));
        self.note(node, &result);
        result
    }

    /// Have chunkserver `node` put every shard of `ino` written to it so far on disk.
    pub async fn sync_shards(&self, node: u32, ino: u64) -> Result<()> {
        let c = self.client(node).await?;
        let cap = self.capability(ino).await?;
        let result = self
            .with_capability(ino, cap, |cap| {
                c.sync_shards(cairn_proto::SyncShardsRequest { ino, cap: Some(cap) })
            })
            .await
            .map_err(|e| node_error(node, e));
        self.note(node, &result);
        result
    }

    /// A shard whose bytes do not match the content hash its writer recorded: its cached
    /// blocks are dropped and it is reported damaged.
    pub fn content_mismatch(&self, id: ShardId) {
        ::metrics::counter!(crate::metrics::CONTENT_MISMATCHES).increment(1);
        self.blocks.forget(id);
        self.report_damaged(id);
    }

    /// Tell the metaserver a shard is corrupt or gone (fire and forget): it marks the shard
    /// missing and the repair rebuilds it.
    pub fn report_damaged(&self, id: ShardId) {
        let report = self.directory.report_damaged(vec![id]);
        tokio::spawn(async move {
            if let Err(e) = report.await {
                tracing::warn!(shard = %id, "could not report a damaged shard: {e}");
            }
        });
    }

    /// Delete shards from one chunkserver; returns how many existed.
    pub async fn delete_shards(&self, node: u32, ids: Vec<ShardId>) -> Result<u32> {
        let c = self.client(node).await?;
        // One file's shards (its capability covers them); fence 0: the client's own abandoned
        // shards, not a metaserver leader's order.
        let Some(ino) = ids.first().map(|id| id.ino) else { return Ok(0) };
        if ids.iter().any(|id| id.ino != ino) {
            return Err(CairnError::internal("one delete of shards of more than one file"));
        }
        let ids: Vec<cairn_proto::ShardId> = ids.into_iter().map(Into::into).collect();
        let cap = self.capability(ino).await?;
        let reply = self
            .with_capability(ino, cap, |cap| {
                let req = cairn_proto::DeleteShardsRequest {
                    ids: ids.clone(),
                    fence: 0,
                    cluster_id: String::new(),
                    cap: Some(cap),
                    group: 0,
                };
                c.delete_shards(req)
            })
            .await;
        Ok(reply.map_err(|e| node_error(node, e))?.deleted)
    }

    /// Read `len` bytes (0 = to the end) at `offset` of a shard. With `reader_checks` the
    /// caller checks the bytes against their content hash (a whole data shard), and the
    /// chunkserver sends them without verifying its block checksums.
    pub async fn read_shard(
        &self,
        node: u32,
        id: ShardId,
        offset: u64,
        len: u64,
        reader_checks: bool,
    ) -> Result<Bytes> {
        self.read_reply(node, id, (offset, len), reader_checks, false).await.map(|r| r.data)
    }

    async fn read_reply(
        &self,
        node: u32,
        id: ShardId,
        (offset, len): (u64, u64),
        reader_checks: bool,
        want_tree: bool,
    ) -> Result<p::ReadShardReply> {
        let c = self.client(node).await?;
        let cap = self.capability(id.ino).await?;
        let result = self
            .with_capability(id.ino, cap, |cap| {
                c.read_shard(cairn_proto::ReadShardRequest {
                    id: Some(id.into()),
                    offset,
                    len,
                    cap: Some(cap),
                    reader_checks,
                    want_tree,
                })
            })
            .await
            .map_err(|e| node_error(node, e));
        self.note(node, &result);
        result
    }

    /// [`Nodes::read_shard`] through the block cache: answered from it when every block the
    /// range touches is there. Otherwise a range shorter than a block is widened to the whole
    /// block(s) around it (the chunkserver reads and verifies whole blocks anyway, so only the
    /// transfer grows), a longer one is read as asked (no more than asked for), and the blocks
    /// the answer holds whole are kept. With `content` (a data shard's content hash), the range
    /// is widened to whole blocks in any case and each block is checked end to end: the
    /// chunkserver sends the values of the shard's BLAKE3 tree, which must merge to `content`,
    /// and each block read must have its value (a shard sent without them — format 1, or a
    /// chunkserver withholding them — is read whole instead and checked against `content`).
    /// A block that fails is `Corrupt`, kept nowhere.
    pub async fn read_shard_cached(
        &self,
        node: u32,
        id: ShardId,
        offset: u64,
        len: u64,
        content: Option<&BlockHash>,
    ) -> Result<Bytes> {
        self.read_blocks(node, id, (offset, len), content, self.blocks.enabled()).await
    }

    /// Part of a data shard whose content hash is `content`, checked as
    /// [`Nodes::read_shard_cached`] checks it, without the block cache (whole-stripe readers).
    pub async fn read_shard_checked(
        &self,
        node: u32,
        id: ShardId,
        offset: u64,
        len: u64,
        content: &BlockHash,
    ) -> Result<Bytes> {
        self.read_blocks(node, id, (offset, len), Some(content), false).await
    }

    async fn read_blocks(
        &self,
        node: u32,
        id: ShardId,
        (offset, len): (u64, u64),
        content: Option<&BlockHash>,
        cache: bool,
    ) -> Result<Bytes> {
        if len == 0 || (!cache && content.is_none()) {
            return self.read_shard(node, id, offset, len, false).await;
        }
        if cache {
            if let Some(hit) = self.blocks.get(id, offset, len) {
                ::metrics::counter!(crate::metrics::BLOCK_CACHE_HITS).increment(1);
                return Ok(hit);
            }
            ::metrics::counter!(crate::metrics::BLOCK_CACHE_MISSES).increment(1);
        }
        let (start, span) = if len >= BLOCK && content.is_none() {
            (offset, len)
        } else {
            let (first, span) = aligned(offset, len);
            (first * BLOCK, span)
        };
        let reply = self.read_reply(node, id, (start, span), false, content.is_some()).await?;
        let (mut data, mut start, mut span) = (reply.data, start, span);
        if let Some(content) = content {
            let checked = if reply.tree.is_empty() {
                // No tree (a format 1 shard, or a chunkserver withholding it): the whole shard,
                // checked against its hash, and kept whole in the cache.
                let whole = self.read_shard(node, id, 0, 0, true).await?;
                let checked = match hash_block(&whole) == *content {
                    true => Ok(()),
                    false => Err(CairnError::corrupt(format!(
                        "shard {id}: its bytes do not match the content hash its writer recorded"
                    ))),
                };
                (data, start, span) = (whole, 0, u64::MAX);
                checked
            } else {
                check_tree(id, start, &data, reply.shard_len, &reply.tree, content)
            };
            if let Err(e) = checked {
                ::metrics::counter!(crate::metrics::CONTENT_MISMATCHES).increment(1);
                self.blocks.forget(id);
                return Err(e);
            }
        }
        if cache {
            self.blocks.insert(id, start, &data, (data.len() as u64) < span);
            ::metrics::gauge!(crate::metrics::BLOCK_CACHE_BYTES).set(self.blocks.bytes() as f64);
        }
        let from = ((offset - start) as usize).min(data.len());
        let to = (from + len as usize).min(data.len());
        Ok(data.slice(from..to))
    }
}

/// Check `data`, the whole blocks of shard `id` from byte `start` (a block boundary), against
/// the shard's content hash through its BLAKE3 tree: the chunkserver's `tree` values must merge
/// to `content`, and each block must have its value.
fn check_tree(
    id: ShardId,
    start: u64,
    data: &[u8],
    shard_len: u64,
    tree: &[u8],
    content: &BlockHash,
) -> Result<()> {
    let bad = |what: String| CairnError::corrupt(format!("shard {id}: {what}"));
    if !tree.len().is_multiple_of(HASH_LEN) {
        return Err(bad(format!("a tree of {} bytes", tree.len())));
    }
    let values: Vec<BlockHash> =
        tree.chunks_exact(HASH_LEN).map(|c| c.try_into().expect("HASH_LEN")).collect();
    if tree_root(&values, shard_len).as_ref() != Some(content) {
        return Err(bad("its blocks' tree does not match the content hash its writer recorded".into()));
    }
    let first = (start / BLOCK) as usize;
    for (i, block) in data.chunks(BLOCK as usize).enumerate() {
        let index = first + i;
        // Only the shard's last block may be short.
        let whole = block.len() as u64 == BLOCK || start + i as u64 * BLOCK + block.len() as u64 == shard_len;
        if !whole || values.get(index) != Some(&tree_block(block, index as u32, shard_len)) {
            return Err(bad(format!("block {index} does not match the content hash its writer recorded")));
        }
    }
    Ok(())
}

/// Waiting for chunkservers when too few answer: a chunkserver restart or a network blip
/// shorter than the bound (`write_wait_ms`) costs the application time, not an error. Pauses
/// between tries grow from 100 ms to 2 s; the start and the end of a wait are logged, and each
/// wait is counted by `op`.
pub struct NodeWait {
    bound: Duration,
    op: &'static str,
    started: Instant,
    pause: Duration,
    waited: bool,
}

impl NodeWait {
    /// After a failed try: `Ok` once it is time to try again, or `e` itself when it is not
    /// [`ErrorKind::TooFewNodes`](cairn_common::ErrorKind::TooFewNodes) or the bound has
    /// passed since the first try.
    pub async fn again(&mut self, e: CairnError) -> Result<()> {
        let elapsed = self.started.elapsed();
        if e.kind() != cairn_common::ErrorKind::TooFewNodes || elapsed >= self.bound {
            if self.waited {
                self.record(elapsed);
                ::metrics::counter!(crate::metrics::NODE_WAIT_FAILURES, "op" => self.op).increment(1);
                tracing::warn!(op = self.op, "gave up waiting for chunkservers after {elapsed:.1?}: {e}");
            }
            return Err(e);
        }
        if !self.waited {
            self.waited = true;
            ::metrics::counter!(crate::metrics::NODE_WAITS, "op" => self.op).increment(1);
            tracing::warn!(op = self.op, "too few chunkservers answer; waiting up to {:?}: {e}", self.bound);
        }
        tokio::time::sleep(self.pause.min(self.bound - elapsed)).await;
        self.pause = (self.pause * 2).min(WAIT_MAX_PAUSE);
        Ok(())
    }

    /// The operation went through (after a wait, if there was one).
    pub fn succeeded(&self) {
        if self.waited {
            let elapsed = self.started.elapsed();
            self.record(elapsed);
            tracing::info!(op = self.op, "chunkservers answer again after {elapsed:.1?}");
        }
    }

    fn record(&self, elapsed: Duration) {
        ::metrics::histogram!(crate::metrics::NODE_WAIT_SECONDS, "op" => self.op)
            .record(elapsed.as_secs_f64());
    }
}

fn node_error(node: u32, e: CairnError) -> CairnError {
    CairnError::new(e.kind(), format!("chunkserver {node}: {}", e.message()))
}

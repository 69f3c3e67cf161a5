//! Rebuilding a lost shard here from its stripe's other shards. The metaserver's repair picks
//! this node as the new home of shard `i` and names where the other shards live; this node
//! fetches any `k` of them from its peers, decodes, and stores the result like any write (in a
//! temp file, checksummed, fsynced, renamed). Data shards past the stripe's written length are
//! empty and known to be zeros, so they are never fetched. When a source of the same index is
//! named (a shard moving off a draining or full node), it is copied from there instead, and
//! decoding from the others is the fallback.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cairn_common::codec::StripeShards;
use cairn_common::content::ContentHashes;
use cairn_common::{CairnError, Layout, Result, ShardId};
use cairn_net::channels::Channels;
use cairn_proto::{ReadShardRequest, RebuildShardRequest};

use crate::store::ShardStore;

/// Fetch, decode and store the requested shard; returns its length.
pub async fn rebuild(store: &Arc<ShardStore>, req: RebuildShardRequest) -> Result<u64> {
    let id = ShardId::from(req.id.as_ref().ok_or_else(|| CairnError::invalid("rebuild: no shard id"))?);
    id.validate()?;
    let layout =
        Layout::try_from(req.layout.as_ref().ok_or_else(|| CairnError::invalid("rebuild: no layout"))?)?;
    if id.index >= layout.width() || req.written_len > layout.stripe_bytes() {
        return Err(CairnError::invalid(format!("rebuild: shard {id} does not fit {layout}")));
    }
    let want_len = layout.shard_len(id.index, req.written_len);
    let hashes = ContentHashes::from_bytes(&req.hashes, layout.k)?;
    if let Some(same) = req.sources.iter().find(|s| s.index == id.index) {
        match fetch(&same.addr, id).await {
            Ok(data) if data.len() as u64 == want_len => match hashes.check(id.index, &data) {
                Ok(()) => {
                    store.write(id, bytes::Bytes::from(data)).await?;
                    return Ok(want_len);
                }
                Err(e) => {
                    tracing::warn!(%id, addr = %same.addr, "copy source refused, decoding instead: {e}")
                }
            },
            Ok(data) => tracing::warn!(%id, got = data.len(), want_len, "copy source has the wrong length"),
            Err(e) => tracing::warn!(%id, addr = %same.addr, "copy failed, decoding instead: {e}"),
        }
    }
    let mut shards = StripeShards::new(layout, req.written_len).verified_by(hashes);
    let fetches = req.sources.iter().filter(|s| s.index < layout.width() && s.index != id.index).map(|s| {
        let source = ShardId { index: s.index, ..id };
        async move { (s.index, fetch(&s.addr, source).await) }
    });
    for (index, result) in futures::future::join_all(fetches).await {
        if let Err(e) = result.and_then(|data| shards.add(index, &data)) {
            tracing::warn!(%id, index, "rebuild: source unusable: {e}");
        }
    }
    let data = shards
        .shard(id.index)
        .map_err(|e| CairnError::new(e.kind(), format!("rebuild {id}: {}", e.message())))?;
    let len = data.len() as u64;
    store.write(id, bytes::Bytes::from(data)).await?;
    Ok(len)
}

/// Connections to peers, kept across rebuilds (a repair sends one request per shard).
fn peers() -> &'static Channels {
    static PEERS: OnceLock<Channels> = OnceLock::new();
    PEERS.get_or_init(|| Channels::new(Duration::from_secs(2), Duration::from_secs(30)))
}

async fn fetch(addr: &str, id: ShardId) -> Result<Vec<u8>> {
    let mut client = peers().chunk(addr)?;
    let reply = client
        .read_shard(ReadShardRequest { id: Some(id.into()), offset: 0, len: 0, ..Default::default() })
        .await
        .map_err(CairnError::from)?
        .into_inner();
    Ok(reply.data.to_vec())
}

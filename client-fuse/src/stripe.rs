//! Stripe I/O: encode a stripe and write its shards in parallel; read a byte range of a stripe
//! from the data shards that hold it, and fall back to Reed–Solomon reconstruction from any `k`
//! shards when a shard is missing, unreachable or fails its checksum. A read whose shards do
//! not all answer within [`HEDGE_AFTER`] is served by reconstruction instead (the slow nodes
//! become suspect), and reconstruction asks every shard at once and decodes from the first `k`
//! that arrive, so one hung chunkserver delays a read by at most [`HEDGE_AFTER`].
//!
//! Shard `i` of stripe `s` lives on `placement[layout.position(s, i)]`. Data shards hold the
//! stripe's bytes unit by unit; a data shard past the written length is empty and is neither
//! written nor read (it is known to be zeros), so a file smaller than one unit costs one data
//! shard plus `m` parity shards, and one request to read.

use std::time::Duration;

use bytes::Bytes;
use cairn_common::codec::{Codec, StripeShards};
use cairn_common::content::ContentHashes;
use cairn_common::{CairnError, ErrorKind, Layout, Result, ShardId};
use cairn_proto::StripeInfo;
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::nodes::Nodes;

/// How long a read waits for the shards that hold its bytes before reconstructing from others.
pub const HEDGE_AFTER: Duration = Duration::from_secs(2);

/// Where a file's shards live.
#[derive(Clone, Debug)]
pub struct Geometry {
    pub ino: u64,
    pub layout: Layout,
    pub placement: Vec<u32>,
}

impl Geometry {
    pub fn node(&self, stripe: u64, index: u32) -> u32 {
        self.placement[self.layout.position(stripe, index)]
    }

    pub fn shard(&self, stripe: u64, index: u32, version: u64) -> ShardId {
        ShardId { ino: self.ino, stripe, index, version }
    }
}

/// Encode `data` (the first `data.len()` bytes of stripe `stripe`) and store its shards as
/// `version`. Succeeds when at most `m − 1` shards failed (the stripe still survives one more
/// loss); the failed ones are recorded in `missing` for repair. With `retrying` (a later try
/// of a wait for chunkservers), a stripe with more suspect nodes than it can do without fails
/// at once instead of waiting for their timeouts; a first try always tries them.
pub async fn write_stripe(
    nodes: &Nodes,
    geo: &Geometry,
    stripe: u64,
    version: u64,
    data: &Bytes,
    retrying: bool,
) -> Result<StripeInfo> {
    let layout = geo.layout;
    let written = data.len() as u64;
    let unit = layout.unit as usize;
    let coded = layout.coded_len(written) as usize;
    // The data shards are slices of the stripe's buffer, not copies.
    let mut shards: Vec<Bytes> = (0..layout.k as usize)
        .map(|i| {
            let start = (i * unit).min(data.len());
            let end = ((i + 1) * unit).min(data.len());
            data.slice(start..end)
        })
        .collect();
    let hashes = ContentHashes::of(&shards).to_bytes();
    if layout.m > 0 && written > 0 {
        // The codec wants shards of one length: a full stripe's are already; only a partial
        // stripe's shorter shards are copied to be zero-padded.
        let codec = Codec::new(layout.k, layout.m);
        let parity = if shards.iter().all(|s| s.len() == coded) {
            codec.encode(&shards)?
        } else {
            let padded: Vec<Vec<u8>> = shards
                .iter()
                .map(|s| {
                    let mut v = Vec::with_capacity(coded);
                    v.extend_from_slice(s);
                    v.resize(coded, 0);
                    v
                })
                .collect();
            codec.encode(&padded)?
        };
        shards.extend(parity.into_iter().map(Bytes::from));
    }
    let tolerated = layout.m.saturating_sub(1);
    // Retrying, and more of the stripe's nodes did not answer lately than it can do without:
    // writing would only wait for their timeouts again.
    let suspects: Vec<u32> = (0..shards.len() as u32)
        .filter(|&i| !shards[i as usize].is_empty())
        .map(|i| geo.node(stripe, i))
        .filter(|&node| nodes.is_suspect(node))
        .collect();
    if retrying && suspects.len() as u32 > tolerated {
        return Err(CairnError::new(
            ErrorKind::TooFewNodes,
            format!(
                "stripe {stripe} of inode {}: chunkservers {suspects:?} did not answer lately, at most \
                 {tolerated} of its shards may be missing",
                geo.ino
            ),
        ));
    }
    // Shards for suspect nodes are recorded missing without waiting for them, as long as the
    // stripe can afford it.
    let mut skipped = 0u32;
    let mut missing = 0u32;
    let mut writes = Vec::new();
    for (i, s) in shards.into_iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        let index = i as u32;
        let node = geo.node(stripe, index);
        if nodes.is_suspect(node) && skipped < tolerated {
            skipped += 1;
            missing |= 1 << index;
            tracing::debug!(ino = geo.ino, stripe, index, node, "shard not written: node suspect");
            metrics::counter!(crate::metrics::SHARD_WRITE_FAILURES).increment(1);
            continue;
        }
        let id = geo.shard(stripe, index, version);
        writes.push(async move { (index, nodes.write_shard(node, id, s).await) });
    }
    let mut stored = Vec::new();
    let mut first_error = None;
    // Every failure was a node not answering (as opposed to one refusing the write).
    let mut all_unreachable = true;
    for (index, result) in join_all(writes).await {
        match result {
            Ok(()) => stored.push(index),
            Err(e) => {
                tracing::warn!(ino = geo.ino, stripe, index, "shard write failed: {e}");
                metrics::counter!(crate::metrics::SHARD_WRITE_FAILURES).increment(1);
                missing |= 1 << index;
                all_unreachable &= unreachable(&e);
                first_error.get_or_insert(e);
            }
        }
    }
    if missing.count_ones() > tolerated {
        // This version will never be committed: its stored shards are garbage now.
        let deletes = stored.iter().map(|&index| {
            nodes.delete_shards(geo.node(stripe, index), vec![geo.shard(stripe, index, version)])
        });
        join_all(deletes).await;
        let e = first_error.unwrap_or_else(|| CairnError::internal("shard write failed"));
        // A full disk stays ENOSPC for the application; too few nodes answering is worth
        // waiting for (the caller decides how long); anything else is an I/O error.
        let kind = if e.kind() == ErrorKind::NoSpace {
            ErrorKind::NoSpace
        } else if all_unreachable {
            ErrorKind::TooFewNodes
        } else {
            ErrorKind::Io
        };
        return Err(CairnError::new(
            kind,
            format!(
                "stripe {stripe} of inode {}: {} shards failed, at most {tolerated} may: {}",
                geo.ino,
                missing.count_ones(),
                e.message()
            ),
        ));
    }
    Ok(StripeInfo {
        index: stripe,
        version,
        len: written,
        written_len: written,
        missing,
        hashes: hashes.into(),
    })
}

/// [`write_stripe`], waiting for chunkservers while too few answer (up to the mount's
/// `write_wait`). Each try stores a new version (`next_version`): a failed try deletes the
/// shards it stored, and a delete that arrives late must never hit a later try's shard.
pub async fn write_stripe_waiting(
    nodes: &Nodes,
    geo: &Geometry,
    stripe: u64,
    next_version: impl Fn() -> u64,
    data: &Bytes,
) -> Result<StripeInfo> {
    let mut wait = nodes.wait_for("write");
    let mut retrying = false;
    loop {
        match write_stripe(nodes, geo, stripe, next_version(), data, retrying).await {
            Ok(info) => {
                wait.succeeded();
                return Ok(info);
            }
            Err(e) => {
                wait.again(e).await?;
                retrying = true;
            }
        }
    }
}

/// [`read_stripe`], waiting for chunkservers while fewer than `k` of the stripe's shards can be
/// had (up to the mount's `write_wait`).
pub async fn read_stripe_waiting(
    nodes: &Nodes,
    geo: &Geometry,
    info: &StripeInfo,
    offset: u64,
    out: &mut [u8],
    reader: Reader,
) -> Result<()> {
    let mut wait = nodes.wait_for("read");
    loop {
        match read_stripe(nodes, geo, info, offset, out, reader).await {
            Ok(()) => {
                wait.succeeded();
                return Ok(());
            }
            Err(e) => wait.again(e).await?,
        }
    }
}

/// [`read_whole_stripe`], waiting for chunkservers as [`read_stripe_waiting`] does.
pub async fn read_whole_stripe_waiting(nodes: &Nodes, geo: &Geometry, info: &StripeInfo) -> Result<Pieces> {
    let mut wait = nodes.wait_for("read");
    loop {
        match read_whole_stripe(nodes, geo, info).await {
            Ok(p) => {
                wait.succeeded();
                return Ok(p);
            }
            Err(e) => wait.again(e).await?,
        }
    }
}

/// Who reads: a random reader goes through the client's block cache, whole-stripe reads (the
/// sequential readers' stripe cache, read-modify-write) do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    Random,
    Whole,
}

/// A stripe's valid bytes as the shards' answers arrived, in order, without copying them into
/// one buffer: a read inside one piece is a slice of it.
#[derive(Clone, Debug, Default)]
pub struct Pieces {
    pieces: Vec<Bytes>,
    len: usize,
}

impl From<Bytes> for Pieces {
    fn from(b: Bytes) -> Pieces {
        Pieces::new(vec![b])
    }
}

impl Pieces {
    fn new(pieces: Vec<Bytes>) -> Pieces {
        let len = pieces.iter().map(Bytes::len).sum();
        Pieces { pieces, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes `from..from + len` (clamped to the valid ones): a slice of one piece when they lie
    /// in one, else copied together.
    pub fn slice(&self, from: usize, len: usize) -> Bytes {
        let to = (from + len).min(self.len);
        let from = from.min(to);
        let mut at = 0;
        for p in &self.pieces {
            if from >= at && to <= at + p.len() {
                return p.slice(from - at..to - at);
            }
            at += p.len();
        }
        let mut out = vec![0u8; to - from];
        self.copy_to(from, &mut out);
        Bytes::from(out)
    }

    /// Copy bytes from `from` into `out`, as many as there are; returns how many.
    pub fn copy_to(&self, from: usize, out: &mut [u8]) -> usize {
        let mut at = 0;
        let mut done = 0;
        for p in &self.pieces {
            let end = at + p.len();
            let pos = from + done;
            if done < out.len() && pos < end && pos >= at {
                let n = (end - pos).min(out.len() - done);
                out[done..done + n].copy_from_slice(&p[pos - at..pos - at + n]);
                done += n;
            }
            at = end;
        }
        done
    }
}

/// Fill `out` with stripe bytes starting at `offset` (relative to the stripe start). Bytes at
/// or past `info.len` read as zeros.
pub async fn read_stripe(
    nodes: &Nodes,
    geo: &Geometry,
    info: &StripeInfo,
    offset: u64,
    out: &mut [u8],
    reader: Reader,
) -> Result<()> {
    let valid = info.len.saturating_sub(offset).min(out.len() as u64) as usize;
    out[valid..].fill(0);
    if valid == 0 {
        return Ok(());
    }
    if let Some(pieces) = read_data_shards(nodes, geo, info, offset, valid as u64, reader).await {
        let mut at = 0;
        for p in pieces {
            out[at..at + p.len()].copy_from_slice(&p);
            at += p.len();
        }
        return Ok(());
    }
    let data = reconstruct(nodes, geo, info).await?;
    let from = offset as usize;
    out[..valid].copy_from_slice(&data[from..from + valid]);
    Ok(())
}

/// The stripe's valid bytes (what a sequential reader's stripe cache holds), each data shard's
/// answer kept as it came.
pub async fn read_whole_stripe(nodes: &Nodes, geo: &Geometry, info: &StripeInfo) -> Result<Pieces> {
    if info.len == 0 {
        return Ok(Pieces::default());
    }
    if let Some(pieces) = read_data_shards(nodes, geo, info, 0, info.len, Reader::Whole).await {
        return Ok(Pieces::new(pieces));
    }
    let mut data = reconstruct(nodes, geo, info).await?;
    data.resize(info.len as usize, 0);
    Ok(Pieces::from(Bytes::from(data)))
}

/// Read stripe bytes `offset..offset + len` (all valid) from the data shards holding them, one
/// piece per shard segment, in order. `None` when that cannot be done (a shard missing, on a
/// suspect node, failing, short or slower than [`HEDGE_AFTER`]): the caller reconstructs.
async fn read_data_shards(
    nodes: &Nodes,
    geo: &Geometry,
    info: &StripeInfo,
    offset: u64,
    len: u64,
    reader: Reader,
) -> Option<Vec<Bytes>> {
    let layout = geo.layout;
    let start = layout.stripe_start(info.index);
    let segments = layout.segments(start + offset, len);
    let healthy = segments
        .iter()
        .all(|s| info.missing & (1 << s.shard) == 0 && !nodes.is_suspect(geo.node(info.index, s.shard)));
    if !healthy {
        return None;
    }
    let hashes = content_hashes(geo, info);
    // A whole data shard is checked against its writer's content hash below.
    let whole = |s: &cairn_common::layout::Segment| {
        s.shard_offset == 0 && s.len == layout.shard_len(s.shard, info.written_len)
    };
    let mut reads: FuturesUnordered<_> = segments
        .iter()
        .enumerate()
        .map(|(at, s)| {
            let id = geo.shard(info.index, s.shard, info.version);
            let node = geo.node(info.index, s.shard);
            let reader_checks = whole(s) && hashes.covers(s.shard);
            let content = hashes.get(s.shard);
            async move {
                let read = match reader {
                    Reader::Random => nodes.read_shard_cached(node, id, s.shard_offset, s.len, content).await,
                    // Part of a data shard (a stripe truncated inside it): through its tree.
                    Reader::Whole => match content.filter(|_| !whole(s)) {
                        Some(content) => {
                            nodes.read_shard_checked(node, id, s.shard_offset, s.len, content).await
                        }
                        None => nodes.read_shard(node, id, s.shard_offset, s.len, reader_checks).await,
                    },
                };
                (at, read)
            }
        })
        .collect();
    let mut results: Vec<Option<Result<Bytes>>> = (0..segments.len()).map(|_| None).collect();
    let deadline = tokio::time::sleep(HEDGE_AFTER);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = reads.next() => match next {
                Some((at, r)) => results[at] = Some(r),
                None => break,
            },
            _ = &mut deadline => {
                metrics::counter!(crate::metrics::HEDGED_READS).increment(1);
                for (s, r) in segments.iter().zip(&results) {
                    if r.is_none() {
                        nodes.mark_slow(geo.node(info.index, s.shard));
                    }
                }
                break;
            }
        }
    }
    drop(reads);
    let complete =
        results.iter().zip(&segments).all(|(r, s)| matches!(r, Some(Ok(d)) if d.len() as u64 >= s.len));
    if complete {
        let pieces: Vec<Bytes> = segments
            .iter()
            .zip(results)
            .map(|(s, r)| r.expect("complete").expect("checked above").slice(..s.len as usize))
            .collect();
        for (s, piece) in segments.iter().zip(&pieces) {
            // A random reader's pieces were checked as they were read (through the tree, or
            // whole): only whole-stripe readers' whole shards are checked here.
            if !whole(s) || reader == Reader::Random {
                continue;
            }
            if let Err(e) = hashes.check(s.shard, piece) {
                tracing::warn!(ino = geo.ino, stripe = info.index, shard = s.shard, "degraded read: {e}");
                nodes.content_mismatch(geo.shard(info.index, s.shard, info.version));
                return None;
            }
        }
        return Some(pieces);
    }
    for (s, r) in segments.iter().zip(&results) {
        match r {
            None => tracing::warn!(
                ino = geo.ino,
                stripe = info.index,
                shard = s.shard,
                "degraded read: no answer within {HEDGE_AFTER:?}"
            ),
            Some(Err(e)) => {
                tracing::warn!(ino = geo.ino, stripe = info.index, shard = s.shard, "degraded read: {e}");
                if is_damage(e) {
                    nodes.report_damaged(geo.shard(info.index, s.shard, info.version));
                }
            }
            Some(Ok(d)) if (d.len() as u64) < s.len => {
                tracing::warn!(
                    ino = geo.ino,
                    stripe = info.index,
                    shard = s.shard,
                    "degraded read: short shard"
                )
            }
            Some(Ok(_)) => {}
        }
    }
    None
}

/// Rebuild the stripe's data (its first `written_len` bytes) from any `k` shards: every
/// stored shard on a node that is not suspect is asked at once (suspect ones too when the others
/// are not enough), and decoding starts as soon as `k` have arrived.
pub async fn reconstruct(nodes: &Nodes, geo: &Geometry, info: &StripeInfo) -> Result<Vec<u8>> {
    metrics::counter!(crate::metrics::DEGRADED_READS).increment(1);
    let hashes = content_hashes(geo, info);
    let mut shards = StripeShards::new(geo.layout, info.written_len).verified_by(hashes.clone());
    // The shards added, kept for a second decode should the first give data that does not
    // match the content hashes.
    let mut pool: Vec<(u32, Bytes)> = Vec::new();
    let stored: Vec<u32> =
        (0..geo.layout.width()).filter(|&i| shards.needs_fetch(i) && info.missing & (1 << i) == 0).collect();
    let need = (geo.layout.k as usize).saturating_sub(shards.present());
    let (mut first, mut later): (Vec<u32>, Vec<u32>) =
        stored.into_iter().partition(|&i| !nodes.is_suspect(geo.node(info.index, i)));
    if first.len() < need {
        first.append(&mut later);
    }
    // Shards that failed because their node did not answer (not because they are damaged or
    // gone): if these are what is short, waiting for the nodes may help.
    let mut unanswered = 0usize;
    let mut damaged = 0usize;
    for round in [first, later] {
        let mut reads: FuturesUnordered<_> = round
            .iter()
            .map(|&index| {
                let id = geo.shard(info.index, index, info.version);
                // Data shards are checked against their content hashes as they are added.
                let reader_checks = hashes.covers(index);
                async move {
                    (index, nodes.read_shard(geo.node(info.index, index), id, 0, 0, reader_checks).await)
                }
            })
            .collect();
        while !shards.decodable() {
            let Some((index, result)) = reads.next().await else { break };
            let id = geo.shard(info.index, index, info.version);
            // A shard that arrived but is not what was written (wrong length or content).
            let added = result.map(|data| {
                let added = shards.add(index, &data);
                if added.is_ok() {
                    pool.push((index, data));
                }
                added
            });
            if let Ok(Err(e)) = &added {
                tracing::warn!(ino = geo.ino, stripe = info.index, index, "shard refused: {e}");
                nodes.content_mismatch(id);
                damaged += 1;
                continue;
            }
            if let Err(e) = added {
                tracing::warn!(ino = geo.ino, stripe = info.index, index, "shard unavailable: {e}");
                if is_damage(&e) {
                    nodes.report_damaged(id);
                }
                if unreachable(&e) {
                    unanswered += 1;
                } else {
                    damaged += 1;
                }
            }
        }
        if shards.decodable() {
            break;
        }
    }
    // Short only because nodes did not answer: the stored shards are intact as far as we know.
    let stored_intact = geo.layout.width() as usize - info.missing.count_ones() as usize - damaged;
    let waiting_helps = unanswered > 0 && stored_intact >= geo.layout.k as usize;
    let decoded = match shards.data() {
        Err(e) if e.kind() == ErrorKind::Corrupt && !hashes.is_empty() => {
            tracing::warn!(ino = geo.ino, stripe = info.index, "degraded read: {e}");
            decode_around_wrong_parity(nodes, geo, info, &hashes, pool).await
        }
        decoded => decoded,
    };
    decoded.map_err(|e| {
        // Decoded bytes that do not match the content hashes: some shard used is wrong.
        let kind = if waiting_helps && e.kind() != ErrorKind::Corrupt {
            ErrorKind::TooFewNodes
        } else {
            ErrorKind::Io
        };
        CairnError::new(
            kind,
            format!("inode {} stripe {} cannot be reconstructed: {}", geo.ino, info.index, e.message()),
        )
    })
}

/// Decoding gave data shards that do not match their content hashes although every data shard
/// used matched its own: a parity shard used is wrong. Every stored shard not yet in `pool` is
/// read, and the stripe decoded with each choice of parity shards in turn; a parity shard that
/// was in a failed choice and not in the one that worked is reported.
async fn decode_around_wrong_parity(
    nodes: &Nodes,
    geo: &Geometry,
    info: &StripeInfo,
    hashes: &ContentHashes,
    mut pool: Vec<(u32, Bytes)>,
) -> Result<Vec<u8>> {
    let (layout, k) = (geo.layout, geo.layout.k);
    let fresh = || StripeShards::new(layout, info.written_len).verified_by(hashes.clone());
    let probe = fresh();
    let rest: Vec<u32> = (0..layout.width())
        .filter(|&i| {
            probe.needs_fetch(i) && info.missing & (1 << i) == 0 && pool.iter().all(|(j, _)| *j != i)
        })
        .collect();
    let reads = rest.iter().map(|&i| async move {
        let id = geo.shard(info.index, i, info.version);
        (i, nodes.read_shard(geo.node(info.index, i), id, 0, 0, hashes.covers(i)).await)
    });
    for (i, read) in join_all(reads).await {
        let Ok(data) = read else { continue };
        // A data shard is checked on its own (length and content); a parity shard only
        // through what it decodes to.
        if i < k && fresh().add(i, &data).is_err() {
            nodes.content_mismatch(geo.shard(info.index, i, info.version));
            continue;
        }
        pool.push((i, data));
    }
    let (data_shards, parity): (Vec<_>, Vec<_>) = pool.into_iter().partition(|(i, _)| *i < k);
    // Known-empty data shards count as present.
    let need = (k as usize).saturating_sub(probe.present() + data_shards.len());
    let mut failed = 0u32;
    for choice in 0u32..(1 << parity.len()) {
        if choice.count_ones() as usize != need {
            continue;
        }
        let mut shards = fresh();
        let chosen = parity.iter().enumerate().filter(|(n, _)| choice & (1 << n) != 0);
        let mut used = 0u32;
        for (i, d) in &data_shards {
            shards.add(*i, d)?;
        }
        for (_, (i, p)) in chosen {
            if shards.add(*i, p).is_ok() {
                used |= 1 << i;
            }
        }
        match shards.data() {
            Ok(data) => {
                for i in (k..layout.width()).filter(|i| failed & !used & (1 << i) != 0) {
                    tracing::warn!(
                        ino = geo.ino,
                        stripe = info.index,
                        index = i,
                        "parity shard decodes to wrong data"
                    );
                    nodes.content_mismatch(geo.shard(info.index, i, info.version));
                }
                return Ok(data);
            }
            Err(_) => failed |= used,
        }
    }
    Err(CairnError::corrupt(
        "no choice of parity shards decodes to data matching the writer's content hashes",
    ))
}

/// The stripe record's content hashes; a malformed field (a metaserver checks it at commit)
/// is read as none.
fn content_hashes(geo: &Geometry, info: &StripeInfo) -> ContentHashes {
    ContentHashes::from_bytes(&info.hashes, geo.layout.k).unwrap_or_else(|e| {
        tracing::warn!(ino = geo.ino, stripe = info.index, "stripe record: {e}");
        ContentHashes::default()
    })
}

/// fsync's part at the chunkservers: every node of the file's placement group puts the shards
/// of the file it holds on disk (`SyncShards`). A node that reports a failed flush fails the
/// fsync with EIO; one that cannot be reached (or is suspect) is tolerated like a failed shard
/// write, at most `m − 1` of them, so every stripe keeps `k + 1` shards on disk.
pub async fn sync_shards(nodes: &Nodes, geo: &Geometry) -> Result<()> {
    let mut placement = geo.placement.clone();
    placement.sort_unstable();
    placement.dedup();
    let tolerated = geo.layout.m.saturating_sub(1) as usize;
    let (suspect, asked): (Vec<u32>, Vec<u32>) = placement.into_iter().partition(|&n| nodes.is_suspect(n));
    let syncs = asked.iter().map(|&node| async move { (node, nodes.sync_shards(node, geo.ino).await) });
    let mut unreached = suspect.len();
    let mut first = None;
    for (node, result) in join_all(syncs).await {
        match result {
            Ok(()) => {}
            // A chunkserver older than SyncShards ignores `buffered`: its shards were on disk
            // before their writes were answered.
            Err(e) if e.kind() == ErrorKind::NotSupported => {}
            Err(e) if unreachable(&e) => {
                tracing::warn!(ino = geo.ino, node, "fsync: chunkserver not answering: {e}");
                unreached += 1;
                first.get_or_insert(e);
            }
            Err(e) => {
                return Err(CairnError::new(
                    if matches!(e.kind(), ErrorKind::PermissionDenied | ErrorKind::CapabilityRefused) {
                        e.kind()
                    } else {
                        ErrorKind::Io
                    },
                    format!("fsync of inode {}: {}", geo.ino, e.message()),
                ))
            }
        }
    }
    if unreached > tolerated {
        let why = first
            .map_or_else(|| format!("chunkservers {suspect:?} did not answer lately"), |e| e.to_string());
        return Err(CairnError::new(
            ErrorKind::Io,
            format!(
                "fsync of inode {}: {unreached} chunkservers not answering, at most {tolerated} may: {why}",
                geo.ino
            ),
        ));
    }
    Ok(())
}

/// A node that did not answer (down, partitioned, timed out) or too few of them.
fn unreachable(e: &CairnError) -> bool {
    matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::TooFewNodes)
}

/// A shard that is corrupt, or gone from a chunkserver that answers: damage to repair (as
/// opposed to a node that is down, which the repair handles by itself).
fn is_damage(e: &CairnError) -> bool {
    matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces() -> (Pieces, Vec<u8>) {
        let all: Vec<u8> = (0..100u8).collect();
        let p = Pieces::new(vec![
            Bytes::copy_from_slice(&all[..40]),
            Bytes::copy_from_slice(&all[40..90]),
            Bytes::copy_from_slice(&all[90..]),
        ]);
        (p, all)
    }

    #[test]
    fn a_slice_inside_one_piece_shares_its_bytes() {
        let (p, all) = pieces();
        assert_eq!(p.len(), 100);
        let s = p.slice(45, 20);
        assert_eq!(&s[..], &all[45..65]);
        assert_eq!(s.as_ptr(), p.pieces[1][5..].as_ptr(), "no copy");
    }

    #[test]
    fn slices_and_copies_across_pieces_and_past_the_end() {
        let (p, all) = pieces();
        for (from, len) in [(0, 100), (30, 20), (39, 2), (85, 10), (95, 20), (100, 5), (120, 1)] {
            let want = &all[from.min(100)..(from + len).min(100)];
            assert_eq!(&p.slice(from, len)[..], want, "slice {from}+{len}");
            let mut out = vec![0xAA; len];
            let n = p.copy_to(from, &mut out);
            assert_eq!(&out[..n], want, "copy {from}+{len}");
            assert!(out[n..].iter().all(|&b| b == 0xAA), "nothing written past the valid bytes");
        }
    }
}

//! File data metadata: stripe records, open, commit and truncate.
//!
//! A stripe record says which version of a stripe's shards is current, how many bytes of file
//! data it holds (`len`), how many were encoded (`written_len`, which fixes shard lengths) and
//! what its data shards hold (`hashes`, computed by the writer; checked for length here).
//! Replacing or deleting a record queues the shards of the old version for garbage collection
//! in the same batch; a version that stays the same is never collected.

use cairn_common::content::ContentHashes;
use cairn_common::{CairnError, ErrorKind, Result};
use cairn_proto::{FileInfo, StripeInfo, Timespec};

use super::{check_time, stripe_shards, Namespace, Tx};
use crate::schema::{self, Inode, Stripe};
use crate::store::Cf;

/// Most stripe records returned by one Open or ListStripes.
pub const STRIPES_MAX: usize = 4096;
/// Largest file size accepted (as Linux's off_t).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Stripe indexes must fit the 48 bits of a shard id.
const MAX_STRIPE: u64 = 1 << 48;

/// What a client needs to do I/O on a file.
pub fn file_info(inode: &Inode) -> FileInfo {
    FileInfo {
        attr: Some(inode.to_attr()),
        layout: Some(inode.layout().into()),
        placement: inode.placement.clone(),
    }
}

fn stripe_info(index: u64, s: &Stripe) -> StripeInfo {
    StripeInfo {
        index,
        version: s.version,
        len: s.len,
        written_len: s.written_len,
        missing: s.missing,
        hashes: s.hashes.clone().into(),
    }
}

impl Namespace {
    /// The file's info and its first stripe records (`more` if there are more than returned).
    pub fn open_file(&self, ino: u64) -> Result<(Inode, Vec<StripeInfo>, bool)> {
        let inode = self.inode(ino)?;
        if !inode.is_reg() {
            return Ok((inode, Vec::new(), false));
        }
        let (stripes, more) = self.stripes_from(ino, 0, STRIPES_MAX as u32)?;
        Ok((inode, stripes, more))
    }

    /// Stripe records with index >= `from`, at most `limit` (capped at [`STRIPES_MAX`]; 0 means the cap).
    pub fn list_stripes(&self, ino: u64, from: u64, limit: u32) -> Result<(Vec<StripeInfo>, bool)> {
        let inode = self.inode(ino)?;
        if !inode.is_reg() {
            return Err(CairnError::invalid(format!("inode {ino} is not a regular file")));
        }
        self.stripes_from(ino, from, limit)
    }

    /// [`Namespace::list_stripes`] of an inode already known to be a regular file.
    fn stripes_from(&self, ino: u64, from: u64, limit: u32) -> Result<(Vec<StripeInfo>, bool)> {
        let limit = match limit as usize {
            0 => STRIPES_MAX,
            n => n.min(STRIPES_MAX),
        };
        let mut rows = self.store.scan(
            Cf::Stripes,
            &schema::stripe_key(ino, from),
            &schema::prefix_end(ino),
            limit + 1,
        )?;
        let more = rows.len() > limit;
        rows.truncate(limit);
        let mut out = Vec::with_capacity(rows.len());
        for (key, value) in rows {
            out.push(stripe_info(schema::stripe_of(&key)?, &schema::decode("stripe", &value)?));
        }
        Ok((out, more))
    }

    /// Publish written stripes: replace their records, grow the size to at least `size`, set
    /// mtime (given or now) and ctime (now), on disk before this returns. Returns the new inode.
    pub fn commit(
        &self,
        ino: u64,
        size: u64,
        stripes: &[StripeInfo],
        mtime: Option<&Timespec>,
    ) -> Result<Inode> {
        self.commit_as(ino, size, stripes, mtime, true)
    }

    /// [`Namespace::commit`]; without `durable` (a mount's close under `durability=close`) it
    /// is answered once in the log, like other namespace changes: a lone metaserver's WAL is
    /// fsynced by the group commit within about a millisecond (a replicated one's Raft log is
    /// always on disk before an answer).
    pub fn commit_as(
        &self,
        ino: u64,
        size: u64,
        stripes: &[StripeInfo],
        mtime: Option<&Timespec>,
        durable: bool,
    ) -> Result<Inode> {
        if let Some(t) = mtime {
            check_time(t)?;
        }
        if size > MAX_FILE_SIZE {
            return Err(CairnError::new(ErrorKind::TooBig, format!("size {size} too large")));
        }
        let mut indexes: Vec<u64> = stripes.iter().map(|s| s.index).collect();
        indexes.sort_unstable();
        if indexes.windows(2).any(|w| w[0] == w[1]) {
            return Err(CairnError::invalid("commit: a stripe appears twice"));
        }
        self.locked(
            || vec![ino],
            || {
                let now = cairn_common::time::now();
                let mut tx = self.tx();
                let inode = tx.get(ino)?.clone();
                if inode.is_dir() {
                    return Err(CairnError::new(ErrorKind::IsDir, "commit to a directory"));
                }
                if !inode.is_reg() {
                    return Err(CairnError::invalid("commit to a non-regular file"));
                }
                let layout = inode.layout();
                let width = layout.width();
                for s in stripes {
                    if s.version == 0 {
                        return Err(CairnError::invalid(format!("stripe {}: version 0", s.index)));
                    }
                    if s.index >= MAX_STRIPE {
                        return Err(CairnError::invalid(format!("stripe index {} out of range", s.index)));
                    }
                    if s.len > s.written_len || s.written_len > layout.stripe_bytes() {
                        return Err(CairnError::invalid(format!(
                            "stripe {}: len {} written_len {} (stripe holds {})",
                            s.index,
                            s.len,
                            s.written_len,
                            layout.stripe_bytes()
                        )));
                    }
                    if (width < 32 && s.missing >> width != 0) || s.missing.count_ones() > layout.m {
                        return Err(CairnError::invalid(format!(
                            "stripe {}: missing mask {:#x} invalid for {}+{}",
                            s.index, s.missing, layout.k, layout.m
                        )));
                    }
                    ContentHashes::from_bytes(&s.hashes, layout.k)
                        .map_err(|e| CairnError::invalid(format!("stripe {}: {}", s.index, e.message())))?;
                }
                if stripes.iter().any(|s| s.missing != 0) {
                    self.note_degraded();
                }
                for s in stripes {
                    let key = schema::stripe_key(ino, s.index);
                    if let Some(old) = self.store.get(Cf::Stripes, &key)? {
                        let old: Stripe = schema::decode("stripe", &old)?;
                        if old.version != s.version {
                            tx.gc_stripe(&inode, s.index, &old);
                        }
                    }
                    let record = Stripe {
                        version: s.version,
                        len: s.len,
                        written_len: s.written_len,
                        missing: s.missing,
                        hashes: s.hashes.to_vec(),
                    };
                    tx.batch.put(Cf::Stripes, key, schema::encode(&record));
                }
                let new_size = inode.size.max(size);
                tx.stats.logical_bytes += new_size as i64 - inode.size as i64;
                let inode = tx.get(ino)?;
                inode.size = new_size;
                inode.set_mtime(mtime.unwrap_or(&now));
                inode.set_ctime(&now);
                let out = inode.clone();
                // fsync (or a close that asks for it) of written data: on disk before it is
                // answered (and with it every change before it, the file's create included).
                if durable {
                    tx.batch.set_durable();
                }
                tx.commit()?;
                Ok(out)
            },
        )
    }

    /// Set a regular file's size inside `tx`. Shrinking deletes the records of stripes wholly
    /// past the new end (queuing their shards) and clamps the boundary stripe's `len`.
    pub(super) fn truncate(&self, tx: &mut Tx<'_>, ino: u64, size: u64) -> Result<()> {
        let inode = tx.get(ino)?.clone();
        if size < inode.size {
            let layout = inode.layout();
            let keep = layout.stripes_for(size);
            let rows = self.store.scan(
                Cf::Stripes,
                &schema::stripe_key(ino, keep),
                &schema::prefix_end(ino),
                usize::MAX,
            )?;
            for (key, value) in rows {
                let record: Stripe = schema::decode("stripe", &value)?;
                tx.gc.extend(stripe_shards(&inode, schema::stripe_of(&key)?, &record));
                tx.batch.delete(Cf::Stripes, key);
            }
            if keep > 0 {
                let boundary = keep - 1;
                let key = schema::stripe_key(ino, boundary);
                if let Some(v) = self.store.get(Cf::Stripes, &key)? {
                    let mut record: Stripe = schema::decode("stripe", &v)?;
                    let max_len = size - layout.stripe_start(boundary);
                    if record.len > max_len {
                        record.len = max_len;
                        tx.batch.put(Cf::Stripes, key, schema::encode(&record));
                    }
                }
            }
        }
        tx.stats.logical_bytes += size as i64 - inode.size as i64;
        tx.get(ino)?.size = size;
        Ok(())
    }
}

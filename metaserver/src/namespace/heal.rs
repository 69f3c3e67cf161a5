//! Metadata side of repair: publishing rebuilt shards and replaced placement members.

use cairn_common::{CairnError, Result};

use super::Namespace;
use crate::schema::{self, GcShard, Stripe};
use crate::store::Cf;

impl Namespace {
    pub(crate) fn note_degraded(&self) {
        self.cluster.note_degraded();
    }

    /// The record of stripe `stripe` of `ino`, if one was committed.
    pub fn stripe_record(&self, ino: u64, stripe: u64) -> Result<Option<Stripe>> {
        self.store
            .get(Cf::Stripes, &schema::stripe_key(ino, stripe))?
            .map(|v| schema::decode("stripe", &v))
            .transpose()
    }

    /// The inode `ino`, if it exists.
    pub fn find_inode(&self, ino: u64) -> Result<Option<crate::schema::Inode>> {
        self.try_inode(ino)
    }

    /// Record a repair of `ino`: its placement becomes `new` (if it still is `old`: otherwise
    /// nothing changes and the next pass looks again), and for each `(stripe, version, mask)`
    /// whose record still has that version, the shards in `mask` are no longer missing. The
    /// copies left on replaced members are queued for garbage collection in the same batch
    /// (a down member deletes them when it returns). Returns whether it applied.
    pub fn apply_heal(&self, ino: u64, old: &[u32], new: &[u32], healed: &[(u64, u64, u32)]) -> Result<bool> {
        if old.len() != new.len() {
            return Err(CairnError::invalid("heal: placement sizes differ"));
        }
        self.locked(
            || vec![ino],
            || {
                let mut tx = self.tx();
                let inode = tx.get(ino)?;
                if inode.placement != old {
                    return Ok(false);
                }
                inode.placement = new.to_vec();
                let layout = inode.layout();
                let moved: Vec<usize> = (0..old.len()).filter(|&p| old[p] != new[p]).collect();
                if !moved.is_empty() {
                    let ino_start = schema::ino_key(ino);
                    for (key, value) in
                        self.store.scan(Cf::Stripes, &ino_start, &schema::prefix_end(ino), usize::MAX)?
                    {
                        let stripe = schema::stripe_of(&key)?;
                        let record: Stripe = schema::decode("stripe", &value)?;
                        for i in 0..layout.width() {
                            let p = layout.position(stripe, i);
                            let stored =
                                record.missing & (1 << i) == 0 && layout.shard_len(i, record.written_len) > 0;
                            if moved.contains(&p) && stored {
                                tx.gc.push(GcShard {
                                    node: old[p],
                                    ino,
                                    stripe,
                                    index: i,
                                    version: record.version,
                                });
                            }
                        }
                    }
                }
                for &(stripe, version, mask) in healed {
                    let key = schema::stripe_key(ino, stripe);
                    let Some(value) = self.store.get(Cf::Stripes, &key)? else { continue };
                    let mut record: Stripe = schema::decode("stripe", &value)?;
                    if record.version == version && record.missing & mask != 0 {
                        record.missing &= !mask;
                        tx.batch.put(Cf::Stripes, key, schema::encode(&record));
                    }
                }
                tx.commit()?;
                Ok(true)
            },
        )
    }

    /// Shards found damaged (corrupt or gone): mark each missing in its stripe record if that
    /// version is still current, so the repair rebuilds it. Returns how many were marked.
    ///
    /// A report never takes a stripe past `m` missing shards: beyond that nothing could be
    /// rebuilt, and marking would only stop readers from trying shards a mistaken or hostile
    /// reporter named (reports are not authenticated yet). Such a report is refused and logged;
    /// readers still verify every block they get, so a shard that is really damaged is not
    /// returned either way.
    ///
    /// Returns how many it marked, and the reported shards the records now count as missing
    /// (marked now or before): what the reporter may delete.
    pub fn mark_damaged(&self, ids: &[cairn_common::ShardId]) -> Result<(u32, Vec<cairn_common::ShardId>)> {
        let mut marked = 0;
        let mut missing = Vec::new();
        for id in ids {
            id.validate()?;
            let done = self.locked(
                || vec![id.ino],
                || {
                    let key = schema::stripe_key(id.ino, id.stripe);
                    let Some(value) = self.store.get(Cf::Stripes, &key)? else { return Ok(false) };
                    let mut record: Stripe = schema::decode("stripe", &value)?;
                    if record.version != id.version {
                        return Ok(false);
                    }
                    if record.missing & (1 << id.index) != 0 {
                        missing.push(*id);
                        return Ok(false);
                    }
                    let Some(inode) = self.find_inode(id.ino)? else { return Ok(false) };
                    let m = inode.layout().m;
                    if (record.missing | 1 << id.index).count_ones() > m {
                        tracing::warn!(
                            shard = %id,
                            missing = record.missing.count_ones(),
                            m,
                            "damage report refused: the stripe would have more than m shards missing"
                        );
                        return Ok(false);
                    }
                    record.missing |= 1 << id.index;
                    let mut tx = self.tx();
                    tx.batch.put(Cf::Stripes, key, schema::encode(&record));
                    // Durable: the reporter deletes the damaged shard once this is answered.
                    tx.batch.set_durable();
                    tx.commit()?;
                    missing.push(*id);
                    Ok(true)
                },
            )?;
            if done {
                tracing::warn!(shard = %id, "shard reported damaged; queued for rebuild");
                marked += 1;
            }
        }
        if marked > 0 {
            self.note_degraded();
        }
        Ok((marked, missing))
    }
}

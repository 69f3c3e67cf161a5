//! Metadata side of repair: publishing rebuilt shards and replaced placement members.

use std::sync::atomic::Ordering;

use cairn_common::{CairnError, Result};

use super::Namespace;
use crate::schema::{self, Stripe};
use crate::store::Cf;

impl Namespace {
    /// True if a commit recorded missing shards since the last call (the repair then scans).
    pub fn take_degraded_hint(&self) -> bool {
        self.degraded_hint.swap(false, Ordering::Relaxed)
    }

    pub(crate) fn note_degraded(&self) {
        self.degraded_hint.store(true, Ordering::Relaxed);
    }

    pub fn repair_state(&self) -> &parking_lot::Mutex<crate::repair::RepairState> {
        &self.repair_state
    }

    /// Record a repair of `ino`: its placement becomes `new` (if it still is `old`: otherwise
    /// nothing changes and the next pass looks again), and for each `(stripe, version, mask)`
    /// whose record still has that version, the shards in `mask` are no longer missing.
    /// Returns whether it applied.
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
}

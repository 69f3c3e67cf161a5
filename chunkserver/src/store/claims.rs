//! Per-shard claims: whoever holds a shard id's claim is the only one changing its file and
//! its index entry (a write, a delete, a tier move). Reads take none.

use std::collections::HashMap;
use std::sync::Arc;

use cairn_common::ShardId;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// Shard ids with a write, delete or move in progress. Whoever holds an id's claim is the only
/// one changing its file and its index entry. Each claimed id has its own `Notify`, so a
/// release wakes only the tasks waiting for that id.
#[derive(Default)]
pub(crate) struct Claims {
    busy: Mutex<HashMap<ShardId, Arc<Notify>>>,
}

/// The claim on one shard id; dropping it lets the next writer, deleter or mover in.
pub(crate) struct Claim<'a> {
    claims: &'a Claims,
    id: ShardId,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let released = self.claims.busy.lock().remove(&self.id);
        if let Some(waiters) = released {
            waiters.notify_waiters();
        }
    }
}

impl Claims {
    pub(crate) fn try_claim(&self, id: ShardId) -> Option<Claim<'_>> {
        // The guard must be gone before a Claim exists: a Claim built and dropped while the
        // map is locked (as `then_some` would, eagerly) deadlocks in its Drop, and would remove
        // someone else's claim.
        let inserted = match self.busy.lock().entry(id) {
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert(Arc::new(Notify::new()));
                true
            }
            std::collections::hash_map::Entry::Occupied(_) => false,
        };
        inserted.then(|| Claim { claims: self, id })
    }

    pub(crate) async fn claim(&self, id: ShardId) -> Claim<'_> {
        loop {
            if let Some(claim) = self.try_claim(id) {
                return claim;
            }
            let Some(holder) = self.busy.lock().get(&id).cloned() else { continue };
            let released = holder.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            // Released (and maybe claimed again, with a new Notify) before we listened: the
            // wake-up was missed, so look again instead of waiting for it.
            let same = self.busy.lock().get(&id).is_some_and(|now| Arc::ptr_eq(now, &holder));
            if same {
                released.await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[tokio::test]
    async fn a_refused_claim_leaves_the_holder_alone_and_the_next_one_waits() {
        let claims = Claims::default();
        let id = ShardId { ino: 1, stripe: 2, index: 3, version: 4 };
        let held = claims.try_claim(id).expect("free");
        // Refused, without deadlocking and without releasing the holder's claim.
        assert!(claims.try_claim(id).is_none());
        assert!(claims.try_claim(id).is_none());
        assert!(claims.busy.lock().contains_key(&id));
        let waiter = claims.claim(id);
        tokio::pin!(waiter);
        assert!(futures::poll!(waiter.as_mut()).is_pending());
        // Another id's release does not let it in.
        let other = ShardId { index: 4, ..id };
        drop(claims.try_claim(other).expect("free"));
        assert!(futures::poll!(waiter.as_mut()).is_pending());
        drop(held);
        let _next = waiter.await;
        assert!(claims.try_claim(id).is_none());
        assert_eq!(claims.busy.lock().len(), 1, "released ids are forgotten");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_tasks_on_few_ids_take_turns_and_never_overlap() {
        let claims = Arc::new(Claims::default());
        let inside = Arc::new(Mutex::new(HashSet::new()));
        let tasks: Vec<_> = (0..64u32)
            .map(|n| {
                let (claims, inside) = (claims.clone(), inside.clone());
                tokio::spawn(async move {
                    let id = ShardId { ino: 1, stripe: 0, index: n % 3, version: 1 };
                    for _ in 0..50 {
                        let _claim = claims.claim(id).await;
                        assert!(inside.lock().insert(id), "two holders of {id}");
                        tokio::task::yield_now().await;
                        inside.lock().remove(&id);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(claims.busy.lock().is_empty());
    }
}

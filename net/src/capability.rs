//! Shard capabilities: the metaserver's signed permission for one client certificate to read or
//! write the shards of one inode for a while, which chunkservers check before serving a caller
//! that has only the client role (docs/ARCHITECTURE.md, "Shard capabilities"). The metaserver
//! signs with a [`Signer`]; a chunkserver checks with a [`Verifier`] holding the keys the
//! metaserver sent it.

use std::collections::HashMap;
use std::time::Duration;

use cairn_proto::{Capability, CapabilityKey, CapabilityRequest};
use parking_lot::{Mutex, RwLock};

use crate::tls::{Peer, Role, Roles};
use cairn_common::time::unix_secs;
use cairn_common::{CairnError, ErrorKind, Result};

/// The operation bit for reading shards.
pub const READ: u32 = 1;
/// The operation bit for writing (and deleting) shards.
pub const WRITE: u32 = 2;

/// How long a capability is valid after it is signed.
pub const LIFETIME: Duration = Duration::from_secs(3600);
/// A client renews a capability with less than this left.
pub const RENEW_BEFORE: Duration = Duration::from_secs(600);
/// How often a metaserver starts signing with a new key.
pub const ROTATE_EVERY: Duration = Duration::from_secs(6 * 3600);
/// Clock difference between metaserver and chunkserver a chunkserver tolerates.
const SKEW_SECS: i64 = 60;

const DOMAIN: &[u8] = b"cairn shard capability v1";

/// The MAC of `cap`'s fields under `secret`. A capability of metadata group 0 (every one
/// signed before groups) covers the fields it always did; another group's covers its group too.
fn mac(secret: &[u8; 32], cap: &Capability) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(secret);
    h.update(DOMAIN);
    h.update(&cap.ino.to_le_bytes());
    h.update(&cap.ops.to_le_bytes());
    h.update(&cap.expires.to_le_bytes());
    h.update(&cap.key_id.to_le_bytes());
    h.update(&(cap.holder.len() as u32).to_le_bytes());
    h.update(cap.holder.as_bytes());
    if cap.group != 0 {
        h.update(&cap.group.to_le_bytes());
    }
    h.finalize()
}

struct Key {
    id: u64,
    secret: [u8; 32],
    /// When this key started signing, Unix seconds.
    since: i64,
    /// When it was revoked: no token it signed is valid after.
    revoked: Option<i64>,
}

impl Key {
    fn new(now: i64) -> Key {
        let mut secret = [0u8; 32];
        rand::Rng::fill(&mut rand::thread_rng(), &mut secret[..]);
        // Id 0 would read as "no key" in a defaulted message.
        let id = rand::random::<u64>().max(1);
        Key { id, secret, since: now, revoked: None }
    }

    /// When the last token this key may sign expires.
    fn expires(&self) -> i64 {
        self.since + (ROTATE_EVERY + LIFETIME).as_secs() as i64
    }

    /// After when no token it signed is valid: its expiry, or when it was revoked.
    fn retire(&self) -> i64 {
        self.revoked.map_or(self.expires(), |at| at.min(self.expires()))
    }

    fn wire(&self) -> CapabilityKey {
        CapabilityKey { id: self.id, secret: self.secret.to_vec(), retire: self.retire() }
    }
}

/// A metaserver's keys: the one it signs with, and those before it while tokens they signed
/// may still be valid (a revoked one is announced, with its revocation as its retirement, for
/// as long as a chunkserver may still hold it). In memory only (a restarted metaserver starts
/// a new key).
pub struct Signer {
    keys: Mutex<(Key, Vec<Key>)>,
    /// The metadata group whose inodes it signs for (chunkservers keep each group's keys
    /// apart: `Verifier`).
    group: std::sync::atomic::AtomicU32,
}

impl Default for Signer {
    fn default() -> Signer {
        Signer::new()
    }
}

impl Signer {
    /// Metadata group 0's signer.
    pub fn new() -> Signer {
        Signer::for_group(0)
    }

    /// The signer of metadata group `group`'s leaderships.
    pub fn for_group(group: u32) -> Signer {
        Signer { keys: Mutex::new((Key::new(unix_secs()), Vec::new())), group: group.into() }
    }

    /// Sign for metadata group `group` from now on (a replica learns its group as it starts).
    pub fn set_group(&self, group: u32) {
        self.group.store(group, std::sync::atomic::Ordering::Relaxed);
    }

    /// A capability for `holder` to do `ops` on inode `ino`'s shards for [`LIFETIME`].
    pub fn grant(&self, ino: u64, ops: u32, holder: &str) -> Capability {
        self.grant_at(ino, ops, holder, unix_secs())
    }

    /// The keys, after starting a new one if the current one has signed for [`ROTATE_EVERY`].
    fn rotated(&self, now: i64) -> parking_lot::MutexGuard<'_, (Key, Vec<Key>)> {
        let mut keys = self.keys.lock();
        if now - keys.0.since >= ROTATE_EVERY.as_secs() as i64 {
            let old = std::mem::replace(&mut keys.0, Key::new(now));
            keys.1.push(old);
        }
        keys.1.retain(|k| k.expires() > now);
        keys
    }

    /// Sign with a new key from now on (a leadership starting): chunkservers retire the keys
    /// a new leadership does not send, so one that leads again must not sign with a key it
    /// had before. The old keys are still sent while they may be valid.
    pub fn new_key(&self) {
        drop(self.new_key_at(unix_secs()));
    }

    fn new_key_at(&self, now: i64) -> parking_lot::MutexGuard<'_, (Key, Vec<Key>)> {
        let mut keys = self.keys.lock();
        let old = std::mem::replace(&mut keys.0, Key::new(now));
        keys.1.push(old);
        keys
    }

    /// Revoke every token signed so far (what they grant changed: access rules were edited)
    /// and sign with a new key from now on. Chunkservers learn it with their next heartbeat
    /// and then refuse the old tokens (after the clock skew they allow); clients renew.
    pub fn revoke_all(&self) {
        self.revoke_all_at(unix_secs());
    }

    fn revoke_all_at(&self, now: i64) {
        let mut keys = self.new_key_at(now);
        for k in &mut keys.1 {
            k.revoked.get_or_insert(now);
        }
    }

    fn grant_at(&self, ino: u64, ops: u32, holder: &str, now: i64) -> Capability {
        let keys = self.rotated(now);
        let key = &keys.0;
        let mut cap = Capability {
            ino,
            ops,
            expires: now + LIFETIME.as_secs() as i64,
            key_id: key.id,
            holder: holder.to_string(),
            mac: Vec::new(),
            group: self.group.load(std::sync::atomic::Ordering::Relaxed),
        };
        cap.mac = mac(&key.secret, &cap).as_bytes().to_vec();
        cap
    }

    /// The keys chunkservers need to check what this metaserver signed.
    pub fn keys(&self) -> Vec<CapabilityKey> {
        let now = unix_secs();
        let keys = self.rotated(now);
        // A revoked key goes on being sent until it would have expired: a chunkserver that
        // missed the revocation learns it from any later heartbeat.
        std::iter::once(&keys.0).chain(keys.1.iter()).filter(|k| k.expires() > now).map(Key::wire).collect()
    }
}

/// Why a capability was refused; the label of `cairn_chunk_capability_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Missing,
    UnknownKey,
    BadMac,
    Expired,
    WrongInode,
    WrongOperation,
    WrongHolder,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::UnknownKey => "unknown_key",
            Refusal::BadMac => "bad_mac",
            Refusal::Expired => "expired",
            Refusal::WrongInode => "wrong_inode",
            Refusal::WrongOperation => "wrong_operation",
            Refusal::WrongHolder => "wrong_holder",
        }
    }
}

/// Whether `peer` must show a capability for shard access: it has the client role and no
/// server or admin role. (A plaintext server's callers have every role.)
pub fn required_of(peer: Option<&Peer>) -> bool {
    peer.is_some_and(|p| !p.roles.intersects(Roles::of(&[Role::Meta, Role::Chunk, Role::Admin])))
}

/// A key's secret and when it retires (Unix seconds).
type KnownKey = ([u8; 32], i64);

/// A chunkserver's keys, as metaservers sent them, each until it retires, kept per metadata
/// group: a key checks only capabilities of the group that sent it.
#[derive(Default)]
pub struct Verifier {
    /// By (group, key id): the secret and when it retires.
    keys: RwLock<HashMap<(u32, u64), KnownKey>>,
    /// Per group, the highest namespace epoch (fence) a message carrying its keys had: the
    /// leadership whose keys count. Keys the leader of a higher epoch does not send are retired.
    epoch: parking_lot::Mutex<HashMap<u32, u64>>,
    /// Woken when a capability names a key not known yet (the heartbeat then goes at once).
    wanted: tokio::sync::Notify,
}

/// How long a check waits for a key it does not know to arrive.
const KEY_WAIT: Duration = Duration::from_secs(2);

impl Verifier {
    /// Keep `keys` (metadata group 0's, from a registration reply), and forget retired ones.
    pub fn learn(&self, keys: &[CapabilityKey]) {
        self.learn_at(0, keys, unix_secs());
    }

    /// Keep `keys` of metadata group `group` from its leadership with namespace epoch `epoch`
    /// (its fence; 0: a metaserver that sends none) — group 0's in heartbeat replies, another
    /// group's in its `Fence` messages. The first message of a newer leadership of the group
    /// retires every key of that group it does not send — a deposed leader's, or a restarted
    /// metaserver's old ones — so what they signed is refused once the clock skew allowance
    /// passes, and their holders ask the new leader; keys from an older leadership (a deposed
    /// leader answering before it knows) are not taken. Other groups' keys are left alone.
    pub fn learn_from_leader(&self, group: u32, keys: &[CapabilityKey], epoch: u64) {
        self.learn_from_leader_at(group, keys, epoch, unix_secs());
    }

    fn learn_from_leader_at(&self, group: u32, keys: &[CapabilityKey], epoch: u64, now: i64) {
        let mut epochs = self.epoch.lock();
        let highest = epochs.entry(group).or_default();
        if epoch != 0 && epoch < *highest {
            tracing::debug!(
                group,
                epoch,
                highest = *highest,
                "ignored capability keys of an older leadership"
            );
            return;
        }
        if epoch > *highest {
            let mut known = self.keys.write();
            for ((of, id), (_, retire)) in known.iter_mut() {
                if *of == group && !keys.iter().any(|k| k.id == *id) {
                    *retire = (*retire).min(now);
                }
            }
            drop(known);
            if *highest != 0 {
                tracing::info!(
                    group,
                    epoch,
                    "a new metaserver leadership: retired the capability keys it does not send"
                );
            }
            *highest = epoch;
        }
        self.learn_at(group, keys, now);
    }

    fn learn_at(&self, group: u32, keys: &[CapabilityKey], now: i64) {
        let mut known = self.keys.write();
        known.retain(|_, (_, retire)| *retire + SKEW_SECS > now);
        for k in keys {
            let Ok(secret) = <[u8; 32]>::try_from(k.secret.as_slice()) else {
                tracing::warn!(
                    key = k.id,
                    len = k.secret.len(),
                    "ignored a capability key of the wrong length"
                );
                continue;
            };
            // A key's retirement only ever comes earlier (a revocation).
            let retire = known.get(&(group, k.id)).map_or(k.retire, |(_, known)| k.retire.min(*known));
            known.insert((group, k.id), (secret, retire));
        }
    }

    /// Whether key `id` of metadata group `group` is known.
    pub fn knows(&self, group: u32, id: u64) -> bool {
        self.keys.read().contains_key(&(group, id))
    }

    /// Have the owner ask the metaserver for news early (a chunkserver heartbeats, which
    /// also fetches a newer group map): a check met something this node may not know yet.
    pub fn ask_for_news(&self) {
        self.wanted.notify_one();
    }

    /// Resolves when a check met a key it does not know: the owner then asks the metaserver
    /// for keys (a chunkserver heartbeats early).
    pub async fn wanted(&self) {
        self.wanted.notified().await
    }

    /// [`Verifier::check`], and when the key is unknown (a new metaserver leader's, not yet
    /// heartbeated), ask for keys and wait up to 2 s for it before refusing.
    pub async fn check_or_learn(
        &self,
        cap: Option<&Capability>,
        ino: u64,
        op: u32,
        holder: &str,
    ) -> std::result::Result<(), Refusal> {
        match self.check(cap, ino, op, holder) {
            Err(Refusal::UnknownKey) => {
                let (group, key) = cap.map_or((0, 0), |c| (c.group, c.key_id));
                self.wanted.notify_one();
                let deadline = tokio::time::Instant::now() + KEY_WAIT;
                while !self.knows(group, key) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                self.check(cap, ino, op, holder)
            }
            other => other,
        }
    }

    /// Check that `cap` lets `holder` do `op` on inode `ino`'s shards now.
    pub fn check(
        &self,
        cap: Option<&Capability>,
        ino: u64,
        op: u32,
        holder: &str,
    ) -> std::result::Result<(), Refusal> {
        self.check_at(cap, ino, op, holder, unix_secs())
    }

    fn check_at(
        &self,
        cap: Option<&Capability>,
        ino: u64,
        op: u32,
        holder: &str,
        now: i64,
    ) -> std::result::Result<(), Refusal> {
        let cap = cap.ok_or(Refusal::Missing)?;
        let (secret, retire) = *self.keys.read().get(&(cap.group, cap.key_id)).ok_or(Refusal::UnknownKey)?;
        if mac(&secret, cap) != blake3::Hash::from_slice(&cap.mac).map_err(|_| Refusal::BadMac)? {
            return Err(Refusal::BadMac);
        }
        if cap.expires.min(retire) + SKEW_SECS < now {
            return Err(Refusal::Expired);
        }
        if cap.ino != ino {
            return Err(Refusal::WrongInode);
        }
        if cap.ops & op != op {
            return Err(Refusal::WrongOperation);
        }
        if cap.holder != holder {
            return Err(Refusal::WrongHolder);
        }
        Ok(())
    }
}

/// The error a refused shard access gets.
pub fn refused(what: &str, ino: u64, why: Refusal) -> CairnError {
    crate::metrics::record_capability_refused(why.label());
    let reason = match why {
        Refusal::Missing => "no capability (a client needs one from the metaserver's open)".to_string(),
        Refusal::UnknownKey => "a capability signed with a key this chunkserver does not know".to_string(),
        Refusal::BadMac => "a capability whose signature does not match".to_string(),
        Refusal::Expired => "an expired capability".to_string(),
        Refusal::WrongInode => "a capability for another inode".to_string(),
        Refusal::WrongOperation => "a capability that does not grant this operation".to_string(),
        Refusal::WrongHolder => "a capability issued to another certificate".to_string(),
    };
    CairnError::new(ErrorKind::CapabilityRefused, format!("{what} of inode {ino}: refused, {reason}"))
}

/// A client's capabilities by inode, renewed before they run out: for each inode the token
/// that grants most, and the request that renews it (the access and caller of the open that
/// got it).
#[derive(Default)]
pub struct Held {
    caps: Mutex<HashMap<u64, (Option<Capability>, CapabilityRequest)>>,
}

/// How many capabilities a client keeps before it forgets the expired ones.
const HELD_MAX: usize = 1 << 16;

impl Held {
    /// Keep `cap` (from an open, a create or a grant), got by `asked` (what renews it), unless
    /// a fresh one held grants an operation it does not (a read-only open of a file this
    /// client also has open for writing keeps the writer's).
    pub fn keep(&self, cap: Option<Capability>, asked: CapabilityRequest) {
        let Some(cap) = cap else { return };
        let now = unix_secs();
        let mut caps = self.caps.lock();
        if caps.len() >= HELD_MAX {
            // A forgotten token's request stays: the next renewal needs it.
            caps.retain(|_, (c, _)| c.as_ref().is_none_or(|c| c.expires > now));
            if caps.len() >= HELD_MAX {
                caps.clear();
            }
        }
        if let Some((Some(held), _)) = caps.get(&cap.ino) {
            if held.ops & !cap.ops != 0 && is_fresh(held, now) {
                return;
            }
        }
        caps.insert(cap.ino, (Some(cap), asked));
    }

    /// The capability held for `ino` with at least [`RENEW_BEFORE`] left.
    pub fn fresh(&self, ino: u64) -> Option<Capability> {
        let now = unix_secs();
        self.caps.lock().get(&ino).and_then(|(c, _)| c.clone()).filter(|c| is_fresh(c, now))
    }

    /// What renews the capability for `ino`: the request that got the one held, or (none held)
    /// a read and write of the file with no caller.
    pub fn renewal(&self, ino: u64) -> CapabilityRequest {
        let held = self.caps.lock().get(&ino).map(|(_, asked)| asked.clone());
        held.unwrap_or(CapabilityRequest { ino, access: 0, caller: None })
    }

    /// Forget the capability for `ino` (a chunkserver refused it); what renews it stays.
    pub fn forget(&self, ino: u64) {
        if let Some((cap, _)) = self.caps.lock().get_mut(&ino) {
            *cap = None;
        }
    }
}

fn is_fresh(cap: &Capability, now: i64) -> bool {
    cap.expires - now > RENEW_BEFORE.as_secs() as i64
}

/// Whether `e` is a chunkserver's refusal of a capability (worth one renewal and retry): its
/// own kind. A chunkserver older than that kind (wire number 24) refused with
/// `PermissionDenied` and said so only in the message, which is still recognised so a newer
/// mount renews against it; no other error names itself that way.
pub fn is_refusal(e: &CairnError) -> bool {
    match e.kind() {
        ErrorKind::CapabilityRefused => true,
        ErrorKind::PermissionDenied => e.message().contains(": refused, "),
        _ => false,
    }
}

/// Fail unless `result` is fine, naming what was refused.
pub fn enforce(result: std::result::Result<(), Refusal>, what: &str, ino: u64) -> Result<()> {
    result.map_err(|why| refused(what, ino, why))
}

#[cfg(test)]
mod tests;

use super::*;

fn verifier_of(signer: &Signer) -> Verifier {
    let v = Verifier::default();
    v.learn(&signer.keys());
    v
}

#[test]
fn a_granted_capability_passes_for_its_inode_operation_and_holder_only() {
    let signer = Signer::new();
    let v = verifier_of(&signer);
    let cap = signer.grant(7, READ | WRITE, "client-a");
    assert_eq!(v.check(Some(&cap), 7, READ, "client-a"), Ok(()));
    assert_eq!(v.check(Some(&cap), 7, WRITE, "client-a"), Ok(()));
    assert_eq!(v.check(Some(&cap), 8, READ, "client-a"), Err(Refusal::WrongInode));
    assert_eq!(v.check(Some(&cap), 7, READ, "client-b"), Err(Refusal::WrongHolder));
    assert_eq!(v.check(None, 7, READ, "client-a"), Err(Refusal::Missing));
    let read_only = signer.grant(7, READ, "client-a");
    assert_eq!(v.check(Some(&read_only), 7, WRITE, "client-a"), Err(Refusal::WrongOperation));
}

#[test]
fn a_changed_field_or_signature_is_refused() {
    let signer = Signer::new();
    let v = verifier_of(&signer);
    let cap = signer.grant(7, READ, "client-a");
    let mut widened = cap.clone();
    widened.ops = READ | WRITE;
    assert_eq!(v.check(Some(&widened), 7, WRITE, "client-a"), Err(Refusal::BadMac));
    let mut moved = cap.clone();
    moved.ino = 8;
    assert_eq!(v.check(Some(&moved), 8, READ, "client-a"), Err(Refusal::BadMac));
    let mut later = cap.clone();
    later.expires += 86_400;
    assert_eq!(v.check(Some(&later), 7, READ, "client-a"), Err(Refusal::BadMac));
    let mut renamed = cap.clone();
    renamed.holder = "client-b".into();
    assert_eq!(v.check(Some(&renamed), 7, READ, "client-b"), Err(Refusal::BadMac));
    let mut short = cap.clone();
    short.mac.truncate(16);
    assert_eq!(v.check(Some(&short), 7, READ, "client-a"), Err(Refusal::BadMac));
}

#[test]
fn another_metaservers_key_is_unknown_until_learned() {
    let ours = Signer::new();
    let theirs = Signer::new();
    let v = verifier_of(&ours);
    let cap = theirs.grant(7, READ, "c");
    assert_eq!(v.check(Some(&cap), 7, READ, "c"), Err(Refusal::UnknownKey));
    assert!(!v.knows(0, cap.key_id));
    v.learn(&theirs.keys());
    assert_eq!(v.check(Some(&cap), 7, READ, "c"), Ok(()));
    // The first metaserver's tokens stay good (a former leader's, after an election).
    assert_eq!(v.check(Some(&ours.grant(9, READ, "c")), 9, READ, "c"), Ok(()));
}

#[test]
fn capabilities_expire_and_keys_rotate() {
    let signer = Signer::new();
    let v = verifier_of(&signer);
    let now = unix_secs();
    let cap = signer.grant_at(7, READ, "c", now);
    let lifetime = LIFETIME.as_secs() as i64;
    assert_eq!(v.check_at(Some(&cap), 7, READ, "c", now + lifetime), Ok(()));
    assert_eq!(v.check_at(Some(&cap), 7, READ, "c", now + lifetime + SKEW_SECS + 1), Err(Refusal::Expired));

    // Past the rotation period the signer starts a new key and still hands out the old one.
    let later = now + ROTATE_EVERY.as_secs() as i64;
    let rotated = signer.grant_at(7, READ, "c", later);
    assert_ne!(rotated.key_id, cap.key_id);
    let keys = signer.keys();
    assert_eq!(keys.len(), 2);
    assert!(keys.iter().all(|k| k.secret.len() == 32 && k.id != 0));
    v.learn(&keys);
    assert_eq!(v.check_at(Some(&rotated), 7, READ, "c", later), Ok(()));
    assert_eq!(v.check_at(Some(&cap), 7, READ, "c", now + 10), Ok(()));
}

#[test]
fn revoked_tokens_are_refused_once_chunkservers_learn_it_and_new_ones_pass() {
    let signer = Signer::new();
    let v = verifier_of(&signer);
    let now = unix_secs();
    let before = signer.grant_at(7, READ | WRITE, "c", now);
    signer.revoke_all_at(now);
    let after = signer.grant_at(7, READ, "c", now);
    assert_ne!(after.key_id, before.key_id, "a new key signs");
    // Still good on a chunkserver that has not heard of it.
    assert_eq!(v.check_at(Some(&before), 7, WRITE, "c", now + SKEW_SECS + 1), Ok(()));
    let keys = signer.keys();
    assert_eq!(keys.len(), 2, "the revoked key is announced with its revocation");
    v.learn(&keys);
    assert_eq!(v.check_at(Some(&before), 7, WRITE, "c", now + SKEW_SECS + 1), Err(Refusal::Expired));
    assert_eq!(v.check_at(Some(&after), 7, READ, "c", now + SKEW_SECS + 1), Ok(()));
    // A later announcement of the same key with its old retirement (another metaserver's
    // stale list) does not bring it back.
    let mut stale = keys.clone();
    for k in &mut stale {
        k.retire = now + LIFETIME.as_secs() as i64;
    }
    v.learn(&stale);
    assert_eq!(v.check_at(Some(&before), 7, WRITE, "c", now + SKEW_SECS + 1), Err(Refusal::Expired));
}

#[test]
fn a_key_of_the_wrong_length_is_ignored() {
    let v = Verifier::default();
    v.learn(&[CapabilityKey { id: 5, secret: vec![1; 16], retire: unix_secs() + 100 }]);
    assert!(!v.knows(0, 5));
}

#[test]
fn only_callers_with_nothing_but_the_client_role_need_one() {
    let with = |roles: &[Role]| Peer { addr: None, roles: Roles::of(roles), name: "x".into() };
    assert!(required_of(Some(&with(&[Role::Client]))));
    assert!(!required_of(Some(&with(&[Role::Client, Role::Admin]))));
    assert!(!required_of(Some(&with(&[Role::Meta]))));
    assert!(!required_of(Some(&with(&[Role::Chunk]))));
    assert!(!required_of(Some(&Peer::plaintext(None))), "a plaintext server checks nothing");
    assert!(!required_of(None), "an in-process call");
}

#[test]
fn a_client_renews_before_expiry_and_after_a_refusal() {
    let signer = Signer::new();
    let held = Held::default();
    let asked = |ino, access| CapabilityRequest { ino, access, caller: None };
    held.keep(Some(signer.grant(7, READ | WRITE, "c")), asked(7, 6));
    assert!(held.fresh(7).is_some());
    assert!(held.fresh(8).is_none());
    let mut old = signer.grant(8, READ, "c");
    old.expires = unix_secs() + RENEW_BEFORE.as_secs() as i64 - 1;
    held.keep(Some(old), asked(8, 4));
    assert!(held.fresh(8).is_none(), "about to expire: renewed");
    // A read-only grant does not replace a fresh one that also writes, nor what renews it.
    held.keep(Some(signer.grant(7, READ, "c")), asked(7, 4));
    assert_eq!(held.fresh(7).unwrap().ops, READ | WRITE);
    assert_eq!(held.renewal(7).access, 6);
    held.forget(7);
    assert!(held.fresh(7).is_none());
    assert_eq!(held.renewal(7).access, 6, "a refused token is renewed as it was got");
    // Once that one is gone, the narrower grant is kept; a wider one replaces it.
    held.keep(Some(signer.grant(7, READ, "c")), asked(7, 4));
    assert_eq!((held.fresh(7).unwrap().ops, held.renewal(7).access), (READ, 4));
    held.keep(Some(signer.grant(7, READ | WRITE, "c")), asked(7, 2));
    assert_eq!((held.fresh(7).unwrap().ops, held.renewal(7).access), (READ | WRITE, 2));
    assert_eq!(held.renewal(9), asked(9, 0), "nothing held: read and write, no caller");
    let e = refused("read", 7, Refusal::Expired);
    assert_eq!(e.kind(), ErrorKind::CapabilityRefused);
    assert!(is_refusal(&e), "{e}");
    // Over the wire, as the client decodes it.
    let e = CairnError::new(ErrorKind::from_index(e.kind().index()).unwrap(), e.message());
    assert!(is_refusal(&e), "{e}");
    // An older chunkserver's refusal; other permission errors are not refusals.
    let old =
        CairnError::new(ErrorKind::PermissionDenied, "shard read of inode 7: refused, an expired capability");
    assert!(is_refusal(&old), "{old}");
    assert!(!is_refusal(&CairnError::new(ErrorKind::PermissionDenied, "chunk.ReadShard is for ...")));
    assert!(!is_refusal(&CairnError::new(ErrorKind::NotFound, "shard read of inode 7: refused, gone")));
}

/// A new leadership (a higher namespace epoch) retires the keys it does not send: what a
/// deposed leader signed is refused after the skew allowance, even if that leader goes on
/// answering; and a metaserver that leads again signs with a key of the new leadership.
#[test]
fn a_new_leadership_retires_the_keys_it_does_not_send() {
    let (old_leader, new_leader) = (Signer::new(), Signer::new());
    let v = Verifier::default();
    let now = unix_secs();
    v.learn_from_leader_at(0, &old_leader.keys(), 5, now);
    let before = old_leader.grant_at(7, READ, "c", now);
    assert_eq!(v.check_at(Some(&before), 7, READ, "c", now), Ok(()));
    v.learn_from_leader_at(0, &new_leader.keys(), 6, now);
    let after = new_leader.grant_at(7, READ, "c", now);
    assert_eq!(v.check_at(Some(&after), 7, READ, "c", now + SKEW_SECS + 1), Ok(()));
    assert_eq!(v.check_at(Some(&before), 7, READ, "c", now + SKEW_SECS + 1), Err(Refusal::Expired));
    // The deposed leader answering late (its older epoch) changes nothing.
    v.learn_from_leader_at(0, &old_leader.keys(), 5, now);
    assert_eq!(v.check_at(Some(&before), 7, READ, "c", now + SKEW_SECS + 1), Err(Refusal::Expired));
    // It leads again later: its new key counts, its old one stays retired.
    old_leader.new_key();
    v.learn_from_leader_at(0, &old_leader.keys(), 7, now);
    let again = old_leader.grant_at(7, READ, "c", now);
    assert_ne!(again.key_id, before.key_id);
    assert_eq!(v.check_at(Some(&again), 7, READ, "c", now + SKEW_SECS + 1), Ok(()));
    assert_eq!(v.check_at(Some(&before), 7, READ, "c", now + SKEW_SECS + 1), Err(Refusal::Expired));
    assert_eq!(v.check_at(Some(&after), 7, READ, "c", now + SKEW_SECS + 1), Err(Refusal::Expired));
    // A metaserver that sends no epoch (0) is heard as before: nothing retired.
    let lone = Signer::new();
    v.learn_from_leader_at(0, &lone.keys(), 0, now);
    let theirs = lone.grant_at(7, READ, "c", now);
    assert_eq!(v.check_at(Some(&theirs), 7, READ, "c", now + SKEW_SECS + 1), Ok(()));
    assert_eq!(v.check_at(Some(&again), 7, READ, "c", now + SKEW_SECS + 1), Ok(()));
}

/// Each metadata group's keys check only its own capabilities, and a group's new leadership
/// retires only that group's keys.
#[test]
fn each_metadata_group_has_its_own_keys() {
    let (zero, one, one_next) = (Signer::new(), Signer::for_group(1), Signer::for_group(1));
    let v = Verifier::default();
    let now = unix_secs();
    v.learn_from_leader_at(0, &zero.keys(), 100, now);
    v.learn_from_leader_at(1, &one.keys(), 5, now);
    let of_zero = zero.grant_at(7, READ, "c", now);
    let of_one = one.grant_at(9, READ, "c", now);
    assert_eq!((of_zero.group, of_one.group), (0, 1));
    assert_eq!(v.check_at(Some(&of_zero), 7, READ, "c", now), Ok(()));
    assert_eq!(v.check_at(Some(&of_one), 9, READ, "c", now), Ok(()));
    // The group is part of what is signed: relabelled, a capability finds no key, or fails
    // its MAC under the other group's key of the same id.
    let relabelled = Capability { group: 0, ..of_one.clone() };
    assert_eq!(v.check_at(Some(&relabelled), 9, READ, "c", now), Err(Refusal::UnknownKey));
    let mut forged = of_one.clone();
    forged.group = 0;
    forged.key_id = of_zero.key_id;
    assert_eq!(v.check_at(Some(&forged), 9, READ, "c", now), Err(Refusal::BadMac));
    // Group 1's keys sent as another group's (a confused sender) check nothing of group 1; and
    // with the same key known under both groups, a capability relabelled from group 1 to 2
    // fails its MAC: the group is signed.
    let v2 = Verifier::default();
    v2.learn_from_leader_at(2, &one.keys(), 5, now);
    assert_eq!(v2.check_at(Some(&of_one), 9, READ, "c", now), Err(Refusal::UnknownKey));
    v2.learn_from_leader_at(1, &one.keys(), 5, now);
    assert_eq!(v2.check_at(Some(&of_one), 9, READ, "c", now), Ok(()));
    let as_two = Capability { group: 2, ..of_one.clone() };
    assert_eq!(v2.check_at(Some(&as_two), 9, READ, "c", now), Err(Refusal::BadMac));
    // Group 1's next leadership retires group 1's old keys only (an epoch below group 0's is
    // still newer for group 1: each group's epochs are its own).
    v.learn_from_leader_at(1, &one_next.keys(), 6, now);
    let later = now + SKEW_SECS + 1;
    assert_eq!(v.check_at(Some(&of_one), 9, READ, "c", later), Err(Refusal::Expired));
    assert_eq!(v.check_at(Some(&of_zero), 7, READ, "c", later), Ok(()));
    let next = one_next.grant_at(9, READ, "c", now);
    assert_eq!(v.check_at(Some(&next), 9, READ, "c", later), Ok(()));
    // An older leadership of group 1 is not heard.
    v.learn_from_leader_at(1, &one.keys(), 5, now);
    assert_eq!(v.check_at(Some(&of_one), 9, READ, "c", later), Err(Refusal::Expired));
}

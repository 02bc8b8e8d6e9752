use super::*;
use crate::auth::{FabricKey, tests::key};

pub(crate) const DIR: &str = r#"[
{"pod":"a","podIP":"127.0.0.1","id":0,"base":0,"size":4096,"uid":"ua"},
{"pod":"b","podIP":"127.0.0.1","id":1,"base":4096,"size":4096,"uid":"ub"},
{"pod":"c","id":2,"base":8192,"size":4096}
]"#;

pub(crate) fn identity(pod: &str, uid: &str, key: FabricKey) -> Identity {
    Identity {
        fabric: "f".into(),
        namespace: "ns".into(),
        me: Member {
            pod: pod.into(),
            uid: uid.into(),
        },
        key,
    }
}

fn qp() -> QpAddress {
    QpAddress {
        gid: "::ffff:10.0.0.1".parse().unwrap(),
        qpn: 17,
        psn: 5,
        mtu: Some(1024),
    }
}

/// Where a handshake between `initiator` and `owner` stops: the side that refused and why.
fn handshake(
    initiator: &Identity,
    owner: &Identity,
    to_uid: Option<&str>,
) -> Result<Member, (Side, String)> {
    let directory = Directory::parse("d", DIR).unwrap();
    let nonce = Nonce::fresh();
    let h = hello(initiator, &owner.me.pod, to_uid, &nonce);
    let (at_owner, challenge) =
        check_hello(&h, owner, &directory, Nonce::fresh()).map_err(|e| (Side::Owner, e))?;
    let proof =
        check_challenge(initiator, &h, &nonce, &challenge).map_err(|e| (Side::Initiator, e))?;
    let proof = proof.prove(initiator, qp());
    at_owner
        .check_proof(owner, &proof)
        .map_err(|e| (Side::Owner, e))?;
    Ok(at_owner.initiator)
}

#[test]
fn both_ends_use_the_smaller_path_mtu() {
    assert_eq!(path_mtu(4096, Some(1024)), 1024);
    assert_eq!(path_mtu(1024, Some(4096)), 1024);
    assert_eq!(path_mtu(2048, None), 2048, "an older peer: our own");
    let json = serde_json::to_string(&qp()).unwrap();
    assert!(json.contains("\"mtu\":1024"), "{json}");
    let old: QpAddress =
        serde_json::from_str(r#"{"gid":"::ffff:10.0.0.1","qpn":1,"psn":2}"#).unwrap();
    assert_eq!(old.mtu, None);
}

#[test]
fn a_member_holding_the_key_reaches_the_owner_its_directory_names() {
    let (a, b) = (identity("a", "ua", key(1)), identity("b", "ub", key(1)));
    let peer = handshake(&a, &b, Some("ub")).unwrap();
    assert_eq!((peer.pod.as_str(), peer.uid.as_str()), ("a", "ua"));
    // A pod connects to its own window the same way.
    assert!(handshake(&b, &b, Some("ub")).is_ok());
}

#[test]
fn a_copied_directory_claiming_a_members_name_and_uid_without_the_key_is_refused() {
    let owner = identity("b", "ub", key(1));
    let stranger = identity("a", "ua", key(9));
    let (side, why) = handshake(&stranger, &owner, Some("ub")).unwrap_err();
    // The stranger sees the owner fail its check first (the owner's proof is under the real
    // key); it never gets as far as proving anything.
    assert_eq!(side, Side::Initiator);
    assert!(
        why.contains("did not prove holding the fabric key"),
        "{why}"
    );
    // A stranger that skips checking the owner still cannot prove itself.
    let directory = Directory::parse("d", DIR).unwrap();
    let nonce = Nonce::fresh();
    let h = hello(&stranger, "b", Some("ub"), &nonce);
    let (at_owner, challenge) = check_hello(&h, &owner, &directory, Nonce::fresh()).unwrap();
    let forged = Transcript {
        fabric: "f",
        namespace: "ns",
        initiator: &stranger.me,
        owner: &owner.me,
        initiator_nonce: &nonce,
        owner_nonce: &Nonce::from_hex(&challenge.nonce).unwrap(),
    }
    .prove(&stranger.key, Side::Initiator, &encode(&qp()));
    let forged = Proof {
        proof: forged,
        qp: qp(),
    };
    let why = at_owner.check_proof(&owner, &forged).unwrap_err();
    assert_eq!(
        why,
        "pod a (ua) did not prove holding the fabric key of \"f\" in namespace \"ns\""
    );
}

#[test]
fn a_recorded_or_reflected_proof_answers_no_later_challenge() {
    let (a, b) = (identity("a", "ua", key(1)), identity("b", "ub", key(1)));
    let directory = Directory::parse("d", DIR).unwrap();
    let nonce = Nonce::fresh();
    let h = hello(&a, "b", Some("ub"), &nonce);
    let (_, challenge) = check_hello(&h, &b, &directory, Nonce::fresh()).unwrap();
    let recorded = check_challenge(&a, &h, &nonce, &challenge)
        .unwrap()
        .prove(&a, qp());
    // The same hello replayed later gets a fresh owner nonce: the recorded proof fails.
    let (at_owner, _) = check_hello(&h, &b, &directory, Nonce::fresh()).unwrap();
    let why = at_owner.check_proof(&b, &recorded).unwrap_err();
    assert!(why.contains("did not prove"), "{why}");
    // The owner's own proof sent back as the initiator's.
    let (at_owner, challenge) = check_hello(&h, &b, &directory, Nonce::fresh()).unwrap();
    let reflected = Proof {
        proof: challenge.proof,
        qp: qp(),
    };
    assert!(at_owner.check_proof(&b, &reflected).is_err());
    // A recorded challenge replayed to a new hello (new initiator nonce) fails too.
    let (_, old) = check_hello(&h, &b, &directory, Nonce::fresh()).unwrap();
    let again = Nonce::fresh();
    let h2 = hello(&a, "b", Some("ub"), &again);
    assert!(check_challenge(&a, &h2, &again, &old).is_err());
}

#[test]
fn a_swapped_queue_pair_or_changed_offer_is_caught() {
    let (a, b) = (identity("a", "ua", key(1)), identity("b", "ub", key(1)));
    let directory = Directory::parse("d", DIR).unwrap();
    let nonce = Nonce::fresh();
    let h = hello(&a, "b", Some("ub"), &nonce);
    let (at_owner, challenge) = check_hello(&h, &b, &directory, Nonce::fresh()).unwrap();
    let at_initiator = check_challenge(&a, &h, &nonce, &challenge).unwrap();
    let proof = at_initiator.prove(&a, qp());
    assert_eq!(at_owner.check_proof(&b, &proof), Ok(()));
    // Someone on the path puts its own queue pair under the initiator's proof.
    let swapped = Proof {
        qp: QpAddress { qpn: 99, ..qp() },
        ..proof
    };
    assert!(at_owner.check_proof(&b, &swapped).is_err());
    let offer = Offer {
        qp: qp(),
        base: 4096,
        size: 4096,
        addr: 0x7000,
        rkey: 42,
        proof: String::new(),
    };
    let signed = at_owner.sign(&b, offer.clone());
    // On the wire the address and rkey are sealed: what a watcher of the pod network sees is
    // not the window's; the initiator holding the key opens them.
    assert_ne!((signed.addr, signed.rkey), (offer.addr, offer.rkey));
    assert_eq!(
        (signed.qp, signed.base, signed.size),
        (offer.qp, offer.base, offer.size)
    );
    let opened = at_initiator.check_offer(&a, &signed).unwrap();
    assert_eq!((opened.addr, opened.rkey), (0x7000, 42));
    assert!(at_initiator.check_offer(&a, &offer).is_err(), "unsigned");
    // The same offer to another exchange is sealed under another pad.
    let (again, _) = check_hello(&h, &b, &directory, Nonce::fresh()).unwrap();
    let resealed = again.sign(&b, offer.clone());
    assert_ne!((resealed.addr, resealed.rkey), (signed.addr, signed.rkey));
    let changed = Offer {
        rkey: signed.rkey ^ 1,
        ..signed.clone()
    };
    let why = at_initiator.check_offer(&a, &changed).unwrap_err();
    assert_eq!(
        why,
        "the offer of pod b (ub) does not carry its proof for this exchange"
    );
    // An offer signed for another exchange (a replay) does not fit this one.
    let (other, _) = check_hello(&h, &b, &directory, Nonce::fresh()).unwrap();
    assert!(
        at_initiator
            .check_offer(&a, &other.sign(&b, offer))
            .is_err()
    );
}

#[test]
fn the_owner_refuses_other_fabrics_namespaces_unknown_pods_and_missing_uids() {
    let b = identity("b", "ub", key(1));
    let refused = |i: &Identity, to_uid: Option<&str>| handshake(i, &b, to_uid).unwrap_err();
    let mut other = identity("a", "ua", key(1));
    other.fabric = "g".into();
    assert_eq!(
        refused(&other, Some("ub")),
        (Side::Owner, "fabric \"g\" (this pod is in \"f\")".into())
    );
    let mut other = identity("a", "ua", key(1));
    other.namespace = "ns2".into();
    assert!(refused(&other, Some("ub")).1.contains("namespace \"ns2\""));
    let (_, why) = refused(&identity("a", "ua", key(1)), None);
    assert!(why.contains("names no uid for pod b"), "{why}");
    // An empty uid is no uid.
    let (_, why) = refused(&identity("a", "ua", key(1)), Some(""));
    assert!(why.contains("names no uid for pod b"), "{why}");
    let (_, why) = refused(&identity("z", "uz", key(1)), Some("ub"));
    assert_eq!(
        why,
        "pod \"z\" is not in this pod's directory of fabric \"f\" in namespace \"ns\""
    );
    let (_, why) = refused(&identity("a", "u-old", key(1)), Some("ub"));
    assert_eq!(
        why,
        "pod a claims uid \"u-old\", this pod's directory names uid ua"
    );
    let (_, why) = refused(&identity("c", "uc", key(1)), Some("ub"));
    assert!(why.contains("names no uid for pod c"), "{why}");
    let (_, why) = refused(&identity("a", "ua", key(1)), Some("u-replaced"));
    assert!(
        why.contains("uid u-replaced") && why.contains("now uid ub"),
        "{why}"
    );
    let mut h = hello(
        &identity("a", "ua", key(1)),
        "b",
        Some("ub"),
        &Nonce::fresh(),
    );
    h.version = 1;
    let d = Directory::parse("d", DIR).unwrap();
    assert!(
        check_hello(&h, &b, &d, Nonce::fresh())
            .unwrap_err()
            .contains("version 1")
    );
    h.version = VERSION;
    h.nonce = "00".into();
    assert!(
        check_hello(&h, &b, &d, Nonce::fresh())
            .unwrap_err()
            .contains("nonce")
    );
    let mut wrong = identity("a", "ua", key(1));
    wrong.me.pod = "b".into();
    let h = hello(&wrong, "a", Some("ua"), &Nonce::fresh());
    assert!(
        check_hello(&h, &b, &d, Nonce::fresh())
            .unwrap_err()
            .contains("asked for pod")
    );
}

#[test]
fn the_initiator_refuses_a_replaced_owner_at_the_same_address() {
    let a = identity("a", "ua", key(1));
    // The pod IP now belongs to b's replacement (same name, new uid), in the fabric.
    let nonce = Nonce::fresh();
    let h = hello(&a, "b", Some("ub"), &nonce);
    // What the replacement would answer if it did not check the uid itself.
    let challenge = Challenge {
        pod: "b".into(),
        uid: "ub-new".into(),
        nonce: Nonce::fresh().to_hex(),
        proof: String::new(),
    };
    let why = check_challenge(&a, &h, &nonce, &challenge).unwrap_err();
    assert!(
        why.contains("uid ub-new") && why.contains("names ub for pod b"),
        "{why}"
    );
    // And a stranger answering under b's name and uid has no proof.
    let forged = Challenge {
        uid: "ub".into(),
        proof: "00".repeat(32),
        ..challenge
    };
    let why = check_challenge(&a, &h, &nonce, &forged).unwrap_err();
    assert!(why.contains("did not prove"), "{why}");
    assert!(
        check_challenge(
            &a,
            &h,
            &nonce,
            &Challenge {
                pod: "x".into(),
                ..forged
            }
        )
        .unwrap_err()
        .contains("answered for")
    );
}

#[test]
fn messages_are_one_json_line_each() {
    let h = hello(
        &identity("a", "ua", key(1)),
        "b",
        Some("ub"),
        &Nonce([0; 32]),
    );
    let line = encode(&h);
    assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
    let back: Hello = serde_json::from_slice(&line).unwrap();
    assert_eq!(back, h);
    assert_eq!(
        String::from_utf8(encode(&Reply::Refuse("no".into()))).unwrap(),
        "{\"refuse\":\"no\"}\n"
    );
    assert_eq!(
        String::from_utf8(encode(&Response::Refuse("no".into()))).unwrap(),
        "{\"refuse\":\"no\"}\n"
    );
}

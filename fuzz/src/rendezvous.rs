//! The data plane's rendezvous: what any process that reaches a pod's port 18516 may send its
//! owner, and what anything answering at a pod IP may send an initiator. Nothing that does not hold
//! the fabric key gets past either side's checks.

use rocefabric_dsm::auth::{FabricKey, Identity, Member, Nonce};
use rocefabric_dsm::directory::Directory;
use rocefabric_dsm::wire::{self, Answer, Hello, Reply, Response};

use crate::text;

const DIRECTORY: &str = r#"[
{"pod":"a","podIP":"10.0.0.1","id":0,"base":0,"size":4096,"uid":"ua"},
{"pod":"b","podIP":"10.0.0.2","id":1,"base":4096,"size":4096,"uid":"ub"},
{"pod":"c","id":2,"base":8192,"size":4096}
]"#;

fn identity(pod: &str, uid: &str) -> Identity {
    Identity {
        fabric: "f".into(),
        namespace: "ns".into(),
        me: Member {
            pod: pod.into(),
            uid: uid.into(),
        },
        key: FabricKey::new(&[0x5a; 32]).expect("a key"),
    }
}

/// Lines of the input: the first as a hello to owner `b`, the second as the initiator's response
/// to `b`'s challenge; every line also as `b`'s answer and offer to initiator `a`. The owner
/// challenges only a hello for `b` with its uid from a pod its directory names with the uid
/// claimed; no proof, challenge or offer from the input is ever accepted (none holds the key).
pub fn rendezvous(data: &[u8]) {
    let text = text(data);
    let lines: Vec<&str> = text.lines().collect();
    let owner = identity("b", "ub");
    let directory = Directory::parse("d", DIRECTORY).expect("the directory parses");
    let first = lines.first().copied().unwrap_or_default();
    if let Ok(hello) = serde_json::from_str::<Hello>(first) {
        match wire::check_hello(&hello, &owner, &directory, Nonce([7; 32])) {
            Ok((exchange, challenge)) => {
                assert_eq!(
                    (hello.to_pod.as_str(), hello.to_uid.as_deref()),
                    ("b", Some("ub"))
                );
                assert_eq!(
                    (hello.fabric.as_str(), hello.namespace.as_str()),
                    ("f", "ns")
                );
                let entry = directory.pod(&hello.from_pod).expect("a directory pod");
                assert_eq!(entry.uid.as_deref(), Some(hello.from_uid.as_str()));
                assert_eq!(
                    (challenge.pod.as_str(), challenge.uid.as_str()),
                    ("b", "ub")
                );
                let second = lines.get(1).copied().unwrap_or_default();
                if let Ok(Response::Prove(proof)) = serde_json::from_str::<Response>(second) {
                    assert!(
                        exchange.check_proof(&owner, &proof).is_err(),
                        "a proof without the key was accepted: {second}"
                    );
                }
            }
            Err(why) => assert!(!why.is_empty()),
        }
    }
    let initiator = identity("a", "ua");
    let nonce = Nonce([9; 32]);
    let hello = wire::hello(&initiator, "b", Some("ub"), &nonce);
    for line in &lines {
        if let Ok(Answer::Challenge(c)) = serde_json::from_str::<Answer>(line) {
            assert!(
                wire::check_challenge(&initiator, &hello, &nonce, &c).is_err(),
                "a challenge without the key was accepted: {line}"
            );
        }
        let _ = serde_json::from_str::<Reply>(line);
    }
}

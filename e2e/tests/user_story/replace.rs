//! Step 4: a pod is replaced. Its replacement (same name, new uid) gets a fresh window; the old one
//! is not handed out again within its grace period; the data plane refuses the old identity, and
//! the old window's addresses reach nobody.

use crate::devices::{fabric_pod, start_pods};
use crate::kube::{APPS, Story, WAIT, eventually};
use crate::memory::{directory_lists, ok, window};

pub fn replaced_pod_gets_a_fresh_window(story: &mut Story) {
    let node = story.workers[1].clone();
    let (old_id, old_base, size, old_uid) = window(story, "b2");
    ok(
        &story.session("a1", "read b2+0 8"),
        "a1 reads b2 before the replacement",
    );

    story.kubectl(&[
        "delete",
        "pod",
        "-n",
        APPS,
        "b2",
        "--wait=true",
        "--timeout=120s",
    ]);
    story.forget("b2");
    let replacement = fabric_pod(story, "b2", &node);
    start_pods(story, &[replacement]);
    let (id, base, _, uid) = window(story, "b2");
    assert_ne!(uid, old_uid, "the replacement is a new pod");
    assert_ne!(
        id, old_id,
        "the old window is not reused within its grace period"
    );
    assert!(
        base + size <= old_base || old_base + size <= base,
        "the fresh window [{base:#x}, +{size:#x}) does not overlap the old one at {old_base:#x}"
    );

    // The directory every pod mounts names the new identity once the kubelet syncs it.
    for pod in ["a1", "a2"] {
        eventually(
            &format!("{pod}'s mounted directory names the new b2"),
            WAIT,
            || {
                let dir = story
                    .exec(pod, "cat /etc/rocefabric/directory/regions.json")
                    .ok()?;
                (dir.contains(&uid) && !dir.contains(&old_uid)).then_some(())
            },
        );
        // The operator writes the new pod's IP only once it runs: a later sync brings it.
        directory_lists(story, pod, &["b2"]);
    }
    ok(
        &story.session("a1", "reach b2+0 60000"),
        "a1 reaches the new b2",
    );
    ok(&story.session("a1", "read b2+0 8"), "a1 reads the new b2");
    let stale = story.session("a1", &format!("read {old_base} 8"));
    assert_eq!(
        stale["ok"], false,
        "the old window's address reaches nobody: {stale}"
    );
    assert!(
        stale["error"]
            .as_str()
            .is_some_and(|e| e.contains("not assigned to any pod")),
        "{stale}"
    );

    // A peer that still believes in the old identity (a directory naming the old uid at the
    // new pod's address) is refused by the new pod.
    let forged = story.exec(
        "a2",
        &format!(
            "sed 's/{uid}/{old_uid}/' /etc/rocefabric/directory/regions.json >/tmp/old.json && \
             rocefabric-dsm --directory /tmp/old.json read --addr b2+0 --len 8 2>&1; echo exit=$?"
        ),
    );
    let forged = forged.unwrap_or_else(|e| e);
    assert!(
        !forged.contains("exit=0"),
        "the old identity is refused: {forged}"
    );
    assert!(
        forged.contains("refused") && forged.contains(&old_uid) && forged.contains(&uid),
        "the refusal names both identities: {forged}"
    );

    // A process with the directory but not the fabric's key (a hand-made one) gets nothing: the
    // owner's proof does not verify under its key, so it never even proves itself.
    let keyless = story.exec(
        "a2",
        "mkdir -p /tmp/k && head -c 32 /dev/urandom >/tmp/k/key && \
         cp /etc/rocefabric/key/namespace /tmp/k/ && \
         rocefabric-dsm --key-dir /tmp/k read --addr b2+0 --len 8 2>&1; echo exit=$?",
    );
    let keyless = keyless.unwrap_or_else(|e| e);
    assert!(
        !keyless.contains("exit=0") && keyless.contains("did not prove holding the fabric key"),
        "a pod without the key is refused: {keyless}"
    );
}

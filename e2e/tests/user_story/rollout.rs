//! Step 6: an MTU edit of the fabric rolls across the workers one at a time (`maxUnavailable: 1`),
//! as a watch on the RoceNodes shows event by event, and the fabric's status tells where it stands;
//! the data plane works at the new MTU.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::kube::{FABRIC, Story, WAIT, condition, eventually};
use crate::memory::ok;

const NEW_MTU: u64 = 4200;

/// Where a RoceNode stands: the generation it is asked to apply and whether it has.
#[derive(Clone, Copy, Debug, Default)]
struct NodeState {
    target: i64,
    applied: bool,
}

fn state(object: &Value) -> NodeState {
    let target = object["spec"]["fabricGeneration"]
        .as_i64()
        .unwrap_or_default();
    let applied = object["status"]["fabricGeneration"].as_i64() == Some(target)
        && condition(object, "QosApplied").is_some_and(|c| c.0 == "True");
    NodeState { target, applied }
}

pub fn mtu_rolls_out_within_max_unavailable(story: &mut Story) {
    // Every change to the RoceNodes from here on, in order.
    let mut watch = story
        .local
        .kubectl()
        .args(["get", "rocenodes", "--watch", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get --watch");
    let stdout = watch.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for object in
            serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>()
        {
            let Ok(object) = object else { break };
            if tx.send(object).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_secs(2)); // the watch's initial list

    story.kubectl(&[
        "patch",
        "rf",
        FABRIC,
        "--type",
        "merge",
        "-p",
        &format!("{{\"spec\":{{\"qos\":{{\"mtu\":{NEW_MTU}}}}}}}"),
    ]);
    let generation: i64 = story
        .kubectl(&["get", "rf", FABRIC, "-o", "jsonpath={.metadata.generation}"])
        .trim()
        .parse()
        .expect("generation");
    let mut progress = Vec::new();
    let fabric = eventually("the MTU rollout completes", WAIT, || {
        let f: Value = serde_json::from_str(
            &story
                .try_kubectl(&["get", "rf", FABRIC, "-o", "json"])
                .ok()?,
        )
        .ok()?;
        let (status, reason, message) = condition(&f, "Progressing")?;
        if progress.last() != Some(&message) {
            progress.push(message.clone());
        }
        let done = f["status"]["observedGeneration"] == generation
            && status == "False"
            && reason == "RolloutComplete"
            && condition(&f, "Ready").is_some_and(|c| c.0 == "True");
        done.then_some(f)
    });
    assert_eq!(
        fabric["status"]["nodes"]["configured"],
        story.workers.len(),
        "{fabric}"
    );
    println!("   fabric Progressing messages seen: {progress:?}");
    std::thread::sleep(Duration::from_secs(1));
    let _ = watch.kill();
    let _ = watch.wait();

    // Replay the watch: never more than one node asked for the new generation without having
    // applied it, and each node in turn.
    let mut nodes: BTreeMap<String, NodeState> = BTreeMap::new();
    let mut order = Vec::new();
    for object in rx.try_iter() {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let now = state(&object);
        if now.target == generation && nodes.get(&name).is_none_or(|s| s.target != generation) {
            order.push(name.clone());
        }
        nodes.insert(name, now);
        let unavailable: Vec<&String> = nodes
            .iter()
            .filter(|(_, s)| s.target == generation && !s.applied)
            .map(|(n, _)| n)
            .collect();
        assert!(
            unavailable.len() <= 1,
            "maxUnavailable 1 broken: {unavailable:?} at once"
        );
    }
    assert_eq!(
        order.len(),
        story.workers.len(),
        "each worker got generation {generation}: {order:?}"
    );
    for node in story.workers.clone() {
        let rn = story.get_json(&["get", "rocenode", &node]);
        let mtu = rn["status"]["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|i| i["knobs"].as_array().into_iter().flatten())
            .find(|k| k["knob"] == "mtu")
            .cloned()
            .unwrap_or_default();
        assert_eq!(mtu["outcome"], "Applied", "{node}: {mtu}");
        assert_eq!(mtu["observed"], NEW_MTU.to_string(), "{node}: {mtu}");
    }
    // RDMA across the nodes at the new MTU.
    ok(
        &story.session("a1", "reach b1+0 60000"),
        "a1 reaches b1 after the rollout",
    );
    let read = story.session("a1", "read b1+0 1048576 7");
    assert_eq!(
        read["match"], true,
        "the 1 MiB of step 3, read at MTU {NEW_MTU}: {read}"
    );
}

//! Step 7: DRA mode on the same workers. `helm upgrade --set node.mode=dra`; the first worker's
//! ResourceSlice withholds its rxe while device plugin pods (a1, a2) still hold it, and publishes it
//! once they are gone; a ResourceClaim of class `hca.rocefabric.io` gets it through CDI, and its
//! pod, in the fabric with a window, reads a peer's window on the other node with
//! `rocefabric-dsm probe`.

use rocefabric_e2e::workspace_root;
use serde_json::{Value, json};

use crate::devices::{WINDOW_MEMORY, fabric_pod, start_pods};
use crate::fabric::values_file;
use crate::kube::{APPS, NAMESPACE, RELEASE, Story, WAIT, eventually};
use crate::memory::directory_lists;

pub fn claim_gets_rxe_through_cdi(story: &mut Story) {
    let chart = workspace_root().join("charts/rocefabric");
    story.helm(&[
        "upgrade",
        RELEASE,
        &chart.to_string_lossy(),
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout",
        "5m",
        "-f",
        &values_file(),
        "--set",
        "node.mode=dra",
    ]);
    let node = story.workers[0].clone();
    // One device, one owner: while a1 and a2 (device plugin pods) hold the first worker's rxe0,
    // its slice withholds it from claims; once they are gone it is published.
    let rxe_in_slice = |story: &Story| -> Option<bool> {
        let slices: Value = serde_json::from_str(
            &story
                .try_kubectl(&["get", "resourceslices", "-o", "json"])
                .ok()?,
        )
        .ok()?;
        let slice = slices["items"].as_array()?.iter().find(|s| {
            s["spec"]["driver"] == "rocefabric.io" && s["spec"]["nodeName"] == node.as_str()
        })?;
        Some(slice["spec"]["devices"].to_string().contains("rxe0"))
    };
    eventually(
        &format!("{node}'s ResourceSlice, rxe0 withheld while device plugin pods hold it"),
        WAIT,
        || (!rxe_in_slice(story)?).then_some(()),
    );
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(
        rxe_in_slice(story),
        Some(false),
        "rxe0 stays withheld while a1 and a2 run"
    );
    story.kubectl(&[
        "delete",
        "pod",
        "-n",
        APPS,
        "a1",
        "a2",
        "--wait=true",
        "--timeout=120s",
    ]);
    eventually(
        &format!("{node}'s ResourceSlice publishes rxe0 once its holders are gone"),
        WAIT,
        || rxe_in_slice(story)?.then_some(()),
    );

    story.apply(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "hca", "namespace": APPS},
        "spec": {"devices": {"requests": [{"name": "hca", "exactly": {"deviceClassName": "hca.rocefabric.io", "count": 1}}]}},
    }));
    let mut pod = fabric_pod(story, "dra-a", &node);
    let c = &mut pod["spec"]["containers"][0];
    c["resources"] = json!({"limits": {"memory": WINDOW_MEMORY}, "claims": [{"name": "hca"}]});
    pod["spec"]["resourceClaims"] = json!([{"name": "hca", "resourceClaimName": "hca"}]);
    start_pods(story, &[pod]);

    let claim = story.get_json(&["get", "resourceclaim", "-n", APPS, "hca"]);
    let results = &claim["status"]["allocation"]["devices"]["results"];
    assert_eq!(results[0]["driver"], "rocefabric.io", "{claim}");
    assert_eq!(results[0]["pool"], node.as_str(), "{claim}");
    let seen = story
        .exec(
            "dra-a",
            "ls /dev/infiniband | tr '\\n' ' '; echo; echo hca=$NCCL_IB_HCA gid=$NCCL_IB_GID_INDEX",
        )
        .unwrap_or_else(|e| panic!("dra-a: {e}"));
    assert!(
        seen.contains("rdma_cm uverbs0"),
        "the CDI spec gave the device nodes: {seen}"
    );
    assert!(seen.contains("hca==rxe0:1"), "and the environment: {seen}");

    // b1 admits only pods its own mounted directory names: wait for the kubelet to bring dra-a's
    // window into it (the ConfigMap volume's sync), as for every new fabric pod.
    directory_lists(story, "b1", &["dra-a"]);
    directory_lists(story, "dra-a", &["b1"]);
    let probe = story
        .exec("dra-a", "rocefabric-dsm probe --peers b1 --output json")
        .unwrap_or_else(|e| panic!("probe from the DRA pod: {e}"));
    let rows: Value = serde_json::from_str(&probe).unwrap_or_else(|e| panic!("{e}: {probe}"));
    assert_eq!(rows[0]["pod"], "b1", "{probe}");
    assert!(
        rows[0]["readP50Us"].as_f64().is_some_and(|v| v > 0.0),
        "{probe}"
    );
    story.figure(format!(
        "DRA pod's probe to b1: read p50 {} us",
        rows[0]["readP50Us"]
    ));
}

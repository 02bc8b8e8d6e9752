//! Step 1: `helm install` as the README says, `kubectl apply` of the Soft-RoCE example fabric; both
//! workers get a RoceNode with per-knob outcomes and the fabric turns Ready.

use std::time::Instant;

use rocefabric_e2e::bounded::{CALL_LIMIT, OutputWithin as _};
use rocefabric_e2e::workspace_root;
use serde_json::Value;

use crate::kube::{
    APPS, FABRIC, HCA_SHARES, NAMESPACE, RELEASE, Story, WAIT, WORKER_TAINT_KEY, condition,
    eventually,
};

/// The README's values file for VM workers: images from the node's store, the daemon only on the
/// workers (tolerating their taint), rxe served (`softRoce: include`), [`HCA_SHARES`] pods per HCA.
pub fn values_file() -> String {
    let path = workspace_root().join("examples/values/vm-workers.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let values: Value = yaml_serde::from_str(&text).expect("the values file is YAML");
    assert_eq!(
        values["node"]["config"]["hca"]["sharedReplicas"].to_string(),
        HCA_SHARES,
        "{}",
        path.display()
    );
    assert_eq!(
        values["node"]["nodeSelector"][WORKER_TAINT_KEY],
        "true",
        "{}",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// What an earlier run left: the release, the workload namespace, the fabric.
fn clean(story: &Story) {
    let _ = story.try_kubectl(&["delete", "namespace", APPS, "--wait=true", "--timeout=120s"]);
    let _ = story.try_kubectl(&["delete", "rocefabric", FABRIC, "--ignore-not-found"]);
    if story
        .local
        .helm()
        .args(["status", RELEASE, "-n", NAMESPACE])
        .output_within(CALL_LIMIT)
        .is_ok_and(|o| o.status.success())
    {
        story.helm(&[
            "uninstall",
            RELEASE,
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout",
            "3m",
        ]);
    }
}

pub fn install_and_apply(story: &mut Story) {
    clean(story);
    let chart = workspace_root().join("charts/rocefabric");
    let values = values_file();
    story.helm(&[
        "install",
        RELEASE,
        &chart.to_string_lossy(),
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "-f",
        &values,
    ]);
    // The daemon runs on each worker and nowhere else.
    let daemons = story.get_json(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "app.kubernetes.io/component=node",
    ]);
    let mut on: Vec<&str> = daemons["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p["spec"]["nodeName"].as_str())
                .collect()
        })
        .unwrap_or_default();
    on.sort();
    assert_eq!(
        on, story.workers,
        "the node daemon runs on exactly the workers"
    );

    let example = workspace_root().join("examples/rocefabric-soft-roce.yaml");
    let applied = Instant::now();
    story.kubectl(&["apply", "-f", &example.to_string_lossy()]);
    let workers = story.workers.clone();
    for node in &workers {
        let roce_node = eventually(&format!("RoceNode {node} QosApplied=True"), WAIT, || {
            let n = story
                .try_kubectl(&["get", "rocenode", node, "-o", "json"])
                .ok()?;
            let n: Value = serde_json::from_str(&n).ok()?;
            (condition(&n, "QosApplied")?.0 == "True").then_some(n)
        });
        assert_soft_roce_outcomes(node, &roce_node);
    }
    let elapsed = applied.elapsed();
    story.figure(format!(
        "fabric apply to every node QosApplied ({} nodes): {elapsed:.1?}",
        workers.len()
    ));

    let fabric = eventually("fabric Ready=True", WAIT, || {
        let f = story
            .try_kubectl(&["get", "rf", FABRIC, "-o", "json"])
            .ok()?;
        let f: Value = serde_json::from_str(&f).ok()?;
        (condition(&f, "Ready")?.0 == "True").then_some(f)
    });
    assert_eq!(fabric["status"]["nodes"]["selected"], workers.len());
    assert_eq!(fabric["status"]["nodes"]["configured"], workers.len());
    // `kubectl get rf` as the README shows it.
    let table = story.kubectl(&["get", "rf", FABRIC]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .and_then(|i| row.get(i).copied())
    };
    assert_eq!(col("READY"), Some("True"), "{table}");
    assert_eq!(col("CONFIGURED"), Some("2"), "{table}");
    assert_eq!(col("SELECTED"), Some("2"), "{table}");
}

/// The rule of `lossySoftRoce: Accept`, as a user reads it in the RoceNode: what rxe cannot hold
/// is Unsupported with its cause, the MTU and RoCE ToS are Applied, the node is QosApplied with
/// reason SoftRoceAccepted and Degraded (not lossless).
fn assert_soft_roce_outcomes(node: &str, roce_node: &Value) {
    let knobs: Vec<&Value> = roce_node["status"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|i| i["knobs"].as_array().into_iter().flatten())
        .collect();
    let outcome = |knob: &str| {
        knobs
            .iter()
            .find(|k| k["knob"] == knob)
            .map(|k| {
                (
                    k["outcome"].as_str().unwrap_or_default(),
                    k["error"].as_str().unwrap_or_default(),
                )
            })
            .unwrap_or_else(|| panic!("{node}: no knob {knob} in {roce_node}"))
    };
    for knob in ["pfc", "trust"] {
        let (o, error) = outcome(knob);
        assert_eq!(o, "Unsupported", "{node} {knob}");
        assert!(
            !error.is_empty(),
            "{node} {knob}: an Unsupported knob names its cause"
        );
    }
    // Held: set now, or already as asked (the NIC's MTU may start at the fabric's).
    for knob in ["mtu", "roceTos", "roceMode"] {
        let (o, error) = outcome(knob);
        assert!(
            ["Applied", "AlreadyCorrect"].contains(&o),
            "{node} {knob}: {o} {error}"
        );
    }
    let (_, reason, _) = condition(roce_node, "QosApplied").expect("QosApplied");
    assert_eq!(reason, "SoftRoceAccepted", "{node}");
    let (degraded, _, message) = condition(roce_node, "Degraded").expect("Degraded");
    assert_eq!(degraded, "True", "{node}: a soft node is not lossless");
    assert!(
        message.contains("pfc"),
        "{node}: Degraded names the knobs: {message}"
    );
}

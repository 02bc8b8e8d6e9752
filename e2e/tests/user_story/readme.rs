//! The README's pod specs ("Using your window"), word for word: the story's fabric pods are these
//! YAML blocks with only what a test must choose set on top (name, namespace, node, toleration,
//! the command that drives a session, sizes that fit the VMs).

use rocefabric_e2e::workspace_root;
use serde_json::{Value, json};

use crate::kube::{APPS, FABRIC, Story, WORKER_TAINT_KEY};

/// The README's fabric name in its pod specs (the test's fabric is [`FABRIC`]).
const README_FABRIC: &str = "training";

/// The `n`th pod YAML block under "## Using your window" (0: anonymous memory, 1: hugepages).
pub fn pod(n: usize) -> Value {
    let text = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let section = text
        .split_once("\n## Using your window\n")
        .expect("README has \"## Using your window\"")
        .1;
    let block = section
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split_once("\n```").map(|(yaml, _)| yaml))
        .filter(|yaml| yaml.starts_with("apiVersion: v1\nkind: Pod\n"))
        .nth(n)
        .unwrap_or_else(|| panic!("README \"Using your window\" has pod block {n}"));
    // The fabric's name is in the label, the directory's and the key's names: ours is another.
    let yaml = block.replace(README_FABRIC, FABRIC);
    yaml_serde::from_str(&yaml).unwrap_or_else(|e| panic!("README pod block {n}: {e}\n{yaml}"))
}

/// Place a README pod: its name, the story's namespace and `node`, the worker taint tolerated, the
/// image from the node's store, and `rocefabric-dsm session` reading commands from the FIFO
/// `/tmp/cmd` instead of the README's `serve`.
pub fn place(story: &Story, pod: &mut Value, name: &str, node: &str) {
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["namespace"] = json!(APPS);
    let spec = &mut pod["spec"];
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    spec["tolerations"] = json!([{"key": WORKER_TAINT_KEY, "operator": "Exists"}]);
    spec["terminationGracePeriodSeconds"] = json!(2);
    let c = &mut spec["containers"][0];
    c["image"] = json!(story.local.workload_image);
    c["imagePullPolicy"] = json!("Never");
    c.as_object_mut().expect("a container").remove("args");
    c["command"] = json!([
        "sh",
        "-c",
        "mkfifo /tmp/cmd && exec rocefabric-dsm session <>/tmp/cmd"
    ]);
}

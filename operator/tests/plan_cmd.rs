//! `rocefabric-operator plan` over YAML files, run as users run it.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocefabric-operator"))
        .arg("plan")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = run(&all);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn the_example_cluster_gets_four_nodes_and_four_regions() {
    let ex = examples();
    let v = json(&[
        "--fabrics",
        ex.join("rocefabric-dgx.yaml").to_str().unwrap(),
        "--nodes",
        ex.join("cluster-snapshot/nodes.yaml").to_str().unwrap(),
        "--pods",
        ex.join("cluster-snapshot/pods.yaml").to_str().unwrap(),
    ]);
    let fabrics = v["fabrics"].as_array().unwrap();
    assert_eq!(fabrics.len(), 1);
    let f = &fabrics[0];
    assert_eq!(f["name"], "training");
    assert_eq!(f["selectedNodes"], 4);
    assert_eq!(f["conflictingNodes"], 0);
    assert_eq!(
        f["regionsAllocated"], 6,
        "three 1Gi regions and one 3Gi window"
    );
    assert_eq!(f["valid"], true);

    let nodes: Vec<(&str, &str)> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["fabric"].as_str().unwrap()))
        .collect();
    assert_eq!(
        nodes,
        [
            ("dgx-a01", "training"),
            ("dgx-a02", "training"),
            ("dgx-b01", "training"),
            ("dgx-b02", "training")
        ]
    );
    assert!(
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n.get("conflictsWith").is_none())
    );

    let regions: Vec<(String, String, String, u64, u64, u64)> = v["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["namespace"].as_str().unwrap().to_string(),
                r["pod"].as_str().unwrap().to_string(),
                r["fabric"].as_str().unwrap().to_string(),
                r["id"].as_u64().unwrap(),
                r["base"].as_u64().unwrap(),
                r["size"].as_u64().unwrap(),
            )
        })
        .collect();
    let gi = 1u64 << 30;
    assert_eq!(
        regions,
        [
            (
                "default".into(),
                "trainer-0".into(),
                "training".into(),
                1,
                gi,
                gi
            ),
            (
                "default".into(),
                "trainer-1".into(),
                "training".into(),
                2,
                2 * gi,
                gi
            ),
            (
                "default".into(),
                "trainer-2".into(),
                "training".into(),
                3,
                3 * gi,
                3 * gi
            ),
            (
                "ml-eval".into(),
                "eval-0".into(),
                "training".into(),
                0,
                0,
                gi
            ),
        ],
        "the running eval pod is oldest and gets id 0; the 3Gi request gets three contiguous regions"
    );
}

const NODES: &str = "\
apiVersion: v1
kind: NodeList
items:
- apiVersion: v1
  kind: Node
  metadata: {name: gpu-1, labels: {gpu: h100, rack: a}}
- apiVersion: v1
  kind: Node
  metadata: {name: gpu-2, labels: {gpu: h100, rack: b}}
- apiVersion: v1
  kind: Node
  metadata: {name: cpu-1, labels: {rack: a}}
";

const FABRICS: &str = "\
apiVersion: rocefabric.io/v1alpha1
kind: RoceFabric
metadata: {name: gpus, creationTimestamp: \"2026-01-01T00:00:00Z\", generation: 1, uid: u1}
spec:
  nodeSelector: {matchLabels: {gpu: h100}}
---
apiVersion: rocefabric.io/v1alpha1
kind: RoceFabric
metadata: {name: rack-a}
spec:
  nodeSelector:
    matchExpressions:
    - {key: rack, operator: In, values: [a]}
---
";

#[test]
fn conflicts_name_the_younger_fabric_and_a_new_fabric_counts_as_youngest() {
    let dir = tempfile::tempdir().unwrap();
    let fabrics = write(&dir, "fabrics.yaml", FABRICS);
    let nodes = write(&dir, "nodes.yaml", NODES);
    let pods = write(&dir, "pods.yaml", "apiVersion: v1\nkind: List\nitems: []\n");
    let v = json(&["--fabrics", &fabrics, "--nodes", &nodes, "--pods", &pods]);
    let by_name = |n: &str| {
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_name("gpu-1")["fabric"], "gpus");
    assert_eq!(
        by_name("gpu-1")["conflictsWith"],
        serde_json::json!(["rack-a"])
    );
    assert_eq!(by_name("gpu-2")["fabric"], "gpus");
    assert!(by_name("gpu-2").get("conflictsWith").is_none());
    assert_eq!(by_name("cpu-1")["fabric"], "rack-a");
    let f = |n: &str| {
        v["fabrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        (
            f("gpus")["selectedNodes"].as_u64(),
            f("gpus")["conflictingNodes"].as_u64()
        ),
        (Some(2), Some(0))
    );
    assert_eq!(
        (
            f("rack-a")["selectedNodes"].as_u64(),
            f("rack-a")["conflictingNodes"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(v["regions"], serde_json::json!([]));
}

#[test]
fn an_invalid_fabric_is_listed_with_its_field_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fabrics = write(
        &dir,
        "fabric.yaml",
        "apiVersion: rocefabric.io/v1alpha1\nkind: RoceFabric\nmetadata: {name: bad}\nspec:\n  qos: {rocePriority: 5}\n",
    );
    let too_big = write(
        &dir,
        "fabric2.yaml",
        "apiVersion: rocefabric.io/v1alpha1\nkind: RoceFabric\nmetadata: {name: worse}\nspec:\n  qos: {roceDscp: 300}\n",
    );
    let nodes = write(&dir, "nodes.yaml", NODES);
    let pods = write(&dir, "pods.yaml", "");
    // The plan is printed, and the exit status says that a fabric is invalid.
    let out = run(&[
        "--fabrics",
        &fabrics,
        "--fabrics",
        &too_big,
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--output",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("2 of 2 fabrics invalid: bad, worse"),
        "{stderr}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fabrics = v["fabrics"].as_array().unwrap();
    assert_eq!(fabrics[0]["name"], "bad");
    assert_eq!(fabrics[0]["valid"], false);
    assert!(
        fabrics[0]["errors"][0]["field"]
            .as_str()
            .unwrap()
            .contains("rocePriority"),
        "{}",
        fabrics[0]
    );
    assert_eq!(fabrics[1]["name"], "worse");
    assert_eq!(fabrics[1]["valid"], false);
    assert!(
        fabrics[1]["errors"][0]["field"]
            .as_str()
            .unwrap()
            .contains("roceDscp"),
        "{}",
        fabrics[1]
    );
    assert!(
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["action"] == "untouched"),
        "nothing is written for an invalid fabric"
    );
}

#[test]
fn existing_roce_nodes_show_the_rollout_where_it_stands() {
    let dir = tempfile::tempdir().unwrap();
    let fabrics = write(&dir, "fabrics.yaml", FABRICS);
    let nodes = write(&dir, "nodes.yaml", NODES);
    let pods = write(&dir, "pods.yaml", "");
    let roce = write(
        &dir,
        "rocenodes.yaml",
        "apiVersion: rocefabric.io/v1alpha1\nkind: RoceNode\nmetadata: {name: gone, labels: {rocefabric.io/fabric: old}}\n\
         spec: {fabric: old, fabricGeneration: 1, qos: {}}\n",
    );
    let v = json(&[
        "--fabrics",
        &fabrics,
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--roce-nodes",
        &roce,
    ]);
    assert_eq!(v["deletedRoceNodes"], serde_json::json!(["gone"]));
    assert_eq!(v["writes"]["delete_roce_node"], 1);
}

#[test]
fn the_table_names_nodes_fabrics_and_regions() {
    let ex = examples();
    let out = run(&[
        "--fabrics",
        ex.join("rocefabric-dgx.yaml").to_str().unwrap(),
        "--nodes",
        ex.join("cluster-snapshot/nodes.yaml").to_str().unwrap(),
        "--pods",
        ex.join("cluster-snapshot/pods.yaml").to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "FABRIC",
        "training",
        "dgx-a01",
        "dgx-b02",
        "trainer-2",
        "3Gi",
        "eval-0",
    ] {
        assert!(text.contains(needle), "{needle} missing in:\n{text}");
    }
    assert!(!text.contains("jupyter"), "{text}");
}

#[test]
fn bad_files_are_named_with_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let fabrics = write(&dir, "fabrics.yaml", FABRICS);
    let nodes = write(&dir, "nodes.yaml", NODES);
    let broken = write(
        &dir,
        "broken.yaml",
        "apiVersion: v1\nkind: List\nitems: [\n",
    );
    let wrong = write(&dir, "wrong.yaml", NODES);
    let missing = dir
        .path()
        .join("missing.yaml")
        .to_str()
        .unwrap()
        .to_string();
    let no_kind = write(&dir, "nokind.yaml", "metadata: {name: x}\n");
    for (pods, expect) in [
        (&broken, "invalid YAML"),
        (&wrong, "expected Pod, found kind \"Node\""),
        (&missing, "cannot read"),
        (&no_kind, "no `kind`"),
    ] {
        let out = run(&[
            "--fabrics",
            &fabrics,
            "--nodes",
            &nodes,
            "--pods",
            pods,
            "--output",
            "json",
        ]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(pods.as_str()) && err.contains(expect),
            "{expect}: {err}"
        );
        assert!(out.stdout.is_empty());
    }
}

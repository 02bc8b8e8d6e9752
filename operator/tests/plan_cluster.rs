//! `plan --from-cluster` against the in-memory API server: the same plan as `plan` over the
//! same objects in files, read with list requests a page at a time; `--fabrics` files planned
//! as if applied over the cluster's fabrics.

use http::Method;
use rocefabric_operator::cli::plan::{self, PlanArgs};
use rocefabric_operator_testing::fake_cluster::FakeCluster;
use serde_json::{Value, json};

fn fabric(max_regions: u32) -> Value {
    json!({"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
           "metadata": {"name": "dgx", "uid": "uid-dgx", "generation": 1, "resourceVersion": "1",
                        "creationTimestamp": "2025-12-01T00:00:00Z"},
           "spec": {"nodeSelector": {"matchLabels": {"rdma": "true"}}, "rollout": {"maxUnavailable": "100%"},
                    "sharedMemory": {"regionSize": "1Gi", "maxRegions": max_regions,
                                     "maxRegionsPerNamespace": max_regions,
                                     "podSelector": {"matchLabels": {"app": "train"}}}}})
}

fn node(name: &str, rdma: bool) -> Value {
    let labels = if rdma {
        json!({"rdma": "true"})
    } else {
        json!({})
    };
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels, "resourceVersion": "1"}})
}

fn pod(name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"),
                        "labels": {"app": app}, "creationTimestamp": "2025-12-31T23:00:00Z",
                        "resourceVersion": "1"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}],
                    "schedulingGates": [{"name": "rocefabric.io/region"}]},
           "status": {"phase": "Pending"}})
}

fn nodes() -> Vec<Value> {
    vec![
        node("n1", true),
        node("n2", true),
        node("n3", true),
        node("n4", true),
        node("cp", false),
    ]
}

fn pods() -> Vec<Value> {
    vec![
        pod("w0", "train"),
        pod("w1", "train"),
        pod("w2", "train"),
        pod("web", "web"),
    ]
}

fn write(dir: &std::path::Path, name: &str, items: Vec<Value>) -> String {
    let path = dir.join(name);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    std::fs::write(&path, list.to_string()).expect("write");
    path.display().to_string()
}

fn args(argv: &[&str]) -> PlanArgs {
    PlanArgs::from_argv(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

/// `value` with every `lastTransitionTime` blanked.
fn without_clock(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "lastTransitionTime" {
                    *v = Value::Null;
                } else {
                    without_clock(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(without_clock),
        _ => {}
    }
}

fn fabric_report<'a>(out: &'a Value, name: &str) -> &'a Value {
    out["fabrics"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["name"] == name))
        .unwrap_or_else(|| panic!("no fabric {name}: {out}"))
}

#[tokio::test]
async fn the_cluster_plan_is_the_files_plan_read_a_page_at_a_time() {
    let mut objects = vec![fabric(8)];
    objects.extend(nodes());
    objects.extend(pods());
    let (client, fake) = FakeCluster::start(objects);
    let dir = tempfile::tempdir().expect("tempdir");
    let fabrics = write(dir.path(), "fabrics.json", vec![fabric(8)]);
    let nodes = write(dir.path(), "nodes.json", nodes());
    let pods = write(dir.path(), "pods.json", pods());

    let files = plan::plan_files(&args(&[
        "--fabrics",
        &fabrics,
        "--nodes",
        &nodes,
        "--pods",
        &pods,
        "--writes",
    ]))
    .expect("plan over files");
    let cluster = plan::plan_cluster(
        &client,
        &args(&["--from-cluster", "--page-size", "2", "--writes"]),
    )
    .await
    .expect("plan over the cluster");
    let mut files = serde_json::to_value(&files).expect("serializes");
    let mut cluster = serde_json::to_value(&cluster).expect("serializes");
    // Each plan stamps conditions with its own clock: the two may fall in different seconds.
    without_clock(&mut files);
    without_clock(&mut cluster);
    assert_eq!(cluster, files, "the same objects, the same plan");
    assert_eq!(fabric_report(&cluster, "dgx")["selectedNodes"], 4);

    // Read-only, lists of 2 objects at most, every page followed.
    let log = fake.log();
    assert!(
        log.iter()
            .all(|c| c.method == Method::GET
                && c.query.get("limit").map(String::as_str) == Some("2")),
        "{:?}",
        log.iter()
            .map(|c| (&c.method, &c.path, &c.query))
            .collect::<Vec<_>>()
    );
    let node_pages: Vec<_> = log.iter().filter(|c| c.path == "/api/v1/nodes").collect();
    assert_eq!(node_pages.len(), 3, "5 nodes in pages of 2");
    assert!(
        node_pages[1..]
            .iter()
            .all(|c| c.query.contains_key("continue"))
    );
    assert!(log.iter().any(|c| c.path == "/api/v1/configmaps"
        && c.query.get("labelSelector").map(String::as_str) == Some("rocefabric.io/fabric")));
}

#[tokio::test]
async fn proposed_fabrics_replace_the_clusters_as_kubectl_apply_would() {
    let mut objects = vec![fabric(8)];
    objects.extend(nodes());
    objects.extend(pods());
    let (client, _fake) = FakeCluster::start(objects);
    let dir = tempfile::tempdir().expect("tempdir");
    // The edit: a fabric of one region, without the server's metadata, as a user writes it.
    let mut edit = fabric(1);
    edit["metadata"] = json!({"name": "dgx"});
    let new = write(dir.path(), "new.json", vec![edit]);

    let now = plan::plan_cluster(&client, &args(&["--from-cluster"]))
        .await
        .expect("plan");
    let after = plan::plan_cluster(&client, &args(&["--from-cluster", "--fabrics", &new]))
        .await
        .expect("plan with the edit");
    let now = serde_json::to_value(&now).expect("serializes");
    let after = serde_json::to_value(&after).expect("serializes");
    assert_eq!(fabric_report(&now, "dgx")["podsWaiting"], 0, "{now}");
    let dgx = fabric_report(&after, "dgx");
    assert_eq!(dgx["regionCapacity"], 1, "{after}");
    assert_eq!(dgx["podsWaiting"], 2, "{after}");
    assert_eq!(
        after["fabrics"].as_array().map(Vec::len),
        Some(1),
        "replaced, not added"
    );
    assert!(
        after.get("notes").is_none(),
        "no object given twice: {after}"
    );
}

#[test]
fn from_cluster_takes_no_object_files_but_fabrics() {
    for (argv, why) in [
        (
            &["--from-cluster", "--nodes", "n.yaml"][..],
            "--nodes with --from-cluster",
        ),
        (
            &["--nodes", "n.yaml", "--pods", "p.yaml"][..],
            "--fabrics needed without it",
        ),
        (
            &["--from-cluster", "--page-size", "0"][..],
            "a page holds one object at least",
        ),
    ] {
        assert!(PlanArgs::from_argv(argv).is_err(), "{why}");
    }
    let a = args(&["--from-cluster"]);
    assert!(a.from_cluster && a.fabrics.is_empty());
    assert_eq!(a.page_size, 500);
}

/// kubectl runs `kubectl-rocefabric` on PATH for `kubectl rocefabric ...`: a link of that name to
/// the operator binary is the plugin.
#[test]
fn a_kubectl_rocefabric_link_is_the_plan_plugin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let link = dir.path().join("kubectl-rocefabric");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rocefabric-operator"), &link).expect("link");
    let help = std::process::Command::new(&link)
        .args(["plan", "--help"])
        .output()
        .expect("runs");
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--from-cluster"));

    // No kubeconfig: a one-line error, no plan.
    let out = std::process::Command::new(&link)
        .args(["plan", "--from-cluster"])
        .env("KUBECONFIG", dir.path().join("absent"))
        .env("HOME", dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no Kubernetes configuration found"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

//! The README demo's second step: `rocefabric-operator plan` over examples/rocefabric-dgx.yaml and
//! the cluster snapshot in examples/cluster-snapshot/ (as `kubectl get -o yaml` writes it). Checks
//! that the example data stays meaningful as the planner evolves: the four DGX nodes are selected
//! and the control-plane node is not; every fabric pod gets a non-overlapping region of the right
//! size; the notebook outside the fabric gets none.

use clap::Parser as _;
use rocefabric_e2e::workspace_root;
use rocefabric_operator::cli::{Cli, Command, plan};
use serde_json::Value;

fn plan_json() -> Value {
    let root = workspace_root();
    let file = |p: &str| root.join(p).display().to_string();
    let argv = [
        "rocefabric-operator".to_string(),
        "plan".into(),
        "--fabrics".into(),
        file("examples/rocefabric-dgx.yaml"),
        "--nodes".into(),
        file("examples/cluster-snapshot/nodes.yaml"),
        "--pods".into(),
        file("examples/cluster-snapshot/pods.yaml"),
        "--output".into(),
        "json".into(),
    ];
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let Command::Plan(args) = cli.command else {
        panic!("not a plan command: {argv:?}")
    };
    let out = plan::plan_files(&args).unwrap_or_else(|e| panic!("plan failed: {e:#}"));
    serde_json::to_value(&out).expect("the plan serializes")
}

#[test]
fn snapshot_files_are_lists_as_kubectl_writes_them() {
    for (file, kind, count) in [("nodes.yaml", "Node", 5), ("pods.yaml", "Pod", 5)] {
        let path = workspace_root()
            .join("examples/cluster-snapshot")
            .join(file);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let list: Value = yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(list["kind"], "List", "{file}");
        let items = list["items"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: no items"));
        assert_eq!(items.len(), count, "{file}");
        for item in items {
            assert_eq!(item["kind"], kind, "{file}");
            let typed: Result<Value, _> = match kind {
                "Node" => serde_json::from_value::<k8s_openapi::api::core::v1::Node>(item.clone())
                    .map(|_| Value::Null),
                _ => serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(item.clone())
                    .map(|_| Value::Null),
            };
            typed.unwrap_or_else(|e| {
                panic!(
                    "{file}: {} is not a valid {kind}: {e}",
                    item["metadata"]["name"]
                )
            });
        }
    }
}

#[test]
fn plan_over_the_snapshot_selects_the_dgx_nodes_and_assigns_regions() {
    let plan = plan_json();
    let fabric = &plan["fabrics"][0];
    assert_eq!(fabric["name"], "training");
    assert_eq!(fabric["valid"], true);
    assert_eq!(fabric["selectedNodes"], 4);
    assert_eq!(fabric["conflictingNodes"], 0);
    assert_eq!(fabric["trafficClass"], 106);

    let nodes: Vec<&str> = plan["nodes"]
        .as_array()
        .expect("nodes[]")
        .iter()
        .map(|n| n["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        nodes,
        ["dgx-a01", "dgx-a02", "dgx-b01", "dgx-b02"],
        "cp-01 is not a fabric node"
    );

    let gib = 1u64 << 30;
    let regions = plan["regions"].as_array().expect("regions[]");
    let mut windows: Vec<(u64, u64, String)> = Vec::new();
    for r in regions {
        assert_eq!(r["fabric"], "training");
        let pod = format!(
            "{}/{}",
            r["namespace"].as_str().unwrap_or_default(),
            r["pod"].as_str().unwrap_or_default()
        );
        let (base, size) = (
            r["base"].as_u64().expect("base"),
            r["size"].as_u64().expect("size"),
        );
        let want = if pod == "default/trainer-2" {
            3 * gib
        } else {
            gib
        };
        assert_eq!(
            size, want,
            "{pod}: regionSize 1Gi, or the 3Gi its annotation asks for"
        );
        windows.push((base, base + size, pod));
    }
    let mut pods: Vec<&str> = windows.iter().map(|w| w.2.as_str()).collect();
    pods.sort();
    assert_eq!(
        pods,
        [
            "default/trainer-0",
            "default/trainer-1",
            "default/trainer-2",
            "ml-eval/eval-0"
        ],
        "every fabric pod gets a region; notebooks/jupyter-alice does not"
    );
    windows.sort();
    for pair in windows.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "{} and {} overlap",
            pair[0].2,
            pair[1].2
        );
    }
    assert_eq!(
        fabric["regionsAllocated"], 6,
        "1 + 1 + 3 + 1 regions of 1Gi"
    );
}

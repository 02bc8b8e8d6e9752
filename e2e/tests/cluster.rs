//! Real-cluster end-to-end (kind or any cluster): install the chart, apply a fabric, check that
//! RoceNodes appear and the fabric reports status, run a pod that requests `rdma/hca` and one gated
//! for a region, and check the region annotation and the `<fabric>-regions` directory.
//!
//! Runs only when `KUBECONFIG` is set and the cluster answers; otherwise every test prints
//! `SKIPPED: cluster e2e (<reason>): <test>` and returns. Needs the images loaded into the cluster
//! (see e2e/README.md) and either a `helm` binary on PATH or the Helm engine of `.ci/helm-check`.
//! `ROCEFABRIC_E2E_VALUES` may name a values file (YAML or JSON) for the install (image names).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rocefabric_api::constants::{
    FABRIC_LABEL, HCA_RESOURCE, REGION_ANNOTATION, REGION_DIRECTORY_SUFFIX, REGION_SCHEDULING_GATE,
};
use rocefabric_api::{RoceFabric, RoceNode};
use rocefabric_e2e::helm::HelmEngine;
use rocefabric_e2e::{skip, workspace_root};
use rocefabric_operator::planner::directory::{self, DIRECTORY_KEY};
use rocefabric_operator::regions::RegionAssignment;
use serde_json::{Value, json};

const RELEASE: &str = "rocefabric-e2e";
const NAMESPACE: &str = "rocefabric-e2e";
const WORKLOAD_NAMESPACE: &str = "rocefabric-e2e-workload";
const FABRIC: &str = "e2e";
/// Label the suite puts on the nodes that run the node daemon; the test fabric selects it.
const NODE_LABEL: &str = "rocefabric.io/e2e";
const FIELD_MANAGER: &str = "rocefabric-e2e";
/// 1 MiB regions.
const REGION_SIZE: u64 = 1 << 20;
/// How long a reconcile, a rollout or a pod start may take on a small cluster.
const WAIT: Duration = Duration::from_secs(180);

/// What the shared setup found: the nodes of the test fabric.
#[derive(Debug, Clone)]
struct Setup {
    nodes: Vec<String>,
}

enum Outcome {
    Ready(Setup),
    Skip(String),
    Failed(String),
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The cluster, installed and with the test fabric applied, or `None` after printing the skip.
/// A cluster that answers but on which the install fails is a failure, not a skip.
fn cluster(test: &str) -> Option<(tokio::runtime::Runtime, Client, Setup)> {
    static SETUP: OnceLock<Outcome> = OnceLock::new();
    let outcome = SETUP.get_or_init(|| {
        if std::env::var_os("KUBECONFIG").is_none_or(|v| v.is_empty()) {
            return Outcome::Skip("KUBECONFIG not set".into());
        }
        let rt = runtime();
        rt.block_on(setup())
    });
    match outcome {
        Outcome::Skip(reason) => {
            skip("cluster e2e", reason, test);
            None
        }
        Outcome::Failed(error) => panic!("{test}: cluster setup failed: {error}"),
        Outcome::Ready(setup) => {
            let rt = runtime();
            let client = rt.block_on(Client::try_default()).expect("kube client");
            Some((rt, client, setup.clone()))
        }
    }
}

async fn setup() -> Outcome {
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => return Outcome::Skip(format!("no usable kubeconfig: {e}")),
    };
    match tokio::time::timeout(Duration::from_secs(15), client.apiserver_version()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            return Outcome::Skip(format!("the cluster at KUBECONFIG does not answer: {e}"));
        }
        Err(_) => {
            return Outcome::Skip("the cluster at KUBECONFIG does not answer within 15s".into());
        }
    }
    if let Err(e) = install_chart() {
        return Outcome::Failed(e);
    }
    match label_nodes_and_apply_fabric(&client).await {
        Ok(setup) => Outcome::Ready(setup),
        Err(e) => Outcome::Failed(e),
    }
}

/// `helm upgrade --install` with the `helm` binary when there is one, else with the Helm engine.
fn install_chart() -> Result<(), String> {
    let chart = workspace_root().join("charts/rocefabric");
    let values_file = std::env::var_os("ROCEFABRIC_E2E_VALUES").map(PathBuf::from);
    let has_helm = Command::new("helm")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_helm {
        let mut cmd = Command::new("helm");
        cmd.args(["upgrade", "--install", RELEASE])
            .arg(&chart)
            .args([
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "--wait",
                "--timeout",
                "5m",
            ]);
        if let Some(file) = &values_file {
            cmd.arg("--values").arg(file);
        }
        let out = cmd.output().map_err(|e| format!("helm: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "helm upgrade --install failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        return Ok(());
    }
    let engine = HelmEngine::locate().map_err(|e| e.to_string())?;
    let values = match &values_file {
        Some(file) => {
            let text =
                std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
            yaml_serde::from_str::<Value>(&text).map_err(|e| format!("{}: {e}", file.display()))?
        }
        None => Value::Null,
    };
    engine
        .install(&chart, &values, RELEASE, NAMESPACE, 300)
        .map(drop)
        .map_err(|e| e.to_string())
}

async fn label_nodes_and_apply_fabric(client: &Client) -> Result<Setup, String> {
    // The fabric's nodes: those where the node daemon runs.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=node");
    let daemon_pods = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("list node daemon pods: {e}"))?;
    let mut nodes: Vec<String> = daemon_pods
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    if nodes.is_empty() {
        return Err("the node daemon runs on no node (taints? set node.tolerations)".into());
    }
    let node_api: Api<Node> = Api::all(client.clone());
    for node in &nodes {
        let patch = json!({"metadata": {"labels": {NODE_LABEL: "true"}}});
        node_api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("label node {node}: {e}"))?;
    }
    let fabric = test_fabric()?;
    let fabrics: Api<RoceFabric> = Api::all(client.clone());
    fabrics
        .patch(
            FABRIC,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&fabric),
        )
        .await
        .map_err(|e| format!("apply RoceFabric {FABRIC}: {e}"))?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOAD_NAMESPACE}});
    namespaces
        .patch(
            WORKLOAD_NAMESPACE,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&ns),
        )
        .await
        .map_err(|e| format!("namespace {WORKLOAD_NAMESPACE}: {e}"))?;
    Ok(Setup { nodes })
}

/// The suite's fabric: the nodes labelled `rocefabric.io/e2e=true`, default QoS with MTU 4200, 1 MiB
/// regions for pods labelled `rocefabric.io/fabric: e2e`.
fn test_fabric_value() -> Value {
    json!({
        "apiVersion": "rocefabric.io/v1alpha1",
        "kind": "RoceFabric",
        "metadata": {"name": FABRIC},
        "spec": {
            "nodeSelector": {"matchLabels": {NODE_LABEL: "true"}},
            "qos": {"mtu": 4200},
            "sharedMemory": {
                "regionSize": "1Mi",
                "maxRegions": 64,
                "podSelector": {"matchLabels": {FABRIC_LABEL: FABRIC}}
            },
            "rollout": {"maxUnavailable": "100%"}
        }
    })
}

fn test_fabric() -> Result<RoceFabric, String> {
    let value = test_fabric_value();
    rocefabric_api::validate::fabric_value(&value)
        .map_err(|e| format!("the test fabric is invalid: {e}"))?;
    serde_json::from_value(value)
        .map_err(|e| format!("the test fabric does not fit RoceFabric: {e}"))
}

/// Runs everywhere: the fabric the suite applies passes the CRD's schema and CEL rules, so a
/// cluster run cannot fail on its own test data.
#[test]
fn the_suite_fabric_is_valid() {
    let fabric = test_fabric().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fabric.spec.qos.mtu, 4200);
}

/// Poll `probe` every second until it returns `Some`, at most `WAIT`; the last state in the panic.
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(state) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not within {WAIT:?}; last state: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

#[test]
fn chart_installs_crds_operator_and_node_daemon() {
    let Some((rt, client, setup)) = cluster("chart_installs_crds_operator_and_node_daemon") else {
        return;
    };
    rt.block_on(async {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for name in ["rocefabrics.rocefabric.io", "rocenodes.rocefabric.io"] {
            let crd = crds
                .get(name)
                .await
                .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
            assert_eq!(
                crd.annotations()
                    .get("helm.sh/resource-policy")
                    .map(String::as_str),
                Some("keep"),
                "{name} is kept on uninstall"
            );
        }
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
        let name = format!("{RELEASE}-operator");
        eventually("operator Deployment available", || async {
            let d = deployments.get(&name).await.map_err(|e| e.to_string())?;
            let available = d
                .status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0);
            if available >= 1 {
                Ok(())
            } else {
                Err(format!("{:?}", d.status))
            }
        })
        .await;
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
        let name = format!("{RELEASE}-node");
        eventually("node DaemonSet ready on every node it targets", || async {
            let d = daemonsets.get(&name).await.map_err(|e| e.to_string())?;
            let s = d.status.clone().unwrap_or_default();
            if s.desired_number_scheduled > 0 && s.number_ready == s.desired_number_scheduled {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        })
        .await;
        assert!(!setup.nodes.is_empty());
    });
}

#[test]
fn fabric_creates_rocenodes_and_reports_status() {
    let Some((rt, client, setup)) = cluster("fabric_creates_rocenodes_and_reports_status") else {
        return;
    };
    rt.block_on(async {
        let roce_nodes: Api<RoceNode> = Api::all(client.clone());
        let fabrics: Api<RoceFabric> = Api::all(client.clone());
        let fabric = fabrics.get(FABRIC).await.expect("the test fabric");
        let uid = fabric.uid().expect("fabric uid");
        for node in &setup.nodes {
            let rn = eventually(&format!("RoceNode {node}"), || async {
                roce_nodes
                    .get_opt(node)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("absent".to_string())
            })
            .await;
            assert_eq!(rn.spec.fabric, FABRIC, "RoceNode {node} spec.fabric");
            assert_eq!(
                rn.spec.qos.mtu, 4200,
                "RoceNode {node} carries the rendered QoS"
            );
            assert!(
                rn.owner_references()
                    .iter()
                    .any(|o| o.uid == uid && o.kind == "RoceFabric"),
                "RoceNode {node} is owned by the fabric (deleting the fabric cleans it up)"
            );
            // The node agent reports: status with the QosApplied condition, whatever its value on
            // this cluster's NICs.
            eventually(
                &format!("RoceNode {node} status from the agent"),
                || async {
                    let rn = roce_nodes.get(node).await.map_err(|e| e.to_string())?;
                    let status = rn.status.clone().unwrap_or_default();
                    if status.conditions.iter().any(|c| c.type_ == "QosApplied") {
                        Ok(())
                    } else {
                        Err(format!("{status:?}"))
                    }
                },
            )
            .await;
        }
        let expected = setup.nodes.len() as u32;
        let status = eventually("fabric status", || async {
            let f = fabrics.get(FABRIC).await.map_err(|e| e.to_string())?;
            let status = f.status.clone().unwrap_or_default();
            let current = status.observed_generation == f.metadata.generation;
            if current && status.nodes.selected == expected && !status.conditions.is_empty() {
                Ok(status)
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await;
        assert_eq!(status.traffic_class, Some(106), "DSCP 26 -> ToS 106");
        let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert!(types.contains(&"Ready"), "conditions {types:?}");
        assert_eq!(status.regions.capacity, 64, "regions capacity = maxRegions");
    });
}

#[test]
fn pod_requesting_rdma_hca_gets_its_devices_and_environment() {
    const TEST: &str = "pod_requesting_rdma_hca_gets_its_devices_and_environment";
    let Some((rt, client, _setup)) = cluster(TEST) else {
        return;
    };
    rt.block_on(async {
        let nodes: Api<Node> = Api::all(client.clone());
        let list = nodes
            .list(&ListParams::default().labels(&format!("{NODE_LABEL}=true")))
            .await
            .expect("nodes");
        let advertising = list.items.iter().any(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(HCA_RESOURCE))
                .is_some_and(|q| q.0 != "0")
        });
        if !advertising {
            skip(
                "cluster e2e",
                "no node of this cluster advertises rdma/hca (no RoCE HCA)",
                TEST,
            );
            return;
        }
        let image =
            std::env::var("ROCEFABRIC_E2E_POD_IMAGE").unwrap_or_else(|_| "busybox:1.36".into());
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let name = "rdma-hca-probe";
        let _ = pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
        eventually("old probe pod gone", || async {
            match pods.get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            }
        })
        .await;
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
            "spec": {
                "restartPolicy": "Never",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                "containers": [{
                    "name": "probe", "image": image,
                    "command": ["sh", "-c", "env; ls /dev/infiniband"],
                    "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                    "resources": {"limits": {HCA_RESOURCE: "1"}}
                }]
            }
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create the rdma/hca pod");
        eventually("rdma/hca pod completes", || async {
            let p = pods.get(name).await.map_err(|e| e.to_string())?;
            match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Succeeded") => Ok(()),
                Some("Failed") => panic!("the rdma/hca pod failed: {:?}", p.status),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        let logs = pods
            .logs(name, &Default::default())
            .await
            .expect("pod logs");
        let env: BTreeMap<&str, &str> = logs.lines().filter_map(|l| l.split_once('=')).collect();
        let hca = env.get("NCCL_IB_HCA").copied().unwrap_or_default();
        assert!(
            hca.starts_with('=') && hca.contains(":1"),
            "NCCL_IB_HCA exact-match form: {hca:?}\n{logs}"
        );
        assert!(env.contains_key("UCX_NET_DEVICES"), "{logs}");
        assert!(env.contains_key("PCIDEVICE_RDMA_HCA"), "{logs}");
        assert!(
            logs.contains("uverbs") && logs.contains("rdma_cm"),
            "device nodes in the container:\n{logs}"
        );
        let _ = pods.delete(name, &DeleteParams::default()).await;
    });
}

#[test]
fn gated_pod_gets_a_region_annotation_and_a_directory_entry() {
    const TEST: &str = "gated_pod_gets_a_region_annotation_and_a_directory_entry";
    let Some((rt, client, _setup)) = cluster(TEST) else {
        return;
    };
    rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let name = "region-probe";
        let _ = pods.delete(name, &DeleteParams::default().grace_period(0)).await;
        eventually("old region pod gone", || async {
            match pods.get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            }
        })
        .await;
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE, "labels": {FABRIC_LABEL: FABRIC}},
            "spec": {
                "schedulingGates": [{"name": REGION_SCHEDULING_GATE}],
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]
            }
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod).await.expect("create the gated pod");

        // The operator writes the annotation, then removes the gate.
        let region = eventually("region annotation written and gate removed", || async {
            let p = pods.get(name).await.map_err(|e| e.to_string())?;
            let annotation = p.annotations().get(REGION_ANNOTATION).cloned();
            let gated = p.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| !g.is_empty());
            match annotation {
                Some(text) if !gated => RegionAssignment::parse(&text).map_err(|e| e.to_string()),
                other => Err(format!("annotation {other:?}, gated {gated}")),
            }
        })
        .await;
        assert_eq!(region.fabric, FABRIC);
        assert_eq!(region.size, REGION_SIZE, "one region of regionSize");
        assert_eq!(region.base % REGION_SIZE, 0, "windows are region-aligned");

        // The namespace's directory lists it.
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let directory_name = format!("{FABRIC}{REGION_DIRECTORY_SUFFIX}");
        let entry = eventually("directory entry", || async {
            let cm = configmaps.get(&directory_name).await.map_err(|e| e.to_string())?;
            let text = cm.data.as_ref().and_then(|d| d.get(DIRECTORY_KEY)).cloned().unwrap_or_default();
            let entries = directory::parse(&text).ok_or(format!("not a directory: {text}"))?;
            entries.into_iter().find(|e| e.pod == name).ok_or(format!("{name} not listed: {text}"))
        })
        .await;
        assert_eq!((entry.id, entry.base, entry.size), (region.id, region.base, region.size));

        // Deleting the pod frees its region: the directory drops it.
        pods.delete(name, &DeleteParams::default().grace_period(0)).await.expect("delete");
        eventually("directory entry removed", || async {
            let Some(cm) = configmaps.get_opt(&directory_name).await.map_err(|e| e.to_string())? else {
                return Ok(());
            };
            let text = cm.data.as_ref().and_then(|d| d.get(DIRECTORY_KEY)).cloned().unwrap_or_default();
            match directory::parse(&text) {
                Some(entries) if entries.iter().all(|e| e.pod != name) => Ok(()),
                _ => Err(text),
            }
        })
        .await;
    });
}

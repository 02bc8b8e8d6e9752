//! The cluster suite: the chart, the operator and the node daemon on a real Kubernetes cluster.
//!
//! Meant for the local cluster of `e2e/cluster/up` (a control plane and kubelet built from source,
//! containerd, a node with a DGX H100 fixture): `KUBECONFIG=/var/lib/rocefabric-e2e/kubeconfig cargo test
//! -p rocefabric-e2e --test cluster` (the tests take turns on the one cluster, whatever
//! `--test-threads` says). Against another cluster the tests that
//! need the local node's fixture report themselves skipped by name. Without `KUBECONFIG` every test
//! prints `SKIPPED: cluster e2e (<reason>): <test>`; with `ROCEFABRIC_REQUIRE_CLUSTER=1` (CI) any
//! skip is a failure.
//!
//! The setup, shared by every test and done once per process: write the node's fixture, `helm
//! upgrade --install` the chart as release `rocefabric-e2e` (operator with two replicas), label the
//! nodes running the node daemon `rocefabric.io/e2e=true`, and apply fabric `e2e` on them.

mod api;
mod devices;
mod dra;
mod dra_ledger;
mod dra_owners;
mod lifecycle;
mod monitoring;
mod operator;
mod plan;
mod rbac;
mod regions;
mod tenant;
mod tenant_memory;
mod tenant_regions;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rocefabric_api::constants::FABRIC_LABEL;
use rocefabric_api::{RoceFabric, RoceNode};
use rocefabric_e2e::bounded::{CALL_LIMIT, OutputWithin as _};
use rocefabric_e2e::cluster::{self, FABRIC_NETDEVS, LocalCluster};
use rocefabric_e2e::helm::HelmEngine;
use rocefabric_e2e::{skip, workspace_root};
use serde_json::{Value, json};

pub const RELEASE: &str = "rocefabric-e2e";
pub const NAMESPACE: &str = "rocefabric-e2e";
pub const WORKLOAD_NAMESPACE: &str = "rocefabric-e2e-workload";
pub const FABRIC: &str = "e2e";
/// Label the suite puts on the nodes that run the node daemon; the test fabric selects it.
pub const NODE_LABEL: &str = "rocefabric.io/e2e";
pub const FIELD_MANAGER: &str = "rocefabric-e2e";
/// 1 MiB regions.
pub const REGION_SIZE: u64 = 1 << 20;
/// How long a reconcile, a rollout or a pod start may take on a small cluster.
pub const WAIT: Duration = Duration::from_secs(180);

/// What the shared setup found.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Nodes of the test fabric (those running the node daemon).
    pub nodes: Vec<String>,
    /// The local cluster of `e2e/cluster/up`, when that is the cluster.
    pub local: Option<LocalCluster>,
}

enum Outcome {
    Ready(Box<Setup>),
    Skip(String),
    Failed(String),
}

pub struct Ctx {
    pub rt: tokio::runtime::Runtime,
    pub client: Client,
    pub setup: Setup,
    /// Held for the whole test: the tests share one cluster (and some reinstall the chart or
    /// restart the kubelet), so they run one at a time whatever `--test-threads` says.
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A failed test poisons the lock; the next test still runs.
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Report a skip, or fail when the suite is required (`ROCEFABRIC_REQUIRE_CLUSTER`).
pub fn skip_or_fail(reason: &str, test: &str) {
    if cluster::required() {
        panic!(
            "{test}: skipped although {} is set: {reason}",
            cluster::REQUIRE_ENV
        );
    }
    skip("cluster e2e", reason, test);
}

/// The cluster, installed and with the test fabric applied, or `None` after reporting the skip.
/// A cluster that answers but on which the install fails is a failure, not a skip.
pub fn cluster(test: &str) -> Option<Ctx> {
    static SETUP: OnceLock<Outcome> = OnceLock::new();
    let serial = serial();
    let outcome = SETUP.get_or_init(|| {
        if std::env::var_os("KUBECONFIG").is_none_or(|v| v.is_empty()) {
            return Outcome::Skip("KUBECONFIG not set".into());
        }
        runtime().block_on(setup())
    });
    match outcome {
        Outcome::Skip(reason) => {
            skip_or_fail(reason, test);
            None
        }
        Outcome::Failed(error) => panic!("{test}: cluster setup failed: {error}"),
        Outcome::Ready(setup) => {
            let rt = runtime();
            let client = rt.block_on(Client::try_default()).expect("kube client");
            Some(Ctx {
                rt,
                client,
                setup: Setup::clone(setup),
                _serial: serial,
            })
        }
    }
}

/// The cluster and the local node of `e2e/cluster/up`, or `None` after reporting the skip.
pub fn local_cluster(test: &str) -> Option<(Ctx, LocalCluster)> {
    let ctx = cluster(test)?;
    match ctx.setup.local.clone() {
        Some(local) => Some((ctx, local)),
        None => {
            skip_or_fail(
                "not the local cluster of e2e/cluster/up (no cluster.env beside KUBECONFIG)",
                test,
            );
            None
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
    let local = match std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .and_then(|k| LocalCluster::beside(&k))
    {
        None => None,
        Some(Ok(local)) => Some(local),
        Some(Err(e)) => return Outcome::Failed(e),
    };
    if let Some(local) = &local
        && let Err(e) = cluster::prepare_node(local)
    {
        return Outcome::Failed(format!("preparing the node's fixture: {e}"));
    }
    if let Err(e) = install_chart(local.as_ref(), &Value::Null) {
        return Outcome::Failed(e);
    }
    match label_nodes_and_apply_fabric(&client, local.is_some()).await {
        Ok(nodes) => Outcome::Ready(Box::new(Setup { nodes, local })),
        Err(e) => Outcome::Failed(e),
    }
}

/// The release's values: the local node's paths (when local), two operator replicas, and `extra`
/// merged over them.
pub fn release_values(local: Option<&LocalCluster>, extra: &Value) -> Value {
    let mut values = match local {
        Some(local) => local.chart_values(),
        None => match std::env::var_os("ROCEFABRIC_E2E_VALUES") {
            Some(file) => {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                yaml_serde::from_str::<Value>(&text).unwrap_or(Value::Null)
            }
            None => json!({}),
        },
    };
    merge(&mut values, &json!({"operator": {"replicas": 2}}));
    merge(&mut values, extra);
    values
}

fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        // Null in `from` leaves the value as it is.
        (_, Value::Null) => {}
        (slot, v) => *slot = v.clone(),
    }
}

/// `helm upgrade --install --wait` of `charts/rocefabric`: the local cluster's `helm`, else `helm`
/// on PATH, else the Helm engine of `.ci/helm-check`.
pub fn install_chart(local: Option<&LocalCluster>, extra: &Value) -> Result<(), String> {
    let chart = workspace_root().join("charts/rocefabric");
    let values = release_values(local, extra);
    let values_file =
        std::env::temp_dir().join(format!("rocefabric-e2e-values-{}.json", std::process::id()));
    std::fs::write(&values_file, values.to_string()).map_err(|e| e.to_string())?;
    let helm = match local {
        Some(local) => Some(local.helm()),
        None => Command::new("helm")
            .arg("version")
            .output_within(CALL_LIMIT)
            .is_ok_and(|o| o.status.success())
            .then(|| Command::new("helm")),
    };
    if let Some(mut helm) = helm {
        let out = helm
            .args(["upgrade", "--install", RELEASE])
            .arg(&chart)
            .args([
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "--wait",
                "--timeout",
                "5m",
            ])
            .arg("--values")
            .arg(&values_file)
            .output_within(CALL_LIMIT)
            .map_err(|e| format!("helm: {e}"))?;
        return cluster::check(&out, "helm upgrade --install");
    }
    let engine = HelmEngine::locate().map_err(|e| e.to_string())?;
    engine
        .install(&chart, &values, RELEASE, NAMESPACE, 300)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// `helm` (or the engine) with the release's arguments: `uninstall`.
pub fn uninstall_chart(local: Option<&LocalCluster>) -> Result<(), String> {
    match local {
        Some(local) => {
            let out = local
                .helm()
                .args([
                    "uninstall",
                    RELEASE,
                    "--namespace",
                    NAMESPACE,
                    "--wait",
                    "--timeout",
                    "3m",
                ])
                .output_within(CALL_LIMIT)
                .map_err(|e| format!("helm: {e}"))?;
            cluster::check(&out, "helm uninstall")
        }
        None => {
            let out = Command::new("helm")
                .args(["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"])
                .output_within(CALL_LIMIT)
                .map_err(|e| format!("helm: {e}"))?;
            cluster::check(&out, "helm uninstall")
        }
    }
}

async fn label_nodes_and_apply_fabric(client: &Client, local: bool) -> Result<Vec<String>, String> {
    let nodes = daemon_nodes(client).await?;
    let node_api: Api<Node> = Api::all(client.clone());
    for node in &nodes {
        let patch = json!({"metadata": {"labels": {NODE_LABEL: "true"}}});
        node_api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("label node {node}: {e}"))?;
    }
    apply_value(client, &test_fabric_value(local)).await?;
    let ns =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOAD_NAMESPACE}});
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            WORKLOAD_NAMESPACE,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&ns),
        )
        .await
        .map_err(|e| format!("namespace {WORKLOAD_NAMESPACE}: {e}"))?;
    Ok(nodes)
}

/// The user and groups the API server gives ServiceAccount `name` of `namespace` (what its token
/// authenticates as), for impersonation and SubjectAccessReviews.
pub fn service_account_identity(namespace: &str, name: &str) -> (String, Vec<String>) {
    (
        format!("system:serviceaccount:{namespace}:{name}"),
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".into(),
        ],
    )
}

/// Nodes where a node daemon pod of the release runs.
pub async fn daemon_nodes(client: &Client) -> Result<Vec<String>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let daemon_pods = pods
        .list(&ListParams::default().labels(&node_daemon_selector()))
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
    Ok(nodes)
}

pub fn node_daemon_selector() -> String {
    format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=node")
}

pub fn operator_selector() -> String {
    format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator")
}

/// Server-side apply of a RoceFabric given as JSON, after checking it client-side.
pub async fn apply_value(client: &Client, value: &Value) -> Result<RoceFabric, String> {
    rocefabric_api::validate::fabric_value(value)
        .map_err(|e| format!("the test fabric is invalid: {e}"))?;
    let fabric: RoceFabric = serde_json::from_value(value.clone())
        .map_err(|e| format!("the test fabric does not fit RoceFabric: {e}"))?;
    let fabrics: Api<RoceFabric> = Api::all(client.clone());
    fabrics
        .patch(
            &fabric.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&fabric),
        )
        .await
        .map_err(|e| format!("apply RoceFabric {}: {e}", fabric.name_any()))
}

/// The suite's fabric: the nodes labelled `rocefabric.io/e2e=true` and, on the local cluster, the
/// two NICs backed by host veths; default QoS with MTU 4200; 1 MiB regions for pods labelled
/// `rocefabric.io/fabric: e2e`.
pub fn test_fabric_value(local: bool) -> Value {
    let nic_selector = if local {
        json!({"netdevs": FABRIC_NETDEVS.iter().map(|(_, host)| *host).collect::<Vec<_>>()})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "rocefabric.io/v1alpha1",
        "kind": "RoceFabric",
        "metadata": {"name": FABRIC},
        "spec": {
            "nodeSelector": {"matchLabels": {NODE_LABEL: "true"}},
            "nicSelector": nic_selector,
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

/// Runs everywhere: the fabrics the suite applies pass the CRD's schema and CEL rules, so a
/// cluster run cannot fail on its own test data.
#[test]
fn the_suite_fabrics_are_valid() {
    for local in [false, true] {
        rocefabric_api::validate::fabric_value(&test_fabric_value(local))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Poll `probe` every second until it returns `Ok`, at most `WAIT`; the last state in the panic.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let wait = WAIT;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(state) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not within {wait:?}; last state: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Delete a pod (no grace) and wait until it is gone.
pub async fn delete_pod(pods: &Api<Pod>, name: &str) {
    let _ = pods
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
    eventually(&format!("pod {name} gone"), || async {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
}

/// Create a pod from JSON (deleting an old one of the same name first).
pub async fn create_pod(pods: &Api<Pod>, pod: Value) -> Pod {
    let pod: Pod = serde_json::from_value(pod).expect("a pod");
    delete_pod(pods, &pod.name_any()).await;
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create pod {}: {e}", pod.name_any()))
}

/// Wait until a pod is Running (panics when it fails).
pub async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    eventually(&format!("pod {name} running"), || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Running") => Ok(p),
            Some("Failed") | Some("Succeeded") => panic!("pod {name} ended: {:?}", p.status),
            other => Err(format!(
                "{other:?} {:?}",
                p.status.as_ref().map(|s| &s.conditions)
            )),
        }
    })
    .await
}

/// The container logs of a pod, once they contain `marker`.
pub async fn logs_with(pods: &Api<Pod>, name: &str, marker: &str) -> String {
    container_logs_with(pods, name, None, marker).await
}

/// The logs of one container of a pod (its default container when `None`), once they contain
/// `marker`.
pub async fn container_logs_with(
    pods: &Api<Pod>,
    name: &str,
    container: Option<&str>,
    marker: &str,
) -> String {
    let params = kube::api::LogParams {
        container: container.map(String::from),
        ..Default::default()
    };
    eventually(
        &format!("pod {name} {container:?} logs with {marker:?}"),
        || async {
            let logs = pods.logs(name, &params).await.map_err(|e| e.to_string())?;
            if logs.contains(marker) {
                Ok(logs)
            } else {
                Err(logs)
            }
        },
    )
    .await
}

/// The operator Deployment and the node DaemonSet are ready.
pub async fn release_ready(client: &Client) {
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
        let current = s.observed_generation == d.metadata.generation;
        if current
            && s.desired_number_scheduled > 0
            && s.number_ready == s.desired_number_scheduled
            && s.updated_number_scheduled == Some(s.desired_number_scheduled)
        {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await;
}

/// The RoceNode of `node`, once it exists.
pub async fn roce_node(client: &Client, node: &str) -> RoceNode {
    let roce_nodes: Api<RoceNode> = Api::all(client.clone());
    eventually(&format!("RoceNode {node}"), || async {
        roce_nodes
            .get_opt(node)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("absent".to_string())
    })
    .await
}

/// A `kubectl` of the local cluster, else the one on PATH, with `args`; stdout on success.
pub fn kubectl(local: Option<&LocalCluster>, args: &[&str]) -> Result<String, String> {
    let mut cmd = match local {
        Some(local) => local.kubectl(),
        None => Command::new("kubectl"),
    };
    let out = cmd
        .args(args)
        .output_within(CALL_LIMIT)
        .map_err(|e| format!("kubectl: {e}"))?;
    cluster::check(&out, &format!("kubectl {}", args.join(" ")))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Path of a generated CRD file.
pub fn crd_file(name: &str) -> PathBuf {
    workspace_root().join("crds").join(format!("{name}.yaml"))
}

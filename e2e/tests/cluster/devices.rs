//! The node daemon registered with the real kubelet of the local cluster, over the node's DGX H100
//! fixture: capacity and allocatable as the fixture implies (the QoS gate holding the fabric's NICs,
//! whose veths have no DCB), a pod granted `rdma/hca: 2` with exactly the right device nodes and
//! environment, a port going down, a kubelet restart and a daemon pod restart; with `gpuHca` on,
//! the rails and their GPUs served by `rdma/gpu-hca` alone, never also by `rdma/hca`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use rocefabric_api::NicSelector;
use rocefabric_api::constants::{DEFAULT_GPU_RESOURCE, GPU_HCA_RESOURCE, HCA_RESOURCE};
use rocefabric_e2e::bounded::{CALL_LIMIT, OutputWithin as _};
use rocefabric_e2e::cluster::{FABRIC_NETDEVS, LocalCluster, fixture_node};
use rocefabric_node_model::allocation::{self, ResourceKind};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::inventory;
use rocefabric_node_model::model::Inventory;
use rocefabric_node_testing::fixtures;
use serde_json::json;

use crate::{
    NAMESPACE, WORKLOAD_NAMESPACE, create_pod, delete_pod, eventually, install_chart,
    local_cluster, logs_with, node_daemon_selector, running,
};

/// What the fixture implies, computed by the daemon's own discovery over the same tree.
pub(crate) fn fixture_inventory() -> Inventory {
    let dir = fixtures::tempdir().expect("temp dir");
    fixture_node().write_to(dir.path()).expect("fixture");
    inventory::discover(dir.path(), &NicSelector::default()).expect("discovery")
}

/// `(capacity, allocatable)` of `kind` under the chart's default config (the daemon's): every
/// device it lists, minus those with a gated HCA behind them (`<hca>#k`, `<gpu>_<hca>`).
fn counts(inv: &Inventory, kind: ResourceKind, gated: &BTreeSet<String>) -> (i64, i64) {
    counts_with(inv, kind, gated, &Config::default())
}

/// [`counts`] under `config`.
fn counts_with(
    inv: &Inventory,
    kind: ResourceKind,
    gated: &BTreeSet<String>,
    config: &Config,
) -> (i64, i64) {
    let listed = allocation::advertised(kind, inv, config);
    let held = listed
        .iter()
        .filter(|d| d.id.split(['#', '_']).any(|part| gated.contains(part)))
        .count();
    (listed.len() as i64, (listed.len() - held) as i64)
}

/// `(capacity, allocatable)` of `resource` on `node`.
async fn resource_counts(
    client: &Client,
    node: &str,
    resource: &str,
) -> Result<(i64, i64), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await.map_err(|e| e.to_string())?;
    let status = n.status.unwrap_or_default();
    let read =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.and_then(|m| m.get(resource))
                .and_then(|q| q.0.parse::<i64>().ok())
                .unwrap_or(0)
        };
    Ok((
        read(status.capacity.as_ref()),
        read(status.allocatable.as_ref()),
    ))
}

/// Wait until `node`'s allocatable `resource` is `want`, whatever its capacity.
pub(crate) async fn wait_allocatable(client: &Client, node: &str, resource: &str, want: i64) {
    eventually(&format!("{resource} allocatable {want}"), || async {
        let (_, got) = resource_counts(client, node, resource).await?;
        (got == want).then_some(()).ok_or(got.to_string())
    })
    .await;
}

async fn wait_counts(client: &Client, node: &str, resource: &str, want: (i64, i64), what: &str) {
    eventually(
        &format!("{what}: {resource} capacity/allocatable {want:?}"),
        || async {
            let got = resource_counts(client, node, resource).await?;
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
}

/// The node's resources as the fixture implies them while the QoS gate holds some HCAs:
/// `(capacity, allocatable)` of each.
struct Expected {
    hcas: (i64, i64),
    gpus: (i64, i64),
    rails: (i64, i64),
}

impl Expected {
    /// Capacity and allocatable of all three resources, as the kubelet reports them (a resource
    /// the config leaves off is not registered: 0 and 0).
    async fn wait(&self, client: &Client, node: &str, what: &str) {
        wait_counts(client, node, HCA_RESOURCE, self.hcas, what).await;
        wait_counts(client, node, DEFAULT_GPU_RESOURCE, self.gpus, what).await;
        wait_counts(client, node, GPU_HCA_RESOURCE, self.rails, what).await;
    }
}

/// HCAs behind the fabric's NICs: the QoS gate keeps them unhealthy, since a veth has no DCB and
/// the agent reports lossless QoS not applied.
fn gated_hcas(inv: &Inventory) -> BTreeSet<String> {
    inv.hcas
        .iter()
        .filter(|h| {
            FABRIC_NETDEVS
                .iter()
                .any(|(_, host)| h.netdev.as_deref() == Some(host))
        })
        .map(|h| h.id.clone())
        .collect()
}

/// A pod asking for `count` HCAs; its container prints its environment and device nodes, then
/// sleeps so its allocation stays held.
pub(crate) fn hca_pod(name: &str, image: &str, count: u32) -> serde_json::Value {
    pod_asking(name, image, HCA_RESOURCE, count)
}

/// A pod asking for `count` of `resource`, printing like [`hca_pod`]'s.
fn pod_asking(name: &str, image: &str, resource: &str, count: u32) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{
                "name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "env; for d in /dev/infiniband/*; do echo dev=$d; done; echo done; exec sleep 3600"],
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                "resources": {"limits": {resource: count.to_string()}}
            }]
        }
    })
}

/// What a container holding HCAs saw: its environment and its `/dev/infiniband` entries.
pub(crate) struct Granted {
    pub env: BTreeMap<String, String>,
    pub devices: BTreeSet<String>,
}

impl Granted {
    pub fn parse(logs: &str) -> Granted {
        let mut env = BTreeMap::new();
        let mut devices = BTreeSet::new();
        for line in logs.lines() {
            if let Some(d) = line.strip_prefix("dev=") {
                devices.insert(d.to_string());
            } else if let Some((k, v)) = line.split_once('=') {
                env.insert(k.to_string(), v.to_string());
            }
        }
        Granted { env, devices }
    }

    fn pci_addresses(&self) -> BTreeSet<String> {
        self.env
            .get("PCIDEVICE_RDMA_HCA")
            .map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// The environment and device nodes are exactly those of the granted HCAs.
    fn assert_matches(&self, inv: &Inventory, count: usize, logs: &str) {
        let granted = self.pci_addresses();
        assert_eq!(
            granted.len(),
            count,
            "PCIDEVICE_RDMA_HCA lists {count}: {logs}"
        );
        let hcas: Vec<_> = inv
            .hcas
            .iter()
            .filter(|h| h.pci_address.as_ref().is_some_and(|p| granted.contains(p)))
            .collect();
        assert_eq!(
            hcas.len(),
            count,
            "granted ids are fixture HCAs: {granted:?}"
        );
        let mut ports: Vec<String> = hcas
            .iter()
            .map(|h| format!("{}:{}", h.name, h.port))
            .collect();
        ports.sort();
        let listed = |key: &str| -> Vec<String> {
            let mut v: Vec<String> = self
                .env
                .get(key)
                .map(|v| {
                    v.trim_start_matches('=')
                        .split(',')
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        };
        assert!(
            self.env
                .get("NCCL_IB_HCA")
                .is_some_and(|v| v.starts_with('=')),
            "exact-match form: {logs}"
        );
        assert_eq!(listed("NCCL_IB_HCA"), ports, "NCCL_IB_HCA: {logs}");
        assert_eq!(listed("UCX_NET_DEVICES"), ports, "UCX_NET_DEVICES: {logs}");
        let gid = hcas[0]
            .roce_v2_gid_index
            .expect("fixture HCAs have a RoCE v2 GID");
        assert_eq!(
            self.env.get("NCCL_IB_GID_INDEX"),
            Some(&gid.to_string()),
            "{logs}"
        );
        let mut want: BTreeSet<String> = hcas
            .iter()
            .map(|h| format!("/dev/infiniband/{}", h.uverbs.as_deref().expect("uverbs")))
            .collect();
        want.insert("/dev/infiniband/rdma_cm".into());
        assert_eq!(
            self.devices, want,
            "exactly the granted uverbs and rdma_cm: {logs}"
        );
    }
}

async fn daemon_pod_uid(client: &Client) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(&node_daemon_selector()))
        .await
        .ok()?;
    list.items
        .iter()
        .find(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.metadata.deletion_timestamp.is_none()
        })
        .and_then(|p| p.uid())
}

#[test]
fn device_plugin_on_the_real_kubelet() {
    const TEST: &str = "device_plugin_on_the_real_kubelet";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    let LocalCluster {
        node_name: node, ..
    } = local.clone();
    ctx.rt.block_on(async {
        let client = &ctx.client;
        // Capacity: every advertised device of the fixture. Allocatable: minus the gated HCAs,
        // while the agent reports QoS not applied on the veths. The chart's defaults serve
        // rdma/hca only, over every HCA: GPUs (and so GPU+HCA pairs) are left to NVIDIA's plugin.
        let held = gated_hcas(&inv);
        let gated = held.len() as i64;
        assert_eq!(gated, FABRIC_NETDEVS.len() as i64);
        let expected = Expected {
            hcas: counts(&inv, ResourceKind::Hca, &held),
            gpus: counts(&inv, ResourceKind::Gpu, &held),
            rails: counts(&inv, ResourceKind::GpuHca, &held),
        };
        let hcas = expected.hcas.0;
        assert!(
            hcas == inv.hcas.len() as i64 && hcas >= 4,
            "fixture: {hcas} HCAs listed of {}",
            inv.hcas.len()
        );
        assert_eq!(
            (expected.gpus, expected.rails),
            ((0, 0), (0, 0)),
            "GPUs and pairs are off by default"
        );
        expected.wait(client, &node, "registered").await;

        // grpcurl, pointed at the daemon's socket by hand, sends the socket path as :authority
        // (forced here, whatever its default); the daemon answers it like the kubelet.
        let socket = local.plugin_dir.join("rocefabric-rdma_hca.sock");
        let proto = rocefabric_e2e::workspace_root()
            .join("device-plugin/kubelet/proto/deviceplugin/v1beta1");
        let out = local
            .grpcurl()
            .args(["-plaintext", "-unix", "-max-time", "20", "-authority"])
            .arg(&socket)
            .arg("-import-path")
            .arg(&proto)
            .args(["-proto", "api.proto"])
            .arg(&socket)
            .arg("v1beta1.DevicePlugin/GetDevicePluginOptions")
            .output_within(CALL_LIMIT)
            .expect("grpcurl");
        let answer = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && answer.contains("\"getPreferredAllocationAvailable\": true"),
            "grpcurl: {answer}{}",
            String::from_utf8_lossy(&out.stderr)
        );

        // A pod asking for two HCAs runs with exactly their device nodes and environment.
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        create_pod(&pods, hca_pod("hca-a", &local.busybox_image, 2)).await;
        running(&pods, "hca-a").await;
        let logs = logs_with(&pods, "hca-a", "done").await;
        let a = Granted::parse(&logs);
        a.assert_matches(&inv, 2, &logs);
        for gated in gated_hcas(&inv) {
            assert!(
                !a.pci_addresses().contains(&gated),
                "a gated HCA was granted: {gated}"
            );
        }

        // A fixture port going down lowers allocatable; back up restores it.
        let down = inv
            .hcas
            .iter()
            .find(|h| {
                !gated_hcas(&inv).contains(&h.id)
                    && !h
                        .pci_address
                        .as_ref()
                        .is_some_and(|p| a.pci_addresses().contains(p))
            })
            .expect("a free, ungated HCA");
        fixtures::set_port_state(&local.sysfs(), &down.name, down.port, false).expect("port down");
        wait_counts(
            client,
            &node,
            HCA_RESOURCE,
            (hcas, hcas - gated - 1),
            "port down",
        )
        .await;
        fixtures::set_port_state(&local.sysfs(), &down.name, down.port, true).expect("port up");
        wait_counts(
            client,
            &node,
            HCA_RESOURCE,
            (hcas, hcas - gated),
            "port up again",
        )
        .await;

        // The kubelet restarts (deleting every plugin socket): the daemon re-registers and the
        // capacity returns; the running pod keeps its devices.
        let kubelet_sock = local.plugin_dir.join("kubelet.sock");
        // A new file (inode numbers are reused at once on ext4, change times are not).
        let created = || {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&kubelet_sock).expect("kubelet.sock");
            (m.ino(), m.ctime(), m.ctime_nsec())
        };
        let before = created();
        local.restart("kubelet").expect("kubelet restart");
        // The new kubelet answers before its device manager has replaced kubelet.sock.
        eventually("the new kubelet's kubelet.sock", || async {
            let now = created();
            if now != before {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            }
        })
        .await;
        expected
            .wait(client, &node, "after a kubelet restart")
            .await;
        running(&pods, "hca-a").await;

        // The daemon pod is deleted and recreated by its DaemonSet: nothing allocated is lost.
        // The kubelet's checkpoint still holds hca-a's HCAs, so a new pod gets two others.
        let old = daemon_pod_uid(client).await.expect("a running daemon pod");
        let daemon_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        for p in daemon_pods
            .list(&ListParams::default().labels(&node_daemon_selector()))
            .await
            .expect("list")
        {
            daemon_pods
                .delete(&p.name_any(), &DeleteParams::default())
                .await
                .expect("delete daemon pod");
        }
        eventually("a new daemon pod running", || async {
            match daemon_pod_uid(client).await {
                Some(uid) if uid != old => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        expected.wait(client, &node, "after a daemon restart").await;
        let still = running(&pods, "hca-a").await;
        assert_eq!(
            still
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c[0].restart_count),
            Some(0),
            "hca-a never restarted"
        );
        create_pod(&pods, hca_pod("hca-b", &local.busybox_image, 2)).await;
        running(&pods, "hca-b").await;
        let logs_b = logs_with(&pods, "hca-b", "done").await;
        let b = Granted::parse(&logs_b);
        b.assert_matches(&inv, 2, &logs_b);
        assert!(
            a.pci_addresses().is_disjoint(&b.pci_addresses()),
            "no HCA granted twice: a {:?}, b {:?}",
            a.pci_addresses(),
            b.pci_addresses()
        );
        delete_pod(&pods, "hca-a").await;
        delete_pod(&pods, "hca-b").await;
    });
}

/// With `gpuHca` on, the real kubelet gets disjoint device sets: `rdma/gpu-hca` lists each GPU with
/// its rail, `rdma/hca` only the HCAs that are no rail. A pair pod and a pod taking every allocatable
/// `rdma/hca` run side by side without sharing an HCA.
#[test]
fn pairs_own_their_rails_on_the_real_kubelet() {
    const TEST: &str = "pairs_own_their_rails_on_the_real_kubelet";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    let node = local.node_name.clone();
    let mut config = Config::default();
    config.gpu_hca.enabled = true;
    let pairs_on = json!({"node": {"config": {"gpuHca": {"enabled": true}}}});
    install_chart(Some(&local), &pairs_on).expect("helm upgrade with gpuHca on");
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let held = gated_hcas(&inv);
        let hcas = counts_with(&inv, ResourceKind::Hca, &held, &config);
        let rails = counts_with(&inv, ResourceKind::GpuHca, &held, &config);
        let rail_ids: BTreeSet<String> = rocefabric_node_model::topology::gpu_hca_pairs(&inv)
            .iter()
            .map(|(_, h, _)| h.id.clone())
            .collect();
        assert!(
            rails.0 == 8 && rails.1 > 0 && !rail_ids.is_empty(),
            "fixture: 8 GPUs with rails, some of them ungated: {rails:?}"
        );
        assert_eq!(
            hcas.0 as usize,
            inv.hcas.len() - rail_ids.len(),
            "rdma/hca lists the HCAs that are no rail"
        );
        wait_counts(client, &node, GPU_HCA_RESOURCE, rails, "pairs on").await;
        wait_counts(client, &node, HCA_RESOURCE, hcas, "pairs on").await;

        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        create_pod(
            &pods,
            pod_asking("pair-a", &local.busybox_image, GPU_HCA_RESOURCE, 1),
        )
        .await;
        running(&pods, "pair-a").await;
        let pair = Granted::parse(&logs_with(&pods, "pair-a", "done").await);
        let pair_pci: BTreeSet<String> = pair
            .env
            .get("PCIDEVICE_RDMA_GPU_HCA")
            .map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_default();
        let granted_rail: Vec<&String> =
            rail_ids.iter().filter(|r| pair_pci.contains(*r)).collect();
        assert_eq!(granted_rail.len(), 1, "one rail HCA in {pair_pci:?}");
        assert!(
            pair.env.contains_key("NVIDIA_VISIBLE_DEVICES"),
            "{:?}",
            pair.env
        );
        if hcas.1 > 0 {
            let n = u32::try_from(hcas.1).expect("count");
            create_pod(&pods, hca_pod("hca-rest", &local.busybox_image, n)).await;
            running(&pods, "hca-rest").await;
            let rest = Granted::parse(&logs_with(&pods, "hca-rest", "done").await);
            assert!(
                rest.pci_addresses().is_disjoint(&rail_ids),
                "rdma/hca granted a rail: {:?}",
                rest.pci_addresses()
            );
            delete_pod(&pods, "hca-rest").await;
        }
        delete_pod(&pods, "pair-a").await;
    });
    install_chart(Some(&local), &serde_json::Value::Null).expect("helm upgrade back");
    ctx.rt.block_on(async {
        let held = gated_hcas(&inv);
        let all = counts(&inv, ResourceKind::Hca, &held);
        wait_counts(&ctx.client, &node, HCA_RESOURCE, all, "pairs off again").await;
    });
}

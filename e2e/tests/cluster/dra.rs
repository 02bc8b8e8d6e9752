//! DRA mode on the real kubelet and scheduler (the suite installs the chart with `node.mode:
//! both`): the node's ResourceSlice, and claims the scheduler allocates with `matchAttribute` on
//! the PCIe root, prepared and unprepared through the kubelet into CDI specs that containerd
//! injects. The ledger (a daemon killed mid-prepare, one ledger shared with the device plugin) is
//! `dra_ledger`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceAttribute, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use rocefabric_dra::checkpoint;
use rocefabric_dra::devices::{PCIE_ROOT_ATTRIBUTE, gpu_device_name, hca_device_name};
use rocefabric_e2e::cluster::{FABRIC_NETDEVS, LocalCluster};
use rocefabric_e2e::workspace_root;
use rocefabric_node_model::model::{Health, Inventory};
use rocefabric_node_model::topology::PciChain;
use rocefabric_node_testing::fixtures;
use serde_json::{Value, json};

use crate::devices::{Granted, fixture_inventory};
use crate::regions::pod_image;
use crate::{
    WORKLOAD_NAMESPACE, apply_value, create_pod, delete_pod, eventually, local_cluster, logs_with,
    running, test_fabric_value,
};

pub(crate) const DRIVER: &str = "rocefabric.io";

/// The node's slice once `check` accepts it.
pub(crate) async fn slice_where(
    client: &Client,
    node: &str,
    what: &str,
    check: impl Fn(&ResourceSlice) -> Result<(), String>,
) -> ResourceSlice {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let name = format!("{node}-{DRIVER}");
    eventually(what, || async {
        let slice = slices
            .get_opt(&name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no ResourceSlice {name}"))?;
        check(&slice).map(|()| slice)
    })
    .await
}

pub(crate) fn device_names(slice: &ResourceSlice) -> BTreeSet<String> {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.clone())
        .collect()
}

fn attribute<'a>(
    slice: &'a ResourceSlice,
    device: &str,
    name: &str,
) -> Option<&'a DeviceAttribute> {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .find(|d| d.name == device)?
        .attributes
        .as_ref()?
        .get(name)
}

fn string_attr(slice: &ResourceSlice, device: &str, name: &str) -> Option<String> {
    attribute(slice, device, name).and_then(|a| a.string.clone())
}

/// The fabric's HCAs on this node: veths, whose lossless QoS the agent can never prove.
pub(crate) fn fabric_hca_names(inv: &Inventory) -> BTreeSet<String> {
    inv.hcas
        .iter()
        .filter(|h| {
            h.netdev
                .as_deref()
                .is_some_and(|n| FABRIC_NETDEVS.iter().any(|(_, host)| *host == n))
        })
        .map(hca_device_name)
        .collect()
}

/// A ResourceClaimTemplate of `pairs` GPU + HCA pairs, each pair under one PCIe root.
fn pairs_template(name: &str, pairs: usize) -> Value {
    let mut requests = Vec::new();
    let mut constraints = Vec::new();
    for i in 0..pairs {
        for (kind, class) in [("gpu", "gpu.rocefabric.io"), ("hca", "hca.rocefabric.io")] {
            requests.push(json!({"name": format!("{kind}-{i}"),
                "exactly": {"deviceClassName": class, "count": 1}}));
        }
        constraints.push(json!({"matchAttribute": PCIE_ROOT_ATTRIBUTE,
            "requests": [format!("gpu-{i}"), format!("hca-{i}")]}));
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}}
    })
}

/// The first document of kind `kind` in an example file, moved to the workload namespace.
pub(crate) fn example(file: &str, kind: &str) -> Value {
    let text = std::fs::read_to_string(workspace_root().join("examples/dra").join(file))
        .unwrap_or_else(|e| panic!("examples/dra/{file}: {e}"));
    for doc in text.split("\n---") {
        let mut value: Value = yaml_serde::from_str(doc).expect("example YAML");
        if value["kind"] == kind {
            value["metadata"]["namespace"] = json!(WORKLOAD_NAMESPACE);
            return value;
        }
    }
    panic!("examples/dra/{file} has no {kind}");
}

pub(crate) async fn create_template(client: &Client, template: Value) -> String {
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
    let template: ResourceClaimTemplate = serde_json::from_value(template).expect("template");
    let name = template.name_any();
    let _ = api.delete(&name, &DeleteParams::default()).await;
    eventually(&format!("template {name} created"), || async {
        match api.create(&PostParams::default(), &template).await {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    name
}

/// A pod holding a claim from `template`; it prints its environment and device nodes.
pub(crate) fn claim_pod(name: &str, image: &str, template: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "env; for d in /dev/infiniband/* /dev/nvidia*; do [ -e $d ] && echo dev=$d; done; echo done; exec sleep 3600"],
                "resources": {"claims": [{"name": "devices"}]}
            }]
        }
    })
}

/// The claim a pod's template produced, once allocated.
pub(crate) async fn pod_claim(client: &Client, pod: &str) -> ResourceClaim {
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
    eventually(&format!("pod {pod}'s claim allocated"), || async {
        let p = pods.get(pod).await.map_err(|e| e.to_string())?;
        let name = p
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .and_then(|s| s.first())
            .and_then(|s| s.resource_claim_name.clone())
            .ok_or("no claim yet")?;
        let claim = claims.get(&name).await.map_err(|e| e.to_string())?;
        if claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some()
        {
            Ok(claim)
        } else {
            Err("not allocated".into())
        }
    })
    .await
}

/// `(request, device)` of our driver in a claim's allocation.
pub(crate) fn allocated(claim: &ResourceClaim) -> BTreeMap<String, String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == DRIVER)
        .map(|r| (r.request.clone(), r.device.clone()))
        .collect()
}

/// The container saw exactly the device nodes and environment of `devices` (pool names).
pub(crate) fn assert_exactly(
    inv: &Inventory,
    devices: &BTreeSet<String>,
    seen: &Granted,
    logs: &str,
) {
    let hcas: Vec<_> = inv
        .hcas
        .iter()
        .filter(|h| devices.contains(&hca_device_name(h)))
        .collect();
    let gpus: Vec<_> = inv
        .gpus
        .iter()
        .filter(|g| devices.contains(&gpu_device_name(g)))
        .collect();
    assert_eq!(
        hcas.len() + gpus.len(),
        devices.len(),
        "{devices:?} are fixture devices"
    );
    let mut want: BTreeSet<String> = hcas
        .iter()
        .map(|h| format!("/dev/infiniband/{}", h.uverbs.as_deref().expect("uverbs")))
        .chain(gpus.iter().map(|g| format!("/dev/nvidia{}", g.index)))
        .collect();
    if !hcas.is_empty() {
        want.insert("/dev/infiniband/rdma_cm".into());
    }
    if !gpus.is_empty() {
        want.extend(
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"].map(String::from),
        );
    }
    assert_eq!(
        seen.devices, want,
        "exactly the allocated devices' nodes: {logs}"
    );
    let mut ports: Vec<String> = hcas
        .iter()
        .map(|h| format!("{}:{}", h.name, h.port))
        .collect();
    ports.sort();
    let mut listed: Vec<String> = seen
        .env
        .get("NCCL_IB_HCA")
        .map(|v| {
            v.trim_start_matches('=')
                .split(',')
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    listed.sort();
    assert_eq!(listed, ports, "NCCL_IB_HCA: {logs}");
    let mut pci: Vec<String> = hcas
        .iter()
        .filter_map(|h| h.pci_address.clone())
        .chain(gpus.iter().map(|g| g.pci_address.clone()))
        .collect();
    pci.sort();
    let mut env_pci: Vec<String> = seen
        .env
        .get("PCIDEVICE_ROCEFABRIC_IO")
        .map(|v| v.split(',').map(String::from).collect())
        .unwrap_or_default();
    env_pci.sort();
    assert_eq!(env_pci, pci, "PCIDEVICE_ROCEFABRIC_IO: {logs}");
    // Each GPU by its UUID (the NVIDIA container toolkit's name for it), else its index.
    let want_visible: BTreeSet<String> = gpus
        .iter()
        .map(|g| g.uuid.clone().unwrap_or_else(|| g.index.to_string()))
        .collect();
    let visible: BTreeSet<String> = seen
        .env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map(|v| v.split(',').map(String::from).collect())
        .unwrap_or_default();
    assert_eq!(visible, want_visible, "NVIDIA_VISIBLE_DEVICES: {logs}");
}

pub(crate) fn cdi_spec_path(local: &LocalCluster, claim_uid: &str) -> std::path::PathBuf {
    local
        .cdi_dir
        .join(rocefabric_dra::cdi::spec_file_name(claim_uid))
}

pub(crate) fn checkpoint_claims(local: &LocalCluster) -> BTreeMap<String, checkpoint::ClaimRecord> {
    checkpoint::load(&local.dra_plugin_dir().join("checkpoint.json"))
        .expect("the driver's checkpoint")
        .claims
}

/// The test fabric, narrowed to no NIC of this node for the duration of `body`: the node's
/// fabric NICs are veths, on which the agent can never prove lossless QoS, so while they are the
/// fabric's their HCAs (the rails of GPUs 0 and 1) stay withdrawn and no full rail set exists.
async fn without_fabric_nics<F: std::future::Future<Output = ()>>(
    client: &Client,
    local: &LocalCluster,
    inv: &Inventory,
    body: F,
) {
    let mut fabric = test_fabric_value(true);
    fabric["spec"]["nicSelector"] = json!({"netdevs": ["rfe2e-absent"]});
    apply_value(client, &fabric)
        .await
        .expect("narrow the fabric");
    let fabric_hcas = fabric_hca_names(inv);
    slice_where(
        client,
        &local.node_name,
        "the fabric's HCAs published",
        |s| {
            let names = device_names(s);
            fabric_hcas
                .iter()
                .all(|h| names.contains(h))
                .then_some(())
                .ok_or(format!("{names:?}"))
        },
    )
    .await;
    body.await;
    apply_value(client, &test_fabric_value(true))
        .await
        .expect("restore the fabric");
}

#[test]
fn dra_slice_lists_the_fixture_devices_and_withdraws_what_a_claim_must_not_get() {
    const TEST: &str =
        "dra_slice_lists_the_fixture_devices_and_withdraws_what_a_claim_must_not_get";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let node = &local.node_name;
        let fabric_hcas = fabric_hca_names(&inv);
        assert_eq!(fabric_hcas.len(), 2);
        // Every GPU and every HCA but the fabric's two, whose QoS is not proven.
        let want: BTreeSet<String> = inv
            .gpus
            .iter()
            .filter(|g| g.health == Health::Healthy)
            .map(gpu_device_name)
            .chain(
                inv.hcas
                    .iter()
                    .filter(|h| h.health == Health::Healthy)
                    .map(hca_device_name),
            )
            .filter(|d| !fabric_hcas.contains(d))
            .collect();
        let slice = slice_where(client, node, "the node's slice lists the fixture", |s| {
            let names = device_names(s);
            (names == want).then_some(()).ok_or(format!("{names:?}"))
        })
        .await;
        assert_eq!(slice.spec.driver, DRIVER);
        assert_eq!(slice.spec.node_name.as_deref(), Some(node.as_str()));
        assert_eq!(slice.spec.pool.name, *node);
        assert_eq!(slice.spec.pool.resource_slice_count, 1);

        // The attributes say what sysfs says.
        for hca in inv
            .hcas
            .iter()
            .filter(|h| want.contains(&hca_device_name(h)))
        {
            let d = hca_device_name(hca);
            assert_eq!(string_attr(&slice, &d, "type").as_deref(), Some("hca"));
            assert_eq!(
                string_attr(&slice, &d, "rdmaDevice"),
                Some(hca.name.clone())
            );
            assert_eq!(
                string_attr(&slice, &d, "pciAddress"),
                hca.pci_address.clone()
            );
            assert_eq!(string_attr(&slice, &d, "netdev"), hca.netdev.clone());
            assert_eq!(
                attribute(&slice, &d, "gidIndex").and_then(|a| a.int),
                hca.roce_v2_gid_index.map(i64::from)
            );
            assert_eq!(
                attribute(&slice, &d, "numaNode").and_then(|a| a.int),
                hca.numa_node.map(i64::from)
            );
            let chain = PciChain::parse(&hca.device_path).expect("a PCI function's path");
            assert_eq!(
                string_attr(&slice, &d, PCIE_ROOT_ATTRIBUTE).as_deref(),
                Some(chain.root),
                "{d}: the host bridge above it in sysfs"
            );
            let bandwidth = slice
                .spec
                .devices
                .iter()
                .flatten()
                .find(|x| x.name == d)
                .and_then(|x| x.capacity.as_ref()?.get("bandwidth"))
                .map(|c| c.value.0.clone());
            let rate = hca.rate_mbps.expect("fixture ports have a rate");
            assert_eq!(
                bandwidth,
                Some(format!("{}G", rate / 1000)),
                "{d} bandwidth"
            );
        }
        for (gpu, hca, _) in rocefabric_node_model::topology::gpu_hca_pairs(&inv) {
            let (g, h) = (gpu_device_name(gpu), hca_device_name(hca));
            if want.contains(&h) {
                assert_eq!(
                    string_attr(&slice, &g, PCIE_ROOT_ATTRIBUTE),
                    string_attr(&slice, &h, PCIE_ROOT_ATTRIBUTE),
                    "GPU {g} and its rail {h} share a PCIe root"
                );
                assert_eq!(
                    string_attr(&slice, &g, "pcieSwitch"),
                    string_attr(&slice, &h, "pcieSwitch")
                );
            }
        }

        // A port going down withdraws its HCA (and bumps the pool's generation); up, it returns.
        let down = inv
            .hcas
            .iter()
            .find(|h| want.contains(&hca_device_name(h)))
            .expect("a published HCA");
        let name = hca_device_name(down);
        let generation = slice.spec.pool.generation;
        fixtures::set_port_state(&local.sysfs(), &down.name, down.port, false).expect("port down");
        let withdrawn = slice_where(client, node, "the down HCA withdrawn", |s| {
            (!device_names(s).contains(&name))
                .then_some(())
                .ok_or("still listed".into())
        })
        .await;
        assert!(
            withdrawn.spec.pool.generation > generation,
            "generation bumped"
        );
        fixtures::set_port_state(&local.sysfs(), &down.name, down.port, true).expect("port up");
        slice_where(client, node, "the HCA back", |s| {
            device_names(s)
                .contains(&name)
                .then_some(())
                .ok_or("not back".into())
        })
        .await;
    });
}

#[test]
fn dra_rail_set_claim_runs_with_each_gpu_beside_its_hca() {
    const TEST: &str = "dra_rail_set_claim_runs_with_each_gpu_beside_its_hca";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let inv = fixture_inventory();
    let image = pod_image(Some(&local));
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        without_fabric_nics(client, &local, &inv, async {
            let template =
                create_template(client, example("rail-set.yaml", "ResourceClaimTemplate")).await;
            create_pod(&pods, claim_pod("dra-rail-set", &image, &template)).await;
            running(&pods, "dra-rail-set").await;
            let claim = pod_claim(client, "dra-rail-set").await;
            let uid = claim.uid().expect("uid");
            let picked = allocated(&claim);
            // Every GPU of the node, each with an HCA under its own host bridge (the rails).
            let root_of: BTreeMap<String, String> = inv
                .gpus
                .iter()
                .map(|g| (gpu_device_name(g), g.pci_path.as_str()))
                .chain(
                    inv.hcas
                        .iter()
                        .map(|h| (hca_device_name(h), h.device_path.as_str())),
                )
                .filter_map(|(d, path)| Some((d, PciChain::parse(path)?.root.to_string())))
                .collect();
            let gpus: BTreeSet<&String> = (0..8).map(|i| &picked[&format!("gpu-{i}")]).collect();
            let all_gpus: BTreeSet<String> = inv.gpus.iter().map(gpu_device_name).collect();
            assert_eq!(
                gpus,
                all_gpus.iter().collect(),
                "8 distinct GPUs: {picked:?}"
            );
            let hcas: BTreeSet<&String> = (0..8).map(|i| &picked[&format!("hca-{i}")]).collect();
            assert_eq!(hcas.len(), 8, "8 distinct HCAs: {picked:?}");
            for i in 0..8 {
                let (g, h) = (&picked[&format!("gpu-{i}")], &picked[&format!("hca-{i}")]);
                assert!(root_of.contains_key(g), "{g} has a PCIe root");
                assert_eq!(
                    root_of.get(g),
                    root_of.get(h),
                    "pair {i}: {g} and {h} share a PCIe root"
                );
            }
            let logs = logs_with(&pods, "dra-rail-set", "done").await;
            let devices: BTreeSet<String> = picked.values().cloned().collect();
            assert_exactly(&inv, &devices, &Granted::parse(&logs), &logs);
            assert!(cdi_spec_path(&local, &uid).exists(), "the claim's CDI spec");
            assert_eq!(
                checkpoint_claims(&local).get(&uid).map(|r| r.state),
                Some(checkpoint::ClaimState::Prepared)
            );

            // Deleting the pod unprepares the claim: spec and record gone.
            delete_pod(&pods, "dra-rail-set").await;
            eventually("the claim unprepared", || async {
                if cdi_spec_path(&local, &uid).exists()
                    || checkpoint_claims(&local).contains_key(&uid)
                {
                    Err("CDI spec or checkpoint record still there".to_string())
                } else {
                    Ok(())
                }
            })
            .await;
        })
        .await;
    });
}

#[test]
fn dra_a_claim_for_more_pairs_than_the_node_has_stays_pending() {
    const TEST: &str = "dra_a_claim_for_more_pairs_than_the_node_has_stays_pending";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    let image = pod_image(Some(&local));
    ctx.rt.block_on(async {
        let client = &ctx.client;
        let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
        let template = create_template(client, pairs_template("nine-pairs", 9)).await;
        create_pod(&pods, claim_pod("dra-nine-pairs", &image, &template)).await;
        let message = eventually("the scheduler says why the pod waits", || async {
            let p = pods
                .get("dra-nine-pairs")
                .await
                .map_err(|e| e.to_string())?;
            let condition = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
                .cloned()
                .ok_or("no PodScheduled condition")?;
            if condition.status == "False" && condition.reason.as_deref() == Some("Unschedulable") {
                Ok(condition.message.unwrap_or_default())
            } else {
                Err(format!("{condition:?}"))
            }
        })
        .await;
        assert!(
            message.contains("claim"),
            "the reason names the claim: {message}"
        );
        let p = pods.get("dra-nine-pairs").await.expect("pod");
        assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
        delete_pod(&pods, "dra-nine-pairs").await;
    });
}

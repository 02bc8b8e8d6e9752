//! ListAndWatch and registration: each resource registers once it serves, lists every device
//! with its NUMA node, sends a list only on a change; the config renames and disables resources.

use std::collections::BTreeMap;
use std::time::Duration;

use rocefabric_node_testing::fixtures::{self, FixtureNode};

use crate::common::*;
use crate::{ALL, COMPUTE_HCAS, numa_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_each_resource_only_after_it_serves() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, all_config(), &ALL).await;
    let snapshot = kubelet.snapshot();

    // The emulator, like the kubelet, dials <dir>/<endpoint> while handling Register and refuses
    // the registration when nothing answers: every registration was accepted.
    assert_eq!(
        snapshot.registrations.len(),
        3,
        "{:?}",
        snapshot.registrations
    );
    for r in &snapshot.registrations {
        assert!(r.accepted(), "registration refused: {:?}", r.rejected);
    }
    let registered = snapshot.registered();
    for (resource, endpoint) in [
        (HCA, "rocefabric-rdma_hca.sock"),
        (GPU, "rocefabric-nvidia.com_gpu.sock"),
        (GPU_HCA, "rocefabric-rdma_gpu-hca.sock"),
    ] {
        let request = &registered[resource].request;
        assert_eq!(request.version, "v1beta1");
        assert_eq!(
            request.endpoint, endpoint,
            "endpoint is relative to the plugin directory"
        );
        assert_eq!(request.resource_name, resource);
        let options = request.options.expect("options sent");
        assert!(options.get_preferred_allocation_available);
        assert!(!options.pre_start_required);
        assert!(node.plugin_dir.join(endpoint).exists());
        // What the kubelet got from GetDevicePluginOptions matches the registration.
        assert_eq!(snapshot.options[resource], options);
    }
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_every_device_with_its_numa_node() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, gpu_config(), &[HCA, GPU]).await;
    let snapshot = kubelet.snapshot();

    let hcas = snapshot.devices_of(HCA).expect("hca list");
    for (pci, _, _, numa) in COMPUTE_HCAS {
        let d = hcas
            .iter()
            .find(|d| d.id == pci)
            .unwrap_or_else(|| panic!("{pci} listed"));
        assert_eq!(d.health, "Healthy");
        assert_eq!(numa_of(d), vec![numa], "{pci}");
    }
    // 8 compute + 4 storage ConnectX-7 ports + 2 irdma ports, every one with a NUMA node.
    assert_eq!(hcas.len(), 14, "{:?}", ids(hcas));
    assert!(hcas.iter().all(|d| d.topology.is_some()));

    let gpus = snapshot.devices_of(GPU).expect("gpu list");
    assert_eq!(gpus.len(), 8);
    assert_eq!(
        numa_of(gpus.iter().find(|d| d.id == "0000:1b:00.0").expect("gpu 0")),
        vec![0]
    );
    assert_eq!(
        numa_of(gpus.iter().find(|d| d.id == "0000:df:00.0").expect("gpu 7")),
        vec![1]
    );
    daemon.stop().await.expect("clean stop");
}

/// With the pair resource on, each GPU's rail and the GPU are listed by the pair resource only:
/// no device is listed by two resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairs_own_their_gpus_and_rails() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, all_config(), &ALL).await;
    let snapshot = kubelet.snapshot();
    let pairs = snapshot.devices_of(GPU_HCA).expect("pair list");
    assert_eq!(pairs.len(), 8);
    assert!(
        pairs
            .iter()
            .any(|d| d.id == "0000:1b:00.0_0000:18:00.0" && numa_of(d) == [0])
    );
    let hcas = snapshot.devices_of(HCA).expect("hca list");
    assert_eq!(hcas.len(), 6, "14 HCAs less the 8 rails: {:?}", ids(hcas));
    for (pci, _, _, _) in COMPUTE_HCAS {
        assert!(health_of(hcas, pci).is_none(), "rail {pci} under {HCA}");
    }
    let gpus = snapshot.devices_of(GPU).expect("gpu list");
    assert!(gpus.is_empty(), "every GPU has a rail: {:?}", ids(gpus));
    // Each physical device under one resource.
    let mut owner = BTreeMap::new();
    for resource in ALL {
        for d in snapshot.devices_of(resource).unwrap_or_default() {
            for device in d.id.split('_') {
                let was = owner.insert(device.to_string(), resource);
                assert!(
                    was.is_none_or(|w| w == resource),
                    "{device}: {was:?} and {resource}"
                );
            }
        }
    }
    assert_eq!(owner.len(), 14 + 8, "every HCA and GPU is served once");
    // Allocate refuses a rail through rdma/hca, naming it and its owner.
    let message = invalid_argument(
        kubelet
            .allocate(HCA, &["0000:18:00.0"])
            .await
            .expect_err("refused"),
    );
    assert!(
        message.contains("0000:18:00.0") && message.contains(GPU_HCA),
        "{message}"
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn omits_topology_when_numa_is_unknown() {
    let node = Node::new(&FixtureNode::dgx_h100().with_gpu_numa("0000:61:00.0", None));
    let (kubelet, daemon) = start(&node, gpu_config(), &[GPU]).await;
    let gpus = kubelet
        .snapshot()
        .devices_of(GPU)
        .expect("gpu list")
        .to_vec();
    let gpu3 = gpus
        .iter()
        .find(|d| d.id == "0000:61:00.0")
        .expect("gpu 3 listed");
    assert!(
        gpu3.topology.is_none(),
        "no NUMA node: no TopologyInfo, got {:?}",
        gpu3.topology
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_a_list_only_when_something_changed() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, fast_config(), &[HCA]).await;
    // Ten poll intervals without a change: still the one initial list.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(kubelet.snapshot().list_updates[HCA], 1);
    fixtures::set_port_state(&node.sysfs, "mlx5_0", 1, false).expect("link down");
    kubelet
        .wait_for_devices(HCA, WAIT, |d| {
            health_of(d, "0000:18:00.0") == Some("Unhealthy")
        })
        .await
        .expect("update");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(kubelet.snapshot().list_updates[HCA], 2);
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_renames_and_disables_resources() {
    let node = Node::dgx();
    let mut config = fast_config();
    config.gpu.enabled = false;
    config.gpu_hca.enabled = true;
    config.gpu_hca.resource_name = "example.com/rail".into();
    let (kubelet, daemon) = start(&node, config, &[HCA, "example.com/rail"]).await;
    let registered: Vec<String> = kubelet
        .snapshot()
        .registered()
        .keys()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(registered, ["example.com/rail", HCA]);
    assert!(
        node.plugin_dir
            .join("rocefabric-example.com_rail.sock")
            .exists()
    );
    assert!(
        !node
            .plugin_dir
            .join("rocefabric-nvidia.com_gpu.sock")
            .exists()
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_rdma_still_registers_with_no_hcas() {
    let node = Node::new(&FixtureNode::dgx_h100().without_rdma());
    let (kubelet, daemon) = start(&node, all_config(), &ALL).await;
    let snapshot = kubelet.snapshot();
    assert_eq!(snapshot.devices_of(HCA).map(<[_]>::len), Some(0));
    assert_eq!(snapshot.devices_of(GPU_HCA).map(<[_]>::len), Some(0));
    assert_eq!(
        snapshot.devices_of(GPU).map(<[_]>::len),
        Some(8),
        "no HCA, no rail: every GPU is the GPU resource's"
    );
    daemon.stop().await.expect("clean stop");
}

//! The `serve` daemon against the kubelet emulator over real unix sockets, on the DGX H100 fixture.

mod serve_common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rocefabric_node_model::config::Config;
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_testing::fixtures::{self, FixtureNode};
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;
use rocefabric_kubelet_api::pb;
use serve_common::*;

const ALL: [&str; 3] = [HCA, GPU, GPU_HCA];

/// Compute HCAs of the fixture: (PCI address, RDMA device, netdev, NUMA node).
const COMPUTE_HCAS: [(&str, &str, &str, i64); 8] = [
    ("0000:18:00.0", "mlx5_0", "enp24s0np0", 0),
    ("0000:40:00.0", "mlx5_3", "enp64s0np0", 0),
    ("0000:4f:00.0", "mlx5_4", "enp79s0np0", 0),
    ("0000:5e:00.0", "mlx5_5", "enp94s0np0", 0),
    ("0000:9a:00.0", "mlx5_6", "enp154s0np0", 1),
    ("0000:c0:00.0", "mlx5_9", "enp192s0np0", 1),
    ("0000:ce:00.0", "mlx5_10", "enp206s0np0", 1),
    ("0000:dc:00.0", "mlx5_11", "enp220s0np0", 1),
];

fn numa_of(device: &pb::Device) -> Vec<i64> {
    device
        .topology
        .as_ref()
        .map(|t| t.nodes.iter().map(|n| n.id).collect())
        .unwrap_or_default()
}

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
async fn allocate_two_hcas_returns_their_devices_and_exact_env() {
    let node = Node::dgx();
    let config = Config {
        traffic_class: Some(106),
        ..fast_config()
    };
    let (kubelet, daemon) = start(&node, config, &[HCA]).await;

    let response = kubelet
        .allocate(HCA, &["0000:40:00.0", "0000:18:00.0"])
        .await
        .expect("allocate");
    let spec = |path: &str| pb::DeviceSpec {
        container_path: path.into(),
        host_path: path.into(),
        permissions: "rw".into(),
    };
    // mlx5_k has uverbs(k+2) on this node (irdma registered first).
    assert_eq!(
        response.devices,
        vec![
            spec("/dev/infiniband/uverbs2"),
            spec("/dev/infiniband/uverbs5"),
            spec("/dev/infiniband/rdma_cm")
        ]
    );
    let expected_env: BTreeMap<String, String> = [
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1"),
        ("UCX_NET_DEVICES", "mlx5_0:1,mlx5_3:1"),
        ("NCCL_IB_GID_INDEX", "3"),
        ("NCCL_IB_TC", "106"),
        ("UCX_IB_TRAFFIC_CLASS", "106"),
        ("PCIDEVICE_RDMA_HCA", "0000:18:00.0,0000:40:00.0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(response.envs, expected_env);
    assert!(response.mounts.is_empty());
    assert!(response.annotations.is_empty());
    assert!(response.cdi_devices.is_empty());
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_gpu_hca_pair_gets_both_halves() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, pair_config(), &[GPU_HCA]).await;
    let response = kubelet
        .allocate(GPU_HCA, &["0000:1b:00.0_0000:18:00.0"])
        .await
        .expect("allocate");
    let paths = host_paths(&response);
    assert_eq!(
        paths,
        [
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/infiniband/uverbs2",
            "/dev/infiniband/rdma_cm"
        ]
    );
    assert_eq!(response.envs["NCCL_IB_HCA"], "=mlx5_0:1");
    assert_eq!(response.envs["NVIDIA_VISIBLE_DEVICES"], "0");
    assert!(
        !response.envs.contains_key("NCCL_IB_TC"),
        "no traffic class configured"
    );
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_rejects_an_unknown_id_naming_it() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, fast_config(), &[HCA]).await;
    let message = invalid_argument(
        kubelet
            .allocate(HCA, &["0000:18:00.0", "0000:99:00.0"])
            .await
            .expect_err("refused"),
    );
    assert!(message.contains("0000:99:00.0"), "{message}");
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_stays_on_one_numa_node_and_skips_unhealthy() {
    let node = Node::new(&FixtureNode::dgx_h100().with_port_down("mlx5_3"));
    let (kubelet, daemon) = start(&node, fast_config(), &[HCA]).await;
    let compute: Vec<&str> = COMPUTE_HCAS.iter().map(|h| h.0).collect();

    // Must include a NUMA 1 HCA: the other three come from NUMA 1 too.
    let chosen = kubelet
        .preferred_allocation(HCA, &compute, &["0000:c0:00.0"], 4)
        .await
        .expect("preferred");
    assert_eq!(chosen.len(), 4);
    assert_eq!(chosen[0], "0000:c0:00.0", "must_include comes first");
    let numa1: Vec<&str> = COMPUTE_HCAS
        .iter()
        .filter(|h| h.3 == 1)
        .map(|h| h.0)
        .collect();
    assert!(
        chosen.iter().all(|id| numa1.contains(&id.as_str())),
        "{chosen:?}"
    );

    // The link-down mlx5_3 (0000:40:00.0) is never proposed, though on NUMA 0 with the rest.
    let numa0: Vec<&str> = COMPUTE_HCAS
        .iter()
        .filter(|h| h.3 == 0)
        .map(|h| h.0)
        .collect();
    let chosen = kubelet
        .preferred_allocation(HCA, &numa0, &[], 3)
        .await
        .expect("preferred");
    assert_eq!(chosen, ["0000:18:00.0", "0000:4f:00.0", "0000:5e:00.0"]);
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_down_and_back_reaches_list_and_watch() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, pair_config(), &[HCA, GPU_HCA]).await;
    let pci = "0000:29:00.0"; // mlx5_1, a storage port: rdma/hca's
    let pair = "0000:43:00.0_0000:40:00.0"; // mlx5_3 is GPU 1's rail
    assert_eq!(
        health_of(kubelet.snapshot().devices_of(HCA).unwrap_or_default(), pci),
        Some("Healthy")
    );

    fixtures::set_port_state(&node.sysfs, "mlx5_1", 1, false).expect("link down");
    fixtures::set_port_state(&node.sysfs, "mlx5_3", 1, false).expect("link down");
    kubelet
        .wait_for_devices(HCA, WAIT, |d| health_of(d, pci) == Some("Unhealthy"))
        .await
        .expect("HCA reported Unhealthy");
    kubelet
        .wait_for_devices(GPU_HCA, WAIT, |d| health_of(d, pair) == Some("Unhealthy"))
        .await
        .expect("pair reported Unhealthy");
    let others = kubelet.snapshot();
    let hcas = others.devices_of(HCA).unwrap_or_default();
    assert_eq!(
        hcas.iter().filter(|d| d.health == "Unhealthy").count(),
        1,
        "only mlx5_1 is down among rdma/hca's"
    );
    assert_eq!(
        health_of(hcas, "0000:40:00.0"),
        None,
        "the rail stays the pair's while down"
    );

    fixtures::set_port_state(&node.sysfs, "mlx5_1", 1, true).expect("link up");
    fixtures::set_port_state(&node.sysfs, "mlx5_3", 1, true).expect("link up");
    kubelet
        .wait_for_devices(HCA, WAIT, |d| health_of(d, pci) == Some("Healthy"))
        .await
        .expect("HCA Healthy again");
    kubelet
        .wait_for_devices(GPU_HCA, WAIT, |d| health_of(d, pair) == Some("Healthy"))
        .await
        .expect("pair Healthy again");
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
async fn a_device_gone_from_sysfs_stays_listed_unhealthy() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, gpu_config(), &[HCA, GPU]).await;

    fixtures::remove_rdma_device(&node.sysfs, "mlx5_4").expect("unregister mlx5_4");
    let hcas = kubelet
        .wait_for_devices(HCA, WAIT, |d| {
            health_of(d, "0000:4f:00.0") == Some("Unhealthy")
        })
        .await
        .expect("gone HCA reported Unhealthy");
    assert_eq!(hcas.len(), 14, "still listed");
    let gone = hcas
        .iter()
        .find(|d| d.id == "0000:4f:00.0")
        .expect("listed");
    assert_eq!(numa_of(gone), vec![0], "keeps its last NUMA node");

    fixtures::remove_pci_function(&node.sysfs, "0000:9d:00.0").expect("unplug GPU 4");
    let gpus = kubelet
        .wait_for_devices(GPU, WAIT, |d| {
            health_of(d, "0000:9d:00.0") == Some("Unhealthy")
        })
        .await
        .expect("unplugged GPU reported Unhealthy");
    assert_eq!(gpus.len(), 8);
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_makes_every_resource_register_again_promptly() {
    let node = Node::dgx();
    let (mut kubelet, daemon) = start(&node, all_config(), &ALL).await;

    let restarted = Instant::now();
    kubelet.restart().await.expect("kubelet restart");
    // The daemon's fallback liveness check is set to an hour: only the inotify watch can make
    // this happen within the wait.
    let snapshot = kubelet
        .wait_for_resources(&ALL, WAIT)
        .await
        .expect("re-registered and listed");
    let elapsed = restarted.elapsed();
    assert_eq!(snapshot.generation, 1);
    for resource in ALL {
        let r = snapshot.registered()[resource];
        assert!(r.at >= restarted);
        assert!(
            node.plugin_dir.join(&r.request.endpoint).exists(),
            "socket recreated"
        );
    }
    assert!(
        elapsed < Duration::from_secs(2),
        "re-registration took {elapsed:?}"
    );
    // The new kubelet sees the devices and can allocate (a storage port: no GPU's rail).
    let response = kubelet
        .allocate(HCA, &["0000:29:00.0"])
        .await
        .expect("allocate after restart");
    assert_eq!(response.envs["NCCL_IB_HCA"], "=mlx5_1:1");
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_socket_of_ours_is_served_again() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, all_config(), &ALL).await;
    let socket = node.plugin_dir.join("rocefabric-rdma_hca.sock");
    std::fs::remove_file(&socket).expect("delete socket");
    kubelet
        .wait_until(WAIT, |s| {
            s.registrations
                .iter()
                .filter(|r| r.request.resource_name == HCA)
                .count()
                == 2
        })
        .await
        .expect("registered again");
    assert!(socket.exists());
    assert!(kubelet.allocate(HCA, &["0000:29:00.0"]).await.is_ok());
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_restart_replaces_its_stale_sockets() {
    let node = Node::dgx();
    std::fs::create_dir_all(&node.plugin_dir).expect("plugin dir");
    // A socket left by a killed earlier run (bound, never unlinked), one of a renamed resource,
    // and another plugin's socket that must be left alone.
    let stale = node.plugin_dir.join("rocefabric-rdma_hca.sock");
    let renamed = node.plugin_dir.join("rocefabric-example.com_old.sock");
    let foreign = node.plugin_dir.join("nvidia-gpu.sock");
    for path in [&stale, &renamed, &foreign] {
        drop(std::os::unix::net::UnixListener::bind(path).expect("bind"));
    }
    assert!(
        std::os::unix::net::UnixStream::connect(&stale).is_err(),
        "stale: nobody answers"
    );

    let (kubelet, daemon) = start(&node, all_config(), &ALL).await;
    assert!(
        kubelet
            .snapshot()
            .registrations
            .iter()
            .all(|r| r.accepted())
    );
    assert!(
        std::os::unix::net::UnixStream::connect(&stale).is_ok(),
        "served again"
    );
    assert!(!renamed.exists(), "stale socket of ours removed");
    assert!(foreign.exists(), "another plugin's socket kept");

    // Stop and start again (a plugin restart): the new run registers again and serves.
    daemon.stop().await.expect("clean stop");
    assert!(!stale.exists(), "shutdown removes our sockets");
    let daemon = Daemon::start(node.options(all_config()));
    kubelet
        .wait_until(WAIT, |s| {
            s.registrations.iter().filter(|r| r.accepted()).count() == 6
        })
        .await
        .expect("second run registered all three");
    assert!(kubelet.allocate(HCA, &["0000:29:00.0"]).await.is_ok());
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_is_retried_until_the_kubelet_appears() {
    let node = Node::dgx();
    let daemon = Daemon::start(node.options(all_config()));
    // Give the daemon time to fail at least once against the missing kubelet.sock.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    kubelet
        .wait_for_resources(&ALL, WAIT)
        .await
        .expect("registered once the kubelet is up");
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_gate_reports_hcas_without_applied_qos_unhealthy() {
    let node = Node::dgx();
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    // The agent reports QoS applied on two compute netdevs only.
    let ready = ["enp24s0np0", "enp64s0np0"]
        .map(String::from)
        .into_iter()
        .collect();
    let view = FabricView {
        traffic_class: Some(98),
        qos_ready: Some(ready),
        fabric_nics: None,
        fabric: None,
    };
    let config = Config {
        traffic_class: Some(106),
        ..gpu_config()
    };
    let daemon = Daemon::start_with_view(node.options(config), view);
    kubelet
        .wait_for_resources(&[HCA, GPU], WAIT)
        .await
        .expect("registered");

    let snapshot = kubelet.snapshot();
    let hcas = snapshot.devices_of(HCA).unwrap_or_default();
    let healthy: Vec<&str> = hcas
        .iter()
        .filter(|d| d.health == "Healthy")
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(healthy, ["0000:18:00.0", "0000:40:00.0"]);
    // GPUs alone are not gated.
    let gpus = snapshot.devices_of(GPU).unwrap_or_default();
    assert!(gpus.iter().all(|d| d.health == "Healthy"));
    // The fabric's traffic class wins over the config's.
    let response = kubelet
        .allocate(HCA, &["0000:18:00.0"])
        .await
        .expect("allocate");
    assert_eq!(response.envs["NCCL_IB_TC"], "98");

    // QoS applied everywhere: the gate opens without a restart.
    let all = COMPUTE_HCAS.iter().map(|h| h.2.to_string()).collect();
    daemon.view.send_modify(|v| v.qos_ready = Some(all));
    kubelet
        .wait_for_devices(HCA, WAIT, |d| {
            COMPUTE_HCAS
                .iter()
                .all(|h| health_of(d, h.0) == Some("Healthy"))
        })
        .await
        .expect("gate opened");
    daemon.stop().await.expect("clean stop");
}

/// A pair is gated by its HCA: Unhealthy until QoS is applied on the rail's netdev.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_gate_reports_pairs_without_applied_qos_unhealthy() {
    let node = Node::dgx();
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    let view = FabricView {
        traffic_class: Some(98),
        qos_ready: Some(["enp24s0np0".to_string()].into_iter().collect()),
        fabric_nics: None,
        fabric: None,
    };
    let daemon = Daemon::start_with_view(node.options(pair_config()), view);
    let snapshot = kubelet
        .wait_for_resources(&[HCA, GPU_HCA], WAIT)
        .await
        .expect("registered");
    let pairs = snapshot.devices_of(GPU_HCA).unwrap_or_default();
    assert_eq!(
        health_of(pairs, "0000:1b:00.0_0000:18:00.0"),
        Some("Healthy")
    );
    assert_eq!(
        health_of(pairs, "0000:52:00.0_0000:4f:00.0"),
        Some("Unhealthy")
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_on_a_missing_sysfs_root() {
    let node = Node::dgx();
    let mut options = node.options(fast_config());
    options.sysfs_root = node.dir.path().join("nope");
    let err = Daemon::start(options).stop().await.expect_err("refused");
    assert!(err.to_string().contains("nope"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_devices_registrations_allocations_and_restarts() {
    let node = Node::dgx();
    let mut options = node.options(fast_config());
    let metrics = std::sync::Arc::clone(&options.metrics);
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    options.config.gpu_hca.enabled = true;
    let daemon = Daemon::start(options);
    kubelet
        .wait_for_resources(&[HCA, GPU_HCA], WAIT)
        .await
        .expect("registered");

    kubelet
        .allocate(HCA, &["0000:29:00.0"])
        .await
        .expect("allocate");
    kubelet
        .allocate(HCA, &["0000:99:00.0"])
        .await
        .expect_err("unknown");
    kubelet
        .allocate(HCA, &["0000:18:00.0"])
        .await
        .expect_err("a rail is the pair resource's");
    // A storage port (rdma/hca's) and a rail (its pair's) go down.
    fixtures::set_port_state(&node.sysfs, "mlx5_1", 1, false).expect("link down");
    fixtures::set_port_state(&node.sysfs, "mlx5_0", 1, false).expect("link down");
    kubelet
        .wait_for_devices(HCA, WAIT, |d| {
            health_of(d, "0000:29:00.0") == Some("Unhealthy")
        })
        .await
        .expect("down");
    kubelet
        .wait_for_devices(GPU_HCA, WAIT, |d| {
            health_of(d, "0000:1b:00.0_0000:18:00.0") == Some("Unhealthy")
        })
        .await
        .expect("pair down");
    kubelet.restart().await.expect("kubelet restart");
    kubelet
        .wait_for_resources(&[HCA, GPU_HCA], WAIT)
        .await
        .expect("registered again");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    for line in [
        r#"rocefabric_device_plugin_devices{resource="rdma/hca",health="Healthy"} 5"#,
        r#"rocefabric_device_plugin_devices{resource="rdma/hca",health="Unhealthy"} 1"#,
        r#"rocefabric_device_plugin_devices{resource="rdma/gpu-hca",health="Healthy"} 7"#,
        r#"rocefabric_device_plugin_allocations_total{resource="rdma/hca",result="success"} 1"#,
        r#"rocefabric_device_plugin_allocations_total{resource="rdma/hca",result="unknown_device"} 1"#,
        r#"rocefabric_device_plugin_allocations_total{resource="rdma/hca",result="not_owned"} 1"#,
        "rocefabric_device_plugin_kubelet_restarts_total 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(
        !text.contains("nvidia.com/gpu"),
        "a disabled resource is not reported"
    );
    daemon.stop().await.expect("clean stop");
}

/// A kubelet socket that never appears (the plugin directory was re-created on the host and this
/// process still sees the old one through its mount): after the limit, `serve` exits with the
/// reason, so the kubelet restarts the container with a fresh mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_when_never_registered_for_too_long() {
    let node = Node::dgx();
    let mut options = node.options(fast_config());
    options.liveness_interval = Duration::from_millis(50);
    options.exit_after_unregistered = Some(Duration::from_millis(300));
    let started = Instant::now();
    let err = Daemon::start(options)
        .stop_when_done()
        .await
        .expect_err("exits");
    let text = err.to_string();
    assert!(text.contains("not registered with the kubelet"), "{text}");
    assert!(text.contains("kubelet.sock"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "not before the limit"
    );
}

/// With a kubelet that accepts the registrations, the same limit never fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_daemon_does_not_exit() {
    let node = Node::dgx();
    let mut options = node.options(fast_config());
    options.liveness_interval = Duration::from_millis(50);
    options.exit_after_unregistered = Some(Duration::from_millis(300));
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    let daemon = Daemon::start(options);
    kubelet
        .wait_for_resources(&[HCA], WAIT)
        .await
        .expect("registered");
    tokio::time::sleep(Duration::from_millis(800)).await;
    daemon.stop().await.expect("still running, stops cleanly");
}

/// A GPU whose `/dev/nvidiaN` is missing (driver unloaded, node removed) is listed Unhealthy: the
/// kubelet must not hand it out, the container could not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_without_its_device_node_is_unhealthy() {
    let node = Node::dgx();
    std::fs::remove_file(node.dev.join("nvidia2")).expect("remove nvidia2");
    let (kubelet, daemon) = start(&node, gpu_config(), &[GPU]).await;
    let gpus = kubelet
        .snapshot()
        .devices_of(GPU)
        .unwrap_or_default()
        .to_vec();
    assert_eq!(health_of(&gpus, "0000:52:00.0"), Some("Unhealthy"), "GPU 2");
    assert_eq!(gpus.iter().filter(|d| d.health == "Healthy").count(), 7);
    std::fs::write(node.dev.join("nvidia2"), b"").expect("node back");
    kubelet
        .wait_for_devices(GPU, WAIT, |d| {
            health_of(d, "0000:52:00.0") == Some("Healthy")
        })
        .await
        .expect("Healthy once the node is back");
    daemon.stop().await.expect("clean stop");
}

/// The plugin directory itself gone (deleted on the host): our sockets cannot even be bound, and
/// the daemon still exits after the limit instead of retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_when_the_plugin_directory_is_gone() {
    let node = Node::dgx();
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    let mut options = node.options(all_config());
    options.liveness_interval = Duration::from_millis(50);
    options.exit_after_unregistered = Some(Duration::from_millis(500));
    let daemon = Daemon::start(options);
    kubelet
        .wait_for_resources(&ALL, WAIT)
        .await
        .expect("registered");
    drop(kubelet);
    std::fs::remove_dir_all(&node.plugin_dir).expect("remove the plugin directory");
    let err = daemon.stop_when_done().await.expect_err("exits");
    assert!(
        err.to_string().contains("not registered with the kubelet"),
        "{err}"
    );
}

/// A resource whose socket cannot be created (here a directory sits where it goes) is not retried
/// forever: after `start_attempts` in a row `run` ends with the cause, naming the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gives_up_naming_the_cause_when_a_socket_cannot_be_created() {
    use rocefabric_kubelet_api::registration::Backoff;
    use rocefabric_device_plugin::serve::ServeError;
    let node = Node::dgx();
    let blocker = node.plugin_dir.join("rocefabric-rdma_hca.sock");
    std::fs::create_dir_all(blocker.join("not-ours")).expect("a directory where the socket goes");
    let mut options = node.options(fast_config());
    options.start_attempts = 2;
    options.registration_backoff = Backoff {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(1),
    };
    let err = Daemon::start(options)
        .stop_when_done()
        .await
        .expect_err("gives up");
    assert!(matches!(err, ServeError::Start { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot serve rdma/hca after 2 attempts: cannot remove old socket {}: Is a directory (os error 21)",
            blocker.display()
        )
    );
    assert!(blocker.join("not-ours").is_dir(), "left as it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_mode_a_device_a_dra_claim_holds_is_unhealthy_and_refused() {
    use rocefabric_dra::ledger::Ledger;
    let node = Node::dgx();
    let ledger = std::sync::Arc::new(Ledger::default());
    let claimed = "0000:18:00.0";
    ledger.restore_claim("uid-1", "ns/pairs", [claimed.to_string()].into());
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    let mut options = node.options(fast_config());
    options.ledger = Some(std::sync::Arc::clone(&ledger));
    let daemon = Daemon::start(options);
    kubelet
        .wait_for_devices(HCA, WAIT, |d| health_of(d, claimed) == Some("Unhealthy"))
        .await
        .expect("the claimed HCA is listed Unhealthy");
    let message = invalid_argument(
        kubelet
            .allocate(HCA, &[claimed])
            .await
            .expect_err("a claimed HCA is not granted"),
    );
    assert!(
        message.contains("held by DRA claim ns/pairs (uid-1)"),
        "{message}"
    );

    // Granted through the device plugin, an HCA is in the ledger for DRA to see.
    kubelet
        .allocate(HCA, &["0000:40:00.0"])
        .await
        .expect("allocate");
    assert!(
        ledger
            .granted(std::time::Instant::now())
            .contains("0000:40:00.0")
    );

    // Unprepared, the HCA is back.
    ledger.release_claim("uid-1");
    kubelet
        .wait_for_devices(HCA, WAIT, |d| health_of(d, claimed) == Some("Healthy"))
        .await
        .expect("Healthy again once the claim is gone");
    kubelet.allocate(HCA, &[claimed]).await.expect("allocate");
    daemon.stop().await.expect("clean stop");
}

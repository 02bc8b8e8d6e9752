//! Device health as the kubelet sees it: a port going down and up, a device gone from sysfs, a
//! GPU without its device node, and the QoS gate.

use rocefabric_node_model::config::Config;
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_testing::fixtures;
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;

use crate::common::*;
use crate::{COMPUTE_HCAS, numa_of};

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

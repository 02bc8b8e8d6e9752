//! Allocate and GetPreferredAllocation: the devices and environment a container gets, unknown
//! IDs, NUMA-local preferences, and devices a DRA claim holds in `both` mode.

use std::collections::BTreeMap;

use rocefabric_kubelet_api::pb;
use rocefabric_node_model::config::Config;
use rocefabric_node_testing::fixtures::FixtureNode;
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;

use crate::COMPUTE_HCAS;
use crate::common::*;

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

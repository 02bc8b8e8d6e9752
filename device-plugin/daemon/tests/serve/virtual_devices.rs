//! Virtual RDMA devices (Soft-RoCE `rxe`) on fixture trees laid out as the kernel lays out rxe
//! (`shared/reference/soft-roce.md`): discovery, selection, topology, and `serve`'s
//! `softRoce: exclude | include`. The same behaviour on a real rxe device is the `soft_roce`
//! suite of `rocefabric-e2e` (a qemu VM).

#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::collections::BTreeMap;

use crate::common::{HCA, Node, WAIT, fast_config, health_of, host_paths, ids, start};
use rocefabric_api::NicSelector;
use rocefabric_kubelet_api::pb;
use rocefabric_node_model::config::{Config, SoftRoce};
use rocefabric_node_model::inventory::discover;
use rocefabric_node_model::model::{Distance, Hca, Health, Inventory, PortState};
use rocefabric_node_model::topology;
use rocefabric_node_testing::fixtures::{self, FixtureNode};

/// rxe0 on the VM fixture's eth0 (MAC 52:54:00:12:34:56): the node GUID is the MAC in EUI-64.
const VM_RXE_ID: &str = "virtual-505400fffe123456";
/// rxe0 on the DGX fixture's onboard eno3 (MAC 7c:c2:55:10:20:30).
const DGX_RXE_ID: &str = "virtual-7ec255fffe102030";

fn discover_in(node: &FixtureNode, selector: &NicSelector) -> Inventory {
    let dir = fixtures::tempdir().unwrap();
    node.write_to(dir.path()).unwrap();
    discover(dir.path(), selector).unwrap()
}

fn rxe(inv: &Inventory) -> &Hca {
    inv.hcas
        .iter()
        .find(|h| h.is_virtual())
        .expect("a virtual HCA")
}

/// The DGX H100 with an rxe device on its onboard (non-RDMA) NIC, uverbs14.
fn dgx_with_rxe() -> FixtureNode {
    FixtureNode::dgx_h100().with_soft_roce("rxe0", "eno3", Some(14))
}

#[test]
fn rxe_is_discovered_with_its_parent_real_gid_index_and_no_pci_identity() {
    let inv = discover_in(&FixtureNode::vm_soft_roce(), &NicSelector::default());
    assert_eq!(inv.hcas.len(), 1);
    let h = &inv.hcas[0];
    assert_eq!(h.id, VM_RXE_ID);
    assert_eq!(h.name, "rxe0");
    assert!(h.is_virtual());
    assert_eq!(
        (h.pci_address.as_deref(), h.vendor, h.device_id),
        (None, None, None)
    );
    assert_eq!(h.netdev.as_deref(), Some("eth0"));
    // rxe has RoCE v2 entries only: link-local at 0, the IPv4-mapped address at 1.
    assert_eq!(h.roce_v2_gid_index, Some(1));
    assert_eq!(h.numa_node, None);
    assert_eq!(h.uverbs.as_deref(), Some("uverbs0"));
    assert_eq!((h.state, h.health), (PortState::Active, Health::Healthy));
    assert_eq!(h.device_path, "/devices/virtual/infiniband/rxe0");
}

#[test]
fn the_id_does_not_depend_on_the_rxe_number() {
    let mut renamed = FixtureNode::vm_soft_roce();
    renamed.soft_roce.clear();
    let renamed = renamed.with_soft_roce("rxe7", "eth0", Some(3));
    let inv = discover_in(&renamed, &NicSelector::default());
    assert_eq!(rxe(&inv).id, VM_RXE_ID);
    assert_eq!(rxe(&inv).uverbs.as_deref(), Some("uverbs3"));
}

#[test]
fn pci_selectors_never_pick_a_virtual_device_names_do() {
    let node = dgx_with_rxe();
    let all = discover_in(&node, &NicSelector::default());
    assert_eq!(all.hcas.len(), 15);
    assert_eq!(rxe(&all).id, DGX_RXE_ID);
    assert_eq!(rxe(&all).roce_v2_gid_index, Some(1));

    let by_vendor: NicSelector = serde_json::from_str(r#"{"vendors": ["15b3"]}"#).unwrap();
    let inv = discover_in(&node, &by_vendor);
    assert!(inv.hcas.iter().all(|h| !h.is_virtual()));
    let by_name: NicSelector = serde_json::from_str(r#"{"rdmaDevices": ["rxe0"]}"#).unwrap();
    assert_eq!(ids_of(&discover_in(&node, &by_name)), vec![DGX_RXE_ID]);
    let by_netdev: NicSelector = serde_json::from_str(r#"{"netdevs": ["eno3"]}"#).unwrap();
    assert_eq!(ids_of(&discover_in(&node, &by_netdev)), vec![DGX_RXE_ID]);
}

fn ids_of(inv: &Inventory) -> Vec<&str> {
    inv.hcas.iter().map(|h| h.id.as_str()).collect()
}

#[test]
fn a_virtual_device_is_far_from_every_gpu_and_never_a_rail() {
    let without = discover_in(&FixtureNode::dgx_h100(), &NicSelector::default());
    let with = discover_in(&dgx_with_rxe(), &NicSelector::default());
    let rails = |inv: &Inventory| -> Vec<(String, String)> {
        topology::gpu_hca_pairs(inv)
            .into_iter()
            .map(|(g, h, _)| (g.pci_address.clone(), h.id.clone()))
            .collect()
    };
    assert_eq!(rails(&with), rails(&without));
    let matrix = topology::matrix(&with);
    for row in matrix.values() {
        assert_eq!(row[DGX_RXE_ID], Distance::SYS);
    }
}

#[test]
fn soft_roce_config_is_exclude_by_default_and_strict() {
    assert_eq!(Config::default().soft_roce, SoftRoce::Exclude);
    let c = Config::from_yaml("softRoce: include\n").unwrap();
    assert_eq!(c.soft_roce, SoftRoce::Include);
    let err = Config::from_yaml("softRoce: yes\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("softRoce") && err.contains("yes"), "{err}");

    let mut inv = discover_in(&dgx_with_rxe(), &NicSelector::default());
    SoftRoce::Include.apply(&mut inv);
    assert_eq!(inv.hcas.len(), 15);
    SoftRoce::Exclude.apply(&mut inv);
    assert_eq!(inv.hcas.len(), 14);
    assert!(inv.hcas.iter().all(|h| !h.is_virtual()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_advertises_a_soft_device_only_when_configured() {
    let node = Node::new(&dgx_with_rxe());
    let (kubelet, daemon) = start(&node, fast_config(), &[HCA]).await;
    let listed = kubelet.snapshot();
    let hcas = listed.devices_of(HCA).unwrap();
    assert_eq!(hcas.len(), 14);
    assert!(!ids(hcas).contains(&DGX_RXE_ID), "{:?}", ids(hcas));
    let refused = kubelet.allocate(HCA, &[DGX_RXE_ID]).await.unwrap_err();
    assert!(refused.to_string().contains(DGX_RXE_ID), "{refused}");
    daemon.stop().await.unwrap();
    drop(kubelet);

    let node = Node::new(&dgx_with_rxe());
    let config = Config {
        soft_roce: SoftRoce::Include,
        ..fast_config()
    };
    let (kubelet, daemon) = start(&node, config, &[HCA]).await;
    let listed = kubelet.snapshot();
    let hcas = listed.devices_of(HCA).unwrap();
    assert_eq!(hcas.len(), 15);
    assert_eq!(health_of(hcas, DGX_RXE_ID), Some("Healthy"));
    daemon.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocating_a_soft_device_hands_out_its_uverbs_and_gid_index() {
    let node = Node::new(&FixtureNode::vm_soft_roce());
    let config = Config {
        soft_roce: SoftRoce::Include,
        traffic_class: Some(106),
        ..fast_config()
    };
    let (kubelet, daemon) = start(&node, config, &[HCA]).await;
    let listed = kubelet.snapshot();
    let device = &listed.devices_of(HCA).unwrap()[0];
    assert_eq!(device.id, VM_RXE_ID);
    assert!(device.topology.is_none(), "NUMA unknown: no topology hint");

    let response = kubelet.allocate(HCA, &[VM_RXE_ID]).await.unwrap();
    let paths = host_paths(&response);
    assert_eq!(
        paths,
        ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"]
    );
    let env: BTreeMap<&str, &str> = response
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let want: BTreeMap<&str, &str> = [
        ("NCCL_IB_HCA", "=rxe0:1"),
        ("UCX_NET_DEVICES", "rxe0:1"),
        ("NCCL_IB_GID_INDEX", "1"),
        ("NCCL_IB_TC", "106"),
        ("UCX_IB_TRAFFIC_CLASS", "106"),
    ]
    .into_iter()
    .collect();
    // No PCIDEVICE_* variable: a virtual device has no PCI address to name.
    assert_eq!(env, want);
    daemon.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parent_link_going_down_makes_the_soft_device_unhealthy() {
    let node = Node::new(&FixtureNode::vm_soft_roce());
    let config = Config {
        soft_roce: SoftRoce::Include,
        ..fast_config()
    };
    let (kubelet, daemon) = start(&node, config, &[HCA]).await;
    let unhealthy = |d: &[pb::Device]| health_of(d, VM_RXE_ID) == Some("Unhealthy");
    fixtures::set_port_state(&node.sysfs, "rxe0", 1, false).unwrap();
    kubelet
        .wait_for_devices(HCA, WAIT, unhealthy)
        .await
        .unwrap();
    fixtures::set_port_state(&node.sysfs, "rxe0", 1, true).unwrap();
    kubelet
        .wait_for_devices(HCA, WAIT, |d| health_of(d, VM_RXE_ID) == Some("Healthy"))
        .await
        .unwrap();
    daemon.stop().await.unwrap();
}

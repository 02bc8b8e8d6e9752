//! GPUs: PCI order, the driver's numbering and UUIDs, NVSwitches, missing NUMA information,
//! unreadable or foreign-bound functions, and a node with GPUs only.

use std::fs;

use rocefabric_api::NicSelector;
use rocefabric_node_model::inventory::discover_with;
use rocefabric_node_model::model::{Distance, Health};
use rocefabric_node_model::topology;
use rocefabric_node_testing::fixtures::FixtureNode;

use crate::{DGX_RAILS, discover_all, written};

#[test]
fn dgx_fixture_discovers_gpus_in_pci_order_and_skips_nvswitches() {
    let dir = written(&FixtureNode::dgx_h100());
    let inv = discover_all(dir.path());
    let got: Vec<_> = inv
        .gpus
        .iter()
        .map(|g| (g.index, g.pci_address.as_str(), g.numa_node.unwrap()))
        .collect();
    let want: Vec<_> = DGX_RAILS
        .iter()
        .enumerate()
        .map(|(i, (gpu, _, numa))| (i as u32, *gpu, *numa))
        .collect();
    assert_eq!(got, want);
    assert!(
        inv.gpus
            .iter()
            .all(|g| g.device_id == 0x2330 && g.health == Health::Healthy)
    );
    assert_eq!(
        inv.gpus[0].pci_path,
        "/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0/0000:1a:00.0/0000:1b:00.0"
    );
    // The NVSwitch functions (10de:22a3, class 0x0680) are in the tree but are not GPUs.
    assert!(dir.path().join("bus/pci/devices/0000:03:00.0").exists());
}

/// The driver's own numbering wins over PCI order, and gives the UUIDs; a GPU with no driver bound
/// is listed Unhealthy (it has no device node to hand out).
#[test]
fn gpu_minor_and_uuid_come_from_the_driver_and_an_unbound_gpu_is_unhealthy() {
    let mut node = FixtureNode::dgx_h100();
    node.function_mut("0000:df:00.0").unwrap().driver = None;
    let dir = written(&node);
    let proc = tempfile::tempdir().unwrap();
    // The driver numbered the first two GPUs the other way round.
    for (bdf, minor) in [("0000:1b:00.0", 1), ("0000:43:00.0", 0)] {
        let info = proc.path().join("driver/nvidia/gpus").join(bdf);
        fs::create_dir_all(&info).unwrap();
        fs::write(
            info.join("information"),
            format!("Model: \t NVIDIA H100\nGPU UUID: \t GPU-0000000{minor}-aaaa-bbbb-cccc-dddddddddddd\nDevice Minor: \t {minor}\n"),
        )
        .unwrap();
    }
    // Only two of eight GPUs numbered by the driver: mixing numberings could give two GPUs one N,
    // so PCI order for all (the UUIDs are still the driver's).
    let partial = discover_with(dir.path(), Some(proc.path()), &NicSelector::default()).unwrap();
    let indexes: Vec<u32> = partial.gpus.iter().map(|g| g.index).collect();
    assert_eq!(indexes, (0..8).collect::<Vec<u32>>());
    for (bdf, minor) in [
        ("0000:52:00.0", 2),
        ("0000:61:00.0", 3),
        ("0000:9d:00.0", 4),
        ("0000:c3:00.0", 5),
        ("0000:d1:00.0", 6),
        ("0000:df:00.0", 7),
    ] {
        let info = proc.path().join("driver/nvidia/gpus").join(bdf);
        fs::create_dir_all(&info).unwrap();
        fs::write(
            info.join("information"),
            format!("Device Minor: \t {minor}\n"),
        )
        .unwrap();
    }
    let inv = discover_with(dir.path(), Some(proc.path()), &NicSelector::default()).unwrap();
    let gpu = |bdf: &str| inv.gpus.iter().find(|g| g.pci_address == bdf).unwrap();
    assert_eq!(
        (gpu("0000:1b:00.0").index, gpu("0000:43:00.0").index),
        (1, 0)
    );
    assert_eq!(
        gpu("0000:1b:00.0").uuid.as_deref(),
        Some("GPU-00000001-aaaa-bbbb-cccc-dddddddddddd")
    );
    assert_eq!(
        gpu("0000:52:00.0").uuid,
        None,
        "no information file: no UUID"
    );
    assert_eq!(
        gpu("0000:df:00.0").health,
        Health::Unhealthy,
        "no driver bound"
    );
    assert!(
        inv.gpus
            .iter()
            .filter(|g| g.pci_address != "0000:df:00.0")
            .all(|g| g.health == Health::Healthy)
    );
    // Without a proc root, PCI order as before.
    let plain = discover_all(dir.path());
    assert_eq!(plain.gpus[0].index, 0);
    assert_eq!(plain.gpus[0].uuid, None);
}

#[test]
fn node_without_rdma_has_gpus_only() {
    let dir = written(&FixtureNode::variant("dgx-h100-no-rdma").unwrap());
    let inv = discover_all(dir.path());
    assert!(inv.hcas.is_empty());
    assert_eq!(inv.gpus.len(), 8);
    assert!(topology::gpu_hca_pairs(&inv).is_empty());
    assert!(
        dir.path().join("class/net/enp24s0np0").exists(),
        "netdevs stay without RDMA"
    );
}

#[test]
fn gpu_without_numa_information() {
    let dir = written(&FixtureNode::variant("dgx-h100-gpu-no-numa").unwrap());
    assert_eq!(
        fs::read_to_string(dir.path().join("bus/pci/devices/0000:61:00.0/numa_node")).unwrap(),
        "-1\n"
    );
    let inv = discover_all(dir.path());
    let gpu3 = &inv.gpus[3];
    assert_eq!(
        (gpu3.index, gpu3.pci_address.as_str(), gpu3.numa_node),
        (3, "0000:61:00.0", None)
    );
    let m = topology::matrix(&inv);
    assert_eq!(
        m["0000:61:00.0"]["0000:5e:00.0"],
        Distance::PXB,
        "same switch, NUMA irrelevant"
    );
    assert_eq!(
        m["0000:61:00.0"]["0000:18:00.0"],
        Distance::SYS,
        "unknown NUMA is never NODE"
    );
    assert_eq!(m["0000:1b:00.0"]["0000:18:00.0"], Distance::PXB);
}

#[test]
fn an_unreadable_gpu_keeps_the_indexes_of_the_gpus_after_it() {
    let dir = written(&FixtureNode::dgx_h100());
    let root = dir.path();
    // GPU1 is a GPU (vendor and class read fine) but its NUMA node is garbage: it is skipped,
    // and GPU2 must still be /dev/nvidia2, not take GPU1's device node.
    fs::write(root.join("bus/pci/devices/0000:43:00.0/numa_node"), "one\n").unwrap();
    let inv = discover_all(root);
    let gpus: Vec<_> = inv
        .gpus
        .iter()
        .map(|g| (g.index, g.pci_address.as_str()))
        .collect();
    assert_eq!(gpus.len(), 7);
    assert_eq!(gpus[0], (0, "0000:1b:00.0"));
    assert_eq!(
        gpus[1],
        (2, "0000:52:00.0"),
        "index follows the driver's numbering"
    );
}

#[test]
fn a_gpu_bound_to_another_driver_is_not_advertised_or_numbered() {
    let mut node = FixtureNode::dgx_h100();
    node.function_mut("0000:1b:00.0").unwrap().driver = Some("vfio-pci".into());
    let dir = written(&node);
    let inv = discover_all(dir.path());
    let gpus: Vec<_> = inv
        .gpus
        .iter()
        .map(|g| (g.index, g.pci_address.as_str()))
        .collect();
    assert_eq!(gpus.len(), 7);
    assert_eq!(gpus[0], (0, "0000:43:00.0"));
}

//! Discovery, topology and fixture layout on the DGX H100 fixture and its variants.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use rocefabric_api::NicSelector;
use rocefabric_node_testing::fixtures::{self, FixtureNode};
use rocefabric_node_model::inventory::{DiscoverError, discover, discover_with};
use rocefabric_node_model::model::{Distance, Health, Inventory, PortState};
use rocefabric_node_model::topology;

fn written(node: &FixtureNode) -> tempfile::TempDir {
    let dir = fixtures::tempdir().unwrap();
    node.write_to(dir.path()).unwrap();
    dir
}

fn discover_all(root: &Path) -> Inventory {
    discover(root, &NicSelector::default()).unwrap()
}

/// (PCI address, RDMA device, netdev, NUMA node, uverbs) of every RoCE HCA of the DGX fixture,
/// in PCI order: 8 compute ConnectX-7, 2x2 storage ports, 2 irdma ports.
const DGX_HCAS: [(&str, &str, &str, u32, &str); 14] = [
    ("0000:18:00.0", "mlx5_0", "enp24s0np0", 0, "uverbs2"),
    ("0000:29:00.0", "mlx5_1", "enp41s0f0np0", 0, "uverbs3"),
    ("0000:29:00.1", "mlx5_2", "enp41s0f1np1", 0, "uverbs4"),
    ("0000:40:00.0", "mlx5_3", "enp64s0np0", 0, "uverbs5"),
    ("0000:4f:00.0", "mlx5_4", "enp79s0np0", 0, "uverbs6"),
    ("0000:5e:00.0", "mlx5_5", "enp94s0np0", 0, "uverbs7"),
    ("0000:82:00.0", "irdma0", "enp130s0f0", 1, "uverbs0"),
    ("0000:82:00.1", "irdma1", "enp130s0f1", 1, "uverbs1"),
    ("0000:9a:00.0", "mlx5_6", "enp154s0np0", 1, "uverbs8"),
    ("0000:aa:00.0", "mlx5_7", "enp170s0f0np0", 1, "uverbs9"),
    ("0000:aa:00.1", "mlx5_8", "enp170s0f1np1", 1, "uverbs10"),
    ("0000:c0:00.0", "mlx5_9", "enp192s0np0", 1, "uverbs11"),
    ("0000:ce:00.0", "mlx5_10", "enp206s0np0", 1, "uverbs12"),
    ("0000:dc:00.0", "mlx5_11", "enp220s0np0", 1, "uverbs13"),
];

/// (GPU PCI address, its rail NIC's PCI address, NUMA node), GPU 0..7 (dgx-h100.md).
const DGX_RAILS: [(&str, &str, u32); 8] = [
    ("0000:1b:00.0", "0000:18:00.0", 0),
    ("0000:43:00.0", "0000:40:00.0", 0),
    ("0000:52:00.0", "0000:4f:00.0", 0),
    ("0000:61:00.0", "0000:5e:00.0", 0),
    ("0000:9d:00.0", "0000:9a:00.0", 1),
    ("0000:c3:00.0", "0000:c0:00.0", 1),
    ("0000:d1:00.0", "0000:ce:00.0", 1),
    ("0000:df:00.0", "0000:dc:00.0", 1),
];

#[test]
fn dgx_fixture_discovers_every_roce_hca() {
    let dir = written(&FixtureNode::dgx_h100());
    let inv = discover_all(dir.path());
    let got: Vec<_> = inv
        .hcas
        .iter()
        .map(|h| {
            (
                h.id.as_str(),
                h.name.as_str(),
                h.netdev.as_deref().unwrap(),
                h.numa_node.unwrap(),
                h.uverbs.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, DGX_HCAS);
    for h in &inv.hcas {
        assert_eq!(h.port, 1, "{}", h.name);
        assert_eq!(h.state, PortState::Active, "{}", h.name);
        assert_eq!(h.health, Health::Healthy, "{}", h.name);
        assert_eq!(
            h.roce_v2_gid_index,
            Some(3),
            "{}: mlx5 layout puts IPv4 v2 at 3",
            h.name
        );
        let (vendor, device) = if h.name.starts_with("irdma") {
            (0x8086, 0x159b)
        } else {
            (0x15b3, 0x1021)
        };
        assert_eq!(
            (h.vendor, h.device_id),
            (Some(vendor), Some(device)),
            "{}",
            h.name
        );
        assert_eq!(h.pci_address.as_deref(), Some(h.id.as_str()));
        assert!(
            h.device_path.starts_with("/devices/pci0000:"),
            "{}",
            h.device_path
        );
        assert!(h.device_path.ends_with(&h.id), "{}", h.device_path);
    }
    let mlx5_0 = &inv.hcas[0];
    assert_eq!(
        mlx5_0.device_path,
        "/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
    );
}

#[test]
fn a_renamed_netdev_keeps_its_port_and_roce_v2_gid() {
    let node = FixtureNode::dgx_h100().with_netdev_renamed("enp24s0np0", "rfe2e-n0");
    let dir = written(&node);
    let inv = discover_all(dir.path());
    let mlx5_0 = inv.hcas.iter().find(|h| h.name == "mlx5_0").unwrap();
    assert_eq!(mlx5_0.netdev.as_deref(), Some("rfe2e-n0"));
    assert_eq!(
        mlx5_0.roce_v2_gid_index,
        Some(3),
        "GID ndevs follow the name"
    );
    assert!(
        inv.hcas
            .iter()
            .all(|h| h.netdev.as_deref() != Some("enp24s0np0"))
    );
}

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
fn dgx_topology_matrix_matches_nvidia_smi() {
    let dir = written(&FixtureNode::dgx_h100());
    let inv = discover_all(dir.path());
    let m = topology::matrix(&inv);
    assert_eq!(m.len(), 8);
    for (gpu, rail_nic, gpu_numa) in DGX_RAILS {
        let row = &m[gpu];
        assert_eq!(row.len(), 14);
        for (hca, _, _, hca_numa, _) in DGX_HCAS {
            let want = if hca == rail_nic {
                Distance::PXB
            } else if hca_numa == gpu_numa {
                Distance::NODE
            } else {
                Distance::SYS
            };
            assert_eq!(row[hca], want, "GPU {gpu} to HCA {hca}");
        }
    }
}

#[test]
fn storage_and_irdma_ports_are_pix_to_their_sibling() {
    let dir = written(&FixtureNode::dgx_h100());
    let inv = discover_all(dir.path());
    let by = |name: &str| inv.hcas.iter().find(|h| h.name == name).unwrap();
    assert_eq!(
        topology::hca_distance(by("mlx5_1"), by("mlx5_2")),
        Distance::PIX
    );
    assert_eq!(
        topology::hca_distance(by("mlx5_7"), by("mlx5_8")),
        Distance::PIX
    );
    assert_eq!(
        topology::hca_distance(by("irdma0"), by("irdma1")),
        Distance::PIX
    );
    assert_eq!(
        topology::hca_distance(by("mlx5_1"), by("mlx5_0")),
        Distance::NODE
    );
    assert_eq!(
        topology::hca_distance(by("mlx5_1"), by("mlx5_7")),
        Distance::SYS
    );
}

#[test]
fn every_gpu_pairs_with_its_rail_nic() {
    let dir = written(&FixtureNode::dgx_h100());
    let inv = discover_all(dir.path());
    let pairs: Vec<_> = topology::gpu_hca_pairs(&inv)
        .into_iter()
        .map(|(g, h, d)| (g.pci_address.as_str(), h.id.as_str(), d))
        .collect();
    let want: Vec<_> = DGX_RAILS
        .iter()
        .map(|(g, n, _)| (*g, *n, Distance::PXB))
        .collect();
    assert_eq!(pairs, want);
}

#[test]
fn link_down_port_is_listed_unhealthy() {
    let dir = written(&FixtureNode::variant("dgx-h100-link-down").unwrap());
    let inv = discover_all(dir.path());
    assert_eq!(inv.hcas.len(), 14);
    let h = inv.hcas.iter().find(|h| h.name == "mlx5_3").unwrap();
    assert_eq!(h.state, PortState::Down);
    assert_eq!(h.health, Health::Unhealthy);
    assert_eq!(
        h.roce_v2_gid_index,
        Some(3),
        "the GID table outlives the carrier"
    );
    assert_eq!(
        inv.hcas
            .iter()
            .filter(|h| h.health == Health::Unhealthy)
            .count(),
        1
    );
}

#[test]
fn infiniband_port_is_not_advertised() {
    let dir = written(&FixtureNode::variant("dgx-h100-ib-port").unwrap());
    let inv = discover_all(dir.path());
    assert_eq!(inv.hcas.len(), 13);
    assert!(inv.hcas.iter().all(|h| h.name != "mlx5_0"));
    let link_layer = fs::read_to_string(
        dir.path()
            .join("class/infiniband/mlx5_0/ports/1/link_layer"),
    )
    .unwrap();
    assert_eq!(link_layer, "InfiniBand\n");
    // GPU 0 loses its rail; the others keep theirs.
    let pairs = topology::gpu_hca_pairs(&inv);
    assert_eq!(pairs.len(), 7);
    assert!(
        pairs
            .iter()
            .all(|(g, _, _)| g.pci_address != "0000:1b:00.0")
    );
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
fn gid_index_is_found_not_assumed() {
    let dir = written(&FixtureNode::variant("dgx-h100-gid-ipv6-first").unwrap());
    let inv = discover_all(dir.path());
    let h = &inv.hcas[0];
    assert_eq!(h.name, "mlx5_0");
    assert_eq!(h.roce_v2_gid_index, Some(5));
    let port = dir.path().join("class/infiniband/mlx5_0/ports/1");
    assert_eq!(
        fs::read_to_string(port.join("gid_attrs/types/3")).unwrap(),
        "RoCE v2\n"
    );
    assert_eq!(
        fs::read_to_string(port.join("gids/3")).unwrap(),
        "fd00:0200:0000:0000:0000:0000:0000:0010\n",
        "index 3 is the IPv6 address's v2 GID"
    );
    assert_eq!(
        fs::read_to_string(port.join("gids/5")).unwrap(),
        "0000:0000:0000:0000:0000:ffff:0ac8:000a\n"
    );
    assert_eq!(
        inv.hcas[1].roce_v2_gid_index,
        Some(3),
        "other HCAs keep the usual layout"
    );
}

#[test]
fn gid_index_needs_the_ports_own_netdev() {
    let dir = written(&FixtureNode::dgx_h100());
    let port = dir.path().join("class/infiniband/mlx5_0/ports/1");
    // Entry 3 now belongs to another interface (a macvlan, say): no usable index remains.
    fs::write(port.join("gid_attrs/ndevs/3"), "macvlan0\n").unwrap();
    let inv = discover_all(dir.path());
    assert_eq!(inv.hcas[0].roce_v2_gid_index, None);
    assert_eq!(
        inv.hcas[0].health,
        Health::Healthy,
        "the GID index does not decide health"
    );
}

#[test]
fn kernel_layout_symlinks_are_relative() {
    let dir = written(&FixtureNode::dgx_h100());
    let root = dir.path();
    let link = |p: &str| {
        let md = fs::symlink_metadata(root.join(p)).unwrap();
        assert!(md.file_type().is_symlink(), "{p} must be a symlink");
        fs::read_link(root.join(p))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    assert_eq!(
        link("class/infiniband/mlx5_0"),
        "../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/infiniband/mlx5_0"
    );
    assert_eq!(
        link("class/infiniband/mlx5_0/device"),
        "../../../0000:18:00.0"
    );
    assert_eq!(
        link("bus/pci/devices/0000:18:00.0"),
        "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
    );
    assert_eq!(link("class/net/enp24s0np0/device"), "../../../0000:18:00.0");
    assert!(link("class/infiniband_verbs/uverbs2").starts_with("../../devices/pci0000:15/"));
    assert!(link("class/infiniband_mad/umad2").ends_with("0000:18:00.0/infiniband_mad/umad2"));
    assert!(link("bus/pci/devices/0000:18:00.0/driver").ends_with("bus/pci/drivers/mlx5_core"));
    // Real directories where sysfs has directories.
    let fdir = root.join("devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0");
    assert!(
        !fs::symlink_metadata(&fdir)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let ib = fdir.join("infiniband/mlx5_0");
    // Attribute files in the kernel's exact formats.
    let attributes = [
        (fdir.join("infiniband_verbs/uverbs2/ibdev"), "mlx5_0\n"),
        (fdir.join("infiniband_verbs/uverbs2/dev"), "231:194\n"),
        (fdir.join("vendor"), "0x15b3\n"),
        (fdir.join("class"), "0x020000\n"),
        (ib.join("node_type"), "1: CA\n"),
        (ib.join("hca_type"), "MT4129\n"),
        (ib.join("ports/1/state"), "4: ACTIVE\n"),
        (ib.join("ports/1/phys_state"), "5: LinkUp\n"),
        (ib.join("ports/1/hw_counters/np_cnp_sent"), "0\n"),
        (ib.join("ports/1/gid_attrs/types/1"), "RoCE v2\n"),
        (ib.join("ports/1/gid_attrs/ndevs/3"), "enp24s0np0\n"),
        (
            ib.join("ports/1/gids/0"),
            "fe80:0000:0000:0000:a288:c2ff:fe3b:5010\n",
        ),
    ];
    for (path, expected) in attributes {
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            expected,
            "{}",
            path.display()
        );
    }
    // Unused GID entries read as zeros; their attributes exist but cannot be read.
    assert_eq!(fs::read_dir(ib.join("ports/1/gids")).unwrap().count(), 255);
    assert_eq!(
        fs::read_to_string(ib.join("ports/1/gids/200")).unwrap(),
        "0000:0000:0000:0000:0000:0000:0000:0000\n"
    );
    assert!(ib.join("ports/1/gid_attrs/types/200").exists());
    assert!(fs::read_to_string(ib.join("ports/1/gid_attrs/types/200")).is_err());
    assert!(fs::read_to_string(ib.join("ports/1/gid_attrs/ndevs/200")).is_err());
}

#[test]
fn malformed_attributes_skip_only_that_device() {
    let dir = written(&FixtureNode::dgx_h100());
    let root = dir.path();
    fs::write(
        root.join("class/infiniband/mlx5_4/device/vendor"),
        "garbage\n",
    )
    .unwrap();
    fs::write(
        root.join("class/infiniband/mlx5_5/ports/1/state"),
        "ACTIVE\n",
    )
    .unwrap();
    fs::write(
        root.join("class/infiniband/mlx5_6/device/numa_node"),
        "one\n",
    )
    .unwrap();
    // A dangling device link (the function vanished under us).
    fs::remove_file(root.join("class/infiniband/mlx5_9/device")).unwrap();
    std::os::unix::fs::symlink(
        "../../../0000:ff:00.0",
        root.join("class/infiniband/mlx5_9/device"),
    )
    .unwrap();
    // Unreadable (not merely unusual) link layer.
    let ll = root.join("class/infiniband/mlx5_10/ports/1/link_layer");
    fs::remove_file(&ll).unwrap();
    fs::create_dir(&ll).unwrap();
    fs::write(root.join("bus/pci/devices/0000:43:00.0/class"), "0xZZ\n").unwrap();
    let inv = discover_all(root);
    let names: Vec<_> = inv.hcas.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "irdma0", "irdma1", "mlx5_7", "mlx5_8",
            "mlx5_11"
        ]
    );
    let gpus: Vec<_> = inv
        .gpus
        .iter()
        .map(|g| (g.index, g.pci_address.as_str()))
        .collect();
    assert_eq!(gpus.len(), 7);
    assert_eq!(
        gpus[1],
        (1, "0000:52:00.0"),
        "a function whose class cannot be read is not known to be a GPU: not numbered"
    );
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

#[test]
fn missing_uverbs_makes_an_hca_unhealthy() {
    let dir = written(&FixtureNode::dgx_h100());
    let root = dir.path();
    let uv = fs::canonicalize(root.join("class/infiniband_verbs/uverbs2")).unwrap();
    fs::remove_dir_all(uv).unwrap();
    fs::remove_file(root.join("class/infiniband_verbs/uverbs2")).unwrap();
    let inv = discover_all(root);
    let h = &inv.hcas[0];
    assert_eq!(
        (h.name.as_str(), h.uverbs.as_deref(), h.health),
        ("mlx5_0", None, Health::Unhealthy)
    );
}

#[test]
fn iwarp_devices_are_not_roce() {
    let dir = written(&FixtureNode::dgx_h100());
    fs::write(
        dir.path().join("class/infiniband/irdma1/node_type"),
        "4: RNIC\n",
    )
    .unwrap();
    let inv = discover_all(dir.path());
    assert!(inv.hcas.iter().any(|h| h.name == "irdma0"));
    assert!(inv.hcas.iter().all(|h| h.name != "irdma1"));
}

#[test]
fn selectors_narrow_the_hcas() {
    let dir = written(&FixtureNode::dgx_h100());
    let names = |sel: NicSelector| -> Vec<String> {
        discover(dir.path(), &sel)
            .unwrap()
            .hcas
            .into_iter()
            .map(|h| h.name)
            .collect()
    };
    let mellanox = names(NicSelector {
        vendors: vec!["15b3".into()],
        ..Default::default()
    });
    assert_eq!(mellanox.len(), 12);
    assert_eq!(
        names(NicSelector {
            vendors: vec!["0x8086".into()],
            ..Default::default()
        }),
        ["irdma0", "irdma1"]
    );
    assert_eq!(
        names(NicSelector {
            pci_addresses: vec!["18:00.0".into(), "0000:DC:00.0".into()],
            ..Default::default()
        }),
        ["mlx5_0", "mlx5_11"]
    );
    assert_eq!(
        names(NicSelector {
            rdma_devices: vec!["mlx5_1".into()],
            ..Default::default()
        }),
        ["mlx5_1"],
        "exact names: mlx5_1 does not select mlx5_10 or mlx5_11"
    );
    assert_eq!(
        names(NicSelector {
            vendors: vec!["15b3".into()],
            netdevs: vec!["enp64s0np0".into(), "enp130s0f0".into()],
            ..Default::default()
        }),
        ["mlx5_3"],
        "lists are ANDed"
    );
    assert!(
        names(NicSelector {
            device_ids: vec!["101d".into()],
            ..Default::default()
        })
        .is_empty()
    );
    // GPUs are never narrowed by the HCA selector.
    let inv = discover(
        dir.path(),
        &NicSelector {
            vendors: vec!["8086".into()],
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(inv.gpus.len(), 8);
}

#[test]
fn runtime_helpers_change_a_written_tree() {
    let dir = written(&FixtureNode::dgx_h100());
    let root = dir.path();
    fixtures::set_port_state(root, "mlx5_4", 1, false).unwrap();
    let h = discover_all(root)
        .hcas
        .into_iter()
        .find(|h| h.name == "mlx5_4")
        .unwrap();
    assert_eq!((h.state, h.health), (PortState::Down, Health::Unhealthy));
    assert_eq!(
        fs::read_to_string(root.join("class/net/enp79s0np0/carrier")).unwrap(),
        "0\n"
    );
    fixtures::set_port_state(root, "mlx5_4", 1, true).unwrap();
    let h = discover_all(root)
        .hcas
        .into_iter()
        .find(|h| h.name == "mlx5_4")
        .unwrap();
    assert_eq!((h.state, h.health), (PortState::Active, Health::Healthy));
    assert!(fixtures::set_port_state(root, "mlx5_4", 2, true).is_err());

    fixtures::remove_rdma_device(root, "mlx5_5").unwrap();
    assert!(!root.join("class/infiniband/mlx5_5").exists());
    assert!(!root.join("class/infiniband_verbs/uverbs7").exists());
    assert!(!root.join("class/infiniband_mad/umad7").exists());
    assert!(root.join("class/net/enp94s0np0").exists());
    let inv = discover_all(root);
    assert_eq!(inv.hcas.len(), 13);

    fixtures::remove_pci_function(root, "0000:1b:00.0").unwrap();
    fixtures::remove_pci_function(root, "0000:aa:00.1").unwrap();
    assert!(!root.join("bus/pci/devices/0000:1b:00.0").exists());
    assert!(!root.join("class/net/enp170s0f1np1").exists());
    let inv = discover_all(root);
    assert_eq!(inv.gpus.len(), 7);
    assert_eq!(inv.gpus[0].pci_address, "0000:43:00.0");
    assert_eq!(inv.hcas.len(), 12);
    assert!(inv.hcas.iter().all(|h| h.name != "mlx5_8"));
}

#[test]
fn composed_fixture_variants() {
    let node = FixtureNode::dgx_h100()
        .with_port_down("mlx5_0")
        .with_infiniband_port("mlx5_11")
        .with_gpu_numa("0000:df:00.0", None)
        .without_function("0000:82:00.1");
    let dir = written(&node);
    let inv = discover_all(dir.path());
    assert_eq!(inv.hcas.len(), 12);
    assert_eq!(inv.hcas[0].health, Health::Unhealthy);
    assert_eq!(inv.gpus[7].numa_node, None);
}

#[test]
fn a_missing_root_is_an_error_and_an_empty_one_is_empty() {
    let err = discover(Path::new("/nonexistent/sysfs"), &NicSelector::default()).unwrap_err();
    assert!(matches!(err, DiscoverError::Root { .. }));
    assert!(err.to_string().contains("/nonexistent/sysfs"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(discover_all(empty.path()), Inventory::default());
}

/// A dual-port device on one PCI function (mlx4-style): two netdevs told apart by `dev_port`
/// and by the GID table.
#[test]
fn dual_port_function_uses_its_first_roce_port_and_that_ports_netdev() {
    use rocefabric_node_testing::fixtures::{LinkLayer, Netdev, RdmaPort};
    let mut node = FixtureNode::dgx_h100();
    let f = node.rdma_function_mut("irdma0").unwrap();
    let second = Netdev {
        name: "enp130s0f0d1".into(),
        dev_port: 1,
        addresses: vec!["10.150.9.10".parse().unwrap()],
        ..f.netdevs[0].clone()
    };
    f.netdevs.push(second);
    let rdma = f.rdma.as_mut().unwrap();
    let port2 = RdmaPort {
        number: 2,
        netdev: Some("enp130s0f0d1".into()),
        umad: Some(40),
        ..rdma.ports[0].clone()
    };
    rdma.ports.push(port2);
    let dir = written(&node);
    let inv = discover_all(dir.path());
    let h = inv.hcas.iter().find(|h| h.name == "irdma0").unwrap();
    assert_eq!(
        (h.port, h.netdev.as_deref(), h.roce_v2_gid_index),
        (1, Some("enp130s0f0"), Some(3))
    );

    // Port 1 in InfiniBand mode: port 2 is the RoCE port, with the other netdev.
    let mut ib_first = node.clone();
    let r = ib_first.rdma_mut("irdma0").unwrap();
    r.ports[0].link_layer = LinkLayer::InfiniBand;
    let dir = written(&ib_first);
    let inv = discover_all(dir.path());
    let h = inv.hcas.iter().find(|h| h.name == "irdma0").unwrap();
    assert_eq!(
        (h.port, h.netdev.as_deref(), h.roce_v2_gid_index),
        (2, Some("enp130s0f0d1"), Some(3))
    );
    let a = rocefabric_node_model::allocation::allocate(
        rocefabric_node_model::allocation::ResourceKind::Hca,
        &inv,
        &rocefabric_node_model::config::Config::default(),
        None,
        std::slice::from_ref(&h.id),
    )
    .unwrap();
    assert_eq!(a.envs["NCCL_IB_HCA"], "=irdma0:2");
}

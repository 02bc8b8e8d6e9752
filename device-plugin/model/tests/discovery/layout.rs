//! The fixture's tree and what discovery makes of damaged ones: kernel-style symlinks, malformed
//! attributes, runtime changes, composed variants, a missing or empty root.

use std::fs;
use std::path::Path;

use rocefabric_api::NicSelector;
use rocefabric_node_model::inventory::{DiscoverError, discover};
use rocefabric_node_model::model::{Health, Inventory, PortState};
use rocefabric_node_testing::fixtures::{self, FixtureNode};

use crate::{discover_all, written};

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

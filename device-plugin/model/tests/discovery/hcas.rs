//! RoCE HCAs: the fixture's ports with their netdevs, GIDs, health and uverbs; what is not RoCE;
//! selectors; dual-port functions.

use std::fs;

use rocefabric_api::NicSelector;
use rocefabric_node_model::inventory::discover;
use rocefabric_node_model::model::{Health, PortState};
use rocefabric_node_model::topology;
use rocefabric_node_testing::fixtures::FixtureNode;

use crate::{DGX_HCAS, discover_all, written};

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

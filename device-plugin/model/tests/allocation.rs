//! Advertised devices, preferred allocations and Allocate responses over discovered fixtures.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use proptest::prelude::*;
use rocefabric_api::NicSelector;
use rocefabric_node_model::allocation::{
    AllocateError, DeviceNode, ResourceKind, advertised, allocate, preferred,
};
use rocefabric_node_model::config::Config;
use rocefabric_node_testing::fixtures::{self, FixtureNode};
use rocefabric_node_model::inventory::discover;
use rocefabric_node_model::model::{Health, Inventory};
use rocefabric_node_model::ownership::devices_behind;

fn inventory_of(node: &FixtureNode) -> Inventory {
    let dir = fixtures::tempdir().unwrap();
    node.write_to(dir.path()).unwrap();
    discover(dir.path(), &NicSelector::default()).unwrap()
}

fn dgx() -> &'static Inventory {
    static INV: OnceLock<Inventory> = OnceLock::new();
    INV.get_or_init(|| inventory_of(&FixtureNode::dgx_h100()))
}

/// GPUs served by this plugin: every GPU under the GPU resource, every HCA under `rdma/hca`.
fn gpus_on() -> Config {
    let mut c = Config::default();
    c.gpu.enabled = true;
    c
}

/// GPU + rail pairs served: the rails and their GPUs are the pair resource's.
fn pairs_on() -> Config {
    let mut c = Config::default();
    c.gpu_hca.enabled = true;
    c
}

fn shared(n: u32) -> Config {
    let mut c = Config::default();
    c.hca.shared_replicas = n;
    c
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn dev(path: &str) -> DeviceNode {
    DeviceNode {
        container_path: path.into(),
        host_path: path.into(),
        permissions: "rw".into(),
    }
}

fn numa_of(inv: &Inventory, kind: ResourceKind, cfg: &Config, id: &str) -> Option<u32> {
    advertised(kind, inv, cfg)
        .into_iter()
        .find(|d| d.id == id)
        .unwrap()
        .numa_node
}

#[test]
fn hcas_are_advertised_by_pci_address_with_numa_and_health() {
    let devs = advertised(ResourceKind::Hca, dgx(), &Config::default());
    assert_eq!(devs.len(), 14);
    assert_eq!(devs[0].id, "0000:18:00.0");
    assert_eq!(devs[0].numa_node, Some(0));
    assert_eq!(devs[13].id, "0000:dc:00.0");
    assert_eq!(devs[13].numa_node, Some(1));
    assert!(devs.iter().all(|d| d.health == Health::Healthy));
    assert!(
        advertised(ResourceKind::Gpu, dgx(), &Config::default()).is_empty(),
        "GPUs are off by default"
    );
    let gpus = advertised(ResourceKind::Gpu, dgx(), &gpus_on());
    let gpu_ids: Vec<_> = gpus.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        gpu_ids,
        [
            "0000:1b:00.0",
            "0000:43:00.0",
            "0000:52:00.0",
            "0000:61:00.0",
            "0000:9d:00.0",
            "0000:c3:00.0",
            "0000:d1:00.0",
            "0000:df:00.0"
        ]
    );
}

#[test]
fn shared_replicas_stay_traceable_to_their_hca() {
    let devs = advertised(ResourceKind::Hca, dgx(), &shared(4));
    assert_eq!(devs.len(), 56);
    let first: Vec<_> = devs[..4].iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        first,
        [
            "0000:18:00.0#0",
            "0000:18:00.0#1",
            "0000:18:00.0#2",
            "0000:18:00.0#3"
        ]
    );
    let distinct: BTreeSet<_> = devs.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(distinct.len(), 56);
    assert!(devs.iter().all(|d| d.id.len() <= 63));
    let max = advertised(ResourceKind::Hca, dgx(), &shared(1024));
    assert!(max.iter().all(|d| d.id.len() <= 63));
}

#[test]
fn pairs_are_each_gpu_with_its_rail() {
    assert!(
        advertised(ResourceKind::GpuHca, dgx(), &Config::default()).is_empty(),
        "pairs are off by default"
    );
    let devs = advertised(ResourceKind::GpuHca, dgx(), &pairs_on());
    let got: Vec<_> = devs.iter().map(|d| (d.id.as_str(), d.numa_node)).collect();
    assert_eq!(
        got,
        [
            ("0000:1b:00.0_0000:18:00.0", Some(0)),
            ("0000:43:00.0_0000:40:00.0", Some(0)),
            ("0000:52:00.0_0000:4f:00.0", Some(0)),
            ("0000:61:00.0_0000:5e:00.0", Some(0)),
            ("0000:9d:00.0_0000:9a:00.0", Some(1)),
            ("0000:c3:00.0_0000:c0:00.0", Some(1)),
            ("0000:d1:00.0_0000:ce:00.0", Some(1)),
            ("0000:df:00.0_0000:dc:00.0", Some(1)),
        ]
    );
    // A pair is unhealthy when its HCA is.
    let down = inventory_of(&FixtureNode::variant("dgx-h100-link-down").unwrap());
    let devs = advertised(ResourceKind::GpuHca, &down, &pairs_on());
    let unhealthy: Vec<_> = devs
        .iter()
        .filter(|d| d.health == Health::Unhealthy)
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(unhealthy, ["0000:43:00.0_0000:40:00.0"]);
    // A GPU with unknown NUMA takes its HCA's node.
    let no_numa = inventory_of(&FixtureNode::variant("dgx-h100-gpu-no-numa").unwrap());
    let cfg = pairs_on();
    assert_eq!(
        numa_of(
            &no_numa,
            ResourceKind::GpuHca,
            &cfg,
            "0000:61:00.0_0000:5e:00.0"
        ),
        Some(0)
    );
    assert_eq!(
        numa_of(&no_numa, ResourceKind::Gpu, &gpus_on(), "0000:61:00.0"),
        None
    );
}

/// GPUs the driver gave UUIDs are named by UUID in `NVIDIA_VISIBLE_DEVICES`; without UUIDs for
/// every granted GPU, by index.
#[test]
fn visible_devices_are_uuids_when_the_driver_gave_them() {
    let mut inv = dgx().clone();
    let grant = ids(&["0000:1b:00.0", "0000:43:00.0"]);
    let env = |inv: &Inventory| {
        allocate(ResourceKind::Gpu, inv, &gpus_on(), None, &grant)
            .unwrap()
            .envs["NVIDIA_VISIBLE_DEVICES"]
            .clone()
    };
    assert_eq!(env(&inv), "0,1");
    inv.gpus[0].uuid = Some("GPU-aaaa".into());
    assert_eq!(env(&inv), "0,1", "one GPU without a UUID: indexes");
    inv.gpus[1].uuid = Some("GPU-bbbb".into());
    assert_eq!(env(&inv), "GPU-aaaa,GPU-bbbb");
}

#[test]
fn device_specs_name_the_host_dev_root_and_keep_container_paths() {
    let grant = ids(&["0000:18:00.0"]);
    let a = allocate(ResourceKind::Hca, dgx(), &Config::default(), None, &grant).unwrap();
    let moved = a
        .clone()
        .with_host_dev_root(std::path::Path::new("/run/fixture/dev"));
    let pairs: Vec<(&str, &str)> = moved
        .devices
        .iter()
        .map(|d| (d.container_path.as_str(), d.host_path.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            (
                "/dev/infiniband/uverbs2",
                "/run/fixture/dev/infiniband/uverbs2"
            ),
            (
                "/dev/infiniband/rdma_cm",
                "/run/fixture/dev/infiniband/rdma_cm"
            ),
        ]
    );
    assert_eq!(moved.envs, a.envs, "only device paths move");
    assert_eq!(
        a.clone().with_host_dev_root(std::path::Path::new("/dev")),
        a,
        "/dev is the identity"
    );
}

#[test]
fn allocate_two_hcas_exact_response() {
    let grant = ids(&["0000:40:00.0", "0000:18:00.0"]);
    let a = allocate(ResourceKind::Hca, dgx(), &Config::default(), None, &grant).unwrap();
    assert_eq!(
        a.devices,
        [
            dev("/dev/infiniband/uverbs2"),
            dev("/dev/infiniband/uverbs5"),
            dev("/dev/infiniband/rdma_cm")
        ]
    );
    let want: BTreeMap<String, String> = [
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1"),
        ("UCX_NET_DEVICES", "mlx5_0:1,mlx5_3:1"),
        ("NCCL_IB_GID_INDEX", "3"),
        ("PCIDEVICE_RDMA_HCA", "0000:18:00.0,0000:40:00.0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(a.envs, want);
    assert!(a.mounts.is_empty());

    let with_tc = allocate(
        ResourceKind::Hca,
        dgx(),
        &Config::default(),
        Some(106),
        &grant,
    )
    .unwrap();
    assert_eq!(with_tc.envs["NCCL_IB_TC"], "106");
    assert_eq!(with_tc.envs["UCX_IB_TRAFFIC_CLASS"], "106");
    assert_eq!(with_tc.envs.len(), 6);
}

#[test]
fn allocate_never_hands_out_management_devices_or_dev_root_paths() {
    for (kind, cfg) in [
        (ResourceKind::Hca, gpus_on()),
        (ResourceKind::Gpu, gpus_on()),
        (ResourceKind::GpuHca, pairs_on()),
    ] {
        let all: Vec<String> = advertised(kind, dgx(), &cfg)
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert!(!all.is_empty(), "{kind:?}");
        let a = allocate(kind, dgx(), &cfg, None, &all).unwrap();
        for d in &a.devices {
            assert!(d.host_path.starts_with("/dev/"), "{d:?}");
            assert_eq!(d.host_path, d.container_path);
            assert_eq!(d.permissions, "rw");
            assert!(
                !d.host_path.contains("umad") && !d.host_path.contains("issm"),
                "{d:?}"
            );
        }
        let paths: BTreeSet<_> = a.devices.iter().map(|d| &d.host_path).collect();
        assert_eq!(
            paths.len(),
            a.devices.len(),
            "{kind:?}: no duplicate device specs"
        );
    }
}

#[test]
fn custom_resource_names_drive_the_pcidevice_variable() {
    let cfg = Config::from_yaml("hca:\n  resourceName: example.com/roce-nic\n").unwrap();
    let a = allocate(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        None,
        &ids(&["0000:9a:00.0"]),
    )
    .unwrap();
    assert_eq!(a.envs["PCIDEVICE_EXAMPLE_COM_ROCE_NIC"], "0000:9a:00.0");
    assert_eq!(a.envs["NCCL_IB_HCA"], "=mlx5_6:1");
}

#[test]
fn gid_index_is_set_only_when_the_hcas_agree() {
    let inv = inventory_of(&FixtureNode::variant("dgx-h100-gid-ipv6-first").unwrap());
    let cfg = Config::default();
    let one = allocate(ResourceKind::Hca, &inv, &cfg, None, &ids(&["0000:18:00.0"])).unwrap();
    assert_eq!(one.envs["NCCL_IB_GID_INDEX"], "5");
    let two = allocate(
        ResourceKind::Hca,
        &inv,
        &cfg,
        None,
        &ids(&["0000:18:00.0", "0000:40:00.0"]),
    )
    .unwrap();
    assert!(
        !two.envs.contains_key("NCCL_IB_GID_INDEX"),
        "{:?}",
        two.envs
    );
    assert_eq!(two.envs["NCCL_IB_HCA"], "=mlx5_0:1,mlx5_3:1");
}

#[test]
fn shared_replicas_grant_only_their_own_hca() {
    let cfg = shared(4);
    let a = allocate(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        None,
        &ids(&["0000:18:00.0#1", "0000:18:00.0#3"]),
    )
    .unwrap();
    assert_eq!(
        a.devices,
        [
            dev("/dev/infiniband/uverbs2"),
            dev("/dev/infiniband/rdma_cm")
        ]
    );
    assert_eq!(a.envs["NCCL_IB_HCA"], "=mlx5_0:1");
    assert_eq!(a.envs["PCIDEVICE_RDMA_HCA"], "0000:18:00.0");
    // An ID beyond the configured replicas, or a bare address in shared mode, is unknown.
    for bad in ["0000:18:00.0#4", "0000:18:00.0"] {
        let e = allocate(ResourceKind::Hca, dgx(), &cfg, None, &ids(&[bad])).unwrap_err();
        assert_eq!(
            e,
            AllocateError::UnknownDevice {
                resource: "rdma/hca".into(),
                id: bad.into()
            }
        );
    }
}

#[test]
fn unknown_ids_are_named() {
    let e = allocate(
        ResourceKind::Gpu,
        dgx(),
        &gpus_on(),
        None,
        &ids(&["0000:1b:00.0", "0000:99:00.0"]),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown nvidia.com/gpu device id \"0000:99:00.0\""
    );
}

#[test]
fn an_hca_without_uverbs_cannot_be_allocated() {
    let mut node = FixtureNode::dgx_h100();
    node.rdma_mut("mlx5_3").unwrap().uverbs = None;
    let inv = inventory_of(&node);
    let e = allocate(
        ResourceKind::Hca,
        &inv,
        &Config::default(),
        None,
        &ids(&["0000:40:00.0"]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("mlx5_3"), "{e}");
    assert!(e.to_string().contains("0000:40:00.0"), "{e}");
}

#[test]
fn allocate_gpus() {
    let a = allocate(
        ResourceKind::Gpu,
        dgx(),
        &gpus_on(),
        Some(106),
        &ids(&["0000:61:00.0", "0000:1b:00.0"]),
    )
    .unwrap();
    assert_eq!(
        a.devices,
        [
            dev("/dev/nvidia0"),
            dev("/dev/nvidia3"),
            dev("/dev/nvidiactl"),
            dev("/dev/nvidia-uvm"),
            dev("/dev/nvidia-uvm-tools"),
        ]
    );
    assert_eq!(
        a.envs["PCIDEVICE_NVIDIA_COM_GPU"],
        "0000:1b:00.0,0000:61:00.0"
    );
    assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], "0,3");
    assert!(!a.envs.contains_key("NCCL_IB_HCA"));
    assert!(
        !a.envs.contains_key("NCCL_IB_TC"),
        "no HCA, no RoCE variables"
    );
}

#[test]
fn allocate_pairs_hands_over_both_halves() {
    let a = allocate(
        ResourceKind::GpuHca,
        dgx(),
        &pairs_on(),
        Some(106),
        &ids(&["0000:43:00.0_0000:40:00.0", "0000:1b:00.0_0000:18:00.0"]),
    )
    .unwrap();
    let paths: Vec<_> = a.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/infiniband/uverbs2",
            "/dev/infiniband/uverbs5",
            "/dev/infiniband/rdma_cm",
        ]
    );
    assert_eq!(a.envs["NCCL_IB_HCA"], "=mlx5_0:1,mlx5_3:1");
    assert_eq!(a.envs["NCCL_IB_GID_INDEX"], "3");
    assert_eq!(a.envs["NCCL_IB_TC"], "106");
    assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], "0,1");
    assert_eq!(
        a.envs["PCIDEVICE_RDMA_GPU_HCA"],
        "0000:1b:00.0,0000:18:00.0,0000:43:00.0,0000:40:00.0"
    );
}

#[test]
fn preferred_keeps_to_one_numa_node_and_the_tightest_group() {
    let cfg = Config::default();
    let all: Vec<String> = advertised(ResourceKind::Hca, dgx(), &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    // The tightest pair on the node: two ports of one card (PIX).
    assert_eq!(
        preferred(ResourceKind::Hca, dgx(), &cfg, &all, &[], 2),
        ["0000:29:00.0", "0000:29:00.1"]
    );
    // Growing around a NUMA 1 device stays on NUMA 1 and takes a PIX pair with it.
    let got = preferred(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        &all,
        &ids(&["0000:9a:00.0"]),
        3,
    );
    assert_eq!(got, ["0000:9a:00.0", "0000:82:00.0", "0000:82:00.1"]);
    // Six HCAs fit on NUMA 0 only when they are NUMA 0's six.
    let got = preferred(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        &all,
        &ids(&["0000:18:00.0"]),
        6,
    );
    assert!(
        got.iter()
            .all(|id| numa_of(dgx(), ResourceKind::Hca, &cfg, id) == Some(0)),
        "{got:?}"
    );
    // GPUs: four on one socket.
    let cfg = gpus_on();
    let gpus: Vec<String> = advertised(ResourceKind::Gpu, dgx(), &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    let got = preferred(
        ResourceKind::Gpu,
        dgx(),
        &cfg,
        &gpus,
        &ids(&["0000:d1:00.0"]),
        4,
    );
    assert_eq!(
        got,
        [
            "0000:d1:00.0",
            "0000:9d:00.0",
            "0000:c3:00.0",
            "0000:df:00.0"
        ]
    );
    let cfg = pairs_on();
    let pairs: Vec<String> = advertised(ResourceKind::GpuHca, dgx(), &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    let got = preferred(ResourceKind::GpuHca, dgx(), &cfg, &pairs[3..], &[], 2);
    assert!(
        got.iter()
            .all(|id| numa_of(dgx(), ResourceKind::GpuHca, &cfg, id) == Some(1)),
        "GPU 3 is alone on NUMA 0 among the available: {got:?}"
    );
}

/// One device, one owner, on the DGX fixture (healthy and with a link down), for every set of
/// enabled resources, with and without HCA sharing.
#[test]
fn no_device_is_advertised_by_two_resources() {
    let down = inventory_of(&FixtureNode::variant("dgx-h100-link-down").unwrap());
    for inv in [dgx(), &down] {
        for bits in 0..8u8 {
            let mut cfg = shared(if bits & 4 != 0 { 3 } else { 1 });
            cfg.gpu.enabled = bits & 1 != 0;
            cfg.gpu_hca.enabled = bits & 2 != 0;
            let mut owner: BTreeMap<String, ResourceKind> = BTreeMap::new();
            for kind in ResourceKind::enabled_kinds(&cfg) {
                for d in advertised(kind, inv, &cfg) {
                    for device in devices_behind(kind, &d.id) {
                        let was = owner.insert(device.to_string(), kind);
                        assert!(
                            was.is_none_or(|w| w == kind),
                            "config {bits:03b}: {device} under {was:?} and {kind:?}"
                        );
                    }
                }
            }
            // Every HCA is served, rails by pairs; GPUs only when a GPU resource is on.
            let hcas = inv.hcas.iter().filter(|h| owner.contains_key(&h.id));
            assert_eq!(hcas.count(), 14, "config {bits:03b}");
            let gpus = inv
                .gpus
                .iter()
                .filter(|g| owner.contains_key(&g.pci_address));
            assert_eq!(
                gpus.count(),
                if bits & 3 != 0 { 8 } else { 0 },
                "{bits:03b}"
            );
        }
    }
}

#[test]
fn allocate_refuses_a_device_another_resource_owns() {
    let mut cfg = pairs_on();
    cfg.gpu.enabled = true;
    // mlx5_0 is GPU 0's rail: rdma/gpu-hca's, not rdma/hca's.
    let e = allocate(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        None,
        &ids(&["0000:18:00.0"]),
    )
    .unwrap_err();
    assert_eq!(
        e,
        AllocateError::NotOwned {
            resource: "rdma/hca".into(),
            id: "0000:18:00.0".into(),
            owner: "rdma/gpu-hca".into(),
        }
    );
    assert_eq!(
        e.to_string(),
        "rdma/hca device id \"0000:18:00.0\": the device is served by rdma/gpu-hca, not rdma/hca"
    );
    // GPU 0 is in that pair too.
    let e = allocate(
        ResourceKind::Gpu,
        dgx(),
        &cfg,
        None,
        &ids(&["0000:1b:00.0"]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("rdma/gpu-hca"), "{e}");
    // A storage port is no GPU's rail: still rdma/hca's; and the preferred allocation never
    // proposes a rail.
    assert!(
        allocate(
            ResourceKind::Hca,
            dgx(),
            &cfg,
            None,
            &ids(&["0000:29:00.0"])
        )
        .is_ok()
    );
    let every_hca: Vec<String> = dgx().hcas.iter().map(|h| h.id.clone()).collect();
    let got = preferred(ResourceKind::Hca, dgx(), &cfg, &every_hca, &[], 14);
    assert_eq!(got.len(), 6, "{got:?}");
    assert!(!got.contains(&"0000:18:00.0".to_string()), "{got:?}");
    // With the pair resource off the same HCA is rdma/hca's again.
    assert!(
        allocate(
            ResourceKind::Hca,
            dgx(),
            &gpus_on(),
            None,
            &ids(&["0000:18:00.0"])
        )
        .is_ok()
    );
}

#[test]
fn preferred_never_proposes_an_unhealthy_device() {
    let inv = inventory_of(&FixtureNode::variant("dgx-h100-link-down").unwrap());
    let cfg = Config::default();
    let all: Vec<String> = advertised(ResourceKind::Hca, &inv, &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    for size in 1..=14 {
        let got = preferred(ResourceKind::Hca, &inv, &cfg, &all, &[], size);
        assert!(
            !got.contains(&"0000:40:00.0".to_string()),
            "size {size}: {got:?}"
        );
        assert_eq!(got.len(), size.min(13));
    }
    // ... unless the kubelet insists on it.
    let got = preferred(
        ResourceKind::Hca,
        &inv,
        &cfg,
        &all,
        &ids(&["0000:40:00.0"]),
        2,
    );
    assert_eq!(got[0], "0000:40:00.0");
    assert_eq!(got.len(), 2);
    // Unknown available IDs are ignored.
    let got = preferred(
        ResourceKind::Hca,
        &inv,
        &cfg,
        &ids(&["bogus", "0000:18:00.0"]),
        &[],
        2,
    );
    assert_eq!(got, ["0000:18:00.0"]);
}

#[test]
fn preferred_spreads_shared_replicas() {
    let cfg = shared(2);
    let all: Vec<String> = advertised(ResourceKind::Hca, dgx(), &cfg)
        .into_iter()
        .map(|d| d.id)
        .collect();
    let got = preferred(ResourceKind::Hca, dgx(), &cfg, &all, &[], 2);
    assert_eq!(
        got,
        ["0000:29:00.0#0", "0000:29:00.1#0"],
        "two distinct HCAs, not one twice"
    );
    // A single-HCA request goes to the HCA with the most free replicas.
    let avail = ids(&["0000:18:00.0#1", "0000:40:00.0#0", "0000:40:00.0#1"]);
    assert_eq!(
        preferred(ResourceKind::Hca, dgx(), &cfg, &avail, &[], 1),
        ["0000:40:00.0#0"]
    );
    // Two replicas of one HCA only when nothing else is left.
    let avail = ids(&["0000:18:00.0#0", "0000:18:00.0#1"]);
    assert_eq!(
        preferred(ResourceKind::Hca, dgx(), &cfg, &avail, &[], 2),
        avail
    );
}

fn shared_universe() -> &'static (Config, Vec<String>) {
    static U: OnceLock<(Config, Vec<String>)> = OnceLock::new();
    U.get_or_init(|| {
        let cfg = shared(2);
        let all = advertised(ResourceKind::Hca, dgx(), &cfg)
            .into_iter()
            .map(|d| d.id)
            .collect();
        (cfg, all)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `size` distinct IDs from available + must_include, including all of must_include, never
    /// an unhealthy one it was not told to include, and the same answer whatever the input order.
    #[test]
    fn preferred_returns_size_distinct_available_ids(
        avail_mask in proptest::collection::vec(any::<bool>(), 28),
        must_mask in proptest::collection::vec(any::<bool>(), 28),
        size in 1usize..12,
        shuffle in any::<u64>(),
    ) {
        let (cfg, all) = shared_universe();
        let available: Vec<String> =
            all.iter().zip(&avail_mask).filter(|(_, m)| **m).map(|(id, _)| id.clone()).collect();
        let must: Vec<String> = available
            .iter()
            .zip(&must_mask)
            .filter(|(_, m)| **m)
            .map(|(id, _)| id.clone())
            .take(size)
            .collect();
        let got = preferred(ResourceKind::Hca, dgx(), cfg, &available, &must, size);
        let set: BTreeSet<&String> = got.iter().collect();
        prop_assert_eq!(set.len(), got.len(), "distinct");
        prop_assert_eq!(got.len(), size.min(available.len()));
        for m in &must {
            prop_assert!(got.contains(m));
        }
        for id in &got {
            prop_assert!(available.contains(id));
        }
        let mut reordered = available.clone();
        let k = (shuffle % (reordered.len().max(1) as u64)) as usize;
        reordered.rotate_left(k);
        reordered.reverse();
        prop_assert_eq!(preferred(ResourceKind::Hca, dgx(), cfg, &reordered, &must, size), got);
    }

    /// Whatever replicas are granted, the container gets exactly the uverbs of the HCAs behind
    /// them (plus rdma_cm), never another HCA's.
    #[test]
    fn shared_grants_map_to_their_hcas_only(grant_mask in proptest::collection::vec(any::<bool>(), 28)) {
        let (cfg, all) = shared_universe();
        let grant: Vec<String> =
            all.iter().zip(&grant_mask).filter(|(_, m)| **m).map(|(id, _)| id.clone()).collect();
        prop_assume!(!grant.is_empty());
        let a = allocate(ResourceKind::Hca, dgx(), cfg, None, &grant).unwrap();
        let behind: BTreeSet<&str> = grant.iter().map(|id| id.split('#').next().unwrap()).collect();
        let mut want: Vec<String> = dgx()
            .hcas
            .iter()
            .filter(|h| behind.contains(h.id.as_str()))
            .map(|h| format!("/dev/infiniband/{}", h.uverbs.as_deref().unwrap()))
            .collect();
        want.push("/dev/infiniband/rdma_cm".into());
        let got: Vec<String> = a.devices.iter().map(|d| d.host_path.clone()).collect();
        prop_assert_eq!(got, want);
        let pcis: Vec<&str> = behind.into_iter().collect();
        prop_assert_eq!(&a.envs["PCIDEVICE_RDMA_HCA"], &pcis.join(","));
    }
}

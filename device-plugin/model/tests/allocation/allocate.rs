//! Allocate responses: device nodes, environment, GID index, shared replicas, unknown or unusable
//! IDs, GPUs and pairs, devices another resource owns; as a property, shared replicas grant only
//! their own HCAs.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use rocefabric_node_model::allocation::{
    AllocateError, PreferredRequest, ResourceKind, advertised, allocate, preferred,
};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::model::Inventory;
use rocefabric_node_testing::fixtures::FixtureNode;

use crate::{dev, dgx, gpus_on, ids, inventory_of, pairs_on, shared, shared_universe};

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
    let got = preferred(
        ResourceKind::Hca,
        dgx(),
        &cfg,
        PreferredRequest {
            available: &every_hca,
            must_include: &[],
            size: 14,
        },
    );
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

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

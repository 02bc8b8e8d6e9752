//! One device, one owner: which of the served resources advertises and grants each physical
//! device of the node.
//!
//! `rdma/hca`, the GPU resource and `rdma/gpu-hca` reach the same hardware: a pair is a GPU and an
//! HCA. The device plugin API has no Deallocate, so the plugin cannot follow grants across
//! resources; instead each device has exactly one owning resource, and only it lists and grants
//! the device:
//!
//! - with `gpuHca` enabled, each GPU that has a rail (its closest PIX/PXB HCA, see
//!   [`topology::gpu_hca_pairs`]) forms a pair, and the pair resource owns that GPU and that HCA;
//! - `rdma/hca` owns every HCA that is no GPU's rail (all of them with `gpuHca` off), advertised
//!   `hca.sharedReplicas` times: sharing there is configured, not accidental;
//! - the GPU resource, when enabled, owns the GPUs without a rail (all of them with `gpuHca` off);
//! - a disabled resource owns nothing: its devices are left to another plugin (GPUs to NVIDIA's).
//!
//! Several GPUs may have the same rail HCA (two GPUs and one NIC behind one PCIe switch). Each GPU
//! is then its own pair device, so the pair resource can grant that HCA to several containers at
//! once: that is the pair resource's design (a GPU's RDMA traffic goes through its closest NIC),
//! and such an HCA is still never listed under `rdma/hca` as well.
//!
//! The partition depends on topology only, never on health, so a device stays with its resource
//! while its link flaps. Only membership changes it: a rail HCA that appears late (driver load) or
//! disappears moves GPUs and HCAs between resources. Containers granted a moved device through its
//! old resource keep it (without Deallocate the plugin cannot know), so `serve` warns about every
//! move.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{Config, ResourceKind};
use crate::model::{Distance, Gpu, Hca, Inventory};
use crate::topology;

/// The devices each enabled resource owns. Every device of the inventory appears at most once
/// across `hcas`, `gpus` and `pairs` (a rail HCA may appear in several pairs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition<'a> {
    /// `rdma/hca`: the HCAs that are no pair's rail, in inventory order.
    pub hcas: Vec<&'a Hca>,
    /// The GPU resource: the GPUs in no pair, in inventory order; empty when it is disabled.
    pub gpus: Vec<&'a Gpu>,
    /// The pair resource: each GPU with its rail, in GPU order; empty when it is disabled.
    pub pairs: Vec<(&'a Gpu, &'a Hca, Distance)>,
}

impl<'a> Partition<'a> {
    /// Split `inv` between the resources `cfg` enables.
    pub fn new(inv: &'a Inventory, cfg: &Config) -> Self {
        let pairs = if ResourceKind::GpuHca.enabled(cfg) {
            topology::gpu_hca_pairs(inv)
        } else {
            Vec::new()
        };
        let rails: BTreeSet<&str> = pairs.iter().map(|(_, h, _)| h.id.as_str()).collect();
        let paired: BTreeSet<&str> = pairs
            .iter()
            .map(|(g, _, _)| g.pci_address.as_str())
            .collect();
        let hcas = inv
            .hcas
            .iter()
            .filter(|h| !rails.contains(h.id.as_str()))
            .collect();
        let gpus = if ResourceKind::Gpu.enabled(cfg) {
            inv.gpus
                .iter()
                .filter(|g| !paired.contains(g.pci_address.as_str()))
                .collect()
        } else {
            Vec::new()
        };
        Partition { hcas, gpus, pairs }
    }

    /// Every served device (HCA ID, GPU PCI address) with the resource that owns it.
    pub fn owners(&self) -> BTreeMap<String, ResourceKind> {
        let hcas = self.hcas.iter().map(|h| (&h.id, ResourceKind::Hca));
        let gpus = self
            .gpus
            .iter()
            .map(|g| (&g.pci_address, ResourceKind::Gpu));
        let pairs = self.pairs.iter().flat_map(|(g, h, _)| {
            [
                (&g.pci_address, ResourceKind::GpuHca),
                (&h.id, ResourceKind::GpuHca),
            ]
        });
        hcas.chain(gpus)
            .chain(pairs)
            .map(|(device, kind)| (device.clone(), kind))
            .collect()
    }

    /// Whether the pair resource took devices away from `rdma/hca` or the GPU resource (worth a
    /// line in the log: an operator expecting every HCA under `rdma/hca` finds fewer).
    pub fn moved_any(&self) -> bool {
        !self.pairs.is_empty()
    }

    /// The resource, other than `kind`, that owns a device behind `id` (an ID in `kind`'s format:
    /// `<hca>[#k]`, `<gpu>`, `<gpu>_<hca>`), so a refusal can say where the device went.
    pub fn owned_elsewhere(&self, kind: ResourceKind, id: &str) -> Option<ResourceKind> {
        let owners = self.owners();
        devices_behind(kind, id)
            .into_iter()
            .filter_map(|d| owners.get(d).copied())
            .find(|owner| *owner != kind)
    }

    /// The IDs of the devices each resource owns (HCA IDs, GPU PCI addresses, pair IDs), for the
    /// log.
    pub fn summary(&self) -> [(ResourceKind, Vec<String>); 3] {
        [
            (
                ResourceKind::Hca,
                self.hcas.iter().map(|h| h.id.clone()).collect(),
            ),
            (
                ResourceKind::Gpu,
                self.gpus.iter().map(|g| g.pci_address.clone()).collect(),
            ),
            (
                ResourceKind::GpuHca,
                self.pairs
                    .iter()
                    .map(|(g, h, _)| pair_device_id(g, h))
                    .collect(),
            ),
        ]
    }
}

/// The ID of replica `replica` of an HCA when each HCA is advertised `replicas` times.
pub fn hca_device_id(hca: &Hca, replica: u32, replicas: u32) -> String {
    if replicas <= 1 {
        hca.id.clone()
    } else {
        format!("{}#{replica}", hca.id)
    }
}

/// The ID of a GPU + HCA pair.
pub fn pair_device_id(gpu: &Gpu, hca: &Hca) -> String {
    format!("{}_{}", gpu.pci_address, hca.id)
}

/// The physical devices (HCA ID, GPU PCI address) an ID of `kind` stands for: `<hca>[#k]`,
/// `<gpu>`, `<gpu>_<hca>` (the inverse of [`hca_device_id`] and [`pair_device_id`]).
pub fn devices_behind(kind: ResourceKind, id: &str) -> Vec<&str> {
    match kind {
        ResourceKind::Hca => id.split('#').take(1).collect(),
        ResourceKind::Gpu => vec![id],
        // The GPU's PCI address has no `_`; whatever follows the first one is the HCA's ID.
        ResourceKind::GpuHca => id.split_once('_').map_or(vec![id], |(g, h)| vec![g, h]),
    }
}

/// Devices served before and after whose owner changed: `(device, before, after)`. A device no
/// longer served did not move (it is listed Unhealthy where it was, and granted nowhere else).
pub fn moves(
    before: &BTreeMap<String, ResourceKind>,
    after: &BTreeMap<String, ResourceKind>,
) -> Vec<(String, ResourceKind, ResourceKind)> {
    before
        .iter()
        .filter_map(|(device, was)| {
            let now = *after.get(device)?;
            (now != *was).then(|| (device.clone(), *was, now))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use crate::allocation::{self, AllocateError};
    use crate::model::{Health, PortState};

    /// A node with eight GPUs and four rail HCAs, two GPUs and one NIC behind each PCIe switch,
    /// and one more HCA on its own root port (no GPU's rail).
    fn shared_rails() -> Inventory {
        let mut hcas = Vec::new();
        let mut gpus = Vec::new();
        for s in 0..4u8 {
            let root = format!("/devices/pci0000:{:02x}", 0x10 * (s + 1));
            let rp = format!("0000:{:02x}:01.0", 0x10 * (s + 1));
            let up = format!("0000:{:02x}:00.0", 0x10 * (s + 1) + 1);
            let down = |i: u8| format!("0000:{:02x}:{i:02x}.0", 0x10 * (s + 1) + 2);
            let nic = format!("0000:{:02x}:00.0", 0x10 * (s + 1) + 3);
            hcas.push(hca(
                &nic,
                &format!("mlx5_{s}"),
                &format!("{root}/{rp}/{up}/{}/{nic}", down(0)),
            ));
            for k in 0..2u8 {
                let pci = format!("0000:{:02x}:00.0", 0x10 * (s + 1) + 4 + k);
                gpus.push(gpu(
                    &pci,
                    u32::from(s * 2 + k),
                    &format!("{root}/{rp}/{up}/{}/{pci}", down(k + 1)),
                ));
            }
        }
        let storage = "0000:a1:00.0";
        hcas.push(hca(
            storage,
            "mlx5_4",
            &format!("/devices/pci0000:a0/0000:a0:01.0/{storage}"),
        ));
        Inventory { hcas, gpus }
    }

    fn hca(pci: &str, name: &str, path: &str) -> Hca {
        Hca {
            id: pci.into(),
            name: name.into(),
            pci_address: Some(pci.into()),
            vendor: Some(0x15b3),
            device_id: Some(0x1021),
            port: 1,
            netdev: None,
            numa_node: Some(0),
            state: PortState::Active,
            uverbs: Some(format!("uverbs{}", name.trim_start_matches("mlx5_"))),
            roce_v2_gid_index: Some(3),
            rate_mbps: None,
            health: Health::Healthy,
            device_path: path.into(),
        }
    }

    fn gpu(pci: &str, index: u32, path: &str) -> Gpu {
        Gpu {
            pci_address: pci.into(),
            index,
            uuid: None,
            device_id: 0x2330,
            numa_node: Some(0),
            health: Health::Healthy,
            pci_path: path.into(),
        }
    }

    fn config(gpu: bool, gpu_hca: bool, replicas: u32) -> Config {
        let mut c = Config::default();
        c.gpu.enabled = gpu;
        c.gpu_hca.enabled = gpu_hca;
        c.hca.shared_replicas = replicas;
        c
    }

    #[test]
    fn the_fixture_has_four_shared_rails_and_a_free_hca() {
        let inv = shared_rails();
        let pairs = topology::gpu_hca_pairs(&inv);
        assert_eq!(pairs.len(), 8);
        let rails: BTreeSet<&str> = pairs.iter().map(|(_, h, _)| h.name.as_str()).collect();
        assert_eq!(
            rails,
            BTreeSet::from(["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"])
        );
        assert!(pairs.iter().all(|(_, _, d)| *d == Distance::PIX));
    }

    /// Whatever resources are enabled, no physical device is listed by two of them, and every
    /// HCA is listed by one; GPUs are listed once when a GPU-serving resource wants them.
    #[test]
    fn no_device_is_listed_by_two_resources() {
        let inv = shared_rails();
        for gpu_on in [false, true] {
            for pair_on in [false, true] {
                for replicas in [1, 3] {
                    let cfg = config(gpu_on, pair_on, replicas);
                    let mut owner: BTreeMap<String, ResourceKind> = BTreeMap::new();
                    for kind in ResourceKind::enabled_kinds(&cfg) {
                        for d in allocation::advertised(kind, &inv, &cfg) {
                            for device in devices_behind(kind, &d.id) {
                                let was = owner.insert(device.to_string(), kind);
                                assert!(
                                    was.is_none_or(|w| w == kind),
                                    "gpu {gpu_on} gpuHca {pair_on} x{replicas}: {device} under \
                                     {was:?} and {kind:?}"
                                );
                            }
                        }
                    }
                    let hcas = inv.hcas.iter().filter(|h| owner.contains_key(&h.id));
                    assert_eq!(hcas.count(), 5, "every HCA is served");
                    let gpus = inv
                        .gpus
                        .iter()
                        .filter(|g| owner.contains_key(&g.pci_address))
                        .count();
                    assert_eq!(gpus, if gpu_on || pair_on { 8 } else { 0 });
                    let owners = Partition::new(&inv, &cfg).owners();
                    assert_eq!(owners, owner, "owners() says what is advertised");
                }
            }
        }
    }

    #[test]
    fn pairs_take_their_rails_and_gpus() {
        let inv = shared_rails();
        let p = Partition::new(&inv, &config(true, true, 1));
        let hcas: Vec<&str> = p.hcas.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(hcas, ["mlx5_4"], "only the HCA that is no rail stays");
        assert!(p.gpus.is_empty(), "every GPU has a rail");
        assert_eq!(p.pairs.len(), 8);
        assert!(p.moved_any());
        // Two GPUs share each rail inside the pair resource.
        let per_rail = p.pairs.iter().fold(BTreeMap::new(), |mut m, (_, h, _)| {
            *m.entry(h.name.as_str()).or_insert(0) += 1;
            m
        });
        assert!(per_rail.values().all(|n| *n == 2), "{per_rail:?}");

        let plain = Partition::new(&inv, &config(true, false, 1));
        assert_eq!(plain.hcas.len(), 5);
        assert_eq!(plain.gpus.len(), 8);
        assert!(!plain.moved_any());
        let none = Partition::new(&inv, &Config::default());
        assert_eq!(
            (none.hcas.len(), none.gpus.len(), none.pairs.len()),
            (5, 0, 0)
        );
    }

    #[test]
    fn a_gpu_without_a_rail_stays_with_the_gpu_resource() {
        let mut inv = shared_rails();
        // GPU 7 moves to a root port of its own: no PIX/PXB HCA.
        inv.gpus[7].pci_path = "/devices/pci0000:b0/0000:b0:01.0/0000:b1:00.0".into();
        let p = Partition::new(&inv, &config(true, true, 1));
        let gpus: Vec<u32> = p.gpus.iter().map(|g| g.index).collect();
        assert_eq!(gpus, [7]);
        assert_eq!(p.pairs.len(), 7);
        // mlx5_3 is still GPU 6's rail.
        assert_eq!(p.hcas.len(), 1);
    }

    #[test]
    fn partition_ignores_health() {
        let mut inv = shared_rails();
        let cfg = config(true, true, 1);
        let before = Partition::new(&inv, &cfg).summary();
        inv.hcas[0].health = Health::Unhealthy;
        inv.gpus[3].health = Health::Unhealthy;
        assert_eq!(Partition::new(&inv, &cfg).summary(), before);
    }

    #[test]
    fn allocate_refuses_a_device_owned_by_another_resource() {
        let inv = shared_rails();
        let cfg = config(true, true, 1);
        let rail = inv.hcas[0].id.clone();
        let e = allocation::allocate(
            ResourceKind::Hca,
            &inv,
            &cfg,
            None,
            std::slice::from_ref(&rail),
        )
        .unwrap_err();
        assert_eq!(
            e,
            AllocateError::NotOwned {
                resource: "rdma/hca".into(),
                id: rail.clone(),
                owner: "rdma/gpu-hca".into(),
            }
        );
        assert!(e.to_string().contains(&rail), "{e}");
        let gpu = inv.gpus[0].pci_address.clone();
        let e = allocation::allocate(ResourceKind::Gpu, &inv, &cfg, None, &[gpu]).unwrap_err();
        assert!(matches!(e, AllocateError::NotOwned { .. }), "{e}");
        // The HCA that is no rail is still rdma/hca's.
        let free = inv.hcas[4].id.clone();
        assert!(allocation::allocate(ResourceKind::Hca, &inv, &cfg, None, &[free]).is_ok());
        // With the pair resource off the rail is rdma/hca's again.
        assert!(
            allocation::allocate(
                ResourceKind::Hca,
                &inv,
                &config(true, false, 1),
                None,
                &[rail]
            )
            .is_ok()
        );
    }

    #[test]
    fn moves_name_devices_that_changed_owner() {
        let inv = shared_rails();
        let cfg = config(true, true, 1);
        let before = Partition::new(&inv, &cfg).owners();
        // mlx5_3 disappears: GPUs 6 and 7 lose their rail and go to the GPU resource.
        let mut fewer = inv.clone();
        fewer.hcas.remove(3);
        let after = Partition::new(&fewer, &cfg);
        let moved = moves(&before, &after.owners());
        let gpus: Vec<&str> = moved.iter().map(|(d, _, _)| d.as_str()).collect();
        assert_eq!(
            gpus,
            [
                inv.gpus[6].pci_address.as_str(),
                inv.gpus[7].pci_address.as_str()
            ]
        );
        assert!(
            moved
                .iter()
                .all(|(_, was, now)| *was == ResourceKind::GpuHca && *now == ResourceKind::Gpu)
        );
    }
}

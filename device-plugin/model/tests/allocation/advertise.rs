//! Advertised devices: HCAs by PCI address with NUMA node and health, shared replicas, GPU + rail
//! pairs, and one owner per device whatever resources are enabled.

use std::collections::{BTreeMap, BTreeSet};

use rocefabric_node_model::allocation::{ResourceKind, advertised};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::model::Health;
use rocefabric_node_model::ownership::devices_behind;
use rocefabric_node_testing::fixtures::FixtureNode;

use crate::{dgx, gpus_on, inventory_of, numa_of, pairs_on, shared};

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

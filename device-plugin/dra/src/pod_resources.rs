//! Device plugin grants as the kubelet's pod resources API lists them, read in `both` mode: which
//! physical devices live pods hold, so the ledger learns when a grant ends (the device plugin API
//! has no Deallocate).

use std::collections::BTreeMap;

use std::collections::BTreeSet;

use rocefabric_node_model::config::{Config, ResourceKind};
use rocefabric_node_model::model::Inventory;
use rocefabric_node_model::ownership::{Partition, devices_behind};

/// The physical devices (HCA ID, GPU PCI address) behind listed grants of our resources, each
/// with its resource; grants of other resources are ignored.
pub fn held_devices(cfg: &Config, grants: &[(String, String)]) -> BTreeMap<String, String> {
    let kinds: BTreeMap<&str, ResourceKind> = ResourceKind::enabled_kinds(cfg)
        .into_iter()
        .map(|k| (k.resource_name(cfg), k))
        .collect();
    let mut out = BTreeMap::new();
    for (resource, id) in grants {
        if let Some(kind) = kinds.get(resource.as_str()) {
            for device in devices_behind(*kind, id) {
                out.insert(device.to_string(), resource.clone());
            }
        }
    }
    out
}

/// Every device the device plugin serves under `cfg` (HCA IDs, GPU PCI addresses): what it may
/// have granted while its grants are unknown.
pub fn servable(inventory: &Inventory, cfg: &Config) -> BTreeSet<String> {
    Partition::new(inventory, cfg)
        .owners()
        .into_keys()
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn grants_of_our_resources_map_to_physical_devices() {
        let mut cfg = Config::default();
        cfg.gpu_hca.enabled = true;
        let grants = vec![
            ("rdma/hca".to_string(), "0000:18:00.0#1".to_string()),
            (
                "rdma/gpu-hca".to_string(),
                "0000:1b:00.0_0000:19:00.0".to_string(),
            ),
            ("nvidia.com/gpu".to_string(), "0000:2b:00.0".to_string()),
        ];
        let held = held_devices(&cfg, &grants);
        assert_eq!(
            held.into_iter().collect::<Vec<_>>(),
            vec![
                ("0000:18:00.0".to_string(), "rdma/hca".to_string()),
                ("0000:19:00.0".to_string(), "rdma/gpu-hca".to_string()),
                ("0000:1b:00.0".to_string(), "rdma/gpu-hca".to_string()),
            ],
            "the GPU resource is off, so nvidia.com/gpu is another plugin's"
        );
    }
}

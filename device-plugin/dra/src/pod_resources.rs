//! Device plugin grants as the kubelet's pod resources API lists them: which physical devices live
//! pods hold, so the ledger learns when a grant ends (the device plugin API has no Deallocate).
//! Read in `both` mode (our device plugin's grants and the GPU resource's), and in `dra` mode
//! whenever GPUs are published (NVIDIA's device plugin may have given one to a running pod).

use std::collections::{BTreeMap, BTreeSet};

use rocefabric_node_model::config::{Config, ResourceKind};
use rocefabric_node_model::model::Inventory;
use rocefabric_node_model::ownership::{Partition, devices_behind};

/// The physical devices (HCA ID, GPU PCI address) behind listed grants, each with its resource:
/// grants of the GPU resource by any plugin (NVIDIA's device plugin runs beside ours by default)
/// by the GPU's UUID or PCI bus ID, so a GPU another plugin gave to a pod is never handed to a
/// claim, and grants of our resources by their IDs (in `dra` mode, grants left from a
/// `devicePlugin` run whose pods still live). A grant of the GPU resource whose ID names no GPU
/// here (NVIDIA's `index` strategy, a MIG device, a UUID where the driver's information file
/// could not be read) holds every GPU: which one it is cannot be known, so none is handed out
/// while it lives (fail closed). Grants of other resources are ignored.
pub fn held_devices(
    cfg: &Config,
    inventory: &Inventory,
    grants: &[(String, String)],
) -> BTreeMap<String, String> {
    let kinds: BTreeMap<&str, ResourceKind> = ResourceKind::enabled_kinds(cfg)
        .into_iter()
        .map(|k| (k.resource_name(cfg), k))
        .collect();
    let mut out = BTreeMap::new();
    for (resource, id) in grants {
        // First by the GPU's names: ours (the PCI address) is a bus ID too, and a config that
        // enables our GPU resource may be read in `dra` mode, where NVIDIA's plugin serves it.
        if *resource == cfg.gpu.resource_name
            && let Some(gpu) = gpu_of(inventory, id)
        {
            out.insert(gpu.to_string(), resource.clone());
        } else if let Some(kind) = kinds.get(resource.as_str()) {
            for device in devices_behind(*kind, id) {
                out.insert(device.to_string(), resource.clone());
            }
        } else if *resource == cfg.gpu.resource_name {
            tracing::warn!(%resource, id = %id,
                "a GPU grant names no GPU of this node: every GPU is held while it lives \
                 (run NVIDIA's device plugin with its default device-id-strategy, uuid)");
            for gpu in &inventory.gpus {
                out.insert(gpu.pci_address.clone(), resource.clone());
            }
        }
    }
    out
}

/// The GPU (its PCI address) another plugin names `id`: its UUID (`GPU-...`, NVIDIA's default
/// device IDs) or its PCI bus ID in either form (`0000:1b:00.0`, nvidia-smi's `00000000:1B:00.0`).
fn gpu_of<'a>(inventory: &'a Inventory, id: &str) -> Option<&'a str> {
    let bus = normalize_bus_id(id);
    inventory
        .gpus
        .iter()
        .find(|g| g.uuid.as_deref() == Some(id) || Some(g.pci_address.as_str()) == bus.as_deref())
        .map(|g| g.pci_address.as_str())
}

/// A PCI bus ID as sysfs writes it (`dddd:bb:dd.f`, lowercase), from sysfs's or nvidia-smi's
/// (8-digit domain, uppercase) form; `None` for anything else.
fn normalize_bus_id(id: &str) -> Option<String> {
    let (domain, rest) = id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let rest = rest.to_ascii_lowercase();
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
    (domain <= 0xffff && hex(bus, 2) && hex(dev, 2) && hex(func, 1))
        .then(|| format!("{domain:04x}:{rest}"))
}

/// Every device a device plugin may have granted without our knowing while grants are unknown
/// (HCA IDs, GPU PCI addresses): what our device plugin serves under `cfg` when it runs, and
/// every GPU (ours, or the GPU resource's other plugin's).
pub fn may_be_granted(
    inventory: &Inventory,
    cfg: &Config,
    device_plugin: bool,
) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = inventory
        .gpus
        .iter()
        .map(|g| g.pci_address.clone())
        .collect();
    if device_plugin {
        out.extend(Partition::new(inventory, cfg).owners().into_keys());
    }
    out
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
        let held = held_devices(&cfg, &Inventory::default(), &grants);
        assert_eq!(
            held.into_iter().collect::<Vec<_>>(),
            vec![
                ("0000:18:00.0".to_string(), "rdma/hca".to_string()),
                ("0000:19:00.0".to_string(), "rdma/gpu-hca".to_string()),
                ("0000:1b:00.0".to_string(), "rdma/gpu-hca".to_string()),
            ],
            "the GPU resource is off, so nvidia.com/gpu is another plugin's, and names no GPU here"
        );
    }

    fn gpu(pci_address: &str, uuid: &str) -> rocefabric_node_model::model::Gpu {
        rocefabric_node_model::model::Gpu {
            pci_address: pci_address.into(),
            index: 0,
            uuid: Some(uuid.into()),
            device_id: 0x2330,
            numa_node: Some(0),
            health: rocefabric_node_model::model::Health::Healthy,
            pci_path: String::new(),
        }
    }

    #[test]
    fn another_plugins_gpu_grants_hold_the_gpu_by_uuid_or_bus_id() {
        let cfg = Config::default();
        let inventory = Inventory {
            gpus: vec![
                gpu("0000:1b:00.0", "GPU-aaaa"),
                gpu("0000:43:00.0", "GPU-bbbb"),
                gpu("0000:52:00.0", "GPU-cccc"),
            ],
            ..Inventory::default()
        };
        let grant = |id: &str| ("nvidia.com/gpu".to_string(), id.to_string());
        let grants = vec![
            grant("GPU-aaaa"),
            grant("00000000:43:00.0"),
            ("example.com/gpu".to_string(), "GPU-cccc".to_string()),
        ];
        let held = held_devices(&cfg, &inventory, &grants);
        assert_eq!(
            held.into_iter().collect::<Vec<_>>(),
            vec![
                ("0000:1b:00.0".to_string(), "nvidia.com/gpu".to_string()),
                ("0000:43:00.0".to_string(), "nvidia.com/gpu".to_string()),
            ]
        );
        // An ID that names no GPU here (index strategy, MIG, a UUID unknown here) holds them all.
        for id in ["3", "MIG-ffff", "GPU-not-here"] {
            let held = held_devices(&cfg, &inventory, &[grant(id)]);
            assert_eq!(
                held.into_keys().collect::<Vec<_>>(),
                ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0"],
                "{id}"
            );
        }
        assert_eq!(
            normalize_bus_id("00000000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(normalize_bus_id("GPU-aaaa"), None);
        assert_eq!(normalize_bus_id("0000:1b:00"), None);
    }

    #[test]
    fn a_uuid_grant_holds_its_gpu_even_where_the_config_enables_our_gpu_resource() {
        let mut cfg = Config::default();
        cfg.gpu.enabled = true;
        let inventory = Inventory {
            gpus: vec![
                gpu("0000:1b:00.0", "GPU-aaaa"),
                gpu("0000:43:00.0", "GPU-bbbb"),
            ],
            ..Inventory::default()
        };
        let grants = vec![
            ("nvidia.com/gpu".to_string(), "GPU-aaaa".to_string()),
            ("nvidia.com/gpu".to_string(), "0000:43:00.0".to_string()),
        ];
        let held = held_devices(&cfg, &inventory, &grants);
        assert_eq!(
            held.into_keys().collect::<Vec<_>>(),
            ["0000:1b:00.0", "0000:43:00.0"]
        );
    }

    #[test]
    fn while_grants_are_unknown_every_gpu_and_what_our_plugin_serves_may_be_held() {
        let cfg = Config::default();
        let inventory = Inventory {
            gpus: vec![gpu("0000:1b:00.0", "GPU-aaaa")],
            ..Inventory::default()
        };
        let dra_only = may_be_granted(&inventory, &cfg, false);
        assert_eq!(dra_only, BTreeSet::from(["0000:1b:00.0".to_string()]));
        assert_eq!(
            may_be_granted(&inventory, &cfg, true),
            dra_only,
            "no HCAs here"
        );
    }
}

//! Which of the node's devices a DRA claim can get, and what a claim can select them by.
//!
//! One device per RoCE HCA (`hca-<rdma name>`, `mlx5_0` -> `hca-mlx5-0`) and per GPU
//! (`gpu-<index>`). Device names are DNS labels, as `resource.k8s.io` requires.
//!
//! Attributes (unqualified names are in the driver's domain, `rocefabric.io/...`):
//! - `type`: `hca` or `gpu`; the DeviceClasses select on it;
//! - `resource.kubernetes.io/pcieRoot`: the standard attribute, the PCIe host bridge
//!   (`pci0000:15`) as upstream's `deviceattribute` package derives it from sysfs;
//! - `pcieSwitch`: finer, the upstream port of the switch tree below the root port
//!   (`0000:16:00.0`), for devices at least one switch deep; a GPU and its rail HCA share it;
//! - `pciAddress`, `vendorId`, `deviceId` (`0x15b3`), `numaNode` (also as the standard
//!   `resource.kubernetes.io/numaNode`, for `matchAttribute` across drivers);
//! - HCAs: `rdmaDevice`, `port`, `netdev`, `linkState`, `gidIndex` (RoCE v2 IPv4), `virtual`;
//! - GPUs: `index`, `uuid`;
//! - `fabric` (the node's RoceFabric) and `qosReady` (the fabric's QoS proven on this HCA's
//!   netdev), when the node has a RoceNode.
//!
//! Capacity: HCAs carry `bandwidth`, the port's link rate in bits/s (`400G`), for selectors such
//! as `device.capacity["rocefabric.io"].bandwidth.compareTo(quantity("200G")) >= 0`.
//!
//! Withdrawn (left out of the slice, so no claim whatever its selectors can be allocated them):
//! an HCA whose port is not ACTIVE or that has no uverbs device, an HCA of the fabric whose QoS is
//! not proven while the QoS gate holds, a GPU without its driver or device node, and a device a
//! device plugin has granted to a live pod (ours in `both` mode, NVIDIA's GPUs in `dra` mode too)
//! or may have while grants are unknown. Marking such devices with an
//! attribute instead would leave them to every DeviceClass that forgets to test it, and the
//! scheduler never revisits an allocation, so a claim would get a device that cannot carry
//! lossless RoCE traffic.

use std::collections::{BTreeMap, BTreeSet};

use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_model::model::{Gpu, Hca, Health, Inventory, PortState};
use rocefabric_node_model::topology::PciChain;

/// The standard PCIe root attribute (`k8s.io/dynamic-resource-allocation/deviceattribute`).
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";
/// The standard NUMA node attribute (its scalar form).
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// One attribute value, as `resource.k8s.io/v1` `DeviceAttribute` holds it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Attr {
    Bool(bool),
    Int(i64),
    Str(String),
}

/// What a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceKind {
    Hca,
    Gpu,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Hca => "hca",
            DeviceKind::Gpu => "gpu",
        }
    }
}

/// One device of the slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraDevice {
    /// The device name in the pool (a DNS label).
    pub name: String,
    pub kind: DeviceKind,
    /// The physical device: the HCA's ID ([`Hca::id`]) or the GPU's PCI address; the key the
    /// ledger and the device plugin share.
    pub physical: String,
    /// Attribute name (unqualified: the driver's domain) to value.
    pub attributes: BTreeMap<String, Attr>,
    /// Capacity name to quantity (`bandwidth`: the port's link rate in bits/s, `400G`).
    pub capacity: BTreeMap<String, String>,
}

/// Why a device is not in the slice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Withdrawn {
    /// The HCA's port is not ACTIVE.
    LinkDown,
    /// The HCA is ACTIVE but has no uverbs device (no workload could open it).
    NoUverbs,
    /// The HCA carries the fabric's traffic and the fabric's QoS is not proven on it.
    QosNotProven,
    /// The GPU's driver is not bound or its device node is missing.
    GpuUnavailable,
    /// A device plugin granted it to a live pod (ours in `both` mode; NVIDIA's, for a GPU).
    HeldByDevicePlugin,
    /// A device plugin may have granted it and grants are unknown: the kubelet's pod resources
    /// API cannot be read (every GPU; in `both` mode also what our device plugin serves).
    GrantsUnknown,
}

impl Withdrawn {
    pub fn as_str(&self) -> &'static str {
        match self {
            Withdrawn::LinkDown => "link down",
            Withdrawn::NoUverbs => "no uverbs device",
            Withdrawn::QosNotProven => "fabric QoS not proven",
            Withdrawn::GpuUnavailable => "GPU driver or device node missing",
            Withdrawn::HeldByDevicePlugin => "granted by the device plugin",
            Withdrawn::GrantsUnknown => "device plugin grants unknown",
        }
    }
}

/// What device plugins hold or may hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Granted to live pods (or pending).
    pub granted: BTreeSet<String>,
    /// What a device plugin may have granted, while grants are unknown.
    pub unknown: BTreeSet<String>,
}

/// The devices of the node: published, and withdrawn with the reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub published: Vec<DraDevice>,
    pub withdrawn: Vec<(DraDevice, Withdrawn)>,
}

impl Listing {
    /// Every device, published or not, by name.
    pub fn all(&self) -> impl Iterator<Item = &DraDevice> {
        self.published
            .iter()
            .chain(self.withdrawn.iter().map(|(d, _)| d))
    }

    /// The device called `name`, published or not.
    pub fn find(&self, name: &str) -> Option<&DraDevice> {
        self.all().find(|d| d.name == name)
    }
}

/// A DNS label from an RDMA device name: lowercase, `[a-z0-9-]`, other characters as `-`.
fn label(prefix: &str, raw: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + raw.len() + 1);
    out.push_str(prefix);
    out.push('-');
    for c in raw.chars() {
        out.push(if c.is_ascii_alphanumeric() {
            c.to_ascii_lowercase()
        } else {
            '-'
        });
    }
    out.truncate(63);
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// The pool's device name of an HCA.
pub fn hca_device_name(hca: &Hca) -> String {
    label("hca", &hca.name)
}

/// The pool's device name of a GPU.
pub fn gpu_device_name(gpu: &Gpu) -> String {
    format!("gpu-{}", gpu.index)
}

/// Host bridge and switch attributes of a sysfs realpath.
fn pcie_attributes(path: &str, attributes: &mut BTreeMap<String, Attr>) {
    let Some(chain) = PciChain::parse(path) else {
        return;
    };
    attributes.insert(
        PCIE_ROOT_ATTRIBUTE.into(),
        Attr::Str(chain.root.to_string()),
    );
    // Root port, switch upstream port, switch downstream port, function: a switch exists only
    // from four levels down.
    if chain.chain.len() >= 4 {
        attributes.insert("pcieSwitch".into(), Attr::Str(chain.chain[1].to_string()));
    }
}

fn numa(attributes: &mut BTreeMap<String, Attr>, node: Option<u32>) {
    if let Some(n) = node {
        attributes.insert("numaNode".into(), Attr::Int(i64::from(n)));
        // The standard name too, so `matchAttribute` aligns with other drivers' devices.
        attributes.insert(NUMA_NODE_ATTRIBUTE.into(), Attr::Int(i64::from(n)));
    }
}

fn hca_device(hca: &Hca, view: &FabricView) -> DraDevice {
    let mut a = BTreeMap::new();
    a.insert("type".into(), Attr::Str("hca".into()));
    a.insert("rdmaDevice".into(), Attr::Str(hca.name.clone()));
    a.insert("port".into(), Attr::Int(i64::from(hca.port)));
    a.insert("linkState".into(), Attr::Str(hca.state.as_str().into()));
    a.insert("virtual".into(), Attr::Bool(hca.is_virtual()));
    if let Some(pci) = &hca.pci_address {
        a.insert("pciAddress".into(), Attr::Str(pci.clone()));
        pcie_attributes(&hca.device_path, &mut a);
    }
    if let Some(v) = hca.vendor {
        a.insert("vendorId".into(), Attr::Str(format!("{v:#06x}")));
    }
    if let Some(d) = hca.device_id {
        a.insert("deviceId".into(), Attr::Str(format!("{d:#06x}")));
    }
    numa(&mut a, hca.numa_node);
    if let Some(netdev) = &hca.netdev {
        a.insert("netdev".into(), Attr::Str(netdev.clone()));
    }
    if let Some(gid) = hca.roce_v2_gid_index {
        a.insert("gidIndex".into(), Attr::Int(i64::from(gid)));
    }
    if let Some(fabric) = &view.fabric
        && view.governs(hca)
    {
        a.insert("fabric".into(), Attr::Str(fabric.clone()));
        if view.qos_ready.is_some() {
            a.insert(
                "qosReady".into(),
                Attr::Bool(view.admits(hca.netdev.as_deref())),
            );
        }
    }
    let mut capacity = BTreeMap::new();
    if let Some(mbps) = hca.rate_mbps {
        // A quantity in bits/s: `400G`, `2500M`.
        let quantity = if mbps % 1000 == 0 {
            format!("{}G", mbps / 1000)
        } else {
            format!("{mbps}M")
        };
        capacity.insert("bandwidth".to_string(), quantity);
    }
    DraDevice {
        name: hca_device_name(hca),
        kind: DeviceKind::Hca,
        physical: hca.id.clone(),
        attributes: a,
        capacity,
    }
}

fn gpu_device(gpu: &Gpu) -> DraDevice {
    let mut a = BTreeMap::new();
    a.insert("type".into(), Attr::Str("gpu".into()));
    a.insert("index".into(), Attr::Int(i64::from(gpu.index)));
    a.insert("pciAddress".into(), Attr::Str(gpu.pci_address.clone()));
    a.insert("vendorId".into(), Attr::Str("0x10de".into()));
    a.insert(
        "deviceId".into(),
        Attr::Str(format!("{:#06x}", gpu.device_id)),
    );
    pcie_attributes(&gpu.pci_path, &mut a);
    numa(&mut a, gpu.numa_node);
    if let Some(uuid) = &gpu.uuid {
        a.insert("uuid".into(), Attr::Str(uuid.clone()));
    }
    DraDevice {
        name: gpu_device_name(gpu),
        kind: DeviceKind::Gpu,
        physical: gpu.pci_address.clone(),
        attributes: a,
        capacity: BTreeMap::new(),
    }
}

/// The node's devices for DRA. `inventory` is the discovered one (before the gate); `view` is the
/// fabric's view of the node; `gpus` says whether GPUs are published (off where another driver
/// serves them); `held` are the physical devices device plugins hold or may hold.
pub fn listing(inventory: &Inventory, view: &FabricView, gpus: bool, held: &Held) -> Listing {
    let mut out = Listing::default();
    let mut place = |device: DraDevice, why: Option<Withdrawn>| {
        let why = why.or_else(|| {
            if held.granted.contains(&device.physical) {
                Some(Withdrawn::HeldByDevicePlugin)
            } else if held.unknown.contains(&device.physical) {
                Some(Withdrawn::GrantsUnknown)
            } else {
                None
            }
        });
        match why {
            None => out.published.push(device),
            Some(why) => out.withdrawn.push((device, why)),
        }
    };
    for hca in &inventory.hcas {
        let why = if hca.state != PortState::Active {
            Some(Withdrawn::LinkDown)
        } else if hca.uverbs.is_none() || hca.health != Health::Healthy {
            Some(Withdrawn::NoUverbs)
        } else if view.qos_ready.is_some()
            && view.governs(hca)
            && !view.admits(hca.netdev.as_deref())
        {
            Some(Withdrawn::QosNotProven)
        } else {
            None
        };
        place(hca_device(hca, view), why);
    }
    if gpus {
        for gpu in &inventory.gpus {
            let why = (gpu.health != Health::Healthy).then_some(Withdrawn::GpuUnavailable);
            place(gpu_device(gpu), why);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use rocefabric_node_model::inventory;
    use rocefabric_node_testing::fixtures;

    fn dgx() -> Inventory {
        let dir = fixtures::tempdir().unwrap();
        fixtures::FixtureNode::dgx_h100()
            .write_to(dir.path())
            .unwrap();
        inventory::discover(dir.path(), &rocefabric_api::NicSelector::default()).unwrap()
    }

    fn str_attr<'a>(d: &'a DraDevice, name: &str) -> &'a str {
        match d.attributes.get(name) {
            Some(Attr::Str(s)) => s,
            other => panic!("{}: attribute {name} is {other:?}", d.name),
        }
    }

    #[test]
    fn names_are_dns_labels() {
        let inv = dgx();
        let listing = listing(&inv, &FabricView::default(), true, &Held::default());
        let names: BTreeSet<&str> = listing.all().map(|d| d.name.as_str()).collect();
        assert_eq!(names.len(), inv.hcas.len() + inv.gpus.len(), "unique names");
        for name in names {
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
            assert!(!name.starts_with('-') && !name.ends_with('-'), "{name}");
        }
        assert_eq!(label("hca", "mlx5_10"), "hca-mlx5-10");
        let hca = listing.find("hca-mlx5-0").unwrap();
        let rate = inv
            .hcas
            .iter()
            .find(|h| h.name == "mlx5_0")
            .unwrap()
            .rate_mbps;
        assert_eq!(rate, Some(400_000), "the fixture's NDR port");
        assert_eq!(
            hca.capacity.get("bandwidth").map(String::as_str),
            Some("400G")
        );
        assert_eq!(label("hca", "RXE_0_"), "hca-rxe-0");
    }

    #[test]
    fn each_gpu_shares_root_and_switch_with_its_rail_hca() {
        let inv = dgx();
        let listing = listing(&inv, &FabricView::default(), true, &Held::default());
        let pairs = rocefabric_node_model::topology::gpu_hca_pairs(&inv);
        assert_eq!(pairs.len(), 8, "the DGX fixture has 8 rails");
        for (gpu, hca, _) in pairs {
            let g = listing.find(&gpu_device_name(gpu)).unwrap();
            let h = listing.find(&hca_device_name(hca)).unwrap();
            assert_eq!(
                str_attr(g, PCIE_ROOT_ATTRIBUTE),
                str_attr(h, PCIE_ROOT_ATTRIBUTE)
            );
            assert_eq!(str_attr(g, "pcieSwitch"), str_attr(h, "pcieSwitch"));
            assert_eq!(
                g.attributes.get(NUMA_NODE_ATTRIBUTE),
                h.attributes.get(NUMA_NODE_ATTRIBUTE),
                "a GPU and its rail share a NUMA node"
            );
            assert!(g.attributes.contains_key(NUMA_NODE_ATTRIBUTE));
            assert!(str_attr(g, PCIE_ROOT_ATTRIBUTE).starts_with("pci"));
        }
    }

    #[test]
    fn down_and_unproven_hcas_are_withdrawn_with_the_reason() {
        let mut inv = dgx();
        inv.hcas[0].state = PortState::Down;
        inv.hcas[0].health = Health::Unhealthy;
        let ready_netdev = inv.hcas[2].netdev.clone().unwrap();
        let view = FabricView {
            traffic_class: Some(106),
            qos_ready: Some(BTreeSet::from([ready_netdev.clone()])),
            fabric_nics: None,
            fabric: Some("prod".into()),
        };
        let listing = listing(&inv, &view, false, &Held::default());
        assert_eq!(
            listing.published.len(),
            1,
            "only the proven HCA: {listing:?}"
        );
        let published = &listing.published[0];
        assert_eq!(str_attr(published, "netdev"), ready_netdev);
        assert_eq!(str_attr(published, "fabric"), "prod");
        assert_eq!(published.attributes["qosReady"], Attr::Bool(true));
        assert_eq!(listing.withdrawn[0].1, Withdrawn::LinkDown);
        assert!(
            listing.withdrawn[1..]
                .iter()
                .all(|(_, why)| *why == Withdrawn::QosNotProven)
        );
        assert!(listing.all().all(|d| d.kind == DeviceKind::Hca), "GPUs off");
    }

    #[test]
    fn devices_the_device_plugin_holds_are_withdrawn() {
        let inv = dgx();
        let held = Held {
            granted: BTreeSet::from([inv.hcas[1].id.clone(), inv.gpus[3].pci_address.clone()]),
            // A device both granted and unknown is withdrawn as granted (what is known).
            unknown: BTreeSet::from([inv.hcas[1].id.clone(), inv.hcas[4].id.clone()]),
        };
        let listing = listing(&inv, &FabricView::default(), true, &held);
        let withdrawn: Vec<(&str, &Withdrawn)> = listing
            .withdrawn
            .iter()
            .map(|(d, why)| (d.physical.as_str(), why))
            .collect();
        assert_eq!(
            withdrawn,
            vec![
                (inv.hcas[1].id.as_str(), &Withdrawn::HeldByDevicePlugin),
                (inv.hcas[4].id.as_str(), &Withdrawn::GrantsUnknown),
                (
                    inv.gpus[3].pci_address.as_str(),
                    &Withdrawn::HeldByDevicePlugin
                ),
            ]
        );
    }
}

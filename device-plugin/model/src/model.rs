//! The node's devices as discovery reports them: the contract between `inventory` (which builds
//! it from sysfs), `topology`, `allocation` and the kubelet-facing servers.

use serde::Serialize;

/// Kubelet health of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Health {
    Healthy,
    Unhealthy,
}

impl Health {
    /// The kubelet API string (`"Healthy"` / `"Unhealthy"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Unhealthy => "Unhealthy",
        }
    }
}

/// RDMA port state from `ports/<n>/state` (`"4: ACTIVE"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown,
}

impl PortState {
    /// The kernel's name of the state (`ACTIVE`, `DOWN`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            PortState::Nop => "NOP",
            PortState::Down => "DOWN",
            PortState::Init => "INIT",
            PortState::Armed => "ARMED",
            PortState::Active => "ACTIVE",
            PortState::ActiveDefer => "ACTIVE_DEFER",
            PortState::Unknown => "UNKNOWN",
        }
    }
}

/// One RDMA device with a RoCE (Ethernet link layer) port: what the `rdma/hca` resource hands out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hca {
    /// The device ID advertised to the kubelet: the PCI address of a PCI function
    /// (`0000:18:00.0`), `virtual-<node GUID>` for a virtual device (see [`virtual_hca_id`]).
    pub id: String,
    /// RDMA device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Full PCI address (`0000:18:00.0`); `None` for a virtual (software) RDMA device such as
    /// Soft-RoCE's rxe, which has no PCI function.
    pub pci_address: Option<String>,
    /// PCI vendor and device ids; `None` for a virtual device.
    pub vendor: Option<u16>,
    pub device_id: Option<u16>,
    /// The RoCE port number (from 1).
    pub port: u32,
    /// Netdev of the port (`enp24s0np0`), when one is bound.
    pub netdev: Option<String>,
    /// NUMA node, `None` when sysfs says -1 or nothing (always for a virtual device).
    pub numa_node: Option<u32>,
    pub state: PortState,
    /// `uverbsN` character device name of this RDMA device.
    pub uverbs: Option<String>,
    /// Index of the RoCE v2 IPv4-mapped GID on this port's netdev, when there is one.
    pub roce_v2_gid_index: Option<u32>,
    /// The port's link rate in Mb/s (`ports/<n>/rate`, `400 Gb/sec (4X NDR)` -> 400000), when
    /// readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_mbps: Option<u64>,
    /// Healthy when the port is ACTIVE and a uverbs device exists.
    pub health: Health,
    /// Realpath of the device under the sysfs root, relative to it: its PCI function
    /// (`/devices/pci0000:15/.../0000:18:00.0`), or `/devices/virtual/infiniband/rxe0` for a
    /// virtual device. Topology is computed from it (a virtual device is `SYS` from everything).
    pub device_path: String,
}

impl Hca {
    /// A software RDMA device (Soft-RoCE) with no PCI function behind it.
    pub fn is_virtual(&self) -> bool {
        self.pci_address.is_none()
    }
}

/// The device ID of a virtual RDMA device: `virtual-` and its node GUID as 16 hex digits. The
/// GUID is the parent netdev's MAC in EUI-64 form, so the ID survives the device being deleted
/// and re-created under another `rxeN` name. Netdevs sharing a MAC (a VLAN and its parent, bond
/// members) give their rxe devices one GUID: discovery keeps the first and says why.
pub fn virtual_hca_id(node_guid: u64) -> String {
    format!("virtual-{node_guid:016x}")
}

/// One NVIDIA GPU (vendor 0x10de, display or 3D class).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Full PCI address; the device ID advertised to the kubelet.
    pub pci_address: String,
    /// N of `/dev/nvidiaN`: the driver's `Device Minor` from
    /// `/proc/driver/nvidia/gpus/<bdf>/information` when readable, else the PCI bus order.
    pub index: u32,
    /// `GPU-...` UUID from the same file, when readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    pub device_id: u16,
    pub numa_node: Option<u32>,
    /// Healthy only with the nvidia driver bound (and, in `serve`, its device node present).
    pub health: Health,
    /// Realpath of the PCI function relative to the sysfs root.
    pub pci_path: String,
}

/// PCIe distance between two functions, as `nvidia-smi topo -m` names it (closest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Distance {
    /// Crosses at most one PCIe switch.
    PIX,
    /// Crosses several PCIe bridges, without the host bridge.
    PXB,
    /// Crosses a PCIe host bridge.
    PHB,
    /// Crosses host bridges within one NUMA node.
    NODE,
    /// Crosses the interconnect between NUMA nodes.
    SYS,
}

/// Everything discovered on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Inventory {
    /// RoCE HCAs, sorted by PCI address.
    pub hcas: Vec<Hca>,
    /// GPUs, sorted by index.
    pub gpus: Vec<Gpu>,
}

//! Fake sysfs trees laid out like the kernel's, for unit tests, the node-level e2e suite and the
//! README demo (`rocefabric-device-plugin discover --fixture dgx-h100`).
//!
//! A [`FixtureNode`] describes PCI functions (with their bridges), netdevs and RDMA devices;
//! [`FixtureNode::write_to`] lays them out under a directory the way sysfs does:
//! - real directories under `devices/pci<domain>:<bus>/<bridge>/.../<function>/`, one per bridge;
//! - symlinks, with relative targets computed as kernfs computes them, where sysfs has symlinks:
//!   `bus/pci/devices/<bdf>`, `<function>/driver`, `class/net/<if>`, `<if>/device`,
//!   `class/infiniband/<ibdev>`, `<ibdev>/device`, `class/infiniband_verbs/uverbsN`,
//!   `class/infiniband_mad/{umad,issm}N`;
//! - attribute files in the kernel's formats (`"0x15b3\n"`, `"4: ACTIVE\n"`, `"-1\n"`, full
//!   8x4-hex GIDs);
//! - GID tables as mlx5/ib_core fill them for RoCE: per netdev the link-local GID (RoCE v1 at 0,
//!   RoCE v2 at 1), then per address in the netdev's order a v1 and a v2 entry. Unused entries
//!   read as zeros, and their `gid_attrs/types/<i>` and `gid_attrs/ndevs/<i>` exist but cannot be
//!   read (the kernel answers EINVAL; here they are directories, so `read` fails with EISDIR
//!   whatever the caller's privileges).
//!
//! Runtime helpers change a written tree the way the kernel would: [`set_port_state`],
//! [`remove_rdma_device`], [`remove_pci_function`]; [`replace_with_fifo`] the way it never would.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Component, Path, PathBuf};

/// PCI class of a 3D controller (data-centre GPUs).
pub const CLASS_3D: u32 = 0x03_02_00;
/// PCI class of an Ethernet controller.
pub const CLASS_ETHERNET: u32 = 0x02_00_00;
/// PCI class of an InfiniBand controller.
pub const CLASS_INFINIBAND: u32 = 0x02_07_00;
/// PCI class of a PCI-to-PCI bridge.
pub const CLASS_BRIDGE: u32 = 0x06_04_00;
/// PCI class "other bridge" (NVSwitch).
pub const CLASS_OTHER_BRIDGE: u32 = 0x06_80_00;

/// Names accepted by [`FixtureNode::variant`].
pub const VARIANTS: &[&str] = &[
    "dgx-h100",
    "dgx-h100-link-down",
    "dgx-h100-ib-port",
    "dgx-h100-gpu-no-numa",
    "dgx-h100-gid-ipv6-first",
    "dgx-h100-no-rdma",
    "vm-soft-roce",
];

/// A node: PCI functions with what hangs off them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixtureNode {
    pub functions: Vec<PciFunction>,
    /// Entries per RDMA port GID table (mlx5 RoCE ports have 255).
    pub gid_table_len: u32,
    /// Virtual RDMA devices (Soft-RoCE), under `devices/virtual/infiniband/`.
    pub soft_roce: Vec<SoftRoceDevice>,
}

/// A Soft-RoCE (`rdma_rxe`) device as `rdma link add <name> type rxe netdev <parent>` makes it:
/// no PCI function, an empty `fw_ver`, `parent` naming the netdev, a node GUID that is the
/// parent's MAC in EUI-64 form, one port whose GID table holds RoCE v2 entries only, and rxe's
/// `hw_counters` (no `counters/` directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftRoceDevice {
    pub name: String,
    /// The netdev it was added on; must be one of the node's netdevs.
    pub parent: String,
    pub uverbs: Option<u32>,
}

/// One PCI function and the bridges above it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Host bridge directory, `pci0000:15`.
    pub root: String,
    /// Bridges from the root port down (`0000:15:01.0`, ...).
    pub bridges: Vec<String>,
    /// `0000:18:00.0`.
    pub address: String,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    /// `None` is written as `-1`.
    pub numa_node: Option<u32>,
    pub driver: Option<String>,
    pub netdevs: Vec<Netdev>,
    pub rdma: Option<RdmaDevice>,
}

/// A network interface of a function (`<function>/net/<name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netdev {
    pub name: String,
    pub mac: [u8; 6],
    /// Addresses in the order they were configured (the GID table follows it).
    pub addresses: Vec<IpAddr>,
    /// Carrier up and operstate `up`.
    pub up: bool,
    /// `dev_port`: 0 for the first port of the function.
    pub dev_port: u32,
    /// ARPHRD type: 1 Ethernet, 32 InfiniBand (IPoIB).
    pub arp_type: u16,
}

/// An RDMA device (`<function>/infiniband/<name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaDevice {
    pub name: String,
    /// `node_type` number: 1 CA, 4 RNIC (iWARP).
    pub node_type: u8,
    pub node_guid: u64,
    pub fw_ver: String,
    pub hca_type: Option<String>,
    /// `uverbsN` minor index; `None`: no uverbs device (ib_uverbs not bound).
    pub uverbs: Option<u32>,
    pub ports: Vec<RdmaPort>,
}

/// Link layer of an RDMA port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    Ethernet,
    InfiniBand,
}

/// Type of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// `IB/RoCE v1` (also every GID of an InfiniBand port).
    RoceV1,
    /// `RoCE v2`.
    RoceV2,
}

/// One populated GID table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub gid: Ipv6Addr,
    pub gid_type: GidType,
    /// `gid_attrs/ndevs/<i>`; `None` makes the read fail (InfiniBand ports).
    pub ndev: Option<String>,
}

/// A port of an RDMA device (`ports/<number>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaPort {
    pub number: u32,
    pub link_layer: LinkLayer,
    /// `4: ACTIVE`/`5: LinkUp` when true, `1: DOWN`/`3: Disabled` otherwise.
    pub active: bool,
    /// The netdev (of the same function) this port's RoCE GIDs belong to.
    pub netdev: Option<String>,
    pub rate: String,
    /// The GID table; `None` derives it from the netdev as ib_core does for RoCE.
    pub gids: Option<Vec<GidEntry>>,
    /// `umadN` / `issmN` index.
    pub umad: Option<u32>,
}

impl PciFunction {
    fn new(
        root: &str,
        bridges: &[&str],
        address: &str,
        vendor: u16,
        device: u16,
        class: u32,
    ) -> Self {
        PciFunction {
            root: root.to_string(),
            bridges: bridges.iter().map(|b| b.to_string()).collect(),
            address: address.to_string(),
            vendor,
            device,
            class,
            numa_node: None,
            driver: None,
            netdevs: Vec::new(),
            rdma: None,
        }
    }

    /// Directory of the function relative to the sysfs root.
    pub fn sysfs_dir(&self) -> PathBuf {
        let mut p = PathBuf::from("devices");
        p.push(&self.root);
        for b in &self.bridges {
            p.push(b);
        }
        p.push(&self.address);
        p
    }
}

fn bdf(bus: u8, dev: u8, func: u8) -> String {
    format!("0000:{bus:02x}:{dev:02x}.{func:x}")
}

fn mac(prefix: [u8; 4], a: u8, b: u8) -> [u8; 6] {
    [prefix[0], prefix[1], prefix[2], prefix[3], a, b]
}

/// mlx5-style node GUID from a MAC: `a0:88:c2:3b:50:6a` -> `a088:c203:003b:506a`.
fn guid_from_mac(m: [u8; 6]) -> u64 {
    u64::from_be_bytes([m[0], m[1], m[2], 0x03, 0x00, m[3], m[4], m[5]])
}

/// Link-local GID (modified EUI-64 of the MAC).
fn link_local(m: [u8; 6]) -> Ipv6Addr {
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

fn ethernet_netdev(name: &str, mac: [u8; 6], addr: Option<Ipv4Addr>, dev_port: u32) -> Netdev {
    Netdev {
        name: name.to_string(),
        mac,
        addresses: addr.map(IpAddr::V4).into_iter().collect(),
        up: true,
        dev_port,
        arp_type: 1,
    }
}

fn roce_port(netdev: &str, rate: &str, umad: u32) -> RdmaPort {
    RdmaPort {
        number: 1,
        link_layer: LinkLayer::Ethernet,
        active: true,
        netdev: Some(netdev.to_string()),
        rate: rate.to_string(),
        gids: None,
        umad: Some(umad),
    }
}

#[allow(clippy::too_many_arguments)]
fn mlx5_function(
    root: &str,
    bridges: &[&str],
    address: &str,
    numa: u32,
    ibdev: &str,
    netdev: &str,
    m: [u8; 6],
    ip: Ipv4Addr,
    uverbs: u32,
    rate: &str,
) -> PciFunction {
    let dev_port = 0;
    let mut f = PciFunction::new(root, bridges, address, 0x15b3, 0x1021, CLASS_ETHERNET);
    f.numa_node = Some(numa);
    f.driver = Some("mlx5_core".into());
    f.netdevs
        .push(ethernet_netdev(netdev, m, Some(ip), dev_port));
    f.rdma = Some(RdmaDevice {
        name: ibdev.to_string(),
        node_type: 1,
        node_guid: guid_from_mac(m),
        fw_ver: "28.39.1002".into(),
        hca_type: Some("MT4129".into()),
        uverbs: Some(uverbs),
        ports: vec![roce_port(netdev, rate, uverbs)],
    });
    f
}

impl FixtureNode {
    /// A DGX H100 as `dgx-h100.md` describes it:
    /// - 8 H100 SXM5 GPUs (10de:2330) and 8 compute ConnectX-7 (15b3:1021, `mlx5_0`, `mlx5_3`..`6`,
    ///   `mlx5_9`..`11`), each GPU/NIC pair below its own host bridge, the NIC on one downstream
    ///   port of a switch and the GPU one switch further down (PXB);
    /// - 2 dual-port storage ConnectX-7 (`mlx5_1`/`mlx5_2` at 29:00.x on NUMA 0, `mlx5_7`/`mlx5_8`
    ///   at aa:00.x on NUMA 1);
    /// - an Intel E810 (8086:159b) at 82:00.x in RoCE mode (`irdma0`/`irdma1`, NUMA 1), whose
    ///   driver registered first, so its uverbs are 0 and 1 and `mlx5_k` has `uverbs(k+2)`;
    /// - an onboard Intel X550 (`eno3`, no RDMA) and 4 NVSwitch functions (10de:22a3, class
    ///   0x0680: not GPUs);
    /// - every RoCE port ACTIVE with one IPv4 address, so the RoCE v2 IPv4 GID is at index 3.
    pub fn dgx_h100() -> FixtureNode {
        let mut functions = Vec::new();
        // NVSwitches behind a switch on the legacy root.
        for (i, bus) in [0x03u8, 0x04, 0x05, 0x06].into_iter().enumerate() {
            let down = bdf(0x02, i as u8, 0);
            let mut f = PciFunction::new(
                "pci0000:00",
                &["0000:00:01.0", "0000:01:00.0", &down],
                &bdf(bus, 0, 0),
                0x10de,
                0x22a3,
                CLASS_OTHER_BRIDGE,
            );
            f.numa_node = Some(0);
            f.driver = Some("nvidia".into());
            functions.push(f);
        }
        // Onboard NIC without RDMA.
        let mut onboard = PciFunction::new(
            "pci0000:0a",
            &["0000:0a:01.0"],
            "0000:0b:00.0",
            0x8086,
            0x1563,
            CLASS_ETHERNET,
        );
        onboard.numa_node = Some(0);
        onboard.driver = Some("ixgbe".into());
        onboard.netdevs.push(ethernet_netdev(
            "eno3",
            [0x7c, 0xc2, 0x55, 0x10, 0x20, 0x30],
            Some(Ipv4Addr::new(192, 168, 1, 10)),
            0,
        ));
        functions.push(onboard);

        // Compute rails: (NIC bus, RDMA device, netdev, GPU bus, NUMA node).
        let rails: [(u8, &str, &str, u8, u32); 8] = [
            (0x18, "mlx5_0", "enp24s0np0", 0x1b, 0),
            (0x40, "mlx5_3", "enp64s0np0", 0x43, 0),
            (0x4f, "mlx5_4", "enp79s0np0", 0x52, 0),
            (0x5e, "mlx5_5", "enp94s0np0", 0x61, 0),
            (0x9a, "mlx5_6", "enp154s0np0", 0x9d, 1),
            (0xc0, "mlx5_9", "enp192s0np0", 0xc3, 1),
            (0xce, "mlx5_10", "enp206s0np0", 0xd1, 1),
            (0xdc, "mlx5_11", "enp220s0np0", 0xdf, 1),
        ];
        for (rail, (nic_bus, ibdev, netdev, gpu_bus, numa)) in rails.into_iter().enumerate() {
            let r = nic_bus - 3;
            let root = format!("pci0000:{r:02x}");
            let (rp, up) = (bdf(r, 1, 0), bdf(r + 1, 0, 0));
            let (down_nic, down_gpu) = (bdf(r + 2, 0, 0), bdf(r + 2, 1, 0));
            let (up2, down2) = (bdf(gpu_bus - 2, 0, 0), bdf(gpu_bus - 1, 0, 0));
            let k: u32 = ibdev
                .trim_start_matches("mlx5_")
                .parse()
                .unwrap_or_default();
            functions.push(mlx5_function(
                &root,
                &[&rp, &up, &down_nic],
                &bdf(nic_bus, 0, 0),
                numa,
                ibdev,
                netdev,
                mac([0xa0, 0x88, 0xc2, 0x3b], 0x50, 0x10 + rail as u8),
                Ipv4Addr::new(10, 200, rail as u8, 10),
                k + 2,
                "400 Gb/sec (4X NDR)",
            ));
            let mut gpu = PciFunction::new(
                &root,
                &[&rp, &up, &down_gpu, &up2, &down2],
                &bdf(gpu_bus, 0, 0),
                0x10de,
                0x2330,
                CLASS_3D,
            );
            gpu.numa_node = Some(numa);
            gpu.driver = Some("nvidia".into());
            functions.push(gpu);
        }

        // Storage cards: dual-port ConnectX-7, one per socket.
        for (r, bus, numa, names, ips) in [
            (0x26u8, 0x29u8, 0u32, ["mlx5_1", "mlx5_2"], [1u8, 2]),
            (0xa7, 0xaa, 1, ["mlx5_7", "mlx5_8"], [3, 4]),
        ] {
            let root = format!("pci0000:{r:02x}");
            let bridges = [bdf(r, 1, 0), bdf(r + 1, 0, 0), bdf(r + 2, 0, 0)];
            let bridges: Vec<&str> = bridges.iter().map(String::as_str).collect();
            for (func, ibdev) in names.into_iter().enumerate() {
                let k: u32 = ibdev
                    .trim_start_matches("mlx5_")
                    .parse()
                    .unwrap_or_default();
                let netdev = format!("enp{bus}s0f{func}np{func}");
                let mut f = mlx5_function(
                    &root,
                    &bridges,
                    &bdf(bus, 0, func as u8),
                    numa,
                    ibdev,
                    &netdev,
                    mac([0xb8, 0x3f, 0xd2, 0x11], bus, func as u8),
                    Ipv4Addr::new(10, 100, ips[func], 10),
                    k + 2,
                    "200 Gb/sec (2X NDR)",
                );
                f.netdevs[0].dev_port = 0;
                functions.push(f);
            }
        }

        // Intel E810 in RoCE mode (irdma), on NUMA 1.
        for func in 0..2u8 {
            let netdev = format!("enp130s0f{func}");
            let mut f = PciFunction::new(
                "pci0000:81",
                &["0000:81:01.0"],
                &bdf(0x82, 0, func),
                0x8086,
                0x159b,
                CLASS_ETHERNET,
            );
            f.numa_node = Some(1);
            f.driver = Some("ice".into());
            let m = mac([0x40, 0xa6, 0xb7, 0x2c], 0x00, func);
            f.netdevs.push(ethernet_netdev(
                &netdev,
                m,
                Some(Ipv4Addr::new(10, 150, func, 10)),
                0,
            ));
            f.rdma = Some(RdmaDevice {
                name: format!("irdma{func}"),
                node_type: 1,
                node_guid: u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]),
                fw_ver: "1.70".into(),
                hca_type: None,
                uverbs: Some(u32::from(func)),
                ports: vec![roce_port(&netdev, "100 Gb/sec (4X EDR)", u32::from(func))],
            });
            functions.push(f);
        }
        functions.sort_by(|a, b| a.address.cmp(&b.address));
        FixtureNode {
            functions,
            gid_table_len: 255,
            soft_roce: Vec::new(),
        }
    }

    /// A qemu VM as the Soft-RoCE suite boots it: one virtio-net NIC (`eth0`, 10.0.2.15) with
    /// `rxe0` on it (`uverbs0`), no GPU, no NUMA.
    pub fn vm_soft_roce() -> FixtureNode {
        let mut nic = PciFunction::new(
            "pci0000:00",
            &[],
            "0000:00:03.0",
            0x1af4,
            0x1041,
            CLASS_ETHERNET,
        );
        nic.driver = Some("virtio-pci".into());
        nic.netdevs.push(ethernet_netdev(
            "eth0",
            [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            Some(Ipv4Addr::new(10, 0, 2, 15)),
            0,
        ));
        FixtureNode {
            functions: vec![nic],
            gid_table_len: 1024,
            soft_roce: Vec::new(),
        }
        .with_soft_roce("rxe0", "eth0", Some(0))
    }

    /// A Soft-RoCE device `name` on netdev `parent` with `uverbs<uverbs>`.
    pub fn with_soft_roce(mut self, name: &str, parent: &str, uverbs: Option<u32>) -> Self {
        self.soft_roce.push(SoftRoceDevice {
            name: name.to_string(),
            parent: parent.to_string(),
            uverbs,
        });
        self
    }

    fn netdev(&self, name: &str) -> Option<&Netdev> {
        self.functions
            .iter()
            .flat_map(|f| f.netdevs.iter())
            .find(|n| n.name == name)
    }

    /// A fixture by name (see [`VARIANTS`]).
    pub fn variant(name: &str) -> Option<FixtureNode> {
        let dgx = FixtureNode::dgx_h100();
        Some(match name {
            "dgx-h100" => dgx,
            "dgx-h100-link-down" => dgx.with_port_down("mlx5_3"),
            "dgx-h100-ib-port" => dgx.with_infiniband_port("mlx5_0"),
            "dgx-h100-gpu-no-numa" => dgx.with_gpu_numa("0000:61:00.0", None),
            "dgx-h100-gid-ipv6-first" => dgx.with_addresses(
                "enp24s0np0",
                vec![
                    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, 0x10)),
                    IpAddr::V4(Ipv4Addr::new(10, 200, 0, 10)),
                ],
            ),
            "dgx-h100-no-rdma" => dgx.without_rdma(),
            "vm-soft-roce" => FixtureNode::vm_soft_roce(),
            _ => return None,
        })
    }

    /// The function at `address`.
    pub fn function_mut(&mut self, address: &str) -> Option<&mut PciFunction> {
        self.functions.iter_mut().find(|f| f.address == address)
    }

    /// The function holding RDMA device `ibdev`.
    pub fn rdma_function_mut(&mut self, ibdev: &str) -> Option<&mut PciFunction> {
        self.functions
            .iter_mut()
            .find(|f| f.rdma.as_ref().is_some_and(|r| r.name == ibdev))
    }

    /// RDMA device `ibdev`.
    pub fn rdma_mut(&mut self, ibdev: &str) -> Option<&mut RdmaDevice> {
        self.rdma_function_mut(ibdev).and_then(|f| f.rdma.as_mut())
    }

    /// Netdev `name`.
    pub fn netdev_mut(&mut self, name: &str) -> Option<&mut Netdev> {
        self.functions
            .iter_mut()
            .flat_map(|f| f.netdevs.iter_mut())
            .find(|n| n.name == name)
    }

    /// Netdev `old` is called `new` (its RDMA ports and GID entries follow), e.g. to match an
    /// interface a test created on the host.
    pub fn with_netdev_renamed(mut self, old: &str, new: &str) -> Self {
        for f in &mut self.functions {
            for n in f.netdevs.iter_mut().filter(|n| n.name == old) {
                n.name = new.to_string();
            }
            for p in f.rdma.iter_mut().flat_map(|r| r.ports.iter_mut()) {
                if p.netdev.as_deref() == Some(old) {
                    p.netdev = Some(new.to_string());
                }
                for e in p.gids.iter_mut().flatten() {
                    if e.ndev.as_deref() == Some(old) {
                        e.ndev = Some(new.to_string());
                    }
                }
            }
        }
        self
    }

    /// Port 1 of `ibdev` and its netdev go down (`1: DOWN`, `3: Disabled`, no carrier).
    pub fn with_port_down(mut self, ibdev: &str) -> Self {
        if let Some(f) = self.rdma_function_mut(ibdev) {
            for n in &mut f.netdevs {
                n.up = false;
            }
            for p in f.rdma.iter_mut().flat_map(|r| r.ports.iter_mut()) {
                p.active = false;
            }
        }
        self
    }

    /// `ibdev` runs its port in InfiniBand mode: link layer `InfiniBand`, class 0x0207, an IPoIB
    /// netdev (`ibp<bus>s0`), IB GIDs of type `IB/RoCE v1` without ndevs.
    pub fn with_infiniband_port(mut self, ibdev: &str) -> Self {
        if let Some(f) = self.rdma_function_mut(ibdev) {
            f.class = CLASS_INFINIBAND;
            let bus = u8::from_str_radix(&f.address[5..7], 16).unwrap_or_default();
            let ipoib = format!("ibp{bus}s0");
            for n in &mut f.netdevs {
                n.name = ipoib.clone();
                n.arp_type = 32;
            }
            if let Some(r) = f.rdma.as_mut() {
                let guid = r.node_guid.to_be_bytes();
                let mut gid = [0u8; 16];
                gid[0] = 0xfe;
                gid[1] = 0x80;
                gid[8..].copy_from_slice(&guid);
                for p in &mut r.ports {
                    p.link_layer = LinkLayer::InfiniBand;
                    p.netdev = None;
                    p.rate = "400 Gb/sec (4X NDR)".into();
                    p.gids = Some(vec![GidEntry {
                        gid: Ipv6Addr::from(gid),
                        gid_type: GidType::RoceV1,
                        ndev: None,
                    }]);
                }
            }
        }
        self
    }

    /// The GPU (or any function) at `address` reports NUMA node `numa` (`None`: `-1`).
    pub fn with_gpu_numa(mut self, address: &str, numa: Option<u32>) -> Self {
        if let Some(f) = self.function_mut(address) {
            f.numa_node = numa;
        }
        self
    }

    /// Replace the addresses of `netdev` (in configuration order; the GID table follows).
    pub fn with_addresses(mut self, netdev: &str, addresses: Vec<IpAddr>) -> Self {
        if let Some(n) = self.netdev_mut(netdev) {
            n.addresses = addresses;
        }
        self
    }

    /// No RDMA driver loaded: netdevs stay, no `infiniband*` entries anywhere.
    pub fn without_rdma(mut self) -> Self {
        for f in &mut self.functions {
            f.rdma = None;
        }
        self
    }

    /// Drop the function at `address` (as if it were not present at boot).
    pub fn without_function(mut self, address: &str) -> Self {
        self.functions.retain(|f| f.address != address);
        self
    }

    /// Write the tree under `root` (created when missing).
    pub fn write_to(&self, root: &Path) -> io::Result<()> {
        let mut w = Writer {
            root,
            made: HashSet::new(),
        };
        let w = &mut w;
        for d in [
            "devices",
            "class/net",
            "class/infiniband",
            "class/infiniband_verbs",
            "class/infiniband_mad",
            "bus/pci/devices",
            "bus/pci/drivers",
        ] {
            w.mkdir(Path::new(d))?;
        }
        w.write(Path::new("class/infiniband_verbs/abi_version"), "6\n")?;
        w.write(Path::new("class/infiniband_mad/abi_version"), "5\n")?;
        let mut bridges_done = BTreeSet::new();
        let mut ifindex = 2;
        for f in &self.functions {
            let mut dir = PathBuf::from("devices").join(&f.root);
            w.mkdir(&dir)?;
            for (depth, b) in f.bridges.iter().enumerate() {
                dir.push(b);
                if bridges_done.insert(dir.clone()) {
                    // Root ports are the CPU's (Intel), deeper bridges a PCIe switch (Broadcom).
                    let (vendor, device) = if depth == 0 {
                        (0x8086, 0x352a)
                    } else {
                        (0x1000, 0xc030)
                    };
                    write_pci_attrs(w, &dir, vendor, device, CLASS_BRIDGE, f.numa_node)?;
                    w.symlink(&Path::new("bus/pci/devices").join(b), &dir)?;
                    w.write(&dir.join("driver_override"), "(null)\n")?;
                }
            }
            self.write_function(w, f, &mut ifindex)?;
        }
        for s in &self.soft_roce {
            self.write_soft_roce(w, s)?;
        }
        Ok(())
    }

    fn write_soft_roce(&self, w: &mut Writer<'_>, s: &SoftRoceDevice) -> io::Result<()> {
        let parent = self.netdev(&s.parent).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("soft-RoCE device {}: no netdev {}", s.name, s.parent),
            )
        })?;
        let m = parent.mac;
        let guid = u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]);
        let ib = Path::new("devices/virtual/infiniband").join(&s.name);
        w.write(&ib.join("node_type"), "1: CA\n")?;
        w.write(&ib.join("node_guid"), &format!("{}\n", guid_text(guid)))?;
        w.write(
            &ib.join("sys_image_guid"),
            &format!("{}\n", guid_text(guid)),
        )?;
        w.write(&ib.join("fw_ver"), "\n")?;
        w.write(&ib.join("node_desc"), "rxe\n")?;
        w.write(&ib.join("parent"), &format!("{}\n", s.parent))?;
        w.symlink(&Path::new("class/infiniband").join(&s.name), &ib)?;
        if let Some(n) = s.uverbs {
            let uv = Path::new("devices/virtual/infiniband_verbs").join(format!("uverbs{n}"));
            w.write(&uv.join("ibdev"), &format!("{}\n", s.name))?;
            w.write(&uv.join("abi_version"), "2\n")?;
            w.write(&uv.join("dev"), &format!("231:{}\n", 192 + n))?;
            w.symlink(
                &Path::new("class/infiniband_verbs").join(format!("uverbs{n}")),
                &uv,
            )?;
        }
        let pd = ib.join("ports/1");
        let (state, phys) = if parent.up {
            ("4: ACTIVE", "5: LinkUp")
        } else {
            ("1: DOWN", "3: Disabled")
        };
        w.write(&pd.join("state"), &format!("{state}\n"))?;
        w.write(&pd.join("phys_state"), &format!("{phys}\n"))?;
        w.write(&pd.join("link_layer"), "Ethernet\n")?;
        w.write(&pd.join("rate"), "2.5 Gb/sec (1X SDR)\n")?;
        for c in RXE_HW_COUNTERS {
            w.write(&pd.join("hw_counters").join(c), "0\n")?;
        }
        // rxe registers RoCE v2 GIDs only, in the order the addresses were added.
        let entries: Vec<GidEntry> = roce_gid_table(Some(parent))
            .into_iter()
            .filter(|e| e.gid_type == GidType::RoceV2)
            .collect();
        self.write_gid_table(w, &pd, &entries)?;
        Ok(())
    }

    fn write_function(
        &self,
        w: &mut Writer<'_>,
        f: &PciFunction,
        ifindex: &mut u32,
    ) -> io::Result<()> {
        let dir = f.sysfs_dir();
        write_pci_attrs(w, &dir, f.vendor, f.device, f.class, f.numa_node)?;
        w.symlink(&Path::new("bus/pci/devices").join(&f.address), &dir)?;
        if let Some(drv) = &f.driver {
            let drv_dir = Path::new("bus/pci/drivers").join(drv);
            w.mkdir(&drv_dir)?;
            w.symlink(&dir.join("driver"), &drv_dir)?;
            w.symlink(&drv_dir.join(&f.address), &dir)?;
        }
        for n in &f.netdevs {
            let nd = dir.join("net").join(&n.name);
            let m = n.mac;
            let mac = format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}\n",
                m[0], m[1], m[2], m[3], m[4], m[5]
            );
            w.write(&nd.join("address"), &mac)?;
            w.write(&nd.join("operstate"), if n.up { "up\n" } else { "down\n" })?;
            w.write(&nd.join("carrier"), if n.up { "1\n" } else { "0\n" })?;
            w.write(&nd.join("dev_port"), &format!("{}\n", n.dev_port))?;
            w.write(&nd.join("ifindex"), &format!("{ifindex}\n"))?;
            w.write(&nd.join("type"), &format!("{}\n", n.arp_type))?;
            w.write(
                &nd.join("mtu"),
                if n.arp_type == 32 { "4092\n" } else { "9000\n" },
            )?;
            w.symlink(&nd.join("device"), &dir)?;
            w.symlink(&Path::new("class/net").join(&n.name), &nd)?;
            *ifindex += 1;
        }
        if let Some(r) = &f.rdma {
            self.write_rdma(w, f, r)?;
        }
        Ok(())
    }

    fn write_rdma(&self, w: &mut Writer<'_>, f: &PciFunction, r: &RdmaDevice) -> io::Result<()> {
        let dir = f.sysfs_dir();
        let ib = dir.join("infiniband").join(&r.name);
        let node_type = match r.node_type {
            1 => "1: CA",
            2 => "2: switch",
            3 => "3: router",
            4 => "4: RNIC",
            _ => "0: <unknown>",
        };
        w.write(&ib.join("node_type"), &format!("{node_type}\n"))?;
        w.write(
            &ib.join("node_guid"),
            &format!("{}\n", guid_text(r.node_guid)),
        )?;
        w.write(
            &ib.join("sys_image_guid"),
            &format!("{}\n", guid_text(r.node_guid)),
        )?;
        w.write(&ib.join("fw_ver"), &format!("{}\n", r.fw_ver))?;
        if let Some(t) = &r.hca_type {
            w.write(&ib.join("hca_type"), &format!("{t}\n"))?;
        }
        w.write(&ib.join("node_desc"), &format!("fixture {}\n", r.name))?;
        w.symlink(&ib.join("device"), &dir)?;
        w.symlink(&Path::new("class/infiniband").join(&r.name), &ib)?;
        if let Some(n) = r.uverbs {
            let uv = dir.join("infiniband_verbs").join(format!("uverbs{n}"));
            w.write(&uv.join("ibdev"), &format!("{}\n", r.name))?;
            w.write(&uv.join("abi_version"), "1\n")?;
            w.write(&uv.join("dev"), &format!("231:{}\n", 192 + n))?;
            w.symlink(&uv.join("device"), &dir)?;
            w.symlink(
                &Path::new("class/infiniband_verbs").join(format!("uverbs{n}")),
                &uv,
            )?;
        }
        for p in &r.ports {
            let pd = ib.join("ports").join(p.number.to_string());
            let (state, phys) = if p.active {
                ("4: ACTIVE", "5: LinkUp")
            } else {
                ("1: DOWN", "3: Disabled")
            };
            w.write(&pd.join("state"), &format!("{state}\n"))?;
            w.write(&pd.join("phys_state"), &format!("{phys}\n"))?;
            let ll = match p.link_layer {
                LinkLayer::Ethernet => "Ethernet",
                LinkLayer::InfiniBand => "InfiniBand",
            };
            w.write(&pd.join("link_layer"), &format!("{ll}\n"))?;
            w.write(&pd.join("rate"), &format!("{}\n", p.rate))?;
            w.write(&pd.join("lid"), "0x0\n")?;
            w.write(&pd.join("sm_lid"), "0x0\n")?;
            w.write(&pd.join("cap_mask"), "0x04010000\n")?;
            for c in [
                "port_xmit_data",
                "port_rcv_data",
                "port_xmit_packets",
                "port_rcv_packets",
            ] {
                w.write(&pd.join("counters").join(c), "0\n")?;
            }
            for c in [
                "np_cnp_sent",
                "np_ecn_marked_roce_packets",
                "rp_cnp_handled",
                "rp_cnp_ignored",
                "out_of_sequence",
                "packet_seq_err",
                "local_ack_timeout_err",
                "out_of_buffer",
            ] {
                w.write(&pd.join("hw_counters").join(c), "0\n")?;
            }
            self.write_gids(w, &pd, f, p)?;
            if let Some(n) = p.umad {
                for (kind, minor) in [("umad", n), ("issm", 64 + n)] {
                    let name = format!("{kind}{n}");
                    let md = dir.join("infiniband_mad").join(&name);
                    w.write(&md.join("ibdev"), &format!("{}\n", r.name))?;
                    w.write(&md.join("port"), &format!("{}\n", p.number))?;
                    w.write(&md.join("dev"), &format!("231:{minor}\n"))?;
                    w.symlink(&md.join("device"), &dir)?;
                    w.symlink(&Path::new("class/infiniband_mad").join(&name), &md)?;
                }
            }
        }
        Ok(())
    }

    fn write_gids(
        &self,
        w: &mut Writer<'_>,
        pd: &Path,
        f: &PciFunction,
        p: &RdmaPort,
    ) -> io::Result<()> {
        let entries = match &p.gids {
            Some(g) => g.clone(),
            None => roce_gid_table(
                p.netdev
                    .as_deref()
                    .and_then(|n| f.netdevs.iter().find(|d| d.name == n)),
            ),
        };
        self.write_gid_table(w, pd, &entries)
    }

    /// `gids/<i>`, `gid_attrs/types/<i>`, `gid_attrs/ndevs/<i>` of a port: `entries` first, the
    /// rest of the table empty (zeros, unreadable attributes).
    fn write_gid_table(
        &self,
        w: &mut Writer<'_>,
        pd: &Path,
        entries: &[GidEntry],
    ) -> io::Result<()> {
        let len = self.gid_table_len.max(entries.len() as u32);
        for i in 0..len {
            let gd = pd.join("gids").join(i.to_string());
            let types = pd.join("gid_attrs/types").join(i.to_string());
            let ndevs = pd.join("gid_attrs/ndevs").join(i.to_string());
            match entries.get(i as usize) {
                Some(e) => {
                    w.write(&gd, &format!("{}\n", gid_text(e.gid)))?;
                    let t = match e.gid_type {
                        GidType::RoceV1 => "IB/RoCE v1",
                        GidType::RoceV2 => "RoCE v2",
                    };
                    w.write(&types, &format!("{t}\n"))?;
                    match &e.ndev {
                        Some(n) => w.write(&ndevs, &format!("{n}\n"))?,
                        None => w.unreadable(&ndevs)?,
                    }
                }
                None => {
                    w.write(&gd, &format!("{}\n", gid_text(Ipv6Addr::UNSPECIFIED)))?;
                    w.unreadable(&types)?;
                    w.unreadable(&ndevs)?;
                }
            }
        }
        Ok(())
    }
}

/// The `ports/1/hw_counters` files of an rxe device (kernel 6.1).
pub const RXE_HW_COUNTERS: &[&str] = &[
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
];

/// The RoCE GID table ib_core builds for a netdev: link-local v1, v2, then v1/v2 per address.
fn roce_gid_table(netdev: Option<&Netdev>) -> Vec<GidEntry> {
    let Some(n) = netdev else { return Vec::new() };
    let mut gids = vec![link_local(n.mac)];
    gids.extend(n.addresses.iter().map(|a| match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => *v6,
    }));
    gids.into_iter()
        .flat_map(|gid| {
            [GidType::RoceV1, GidType::RoceV2].map(|gid_type| GidEntry {
                gid,
                gid_type,
                ndev: Some(n.name.clone()),
            })
        })
        .collect()
}

/// `fe80:0000:0000:0000:a288:c2ff:fe3b:506a`: every group 4 digits, as sysfs prints GIDs.
pub fn gid_text(gid: Ipv6Addr) -> String {
    gid.segments()
        .iter()
        .map(|g| format!("{g:04x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// GUIDs print as four groups: `a088:c203:003b:506a`.
fn guid_text(guid: u64) -> String {
    let b = guid.to_be_bytes();
    (0..4)
        .map(|i| format!("{:02x}{:02x}", b[2 * i], b[2 * i + 1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn write_pci_attrs(
    w: &mut Writer<'_>,
    dir: &Path,
    vendor: u16,
    device: u16,
    class: u32,
    numa: Option<u32>,
) -> io::Result<()> {
    w.write(&dir.join("vendor"), &format!("0x{vendor:04x}\n"))?;
    w.write(&dir.join("device"), &format!("0x{device:04x}\n"))?;
    w.write(&dir.join("class"), &format!("0x{class:06x}\n"))?;
    let numa_text = numa.map_or_else(|| "-1".to_string(), |n| n.to_string());
    w.write(&dir.join("numa_node"), &format!("{numa_text}\n"))?;
    let cpus = match numa {
        Some(0) => "0-55,112-167",
        Some(_) => "56-111,168-223",
        None => "0-223",
    };
    w.write(&dir.join("local_cpulist"), &format!("{cpus}\n"))?;
    w.write(&dir.join("max_link_speed"), "32.0 GT/s PCIe\n")?;
    w.write(&dir.join("max_link_width"), "16\n")?;
    w.write(&dir.join("enable"), "1\n")
}

/// Writes a tree below `root`, creating each directory once.
struct Writer<'a> {
    root: &'a Path,
    made: HashSet<PathBuf>,
}

impl Writer<'_> {
    fn mkdir(&mut self, rel: &Path) -> io::Result<()> {
        if !self.made.contains(rel) {
            fs::create_dir_all(self.root.join(rel))?;
            let mut p = rel.to_path_buf();
            while self.made.insert(p.clone()) && p.pop() {}
        }
        Ok(())
    }

    fn mkparent(&mut self, rel: &Path) -> io::Result<()> {
        match rel.parent() {
            Some(parent) => self.mkdir(parent),
            None => Ok(()),
        }
    }

    fn write(&mut self, rel: &Path, content: &str) -> io::Result<()> {
        self.mkparent(rel)?;
        fs::write(self.root.join(rel), content)
    }

    /// An attribute that exists but whose read fails, like a sysfs file answering EINVAL.
    fn unreadable(&mut self, rel: &Path) -> io::Result<()> {
        self.mkdir(rel)
    }

    /// A symlink at `link` to `target` (both relative to the root), relative as kernfs makes it.
    fn symlink(&mut self, link: &Path, target: &Path) -> io::Result<()> {
        self.mkparent(link)?;
        let abs = self.root.join(link);
        if abs.symlink_metadata().is_ok() {
            fs::remove_file(&abs)?;
        }
        std::os::unix::fs::symlink(kernfs_link_target(link, target), abs)
    }
}

/// The relative target kernfs writes for a link at `link` pointing to `target` (both relative to
/// the sysfs root): up from the link's directory to the deepest common ancestor with the
/// target's parent, then down to the target (`../../../0000:18:00.0` for `<fn>/net/<if>/device`).
pub fn kernfs_link_target(link: &Path, target: &Path) -> PathBuf {
    let parts = |p: &Path| -> Vec<String> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect()
    };
    let link_dir = parts(link.parent().unwrap_or(Path::new("")));
    let tgt = parts(target);
    let tgt_parent = &tgt[..tgt.len().saturating_sub(1)];
    let common = link_dir
        .iter()
        .zip(tgt_parent)
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in common..link_dir.len() {
        out.push("..");
    }
    for t in &tgt[common..] {
        out.push(t);
    }
    out
}

/// The device nodes a node with this fixture has, as empty files under `dev_root` (enough for
/// the daemon's existence checks; the cluster suite makes real character devices instead):
/// `infiniband/uverbsN` per RDMA device, `infiniband/rdma_cm`, `nvidiaN` per GPU bound to the
/// nvidia driver (PCI order), `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`.
pub fn write_dev_nodes(node: &FixtureNode, dev_root: &Path) -> io::Result<()> {
    let touch = |relative: String| -> io::Result<()> {
        let path = dev_root.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, b"")
    };
    let soft = node.soft_roce.iter().filter_map(|s| s.uverbs);
    for uverbs in node
        .functions
        .iter()
        .filter_map(|f| f.rdma.as_ref()?.uverbs)
        .chain(soft)
    {
        touch(format!("infiniband/uverbs{uverbs}"))?;
    }
    touch("infiniband/rdma_cm".into())?;
    let mut gpus: Vec<&PciFunction> = node
        .functions
        .iter()
        .filter(|f| f.vendor == 0x10de && f.class >> 8 == CLASS_3D >> 8)
        .filter(|f| f.driver.as_deref() == Some("nvidia"))
        .collect();
    gpus.sort_by(|a, b| a.address.cmp(&b.address));
    for i in 0..gpus.len() {
        touch(format!("nvidia{i}"))?;
    }
    for name in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        touch(name.into())?;
    }
    Ok(())
}

/// A temporary directory for a fixture tree: in `/dev/shm` when it exists (a tree is thousands of
/// small files; on tmpfs it is written in milliseconds rather than the second a disk-backed
/// `/tmp` can take), else in the default temp dir. Removed when dropped.
pub fn tempdir() -> io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new()
            .prefix("rocefabric-sysfs-")
            .tempdir_in(shm)
    {
        return Ok(dir);
    }
    tempfile::Builder::new()
        .prefix("rocefabric-sysfs-")
        .tempdir()
}

/// Set port `port` of `ibdev` in a written tree to ACTIVE/LinkUp (`up`) or DOWN/Disabled, with the
/// carrier and operstate of the function's netdevs, as a cable pull or `ip link set down` does.
pub fn set_port_state(root: &Path, ibdev: &str, port: u32, up: bool) -> io::Result<()> {
    let ib = root.join("class/infiniband").join(ibdev);
    let pd = ib.join("ports").join(port.to_string());
    if !pd.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no port {port} on RDMA device {ibdev} under {}",
                root.display()
            ),
        ));
    }
    let (state, phys) = if up {
        ("4: ACTIVE", "5: LinkUp")
    } else {
        ("1: DOWN", "3: Disabled")
    };
    fs::write(pd.join("state"), format!("{state}\n"))?;
    fs::write(pd.join("phys_state"), format!("{phys}\n"))?;
    // The function's netdevs, or a virtual device's parent.
    let mut netdevs: Vec<PathBuf> = fs::read_dir(ib.join("device/net"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    if let Some(parent) = rocefabric_input::read::attr(&ib.join("parent")) {
        netdevs.push(root.join("class/net").join(parent));
    }
    for n in netdevs {
        fs::write(n.join("operstate"), if up { "up\n" } else { "down\n" })?;
        fs::write(n.join("carrier"), if up { "1\n" } else { "0\n" })?;
    }
    Ok(())
}

/// Replace the file at `path` with a FIFO, as a broken or hostile tree could: a read that opens it
/// the ordinary way blocks until a writer comes, which is what tests of bounded reads plant.
/// Uses `mkfifo(1)`, keeping `unsafe` out of this crate.
pub fn replace_with_fifo(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let status = std::process::Command::new("mkfifo").arg(path).status()?;
    if !status.success() {
        return Err(io::Error::other(format!(
            "mkfifo {} failed: {status}",
            path.display()
        )));
    }
    Ok(())
}

/// Remove every `class/<class>/*` link of a written tree whose target lies under `dir` (absolute).
fn remove_class_links_into(root: &Path, dir: &Path) -> io::Result<()> {
    for class in [
        "class/net",
        "class/infiniband",
        "class/infiniband_verbs",
        "class/infiniband_mad",
        "bus/pci/devices",
    ] {
        let Ok(entries) = fs::read_dir(root.join(class)) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if !path
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink())
            {
                continue;
            }
            if fs::canonicalize(&path).is_ok_and(|t| t.starts_with(dir)) {
                fs::remove_file(&path)?;
            }
        }
    }
    Ok(())
}

/// Unregister RDMA device `ibdev` from a written tree (as unloading its RDMA driver does): its
/// `infiniband`, `infiniband_verbs` and `infiniband_mad` entries and their class links go away;
/// the PCI function and netdevs stay.
pub fn remove_rdma_device(root: &Path, ibdev: &str) -> io::Result<()> {
    let link = root.join("class/infiniband").join(ibdev);
    let ib_dir = fs::canonicalize(&link)?;
    let func = fs::canonicalize(link.join("device"))?;
    let mut dirs = vec![ib_dir];
    for sub in ["infiniband_verbs", "infiniband_mad"] {
        let Ok(entries) = fs::read_dir(func.join(sub)) else {
            continue;
        };
        for e in entries.flatten() {
            if rocefabric_input::read::attr(&e.path().join("ibdev")).is_some_and(|o| o == ibdev) {
                dirs.push(e.path());
            }
        }
    }
    let canon_root = fs::canonicalize(root)?;
    for d in dirs {
        remove_class_links_into(&canon_root, &d)?;
        fs::remove_dir_all(&d)?;
    }
    Ok(())
}

/// Remove PCI function `address` from a written tree (hot-unplug): its directory and every link
/// into it.
pub fn remove_pci_function(root: &Path, address: &str) -> io::Result<()> {
    let dir = fs::canonicalize(root.join("bus/pci/devices").join(address))?;
    let canon_root = fs::canonicalize(root)?;
    remove_class_links_into(&canon_root, &dir)?;
    if let Ok(drivers) = fs::read_dir(canon_root.join("bus/pci/drivers")) {
        for d in drivers.flatten() {
            let l = d.path().join(address);
            if l.symlink_metadata().is_ok() {
                fs::remove_file(l)?;
            }
        }
    }
    fs::remove_dir_all(dir)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn kernfs_relative_targets() {
        let f = Path::new("devices/pci0000:15/0000:15:01.0/0000:18:00.0");
        assert_eq!(
            kernfs_link_target(&f.join("net/enp24s0np0/device"), f),
            Path::new("../../../0000:18:00.0")
        );
        assert_eq!(
            kernfs_link_target(Path::new("class/net/enp24s0np0"), &f.join("net/enp24s0np0")),
            Path::new("../../devices/pci0000:15/0000:15:01.0/0000:18:00.0/net/enp24s0np0")
        );
        assert_eq!(
            kernfs_link_target(Path::new("bus/pci/devices/0000:18:00.0"), f),
            Path::new("../../../devices/pci0000:15/0000:15:01.0/0000:18:00.0")
        );
        assert_eq!(
            kernfs_link_target(&f.join("driver"), Path::new("bus/pci/drivers/mlx5_core")),
            Path::new("../../../../bus/pci/drivers/mlx5_core")
        );
    }

    #[test]
    fn text_formats() {
        assert_eq!(
            gid_text(link_local([0xa0, 0x88, 0xc2, 0x3b, 0x50, 0x6a])),
            "fe80:0000:0000:0000:a288:c2ff:fe3b:506a"
        );
        assert_eq!(
            gid_text(Ipv4Addr::new(10, 200, 1, 10).to_ipv6_mapped()),
            "0000:0000:0000:0000:0000:ffff:0ac8:010a"
        );
        assert_eq!(
            guid_text(guid_from_mac([0xa0, 0x88, 0xc2, 0x3b, 0x50, 0x6a])),
            "a088:c203:003b:506a"
        );
    }

    #[test]
    fn every_variant_builds() {
        for v in VARIANTS {
            assert!(FixtureNode::variant(v).is_some(), "{v}");
        }
        assert!(FixtureNode::variant("nope").is_none());
    }
}

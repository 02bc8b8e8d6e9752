//! Discovery of RoCE HCAs and NVIDIA GPUs from a sysfs tree. Pure over a root directory (`/sys`
//! on a host, a fixture tree in tests): no global state, nothing but reads below the root.
//!
//! - HCAs: every `class/infiniband/<ibdev>` whose first Ethernet-link-layer port makes it a RoCE
//!   device, whatever the vendor, kept when the [`NicSelector`] matches. iWARP devices
//!   (`node_type` `4: RNIC`, also Ethernet link layer) are not RoCE and are left out. A device
//!   with several Ethernet ports is served through its lowest-numbered one (its PCI address is its
//!   device ID). The RoCE v2 GID index is the lowest index whose `gid_attrs/types` is `RoCE v2`,
//!   whose GID is IPv4-mapped and whose `gid_attrs/ndevs` is the port's netdev: never assumed.
//! - Virtual RDMA devices (Soft-RoCE `rxe`, under `devices/virtual/infiniband`) have no PCI
//!   function: their device ID is `virtual-<node GUID>` ([`virtual_hca_id`]), their netdev the one
//!   named in `parent`, no vendor, PCI address or NUMA node. Everything else (RoCE port, GID index,
//!   health) is read as for hardware.
//! - GPUs: every PCI function of vendor 0x10de with class 0x0300xx (VGA) or 0x0302xx (3D) not
//!   bound to another driver. `N` of `/dev/nvidiaN` and the UUID come from the driver's
//!   `/proc/driver/nvidia/gpus/<bdf>/information` when a proc root is given and the file reads;
//!   otherwise `N` is the PCI address order (the driver's enumeration on a normal system). A GPU
//!   with no driver bound is listed Unhealthy: it has no device node to hand out.
//! - An unreadable or malformed device attribute (vendor, numa_node, port state, ...) skips that
//!   one device with a warning; discovery of the others goes on. GID table entries are different:
//!   the kernel fails reads of unused entries by design, so an unreadable or malformed entry only
//!   skips that index.
//! - Every attribute is read with [`rocefabric_input::read::read_attr`]: a FIFO or device planted
//!   in the tree is refused instead of blocking the poll, and a value is at most 16 KiB. Names and
//!   values quoted in warnings go through [`shown`].

use std::fs;
use std::io;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

use rocefabric_api::{NicIdentity, NicSelector};
use rocefabric_input::read::{ReadError, attr, read_attr};
use rocefabric_input::shown;
use rocefabric_input::shown::shown_within;
use tracing::{debug, warn};

use crate::model::{Gpu, Hca, Health, Inventory, PortState, virtual_hca_id};
use crate::topology::is_bdf;

/// PCI vendor id of NVIDIA.
pub const NVIDIA_VENDOR: u16 = 0x10de;

/// Discovery as a whole failed (individual devices never fail it).
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("sysfs root {path} is not a readable directory: {source}")]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `class/infiniband` itself cannot be listed: "no RDMA devices" would be a guess.
    #[error("cannot read {}: {source}{}", path.display(), rdma_class_hint(source))]
    RdmaClass {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn rdma_class_hint(source: &io::Error) -> &'static str {
    if source.kind() == io::ErrorKind::NotFound {
        ": no RDMA devices are registered (is the RDMA stack loaded?)"
    } else {
        ""
    }
}

/// Why one device was skipped.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("failed to read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An attribute that cannot be read (missing, a FIFO, too large, ...); names its path.
    #[error(transparent)]
    Attr(#[from] ReadError),
    /// `value` is already [`shown`]: escaped and cut.
    #[error("malformed {path}: \"{value}\" ({expected})")]
    Malformed {
        path: PathBuf,
        value: String,
        expected: &'static str,
    },
}

fn read(path: &Path) -> Result<String, DeviceError> {
    Ok(read_attr(path)?)
}

fn malformed(path: &Path, value: &str, expected: &'static str) -> DeviceError {
    DeviceError::Malformed {
        path: path.to_path_buf(),
        value: shown(value),
        expected,
    }
}

/// A link that resolves somewhere unexpected: its target is escaped but not cut (a resolved path
/// is at most PATH_MAX, and cut it would not say where it points).
fn bad_link(link: &Path, target: &Path, expected: &'static str) -> DeviceError {
    DeviceError::Malformed {
        path: link.to_path_buf(),
        value: shown_within(&target.to_string_lossy(), usize::MAX),
        expected,
    }
}

/// `"0x15b3\n"` -> 0x15b3.
fn read_hex16(path: &Path) -> Result<u16, DeviceError> {
    let text = read(path)?;
    let t = text.trim();
    t.strip_prefix("0x")
        .filter(|d| !d.is_empty() && d.len() <= 4)
        .and_then(|d| u16::from_str_radix(d, 16).ok())
        .ok_or_else(|| malformed(path, t, "a 16-bit hex id such as 0x15b3"))
}

/// `"0x030200\n"` -> 0x030200.
fn read_class(path: &Path) -> Result<u32, DeviceError> {
    let text = read(path)?;
    let t = text.trim();
    t.strip_prefix("0x")
        .filter(|d| !d.is_empty() && d.len() <= 6)
        .and_then(|d| u32::from_str_radix(d, 16).ok())
        .ok_or_else(|| malformed(path, t, "a 24-bit hex class such as 0x030200"))
}

/// `numa_node`: `"-1\n"` (or no file, on kernels without NUMA) -> `None`.
fn read_numa(func: &Path) -> Result<Option<u32>, DeviceError> {
    let path = func.join("numa_node");
    let text = match read_attr(&path) {
        Ok(t) => t,
        Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let t = text.trim();
    let n: i64 = t
        .parse()
        .map_err(|_| malformed(&path, t, "a decimal NUMA node or -1"))?;
    match n {
        n if n < 0 => Ok(None),
        n => u32::try_from(n)
            .map(Some)
            .map_err(|_| malformed(&path, t, "a decimal NUMA node or -1")),
    }
}

/// `"4: ACTIVE\n"` -> `Active`.
fn read_port_state(path: &Path) -> Result<PortState, DeviceError> {
    let text = read(path)?;
    let t = text.trim();
    let num = t
        .split_once(':')
        .and_then(|(n, _)| n.trim().parse::<u32>().ok())
        .ok_or_else(|| malformed(path, t, "\"<number>: <NAME>\" such as \"4: ACTIVE\""))?;
    Ok(match num {
        0 => PortState::Nop,
        1 => PortState::Down,
        2 => PortState::Init,
        3 => PortState::Armed,
        4 => PortState::Active,
        5 => PortState::ActiveDefer,
        _ => PortState::Unknown,
    })
}

/// Entries of a directory, sorted by name; a missing directory is empty.
fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Entries of a directory whose names are numbers, sorted numerically.
fn numbered(dir: &Path) -> Vec<u32> {
    let mut nums: Vec<u32> = dir_names(dir)
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    nums.sort_unstable();
    nums
}

/// A resolved PCI function: address, realpath relative to the sysfs root (`/devices/...`).
struct PciFn {
    dir: PathBuf,
    address: String,
    pci_path: String,
}

fn resolve_function(root: &Path, link: &Path) -> Result<PciFn, DeviceError> {
    let dir = fs::canonicalize(link).map_err(|source| DeviceError::Read {
        path: link.to_path_buf(),
        source,
    })?;
    let address = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !is_bdf(&address) {
        return Err(bad_link(
            link,
            &dir,
            "a link to a PCI function dddd:bb:dd.f",
        ));
    }
    let rel = dir
        .strip_prefix(root)
        .map_err(|_| bad_link(link, &dir, "a PCI function below the sysfs root"))?;
    let pci_path = format!("/{}", rel.to_string_lossy());
    Ok(PciFn {
        dir,
        address,
        pci_path,
    })
}

/// Fail, naming the path and the cause, unless `<sysfs_root>/class/infiniband` can be listed.
/// [`discover`] takes a missing one for "no RDMA devices" (right for `serve` on a GPU-only node);
/// a user asking what is there needs to hear why nothing is. An empty directory is fine.
pub fn check_rdma_class(sysfs_root: &Path) -> Result<(), DiscoverError> {
    let path = sysfs_root.join("class/infiniband");
    fs::read_dir(&path)
        .map(drop)
        .map_err(|source| DiscoverError::RdmaClass { path, source })
}

/// Discover HCAs (narrowed by `selector`) and GPUs under `sysfs_root`.
pub fn discover(sysfs_root: &Path, selector: &NicSelector) -> Result<Inventory, DiscoverError> {
    discover_with(sysfs_root, None, selector)
}

/// [`discover`], reading the NVIDIA driver's GPU information under `proc_root` (`/proc`) too.
pub fn discover_with(
    sysfs_root: &Path,
    proc_root: Option<&Path>,
    selector: &NicSelector,
) -> Result<Inventory, DiscoverError> {
    let root = fs::canonicalize(sysfs_root)
        .and_then(|r| {
            if r.is_dir() {
                Ok(r)
            } else {
                Err(io::Error::other("not a directory"))
            }
        })
        .map_err(|source| DiscoverError::Root {
            path: sysfs_root.to_path_buf(),
            source,
        })?;
    let mut hcas: Vec<Hca> = Vec::new();
    for name in dir_names(&root.join("class/infiniband")) {
        match read_hca(&root, &name, selector) {
            Ok(Some(hca)) => {
                if let Some(other) = hcas.iter().find(|h| h.id == hca.id) {
                    warn!(
                        rdma_device = %shown(&hca.name),
                        id = %shown(&hca.id),
                        kept = %shown(&other.name),
                        "skipping RDMA device: another RoCE device already has its device ID (virtual devices on netdevs sharing a MAC share a node GUID)"
                    );
                } else {
                    hcas.push(hca);
                }
            }
            Ok(None) => {}
            Err(error) => warn!(rdma_device = %shown(&name), %error, "skipping RDMA device"),
        }
    }
    hcas.sort_by(|a, b| a.id.cmp(&b.id));

    // `/dev/nvidiaN` follows the driver's enumeration, PCI order over the functions the nvidia
    // driver owns: number every such GPU first, so one that cannot be read is skipped without
    // shifting the indexes (and device nodes) of the GPUs after it.
    let mut candidates: Vec<String> = Vec::new();
    for address in dir_names(&root.join("bus/pci/devices")) {
        match is_nvidia_gpu(&root, &address) {
            Ok(true) => candidates.push(address),
            Ok(false) => {}
            Err(error) => warn!(pci_address = %shown(&address), %error, "skipping PCI function"),
        }
    }
    candidates.sort();
    let mut gpus: Vec<Gpu> = Vec::new();
    let mut from_driver = 0;
    for (i, address) in candidates.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        match read_gpu(&root, proc_root, address, index) {
            Ok((gpu, minor_from_driver)) => {
                from_driver += usize::from(minor_from_driver);
                gpus.push(gpu);
            }
            Err(error) => warn!(pci_address = %shown(address), %error, "skipping GPU"),
        }
    }
    // The driver's minors and the PCI order are two numberings: mixed, they could give two GPUs
    // one N. Use the driver's only when it numbered every GPU.
    if from_driver > 0 && from_driver < gpus.len() {
        warn!(
            numbered = from_driver,
            gpus = gpus.len(),
            "the driver's information covers only some GPUs; numbering all in PCI order"
        );
        for gpu in &mut gpus {
            if let Some(p) = candidates.iter().position(|a| *a == gpu.pci_address) {
                gpu.index = u32::try_from(p).unwrap_or(u32::MAX);
            }
        }
    }
    debug!(hcas = hcas.len(), gpus = gpus.len(), root = %root.display(), "discovery done");
    Ok(Inventory { hcas, gpus })
}

fn read_hca(root: &Path, name: &str, selector: &NicSelector) -> Result<Option<Hca>, DeviceError> {
    let ib = root.join("class/infiniband").join(name);
    let node_type_path = ib.join("node_type");
    match read_attr(&node_type_path) {
        Ok(t) if t.trim_start().starts_with("4:") => {
            debug!(rdma_device = %shown(name), "not RoCE: iWARP (RNIC) device");
            return Ok(None);
        }
        Ok(_) => {}
        Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    let mut roce_port = None;
    for port in numbered(&ib.join("ports")) {
        let path = ib.join("ports").join(port.to_string()).join("link_layer");
        if read(&path)?.trim() == "Ethernet" {
            roce_port = Some(port);
            break;
        }
    }
    let Some(port) = roce_port else {
        debug!(rdma_device = %shown(name), "not RoCE: no Ethernet link layer port");
        return Ok(None);
    };
    let port_dir = ib.join("ports").join(port.to_string());
    let hw = if ib.join("device").exists() {
        HcaHardware::pci(root, &ib)?
    } else {
        HcaHardware::virtual_device(root, &ib)?
    };
    let state = read_port_state(&port_dir.join("state"))?;
    let netdev = match &hw.pci_address {
        Some(_) => port_netdev(&ib, &port_dir, port),
        // A virtual device names its netdev in `parent` (nothing under the netdev points back).
        None => read_parent(&ib)?,
    };
    let identity = NicIdentity {
        vendor: hw.vendor,
        device_id: hw.device_id,
        pci_address: hw.pci_address.as_deref(),
        rdma_device: name,
        netdev: netdev.as_deref(),
    };
    if !selector.matches(&identity) {
        debug!(rdma_device = %shown(name), id = %shown(&hw.id), "not selected");
        return Ok(None);
    }
    let uverbs = find_uverbs(root, &ib.join("device"), name);
    let roce_v2_gid_index = netdev
        .as_deref()
        .and_then(|n| roce_v2_ipv4_gid_index(&port_dir, n));
    let health = if state == PortState::Active && uverbs.is_some() {
        Health::Healthy
    } else {
        Health::Unhealthy
    };
    Ok(Some(Hca {
        id: hw.id,
        name: name.to_string(),
        pci_address: hw.pci_address,
        vendor: hw.vendor,
        device_id: hw.device_id,
        port,
        netdev,
        numa_node: hw.numa_node,
        state,
        uverbs,
        roce_v2_gid_index,
        rate_mbps: attr(&port_dir.join("rate")).and_then(|r| parse_rate_mbps(&r)),
        health,
        device_path: hw.device_path,
    }))
}

/// `400 Gb/sec (4X NDR)` -> 400000, `2.5 Gb/sec (1X SDR)` -> 2500; `None` for anything else.
pub fn parse_rate_mbps(text: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    let value: f64 = words.next()?.parse().ok()?;
    let per_mbit = match words.next()? {
        "Gb/sec" => 1000.0,
        "Mb/sec" => 1.0,
        _ => return None,
    };
    let mbps = value * per_mbit;
    // Rates are small positive numbers; anything else is not a rate.
    (mbps.is_finite() && mbps > 0.0 && mbps < 1e9).then(|| mbps.round() as u64)
}

/// What an RDMA device sits on: a PCI function, or nothing (a virtual device).
struct HcaHardware {
    id: String,
    pci_address: Option<String>,
    vendor: Option<u16>,
    device_id: Option<u16>,
    numa_node: Option<u32>,
    device_path: String,
}

impl HcaHardware {
    fn pci(root: &Path, ib: &Path) -> Result<HcaHardware, DeviceError> {
        let func = resolve_function(root, &ib.join("device"))?;
        Ok(HcaHardware {
            id: func.address.clone(),
            vendor: Some(read_hex16(&func.dir.join("vendor"))?),
            device_id: Some(read_hex16(&func.dir.join("device"))?),
            numa_node: read_numa(&func.dir)?,
            pci_address: Some(func.address),
            device_path: func.pci_path,
        })
    }

    /// A device under `devices/virtual` (rxe): identified by its node GUID, no NUMA node.
    fn virtual_device(root: &Path, ib: &Path) -> Result<HcaHardware, DeviceError> {
        let dir = fs::canonicalize(ib).map_err(|source| DeviceError::Read {
            path: ib.to_path_buf(),
            source,
        })?;
        let rel = dir
            .strip_prefix(root)
            .ok()
            .filter(|rel| rel.starts_with("devices/virtual"))
            .ok_or_else(|| {
                bad_link(
                    ib,
                    &dir,
                    "a PCI device link, or a virtual device under devices/virtual",
                )
            })?;
        let guid_path = ib.join("node_guid");
        let text = read(&guid_path)?;
        let guid = parse_node_guid(&text).ok_or_else(|| {
            malformed(
                &guid_path,
                text.trim(),
                "a GUID such as 5054:00ff:fe12:3456",
            )
        })?;
        Ok(HcaHardware {
            id: virtual_hca_id(guid),
            pci_address: None,
            vendor: None,
            device_id: None,
            numa_node: None,
            device_path: format!("/{}", rel.to_string_lossy()),
        })
    }
}

/// `parent` of a virtual RDMA device: its netdev (`eth0`), `None` when empty.
fn read_parent(ib: &Path) -> Result<Option<String>, DeviceError> {
    let text = read(&ib.join("parent"))?;
    Ok(Some(text.trim().to_string()).filter(|n| !n.is_empty()))
}

/// `"5054:00ff:fe12:3456\n"` -> 0x505400fffe123456 (a GUID of all zeros is no identity).
pub fn parse_node_guid(text: &str) -> Option<u64> {
    let groups: Vec<&str> = text.trim().split(':').collect();
    if groups.len() != 4 || groups.iter().any(|g| g.len() != 4) {
        return None;
    }
    u64::from_str_radix(&groups.concat(), 16)
        .ok()
        .filter(|g| *g != 0)
}

/// The netdev of RoCE port `port`: the function's only netdev, else the one the port's GID
/// table names, else the one whose `dev_port` is `port - 1`.
fn port_netdev(ib: &Path, port_dir: &Path, port: u32) -> Option<String> {
    let net = ib.join("device/net");
    let candidates = dir_names(&net);
    if let [only] = candidates.as_slice() {
        return Some(only.clone());
    }
    let ndevs = port_dir.join("gid_attrs/ndevs");
    for i in numbered(&ndevs) {
        let Some(n) = attr(&ndevs.join(i.to_string())) else {
            continue;
        };
        if !n.is_empty() && (candidates.is_empty() || candidates.contains(&n)) {
            return Some(n);
        }
    }
    let by_dev_port = candidates.iter().find(|c| {
        attr(&net.join(c).join("dev_port"))
            .is_some_and(|t| t.parse::<u32>().ok() == Some(port.saturating_sub(1)))
    });
    by_dev_port.or(candidates.first()).cloned()
}

/// `uverbsN` of `ibdev`: from the function's `infiniband_verbs/`, else `class/infiniband_verbs/`.
fn find_uverbs(root: &Path, func: &Path, ibdev: &str) -> Option<String> {
    for dir in [
        func.join("infiniband_verbs"),
        root.join("class/infiniband_verbs"),
    ] {
        for entry in dir_names(&dir)
            .into_iter()
            .filter(|n| n.starts_with("uverbs"))
        {
            if attr(&dir.join(&entry).join("ibdev")).is_some_and(|o| o == ibdev) {
                return Some(entry);
            }
        }
    }
    None
}

/// Parse a sysfs GID (`0000:...:ffff:0ac8:010a`).
pub fn parse_gid(text: &str) -> Option<Ipv6Addr> {
    let groups: Vec<u16> = text
        .trim()
        .split(':')
        .map(|g| u16::from_str_radix(g, 16).ok())
        .collect::<Option<_>>()?;
    let g: [u16; 8] = groups.try_into().ok()?;
    Some(Ipv6Addr::from(g))
}

/// The lowest GID index of `port_dir` that is `RoCE v2`, IPv4-mapped and bound to `netdev`.
pub fn roce_v2_ipv4_gid_index(port_dir: &Path, netdev: &str) -> Option<u32> {
    let types = port_dir.join("gid_attrs/types");
    let mut indexes = numbered(&types);
    if indexes.is_empty() {
        indexes = numbered(&port_dir.join("gids"));
    }
    for i in indexes {
        let idx = i.to_string();
        // Unused entries fail to read (EINVAL): not an error, just not this index.
        if attr(&types.join(&idx)).is_none_or(|kind| kind != "RoCE v2") {
            continue;
        }
        let gid_path = port_dir.join("gids").join(&idx);
        let Some(gid_text) = attr(&gid_path) else {
            continue;
        };
        let Some(gid) = parse_gid(&gid_text) else {
            warn!(path = %gid_path.display(), value = %shown(&gid_text), "skipping malformed GID entry");
            continue;
        };
        if gid.to_ipv4_mapped().is_none_or(|v4| v4.is_unspecified()) {
            continue;
        }
        if attr(&port_dir.join("gid_attrs/ndevs").join(&idx)).is_some_and(|n| n == netdev) {
            return Some(i);
        }
    }
    None
}

/// An NVIDIA display or 3D function not bound to another driver (a GPU passed through with
/// `vfio-pci` is neither numbered by the nvidia driver nor usable by a container here).
fn is_nvidia_gpu(root: &Path, address: &str) -> Result<bool, DeviceError> {
    let link = root.join("bus/pci/devices").join(address);
    if read_hex16(&link.join("vendor"))? != NVIDIA_VENDOR {
        return Ok(false);
    }
    let class = read_class(&link.join("class"))?;
    if !matches!(class >> 8, 0x0300 | 0x0302) {
        return Ok(false);
    }
    let other_driver = std::fs::read_link(link.join("driver"))
        .ok()
        .and_then(|target| target.file_name().map(|n| n != "nvidia"))
        .unwrap_or(false);
    Ok(!other_driver)
}

fn read_gpu(
    root: &Path,
    proc_root: Option<&Path>,
    address: &str,
    index: u32,
) -> Result<(Gpu, bool), DeviceError> {
    let link = root.join("bus/pci/devices").join(address);
    let func = resolve_function(root, &link)?;
    let device_id = read_hex16(&func.dir.join("device"))?;
    let numa_node = read_numa(&func.dir)?;
    let bound = fs::read_link(link.join("driver"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n == "nvidia"))
        .unwrap_or(false);
    if !bound {
        warn!(pci_address = %shown(address), "GPU has no driver bound: listed Unhealthy");
    }
    let info = proc_root
        .and_then(|p| {
            read_attr(
                &p.join("driver/nvidia/gpus")
                    .join(address)
                    .join("information"),
            )
            .ok()
        })
        .map(|text| parse_nvidia_information(&text))
        .unwrap_or_default();
    let gpu = Gpu {
        pci_address: func.address,
        index: info.minor.unwrap_or(index),
        uuid: info.uuid,
        device_id,
        numa_node,
        health: if bound {
            Health::Healthy
        } else {
            Health::Unhealthy
        },
        pci_path: func.pci_path,
    };
    Ok((gpu, info.minor.is_some()))
}

/// What the NVIDIA driver says of one GPU in `/proc/driver/nvidia/gpus/<bdf>/information`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvidiaInformation {
    /// `Device Minor:`, the N of `/dev/nvidiaN`.
    pub minor: Option<u32>,
    /// `GPU UUID:`.
    pub uuid: Option<String>,
}

/// Parse the `Key: value` lines of the driver's information file (unknown keys are ignored).
pub fn parse_nvidia_information(text: &str) -> NvidiaInformation {
    let mut info = NvidiaInformation::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "Device Minor" => info.minor = value.parse().ok(),
            "GPU UUID" if value.starts_with("GPU-") => info.uuid = Some(value.to_string()),
            _ => {}
        }
    }
    info
}

#[cfg(test)]
mod tests;

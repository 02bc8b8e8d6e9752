//! PCIe distance between devices, computed from their sysfs realpaths the way `nvidia-smi topo -m`
//! classifies it, and the GPU <-> HCA rails derived from it.
//!
//! A realpath such as `/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0`
//! names the host bridge (`pci0000:15`, the root) and then one directory per PCI bridge down to the
//! function itself. For two functions:
//! - different roots: `NODE` when both report the same NUMA node, else `SYS` (an unknown NUMA
//!   node, -1 in sysfs, never counts as "same");
//! - two functions of one card (same bridges, same bus and device number): `PIX`;
//! - same root but no shared bridge: `PHB` (the path goes through the host bridge);
//! - a shared bridge: `PIX` when each function sits at most one bridge below the deepest shared
//!   one (one switch is crossed: upstream port, then a downstream port on either side), `PXB`
//!   when more bridges are crossed (several switches).

use std::collections::BTreeMap;

use crate::model::{Distance, Gpu, Hca, Inventory};

/// A PCI function's position in the PCIe tree, parsed from its realpath.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciChain<'a> {
    /// Host bridge directory, `pci0000:15`.
    pub root: &'a str,
    /// Bridges from the root port down, then the function itself (last).
    pub chain: Vec<&'a str>,
}

impl<'a> PciChain<'a> {
    /// Parse `/devices/pci<domain>:<bus>/<bdf>/.../<bdf>` (leading sysfs prefix allowed). `None`
    /// when the path holds no host bridge or no function.
    pub fn parse(path: &'a str) -> Option<PciChain<'a>> {
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let root = parts.by_ref().find(|p| is_host_bridge(p))?;
        let chain: Vec<&str> = parts.take_while(|p| is_bdf(p)).collect();
        if chain.is_empty() {
            None
        } else {
            Some(PciChain { root, chain })
        }
    }

    fn function(&self) -> &'a str {
        // `parse` only builds chains with at least one element.
        self.chain.last().copied().unwrap_or_default()
    }

    fn bridges(&self) -> &[&'a str] {
        &self.chain[..self.chain.len().saturating_sub(1)]
    }
}

fn is_host_bridge(s: &str) -> bool {
    s.strip_prefix("pci").is_some_and(|rest| {
        rest.split_once(':').is_some_and(|(d, b)| {
            !d.is_empty()
                && !b.is_empty()
                && d.chars().all(|c| c.is_ascii_hexdigit())
                && b.chars().all(|c| c.is_ascii_hexdigit())
        })
    })
}

/// `dddd:bb:dd.f`
pub fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// `dddd:bb:dd` of a `dddd:bb:dd.f` address: functions sharing it are one card.
fn slot(bdf: &str) -> &str {
    bdf.rsplit_once('.').map_or(bdf, |(s, _)| s)
}

/// The PCIe distance class between two functions given their realpaths (relative to the sysfs
/// root or absolute) and NUMA nodes. A path that cannot be parsed counts as `SYS`.
pub fn distance(a_path: &str, a_numa: Option<u32>, b_path: &str, b_numa: Option<u32>) -> Distance {
    let (Some(a), Some(b)) = (PciChain::parse(a_path), PciChain::parse(b_path)) else {
        return Distance::SYS;
    };
    if a.root != b.root {
        return if a_numa.is_some() && a_numa == b_numa {
            Distance::NODE
        } else {
            Distance::SYS
        };
    }
    let (ab, bb) = (a.bridges(), b.bridges());
    if ab == bb && slot(a.function()) == slot(b.function()) {
        return Distance::PIX;
    }
    let shared = ab.iter().zip(bb).take_while(|(x, y)| x == y).count();
    if shared == 0 {
        return Distance::PHB;
    }
    if ab.len() - shared <= 1 && bb.len() - shared <= 1 {
        Distance::PIX
    } else {
        Distance::PXB
    }
}

/// Distance between a GPU and an HCA.
pub fn gpu_hca_distance(gpu: &Gpu, hca: &Hca) -> Distance {
    distance(
        &gpu.pci_path,
        gpu.numa_node,
        &hca.device_path,
        hca.numa_node,
    )
}

/// Distance between two HCAs.
pub fn hca_distance(a: &Hca, b: &Hca) -> Distance {
    distance(&a.device_path, a.numa_node, &b.device_path, b.numa_node)
}

/// Distance between two GPUs.
pub fn gpu_distance(a: &Gpu, b: &Gpu) -> Distance {
    distance(&a.pci_path, a.numa_node, &b.pci_path, b.numa_node)
}

/// The whole GPU x HCA matrix keyed by GPU PCI address and HCA ID: `{gpu: {hca: distance}}`.
pub fn matrix(inv: &Inventory) -> BTreeMap<String, BTreeMap<String, Distance>> {
    inv.gpus
        .iter()
        .map(|g| {
            let row = inv
                .hcas
                .iter()
                .map(|h| (h.id.clone(), gpu_hca_distance(g, h)))
                .collect();
            (g.pci_address.clone(), row)
        })
        .collect()
}

/// The GPU's rail: the closest HCA when it is `PIX` or `PXB` (GPUDirect RDMA without crossing the
/// CPU). Ties go to the lowest PCI address. The pairing depends on topology only, never on link
/// health, so pair IDs stay stable while links flap.
pub fn closest_hca<'a>(inv: &'a Inventory, gpu: &Gpu) -> Option<(&'a Hca, Distance)> {
    inv.hcas
        .iter()
        .map(|h| (h, gpu_hca_distance(gpu, h)))
        .filter(|(_, d)| *d <= Distance::PXB)
        .min_by(|(ha, da), (hb, db)| da.cmp(db).then_with(|| ha.id.cmp(&hb.id)))
}

/// Every GPU that has a rail, with its HCA, in GPU order.
pub fn gpu_hca_pairs(inv: &Inventory) -> Vec<(&Gpu, &Hca, Distance)> {
    inv.gpus
        .iter()
        .filter_map(|g| closest_hca(inv, g).map(|(h, d)| (g, h, d)))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NIC: &str = "/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";
    const GPU_PIX: &str = "/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0";
    const GPU_PXB: &str = "/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0/0000:1a:00.0/0000:1b:00.0";

    #[test]
    fn parse_chain() {
        let c = PciChain::parse(NIC).unwrap();
        assert_eq!(c.root, "pci0000:15");
        assert_eq!(
            c.chain,
            [
                "0000:15:01.0",
                "0000:16:00.0",
                "0000:17:00.0",
                "0000:18:00.0"
            ]
        );
        let abs = format!("/sys{NIC}");
        assert_eq!(PciChain::parse(&abs).unwrap(), c);
        assert!(PciChain::parse("/devices/virtual/net/lo").is_none());
        assert!(PciChain::parse("/devices/pci0000:15").is_none());
    }

    #[test]
    fn reference_examples() {
        assert_eq!(distance(NIC, Some(0), GPU_PIX, Some(0)), Distance::PIX);
        assert_eq!(distance(NIC, Some(0), GPU_PXB, Some(0)), Distance::PXB);
        assert_eq!(
            distance(GPU_PXB, Some(0), NIC, Some(0)),
            Distance::PXB,
            "symmetric"
        );
    }

    #[test]
    fn roots_and_numa() {
        let other = "/devices/pci0000:3d/0000:3d:01.0/0000:40:00.0";
        assert_eq!(distance(NIC, Some(0), other, Some(0)), Distance::NODE);
        assert_eq!(distance(NIC, Some(0), other, Some(1)), Distance::SYS);
        assert_eq!(
            distance(NIC, None, other, None),
            Distance::SYS,
            "unknown NUMA is never same"
        );
        assert_eq!(distance(NIC, Some(0), "garbage", Some(0)), Distance::SYS);
    }

    #[test]
    fn host_bridge_and_functions() {
        let a = "/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
        let b = "/devices/pci0000:00/0000:00:02.0/0000:02:00.0";
        assert_eq!(distance(a, Some(0), b, Some(0)), Distance::PHB);
        let a1 = "/devices/pci0000:00/0000:00:01.0/0000:01:00.1";
        assert_eq!(distance(a, Some(0), a1, Some(0)), Distance::PIX);
        // Root-complex integrated functions of one device.
        assert_eq!(
            distance(
                "/devices/pci0000:00/0000:00:1f.0",
                None,
                "/devices/pci0000:00/0000:00:1f.3",
                None
            ),
            Distance::PIX
        );
        assert_eq!(
            distance(
                "/devices/pci0000:00/0000:00:1f.0",
                None,
                "/devices/pci0000:00/0000:00:14.0",
                None
            ),
            Distance::PHB
        );
    }
}

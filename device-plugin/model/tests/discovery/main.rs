//! Discovery, topology and fixture layout on the DGX H100 fixture and its variants.

#![allow(clippy::unwrap_used)]

mod distances;
mod gpus;
mod hcas;
mod layout;

use std::path::Path;

use rocefabric_api::NicSelector;
use rocefabric_node_model::inventory::discover;
use rocefabric_node_model::model::Inventory;
use rocefabric_node_testing::fixtures::{self, FixtureNode};

pub(crate) fn written(node: &FixtureNode) -> tempfile::TempDir {
    let dir = fixtures::tempdir().unwrap();
    node.write_to(dir.path()).unwrap();
    dir
}

pub(crate) fn discover_all(root: &Path) -> Inventory {
    discover(root, &NicSelector::default()).unwrap()
}

/// (PCI address, RDMA device, netdev, NUMA node, uverbs) of every RoCE HCA of the DGX fixture,
/// in PCI order: 8 compute ConnectX-7, 2x2 storage ports, 2 irdma ports.
pub(crate) const DGX_HCAS: [(&str, &str, &str, u32, &str); 14] = [
    ("0000:18:00.0", "mlx5_0", "enp24s0np0", 0, "uverbs2"),
    ("0000:29:00.0", "mlx5_1", "enp41s0f0np0", 0, "uverbs3"),
    ("0000:29:00.1", "mlx5_2", "enp41s0f1np1", 0, "uverbs4"),
    ("0000:40:00.0", "mlx5_3", "enp64s0np0", 0, "uverbs5"),
    ("0000:4f:00.0", "mlx5_4", "enp79s0np0", 0, "uverbs6"),
    ("0000:5e:00.0", "mlx5_5", "enp94s0np0", 0, "uverbs7"),
    ("0000:82:00.0", "irdma0", "enp130s0f0", 1, "uverbs0"),
    ("0000:82:00.1", "irdma1", "enp130s0f1", 1, "uverbs1"),
    ("0000:9a:00.0", "mlx5_6", "enp154s0np0", 1, "uverbs8"),
    ("0000:aa:00.0", "mlx5_7", "enp170s0f0np0", 1, "uverbs9"),
    ("0000:aa:00.1", "mlx5_8", "enp170s0f1np1", 1, "uverbs10"),
    ("0000:c0:00.0", "mlx5_9", "enp192s0np0", 1, "uverbs11"),
    ("0000:ce:00.0", "mlx5_10", "enp206s0np0", 1, "uverbs12"),
    ("0000:dc:00.0", "mlx5_11", "enp220s0np0", 1, "uverbs13"),
];

/// (GPU PCI address, its rail NIC's PCI address, NUMA node), GPU 0..7 (dgx-h100.md).
pub(crate) const DGX_RAILS: [(&str, &str, u32); 8] = [
    ("0000:1b:00.0", "0000:18:00.0", 0),
    ("0000:43:00.0", "0000:40:00.0", 0),
    ("0000:52:00.0", "0000:4f:00.0", 0),
    ("0000:61:00.0", "0000:5e:00.0", 0),
    ("0000:9d:00.0", "0000:9a:00.0", 1),
    ("0000:c3:00.0", "0000:c0:00.0", 1),
    ("0000:d1:00.0", "0000:ce:00.0", 1),
    ("0000:df:00.0", "0000:dc:00.0", 1),
];

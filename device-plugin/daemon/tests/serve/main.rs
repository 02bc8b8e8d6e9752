//! The `serve` daemon against the kubelet emulator over real unix sockets, on the DGX H100
//! fixture and on trees with Soft-RoCE devices.

mod common;

mod allocate;
mod health;
mod lifecycle;
mod list;
mod virtual_devices;

use common::*;
use rocefabric_kubelet_api::pb;

pub(crate) const ALL: [&str; 3] = [HCA, GPU, GPU_HCA];

/// Compute HCAs of the fixture: (PCI address, RDMA device, netdev, NUMA node).
pub(crate) const COMPUTE_HCAS: [(&str, &str, &str, i64); 8] = [
    ("0000:18:00.0", "mlx5_0", "enp24s0np0", 0),
    ("0000:40:00.0", "mlx5_3", "enp64s0np0", 0),
    ("0000:4f:00.0", "mlx5_4", "enp79s0np0", 0),
    ("0000:5e:00.0", "mlx5_5", "enp94s0np0", 0),
    ("0000:9a:00.0", "mlx5_6", "enp154s0np0", 1),
    ("0000:c0:00.0", "mlx5_9", "enp192s0np0", 1),
    ("0000:ce:00.0", "mlx5_10", "enp206s0np0", 1),
    ("0000:dc:00.0", "mlx5_11", "enp220s0np0", 1),
];

pub(crate) fn numa_of(device: &pb::Device) -> Vec<i64> {
    device
        .topology
        .as_ref()
        .map(|t| t.nodes.iter().map(|n| n.id).collect())
        .unwrap_or_default()
}

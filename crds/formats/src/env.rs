//! Names of the environment variables a workload's containers receive and read: the node daemon
//! sets the first group for a grant (device plugin `Allocate` and the DRA driver's CDI specs) for
//! NCCL, UCX, the NVIDIA container runtime and rocefabric's data plane; the pod spec sets the
//! second group (downward API or by hand) for the data plane (`rocefabric-dsm`).

// Set by the node daemon.

/// The granted HCA ports for NCCL, an exact-match list: `=mlx5_0:1,mlx5_3:1`. The data plane
/// uses the first one.
pub const NCCL_IB_HCA: &str = "NCCL_IB_HCA";
/// The granted HCA ports for UCX: `mlx5_0:1,mlx5_3:1`.
pub const UCX_NET_DEVICES: &str = "UCX_NET_DEVICES";
/// The RoCE v2 GID index of the granted ports, when they all agree on one.
pub const NCCL_IB_GID_INDEX: &str = "NCCL_IB_GID_INDEX";
/// The fabric's RoCE traffic class (the ToS byte, decimal) for NCCL and the data plane.
pub const NCCL_IB_TC: &str = "NCCL_IB_TC";
/// The same traffic class for UCX.
pub const UCX_IB_TRAFFIC_CLASS: &str = "UCX_IB_TRAFFIC_CLASS";
/// The granted GPUs (UUIDs, else indexes, comma-separated) for the NVIDIA container runtime.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Prefix of `PCIDEVICE_<RESOURCE>` (the SR-IOV device plugin's convention): the granted
/// devices' PCI addresses, comma-separated. See [`pcidevice`].
pub const PCIDEVICE_PREFIX: &str = "PCIDEVICE_";
/// `PCIDEVICE_<RESOURCE>` of the DRA driver `rocefabric.io`: the PCI addresses of all of a
/// claim's devices.
pub const PCIDEVICE_ROCEFABRIC_IO: &str = "PCIDEVICE_ROCEFABRIC_IO";

// Set in the pod spec, read by the data plane.

/// The pod's name (downward API `metadata.name`); else the host name.
pub const POD_NAME: &str = "POD_NAME";
/// The pod's uid (downward API `metadata.uid`); else the region annotation's `uid`.
pub const POD_UID: &str = "POD_UID";
/// The downward-API file of the pod's `rocefabric.io/region` annotation, when not at the
/// default path.
pub const ROCEFABRIC_REGION_FILE: &str = "ROCEFABRIC_REGION_FILE";
/// The mounted `regions.json` of the namespace's region directory, when not at the default path.
pub const ROCEFABRIC_DIRECTORY: &str = "ROCEFABRIC_DIRECTORY";
/// The mounted `<fabric>-key` Secret (a directory with `key` and `namespace`), when not at the
/// default path.
pub const ROCEFABRIC_KEY_DIR: &str = "ROCEFABRIC_KEY_DIR";
/// `DEVICE[:PORT]`: the HCA port to use instead of the first of [`NCCL_IB_HCA`].
pub const ROCEFABRIC_HCA: &str = "ROCEFABRIC_HCA";
/// The data plane's rendezvous port, when not the default.
pub const ROCEFABRIC_DSM_PORT: &str = "ROCEFABRIC_DSM_PORT";
/// The most connections a pod's rendezvous endpoint serves at once, when not the default.
pub const ROCEFABRIC_DSM_MAX_PEERS: &str = "ROCEFABRIC_DSM_MAX_PEERS";
/// The most it serves at once from one address, when not the default.
pub const ROCEFABRIC_DSM_MAX_PEERS_PER_SOURCE: &str = "ROCEFABRIC_DSM_MAX_PEERS_PER_SOURCE";
/// The container's termination message file (the pod's `terminationMessagePath`), when not the
/// kubelet's default `/dev/termination-log`.
pub const ROCEFABRIC_TERMINATION_LOG: &str = "ROCEFABRIC_TERMINATION_LOG";

/// `PCIDEVICE_<RESOURCE>` of a resource or driver name: uppercased, with `.`, `/` and `-` as `_`
/// (`rdma/hca` gives `PCIDEVICE_RDMA_HCA`).
pub fn pcidevice(resource_name: &str) -> String {
    let mut name = String::from(PCIDEVICE_PREFIX);
    name.extend(resource_name.chars().map(|c| match c {
        '.' | '/' | '-' => '_',
        c => c.to_ascii_uppercase(),
    }));
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcidevice_names_follow_the_sr_iov_convention() {
        assert_eq!(pcidevice("rdma/hca"), "PCIDEVICE_RDMA_HCA");
        assert_eq!(pcidevice("rdma/gpu-hca"), "PCIDEVICE_RDMA_GPU_HCA");
        assert_eq!(pcidevice("nvidia.com/gpu"), "PCIDEVICE_NVIDIA_COM_GPU");
        assert_eq!(pcidevice("rocefabric.io"), PCIDEVICE_ROCEFABRIC_IO);
    }
}

//! DRA mode: the node daemon as a Dynamic Resource Allocation driver (`resource.k8s.io/v1`).
//!
//! The same inventory the device plugin serves becomes a `ResourceSlice` of this node's pool, a
//! device per RoCE HCA and per GPU with attributes a claim can select and constrain on (PCIe
//! root and switch, NUMA node, RDMA device, GID index, fabric, QoS). The scheduler allocates; the
//! kubelet then asks this driver to prepare the claim, and the driver answers with CDI device ids
//! whose spec carries exactly what the device plugin's Allocate gives: device nodes and the
//! NCCL/UCX environment.
//!
//! Pure cores:
//! - [`devices`]: which devices are published, with which attributes, and which are withdrawn and
//!   why;
//! - [`slice`]: the `ResourceSlice` object of a device list;
//! - [`cdi`]: the CDI spec of a prepared claim, a CDI device per request so each container gets
//!   its own devices' environment (and the few lines that write and remove its file);
//! - [`prepare`]: a claim's allocation results resolved against the inventory, and the answer;
//! - [`ledger`]: who holds each physical device (DRA claims, device plugin grants: ours in `both`
//!   mode, NVIDIA's GPUs wherever GPUs are published), so no device is handed to two pods.
//!
//! I/O shells:
//! - [`checkpoint`]: the prepared claims on disk, written before a prepare answers;
//! - [`publish`]: the slice written to the API server;
//! - [`pod_resources`]: device plugin grants of live pods, from the kubelet's pod resources API;
//! - [`driver`]: the loop that ties them together: it serves the kubelet's DRA gRPC service
//!   (`rocefabric-kubelet-api`) and follows the daemon's one discovery loop.

pub mod cdi;
pub mod checkpoint;
pub mod devices;
pub mod driver;
pub mod ledger;
pub mod pod_resources;
pub mod prepare;
pub mod publish;
pub mod slice;

/// The driver name: `spec.driver` of our slices, the domain of our attributes, the CDI vendor.
pub const DRIVER_NAME: &str = "rocefabric.io";
/// The DRA service socket in the driver's plugin directory.
pub const DRA_SOCKET_NAME: &str = "dra.sock";
/// The registration socket's file name in the kubelet's `plugins_registry`.
pub const REGISTRATION_SOCKET_NAME: &str = "rocefabric.io-reg.sock";
/// The prepared-claims checkpoint in the driver's plugin directory.
pub const CHECKPOINT_FILE_NAME: &str = "checkpoint.json";
/// Default plugin directory (the kubelet's `plugins/<driver>`).
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/rocefabric.io";
/// Default kubelet plugin registration directory.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Default CDI spec directory (the runtime also reads `/etc/cdi`; `/var/run/cdi` is for
/// generated, transient specs).
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// Default socket of the kubelet's pod resources API.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

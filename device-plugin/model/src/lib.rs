//! The node daemon's model: what a node has and who may use it, decided without I/O beyond
//! reading a sysfs tree under a root path.
//! - [`inventory`]: HCAs, GPUs, ports, GIDs, uverbs, NUMA and PCI paths, from a sysfs root;
//! - [`topology`]: PCIe distance classes and GPU-HCA rails;
//! - [`ownership`]: which resource serves each device;
//! - [`allocation`]: preferred sets, Allocate responses, the workload environment;
//! - [`config`]: the daemon's config file;
//! - [`fabric_view`]: what the node's RoceNode says (fabric, QoS proven, traffic class).
//!
//! Not here: tokio, kube, gRPC, netlink. Those live in the I/O crates beside this one.

pub mod allocation;
pub mod config;
pub mod fabric_view;
pub mod inventory;
pub mod model;
pub mod ownership;
pub mod topology;

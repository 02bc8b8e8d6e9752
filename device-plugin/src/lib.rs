//! The rocefabric node daemon: discovers RDMA HCAs and GPUs with their PCIe/NUMA topology from
//! sysfs, serves them to the kubelet over the device plugin API, and applies and verifies the
//! fabric's lossless RoCE QoS on the node's NICs.
//!
//! Pure decisions (inventory, topology, allocation, QoS plans) are kept apart from the I/O shells
//! (kubelet gRPC, netlink, driver files, the Kubernetes API).

pub mod allocation;
pub mod cli;
pub mod config;
pub mod dra;
pub mod fabric_view;
pub mod fixtures;
pub mod inventory;
pub mod kubelet;
pub mod model;
pub mod ownership;
pub mod qos;
pub mod serve;
pub mod topology;

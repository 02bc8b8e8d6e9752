//! Lossless RoCE QoS on the node's NICs: read every knob, plan what differs, write only that,
//! read back, and report each knob's outcome.
//!
//! One pipeline, one module per step:
//! - [`model`] (pure): the vocabulary every step shares: a knob's [`Reading`], IEEE PFC, DCB APP
//!   entries, ECN points. The kernel codecs import it; nothing in it knows a wire format;
//! - [`plan`] (pure): desired [`QosSpec`](rocefabric_api::QosSpec) against the observed state ->
//!   ordered writes;
//! - [`dcbnl`] (DCB netlink: IEEE PFC and APP table), [`rtnl`] (MTU), [`driver_files`]
//!   (out-of-tree sysfs, upstream debugfs, rdma_cm configfs): the kernel interfaces, each behind a
//!   small trait or a root path so tests need no NIC;
//! - [`apply`]: observe -> plan -> write -> read back -> per-knob [`KnobStatus`](rocefabric_api::KnobStatus);
//! - [`counters`]: PFC, CNP and ECN counters as Prometheus metrics, with [`ethtool`] reading the
//!   driver statistics (`ethtool -S`: pause durations, pause-storm events) over `SIOCETHTOOL`;
//! - [`default_route`] (pure): the node's default-route interfaces, kept out of QoS unless named;
//! - [`agent`]: the Kubernetes shell that applies a `RoceNode` and writes its status;
//! - [`gate`]: the device plugin's view of which netdevs are lossless (or Soft-RoCE the fabric
//!   accepts without it, `spec.qos.lossySoftRoce: Accept`).

pub mod agent;
pub mod apply;
pub mod counters;
pub mod dcbnl;
pub mod default_route;
pub mod driver_files;
pub mod ethtool;
#[cfg(test)]
mod fixture_tests;
pub mod gate;
pub mod model;
pub mod netlink;
pub mod plan;
pub mod rtnl;

pub use model::{Reading, priority_list};

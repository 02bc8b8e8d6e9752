//! The rocefabric API: the `RoceFabric` and `RoceNode` custom resources, the constants every
//! component shares (group, annotation keys, resource names, condition types), and pure helpers
//! over them (defaults, the RoCE ToS formula, NIC selection, quantity parsing, condition merging,
//! client-side validation against the generated CRD schema).
//!
//! This crate does no I/O and talks to no API server; the `crdgen` binary prints the CRDs. The
//! formats other processes read (the region annotation and directory, the workload environment)
//! are in `rocefabric-formats`, whose names [`constants`] re-exports.

pub mod conditions;
pub mod constants;
pub mod crdgen;
pub mod errors;
pub mod fabric;
pub mod field_error;
pub mod nic_selector;
pub mod node;
pub mod quantity;
pub mod resource_name;
pub mod structural;
pub mod validate;

pub use fabric::{
    CnpSpec, EcnSpec, LossySoftRoce, NodeCounts, QosSpec, RegionCounts, RoceFabric, RoceFabricSpec,
    RoceFabricStatus, RolloutSpec, SharedMemorySpec, Trust,
};
pub use nic_selector::{NicIdentity, NicSelector};
pub use node::{
    InterfaceStatus, Knob, KnobOutcome, KnobStatus, Mechanism, RoceNode, RoceNodeSpec,
    RoceNodeStatus,
};

/// A string from outside, quoted for an error message: control characters escaped and cut to a
/// readable length, so a crafted value cannot forge output.
pub(crate) fn shown_json(s: &str) -> String {
    format!("\"{}\"", rocefabric_input::shown(s))
}

//! The rocefabric node daemon (binary `rocefabric-device-plugin`, chart key `node`): one
//! discovery loop over the node's sysfs that feeds the kubelet device plugin, the DRA driver, or
//! both with one ledger; the QoS agent; the `discover` and `qos` commands.
//!
//! This crate only wires the others together: the model (`rocefabric-node-model`), the kubelet
//! APIs (`rocefabric-kubelet-api`), the DRA driver (`rocefabric-dra`) and the QoS agent
//! (`rocefabric-qos-agent`).
//!
//! - [`discovery`]: the one discovery loop;
//! - [`serve`]: the device plugin (publisher, per-resource backends, socket supervisor);
//! - [`fabric_source`]: where the fabric view comes from (the node's RoceNode, or the config);
//! - [`cli`]: the subcommands;
//! - [`metrics_catalog`]: every metric family the daemon can export.

pub mod cli;
pub mod discovery;
pub mod fabric_source;
pub mod metrics_catalog;
pub mod mode;
pub mod serve;

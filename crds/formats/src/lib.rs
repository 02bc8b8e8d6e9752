//! The formats that cross a process boundary in rocefabric, each defined once: what the operator
//! writes and the node daemon or a pod's data plane reads, or what the node daemon puts into a
//! container for NCCL, UCX and the data plane.
//!
//! - [`names`]: annotation, label, scheduling gate and ConfigMap names.
//! - [`region`]: the value of the `rocefabric.io/region` pod annotation.
//! - [`directory`]: the per-namespace region directory (`<fabric>-regions`, key `regions.json`).
//! - [`env`]: the environment variable names a workload's containers receive and read.
//!
//! It is pure (serde, serde_json and thiserror only): no Kubernetes client or API types, no
//! I/O, no policy. The custom resources and their schema live in `rocefabric-api`; which window a
//! pod gets, how large a directory may grow and how a directory is checked before use belong to
//! the operator and the data plane.

pub mod directory;
pub mod env;
pub mod names;
pub mod region;

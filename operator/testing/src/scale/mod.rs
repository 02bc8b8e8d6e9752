//! The scale harness (issue "100,000 nodes and 1,000,000 pods"): an in-process API server
//! serving a generated cluster, the real operator binary run against it, and the scenario that
//! waits for convergence and measures single events. The operator's `benches/scale.rs` runs it
//! at full size and prints the figures; its `tests/scale.rs` runs it small and checks what a
//! user would.

pub mod apiserver;
pub mod cluster;
pub mod operator;
pub mod scenario;

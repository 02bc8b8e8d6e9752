//! The scale harness (issue "100,000 nodes and 1,000,000 pods"): an in-process API server
//! serving a generated cluster, the real operator binary run against it, and the scenario that
//! waits for convergence and measures single events. `benches/scale.rs` runs it at full size
//! and prints the figures; `tests/scale.rs` runs it small and checks what a user would.
// Each of the bench and the test uses part of it.
#![allow(dead_code)]

pub mod apiserver;
pub mod operator;
pub mod scenario;
pub mod world;

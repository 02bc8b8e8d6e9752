//! The scale harness (issue "100,000 nodes and 1,000,000 pods"): an in-process API server
//! serving a generated cluster.
// Each of the bench and the test uses part of it.
#![allow(dead_code)]

pub mod apiserver;
pub mod world;

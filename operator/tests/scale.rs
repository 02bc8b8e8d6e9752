//! The scale harness's API server and generated world (their unit tests).

#[path = "../benches/scale/mod.rs"]
mod scale;

//! Test doubles of the operator's tests and benches, kept out of the operator's own code.
//!
//! - [`verifier`]: a strict mock API server behind a real `kube::Client` that asserts each
//!   request (method, path, query, body) and answers it, in the style of controller-rs's
//!   `ApiServerVerifier`.
//! - [`fake_cluster`]: a small in-memory API server behind a `kube::Client` for the tests that
//!   run the whole controller loop.
//! - [`objects`]: builders of fabrics, nodes and pods, and a fake node agent's status.
//! - [`bench_cluster`]: the generated cluster of the planner benchmarks.
//! - [`scale`]: the scale harness: an in-process HTTP API server serving a generated cluster
//!   to the real operator binary, and the scenario that measures it.
//! - [`api`]: what both fakes share: request routing, label selectors, `Status` failures and
//!   the object store with the API server's write semantics.
//!
//! It does not depend on the operator crate (the operator takes it as a dev-dependency; a
//! dependency back would build a second copy of the operator's types into its tests): helpers
//! that need the planner's types stay in the operator's `tests/support`.

pub mod api;
pub mod bench_cluster;
pub mod fake_cluster;
pub mod objects;
pub mod scale;
pub mod verifier;

/// Sequences a property test runs: 64, or `ROCEFABRIC_PROPTEST_CASES`.
pub fn proptest_cases() -> u32 {
    std::env::var("ROCEFABRIC_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

//! What the fake API servers share: how a request names its object ([`resource`]), label
//! selectors ([`selector`]), the `Status` of a failed request ([`failure`]) and the store of
//! objects with the API server's write semantics ([`store`]). The scale harness's HTTP server
//! and the in-memory [`crate::fake_cluster::FakeCluster`] both answer from these.

pub mod failure;
pub mod resource;
pub mod selector;
pub mod store;

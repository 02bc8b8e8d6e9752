//! What every rocefabric process does the same way, written once: exponential backoff, logging
//! setup, shutdown on SIGTERM/SIGINT, the `/metrics` + `/healthz` server and crash-safe file
//! writes.
//!
//! The async pieces (`shutdown`, `metrics_server`) are behind the `server` feature.
//!
//! Not for domain logic: nothing here knows about HCAs, fabrics or regions. The operator, the
//! node daemon and the data plane's CLI depend on it; it depends on none of them.

pub mod backoff;
pub mod file;
#[cfg(feature = "server")]
pub mod http_server;
pub mod logging;
#[cfg(feature = "server")]
pub mod metrics_server;
#[cfg(feature = "server")]
pub mod shutdown;

pub use backoff::{Backoff, Retry};

//! Reading outside data without being hurt by it.
//!
//! Everything the binaries take from outside (config and snapshot files, sysfs and procfs
//! attributes, YAML written by hand) comes in through here:
//! - [`read`]: reads with a size cap, refusing devices and FIFOs where a file is expected;
//! - [`yaml`]: YAML parsed as strictly as `kubectl` and the API server do (duplicate keys are
//!   errors, nesting is bounded before the parser can be made slow), typed with field paths;
//! - [`shown`]: values made safe to print in logs and tables (escaped, truncated).

pub mod read;
pub mod shown;
pub mod yaml;

pub use shown::shown;

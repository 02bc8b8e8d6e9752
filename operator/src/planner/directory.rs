//! How large the per-namespace region directory may grow. Its format (the `<fabric>-regions`
//! ConfigMap, key `regions.json`, one entry per line, sorted by id) is defined with the other
//! cross-process formats in [`rocefabric_formats::directory`].
//!
//! # Scale
//!
//! One entry is at most [`MAX_ENTRY_BYTES`] (692) bytes with its separator: a 253-character pod name and node name,
//! a 39-character IPv6 address, a 7-digit id, 20-digit base and size, and a 36-character uid.
//! Typical entries (names under 63 characters, IPv4) take about 195 bytes. The documented scale is
//! [`DOCUMENTED_REGIONS_PER_NAMESPACE`] (1,000) regions per namespace per fabric: at most
//! 692,000 bytes (0.66 MiB) with worst-case names, about 195 KB with typical ones, well under the 1 MiB
//! object limit. A directory that would exceed [`MAX_DIRECTORY_BYTES`] (900 KiB, about 1,330
//! worst-case or 4,700 typical entries) is not written; the fabric reports
//! `RegionDirectoryTooLarge` instead and the previous directory stays.

/// Largest directory the planner writes, in bytes of data.
pub const MAX_DIRECTORY_BYTES: usize = 900 * 1024;
/// Largest possible entry line (with its separator), in bytes.
pub const MAX_ENTRY_BYTES: usize = 692;
/// Regions per namespace per fabric the directory is sized for.
pub const DOCUMENTED_REGIONS_PER_NAMESPACE: usize = 1_000;

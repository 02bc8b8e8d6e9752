//! The per-namespace region directory: ConfigMap `<fabric>-regions` with one key,
//! [`DIRECTORY_KEY`], holding a JSON array of the namespace's regions, one object per line,
//! sorted by id:
//!
//! ```text
//! [
//! {"pod":"trainer-0","node":"dgx-001","podIP":"10.1.2.3","id":0,"base":0,"size":1073741824,"uid":"9f3c2a7e-5b1d-4e8a-b6c0-1d2e3f4a5b6c"},
//! {"pod":"trainer-1","id":1,"base":1073741824,"size":1073741824,"uid":"0c4d8e21-7a3f-4b9e-8d1c-2e5f6a7b8c9d"}
//! ]
//! ```
//!
//! `node` and `podIP` are left out until the pod is scheduled and has an address. `uid` is the
//! owner pod's `metadata.uid`, last in the object, so that the data plane can refuse to write a
//! window through a connection to a pod that no longer owns it. It is left out only for a pod without a
//! uid (never the case for a pod read from the API server).
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

use serde::{Deserialize, Serialize};

/// The ConfigMap key holding the directory.
pub const DIRECTORY_KEY: &str = "regions.json";
/// Largest directory the planner writes, in bytes of data.
pub const MAX_DIRECTORY_BYTES: usize = 900 * 1024;
/// Largest possible entry line (with its separator), in bytes.
pub const MAX_ENTRY_BYTES: usize = 692;
/// Regions per namespace per fabric the directory is sized for.
pub const DOCUMENTED_REGIONS_PER_NAMESPACE: usize = 1_000;

/// One region of the directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DirectoryEntry {
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    pub id: u32,
    pub base: u64,
    pub size: u64,
    /// The owner pod's `metadata.uid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// One region of the directory, borrowed from the pod, for rendering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct EntryRef<'a> {
    pub pod: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<&'a str>,
    #[serde(rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<&'a str>,
    pub id: u32,
    pub base: u64,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<&'a str>,
}

impl<'a> From<&'a DirectoryEntry> for EntryRef<'a> {
    fn from(e: &'a DirectoryEntry) -> Self {
        Self {
            pod: &e.pod,
            node: e.node.as_deref(),
            pod_ip: e.pod_ip.as_deref(),
            id: e.id,
            base: e.base,
            size: e.size,
            uid: e.uid.as_deref(),
        }
    }
}

/// Render entries (sorted by id by the caller) as the directory text.
pub fn render(entries: &[DirectoryEntry]) -> String {
    let refs: Vec<EntryRef<'_>> = entries.iter().map(EntryRef::from).collect();
    render_refs(&refs)
}

/// [`render`] over borrowed entries.
pub fn render_refs(entries: &[EntryRef<'_>]) -> String {
    let mut out = String::with_capacity(4 + entries.len() * 200);
    out.push_str("[\n");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(",\n");
        }
        out.push_str(
            &serde_json::to_string(e)
                .unwrap_or_else(|_| unreachable!("strings and integers serialize")),
        );
    }
    out.push_str("\n]\n");
    out
}

/// Parse a directory text; `None` when it is not one.
pub fn parse(text: &str) -> Option<Vec<DirectoryEntry>> {
    serde_json::from_str(text).ok()
}

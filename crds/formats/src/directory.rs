//! The per-namespace region directory: ConfigMap `<fabric>-regions`
//! ([`REGION_DIRECTORY_SUFFIX`](crate::names::REGION_DIRECTORY_SUFFIX)) with one key,
//! [`DIRECTORY_KEY`](crate::names::DIRECTORY_KEY), holding a JSON array of the namespace's
//! regions, one object per line, sorted by id:
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
//! window through a connection to a pod that no longer owns it. It is left out only for a pod
//! without a uid (never the case for a pod read from the API server).
//!
//! The operator writes it ([`render`], [`render_refs`]); the pods' data plane mounts it and reads
//! it ([`parse`]), then checks it for its own use (sorted, disjoint, non-empty windows).

use serde::{Deserialize, Serialize};

/// One region of the directory: who holds it and where to reach them.
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

impl DirectoryEntry {
    /// One past the last byte of the window (saturating at `u64::MAX`).
    pub fn end(&self) -> u64 {
        self.base.saturating_add(self.size)
    }
}

/// One region of the directory, borrowed from the pod, for rendering: serializes exactly as the
/// [`DirectoryEntry`] it stands for.
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

/// Parse a directory text (any JSON array of entries, whatever its layout). Unknown fields are
/// ignored; order, overlap and empty windows are not checked here.
pub fn parse(text: &str) -> Result<Vec<DirectoryEntry>, serde_json::Error> {
    serde_json::from_str(text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

    use super::*;

    const GI: u64 = 1 << 30;

    fn entries() -> Vec<DirectoryEntry> {
        vec![
            DirectoryEntry {
                pod: "trainer-0".into(),
                node: Some("dgx-001".into()),
                pod_ip: Some("10.1.2.3".into()),
                id: 0,
                base: 0,
                size: GI,
                uid: Some("9f3c2a7e-5b1d-4e8a-b6c0-1d2e3f4a5b6c".into()),
            },
            DirectoryEntry {
                pod: "trainer-1".into(),
                node: None,
                pod_ip: None,
                id: 1,
                base: GI,
                size: GI,
                uid: Some("0c4d8e21-7a3f-4b9e-8d1c-2e5f6a7b8c9d".into()),
            },
            DirectoryEntry {
                pod: "q\"\\\u{1}ü".into(),
                node: Some("n".into()),
                pod_ip: None,
                id: 4_000_000,
                base: u64::MAX - 1,
                size: 1,
                uid: None,
            },
        ]
    }

    /// Byte for byte what the operator has written since the directory has had a `uid`.
    #[test]
    fn the_rendered_directory_is_exactly_what_the_operator_wrote() {
        assert_eq!(
            render(&entries()),
            concat!(
                "[\n",
                r#"{"pod":"trainer-0","node":"dgx-001","podIP":"10.1.2.3","id":0,"base":0,"size":1073741824,"uid":"9f3c2a7e-5b1d-4e8a-b6c0-1d2e3f4a5b6c"}"#,
                ",\n",
                r#"{"pod":"trainer-1","id":1,"base":1073741824,"size":1073741824,"uid":"0c4d8e21-7a3f-4b9e-8d1c-2e5f6a7b8c9d"}"#,
                ",\n",
                r#"{"pod":"q\"\\\u0001ü","node":"n","id":4000000,"base":18446744073709551614,"size":1}"#,
                "\n]\n",
            )
        );
        assert_eq!(render(&[]), "[\n\n]\n");
    }

    #[test]
    fn an_owned_entry_and_its_borrowed_view_serialize_alike() {
        for e in entries() {
            assert_eq!(
                serde_json::to_string(&e).unwrap(),
                serde_json::to_string(&EntryRef::from(&e)).unwrap()
            );
        }
    }

    #[test]
    fn the_directory_reads_back_and_tolerates_absent_optionals_and_unknown_fields() {
        let text = render(&entries());
        assert_eq!(parse(&text).unwrap(), entries());
        let e = &parse(r#"[{"pod":"b","id":2,"base":8192,"size":8192,"future":{}}]"#).unwrap()[0];
        assert_eq!(
            (e.node.as_deref(), e.pod_ip.as_deref(), e.uid.as_deref()),
            (None, None, None)
        );
        assert_eq!(e.end(), 16384);
        assert_eq!(entries()[2].end(), u64::MAX);
        assert_eq!(parse("[]").unwrap(), []);
    }

    #[test]
    fn what_is_not_a_directory_is_refused() {
        for bad in [
            "{}",
            "",
            r#"[{"pod":"a","id":0,"base":0}]"#,
            r#"[{"pod":"a","pod_ip":"x","id":0,"base":0,"size":1,"podIP":7}]"#,
            r#"[{"pod":"a","id":0,"base":-1,"size":1}]"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

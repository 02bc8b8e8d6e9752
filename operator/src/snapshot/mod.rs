//! Loading Kubernetes objects from files as `kubectl get -o yaml|json` writes them: a `List`
//! (`kind: List` or any `*List` with `items`), multi-document YAML, or a single object.
//!
//! Outside data, so read defensively:
//! - JSON is read a chunk at a time and taken apart (`split`): one item is parsed at a time, from
//!   a slice, and of a pod or node list's items only the fields the planner reads are built
//!   (`prune`), then decoded into the planner's compact objects ([`crate::objects`]), so a
//!   `kubectl get pods -A -o json` of a large cluster needs memory for the kept fields only.
//!   Up to [`MAX_JSON_BYTES`].
//! - YAML is parsed a document at a time (the parser holds one document), strictly (duplicate
//!   keys, nesting depth: [`rocefabric_input::yaml`]). Up to [`MAX_YAML_BYTES`].
//! - Objects are keyed by kind, namespace and name: one given twice is counted once and noted,
//!   or refused when the two copies differ.
//! - Names are checked as the API server checks them; type errors name the field path.
//!
//! One file per step: `split` takes JSON apart and `stream` parses YAML documents (`prune` says
//! what of an item is built); each object goes to `object`, which identifies it, tells a second
//! copy apart and keeps it.

mod json;
mod object;
mod prune;
mod split;
mod stream;

use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ConfigMap;
use rocefabric_api::RoceFabric;
use rocefabric_api::validate::FieldError;
use rocefabric_input::read::{self, ReadError, human};
use rocefabric_input::yaml;
use serde::de::DeserializeSeed;
use serde_json::Value;

use object::{Kept, Origin, Place};
use split::Split;
use stream::Top;

/// Most notes kept; the rest are counted.
pub const MAX_NOTES: usize = 20;

/// Largest single object (a List's item, a document): the API server refuses requests over
/// 3 MiB, so anything larger is not a Kubernetes object, and parsing it whole would cost memory
/// out of proportion to what is kept.
pub const MAX_OBJECT_BYTES: u64 = 8 << 20;

/// Largest YAML file loaded: YAML is parsed a whole document at a time.
pub const MAX_YAML_BYTES: u64 = 256 << 20;
/// Largest JSON file loaded: JSON is read a chunk at a time, one object parsed at a time.
pub const MAX_JSON_BYTES: u64 = 64 << 30;

/// A file that cannot be loaded, naming the file and where in it.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}")]
    Read(#[from] ReadError),
    #[error("{path}: {place}: invalid {format}: {reason}")]
    Syntax {
        path: PathBuf,
        place: String,
        format: &'static str,
        reason: String,
    },
    #[error("{path}: {place}: {reason}")]
    Object {
        path: PathBuf,
        place: String,
        reason: String,
    },
}

/// The kinds a snapshot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    RoceFabric,
    Node,
    Pod,
    RoceNode,
    ConfigMap,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::RoceFabric => "RoceFabric",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::RoceNode => "RoceNode",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    fn parse(kind: &str) -> Option<Self> {
        [
            Kind::RoceFabric,
            Kind::Node,
            Kind::Pod,
            Kind::RoceNode,
            Kind::ConfigMap,
        ]
        .into_iter()
        .find(|k| k.as_str() == kind)
    }

    fn namespaced(self) -> bool {
        matches!(self, Kind::Pod | Kind::ConfigMap)
    }
}

/// A fabric the API server would reject, with every reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidFabric {
    pub name: String,
    pub errors: Vec<FieldError>,
}

/// Objects loaded from files.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Fabrics that deserialize (valid or not: the planner reports invalid ones).
    pub fabrics: Vec<RoceFabric>,
    /// Fabrics too malformed to read as a RoceFabric at all.
    pub unreadable_fabrics: Vec<InvalidFabric>,
    pub nodes: Vec<crate::objects::CompactNode>,
    pub roce_nodes: Vec<crate::objects::CompactRoceNode>,
    pub pods: Vec<crate::objects::CompactPod>,
    pub config_maps: Vec<ConfigMap>,
    /// Things worth saying that are not errors: objects given twice (the first
    /// [`MAX_NOTES`], then a count).
    pub notes: Vec<String>,
    /// Notes left out past [`MAX_NOTES`].
    pub notes_left_out: usize,
    /// While a page of an API list is loaded ([`Snapshot::load_page`]): the kind of its items,
    /// which the API server sends without `kind`, and the list's `metadata.continue`.
    page: Option<(Kind, Option<String>)>,
    /// Where each object was first seen, and its index in its list (or, for a fabric that could
    /// not be read, a digest of it), by kind, namespace and name.
    seen: HashMap<(Kind, String), (Origin, Kept)>,
    /// The path of the file read last, shared by the [`Origin`]s of its objects.
    last_path: Option<std::sync::Arc<Path>>,
}

impl Snapshot {
    /// Load every object of `path`, accepting only the kinds in `accept`.
    pub fn load_file(&mut self, path: &Path, accept: &[Kind]) -> Result<(), SnapshotError> {
        let mut reader =
            std::io::BufReader::with_capacity(256 * 1024, read::open_file(path, MAX_JSON_BYTES)?);
        let io = |source| ReadError::Io {
            path: path.to_path_buf(),
            source,
        };
        // JSON (`kubectl get -o json`) starts with `{` or `[`; anything else is YAML. Where the
        // first byte kept is, past a byte order mark and whitespace: line, column.
        let mut place = (1, 0);
        let json = loop {
            let buf = reader.fill_buf().map_err(io)?;
            if buf.is_empty() {
                break false;
            }
            if buf.starts_with("\u{feff}".as_bytes()) {
                reader.consume(3); // a byte order mark: not content
                continue;
            }
            if let Some(offset) = buf.iter().position(|&b| b == 0) {
                // Neither YAML nor JSON holds a NUL: refuse a binary file or device at once.
                return Err(SnapshotError::Object {
                    path: path.to_path_buf(),
                    place: "file".into(),
                    reason: format!("not text: a NUL byte at offset {offset}"),
                });
            }
            match buf.iter().position(|b| !b.is_ascii_whitespace()) {
                Some(i) => break matches!(buf[i], b'{' | b'['),
                None => {
                    for &b in buf {
                        place = if b == b'\n' {
                            (place.0 + 1, 0)
                        } else {
                            (place.0, place.1 + 1)
                        };
                    }
                    let n = buf.len();
                    reader.consume(n);
                }
            }
        };
        if json {
            let before = self.len();
            let split = Split::reader(&mut reader, place.0, place.1);
            return match self.load_json(split, path, accept) {
                // Flow-style YAML (`{apiVersion: v1, ...}`) starts like JSON: when nothing was
                // read as JSON, a small regular file gets a second reading as YAML.
                Err(json @ SnapshotError::Syntax { .. })
                    if self.len() == before
                        && std::fs::metadata(path)
                            .is_ok_and(|m| m.is_file() && m.len() <= MAX_YAML_BYTES) =>
                {
                    let text = read::read_file(path, MAX_YAML_BYTES)?;
                    self.load_str(&text, path, accept).map_err(|_| json)
                }
                other => other,
            };
        }
        let mut bytes = Vec::new();
        reader
            .take(MAX_YAML_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > MAX_YAML_BYTES {
            return Err(SnapshotError::Object {
                path: path.to_path_buf(),
                place: "file".into(),
                reason: format!(
                    "YAML larger than {} (YAML is parsed a document at a time); give it as JSON \
                     (`kubectl get -o json`), which is streamed",
                    human(MAX_YAML_BYTES)
                ),
            });
        }
        let text = String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 {
            path: path.to_path_buf(),
            offset: e.utf8_error().valid_up_to(),
        })?;
        self.load_str(&text, path, accept)
    }

    /// Load one page of an API server list of `kind` (`GET /api/v1/pods?limit=N`), read from
    /// `bytes` (not copied) and decoded as a JSON file is (each object bounded, checked and
    /// trimmed); `source` names the request in errors. Returns the list's `continue` token,
    /// `None` on the last page.
    pub fn load_page(
        &mut self,
        bytes: &[u8],
        source: &Path,
        kind: Kind,
    ) -> Result<Option<String>, SnapshotError> {
        self.page = Some((kind, None));
        let loaded = self.load_json(Split::slice(bytes), source, &[kind]);
        let token = self.page.take().and_then(|(_, token)| token);
        loaded.map(|()| token.filter(|t| !t.is_empty()))
    }

    /// How many objects are loaded (of every kind).
    fn len(&self) -> usize {
        self.fabrics.len()
            + self.unreadable_fabrics.len()
            + self.nodes.len()
            + self.roce_nodes.len()
            + self.pods.len()
            + self.config_maps.len()
    }

    /// Load every object of YAML (or JSON) `text` read from `path`, named in errors.
    pub fn load_str(
        &mut self,
        text: &str,
        path: &Path,
        accept: &[Kind],
    ) -> Result<(), SnapshotError> {
        let syntax = |document: usize, e: yaml::YamlError| SnapshotError::Syntax {
            path: path.to_path_buf(),
            place: format!("document {document}"),
            format: "YAML",
            reason: e.message,
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        yaml::check_depth(text).map_err(|e| syntax(e.document, e))?;
        let too_large = |place: &str, line: usize| SnapshotError::Object {
            path: path.to_path_buf(),
            place: format!("{place} (line {line})"),
            reason: format!(
                "an object larger than {} (the API server refuses anything over 3 MiB)",
                human(MAX_OBJECT_BYTES)
            ),
        };
        for (n, (first_line, doc)) in yaml::split_documents(text).into_iter().enumerate() {
            let document = n + 1;
            let place = format!("document {document}");
            // A kubectl List is parsed item by item; anything else whole.
            let (head, items, dedent) = match yaml::split_list(doc, first_line) {
                Some(list) => (std::borrow::Cow::Owned(list.head), list.items, list.dedent),
                None if doc.len() as u64 > MAX_OBJECT_BYTES => {
                    return Err(too_large(&place, first_line));
                }
                None => (std::borrow::Cow::Borrowed(doc), Vec::new(), 0),
            };
            self.load_document(&head, first_line, path, &place, accept)
                .map_err(|e| e.unwrap_or_else(|e| syntax(document, e)))?;
            for (i, (line, item)) in items.into_iter().enumerate() {
                let item_place = Place::item(&place, i);
                if item.len() as u64 > MAX_OBJECT_BYTES {
                    return Err(too_large(&item_place.to_string(), line));
                }
                let mut values = yaml::documents(&item)
                    .map_err(|e| syntax(document, yaml::shift_lines(e, line - 1, dedent)))?;
                let value = values.pop().unwrap_or(Value::Null);
                self.add(value, path, item_place, accept)?;
            }
        }
        Ok(())
    }

    /// Parse one YAML document (its first line is `first_line` of the file): an object, or a
    /// List whose items are added as they are parsed. Errors are the snapshot's own, or the
    /// YAML's (with lines counted in the whole file).
    fn load_document(
        &mut self,
        doc: &str,
        first_line: usize,
        path: &Path,
        place: &str,
        accept: &[Kind],
    ) -> Result<(), Result<SnapshotError, yaml::YamlError>> {
        for parsed in yaml_serde::Deserializer::from_str(doc) {
            let mut failure = None;
            let seed = Top {
                snapshot: self,
                path,
                place,
                accept,
                failure: &mut failure,
            };
            match (seed.deserialize(parsed), failure) {
                (_, Some(e)) => return Err(Ok(e)),
                (Ok(()), None) => {}
                (Err(e), None) => {
                    let e = yaml::yaml_error(1, &e);
                    let e = yaml::with_duplicate_line(e, doc);
                    return Err(Err(yaml::shift_lines(e, first_line - 1, 0)));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_page_gives_its_items_their_kind_and_its_continue_token() {
        let page = serde_json::json!({"apiVersion": "v1", "kind": "NodeList",
            "metadata": {"resourceVersion": "7", "continue": "tok"},
            "items": [{"metadata": {"name": "n1", "managedFields": [{"manager": "m"}]}},
                      {"metadata": {"name": "n2"}}]});
        let mut snap = Snapshot::default();
        let source = Path::new("/api/v1/nodes?limit=2");
        let token = snap
            .load_page(page.to_string().as_bytes(), source, Kind::Node)
            .expect("loads");
        assert_eq!(token.as_deref(), Some("tok"));
        assert_eq!(snap.nodes.len(), 2);
        assert_eq!(snap.nodes[0].labels.len(), 0);
        let last = serde_json::json!({"kind": "NodeList", "metadata": {"continue": ""},
            "items": [{"metadata": {"name": "n3"}}]});
        let token = snap
            .load_page(last.to_string().as_bytes(), source, Kind::Node)
            .expect("loads");
        assert_eq!(token, None, "an empty token ends the list");
        // Checked as a file is: a bad name is refused, naming the request.
        let bad = serde_json::json!({"kind": "NodeList", "items": [{"metadata": {"name": "N!"}}]});
        let err = snap
            .load_page(bad.to_string().as_bytes(), source, Kind::Node)
            .expect_err("refused");
        assert!(err.to_string().contains("/api/v1/nodes?limit=2"), "{err}");
        // A file keeps requiring `kind`.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nodes.json");
        std::fs::write(
            &path,
            r#"{"kind": "List", "items": [{"metadata": {"name": "x"}}]}"#,
        )
        .expect("write");
        assert!(snap.load_file(&path, &[Kind::Node]).is_err());
    }

    #[test]
    fn a_copy_is_noted_naming_both_places() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "ns"}});
        let json = dir.path().join("pods.json");
        let list = serde_json::json!({"kind": "List", "items": [{"kind": "Pod",
            "metadata": {"name": "b", "namespace": "ns"}}, pod]});
        std::fs::write(&json, list.to_string()).expect("write");
        let yaml = dir.path().join("pods.yaml");
        let text = "kind: List\nitems:\n\
                    - {apiVersion: v1, kind: Pod, metadata: {name: a, namespace: ns}}\n";
        std::fs::write(
            &yaml,
            format!("kind: Pod\nmetadata: {{name: c, namespace: ns}}\n---\n{text}"),
        )
        .expect("write");
        let mut snap = Snapshot::default();
        snap.load_file(&json, &[Kind::Pod]).expect("loads");
        snap.load_file(&yaml, &[Kind::Pod]).expect("loads");
        assert_eq!(
            snap.notes,
            [format!(
                "Pod ns/a is given twice ({} item 1 (Pod a); {} document 2, item 0 (Pod a)): \
                 counted once",
                json.display(),
                yaml.display()
            )]
        );
        let other = dir.path().join("other.json");
        std::fs::write(
            &other,
            pod.to_string().replace("\"ns\"", "\"ns\", \"uid\": \"u\""),
        )
        .expect("write");
        let e = snap.load_file(&other, &[Kind::Pod]).expect_err("differs");
        assert_eq!(
            e.to_string(),
            format!(
                "{0}: top level (Pod a): Pod ns/a was already given, with other contents, at \
                 {1} item 1 (Pod a): give one copy",
                other.display(),
                json.display()
            )
        );
    }

    #[test]
    fn a_syntax_error_past_the_first_chunks_is_placed_in_the_whole_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pods.json");
        // Pretty, as kubectl writes it: a few MiB of lines, and a fault in the last item.
        let pod = |i: usize| {
            serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p{i}"), "namespace": "ns",
                    "annotations": {"note": "x".repeat(500)}}})
        };
        let items: Vec<_> = (0..5000).map(pod).collect();
        let text =
            serde_json::to_string_pretty(&serde_json::json!({"kind": "List", "items": items}))
                .expect("renders");
        let at = text.rfind("\"ns\"").expect("a namespace");
        let text = format!("{}\"ns\" \"x\"{}", &text[..at], &text[at + 4..]);
        assert!(text.len() > 2 << 20, "{} bytes", text.len());
        std::fs::write(&path, &text).expect("write");
        let whole = serde_json::from_str::<Value>(&text).expect_err("malformed");
        let e = Snapshot::default()
            .load_file(&path, &[Kind::Pod])
            .expect_err("malformed");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: line {} column {}: invalid JSON: expected `,` or `}}`",
                path.display(),
                whole.line(),
                whole.column()
            )
        );
    }

    #[test]
    fn streamed_pods_keep_only_what_the_planner_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pods.json");
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "default", "managedFields": [{"manager": "m"}],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "rocefabric.io/region-size": "2Gi"}},
            "spec": {"containers": [{"name": "c", "image": "i"}], "nodeName": "n1"},
            "status": {"phase": "Running", "containerStatuses": []}});
        let list = serde_json::json!({"apiVersion": "v1", "items": [pod], "kind": "List"});
        std::fs::write(&path, list.to_string()).expect("write");
        let mut snap = Snapshot::default();
        snap.load_file(&path, &[Kind::Pod]).expect("loads");
        let p = &snap.pods[0];
        assert_eq!(p.key(), ("default", "a"));
        assert_eq!(p.region_size.as_deref(), Some("2Gi"));
        assert_eq!(p.region, None);
        assert_eq!(p.node_name.as_deref(), Some("n1"));
        assert_eq!(p.phase.as_deref(), Some("Running"));
    }
}

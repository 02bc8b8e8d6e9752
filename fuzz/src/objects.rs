//! Kubernetes objects and YAML: snapshot files, fabrics, the QoS block, the strict YAML reader.

use std::cell::RefCell;
use std::fs;
use std::path::Path;

use rocefabric_api::RoceFabric;
use rocefabric_api::validate::{self, Invalid};
use rocefabric_input::yaml;
use rocefabric_operator::snapshot::{Kind, Snapshot, SnapshotError};
use serde_json::Value;

use crate::text;

/// The file name errors must mention.
const FILE: &str = "fuzz-input.yaml";

/// Every kind a snapshot file may hold.
const ALL_KINDS: &[Kind] = &[
    Kind::RoceFabric,
    Kind::Node,
    Kind::Pod,
    Kind::RoceNode,
    Kind::ConfigMap,
];

/// Bytes of JSON the strict reader may make of one byte of YAML. Without aliases the worst cases
/// are small: `-\n` is `[null]`, a control character in a quoted scalar is `"\u0001"`.
pub(crate) const MAX_EXPANSION: usize = 16;

/// Size of `v` as compact JSON, counted without building the text.
pub(crate) fn json_len(v: &Value) -> usize {
    match v {
        Value::Null => 4,
        Value::Bool(b) => {
            if *b {
                4
            } else {
                5
            }
        }
        Value::Number(n) => n.to_string().len(),
        Value::String(s) => s.len() + 2,
        Value::Array(a) => 2 + a.iter().map(|x| json_len(x) + 1).sum::<usize>(),
        Value::Object(o) => {
            2 + o
                .iter()
                .map(|(k, x)| k.len() + 4 + json_len(x))
                .sum::<usize>()
        }
    }
}

/// Length of the longest mapping key, in bytes as JSON writes it.
fn longest_key(v: &Value) -> usize {
    match v {
        Value::Array(a) => a.iter().map(longest_key).max().unwrap_or(0),
        Value::Object(o) => o
            .iter()
            .map(|(k, x)| {
                Value::from(k.as_str())
                    .to_string()
                    .len()
                    .max(longest_key(x))
            })
            .max()
            .unwrap_or(0),
        _ => 0,
    }
}

/// Nesting depth of collections (a scalar is 0).
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn assert_bounded(input_len: usize, what: &str, output_len: usize) {
    assert!(
        output_len <= MAX_EXPANSION * input_len + 64,
        "{what}: {input_len} bytes of YAML became {output_len} bytes of JSON"
    );
}

/// YAML's `c-printable`, less the YAML 1.1 line breaks NEL, LS and PS: what a YAML text may hold
/// unescaped inside a JSON string and mean the same (JSON text may hold more).
fn yaml_printable(c: char) -> bool {
    let printable = matches!(
        c,
        '\t' | '\n' | '\r' | ' '..='~' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..
    );
    printable && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}')
}

/// Every rejected field of an [`Invalid`] names a field and a reason.
fn assert_names_fields(e: &Invalid) {
    assert!(!e.errors.is_empty(), "an Invalid without errors: {e:?}");
    for f in &e.errors {
        assert!(!f.field.is_empty(), "an error naming no field: {e:?}");
        assert!(!f.message.is_empty(), "an error with no message: {e:?}");
    }
    assert!(!e.to_string().is_empty());
}

/// Objects of each kind in a snapshot.
fn counts(s: &Snapshot) -> [usize; 6] {
    [
        s.fabrics.len(),
        s.unreadable_fabrics.len(),
        s.nodes.len(),
        s.roce_nodes.len(),
        s.pods.len(),
        s.config_maps.len(),
    ]
}

thread_local! {
    /// A file for `load_file`, which streams JSON and reads YAML whole.
    static FILE_INPUT: RefCell<Option<tempfile::NamedTempFile>> = const { RefCell::new(None) };
}

/// `Snapshot::load_str` on the text and `Snapshot::load_file` on the bytes, every kind accepted.
/// Both name the file in errors; where both load, they load the same objects.
pub fn snapshot(data: &[u8]) {
    let text = text(data);
    let from_text = check_snapshot(text.len(), FILE, |s| {
        s.load_str(&text, Path::new(FILE), ALL_KINDS)
    });
    FILE_INPUT.with(|cell| {
        let mut slot = cell.borrow_mut();
        let file = slot.get_or_insert_with(|| {
            tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("temp file: {e}"))
        });
        fs::write(file.path(), data).unwrap_or_else(|e| panic!("temp file: {e}"));
        let path = file.path().to_path_buf();
        let name = path.display().to_string();
        let from_file = check_snapshot(data.len(), &name, |s| s.load_file(&path, ALL_KINDS));
        if let (Some(a), Some(b)) = (from_text, from_file)
            && std::str::from_utf8(data).is_ok()
        {
            assert_eq!(a, b, "load_str and load_file load different objects");
        }
    });
}

/// Load with `load`; the error names the file; what was loaded is bounded by the input and
/// valid enough to validate. The counts of a successful load.
fn check_snapshot(
    input_len: usize,
    name: &str,
    load: impl FnOnce(&mut Snapshot) -> Result<(), SnapshotError>,
) -> Option<[usize; 6]> {
    let mut snap = Snapshot::default();
    let loaded = match load(&mut snap) {
        Ok(()) => true,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(name), "error does not name {name}: {msg}");
            false
        }
    };
    // What was loaded (also before an error) is bounded by the input.
    let objects: usize = counts(&snap).iter().sum();
    assert!(
        objects <= input_len / 8 + 1,
        "{objects} objects from {input_len} bytes"
    );
    for f in &snap.unreadable_fabrics {
        assert!(!f.errors.is_empty(), "unreadable fabric without a reason");
    }
    for f in &snap.fabrics {
        // A fabric that deserialized can be validated (the planner does) without panicking.
        if let Err(e) = validate::fabric(f) {
            assert_names_fields(&e);
        }
    }
    loaded.then(|| counts(&snap))
}

/// `validate::fabric_value` on each strict YAML document.
pub fn fabric_validate(data: &[u8]) {
    let text = text(data);
    let Ok(docs) = yaml::documents(&text) else {
        return;
    };
    for doc in docs {
        match validate::fabric_value(&doc) {
            Err(e) => assert_names_fields(&e),
            Ok(()) => {
                // What the schema and CEL accept, the typed object reads, and its own JSON is
                // accepted again (the operator validates the typed object it re-serializes).
                let fabric: RoceFabric = match serde_json::from_value(doc.clone()) {
                    Ok(f) => f,
                    Err(e) => panic!("valid fabric does not deserialize: {e}\n{doc}"),
                };
                if let Err(e) = validate::fabric(&fabric) {
                    panic!("valid fabric is invalid after a round trip: {e}\n{doc}");
                }
            }
        }
    }
}

/// The `qos apply --config` block: strict YAML, then `validate::qos_value`.
pub fn qos_config(data: &[u8]) {
    let text = text(data);
    let Ok(docs) = yaml::documents(&text) else {
        return;
    };
    let value = docs
        .into_iter()
        .find(|d| !d.is_null())
        .unwrap_or_else(|| serde_json::json!({}));
    match validate::qos_value(&value) {
        Err(e) => assert_names_fields(&e),
        Ok(spec) => {
            let again = serde_json::to_value(&spec)
                .map_err(|e| e.to_string())
                .and_then(|v| validate::qos_value(&v).map_err(|e| e.to_string()));
            assert_eq!(again.as_ref(), Ok(&spec), "QoS block does not round-trip");
        }
    }
}

/// `rocefabric_input::yaml::documents`: bounded output, errors that say where, and every
/// document read back from its own JSON (JSON is YAML) unchanged.
pub fn yaml(data: &[u8]) {
    let text = text(data);
    let depth_ok = yaml::check_depth(&text).is_ok();
    match yaml::documents(&text) {
        Err(e) => {
            assert!(e.document >= 1, "document numbers are 1-based: {e:?}");
            assert!(!e.message.is_empty(), "an error without a message");
            if let Some(line) = e.line {
                // YAML breaks lines at CR, LF, NEL, LS and PS (CRLF is one break).
                let breaks = text
                    .replace("\r\n", "\n")
                    .matches(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'])
                    .count();
                assert!(
                    line >= 1 && line <= breaks + 2,
                    "line {line} of a text with {breaks} line breaks: {e:?}"
                );
            }
        }
        Ok(docs) => {
            assert!(depth_ok, "a text refused by check_depth was parsed");
            assert!(docs.len() <= text.len() / 3 + 1, "{} documents", docs.len());
            let out: usize = docs.iter().map(json_len).sum();
            assert_bounded(text.len(), "documents", out);
            for doc in &docs {
                let json = doc.to_string();
                if !json.chars().all(yaml_printable) {
                    continue; // JSON leaves DEL and C1 controls raw; YAML refuses them raw
                }
                if depth(doc) > yaml::MAX_DEPTH || longest_key(doc) > 1000 {
                    // Block nesting is bounded by the parser (128), flow nesting by the scan (100);
                    // libyaml limits an implicit key (a JSON key) to 1024 bytes.
                    continue;
                }
                match yaml::documents(&json) {
                    Ok(back) => assert_eq!(
                        back.as_slice(),
                        std::slice::from_ref(doc),
                        "document changed when its JSON was read back: {json}"
                    ),
                    Err(e) => panic!("own JSON is not read back: {e}: {json}"),
                }
            }
        }
    }
}

//! What the API server checks of an object besides its schema's types and CEL rules: the
//! `apiVersion` and `kind`, `metadata.name` as a DNS subdomain, unknown fields (as strict field
//! validation, `kubectl apply --validate=strict`, reports them) and the uniqueness of lists the
//! schema declares as sets or maps (`x-kubernetes-list-type`). Pure functions over the schema.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::field_error::FieldError;

/// The fields of `metadata` (ObjectMeta) an object may carry.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Every structural error of `object` against the CRD `schema` of `api_version`/`kind`.
pub fn check(object: &Value, schema: &Value, api_version: &str, kind: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    let Some(map) = object.as_object() else {
        return vec![error("<root>", "must be an object")];
    };
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v == api_version => {}
        Some(v) => out.push(error(
            "apiVersion",
            format!("Unsupported value: {v:?}: supported values: {api_version:?}"),
        )),
        None => out.push(error("apiVersion", "Required value")),
    }
    match map.get("kind").and_then(Value::as_str) {
        Some(k) if k == kind => {}
        Some(k) => out.push(error(
            "kind",
            format!("Unsupported value: {k:?}: supported values: {kind:?}"),
        )),
        None => out.push(error("kind", "Required value")),
    }
    match map.get("metadata") {
        Some(Value::Object(meta)) => {
            for key in meta.keys() {
                if !OBJECT_META_FIELDS.contains(&key.as_str()) {
                    out.push(unknown(&join("metadata", key), key, OBJECT_META_FIELDS));
                }
            }
            match meta.get("name") {
                Some(Value::String(name)) => {
                    if let Err(why) = dns_subdomain(name) {
                        out.push(error(
                            "metadata.name",
                            format!("Invalid value: {}: {why}", crate::shown_json(name)),
                        ));
                    }
                }
                Some(_) => out.push(error("metadata.name", "must be a string")),
                None => out.push(error("metadata.name", "Required value: name is required")),
            }
        }
        Some(_) => out.push(error("metadata", "must be an object")),
        None => out.push(error("metadata.name", "Required value: name is required")),
    }
    let props = schema.get("properties").and_then(Value::as_object);
    for (key, value) in map {
        // `status` is the controller's, and ignored on writes of the object: a snapshot from a
        // newer operator with more status fields is still a valid fabric.
        if matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
            continue;
        }
        match props.and_then(|p| p.get(key)) {
            Some(s) => walk(value, s, key, &mut out),
            None => {
                let mut known: Vec<&str> = vec!["apiVersion", "kind", "metadata"];
                known.extend(props.into_iter().flat_map(|p| p.keys().map(String::as_str)));
                out.push(unknown(&join("", key), key, &known));
            }
        }
    }
    out
}

/// Unknown fields and duplicate set/map entries below `value`, at `path`.
pub fn walk(value: &Value, schema: &Value, path: &str, out: &mut Vec<FieldError>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (key, v) in map {
                    let p = join(path, key);
                    match props.get(key) {
                        Some(s) => walk(v, s, &p, out),
                        None => {
                            let known: Vec<&str> = props.keys().map(String::as_str).collect();
                            out.push(unknown(&p, key, &known));
                        }
                    }
                }
            } else if let Some(inner) = schema.get("additionalProperties").filter(|s| s.is_object())
            {
                for (key, v) in map {
                    walk(v, inner, &join(path, key), out);
                }
            }
        }
        Value::Array(items) => {
            let Some(inner) = schema.get("items") else {
                return;
            };
            match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => duplicates(items, path, |v| Some(v.clone()), "", out),
                Some("map") => {
                    let keys: Vec<&str> = schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|k| k.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let key_of = |v: &Value| -> Option<Value> {
                        Some(Value::Array(
                            keys.iter()
                                .map(|k| v.get(*k).cloned().unwrap_or(Value::Null))
                                .collect(),
                        ))
                    };
                    duplicates(items, path, key_of, &keys.join(","), out);
                }
                _ => {}
            }
            for (i, v) in items.iter().enumerate() {
                walk(v, inner, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// `Duplicate value: 3` at the index of each repeat, as the API server words it.
fn duplicates(
    items: &[Value],
    path: &str,
    key_of: impl Fn(&Value) -> Option<Value>,
    key_names: &str,
    out: &mut Vec<FieldError>,
) {
    let mut seen = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let Some(key) = key_of(item) else { continue };
        let text = key.to_string();
        if !seen.insert(text.clone()) {
            let what = if key_names.is_empty() {
                format!("Duplicate value: {}", rocefabric_input::shown(&text))
            } else {
                format!(
                    "Duplicate value: entry with the same {key_names} ({})",
                    rocefabric_input::shown(&text)
                )
            };
            out.push(error(&format!("{path}[{i}]"), what));
        }
    }
}

/// `path.key`, with a key that is empty or not a plain name quoted (`spec."a b"`).
fn join(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/'));
    let key = if plain {
        key.to_string()
    } else {
        crate::shown_json(key)
    };
    if path.is_empty() {
        key
    } else {
        format!("{path}.{key}")
    }
}

fn unknown(path: &str, key: &str, known: &[&str]) -> FieldError {
    let hint = known
        .iter()
        .filter(|k| edit_distance(k, key) <= 2)
        .min_by_key(|k| edit_distance(k, key))
        .map(|k| format!(" (did you mean {k:?}?)"))
        .unwrap_or_default();
    error(
        path,
        format!("unknown field {}{hint}", crate::shown_json(key)),
    )
}

fn error(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_string(),
        message: message.into(),
    }
}

/// A DNS-1123 subdomain, as Kubernetes requires of most object names.
pub fn dns_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a name must not be empty".into());
    }
    if name.len() > 253 {
        return Err(format!(
            "must be no more than 253 characters (it has {})",
            name.len()
        ));
    }
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.split('.').all(ok_label) {
        Ok(())
    } else {
        Err("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into())
    }
}

/// A DNS-1123 label (namespaces, label-value-sized names).
pub fn dns_label(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a name must not be empty".into());
    }
    if name.len() > 63 || name.contains('.') {
        return Err("a lowercase RFC 1123 label must be at most 63 characters, without '.'".into());
    }
    dns_subdomain(name).map_err(|_| {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character".into()
    })
}

/// Levenshtein distance, for "did you mean" on short field names.
fn edit_distance(a: &str, b: &str) -> usize {
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_rfc_1123() {
        assert!(dns_subdomain("training.a-1").is_ok());
        for bad in ["", "Training", "-a", "a-", "a..b", "a_b", "a\nb"] {
            assert!(dns_subdomain(bad).is_err(), "{bad:?}");
        }
        assert!(dns_subdomain(&"a".repeat(254)).is_err());
        assert!(dns_label("ml-eval").is_ok());
        assert!(dns_label("a.b").is_err());
    }

    #[test]
    fn typos_get_a_suggestion() {
        assert_eq!(edit_distance("nodeSelectr", "nodeSelector"), 1);
        let e = unknown("spec.nodeSelectr", "nodeSelectr", &["nodeSelector", "qos"]);
        assert_eq!(
            e.message,
            "unknown field \"nodeSelectr\" (did you mean \"nodeSelector\"?)"
        );
    }
}

//! Client-side validation of a RoceFabric exactly as the API server would do it: the generated
//! CRD's OpenAPI schema (ranges, list sizes, types) and its CEL rules. The CRD is the one source
//! of the rules; the operator, `plan` and `qos apply` call this instead of re-stating them.

use std::sync::OnceLock;

use kube::CustomResourceExt;
use kube::core::cel::Validator;
use serde_json::Value;

use crate::{QosSpec, RoceFabric, quantity, structural};

pub use crate::field_error::FieldError;

/// Every reason an object was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind}{}: {}", if name.is_empty() { String::new() } else { format!(" {name:?}") }, .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Invalid {
    pub kind: &'static str,
    pub name: String,
    pub errors: Vec<FieldError>,
}

fn fabric_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let crd = RoceFabric::crd();
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("the derived CRD has an openAPIV3Schema");
        serde_json::to_value(schema).expect("a schema serializes to JSON")
    })
}

fn schema_validator() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        jsonschema::draft4::new(fabric_schema()).expect("the generated schema is valid JSON Schema")
    })
}

/// The field a CEL error is about: its fieldPath, else (rules at the root, where the API server
/// allows no fieldPath into `metadata`) the path the message starts with, e.g. `metadata.name`.
fn cel_field(field_path: &str, message: &str) -> String {
    let path = field_path.trim_start_matches('.');
    if !path.is_empty() {
        return path.to_string();
    }
    message
        .split_whitespace()
        .next()
        .filter(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '.'))
        .unwrap_or_default()
        .to_string()
}

/// Validate a RoceFabric given as JSON (as read from YAML or the API server).
pub fn fabric_value(object: &Value) -> Result<(), Invalid> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut errors = structural::check(
        object,
        fabric_schema(),
        crate::constants::API_VERSION,
        "RoceFabric",
    );
    errors.extend(schema_validator().iter_errors(object).map(|e| FieldError {
        field: pointer_to_path(e.instance_path().as_str()),
        message: rocefabric_input::shown::shown_within(&tidy_numbers(&e.to_string()), 512),
    }));
    // CEL rules presume a structurally valid object, as in the API server.
    if errors.is_empty()
        && let Err(cel) = Validator::new().validate(fabric_schema(), object, None)
    {
        errors.extend(cel.into_vec().into_iter().map(|e| FieldError {
            field: cel_field(&e.field_path, &e.message),
            message: rocefabric_input::shown::shown_within(&e.message, 512),
        }));
    }
    if errors.is_empty()
        && let Some(size) = object
            .pointer("/spec/sharedMemory/regionSize")
            .and_then(Value::as_str)
        && let Err(e) = quantity::parse_bytes(size)
    {
        errors.push(FieldError {
            field: "spec.sharedMemory.regionSize".into(),
            message: e.to_string(),
        });
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Invalid {
            kind: "RoceFabric",
            name,
            errors,
        })
    }
}

/// Validate a typed RoceFabric.
pub fn fabric(object: &RoceFabric) -> Result<(), Invalid> {
    let value = serde_json::to_value(object).expect("a RoceFabric serializes to JSON");
    fabric_value(&value)
}

/// Validate a bare QoS block (the `qos apply --config` file) with the fabric's rules.
pub fn qos_value(qos: &Value) -> Result<QosSpec, Invalid> {
    let object = serde_json::json!({
        "apiVersion": crate::constants::API_VERSION,
        "kind": "RoceFabric",
        "metadata": { "name": "qos" },
        "spec": { "qos": qos },
    });
    fabric_value(&object).map_err(|mut e| {
        e.kind = "QoS block";
        e.name = String::new();
        for err in &mut e.errors {
            if let Some(rest) = err.field.strip_prefix("spec.qos") {
                err.field = rest.trim_start_matches('.').to_string();
                if err.field.is_empty() {
                    err.field = "qos".into();
                }
            }
        }
        e
    })?;
    serde_json::from_value(qos.clone()).map_err(|e| Invalid {
        kind: "QoS block",
        name: String::new(),
        errors: vec![FieldError {
            field: "qos".into(),
            message: e.to_string(),
        }],
    })
}

/// Schema bounds are floats in the generated schema (`maximum: 7.0`); say `7`, and write huge
/// integral values out (`18446744073709551616`, not `1.8446744073709552e19`).
fn tidy_numbers(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for (i, word) in message.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let (body, tail) = word.split_at(word.trim_end_matches([',', ';', ')']).len());
        match body.parse::<f64>() {
            Ok(f) if body.contains(['.', 'e']) && f.fract() == 0.0 && f.abs() < 1e21 => {
                out.push_str(&format!("{f:.0}{tail}"));
            }
            _ => out.push_str(word),
        }
    }
    out
}

/// `/spec/qos/pfcPriorities/1` -> `spec.qos.pfcPriorities[1]`.
fn pointer_to_path(pointer: &str) -> String {
    let mut out = String::new();
    for seg in pointer.split('/').filter(|s| !s.is_empty()) {
        if seg.chars().all(|c| c.is_ascii_digit()) {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&seg.replace("~1", "/").replace("~0", "~"));
        }
    }
    if out.is_empty() { "<root>".into() } else { out }
}

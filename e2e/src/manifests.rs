//! Reading rendered Kubernetes manifests (a multi-document YAML stream) as JSON values.

use serde_json::Value;

/// Every non-empty document of a YAML stream, as JSON.
pub fn parse_stream(text: &str) -> Result<Vec<Value>, yaml_serde::Error> {
    let mut docs = Vec::new();
    for document in yaml_serde::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// `kind/name` of an object, for messages.
pub fn object_ref(object: &Value) -> String {
    format!(
        "{}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The objects of `kind`.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

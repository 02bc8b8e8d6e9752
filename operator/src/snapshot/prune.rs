//! Reading a List's items of one kind, only the fields the planner reads are built as JSON
//! values; the rest (a pod's containers, statuses, managedFields) is skipped as it is parsed,
//! never allocated. What is built is read strictly (duplicate keys refused), as every object.

use rocefabric_api::constants::{REGION_ANNOTATION, REGION_SIZE_ANNOTATION};
use rocefabric_input::yaml::Strict;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::Kind;

/// Which fields of a value are built.
#[derive(Debug)]
pub(super) enum Keep {
    /// The whole value.
    All,
    /// These fields of an object (a value of another type is built whole, so the typed read
    /// names what is wrong with it).
    Fields(&'static [(&'static str, Keep)]),
}

use Keep::{All, Fields};

/// The metadata the compact objects read (a node's labels; a pod's, its age and our
/// annotations), and what identifies an object.
const METADATA: Keep = Fields(&[
    ("name", All),
    ("namespace", All),
    ("resourceVersion", All),
    ("uid", All),
    ("creationTimestamp", All),
    ("deletionTimestamp", All),
    ("labels", All),
    (
        "annotations",
        Fields(&[(REGION_ANNOTATION, All), (REGION_SIZE_ANNOTATION, All)]),
    ),
]);

/// What [`crate::objects::CompactPod`] reads.
const POD: Keep = Fields(&[
    ("apiVersion", All),
    ("kind", All),
    ("metadata", METADATA),
    (
        "spec",
        Fields(&[("nodeName", All), ("schedulingGates", All)]),
    ),
    ("status", Fields(&[("phase", All), ("podIP", All)])),
]);

/// What [`crate::objects::CompactNode`] reads.
const NODE: Keep = Fields(&[("apiVersion", All), ("kind", All), ("metadata", METADATA)]);

impl Keep {
    /// What to build of the items of a file that holds only `accept`.
    pub(super) fn items_of(accept: &[Kind]) -> &'static Keep {
        match accept {
            [Kind::Pod] => &POD,
            [Kind::Node] => &NODE,
            _ => &All,
        }
    }
}

impl<'de> DeserializeSeed<'de> for &'static Keep {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self {
            All => Strict.deserialize(d),
            Fields(fields) => d.deserialize_any(Pruned(fields)),
        }
    }
}

struct Pruned(&'static [(&'static str, Keep)]);

impl<'de> Visitor<'de> for Pruned {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut seen: Vec<String> = Vec::new();
        while let Some(key) = map.next_key_seed(Strict)? {
            let key = match key {
                Value::String(s) => s,
                other => other.to_string(),
            };
            if seen.contains(&key) {
                return Err(de::Error::custom(format!(
                    "duplicate key \"{}\"",
                    rocefabric_input::shown::shown_within(&key, 1024)
                )));
            }
            match self.0.iter().find(|(k, _)| *k == key) {
                Some((_, keep)) => {
                    let value = map.next_value_seed(keep)?;
                    out.insert(key.clone(), value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            seen.push(key);
        }
        Ok(Value::Object(out))
    }

    // Not an object: built whole, for the typed read to refuse.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_fields_read_are_built() {
        let pod = r#"{"kind": "Pod", "metadata": {"name": "a", "managedFields": [{"m": 1}],
            "annotations": {"rocefabric.io/region": "{}", "other": "x"}},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1"}, "status": "odd"}"#;
        let mut de = serde_json::Deserializer::from_str(pod);
        let v = Keep::items_of(&[Kind::Pod])
            .deserialize(&mut de)
            .expect("a pod");
        assert_eq!(
            v,
            serde_json::json!({"kind": "Pod", "metadata": {"name": "a",
                "annotations": {"rocefabric.io/region": "{}"}},
                "spec": {"nodeName": "n1"}, "status": "odd"})
        );
        let twice = r#"{"kind": "Pod", "metadata": {"name": "a", "x": 1, "x": 2}}"#;
        let mut de = serde_json::Deserializer::from_str(twice);
        let e = Keep::items_of(&[Kind::Pod])
            .deserialize(&mut de)
            .expect_err("a duplicate key");
        assert!(e.to_string().contains("duplicate key \"x\""), "{e}");
    }
}

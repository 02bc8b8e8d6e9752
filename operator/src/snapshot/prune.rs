//! Reading a List's items of one kind, only the fields the planner reads are built as JSON
//! values; the rest (a pod's containers, statuses, managedFields) is skipped as it is parsed,
//! never allocated. What is built is read strictly (duplicate keys refused), as every object.

use std::borrow::Cow;
use std::marker::PhantomData;

use rocefabric_api::constants::{REGION_ANNOTATION, REGION_SIZE_ANNOTATION};
use rocefabric_input::yaml::Strict;
use serde::Deserialize;
use serde::de::{
    self, DeserializeSeed, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
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
    /// Each item of a list, kept so (a value of another type is built whole).
    Each(&'static Keep),
}

use Keep::{All, Each, Fields};

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

/// Of a container's state: whether it runs, and a termination message (is it the data plane's
/// window failure?).
const CONTAINER_STATE: Keep = Fields(&[
    ("running", All),
    ("terminated", Fields(&[("message", All)])),
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
    (
        "status",
        Fields(&[
            ("phase", All),
            ("podIP", All),
            (
                "containerStatuses",
                Each(&Fields(&[
                    ("state", CONTAINER_STATE),
                    ("lastState", CONTAINER_STATE),
                ])),
            ),
        ]),
    ),
]);

/// What [`crate::objects::CompactNode`] reads.
const NODE: Keep = Fields(&[("apiVersion", All), ("kind", All), ("metadata", METADATA)]);

impl Keep {
    /// What to build of the items of a file that holds only `accept` (as [`Items`] says it).
    pub(super) fn items_of(accept: &[Kind]) -> &'static Keep {
        match accept {
            [Kind::Pod] => Pods::KEEP,
            [Kind::Node] => Nodes::KEEP,
            _ => Whole::KEEP,
        }
    }
}

/// What is built of each item of a JSON List, as a type: serde_json's stream reader, which says
/// where each item ends, builds types, not seeds.
pub(super) trait Items {
    const KEEP: &'static Keep;
}

/// A pod list's items ([`POD`]).
pub(super) struct Pods;
/// A node list's items ([`NODE`]).
pub(super) struct Nodes;
/// Items built whole.
pub(super) struct Whole;

impl Items for Pods {
    const KEEP: &'static Keep = &POD;
}

impl Items for Nodes {
    const KEEP: &'static Keep = &NODE;
}

impl Items for Whole {
    const KEEP: &'static Keep = &All;
}

/// An item as `K` builds it.
pub(super) struct Built<K>(pub(super) Value, PhantomData<K>);

impl<'de, K: Items> Deserialize<'de> for Built<K> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        K::KEEP.deserialize(d).map(|v| Built(v, PhantomData))
    }
}

impl<'de> DeserializeSeed<'de> for &'static Keep {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self {
            All => Strict.deserialize(d),
            Fields(_) | Each(_) => d.deserialize_any(Pruned(self)),
        }
    }
}

/// A key of an object: borrowed from the input where it can be (a JSON key without escapes:
/// most are skipped, and need no copy); a YAML key that is no string, as [`Strict`] reads it.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        strict(())
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        strict(())
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Ok(Cow::Owned(Strict.deserialize(d)?.to_string()))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        strict(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        strict(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        strict(v)
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Self::Value, E> {
        strict(v)
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Self::Value, E> {
        strict(v)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        strict(v)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let v = Strict.deserialize(de::value::SeqAccessDeserializer::new(seq))?;
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let v = Strict.deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(Cow::Owned(v.to_string()))
    }
}

/// A key that is no string, as [`Strict`] reads it (its JSON text).
fn strict<'de, E: de::Error>(v: impl IntoDeserializer<'de, E>) -> Result<Cow<'de, str>, E> {
    Ok(Cow::Owned(
        Strict.deserialize(v.into_deserializer())?.to_string(),
    ))
}

/// An object or a list kept as its [`Keep`] says; a value of another shape is built whole, for
/// the typed read to refuse.
struct Pruned(&'static Keep);

impl<'de> Visitor<'de> for Pruned {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Each(_) => "a list",
            _ => "an object",
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Fields(fields) = self.0 else {
            return Strict.deserialize(de::value::MapAccessDeserializer::new(map));
        };
        let mut out = Map::new();
        let mut seen: Vec<Cow<'de, str>> = Vec::new();
        while let Some(key) = map.next_key_seed(Key)? {
            if seen.contains(&key) {
                return Err(de::Error::custom(format!(
                    "duplicate key \"{}\"",
                    rocefabric_input::shown::shown_within(&key, 1024)
                )));
            }
            match fields.iter().find(|(k, _)| *k == key) {
                Some((_, keep)) => {
                    let value = map.next_value_seed(keep)?;
                    out.insert(key.to_string(), value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            seen.push(key);
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let item: &'static Keep = match self.0 {
            Each(item) => item,
            _ => &All,
        };
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(item)? {
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
        let statuses = r#"{"kind": "Pod", "status": {"phase": "Running", "containerStatuses": [
            {"name": "c", "image": "i", "imageID": "sha256:...", "ready": false,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"exitCode": 1, "message": "m", "reason": "Error"}}}]}}"#;
        let mut de = serde_json::Deserializer::from_str(statuses);
        let v = Keep::items_of(&[Kind::Pod])
            .deserialize(&mut de)
            .expect("a pod");
        assert_eq!(
            v,
            serde_json::json!({"kind": "Pod", "status": {"phase": "Running", "containerStatuses": [
                {"state": {}, "lastState": {"terminated": {"message": "m"}}}]}}),
            "of container statuses, only whether each runs and its termination messages"
        );
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
        // A key with an escape is read (not borrowed) and matched all the same.
        let escaped = r#"{"kind": "Pod", "meta\u0064ata": {"name": "a", "uid": "u"}}"#;
        let mut de = serde_json::Deserializer::from_str(escaped);
        let v = Keep::items_of(&[Kind::Pod])
            .deserialize(&mut de)
            .expect("a pod");
        assert_eq!(v["metadata"]["uid"], "u");
        let twice = r#"{"kind": "Pod", "metadata": {"name": "a", "x": 1, "x": 2}}"#;
        let mut de = serde_json::Deserializer::from_str(twice);
        let e = Keep::items_of(&[Kind::Pod])
            .deserialize(&mut de)
            .expect_err("a duplicate key");
        assert!(e.to_string().contains("duplicate key \"x\""), "{e}");
    }

    #[test]
    fn yaml_keys_that_are_no_strings_are_read_as_their_text() {
        let read = |text: &str| {
            let doc = yaml_serde::Deserializer::from_str(text)
                .next()
                .expect("a document");
            Keep::items_of(&[Kind::Pod]).deserialize(doc)
        };
        let v = read("kind: Pod\n1: x\n[a]: y\nmetadata: {name: a}\n").expect("a pod");
        assert_eq!(
            v,
            serde_json::json!({"kind": "Pod", "metadata": {"name": "a"}})
        );
        let e = read("kind: Pod\nmetadata: {name: a}\n1: x\n1.0: y\ntrue: z\n\"1\": w\n")
            .expect_err("`1` twice");
        assert!(e.to_string().contains("duplicate key \"1\""), "{e}");
    }
}

//! Objects the operator writes (RoceFabrics, RoceNodes, ConfigMaps, Leases, Events), kept as
//! their JSON text and labels, with the write semantics the operator relies on: create,
//! replace with a resourceVersion check, server-side apply (the applied top-level fields
//! replace the stored ones; labels and annotations merge), merge and JSON patches with
//! preconditions, and delete. A write that changes nothing keeps the resourceVersion and sends
//! no watch event, as the API server does.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::Method;
use serde_json::{Value, json};

use super::failure::Failure;
use super::resource::Resource;

/// Labels of an object, shared between the store and the scale server's change log.
pub type Labels = Arc<BTreeMap<String, String>>;

/// One stored object.
#[derive(Clone, Debug)]
pub struct Stored {
    pub rv: u64,
    pub labels: Labels,
    pub json: Arc<str>,
}

/// (resource, namespace or "", name)
pub type Key = (Resource, String, String);

/// The store.
#[derive(Debug, Default)]
pub struct Store {
    map: BTreeMap<Key, Stored>,
}

/// How a write wants to change an object.
#[derive(Debug)]
pub enum Write {
    Create(Value),
    Replace(Value),
    Apply { body: Value, status: bool },
    Merge(Value),
    JsonPatch(Value),
}

impl Write {
    /// The write a request asks for, by its method and content type (`status`: a write to the
    /// status subresource). A delete is no write of this kind.
    pub fn of_request(
        method: &Method,
        content_type: &str,
        status: bool,
        body: Value,
    ) -> Result<Write, Failure> {
        Ok(match (method, content_type) {
            (&Method::POST, _) => Write::Create(body),
            (&Method::PUT, _) => Write::Replace(body),
            (&Method::PATCH, ct) if ct.contains("apply-patch") => Write::Apply { body, status },
            (&Method::PATCH, ct) if ct.contains("json-patch") => Write::JsonPatch(body),
            // Strategic merge acts as a merge patch on the objects stored here.
            (&Method::PATCH, _) => Write::Merge(body),
            _ => return Err(Failure::new(405, "MethodNotAllowed", method.as_str())),
        })
    }
}

/// What a write did: the object before and after (`None` when absent).
#[derive(Debug)]
pub struct Outcome {
    pub before: Option<Stored>,
    pub after: Value,
    pub created: bool,
}

pub fn labels_of(obj: &Value) -> Labels {
    Arc::new(
        obj["metadata"]["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// Server-side apply, close enough for one field manager: the applied fields replace the
/// stored ones, except labels and annotations, which merge.
fn apply(obj: &mut Value, body: &Value, status: bool) {
    if status {
        obj["status"] = body["status"].clone();
        return;
    }
    for (k, v) in body.as_object().into_iter().flatten() {
        match k.as_str() {
            "metadata" => {
                for (mk, mv) in v.as_object().into_iter().flatten() {
                    match mk.as_str() {
                        "labels" | "annotations" => json_patch::merge(&mut obj["metadata"][mk], mv),
                        "name" | "namespace" => {}
                        _ => obj["metadata"][mk] = mv.clone(),
                    }
                }
            }
            // A status in an apply of the main resource is ignored, as for CRDs with a
            // status subresource.
            "status" => {}
            _ => obj[k] = v.clone(),
        }
    }
}

/// The managedFields a real API server keeps on a RoceNode: one entry for the operator's
/// server-side apply (labels, owner reference, spec) and one for the node agent's status.
fn roce_node_managed_fields() -> Value {
    let time = "2026-01-03T00:00:00Z";
    json!([
        {"manager": "rocefabric-operator", "operation": "Apply", "apiVersion": "rocefabric.io/v1alpha1",
         "time": time, "fieldsType": "FieldsV1", "fieldsV1": {
            "f:metadata": {"f:labels": {"f:rocefabric.io/fabric": {}},
                "f:ownerReferences": {"k:{\"uid\":\"fabric\"}": {}}},
            "f:spec": {"f:fabric": {}, "f:fabricGeneration": {}, "f:pending": {}, "f:nics": {},
                "f:qos": {"f:trust": {}, "f:roceDscp": {}, "f:rocePriority": {},
                    "f:pfcPriorities": {}, "f:ecn": {"f:enabled": {}, "f:priorities": {}},
                    "f:cnp": {"f:dscp": {}, "f:priority": {}}, "f:mtu": {}}}}},
        {"manager": "rocefabric-node", "operation": "Update", "apiVersion": "rocefabric.io/v1alpha1",
         "time": time, "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {
            "f:status": {"f:observedGeneration": {}, "f:appliedGeneration": {},
                "f:conditions": {".": {}, "k:{\"type\":\"Applied\"}": {".": {},
                    "f:lastTransitionTime": {}, "f:message": {}, "f:observedGeneration": {},
                    "f:reason": {}, "f:status": {}, "f:type": {}}}}}}
    ])
}

/// The 409 of a failed precondition.
fn check_preconditions(current: &Value, patch_meta: &Value) -> Result<(), Failure> {
    for field in ["uid", "resourceVersion"] {
        if let Some(want) = patch_meta.get(field)
            && *want != current["metadata"][field]
        {
            return Err(Failure::conflict(&format!(
                "precondition failed: {field} is {}, not {want}",
                current["metadata"][field]
            )));
        }
    }
    Ok(())
}

impl Store {
    pub fn get(&self, key: &Key) -> Option<&Stored> {
        self.map.get(key)
    }

    /// Objects of `resource` (in `namespace` when given) after `after`, in key order.
    pub fn iter_from<'a>(
        &'a self,
        resource: Resource,
        namespace: Option<&'a str>,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = (&'a Key, &'a Stored)> + 'a {
        let start = match after {
            Some((ns, name)) => std::ops::Bound::Excluded((resource, ns, name)),
            None => std::ops::Bound::Included((resource, String::new(), String::new())),
        };
        self.map
            .range((start, std::ops::Bound::Unbounded))
            .take_while(move |(k, _)| k.0 == resource)
            .filter(move |(k, _)| namespace.is_none_or(|ns| k.1 == ns))
    }

    /// Count of `resource` objects.
    pub fn count(&self, resource: Resource) -> usize {
        self.iter_from(resource, None, None).count()
    }

    /// Apply `write` to `key` at resourceVersion `rv` (taken only when something changes).
    pub fn write(&mut self, key: &Key, write: Write, rv: u64) -> Result<Option<Outcome>, Failure> {
        let before = self.map.get(key).cloned();
        let current: Option<Value> = match &before {
            Some(s) => Some(serde_json::from_str(&s.json).map_err(Failure::internal)?),
            None => None,
        };
        let mut created = false;
        let mut obj = match (write, current) {
            (Write::Create(_), Some(_)) => {
                return Err(Failure::new(409, "AlreadyExists", "already exists"));
            }
            (Write::Create(body), None) => {
                created = true;
                body
            }
            (
                Write::Apply {
                    status: false,
                    body,
                },
                None,
            ) => {
                created = true;
                body
            }
            (_, None) => return Err(Failure::not_found(&key.2)),
            (Write::Replace(body), Some(cur)) => {
                check_preconditions(
                    &cur,
                    &json!({"resourceVersion": body["metadata"]["resourceVersion"]}),
                )?;
                let mut body = body;
                for field in ["uid", "creationTimestamp", "generation"] {
                    body["metadata"][field] = cur["metadata"][field].clone();
                }
                body
            }
            (Write::Apply { body, status }, Some(mut cur)) => {
                apply(&mut cur, &body, status);
                cur
            }
            (Write::Merge(patch), Some(mut cur)) => {
                check_preconditions(&cur, &patch["metadata"])?;
                json_patch::merge(&mut cur, &patch);
                cur
            }
            (Write::JsonPatch(ops), Some(mut cur)) => {
                let ops: json_patch::Patch = serde_json::from_value(ops)
                    .map_err(|e| Failure::new(400, "BadRequest", &e.to_string()))?;
                json_patch::patch(&mut cur, &ops)
                    .map_err(|e| Failure::new(422, "Invalid", &e.to_string()))?;
                cur
            }
        };
        let (group_kind_ok, namespaced) = (obj.is_object(), !key.1.is_empty());
        if !group_kind_ok {
            return Err(Failure::new(400, "BadRequest", "the body is not an object"));
        }
        obj["apiVersion"] = json!(key.0.api_version());
        obj["kind"] = json!(key.0.kind());
        obj["metadata"]["name"] = json!(key.2);
        if namespaced {
            obj["metadata"]["namespace"] = json!(key.1);
        }
        if key.0 == Resource::RoceNodes {
            // As a real API server records them: the operator's apply and the agent's status.
            obj["metadata"]["managedFields"] = roce_node_managed_fields();
        }
        if created {
            obj["metadata"]["uid"] = json!(format!("{:08x}-0000-4000-8000-{rv:012x}", 5));
            obj["metadata"]["creationTimestamp"] = json!("2026-01-03T00:00:00Z");
            obj["metadata"]["generation"] = json!(1);
        } else if let Some(cur) = &before {
            let cur: Value = serde_json::from_str(&cur.json).map_err(Failure::internal)?;
            // Same rv as stored: a write that changes nothing is no write.
            obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
            if obj == cur {
                return Ok(None);
            }
            if obj.get("spec") != cur.get("spec") {
                let generation = cur["metadata"]["generation"].as_i64().unwrap_or(1);
                obj["metadata"]["generation"] = json!(generation + 1);
            }
        }
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let stored = Stored {
            rv,
            labels: labels_of(&obj),
            json: obj.to_string().into(),
        };
        self.map.insert(key.clone(), stored);
        Ok(Some(Outcome {
            before,
            after: obj,
            created,
        }))
    }

    /// Set a stored object's whole JSON (the simulated node agents' status writes).
    pub fn put(&mut self, key: &Key, mut obj: Value, rv: u64) -> Stored {
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let stored = Stored {
            rv,
            labels: labels_of(&obj),
            json: obj.to_string().into(),
        };
        self.map.insert(key.clone(), stored.clone());
        stored
    }

    pub fn remove(&mut self, key: &Key) -> Option<Stored> {
        self.map.remove(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        (Resource::RoceNodes, String::new(), name.to_string())
    }

    #[test]
    fn apply_creates_then_replaces_spec_merges_labels_and_a_no_op_is_no_write() {
        let mut o = Store::default();
        let body =
            json!({"metadata": {"name": "n", "labels": {"a": "1"}}, "spec": {"x": 1, "y": 2}});
        let out = o
            .write(
                &key("n"),
                Write::Apply {
                    body,
                    status: false,
                },
                10,
            )
            .unwrap()
            .unwrap();
        assert!(out.created);
        assert_eq!(out.after["metadata"]["generation"], 1);
        let body = json!({"metadata": {"labels": {"b": "2"}}, "spec": {"x": 3}});
        let out = o
            .write(
                &key("n"),
                Write::Apply {
                    body: body.clone(),
                    status: false,
                },
                11,
            )
            .unwrap()
            .unwrap();
        assert_eq!(out.after["spec"], json!({"x": 3}));
        assert_eq!(out.after["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(out.after["metadata"]["generation"], 2);
        assert_eq!(out.after["metadata"]["resourceVersion"], "11");
        assert!(
            o.write(
                &key("n"),
                Write::Apply {
                    body,
                    status: false
                },
                12
            )
            .unwrap()
            .is_none()
        );
        assert_eq!(o.get(&key("n")).unwrap().rv, 11);
    }

    #[test]
    fn replace_and_merge_check_their_preconditions() {
        let mut o = Store::default();
        o.write(&key("l"), Write::Create(json!({"spec": {"h": "a"}})), 5)
            .unwrap();
        let stale = json!({"metadata": {"resourceVersion": "4"}, "spec": {"h": "b"}});
        let err = o.write(&key("l"), Write::Replace(stale), 6).unwrap_err();
        assert_eq!(err.code, 409);
        let fresh = json!({"metadata": {"resourceVersion": "5"}, "spec": {"h": "b"}});
        o.write(&key("l"), Write::Replace(fresh), 6)
            .unwrap()
            .unwrap();
        let err = o
            .write(
                &key("l"),
                Write::Merge(json!({"metadata": {"resourceVersion": "5"}})),
                7,
            )
            .unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(
            o.write(&key("x"), Write::Merge(json!({})), 7)
                .unwrap_err()
                .code,
            404
        );
    }
}

//! Generated pods and nodes: one small state record each (see [`crate::scale::cluster`] for the rest),
//! and the pod writes the operator sends: a merge patch of annotations or labels with `uid` and
//! `resourceVersion` preconditions, and the JSON patch that tests and removes the region
//! scheduling gate.

use serde_json::Value;

use crate::api::failure::Failure;
use crate::scale::cluster::{self, Changed, GeneratedCluster, NodeState, PodState};
use rocefabric_api::constants::{REGION_ANNOTATION, REGION_SCHEDULING_GATE};

/// Every pod ever made, by index (deleted ones stay, marked).
#[derive(Debug, Default)]
pub struct Pods {
    pub states: Vec<PodState>,
}

/// Every node, by index.
#[derive(Debug, Default)]
pub struct Nodes {
    pub states: Vec<NodeState>,
}

impl Pods {
    /// The index of the live pod `namespace/name`.
    pub fn find(&self, cluster: &GeneratedCluster, namespace: &str, name: &str) -> Option<u32> {
        let i = GeneratedCluster::pod_index(name)?;
        let st = self.states.get(i as usize)?;
        (!st.deleted && cluster.pod_name(i, st.fabric) == name && cluster.namespace(i) == namespace)
            .then_some(i)
    }
}

fn unsupported(what: &str) -> Failure {
    Failure::new(
        422,
        "Invalid",
        &format!("the scale API server does not support {what} on generated objects"),
    )
}

/// `{key: value-or-null}` into overrides.
fn overrides(into: &mut cluster::Overrides, map: &Value) -> Result<(), Failure> {
    for (k, v) in map.as_object().into_iter().flatten() {
        let v = match v {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            _ => return Err(unsupported("non-string label or annotation values")),
        };
        cluster::set_override(into, k, v.as_deref());
    }
    Ok(())
}

fn check(field: &str, want: &Value, have: &str) -> Result<(), Failure> {
    match want {
        Value::Null => Ok(()),
        Value::String(s) if s == have => Ok(()),
        _ => Err(Failure::conflict(&format!(
            "precondition failed: {field} is {have:?}, not {want}"
        ))),
    }
}

/// A JSON merge patch of a pod's metadata: preconditions, then annotations and labels.
pub fn merge_patch(st: &mut PodState, uid: &str, patch: &Value) -> Result<(), Failure> {
    let Some(top) = patch.as_object() else {
        return Err(unsupported("a patch that is not an object"));
    };
    if top.keys().any(|k| k != "metadata") {
        return Err(unsupported("patches beyond metadata"));
    }
    let meta = &patch["metadata"];
    check("uid", &meta["uid"], uid)?;
    check(
        "resourceVersion",
        &meta["resourceVersion"],
        &st.rv.to_string(),
    )?;
    for (k, v) in meta.as_object().into_iter().flatten() {
        match k.as_str() {
            "uid" | "resourceVersion" => {}
            "annotations" => {
                let mut rest = v.clone();
                if let Some(region) = rest
                    .as_object_mut()
                    .and_then(|m| m.remove(REGION_ANNOTATION))
                {
                    st.region = match region {
                        Value::String(s) => Some(s.into()),
                        Value::Null => None,
                        _ => return Err(unsupported("a non-string region annotation")),
                    };
                }
                let changed = st.changed.get_or_insert_with(Box::<Changed>::default);
                overrides(&mut changed.annotations, &rest)?;
            }
            "labels" => {
                let changed = st.changed.get_or_insert_with(Box::<Changed>::default);
                overrides(&mut changed.labels, v)?;
            }
            other => return Err(unsupported(&format!("patching metadata.{other}"))),
        }
    }
    Ok(())
}

/// A JSON patch of the scheduling gates: `test` the pod's uid (`uid` is the pod's) or a gate's
/// name, `remove` a gate. A generated pod carries at most the region gate, at index 0.
pub fn json_patch(st: &mut PodState, uid: &str, ops: &Value) -> Result<(), Failure> {
    let mut gated = st.gated;
    for op in ops.as_array().into_iter().flatten() {
        let path = op["path"].as_str().unwrap_or_default();
        if path == "/metadata/uid" && op["op"] == "test" {
            if op["value"] != uid {
                return Err(Failure::new(422, "Invalid", "testing /metadata/uid failed"));
            }
            continue;
        }
        let index = path
            .strip_prefix("/spec/schedulingGates/")
            .map(|rest| rest.trim_end_matches("/name"))
            .and_then(|i| i.parse::<usize>().ok())
            .ok_or_else(|| unsupported(&format!("JSON patch path {path:?}")))?;
        let present = gated && index == 0;
        match op["op"].as_str() {
            Some("test") if path.ends_with("/name") => {
                if !(present && op["value"] == REGION_SCHEDULING_GATE) {
                    return Err(Failure::new(
                        422,
                        "Invalid",
                        &format!("testing {path} failed"),
                    ));
                }
            }
            Some("remove") if !path.ends_with("/name") => {
                if !present {
                    return Err(Failure::new(
                        422,
                        "Invalid",
                        &format!("no {path} to remove"),
                    ));
                }
                gated = false;
            }
            _ => return Err(unsupported(&format!("JSON patch op {op}"))),
        }
    }
    st.gated = gated;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gated() -> PodState {
        PodState {
            rv: 7,
            gated: true,
            fabric: true,
            ..PodState::default()
        }
    }

    #[test]
    fn the_region_annotation_needs_the_planned_uid_and_resource_version() {
        let mut st = gated();
        let patch = |rv: &str| {
            json!({"metadata": {"uid": "u", "resourceVersion": rv,
            "annotations": {REGION_ANNOTATION: "{\"id\":1}"}}})
        };
        assert_eq!(
            merge_patch(&mut st, "u", &patch("6")).unwrap_err().code,
            409
        );
        assert_eq!(
            merge_patch(&mut st, "other", &patch("7")).unwrap_err().code,
            409
        );
        merge_patch(&mut st, "u", &patch("7")).unwrap();
        assert_eq!(st.region.as_deref(), Some("{\"id\":1}"));
        let labels = json!({"metadata": {"labels": {"a": "b"}}});
        merge_patch(&mut st, "u", &labels).unwrap();
        assert_eq!(
            st.changed.unwrap().labels,
            [("a".to_string(), Some("b".to_string()))]
        );
    }

    #[test]
    fn the_gate_is_removed_only_where_the_test_holds() {
        let ops = json!([
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": REGION_SCHEDULING_GATE},
            {"op": "remove", "path": "/spec/schedulingGates/0"},
        ]);
        let mut st = gated();
        json_patch(&mut st, "u", &ops).unwrap();
        assert!(!st.gated);
        assert_eq!(json_patch(&mut st, "u", &ops).unwrap_err().code, 422);
        let wrong = json!([{"op": "test", "path": "/spec/schedulingGates/1/name", "value": REGION_SCHEDULING_GATE}]);
        assert_eq!(json_patch(&mut gated(), "u", &wrong).unwrap_err().code, 422);
        // Another pod under the same name: its uid fails the test and it keeps its gate.
        let bound = json!([
            {"op": "test", "path": "/metadata/uid", "value": "u"},
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": REGION_SCHEDULING_GATE},
            {"op": "remove", "path": "/spec/schedulingGates/0"},
        ]);
        let mut other = gated();
        assert_eq!(json_patch(&mut other, "u2", &bound).unwrap_err().code, 422);
        assert!(other.gated);
        let mut same = gated();
        json_patch(&mut same, "u", &bound).unwrap();
        assert!(!same.gated);
    }
}

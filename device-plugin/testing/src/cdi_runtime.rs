//! What the kubelet and a CDI-enabled container runtime make of a DRA driver's answers and CDI
//! specs, done the way they do it, so a test can say what each container ends up with:
//!
//! - the kubelet (its DRA manager's `GetResources`): for each entry of a container's
//!   `resources.claims`, the CDI ids of the claim's answered devices whose request names contain
//!   the entry's request, or of all of them for an entry naming no request (a device with no
//!   request names goes to every entry), in the answer's order;
//! - the runtime (the CDI cache's `InjectDevices`): for each id in that order, its spec's own
//!   edits the first time the spec is met, then the device's edits. A variable set again replaces
//!   the earlier value (nothing is appended); a device node set again stays one node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rocefabric_kubelet_api::pb_dra_v1::Device;
use serde_json::Value;

/// One entry of a container's `resources.claims`: the devices its claim was prepared with (the
/// driver's answer), and the request it names (`None`: the whole claim).
#[derive(Clone, Copy, Debug)]
pub struct ClaimEntry<'a> {
    pub devices: &'a [Device],
    pub request: Option<&'a str>,
}

/// The CDI ids the kubelet hands the runtime for a container with `entries` (in the pod's claim
/// order).
pub fn cdi_ids(entries: &[ClaimEntry<'_>]) -> Vec<String> {
    let mut out = Vec::new();
    for entry in entries {
        for device in entry.devices {
            let wanted = match entry.request {
                None => true,
                Some(request) => {
                    device.request_names.is_empty()
                        || device.request_names.iter().any(|r| r == request)
                }
            };
            if wanted {
                out.extend(device.cdi_device_ids.iter().cloned());
            }
        }
    }
    out
}

/// What the runtime put into a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub env: BTreeMap<String, String>,
    /// Container path -> host path.
    pub device_nodes: BTreeMap<String, String>,
}

impl Injected {
    /// A variable's value split at commas, `NCCL_IB_HCA`'s leading `=` (exact match) dropped;
    /// empty when unset.
    pub fn list(&self, name: &str) -> BTreeSet<String> {
        self.env
            .get(name)
            .map(|v| {
                v.trim_start_matches('=')
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn apply(&mut self, edits: &Value) {
        for kv in edits["env"].as_array().into_iter().flatten() {
            if let Some((k, v)) = kv.as_str().and_then(|kv| kv.split_once('=')) {
                self.env.insert(k.to_string(), v.to_string());
            }
        }
        for node in edits["deviceNodes"].as_array().into_iter().flatten() {
            if let Some(path) = node["path"].as_str() {
                let host = node["hostPath"].as_str().unwrap_or(path);
                self.device_nodes.insert(path.to_string(), host.to_string());
            }
        }
    }
}

/// Why CDI ids cannot be injected (the runtime refuses to create the container).
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("unresolvable CDI device {0}")]
    Unresolved(String),
    #[error("CDI device {0} is defined by two specs")]
    Conflict(String),
    #[error("failed to read CDI spec {path}: {reason}")]
    Spec { path: PathBuf, reason: String },
}

/// Inject `ids` from `specs` (CDI spec files as JSON) into an empty container.
pub fn inject(specs: &[Value], ids: &[String]) -> Result<Injected, CdiError> {
    let mut devices: BTreeMap<String, (usize, &Value)> = BTreeMap::new();
    for (i, spec) in specs.iter().enumerate() {
        let kind = spec["kind"].as_str().unwrap_or_default();
        for device in spec["devices"].as_array().into_iter().flatten() {
            let id = format!("{kind}={}", device["name"].as_str().unwrap_or_default());
            if devices.insert(id.clone(), (i, device)).is_some() {
                return Err(CdiError::Conflict(id));
            }
        }
    }
    let mut out = Injected::default();
    let mut seen = BTreeSet::new();
    for id in ids {
        let (spec, device) = devices
            .get(id)
            .ok_or_else(|| CdiError::Unresolved(id.clone()))?;
        if seen.insert(*spec) {
            out.apply(&specs[*spec]["containerEdits"]);
        }
        out.apply(&device["containerEdits"]);
    }
    Ok(out)
}

/// Every `*.json` spec in a CDI directory.
pub fn specs_in(dir: &Path) -> Result<Vec<Value>, CdiError> {
    let failed = |path: &Path, reason: String| CdiError::Spec {
        path: path.to_path_buf(),
        reason,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| failed(dir, e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(|e| failed(path, e.to_string()))?;
            serde_json::from_str(&text).map_err(|e| failed(path, e.to_string()))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use serde_json::json;

    fn device(requests: &[&str], ids: &[&str]) -> Device {
        Device {
            request_names: requests.iter().map(|r| r.to_string()).collect(),
            pool_name: "node".into(),
            device_name: "d".into(),
            cdi_device_ids: ids.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn the_kubelet_picks_by_request_and_the_runtime_lets_the_later_variable_win() {
        let answer = vec![
            device(&["a"], &["k/x=a"]),
            device(&["b"], &["k/x=b"]),
            device(&[], &["k/x=all"]),
        ];
        let entry = |request| ClaimEntry {
            devices: &answer,
            request,
        };
        assert_eq!(cdi_ids(&[entry(Some("a"))]), ["k/x=a", "k/x=all"]);
        assert_eq!(
            cdi_ids(&[entry(None)]),
            ["k/x=a", "k/x=b", "k/x=all"],
            "the whole claim: every device, in the answer's order"
        );
        let spec = json!({"kind": "k/x", "containerEdits": {"env": ["S=1", "V=spec"]}, "devices": [
            {"name": "a", "containerEdits": {"env": ["V=a"], "deviceNodes": [{"path": "/dev/a"}]}},
            {"name": "b", "containerEdits": {"env": ["V=b"], "deviceNodes": [{"path": "/dev/b", "hostPath": "/host/b"}]}},
        ]});
        let got = inject(
            std::slice::from_ref(&spec),
            &["k/x=b".into(), "k/x=a".into()],
        )
        .unwrap();
        assert_eq!(got.env["V"], "a", "the later device wins");
        assert_eq!(got.env["S"], "1", "the spec's own edits, once");
        assert_eq!(got.device_nodes["/dev/b"], "/host/b");
        assert_eq!(got.device_nodes.len(), 2);
        let err = inject(std::slice::from_ref(&spec), &["k/x=c".into()]).unwrap_err();
        assert_eq!(err.to_string(), "unresolvable CDI device k/x=c");
        let err = inject(&[spec.clone(), spec], &[]).unwrap_err();
        assert!(matches!(err, CdiError::Conflict(_)), "{err}");
    }
}

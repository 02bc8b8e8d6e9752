//! Every manifest under `examples/` parses into the Rust types, survives a round trip, and passes
//! the schema and CEL rules the API server would apply.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rocefabric_api::constants::FABRIC_LABEL;
use rocefabric_api::{RoceFabric, validate};
use serde::Deserialize;

/// The data plane's rendezvous port (`rocefabric-dsm`'s default).
const RENDEZVOUS_PORT: i32 = 18516;

/// Whether a NetworkPolicy port entry admits TCP to the rendezvous port.
fn admits_rendezvous(p: &NetworkPolicyPort) -> bool {
    let tcp = p.protocol.as_deref().unwrap_or("TCP") == "TCP";
    let port = match &p.port {
        None => true,
        Some(IntOrString::Int(first)) => {
            (*first..=p.end_port.unwrap_or(*first)).contains(&RENDEZVOUS_PORT)
        }
        Some(IntOrString::String(_)) => true,
    };
    tcp && port
}

/// A NetworkPolicy example confines the rendezvous port to the pods of the fabric it selects: every
/// ingress rule that admits it names only pods with that fabric label.
fn assert_confines_rendezvous(file: &Path, value: serde_json::Value) {
    let policy: NetworkPolicy =
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let spec = policy.spec.expect("spec");
    let fabric = spec
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
        .and_then(|l| l.get(FABRIC_LABEL))
        .unwrap_or_else(|| panic!("{}: selects a fabric's pods", file.display()))
        .clone();
    let mut rendezvous_rules = 0;
    for rule in spec.ingress.iter().flatten() {
        let ports = rule.ports.as_deref().unwrap_or_default();
        if !ports.is_empty() && !ports.iter().any(admits_rendezvous) {
            continue;
        }
        rendezvous_rules += 1;
        let from = rule.from.as_deref().unwrap_or_default();
        assert!(
            !from.is_empty()
                && from.iter().all(|peer| {
                    peer.ip_block.is_none()
                        && peer.namespace_selector.is_none()
                        && peer
                            .pod_selector
                            .as_ref()
                            .and_then(|s| s.match_labels.as_ref())
                            .and_then(|l| l.get(FABRIC_LABEL))
                            == Some(&fabric)
                }),
            "{}: a rule admits TCP {RENDEZVOUS_PORT} from outside fabric {fabric}: {rule:?}",
            file.display()
        );
    }
    assert!(
        rendezvous_rules > 0,
        "{}: admits the fabric's own pods",
        file.display()
    );
}

fn example_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/ exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples found in {}", dir.display());
    files
}

#[test]
fn every_example_parses_round_trips_and_validates() {
    let mut fabrics = 0;
    let mut pods = 0;
    for file in example_files() {
        let text = std::fs::read_to_string(&file).expect("readable example");
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(doc).expect("valid YAML");
            let kind = value["kind"].as_str().unwrap_or_default().to_string();
            match kind.as_str() {
                "RoceFabric" => {
                    let fabric: RoceFabric = serde_json::from_value(value.clone())
                        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                    let again: RoceFabric =
                        serde_json::from_value(serde_json::to_value(&fabric).expect("serializes"))
                            .expect("round trip");
                    assert_eq!(fabric.spec, again.spec, "{}", file.display());
                    assert_eq!(fabric.metadata, again.metadata);
                    validate::fabric_value(&value)
                        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                    fabric
                        .validate_cel()
                        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                    fabrics += 1;
                }
                "Pod" => {
                    let pod: Pod = serde_json::from_value(value).expect("a valid Pod");
                    let limits = pod.spec.expect("spec").containers[0]
                        .resources
                        .clone()
                        .and_then(|r| r.limits)
                        .unwrap_or_default();
                    assert!(limits.contains_key(rocefabric_api::constants::HCA_RESOURCE));
                    pods += 1;
                }
                "NetworkPolicy" => assert_confines_rendezvous(&file, value),
                other => panic!("{}: unexpected kind {other:?} in examples", file.display()),
            }
        }
    }
    assert!(fabrics >= 1, "examples must include a RoceFabric");
    assert!(pods >= 1, "examples must include a pod requesting rdma/hca");
}

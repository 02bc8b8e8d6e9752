//! Planned writes and API answers the executor's tests share (`shell_apply`, `shell_pass`).

use rocefabric_api::constants::REGION_ANNOTATION;
use rocefabric_api::{QosSpec, RoceNodeSpec};
use rocefabric_operator::controller::{Context, PassSummary, execute_all};
use rocefabric_operator::planner::writes::Write;
use serde_json::json;

/// The RoceNodes' collection path.
pub const ROCENODES: &str = "/apis/rocefabric.io/v1alpha1/rocenodes";

/// An apply of RoceNode `name` of fabric `dgx`.
pub fn roce_node_write(name: &str) -> Write {
    Write::ApplyRoceNode {
        name: name.into(),
        fabric_name: "dgx".into(),
        fabric_uid: "uid-dgx".into(),
        spec: RoceNodeSpec {
            fabric: "dgx".into(),
            fabric_generation: 2,
            qos: QosSpec::default().rendered(),
            ..RoceNodeSpec::default()
        },
    }
}

/// Pod `team/name` as the API server answers, with `gates` and, when `annotated`, a region.
pub fn pod_json(name: &str, gates: &[&str], annotated: bool) -> serde_json::Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"), "resourceVersion": "7"},
        "spec": {"containers": [], "schedulingGates": gates.iter().map(|g| json!({"name": g})).collect::<Vec<_>>()},
    });
    if annotated {
        pod["metadata"]["annotations"] = json!({ REGION_ANNOTATION: "{\"fabric\":\"dgx\",\"id\":0,\"base\":0,\"size\":1073741824}" });
    }
    pod
}

/// An annotation of `team/w0`, its gate, then an independent RoceNode delete.
pub fn annotate_gate_then_delete() -> Vec<Write> {
    vec![
        Write::AnnotatePodRegion {
            namespace: "team".into(),
            pod: "w0".into(),
            value: "{}".into(),
            uid: None,
            resource_version: None,
        },
        Write::RemovePodGate {
            namespace: "team".into(),
            pod: "w0".into(),
            remaining_gates: vec![],
        },
        Write::DeleteRoceNode { name: "n3".into() },
    ]
}

/// Run a pass's `writes` under `ctx` in a task; its summary once every write is done.
pub fn spawn_pass(ctx: Context, writes: Vec<Write>) -> tokio::task::JoinHandle<PassSummary> {
    tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(&ctx, &writes, &mut summary).await;
        summary
    })
}

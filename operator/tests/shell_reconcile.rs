//! Whole passes (`reconcile_once`: plan, then the writes in order) against the strict mock API
//! server: the exact requests of a first reconcile, of a steady state (none), of a node leaving
//! the selection, and of a fabric's deletion.

mod support;

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rocefabric_api::constants::REGION_SCHEDULING_GATE;
use rocefabric_operator::controller::{Context, PassSummary, reconcile_once};
use rocefabric_operator::metrics::Metrics;
use rocefabric_operator::planner::{PlanOptions, World, plan};
use rocefabric_operator_testing::objects::{fabric, node, now, pod, with_shared_memory};
use rocefabric_operator_testing::verifier::{ApiServerVerifier, MANAGED, SSA, mock_client};
use serde_json::json;
use support::{apply, world};

const ROCENODES: &str = "/apis/rocefabric.io/v1alpha1/rocenodes";
const STATUS: &str = "/apis/rocefabric.io/v1alpha1/rocefabrics/dgx/status";
const POD: &str = "/api/v1/namespaces/team/pods/w0";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// Fabric `dgx` (all nodes at once) over `n1`, `n2` (labelled) and `n3` (not), with a 4-region
/// space for pods labelled `app=train`, and one gated pod `team/w0` behind another gate.
fn first_world() -> World {
    // Created 100 s before `now()` (an hour after T0); the pod 10 s before.
    let mut f = fabric("dgx", 3500, &[("rdma", "true")]);
    f.spec.rollout.max_unavailable = IntOrString::String("100%".into());
    let f = with_shared_memory(f, "1Gi", 4, &[("app", "train")]);
    world(
        vec![f],
        vec![
            node("n1", &[("rdma", "true")]),
            node("n2", &[("rdma", "true")]),
            node("n3", &[]),
        ],
        vec![pod("team", "w0", 3590, &[("app", "train")], true)],
    )
}

/// The world as the API server holds it once every write of every pass succeeded.
fn converged(mut w: World) -> World {
    for _ in 0..3 {
        let p = plan(&w, &PlanOptions::default());
        apply(&mut w, &p);
    }
    assert!(
        plan(&w, &PlanOptions::default()).writes.is_empty(),
        "the planner converges"
    );
    w
}

fn pass(client: kube::Client, w: World) -> tokio::task::JoinHandle<PassSummary> {
    tokio::spawn(async move {
        let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
        reconcile_once(&ctx, &w).await
    })
}

fn ok_status() -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Success"})
}

fn fabric_reply() -> serde_json::Value {
    json!({"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric", "metadata": {"name": "dgx"}, "spec": {}})
}

async fn expect_roce_node_apply(api: &mut ApiServerVerifier, name: &str) {
    let call = api
        .expect(Method::PATCH, &format!("{ROCENODES}/{name}"), SSA)
        .await;
    assert_eq!(call.body["metadata"]["name"], name);
    assert_eq!(
        call.body["metadata"]["labels"]["rocefabric.io/fabric"],
        "dgx"
    );
    let owner = &call.body["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            &owner["kind"],
            &owner["name"],
            &owner["uid"],
            &owner["controller"]
        ),
        (
            &json!("RoceFabric"),
            &json!("dgx"),
            &json!("uid-dgx"),
            &json!(true)
        )
    );
    assert_eq!(call.body["spec"]["fabric"], "dgx");
    assert_eq!(call.body["spec"]["fabricGeneration"], 1);
    call.echo();
}

#[tokio::test(start_paused = true)]
async fn first_reconcile_applies_roce_nodes_regions_and_status_in_order() {
    let (client, mut api) = mock_client();
    let task = pass(client, first_world());

    expect_roce_node_apply(&mut api, "n1").await;
    expect_roce_node_apply(&mut api, "n2").await;

    let annotate = api.expect(Method::PATCH, POD, MANAGED).await;
    assert_eq!(
        annotate.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let region = annotate.body["metadata"]["annotations"]["rocefabric.io/region"]
        .as_str()
        .expect("annotation")
        .to_string();
    let parsed: serde_json::Value = serde_json::from_str(&region).expect("annotation is JSON");
    assert_eq!(
        parsed,
        json!({"fabric": "dgx", "id": 0, "base": 0, "size": 1_073_741_824u64,
               "uid": "uid-team-w0"}),
        "the window, bound to the pod it was written for"
    );
    assert_eq!(
        annotate.body["metadata"]["uid"], "uid-team-w0",
        "and the uid precondition"
    );
    let gated = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "w0", "namespace": "team", "annotations": {"rocefabric.io/region": region}},
        "spec": {"containers": [], "schedulingGates": [{"name": REGION_SCHEDULING_GATE}]}});
    annotate.ok(&gated);
    api.expect(Method::GET, POD, &[]).await.ok(&gated);
    let gate = api.expect(Method::PATCH, POD, MANAGED).await;
    assert_eq!(
        gate.content_type.as_deref(),
        Some("application/json-patch+json")
    );
    assert_eq!(
        gate.body[2],
        json!({"op": "remove", "path": "/spec/schedulingGates/0"})
    );
    gate.ok(&gated);

    // The namespace's fabric key before its directory: the pods mount both.
    let key = api
        .expect(Method::POST, "/api/v1/namespaces/team/secrets", MANAGED)
        .await;
    assert_eq!(key.body["metadata"]["name"], "dgx-key");
    key.echo();
    let dir = api
        .expect(
            Method::PATCH,
            "/api/v1/namespaces/team/configmaps/dgx-regions",
            SSA,
        )
        .await;
    assert_eq!(dir.body["metadata"]["ownerReferences"][0]["uid"], "uid-dgx");
    assert!(
        dir.body["data"]["regions.json"]
            .as_str()
            .expect("directory data")
            .contains("\"pod\":\"w0\"")
    );
    dir.echo();

    let status = api.expect(Method::PATCH, STATUS, SSA).await;
    assert_eq!(
        status.body["status"]["nodes"],
        json!({"selected": 2, "configured": 0, "failed": 0, "conflicting": 0})
    );
    assert_eq!(
        status.body["status"]["regions"],
        json!({"allocated": 1, "capacity": 4})
    );
    assert_eq!(status.body["status"]["trafficClass"], 106);
    status.ok(&fabric_reply());

    let event = api.expect(Method::POST, EVENTS, &[]).await;
    assert_eq!(event.body["reason"], "RolloutInProgress");
    assert_eq!(event.body["regarding"]["name"], "dgx");
    event.echo();

    api.assert_no_request(Duration::from_secs(5)).await;
    let summary = task.await.expect("pass ends");
    assert_eq!(
        (summary.done, summary.already_done, summary.failures.len()),
        (7, 0, 0)
    );
    assert!(summary.plan.writes.iter().all(|w| !matches!(w, rocefabric_operator::planner::Write::ApplyRoceNode { name, .. } if name == "n3")));
}

#[tokio::test(start_paused = true)]
async fn steady_state_sends_no_request() {
    let (client, mut api) = mock_client();
    let task = pass(client, converged(first_world()));
    api.assert_no_request(Duration::from_secs(10)).await;
    let summary = task.await.expect("pass ends");
    assert!(summary.plan.writes.is_empty());
    assert_eq!(summary.done, 0);
}

#[tokio::test(start_paused = true)]
async fn node_leaving_the_selection_loses_its_roce_node() {
    let (client, mut api) = mock_client();
    let mut w = converged(first_world());
    w.nodes[1].labels = Default::default(); // n2 no longer has rdma=true
    let task = pass(client, w);
    api.expect(Method::DELETE, &format!("{ROCENODES}/n2"), &[])
        .await
        .ok(&ok_status());
    let status = api.expect(Method::PATCH, STATUS, SSA).await;
    assert_eq!(status.body["status"]["nodes"]["selected"], 1);
    status.ok(&fabric_reply());
    api.assert_no_request(Duration::from_secs(5)).await;
    let summary = task.await.expect("pass ends");
    assert_eq!((summary.done, summary.failures.len()), (2, 0));
}

/// A deleted fabric (gone from the cache) leaves RoceNodes and a directory behind until the
/// garbage collector follows their owner references; the operator deletes them itself too, and
/// a 404 (the collector was first) counts as done.
#[tokio::test(start_paused = true)]
async fn deleted_fabric_has_its_roce_nodes_and_directory_deleted() {
    let (client, mut api) = mock_client();
    let mut w = converged(first_world());
    w.fabrics.clear();
    let task = pass(client, w);
    api.expect(Method::DELETE, &format!("{ROCENODES}/n1"), &[])
        .await
        .ok(&ok_status());
    api.expect(Method::DELETE, &format!("{ROCENODES}/n2"), &[])
        .await
        .fail(404, "NotFound");
    api.expect(
        Method::DELETE,
        "/api/v1/namespaces/team/configmaps/dgx-regions",
        &[],
    )
    .await
    .ok(&ok_status());
    api.assert_no_request(Duration::from_secs(5)).await;
    let summary = task.await.expect("pass ends");
    assert_eq!(
        (summary.done, summary.already_done, summary.failures.len()),
        (2, 1, 0)
    );
}

/// A fabric being deleted (foreground deletion: `deletionTimestamp` set while the garbage
/// collector removes its dependents) is left alone: no write at all.
#[tokio::test(start_paused = true)]
async fn fabric_being_deleted_is_left_to_the_garbage_collector() {
    let (client, mut api) = mock_client();
    let mut w = converged(first_world());
    w.fabrics[0].metadata.deletion_timestamp = Some(Time(now()));
    let task = pass(client, w);
    api.assert_no_request(Duration::from_secs(10)).await;
    assert!(task.await.expect("pass ends").plan.writes.is_empty());
}

//! The executor against the strict mock API server: the exact request each planned write sends.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::ObjectReference;
use rocefabric_api::constants::REGION_SCHEDULING_GATE;
use rocefabric_api::{NodeCounts, RoceFabricStatus};
use rocefabric_operator::apply::{ApplyError, Executor, Outcome};
use rocefabric_operator::controller::{Context, ReconcileError};
use rocefabric_operator::metrics::Metrics;
use rocefabric_operator::planner::writes::{Event, EventType, Write};
use rocefabric_operator_testing::verifier::{MANAGED, SSA, mock_client};
use serde_json::json;

mod support;
use support::writes::{
    ROCENODES, annotate_gate_then_delete, pod_json, roce_node_write, spawn_pass,
};

#[tokio::test(start_paused = true)]
async fn roce_node_is_server_side_applied_with_owner_and_label() {
    let (client, mut api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let task = tokio::spawn(async move { exec.execute(&roce_node_write("n1")).await });

    let call = api
        .expect(Method::PATCH, &format!("{ROCENODES}/n1"), SSA)
        .await;
    assert_eq!(
        call.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(call.body["apiVersion"], "rocefabric.io/v1alpha1");
    assert_eq!(call.body["kind"], "RoceNode");
    assert_eq!(call.body["metadata"]["name"], "n1");
    assert_eq!(
        call.body["metadata"]["labels"],
        json!({"rocefabric.io/fabric": "dgx"})
    );
    assert_eq!(
        call.body["metadata"]["ownerReferences"],
        json!([{"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric", "name": "dgx", "uid": "uid-dgx",
                "controller": true, "blockOwnerDeletion": true}])
    );
    assert_eq!(call.body["spec"]["fabric"], "dgx");
    assert_eq!(call.body["spec"]["fabricGeneration"], 2);
    assert_eq!(call.body["spec"]["qos"]["roceDscp"], 26);
    assert!(
        call.body.get("status").is_none(),
        "the operator never applies RoceNode status"
    );
    call.echo();
    assert_eq!(task.await.expect("joined").expect("applied"), Outcome::Done);
}

#[tokio::test(start_paused = true)]
async fn deleting_a_gone_roce_node_counts_as_done() {
    let (client, mut api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let task = tokio::spawn(async move {
        exec.execute(&Write::DeleteRoceNode { name: "n3".into() })
            .await
    });
    api.expect(Method::DELETE, &format!("{ROCENODES}/n3"), &[])
        .await
        .fail(404, "NotFound");
    assert_eq!(
        task.await.expect("joined").expect("no error"),
        Outcome::AlreadyDone
    );
}

#[tokio::test(start_paused = true)]
async fn fabric_status_is_applied_on_the_status_subresource() {
    let (client, mut api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let status = RoceFabricStatus {
        observed_generation: Some(2),
        nodes: NodeCounts {
            selected: 2,
            configured: 1,
            failed: 0,
            conflicting: 1,
        },
        traffic_class: Some(106),
        conflicting_nodes: vec!["n9".into()],
        ..RoceFabricStatus::default()
    };
    let write = Write::ApplyFabricStatus {
        fabric: "dgx".into(),
        status,
    };
    let task = tokio::spawn(async move { exec.execute(&write).await });
    let call = api
        .expect(
            Method::PATCH,
            "/apis/rocefabric.io/v1alpha1/rocefabrics/dgx/status",
            SSA,
        )
        .await;
    assert_eq!(
        call.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(call.body["apiVersion"], "rocefabric.io/v1alpha1");
    assert_eq!(call.body["kind"], "RoceFabric");
    assert_eq!(call.body["status"]["observedGeneration"], 2);
    assert_eq!(
        call.body["status"]["nodes"],
        json!({"selected": 2, "configured": 1, "failed": 0, "conflicting": 1})
    );
    assert_eq!(call.body["status"]["trafficClass"], 106);
    assert_eq!(call.body["status"]["conflictingNodes"], json!(["n9"]));
    assert!(
        call.body.get("spec").is_none(),
        "a status apply carries no spec"
    );
    call.ok(
        &json!({"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
                    "metadata": {"name": "dgx"}, "spec": {}}),
    );
    assert_eq!(task.await.expect("joined").expect("applied"), Outcome::Done);
}

#[tokio::test(start_paused = true)]
async fn annotation_is_patched_strictly_before_the_gate_which_is_removed_by_tested_index() {
    let (client, mut api) = mock_client();
    let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    let value = "{\"fabric\":\"dgx\",\"id\":0,\"base\":0,\"size\":1073741824}".to_string();
    let writes = vec![
        Write::AnnotatePodRegion {
            namespace: "team".into(),
            pod: "w0".into(),
            value: value.clone(),
            uid: Some("uid-w0".into()),
            resource_version: Some("41".into()),
        },
        Write::RemovePodGate {
            namespace: "team".into(),
            pod: "w0".into(),
            remaining_gates: vec!["example.com/quota".into()],
        },
    ];
    let task = spawn_pass(ctx, writes);

    let annotate = api
        .expect(Method::PATCH, "/api/v1/namespaces/team/pods/w0", MANAGED)
        .await;
    assert_eq!(
        annotate.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        annotate.body,
        json!({"metadata": {"uid": "uid-w0", "resourceVersion": "41",
                            "annotations": {"rocefabric.io/region": value}}}),
        "the pod as planned: uid and resourceVersion are preconditions"
    );
    // Until the annotation patch is answered, nothing else may be sent.
    api.assert_no_request(Duration::from_secs(2)).await;
    annotate.ok(&pod_json(
        "w0",
        &["example.com/quota", REGION_SCHEDULING_GATE],
        true,
    ));

    api.expect(Method::GET, "/api/v1/namespaces/team/pods/w0", &[])
        .await
        .ok(&pod_json(
            "w0",
            &["example.com/quota", REGION_SCHEDULING_GATE],
            true,
        ));
    let gate = api
        .expect(Method::PATCH, "/api/v1/namespaces/team/pods/w0", MANAGED)
        .await;
    assert_eq!(
        gate.content_type.as_deref(),
        Some("application/json-patch+json")
    );
    assert_eq!(
        gate.body,
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "uid-w0"},
            {"op": "test", "path": "/spec/schedulingGates/1/name", "value": "rocefabric.io/region"},
            {"op": "remove", "path": "/spec/schedulingGates/1"},
        ]),
        "bound to the pod read: a pod recreated under the name keeps its gate"
    );
    gate.ok(&pod_json("w0", &["example.com/quota"], true));
    let summary = task.await.expect("joined");
    assert_eq!(
        (summary.done, summary.failures.len(), summary.skipped),
        (2, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn gate_is_kept_when_the_annotation_write_failed() {
    let (client, mut api) = mock_client();
    let metrics = Arc::new(Metrics::new());
    let ctx = Context::always_leader(client, "op-0", metrics.clone());
    let task = spawn_pass(ctx, annotate_gate_then_delete());
    api.expect(Method::PATCH, "/api/v1/namespaces/team/pods/w0", MANAGED)
        .await
        .fail(500, "InternalError");
    // The next request is the independent delete: no GET or PATCH of the gate in between.
    api.expect(Method::DELETE, &format!("{ROCENODES}/n3"), &[])
        .await
        .ok(&json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
    api.assert_no_request(Duration::from_secs(2)).await;
    let summary = task.await.expect("joined");
    assert_eq!(
        (summary.done, summary.skipped, summary.failures.len()),
        (1, 1, 1)
    );
    let err = summary.into_result().expect_err("a failed pass");
    assert!(
        matches!(err, ReconcileError::Writes { failed: 1, .. }),
        "{err}"
    );
    assert_eq!(err.metric_label(), "server_error");
    let text = metrics.render().expect("metrics render");
    assert!(
        text.contains(r#"rocefabric_operator_reconcile_failures_total{reason="server_error"} 1"#),
        "{text}"
    );
}

/// The executor removing our gate from `team/w0`, against a fresh mock API server.
fn remove_gate_of_w0() -> (
    rocefabric_operator_testing::verifier::ApiServerVerifier,
    tokio::task::JoinHandle<Result<Outcome, ApplyError>>,
) {
    let (client, api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let write = Write::RemovePodGate {
        namespace: "team".into(),
        pod: "w0".into(),
        remaining_gates: vec![],
    };
    (api, tokio::spawn(async move { exec.execute(&write).await }))
}

#[tokio::test(start_paused = true)]
async fn gate_already_removed_sends_no_patch() {
    let (mut api, task) = remove_gate_of_w0();
    api.expect(Method::GET, "/api/v1/namespaces/team/pods/w0", &[])
        .await
        .ok(&pod_json("w0", &[], true));
    api.assert_no_request(Duration::from_secs(2)).await;
    assert_eq!(
        task.await.expect("joined").expect("no error"),
        Outcome::AlreadyDone
    );
}

#[tokio::test(start_paused = true)]
async fn gate_is_not_removed_from_a_pod_without_its_annotation() {
    let (mut api, task) = remove_gate_of_w0();
    api.expect(Method::GET, "/api/v1/namespaces/team/pods/w0", &[])
        .await
        .ok(&pod_json("w0", &[REGION_SCHEDULING_GATE], false));
    api.assert_no_request(Duration::from_secs(2)).await;
    let err = task.await.expect("joined").expect_err("refused");
    assert!(matches!(err, ApplyError::AnnotationMissing { .. }), "{err}");
    assert_eq!(err.metric_label(), "annotation_missing");
}

#[tokio::test(start_paused = true)]
async fn concurrent_gate_change_fails_the_tested_patch() {
    let (mut api, task) = remove_gate_of_w0();
    api.expect(Method::GET, "/api/v1/namespaces/team/pods/w0", &[])
        .await
        .ok(&pod_json("w0", &[REGION_SCHEDULING_GATE], true));
    let patch = api
        .expect(Method::PATCH, "/api/v1/namespaces/team/pods/w0", MANAGED)
        .await;
    assert_eq!(
        patch.body[1],
        json!({"op": "test", "path": "/spec/schedulingGates/0/name", "value": "rocefabric.io/region"})
    );
    // Someone removed or reordered gates meanwhile: the test op fails on the server.
    patch.fail(422, "Invalid");
    let err = task.await.expect("joined").expect_err("failed");
    assert_eq!(err.metric_label(), "invalid");
}

#[tokio::test(start_paused = true)]
async fn region_directory_is_applied_after_its_fabric_key_and_deleted() {
    let (client, mut api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let data = BTreeMap::from([("regions.json".to_string(), "[]".to_string())]);
    let apply = Write::ApplyRegionDirectory {
        namespace: "team".into(),
        fabric: "dgx".into(),
        fabric_uid: "uid-dgx".into(),
        data,
    };
    let delete = Write::DeleteRegionDirectory {
        namespace: "old".into(),
        fabric: "dgx".into(),
    };
    let task = tokio::spawn(async move {
        (
            exec.execute(&apply).await,
            exec.execute(&apply).await,
            exec.execute(&delete).await,
        )
    });
    // First the namespace's fabric key, created (never read) with fresh random bytes.
    let key = api
        .expect(Method::POST, "/api/v1/namespaces/team/secrets", MANAGED)
        .await;
    assert_eq!(key.body["kind"], "Secret");
    assert_eq!(key.body["metadata"]["name"], "dgx-key");
    assert_eq!(key.body["immutable"], true);
    assert_eq!(key.body["metadata"]["ownerReferences"][0]["uid"], "uid-dgx");
    let bytes = key.body["data"]["key"]
        .as_str()
        .expect("base64 key")
        .to_string();
    assert_eq!(bytes.len(), 44, "32 bytes: {bytes}");
    assert_eq!(key.body["data"]["namespace"], "dGVhbQ==", "team");
    key.echo();
    let call = api
        .expect(
            Method::PATCH,
            "/api/v1/namespaces/team/configmaps/dgx-regions",
            SSA,
        )
        .await;
    assert_eq!(call.body["kind"], "ConfigMap");
    assert_eq!(
        call.body["metadata"]["labels"],
        json!({"rocefabric.io/fabric": "dgx"})
    );
    assert_eq!(
        call.body["metadata"]["ownerReferences"][0]["uid"],
        "uid-dgx"
    );
    assert_eq!(call.body["data"], json!({"regions.json": "[]"}));
    call.echo();
    // The second time the key exists: kept as it is, the directory applied.
    let again = api
        .expect(Method::POST, "/api/v1/namespaces/team/secrets", MANAGED)
        .await;
    assert_ne!(
        again.body["data"]["key"].as_str(),
        Some(bytes.as_str()),
        "fresh bytes each try"
    );
    again.fail(409, "AlreadyExists");
    api.expect(
        Method::PATCH,
        "/api/v1/namespaces/team/configmaps/dgx-regions",
        SSA,
    )
    .await
    .echo();
    api.expect(
        Method::DELETE,
        "/api/v1/namespaces/old/configmaps/dgx-regions",
        &[],
    )
    .await
    .ok(&json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
    let (a, b, d) = task.await.expect("joined");
    assert_eq!(
        (
            a.expect("applied"),
            b.expect("applied"),
            d.expect("deleted")
        ),
        (Outcome::Done, Outcome::Done, Outcome::Done)
    );
}

#[tokio::test(start_paused = true)]
async fn events_are_recorded_through_events_k8s_io() {
    let (client, mut api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let event = Write::Event(Event {
        regarding: ObjectReference {
            api_version: Some("rocefabric.io/v1alpha1".into()),
            kind: Some("RoceFabric".into()),
            name: Some("dgx".into()),
            uid: Some("uid-dgx".into()),
            ..ObjectReference::default()
        },
        type_: EventType::Warning,
        reason: "NodesConflicting".into(),
        message: "node n9 belongs to the older fabric old".into(),
    });
    let task = tokio::spawn(async move { exec.execute(&event).await });
    // A cluster-scoped object's Events go to the default namespace.
    let call = api
        .expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events",
            &[],
        )
        .await;
    assert_eq!(call.body["reason"], "NodesConflicting");
    assert_eq!(call.body["note"], "node n9 belongs to the older fabric old");
    assert_eq!(call.body["type"], "Warning");
    assert_eq!(call.body["action"], "Reconcile");
    assert_eq!(call.body["reportingController"], "rocefabric-operator");
    assert_eq!(call.body["reportingInstance"], "op-0");
    assert_eq!(call.body["regarding"]["uid"], "uid-dgx");
    call.echo();
    assert_eq!(
        task.await.expect("joined").expect("recorded"),
        Outcome::Done
    );
}

/// A RoceNode apply the API server refuses (its answer is never decoded on success) fails the
/// write with the API's reason and names the node.
#[tokio::test]
async fn a_refused_roce_node_apply_fails_naming_the_node_and_the_reason() {
    let (client, mut api) = mock_client();
    let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    let task = spawn_pass(ctx, vec![roce_node_write("n1"), roce_node_write("n2")]);
    api.expect(Method::PATCH, &format!("{ROCENODES}/n1"), SSA)
        .await
        .fail(422, "Invalid");
    api.expect(Method::PATCH, &format!("{ROCENODES}/n2"), SSA)
        .await
        .echo();
    let summary = task.await.expect("joined");
    assert_eq!((summary.done, summary.failures.len()), (1, 1));
    let (kind, err) = &summary.failures[0];
    assert_eq!(*kind, "apply_roce_node");
    let text = err.to_string();
    assert!(
        text.contains("rocenode n1") && text.contains("Invalid"),
        "{text}"
    );
    assert_eq!(err.metric_label(), "invalid");
}

fn reclaim_w0() -> Write {
    Write::ReclaimPodRegion {
        namespace: "team".into(),
        pod: "w0".into(),
        uid: Some("uid-w0".into()),
        resource_version: Some("41".into()),
        event: Event {
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some("w0".into()),
                namespace: Some("team".into()),
                uid: Some("uid-w0".into()),
                ..ObjectReference::default()
            },
            type_: EventType::Warning,
            reason: "RegionReclaimed".into(),
            message: "not bound to a node 600s after its window was assigned".into(),
        },
    }
}

/// A reclaim removes the region annotation and says why, only on the pod as planned (uid and
/// resourceVersion are preconditions), then records its Event on the pod.
#[tokio::test(start_paused = true)]
async fn a_reclaim_patches_the_pod_as_seen_then_records_its_event() {
    let (client, mut api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let write = reclaim_w0();
    let task = tokio::spawn(async move { exec.execute(&write).await });
    let patch = api
        .expect(Method::PATCH, "/api/v1/namespaces/team/pods/w0", MANAGED)
        .await;
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        patch.body,
        json!({"metadata": {"uid": "uid-w0", "resourceVersion": "41", "annotations": {
            "rocefabric.io/region": null,
            "rocefabric.io/region-reclaimed": "not bound to a node 600s after its window was assigned",
        }}})
    );
    patch.ok(&pod_json("w0", &["example.com/hold"], true));
    let event = api
        .expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/team/events",
            &[],
        )
        .await;
    assert_eq!(event.body["reason"], "RegionReclaimed");
    assert_eq!(event.body["regarding"]["uid"], "uid-w0");
    event.echo();
    assert_eq!(
        task.await.expect("joined").expect("reclaimed"),
        Outcome::Done
    );
}

/// A pod changed since it was planned (bound to a node meanwhile): the server refuses the
/// precondition, the pod keeps its window, no Event is recorded and the pass does not fail.
#[tokio::test(start_paused = true)]
async fn a_reclaim_of_a_pod_changed_since_is_not_needed() {
    let (client, mut api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let write = reclaim_w0();
    let task = tokio::spawn(async move { exec.execute(&write).await });
    api.expect(Method::PATCH, "/api/v1/namespaces/team/pods/w0", MANAGED)
        .await
        .fail(409, "Conflict");
    assert_eq!(
        task.await.expect("joined").expect("not an error"),
        Outcome::AlreadyDone
    );
    api.assert_no_request(Duration::from_secs(2)).await;
}

/// A region directory someone else wrote first (a tenant's planted ConfigMap of the same name)
/// is replaced: after the apply, the keys the operator does not own are removed, as the
/// directory was when applied (its resourceVersion tested).
#[tokio::test(start_paused = true)]
async fn a_planted_region_directory_is_replaced() {
    let (client, mut api) = mock_client();
    let exec = Executor::new(client, "op-0");
    let apply = Write::ApplyRegionDirectory {
        namespace: "team".into(),
        fabric: "dgx".into(),
        fabric_uid: "uid-dgx".into(),
        data: BTreeMap::from([("regions.json".to_string(), "[]".to_string())]),
    };
    let task = tokio::spawn(async move { exec.execute(&apply).await });
    api.expect(Method::POST, "/api/v1/namespaces/team/secrets", MANAGED)
        .await
        .fail(409, "AlreadyExists");
    let path = "/api/v1/namespaces/team/configmaps/dgx-regions";
    let applied = api.expect(Method::PATCH, path, SSA).await;
    let mut answer = applied.body.clone();
    answer["metadata"]["resourceVersion"] = json!("77");
    answer["data"]["peers/extra"] = json!("planted");
    answer["binaryData"] = json!({"blob": "AAAA"});
    applied.ok(&answer);
    let strip = api.expect(Method::PATCH, path, MANAGED).await;
    assert_eq!(
        strip.content_type.as_deref(),
        Some("application/json-patch+json")
    );
    assert_eq!(
        strip.body,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "77"},
            {"op": "remove", "path": "/data/peers~1extra"},
            {"op": "remove", "path": "/binaryData"},
        ])
    );
    strip.ok(&json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "dgx-regions", "namespace": "team"}, "data": {"regions.json": "[]"}}));
    assert_eq!(task.await.expect("joined").expect("applied"), Outcome::Done);
}

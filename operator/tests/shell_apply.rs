//! The executor against the strict mock API server: the exact request each planned write sends.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::ObjectReference;
use rocefabric_api::constants::{REGION_ANNOTATION, REGION_SCHEDULING_GATE};
use rocefabric_api::{NodeCounts, QosSpec, RoceFabricStatus, RoceNodeSpec};
use rocefabric_operator::apply::{ApplyError, Executor, Outcome};
use rocefabric_operator::controller::{
    Context, PassSummary, ReconcileError, WRITE_TIMEOUT, execute_all,
};
use rocefabric_operator::http::Health;
use rocefabric_operator::metrics::Metrics;
use rocefabric_operator::planner::writes::{Event, EventType, Write};
use rocefabric_operator::rate::TokenBucket;
use rocefabric_operator_testing::verifier::{MANAGED, SSA, mock_client};
use serde_json::json;
use tokio::sync::watch;

const ROCENODES: &str = "/apis/rocefabric.io/v1alpha1/rocenodes";

fn roce_node_write(name: &str) -> Write {
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

fn pod_json(name: &str, gates: &[&str], annotated: bool) -> serde_json::Value {
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
    let task = tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(&ctx, &writes, &mut summary).await;
        summary
    });

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

/// An annotation of `team/w0`, its gate, then an independent RoceNode delete.
fn annotate_gate_then_delete() -> Vec<Write> {
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

#[tokio::test(start_paused = true)]
async fn gate_is_kept_when_the_annotation_write_failed() {
    let (client, mut api) = mock_client();
    let metrics = Arc::new(Metrics::new());
    let ctx = Context::always_leader(client, "op-0", metrics.clone());
    let task = tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(&ctx, &annotate_gate_then_delete(), &mut summary).await;
        summary
    });
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

#[tokio::test(start_paused = true)]
async fn a_follower_sends_nothing() {
    let (client, mut api) = mock_client();
    let (_tx, leader) = watch::channel(false);
    let ctx = Context::new(
        client,
        "op-1",
        Arc::new(Metrics::new()),
        leader,
        Default::default(),
    );
    let writes = vec![
        roce_node_write("n1"),
        Write::DeleteRoceNode { name: "n2".into() },
    ];
    let mut summary = PassSummary::default();
    let run = execute_all(&ctx, &writes, &mut summary);
    let ((), ()) = tokio::join!(run, api.assert_no_request(Duration::from_secs(5)));
    assert_eq!(summary.unsent, 2);
    assert!(matches!(
        summary.into_result(),
        Err(ReconcileError::NotLeader { remaining: 2 })
    ));
}

/// SIGTERM while a batch of RoceNode writes is in flight: the batch completes, nothing after it
/// is sent.
#[tokio::test(start_paused = true)]
async fn shutdown_stops_a_pass_before_its_next_write() {
    let (client, mut api) = mock_client();
    let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    let writes = vec![
        roce_node_write("n1"),
        roce_node_write("n2"),
        Write::DeleteRegionDirectory {
            namespace: "team".into(),
            fabric: "dgx".into(),
        },
    ];
    let stop = ctx.stop.clone();
    let task = tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(&ctx, &writes, &mut summary).await;
        summary
    });
    let first = api
        .expect(Method::PATCH, &format!("{ROCENODES}/n1"), SSA)
        .await;
    let second = api
        .expect(Method::PATCH, &format!("{ROCENODES}/n2"), SSA)
        .await;
    stop.cancel();
    first.echo();
    second.echo();
    api.assert_no_request(Duration::from_secs(5)).await;
    let summary = task.await.expect("joined");
    assert_eq!((summary.done, summary.unsent), (2, 1));
    assert!(matches!(
        summary.into_result(),
        Err(ReconcileError::ShuttingDown { remaining: 1 })
    ));
}

/// At `--write-qps 20 --write-burst 10`, RoceNode writes go out ten at a time (half a second of
/// the rate), each batch once its last write is paid for, the next only once the batch is
/// answered; the pod write after them waits for the last batch's answers.
#[tokio::test(start_paused = true)]
async fn roce_node_writes_go_in_paced_batches_and_the_next_write_waits_for_them() {
    let (client, mut api) = mock_client();
    let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    *ctx.write_limit.lock().await = TokenBucket::new(20.0, 10);
    let mut writes: Vec<Write> = (0..25)
        .map(|i| roce_node_write(&format!("n{i:02}")))
        .collect();
    writes.extend(annotate_gate_then_delete().into_iter().take(1));
    let task = tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(&ctx, &writes, &mut summary).await;
        summary
    });
    let start = tokio::time::Instant::now();
    let mut batches = Vec::new();
    let mut i = 0;
    while i < 25 {
        let mut held = vec![
            api.expect(Method::PATCH, &format!("{ROCENODES}/n{i:02}"), SSA)
                .await,
        ];
        let at = (tokio::time::Instant::now() - start).as_millis();
        i += 1;
        // The rest of the batch is already sent, at the same instant.
        while let Some(r) = api.try_next(Duration::from_millis(1)).await {
            assert_eq!(r.path, format!("{ROCENODES}/n{i:02}"));
            held.push(r);
            i += 1;
        }
        batches.push((held.len(), at));
        if i == 25 {
            // Unanswered, the last batch holds back the pod write.
            api.assert_no_request(Duration::from_secs(1)).await;
        }
        held.into_iter().for_each(|r| r.echo());
    }
    assert_eq!(batches, [(10, 0), (10, 500), (5, 750)], "(writes, ms)");
    api.expect(Method::PATCH, "/api/v1/namespaces/team/pods/w0", MANAGED)
        .await
        .ok(&pod_json("w0", &[], true));
    let summary = task.await.expect("joined");
    assert_eq!((summary.done, summary.failures.len()), (26, 0));
}

/// A write the API server never answers fails after `WRITE_TIMEOUT` (the pass goes on, the gate
/// stays): a hung call cannot hold a pass, planned under a leadership that may be gone, open.
#[tokio::test(start_paused = true)]
async fn a_hung_write_fails_after_the_write_timeout() {
    let (client, mut api) = mock_client();
    let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    let task = tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(&ctx, &annotate_gate_then_delete(), &mut summary).await;
        summary
    });
    let hung = api
        .expect(Method::PATCH, "/api/v1/namespaces/team/pods/w0", MANAGED)
        .await;
    let sent = tokio::time::Instant::now();
    // (The verifier waits at most 5 s per request itself.)
    tokio::time::sleep(WRITE_TIMEOUT - Duration::from_secs(1)).await;
    api.expect(Method::DELETE, &format!("{ROCENODES}/n3"), &[])
        .await
        .ok(&json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
    assert_eq!(sent.elapsed(), WRITE_TIMEOUT);
    drop(hung);
    let summary = task.await.expect("joined");
    assert_eq!(
        (summary.done, summary.skipped, summary.failures.len()),
        (1, 1, 1)
    );
    assert_eq!(summary.failures[0].1.metric_label(), "timeout");
}

/// `--write-qps 2 --write-burst 2` (a batch of one): two writes go at once, each further one
/// 500 ms after the one before, as the API server sees them arrive.
#[tokio::test(start_paused = true)]
async fn writes_are_paced_by_the_write_rate_limit() {
    let (client, mut api) = mock_client();
    let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    *ctx.write_limit.lock().await = TokenBucket::new(2.0, 2);
    let writes: Vec<Write> = (0..5).map(|i| roce_node_write(&format!("n{i}"))).collect();
    let task = tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(&ctx, &writes, &mut summary).await;
        summary
    });
    let start = tokio::time::Instant::now();
    let mut arrived = Vec::new();
    for i in 0..5 {
        api.expect(Method::PATCH, &format!("{ROCENODES}/n{i}"), SSA)
            .await
            .echo();
        arrived.push((tokio::time::Instant::now() - start).as_millis());
    }
    let summary = task.await.expect("joined");
    assert_eq!(summary.done, 5);
    assert_eq!(arrived, [0, 0, 500, 1000, 1500], "arrival times in ms");
    assert_eq!(summary.throttled, Duration::from_millis(1500));
}

/// A paced pass that lasts longer than `/healthz`'s stall window is progress: every finished write
/// tells the health, so liveness never restarts a leader in the middle of a long rollout.
#[tokio::test(start_paused = true)]
async fn a_long_paced_pass_keeps_healthz_alive() {
    let (client, mut api) = mock_client();
    let mut ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    let health = Arc::new(Health::default());
    health.set_stall_after(Duration::from_secs(60));
    health.progress(true);
    ctx.health = Some(health.clone());
    // One write a second: 100 writes take 99 s, past the 60 s window.
    *ctx.write_limit.lock().await = TokenBucket::new(1.0, 1);
    let writes: Vec<Write> = (0..100)
        .map(|i| roce_node_write(&format!("n{i}")))
        .collect();
    let task = tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(&ctx, &writes, &mut summary).await;
        summary
    });
    for i in 0..100 {
        api.expect(Method::PATCH, &format!("{ROCENODES}/n{i}"), SSA)
            .await
            .echo();
        assert_eq!(health.stalled_for(), None, "stalled at write {i}");
    }
    let summary = task.await.expect("joined");
    assert_eq!(summary.done, 100);
    assert!(summary.throttled >= Duration::from_secs(99));
    assert_eq!(health.stalled_for(), None);
}

/// A RoceNode apply the API server refuses (its answer is never decoded on success) fails the
/// write with the API's reason and names the node.
#[tokio::test]
async fn a_refused_roce_node_apply_fails_naming_the_node_and_the_reason() {
    let (client, mut api) = mock_client();
    let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    let task = tokio::spawn(async move {
        let mut summary = PassSummary::default();
        execute_all(
            &ctx,
            &[roce_node_write("n1"), roce_node_write("n2")],
            &mut summary,
        )
        .await;
        summary
    });
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

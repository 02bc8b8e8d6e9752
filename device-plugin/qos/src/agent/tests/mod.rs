//! The agent's kube side against a mock API server (tower-test behind `kube::Client`): the exact
//! status patch, drift Events and metrics, and the watch/resync loop under paused time.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::collections::BTreeSet;
use std::sync::Mutex;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use rocefabric_api::{NicSelector, QosSpec, RoceNodeSpec};
use serde_json::{Value, json};

use super::*;
use crate::apply::tests::{FakeDcb, FakeLink};
use crate::apply::{Kernel, apply as apply_qos};
use crate::fixture_tests::{Flavour, Tree, tree};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Responder = tower_test::mock::SendResponse<Response<Body>>;

/// A node whose DCB and MTU live in memory; driver files come from the fixture tree.
struct FakeNode {
    dcb: Mutex<FakeDcb>,
    link: Mutex<FakeLink>,
}

impl NodeKernel for FakeNode {
    fn apply(&self, files: &NetdevFiles, desired: &Desired) -> Result<Outcome, String> {
        let mut dcb = self.dcb.lock().map_err(|e| e.to_string())?;
        let mut link = self.link.lock().map_err(|e| e.to_string())?;
        Ok(apply_qos(
            &mut Kernel {
                dcb: &mut *dcb,
                link: &mut *link,
            },
            files,
            desired,
        ))
    }
}

fn t(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).expect("valid time"))
}

fn roce_node(generation: i64) -> RoceNode {
    let mut node = RoceNode::new(
        "node-a",
        RoceNodeSpec {
            fabric: "fabric-a".into(),
            fabric_generation: 4,
            qos: QosSpec::default().rendered(),
            nic_selector: NicSelector {
                rdma_devices: vec!["mlx5_0".into()],
                ..Default::default()
            },
            pending: false,
        },
    );
    node.metadata.generation = Some(generation);
    node.metadata.uid = Some("0b6e8a8e-1c1d-4c55-9d0b-3f5d0e1a2b3c".into());
    node.metadata.resource_version = Some("10".into());
    node
}

struct Setup {
    ctx: Arc<AgentContext>,
    handle: Handle,
    kernel: Arc<FakeNode>,
    tree: Tree,
}

fn setup() -> Setup {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let tree = tree(Flavour::OutOfTree, true);
    let kernel = Arc::new(FakeNode {
        dcb: Mutex::new(FakeDcb::mlx5()),
        link: Mutex::new(FakeLink::with_mtu(1500)),
    });
    let ctx = AgentContext::new(client, "node-a".into(), tree.roots.clone(), kernel.clone());
    Setup {
        ctx: Arc::new(ctx),
        handle,
        kernel,
        tree,
    }
}

async fn next(handle: &mut Handle) -> (Request<Body>, Responder) {
    tokio::time::timeout(Duration::from_secs(600), handle.next_request())
        .await
        .expect("the agent sent a request in time")
        .expect("the client is alive")
}

async fn body_json(req: Request<Body>) -> (http::request::Parts, Value) {
    let (parts, body) = req.into_parts();
    let bytes = body.collect_bytes().await.expect("request body");
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("JSON body")
    };
    (parts, value)
}

fn query(parts: &http::request::Parts) -> Vec<(String, String)> {
    let mut q: Vec<(String, String)> = parts
        .uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    q.sort();
    q
}

fn respond(send: Responder, status: StatusCode, body: &Value) {
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response"),
    );
}

/// The object the API server returns after a status apply.
fn with_status(node: &RoceNode, patch: &Value) -> Value {
    let mut obj = serde_json::to_value(node).expect("node json");
    obj["status"] = patch["status"].clone();
    obj
}

fn is_status_patch(parts: &http::request::Parts) -> bool {
    parts.method == Method::PATCH
        && parts.uri.path() == "/apis/rocefabric.io/v1alpha1/rocenodes/node-a/status"
}

fn knob_json(knob: &str, outcome: &str, mechanism: &str, value: &str) -> Value {
    json!({ "knob": knob, "outcome": outcome, "mechanism": mechanism, "desired": value, "observed": value })
}

#[tokio::test]
async fn first_pass_sends_the_exact_status_apply_patch() {
    let Setup {
        ctx,
        mut handle,
        kernel,
        tree: _tree,
    } = setup();
    let node = roce_node(2);
    let task = {
        let (ctx, node) = (ctx.clone(), node.clone());
        tokio::spawn(async move { reconcile(&ctx, &node, t(1_800_000_000)).await })
    };
    let (req, send) = next(&mut handle).await;
    assert_eq!(
        req.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/apply-patch+yaml")
    );
    let (parts, body) = body_json(req).await;
    assert!(is_status_patch(&parts), "{} {}", parts.method, parts.uri);
    assert_eq!(
        query(&parts),
        vec![
            ("fieldManager".to_string(), "rocefabric-agent".to_string()),
            ("force".to_string(), "true".to_string())
        ]
    );
    let message = "QoS holds on 1 interface(s)";
    let expected = json!({
        "apiVersion": "rocefabric.io/v1alpha1",
        "kind": "RoceNode",
        "status": {
            "observedGeneration": 2,
            "fabricGeneration": 4,
            "conditions": [
                { "type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
                  "observedGeneration": 2, "lastTransitionTime": "2027-01-15T08:00:00Z" },
                { "type": "QosApplied", "status": "True", "reason": "QosApplied", "message": message,
                  "observedGeneration": 2, "lastTransitionTime": "2027-01-15T08:00:00Z" },
                { "type": "Ready", "status": "True", "reason": "AsExpected", "message": message,
                  "observedGeneration": 2, "lastTransitionTime": "2027-01-15T08:00:00Z" },
            ],
            "interfaces": [{
                "netdev": "enp24s0np0",
                "rdmaDevice": "mlx5_0",
                "pciAddress": "0000:18:00.0",
                "linkState": "ACTIVE",
                "trust": "dscp",
                "pfcPriorities": [3],
                "ecnPriorities": [3],
                "roceTos": 106,
                "mtu": 4200,
                "knobs": [
                    knob_json("trust", "Applied", "Sysfs", "dscp"),
                    knob_json("dscpMap", "Applied", "DcbNetlink", "26:3,48:6"),
                    knob_json("pfc", "Applied", "DcbNetlink", "3"),
                    knob_json("ecnNotificationPoint", "Applied", "Sysfs", "3"),
                    knob_json("ecnReactionPoint", "Applied", "Sysfs", "3"),
                    knob_json("cnpDscp", "AlreadyCorrect", "Sysfs", "48"),
                    knob_json("cnpPriority", "Applied", "Sysfs", "6"),
                    knob_json("roceTos", "Applied", "Configfs", "106"),
                    knob_json("roceMode", "Applied", "Configfs", "RoCE v2"),
                    knob_json("mtu", "Applied", "Rtnetlink", "4200"),
                ],
            }],
            "lastSyncTime": "2027-01-15T08:00:00Z",
        },
    });
    assert_eq!(
        body,
        expected,
        "status patch body:\n{}",
        serde_json::to_string_pretty(&body).unwrap_or_default()
    );
    respond(send, StatusCode::OK, &with_status(&node, &body));
    let status = task.await.expect("task").expect("reconcile");
    assert!(conditions::is_true(
        &status.conditions,
        condition::QOS_APPLIED,
        Some(2)
    ));
    assert_eq!(
        kernel.dcb.lock().expect("lock").pfc.map(|p| p.pfc_en),
        Some(0x08)
    );
    let targets = ctx.counter_targets.read().expect("lock");
    assert_eq!(
        targets
            .iter()
            .map(|f| f.netdev.as_str())
            .collect::<Vec<_>>(),
        ["enp24s0np0"]
    );
}

#[tokio::test]
async fn drift_is_corrected_with_an_event_and_a_metric() {
    let Setup {
        ctx,
        mut handle,
        kernel,
        tree,
    } = setup();
    let node = roce_node(2);
    // First pass.
    let first = {
        let (ctx, node) = (ctx.clone(), node.clone());
        tokio::spawn(async move { reconcile(&ctx, &node, t(1_800_000_000)).await })
    };
    let (req, send) = next(&mut handle).await;
    let (_, body) = body_json(req).await;
    let stored: RoceNode = serde_json::from_value(with_status(&node, &body)).expect("node");
    respond(send, StatusCode::OK, &with_status(&node, &body));
    first.await.expect("task").expect("reconcile");

    // Someone runs `mlnx_qos --pfc 0,0,0,0,0,0,0,0` by hand; the watch brings back our status.
    if let Ok(mut dcb) = kernel.dcb.lock()
        && let Some(pfc) = dcb.pfc.as_mut()
    {
        pfc.pfc_en = 0;
    }
    let second = {
        let (ctx, stored) = (ctx.clone(), stored.clone());
        tokio::spawn(async move { reconcile(&ctx, &stored, t(1_800_000_060)).await })
    };
    let (req, send) = next(&mut handle).await;
    let (parts, event) = body_json(req).await;
    assert_eq!(parts.method, Method::POST);
    assert_eq!(
        parts.uri.path(),
        "/apis/events.k8s.io/v1/namespaces/default/events"
    );
    assert_eq!(event["reason"], "DriftCorrected");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["kind"], "RoceNode");
    assert_eq!(event["regarding"]["name"], "node-a");
    assert_eq!(
        event["note"],
        "QoS had drifted and was written back: enp24s0np0 pfc"
    );
    assert_eq!(event["reportingController"], "rocefabric-agent");
    respond(send, StatusCode::CREATED, &event);

    let (req, send) = next(&mut handle).await;
    let (parts, body) = body_json(req).await;
    assert!(is_status_patch(&parts));
    let knobs = body["status"]["interfaces"][0]["knobs"]
        .as_array()
        .expect("knobs")
        .clone();
    let pfc = knobs.iter().find(|k| k["knob"] == "pfc").expect("pfc");
    assert_eq!(pfc["outcome"], "Applied");
    assert!(
        knobs
            .iter()
            .filter(|k| k["knob"] != "pfc")
            .all(|k| k["outcome"] == "AlreadyCorrect"),
        "{knobs:?}"
    );
    // QosApplied stayed True: its transition time does not move; lastSyncTime does.
    assert_eq!(
        body["status"]["conditions"][1]["lastTransitionTime"],
        "2027-01-15T08:00:00Z"
    );
    assert_eq!(body["status"]["lastSyncTime"], "2027-01-15T08:01:00Z");
    respond(send, StatusCode::OK, &with_status(&stored, &body));
    second.await.expect("task").expect("reconcile");

    let mut registry = Registry::default();
    ctx.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(
        text.contains(
            r#"rocefabric_qos_drift_corrections_total{interface="enp24s0np0",knob="pfc"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"rocefabric_qos_knob_holds{interface="enp24s0np0",knob="pfc"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"rocefabric_qos_node_fabric{fabric="#),
        "the node's fabric is exported: {text}"
    );
    drop(tree);
}

#[tokio::test]
async fn a_failed_status_write_is_an_error_naming_the_node() {
    let Setup {
        ctx,
        mut handle,
        tree: _tree,
        ..
    } = setup();
    let node = roce_node(1);
    let task = {
        let (ctx, node) = (ctx.clone(), node.clone());
        tokio::spawn(async move { reconcile(&ctx, &node, t(1_800_000_000)).await })
    };
    let (_, send) = next(&mut handle).await;
    respond(
        send,
        StatusCode::FORBIDDEN,
        &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                 "message": "rocenodes/status is forbidden", "code": 403 }),
    );
    let err = task.await.expect("task").expect_err("forbidden");
    assert_eq!(err.metric_label(), "status");
    assert!(err.to_string().contains("RoceNode node-a status"), "{err}");
}

fn list_body(node: &RoceNode) -> Value {
    json!({ "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceNodeList",
            "metadata": { "resourceVersion": "10" }, "items": [serde_json::to_value(node).expect("node")] })
}

fn watch_body(kind: &str, object: &Value) -> Body {
    let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).expect("json");
    line.push(b'\n');
    Body::from(line)
}

fn is_watch(parts: &http::request::Parts) -> bool {
    parts.method == Method::GET
        && query(parts)
            .iter()
            .any(|(k, v)| k == "watch" && v == "true")
}

#[tokio::test(start_paused = true)]
async fn the_loop_applies_on_spec_changes_and_resyncs_but_ignores_its_own_status_writes() {
    let Setup {
        ctx,
        mut handle,
        tree: _tree,
        ..
    } = setup();
    let start = tokio::time::Instant::now();
    let resync = Duration::from_secs(60);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run(ctx.clone(), resync, async move {
        let _ = stop_rx.await;
    }));

    // The watcher lists the node by name.
    let node = roce_node(2);
    let (req, send) = next(&mut handle).await;
    let (parts, _) = body_json(req).await;
    assert_eq!(
        (parts.method.clone(), parts.uri.path()),
        (Method::GET, "/apis/rocefabric.io/v1alpha1/rocenodes")
    );
    assert!(
        query(&parts).contains(&("fieldSelector".into(), "metadata.name%3Dnode-a".into())),
        "{:?}",
        parts.uri
    );
    respond(send, StatusCode::OK, &list_body(&node));

    // Then watches (held open) and applies generation 2 at once; requests may come in any order.
    let mut watch: Option<Responder> = None;
    let mut patch: Option<Value> = None;
    while watch.is_none() || patch.is_none() {
        let (req, send) = next(&mut handle).await;
        let (parts, body) = body_json(req).await;
        if is_watch(&parts) {
            watch = Some(send);
        } else {
            assert!(is_status_patch(&parts), "{} {}", parts.method, parts.uri);
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "a new generation is applied at once"
            );
            assert_eq!(body["status"]["observedGeneration"], 2);
            respond(send, StatusCode::OK, &with_status(&node, &body));
            patch = Some(body);
        }
    }
    // The watch brings our own status write back: same generation, so no new pass.
    let echoed = with_status(&node, patch.as_ref().expect("patched"));
    if let Some(send) = watch.take() {
        send.send_response(
            Response::builder()
                .body(watch_body("MODIFIED", &echoed))
                .expect("response"),
        );
    }
    // Next comes the re-watch; the next status write is the resync, a full interval later.
    let mut rewatch: Option<Responder> = None;
    loop {
        let (req, send) = next(&mut handle).await;
        let (parts, body) = body_json(req).await;
        if is_watch(&parts) {
            rewatch = Some(send);
            continue;
        }
        assert!(is_status_patch(&parts), "{} {}", parts.method, parts.uri);
        let at = start.elapsed();
        assert!(
            at >= resync && at < resync + Duration::from_secs(5),
            "resync at {at:?}"
        );
        assert_eq!(body["status"]["observedGeneration"], 2);
        respond(send, StatusCode::OK, &with_status(&node, &body));
        break;
    }
    assert!(rewatch.is_some(), "the watch was resumed");
    // A spec change (generation 3) is applied at once, well before the next resync.
    let before = start.elapsed();
    let mut changed = roce_node(3);
    changed.spec.qos.mtu = 9000;
    if let Some(send) = rewatch.take() {
        send.send_response(
            Response::builder()
                .body(watch_body(
                    "MODIFIED",
                    &serde_json::to_value(&changed).expect("json"),
                ))
                .expect("response"),
        );
    }
    let mut open_watches = Vec::new();
    loop {
        let (req, send) = next(&mut handle).await;
        let (parts, body) = body_json(req).await;
        if is_watch(&parts) {
            open_watches.push(send); // kept open
            continue;
        }
        assert!(is_status_patch(&parts));
        assert!(
            start.elapsed() - before < Duration::from_secs(1),
            "applied at once"
        );
        assert_eq!(body["status"]["observedGeneration"], 3);
        assert_eq!(body["status"]["interfaces"][0]["mtu"], 9000);
        respond(send, StatusCode::OK, &with_status(&changed, &body));
        break;
    }
    let _ = stop_tx.send(());
    agent.await.expect("task").expect("clean shutdown");
    let mut registry = Registry::default();
    ctx.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(
        text.contains(r#"rocefabric_qos_syncs_total{result="success"} 3"#),
        "{text}"
    );
}

mod soft_roce;
mod status;

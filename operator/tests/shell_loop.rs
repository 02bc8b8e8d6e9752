//! The whole controller (watch caches, leader election, reconcile loop) against the in-memory
//! fake API server, on paused time: a follower sends no writes and is ready; when the holder
//! stops renewing it takes the Lease over, configures the fabric, then goes quiet (steady
//! state); on shutdown it releases the Lease.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use rocefabric_operator::controller::{self, ControllerConfig, Handles};
use rocefabric_operator::http::Health;
use rocefabric_operator::leader::{LeaderElector, LeaseConfig};
use rocefabric_operator::metrics::Metrics;
use rocefabric_operator_testing::fake_cluster::{FakeCluster, Logged};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn objects() -> Vec<serde_json::Value> {
    let node = |name: &str, rdma: bool| {
        let labels = if rdma {
            json!({"rdma": "true"})
        } else {
            json!({})
        };
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels, "resourceVersion": "1"}})
    };
    vec![
        json!({"apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
               "metadata": {"name": "dgx", "uid": "uid-dgx", "generation": 1, "resourceVersion": "1",
                            "creationTimestamp": "2025-12-01T00:00:00Z"},
               "spec": {"nodeSelector": {"matchLabels": {"rdma": "true"}}, "rollout": {"maxUnavailable": "100%"},
                        "sharedMemory": {"regionSize": "1Gi", "maxRegions": 8,
                                         "podSelector": {"matchLabels": {"app": "train"}}}}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "w0", "namespace": "team", "uid": "uid-w0", "labels": {"app": "train"},
                            "creationTimestamp": "2025-12-31T23:00:00Z", "resourceVersion": "1"},
               "spec": {"containers": [{"name": "c", "image": "busybox"}],
                        "schedulingGates": [{"name": "rocefabric.io/region"}]},
               "status": {"phase": "Pending"}}),
        node("n1", true),
        node("n2", true),
        node("cp", false),
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "rocefabric-operator", "namespace": "ops", "resourceVersion": "1"},
               "spec": {"holderIdentity": "op-0", "leaseDurationSeconds": 15, "leaseTransitions": 0,
                        "renewTime": "2026-01-01T00:00:00.000000Z"}}),
    ]
}

fn summary(calls: &[Logged]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn follower_is_quiet_then_takes_over_configures_goes_quiet_and_releases() {
    let (client, fake) = FakeCluster::start(objects());
    fake.set_renewing_holder(Some("op-0"));

    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    let (leader_tx, leader_rx) = watch::channel(false);
    let elector = LeaderElector::new(
        client.clone(),
        LeaseConfig::new("rocefabric-operator", "ops", "op-1"),
    );
    let stop_election = CancellationToken::new();
    let election = tokio::spawn(elector.run(leader_tx, stop_election.clone()));
    let ctrl = tokio::spawn(controller::run(
        client.into(),
        ControllerConfig::new("op-1"),
        Handles {
            metrics: metrics.clone(),
            health: health.clone(),
            leader: leader_rx.clone(),
            shutdown: shutdown.clone(),
        },
    ));

    // A minute as a follower: caches synced, ready, and not one write.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        health.is_ready(),
        "a follower is ready once its caches synced"
    );
    assert!(!*leader_rx.borrow());
    assert_eq!(
        summary(&fake.writes()),
        Vec::<String>::new(),
        "a follower sends no writes"
    );
    let lists: Vec<String> = fake
        .log()
        .iter()
        .filter(|c| !c.query.contains_key("watch"))
        .map(|c| c.path.clone())
        .collect();
    for path in [
        "/apis/rocefabric.io/v1alpha1/rocefabrics",
        "/api/v1/nodes",
        "/apis/rocefabric.io/v1alpha1/rocenodes",
        "/api/v1/pods",
        "/api/v1/configmaps",
    ] {
        assert!(
            lists.iter().any(|p| p == path),
            "{path} was listed: {lists:?}"
        );
    }

    // The holder dies; within a lease duration (plus a retry) op-1 takes over and configures.
    fake.clear_log();
    fake.set_renewing_holder(None);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(*leader_rx.borrow(), "took over the expired lease");
    let writes = fake.writes();
    let order = summary(&writes);
    let takeover = writes
        .iter()
        .position(|c| c.method == Method::PUT)
        .expect("lease taken over");
    assert_eq!(writes[takeover].body["spec"]["holderIdentity"], "op-1");
    assert_eq!(writes[takeover].body["spec"]["leaseTransitions"], 1);
    let first_apply = order
        .iter()
        .position(|c| c.starts_with("PATCH /apis/rocefabric.io/v1alpha1/rocenodes/"))
        .expect("rocenodes applied");
    assert!(
        takeover < first_apply,
        "no write before holding the lease: {order:?}"
    );
    for n in ["n1", "n2"] {
        let rn = fake.get("rocenodes", None, n).expect("rocenode created");
        assert_eq!(rn["metadata"]["ownerReferences"][0]["uid"], "uid-dgx");
        assert_eq!(rn["spec"]["fabric"], "dgx");
    }
    assert!(
        fake.get("rocenodes", None, "cp").is_none(),
        "unselected node untouched"
    );
    let fabric = fake.get("rocefabrics", None, "dgx").expect("fabric");
    assert_eq!(fabric["status"]["nodes"]["selected"], 2);
    assert_eq!(fabric["status"]["trafficClass"], 106);
    assert_eq!(
        fabric["status"]["regions"],
        json!({"allocated": 1, "capacity": 8})
    );
    let apply = writes
        .iter()
        .find(|c| c.path.ends_with("/rocenodes/n1"))
        .expect("n1 applied");
    assert_eq!(
        apply.query.get("fieldManager").map(String::as_str),
        Some("rocefabric-operator")
    );
    assert_eq!(apply.query.get("force").map(String::as_str), Some("true"));

    // Steady state: the watch events of its own writes and the periodic resync plan again, and
    // send nothing but lease renewals.
    fake.clear_log();
    tokio::time::sleep(Duration::from_secs(400)).await;
    let other: Vec<String> = summary(&fake.writes())
        .into_iter()
        .filter(|c| {
            c != "PUT /apis/coordination.k8s.io/v1/namespaces/ops/leases/rocefabric-operator"
        })
        .collect();
    assert_eq!(other, Vec::<String>::new(), "steady state writes nothing");
    let text = metrics.render().expect("metrics");
    assert!(
        text.lines().any(|l| l == "rocefabric_operator_leader 1"),
        "the sample, not the HELP text that reads the same: {text}"
    );
    assert!(
        text.contains(r#"rocefabric_operator_nodes{fabric="dgx",state="selected"} 2"#),
        "{text}"
    );

    // Shutdown releases the Lease.
    fake.clear_log();
    shutdown.cancel();
    ctrl.await
        .expect("controller task")
        .expect("controller ends cleanly");
    // As `run` does: the Lease is released only once the controller stopped writing.
    assert!(
        *leader_rx.borrow(),
        "still leader while the controller stops"
    );
    stop_election.cancel();
    election.await.expect("election task");
    let last = fake.writes().pop().expect("release sent");
    assert_eq!(
        (last.method, last.path.as_str()),
        (
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/ops/leases/rocefabric-operator"
        )
    );
    assert!(
        last.body["spec"].get("holderIdentity").is_none(),
        "released: {}",
        last.body
    );
    let lease = fake
        .get("leases", Some("ops"), "rocefabric-operator")
        .expect("lease");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 1);
}

/// `--pod-label-selector`: the pods are listed and watched through the API server's label filter;
/// the other watches are not filtered.
#[tokio::test(start_paused = true)]
async fn a_pod_label_selector_filters_only_the_pod_watch() {
    let (client, fake) = FakeCluster::start(objects());
    let shutdown = CancellationToken::new();
    let (_leader_tx, leader_rx) = watch::channel(false);
    let health = Arc::new(Health::default());
    let ctrl = tokio::spawn(controller::run(
        client.into(),
        ControllerConfig {
            pod_label_selector: Some("rocefabric.io/fabric".into()),
            ..ControllerConfig::new("op-1")
        },
        Handles {
            metrics: Arc::new(Metrics::new()),
            health: health.clone(),
            leader: leader_rx,
            shutdown: shutdown.clone(),
        },
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(health.is_ready());
    let log = fake.log();
    let selector_of = |path: &str| -> Vec<Option<String>> {
        log.iter()
            .filter(|c| c.path == path)
            .map(|c| c.query.get("labelSelector").cloned())
            .collect()
    };
    let pods = selector_of("/api/v1/pods");
    assert!(!pods.is_empty());
    assert!(
        pods.iter()
            .all(|s| s.as_deref() == Some("rocefabric.io/fabric")),
        "{pods:?}"
    );
    assert!(
        selector_of("/api/v1/nodes").iter().all(Option::is_none),
        "nodes are not filtered"
    );
    shutdown.cancel();
    ctrl.await.expect("joins").expect("stops cleanly");
}

//! A pass's writes against the strict mock API server: who may write (the leader), when a pass
//! stops (shutdown, a hung call), and how writes are paced and batched.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use rocefabric_operator::controller::{
    Context, PassSummary, ReconcileError, WRITE_TIMEOUT, execute_all,
};
use rocefabric_operator::http::Health;
use rocefabric_operator::metrics::Metrics;
use rocefabric_operator::planner::writes::Write;
use rocefabric_operator::rate::TokenBucket;
use rocefabric_operator_testing::verifier::{MANAGED, SSA, mock_client};
use serde_json::json;
use tokio::sync::watch;

mod support;
use support::writes::{
    ROCENODES, annotate_gate_then_delete, pod_json, roce_node_write, spawn_pass,
};

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
    let task = spawn_pass(ctx, writes);
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

/// At `--write-qps 20 --write-burst 10`, RoceNode writes go out ten at a time (the burst; a
/// second of the rate would be 20), each batch once its last write is paid for, the next only once the batch is
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
    let task = spawn_pass(ctx, writes);
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
    let task = spawn_pass(ctx, annotate_gate_then_delete());
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

/// `--write-qps 2 --write-burst 1` (a batch of one): the first write goes at once, each further
/// one 500 ms after the one before, as the API server sees them arrive.
#[tokio::test(start_paused = true)]
async fn writes_are_paced_by_the_write_rate_limit() {
    let (client, mut api) = mock_client();
    let ctx = Context::always_leader(client, "op-0", Arc::new(Metrics::new()));
    *ctx.write_limit.lock().await = TokenBucket::new(2.0, 1);
    let writes: Vec<Write> = (0..5).map(|i| roce_node_write(&format!("n{i}"))).collect();
    let task = spawn_pass(ctx, writes);
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
    assert_eq!(arrived, [0, 500, 1000, 1500, 2000], "arrival times in ms");
    assert_eq!(summary.throttled, Duration::from_millis(2000));
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
    let task = spawn_pass(ctx, writes);
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

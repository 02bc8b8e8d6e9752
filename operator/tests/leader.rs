//! Leader election against the strict mock API server, on paused time.

use std::time::Duration;

use http::{Method, StatusCode};
use rocefabric_operator::leader::{LeaderElector, LeaseConfig, Step};
use rocefabric_operator_testing::verifier::{ApiServerVerifier, mock_client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/rocefabric-operator";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";

fn lease(holder: Option<&str>, rv: &str, renew: &str, transitions: i32) -> Value {
    let mut spec = json!({ "leaseDurationSeconds": 15, "leaseTransitions": transitions,
                           "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": renew });
    if let Some(h) = holder {
        spec["holderIdentity"] = json!(h);
    }
    json!({ "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": { "name": "rocefabric-operator", "namespace": "ops", "resourceVersion": rv },
            "spec": spec })
}

fn elector(client: kube::Client, me: &str) -> LeaderElector {
    LeaderElector::new(client, LeaseConfig::new("rocefabric-operator", "ops", me))
}

async fn step(
    api: &mut ApiServerVerifier,
    elector: &mut LeaderElector,
    get_reply: Option<Value>,
) -> Step {
    let fut = elector.try_acquire_or_renew();
    let serve = async {
        let get = api.expect(Method::GET, LEASE, &[]).await;
        match get_reply {
            Some(l) => get.ok(&l),
            None => get.fail(404, "NotFound"),
        }
    };
    let (result, ()) = tokio::join!(fut, serve);
    result.expect("step succeeds")
}

#[tokio::test(start_paused = true)]
async fn absent_lease_is_created_holding_it() {
    let (client, mut api) = mock_client();
    let mut e = elector(client, "op-0");
    let fut = e.try_acquire_or_renew();
    let serve = async {
        api.expect(Method::GET, LEASE, &[])
            .await
            .fail(404, "NotFound");
        let create = api.expect(Method::POST, LEASES, &[]).await;
        assert_eq!(create.body["metadata"]["name"], "rocefabric-operator");
        assert_eq!(create.body["spec"]["holderIdentity"], "op-0");
        assert_eq!(create.body["spec"]["leaseDurationSeconds"], 15);
        assert_eq!(create.body["spec"]["leaseTransitions"], 0);
        assert!(create.body["spec"]["renewTime"].is_string());
        let mut created = create.body.clone();
        created["metadata"]["resourceVersion"] = json!("1");
        create.respond(StatusCode::CREATED, &created);
    };
    let (result, ()) = tokio::join!(fut, serve);
    assert_eq!(result.expect("step"), Step::Leading);
}

#[tokio::test(start_paused = true)]
async fn losing_the_create_race_means_following() {
    let (client, mut api) = mock_client();
    let mut e = elector(client, "op-0");
    let fut = e.try_acquire_or_renew();
    let serve = async {
        api.expect(Method::GET, LEASE, &[])
            .await
            .fail(404, "NotFound");
        api.expect(Method::POST, LEASES, &[])
            .await
            .fail(409, "AlreadyExists");
    };
    let (result, ()) = tokio::join!(fut, serve);
    assert_eq!(result.expect("step"), Step::Following { holder: None });
}

#[tokio::test(start_paused = true)]
async fn follower_writes_nothing_while_the_holder_renews_then_takes_over_after_expiry() {
    let (client, mut api) = mock_client();
    let mut e = elector(client, "op-1");
    // The holder renews every 2 s for a minute: op-1 only reads.
    for i in 0..30 {
        let renewed = lease(
            Some("op-0"),
            &format!("{}", 10 + i),
            &format!("2026-01-01T00:00:{:02}.000000Z", i * 2),
            3,
        );
        let s = step(&mut api, &mut e, Some(renewed)).await;
        assert_eq!(
            s,
            Step::Following {
                holder: Some("op-0".into())
            }
        );
        tokio::time::advance(Duration::from_secs(2)).await;
    }
    // The holder dies: the same record is read for a while.
    let stale = lease(Some("op-0"), "99", "2026-01-01T00:01:00.000000Z", 3);
    let s = step(&mut api, &mut e, Some(stale.clone())).await;
    assert!(matches!(s, Step::Following { .. }));
    tokio::time::advance(Duration::from_secs(14)).await;
    let s = step(&mut api, &mut e, Some(stale.clone())).await;
    assert!(
        matches!(s, Step::Following { .. }),
        "14 s unchanged is not yet expired"
    );
    tokio::time::advance(Duration::from_secs(1)).await;

    let fut = e.try_acquire_or_renew();
    let serve = async {
        api.expect(Method::GET, LEASE, &[]).await.ok(&stale);
        let put = api.expect(Method::PUT, LEASE, &[]).await;
        assert_eq!(
            put.body["metadata"]["resourceVersion"], "99",
            "optimistic concurrency on the read version"
        );
        assert_eq!(put.body["spec"]["holderIdentity"], "op-1");
        assert_eq!(put.body["spec"]["leaseTransitions"], 4);
        assert_eq!(put.body["spec"]["leaseDurationSeconds"], 15);
        assert_ne!(
            put.body["spec"]["acquireTime"],
            stale["spec"]["acquireTime"]
        );
        put.echo();
    };
    let (result, ()) = tokio::join!(fut, serve);
    assert_eq!(result.expect("step"), Step::Leading);
}

#[tokio::test(start_paused = true)]
async fn takeover_conflict_means_following() {
    let (client, mut api) = mock_client();
    let mut e = elector(client, "op-1");
    let stale = lease(Some("op-0"), "5", "2026-01-01T00:00:00.000000Z", 0);
    step(&mut api, &mut e, Some(stale.clone())).await;
    tokio::time::advance(Duration::from_secs(15)).await;
    let fut = e.try_acquire_or_renew();
    let serve = async {
        api.expect(Method::GET, LEASE, &[]).await.ok(&stale);
        api.expect(Method::PUT, LEASE, &[])
            .await
            .fail(409, "Conflict");
    };
    let (result, ()) = tokio::join!(fut, serve);
    assert_eq!(
        result.expect("step"),
        Step::Following {
            holder: Some("op-0".into())
        }
    );
}

#[tokio::test(start_paused = true)]
async fn leader_renews_keeping_acquire_time_and_releases_on_shutdown() {
    let (client, mut api) = mock_client();
    let e = elector(client, "op-0");
    let (tx, mut rx) = watch::channel(false);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(e.run(tx, shutdown.clone()));

    api.expect(Method::GET, LEASE, &[]).await.ok(&lease(
        None,
        "1",
        "2026-01-01T00:00:00.000000Z",
        2,
    ));
    let take = api.expect(Method::PUT, LEASE, &[]).await;
    assert_eq!(
        take.body["spec"]["holderIdentity"], "op-0",
        "a released lease is taken at once"
    );
    assert_eq!(take.body["spec"]["leaseTransitions"], 3);
    let mut held = take.body.clone();
    held["metadata"]["resourceVersion"] = json!("2");
    take.ok(&held);
    rx.wait_for(|l| *l).await.expect("became leader");

    // Renewal 2 s later: same acquireTime and transitions, new renewTime.
    api.expect(Method::GET, LEASE, &[]).await.ok(&held);
    let renew = api.expect(Method::PUT, LEASE, &[]).await;
    assert_eq!(
        renew.body["spec"]["acquireTime"],
        held["spec"]["acquireTime"]
    );
    assert_eq!(renew.body["spec"]["leaseTransitions"], 3);
    assert_eq!(renew.body["metadata"]["resourceVersion"], "2");
    let mut renewed = renew.body.clone();
    renewed["metadata"]["resourceVersion"] = json!("3");
    renew.ok(&renewed);

    shutdown.cancel();
    api.expect(Method::GET, LEASE, &[]).await.ok(&renewed);
    let release = api.expect(Method::PUT, LEASE, &[]).await;
    assert!(
        release.body["spec"].get("holderIdentity").is_none(),
        "holder cleared: {}",
        release.body
    );
    assert_eq!(release.body["spec"]["leaseDurationSeconds"], 1);
    assert_eq!(release.body["spec"]["leaseTransitions"], 3);
    release.echo();
    task.await.expect("election ends");
    assert!(!*rx.borrow(), "not leader after shutdown");
    api.assert_no_request(Duration::from_secs(10)).await;
}

/// Run an elector for `me` that creates the absent Lease and leads.
async fn leading(
    me: &str,
) -> (
    ApiServerVerifier,
    watch::Receiver<bool>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let (client, mut api) = mock_client();
    let e = elector(client, me);
    let (tx, mut rx) = watch::channel(false);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(e.run(tx, shutdown.clone()));
    api.expect(Method::GET, LEASE, &[])
        .await
        .fail(404, "NotFound");
    let create = api.expect(Method::POST, LEASES, &[]).await;
    let body = create.body.clone();
    create.respond(StatusCode::CREATED, &body);
    rx.wait_for(|l| *l).await.expect("became leader");
    (api, rx, shutdown, task)
}

#[tokio::test(start_paused = true)]
async fn leader_steps_down_when_it_cannot_renew_within_the_deadline() {
    let (mut api, mut rx, shutdown, task) = leading("op-0").await;
    let became = tokio::time::Instant::now();

    // The API server fails every read from now on, each after 700 ms (so the retries drift off
    // the 2 s grid: a leader that slept a full retry period past its deadline would be late).
    loop {
        tokio::select! {
            call = api.next("lease read") => {
                assert_eq!(call.method, Method::GET);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    call.fail(503, "ServiceUnavailable");
                });
            }
            res = rx.wait_for(|l| !*l) => { res.expect("stepped down"); break; }
        }
    }
    let after = became.elapsed();
    assert!(
        after >= Duration::from_secs(10) && after < Duration::from_millis(10_050),
        "stepped down after {after:?}: at the renew deadline, not a retry period later"
    );
    shutdown.cancel();
    task.await.expect("election ends");
}

/// A Lease call that never answers must not keep a replica leading: client-go bounds renewal by
/// the renew deadline, so a follower (which takes over after the 15 s lease duration) never
/// overlaps with a leader stuck in a hung GET or PUT.
#[tokio::test(start_paused = true)]
async fn a_hung_lease_call_steps_the_leader_down_at_the_renew_deadline() {
    let (mut api, mut rx, shutdown, task) = leading("op-0").await;
    let became = tokio::time::Instant::now();

    // The next read is received and never answered.
    let hung = api.expect(Method::GET, LEASE, &[]).await;
    rx.wait_for(|l| !*l).await.expect("stepped down");
    let after = became.elapsed();
    assert!(
        after >= Duration::from_secs(10) && after < Duration::from_secs(11),
        "stepped down {after:?} after the last renewal, while the call still hangs"
    );
    drop(hung);
    shutdown.cancel();
    task.await.expect("election ends");
}

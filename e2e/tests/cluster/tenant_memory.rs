//! Issue 39, attack 2: a tenant with only `edit` rights creates 1,000 pods for a fabric, each with
//! 250 KiB of annotations (most of it an unparseable `rocefabric.io/region-size`) and 50 unique
//! labels, to grow the operator until it is killed. The operator keeps only what it plans with,
//! is never restarted, keeps the fabric's status written, and serves a well-behaved tenant's pod
//! meanwhile; its resident memory is reported before and after.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use rocefabric_api::RoceFabric;
use rocefabric_api::constants::{FABRIC_LABEL, REGION_SCHEDULING_GATE};
use rocefabric_e2e::cluster::LocalCluster;
use serde_json::{Value, json};

use crate::regions::{assigned_window, gated_pod};
use crate::tenant::{TENANT, delete_namespace, process_rss, tenant_of};
use crate::{
    NAMESPACE, WORKLOAD_NAMESPACE, create_pod, delete_pod, eventually, local_cluster, running,
};

const FABRIC: &str = "e2e-hoard";
const PODS: usize = 1000;
const LABELS: usize = 50;
/// Of the API server's 256 KiB of annotations per pod: the size request, then the rest.
const SIZE_TEXT: usize = 128 << 10;
const OTHER_TEXT: usize = 120 << 10;
/// Creations in flight at once.
const WRITERS: usize = 8;

fn fabric() -> Value {
    json!({
        "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
        "metadata": {"name": FABRIC},
        "spec": {
            "nodeSelector": {"matchLabels": {"rocefabric.io/e2e-hoard": "none"}},
            "sharedMemory": {
                "regionSize": "1Mi", "maxRegions": 8,
                "podSelector": {"matchLabels": {FABRIC_LABEL: FABRIC}}
            }
        }
    })
}

/// Hostile pod `i`: behind the fabric's gate (the admission policy requires it), which its
/// unparseable size request keeps (a pod behind a gate of its own would not be planned at all).
fn hostile(i: usize, image: &str) -> Value {
    let mut labels = serde_json::Map::new();
    labels.insert(FABRIC_LABEL.into(), json!(FABRIC));
    for j in 0..LABELS {
        labels.insert(
            format!("tenant.example/l{j:02}"),
            json!(format!("{i:04}-{j:02}-{}", "v".repeat(50))),
        );
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("hoard-{i:04}"), "namespace": TENANT, "labels": labels,
            "annotations": {
                "rocefabric.io/region-size": "9".repeat(SIZE_TEXT),
                "tenant.example/ballast": "x".repeat(OTHER_TEXT),
            }
        },
        "spec": {
            "schedulingGates": [{"name": REGION_SCHEDULING_GATE}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                            "command": ["true"]}]
        }
    })
}

/// The operator's resident memory (its largest process: the leader holds the plan) and its
/// pods' restart counts.
async fn operator_state(client: &Client) -> (u64, Vec<i32>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(&crate::operator_selector()))
        .await
        .expect("operator pods");
    let restarts = list
        .items
        .iter()
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .collect();
    let rss = process_rss("rocefabric-operator", None).unwrap_or(0);
    (rss, restarts)
}

#[test]
fn a_tenant_hoarding_pods_does_not_grow_the_operator() {
    const TEST: &str = "a_tenant_hoarding_pods_does_not_grow_the_operator";
    let Some((ctx, local)) = local_cluster(TEST) else {
        return;
    };
    ctx.rt.block_on(hoard(&ctx.client, &local));
}

async fn hoard(client: &Client, local: &LocalCluster) {
    let image = &local.busybox_image;
    let as_tenant = tenant_of(client, &[]).await;
    crate::apply_value(client, &fabric())
        .await
        .expect("apply the hoard fabric");
    let good: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NAMESPACE);
    let good_pod = |name: &str| {
        let mut p = gated_pod(name, image);
        p["metadata"]["labels"][FABRIC_LABEL] = json!(FABRIC);
        p
    };
    // Before: a well-behaved pod served, the operator settled.
    create_pod(&good, good_pod("hoard-good-0")).await;
    assigned_window(&good, "hoard-good-0").await;
    delete_pod(&good, "hoard-good-0").await;
    let (before, restarts_before) = operator_state(client).await;
    assert!(before > 0, "the operator's process is on this machine");

    // The attack, with the tenant's rights.
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let pods: Api<Pod> = Api::namespaced(as_tenant.clone(), TENANT);
        let image = image.clone();
        writers.spawn(async move {
            for i in (w..PODS).step_by(WRITERS) {
                let pod: Pod = serde_json::from_value(hostile(i, &image)).expect("a pod");
                let mut tries = 0;
                while let Err(e) = pods.create(&Default::default(), &pod).await {
                    tries += 1;
                    assert!(tries < 5, "create hoard-{i:04}: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("a writer");
    }
    let created_in = started.elapsed().as_secs_f64();

    // The operator has seen them all: the fabric's status names the first and counts the rest.
    let fabrics: Api<RoceFabric> = Api::all(client.clone());
    let counted = format!("(+{} more)", PODS - 10);
    let message = eventually("the fabric reports every hostile pod", || async {
        let f = fabrics.get(FABRIC).await.map_err(|e| e.to_string())?;
        let message = f
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded"))
            .map(|c| c.message.clone())
            .unwrap_or_default();
        message
            .contains(&counted)
            .then_some(message.clone())
            .ok_or(message)
    })
    .await;
    assert!(
        message.len() < 4096,
        "{} bytes of status message",
        message.len()
    );
    // A well-behaved tenant is served meanwhile.
    let wait = Instant::now();
    create_pod(&good, good_pod("hoard-good")).await;
    assigned_window(&good, "hoard-good").await;
    running(&good, "hoard-good").await;
    let served_in = wait.elapsed().as_secs_f64();
    let (after, restarts_after) = operator_state(client).await;
    assert_eq!(
        restarts_after, restarts_before,
        "the operator was not restarted"
    );
    // The chart's limit is 256 MiB; 1,000 pods of 250 KiB would be 244 MiB of text if kept.
    assert!(
        after < 128 << 20,
        "the operator holds {after} bytes with {PODS} hostile pods"
    );
    println!(
        "FIGURE operator resident memory with {PODS} hostile pods ({} KiB of annotations and \
         {LABELS} unique labels each) vs none: {:.1} MiB vs {:.1} MiB (ratio {:.2}); created in \
         {created_in:.0} s; a well-behaved pod got its window and ran in {served_in:.1} s",
        (SIZE_TEXT + OTHER_TEXT) >> 10,
        after as f64 / 1048576.0,
        before as f64 / 1048576.0,
        after as f64 / before as f64,
    );

    delete_pod(&good, "hoard-good").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), TENANT);
    let _ = pods
        .delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default(),
        )
        .await;
    let _ = fabrics.delete(FABRIC, &Default::default()).await;
    delete_namespace(client, TENANT).await;
}

/// Runs everywhere: the fabric this test applies passes the CRD's schema and CEL rules.
#[test]
fn the_hoard_fabric_is_valid() {
    rocefabric_api::validate::fabric_value(&fabric()).unwrap_or_else(|e| panic!("{e}"));
}

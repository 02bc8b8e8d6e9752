//! The scale harness at a small size (500 nodes, 5,000 pods of which 500 are fabric pods, 50
//! namespaces): the real operator binary against the in-process API server converges (every
//! node's RoceNode configured, every fabric pod given a distinct, non-overlapping region and
//! ungated, a region directory per namespace that lists its pods), gives a new fabric pod its
//! region, deletes the RoceNode of a node that leaves the fabric and configures it again when it
//! rejoins, and makes no write in a pass with nothing to do. The full size runs as
//! `cargo bench -p rocefabric-operator --bench scale`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use rocefabric_formats::directory::{DirectoryEntry, parse};
use rocefabric_formats::names::DIRECTORY_KEY;
use rocefabric_operator_testing::scale::apiserver::{ApiServer, Options, Resource};
use rocefabric_operator_testing::scale::cluster::{FABRIC, GeneratedCluster, Sizes};
use rocefabric_operator_testing::scale::scenario::{Harness, Waits};
use serde_json::Value;

const SIZES: Sizes = Sizes {
    nodes: 500,
    pods: 5_000,
    fabric_pods: 500,
    namespaces: 50,
};

/// A fabric pod's region annotation.
#[derive(Debug, serde::Deserialize)]
struct Region {
    fabric: String,
    id: u32,
    base: u64,
    size: u64,
    uid: String,
}

/// Every live fabric pod's region, by (namespace, name); fails on a pod without one.
fn regions(server: &ApiServer) -> BTreeMap<(String, String), Region> {
    server
        .regions()
        .into_iter()
        .map(|(ns, name, annotation)| {
            let text = annotation.unwrap_or_else(|| panic!("{ns}/{name} has no region"));
            let region: Region = serde_json::from_str(&text).expect("a region annotation");
            ((ns, name), region)
        })
        .collect()
}

/// Regions are the fabric's, bound to their pod's uid, of distinct ids, and never overlap.
fn assert_regions_disjoint(server: &ApiServer, cluster: &GeneratedCluster) {
    let regions = regions(server);
    let mut spans: Vec<(u64, u64, &str)> = Vec::new();
    for ((_, name), r) in &regions {
        assert_eq!(r.fabric, FABRIC);
        let i = GeneratedCluster::pod_index(name).expect("a generated name");
        assert_eq!(r.uid, cluster.pod_uid(i), "{name}'s region is bound to it");
        assert!(r.size > 0);
        spans.push((r.base, r.base + r.size, name));
    }
    let ids: BTreeSet<u32> = regions.values().map(|r| r.id).collect();
    assert_eq!(ids.len(), regions.len(), "region ids are distinct");
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "{} and {} overlap: {:?} {:?}",
            pair[0].2,
            pair[1].2,
            pair[0],
            pair[1]
        );
    }
}

/// Each namespace's directory lists exactly its fabric pods, with their regions, nodes and IPs.
fn assert_directories(server: &ApiServer) {
    let regions = regions(server);
    let mut by_namespace: BTreeMap<&str, BTreeMap<&str, &Region>> = BTreeMap::new();
    for ((ns, name), r) in &regions {
        by_namespace.entry(ns).or_default().insert(name, r);
    }
    for (ns, pods) in by_namespace {
        let cm = server
            .object(Resource::ConfigMaps, Some(ns), &format!("{FABRIC}-regions"))
            .unwrap_or_else(|| panic!("no region directory in {ns}"));
        let text = cm["data"][DIRECTORY_KEY].as_str().expect("directory text");
        let entries: Vec<DirectoryEntry> = parse(text).expect("a directory");
        let listed: BTreeMap<&str, &DirectoryEntry> =
            entries.iter().map(|e| (e.pod.as_str(), e)).collect();
        assert_eq!(
            listed.keys().collect::<Vec<_>>(),
            pods.keys().collect::<Vec<_>>(),
            "{ns}'s directory lists its fabric pods"
        );
        for (pod, e) in listed {
            let r = pods[pod];
            assert_eq!((e.id, e.base, e.size), (r.id, r.base, r.size), "{ns}/{pod}");
            assert!(
                e.node.is_some() && e.pod_ip.is_some(),
                "{ns}/{pod} is scheduled: {e:?}"
            );
        }
    }
}

fn configured(obj: &Value) -> bool {
    obj["status"]["fabricGeneration"] == obj["spec"]["fabricGeneration"]
        && obj["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "QosApplied" && c["status"] == "True")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_converges_on_a_generated_cluster_and_handles_single_events()
-> anyhow::Result<()> {
    let cluster = GeneratedCluster::new(SIZES);
    let args: Vec<String> = ["--debounce-ms", "50", "--resync-seconds", "5"]
        .map(String::from)
        .to_vec();
    let mut h = Harness::start(
        cluster.clone(),
        Options::default(),
        Path::new(env!("CARGO_BIN_EXE_rocefabric-operator")),
        &args,
        Waits {
            pass_timeout: Duration::from_secs(30),
            quiet: Duration::from_millis(500),
        },
    )
    .await?;
    let nodes = SIZES.nodes as usize;

    let c = h.converge(nodes, Duration::from_secs(45)).await?;
    assert_eq!(c.census.fabric_pods, SIZES.fabric_pods as usize);
    assert_eq!(c.census.fabric_namespaces, SIZES.namespaces as usize);
    h.settle().await?;
    assert_regions_disjoint(&h.server, &cluster);
    assert_directories(&h.server);

    // A new fabric pod gets a region of its own and loses its gate.
    let (_, ns, name) = h.new_fabric_pod().await?;
    h.settle().await?;
    let census = h.server.census();
    assert_eq!(census.fabric_pods, SIZES.fabric_pods as usize + 1);
    assert_eq!((census.annotated, census.gated), (census.fabric_pods, 0));
    assert!(regions(&h.server).contains_key(&(ns, name)));
    assert_regions_disjoint(&h.server, &cluster);
    assert_directories(&h.server);

    // A node that leaves the fabric loses its RoceNode; back in, it is configured again.
    let node = cluster.node_name(7);
    h.node_membership(7, false).await?;
    assert!(
        h.server.object(Resource::RoceNodes, None, &node).is_none(),
        "{node} left the fabric: its RoceNode is deleted"
    );
    h.node_membership(7, true).await?;
    h.settle().await?;
    let rn = h
        .server
        .object(Resource::RoceNodes, None, &node)
        .expect("a RoceNode again");
    assert!(configured(&rn), "{node} is configured again: {rn}");
    assert_eq!(h.server.census().configured, nodes);

    // Nothing to do: no write.
    for _ in 0..3 {
        let pass = h.unrelated_change().await?;
        assert_eq!(pass.writes, 0, "an unrelated label change writes nothing");
    }
    let (warnings, first) = h.operator.warnings();
    assert_eq!(warnings, 0, "the operator warned: {first:#?}");
    Ok(())
}

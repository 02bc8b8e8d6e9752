//! The operator's planner at the largest clusters: 100,000 nodes and 100,000 fabric pods (the
//! pods the operator keeps of a 1,000,000-pod cluster), planned by the incremental planner.
//!
//! Figures: heap of the objects and indexes, the first full pass, convergence, then per-event
//! planner work (a new fabric pod to its annotation write; a node label change to its RoceNode
//! write), a pass with nothing to do, and the full pass for comparison.
//!
//! Run: `cargo bench -p rocefabric-operator --bench incremental`; sizes from `SCALE_NODES`,
//! `SCALE_FABRIC_PODS` (100,000 each) and `SCALE_EVENTS` (1,000). Memory is counted by a
//! counting global allocator (`peak_alloc`), so times are slightly pessimistic.
#![allow(clippy::unwrap_used)] // a benchmark fails loudly

mod common;

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use rocefabric_operator::objects::CompactNode;
use rocefabric_operator::planner::incremental::Incremental;
use rocefabric_operator::planner::writes::{region_directory_object, roce_node_object};
use rocefabric_operator::planner::{Plan, PlanOptions, Write};
use rocefabric_operator_testing::bench_cluster;
use rocefabric_operator_testing::objects::agent_status;

#[global_allocator]
static HEAP: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mib(bytes: usize) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The API server and the node agents: every write lands, every RoceNode written with a real
/// spec reports it applied, and the planner sees the objects as its watches would.
fn land(engine: &mut Incremental, plan: &Plan, now: Timestamp) {
    for w in &plan.writes {
        match w {
            Write::ApplyRoceNode {
                name,
                fabric_name,
                fabric_uid,
                spec,
            } => {
                let mut rn = roce_node_object(name, fabric_name, fabric_uid, spec);
                if !spec.pending {
                    rn.status = Some(agent_status(spec.fabric_generation, true, now));
                }
                engine.upsert_roce_node(rn.into());
            }
            Write::DeleteRoceNode { name } => engine.remove_roce_node(name),
            Write::ApplyFabricStatus { fabric, status } => {
                let mut f = engine.fabric(fabric).unwrap().clone();
                f.status = Some(status.clone());
                engine.upsert_fabric(f);
            }
            Write::AnnotatePodRegion {
                namespace,
                pod,
                value,
                uid,
                ..
            } => engine.annotated(namespace, pod, uid.as_deref(), value),
            Write::RemovePodGate { namespace, pod, .. } => {
                let mut p = engine.pod(namespace, pod).unwrap().clone();
                p.gates.clear();
                engine.upsert_pod(p);
            }
            Write::ApplyRegionDirectory {
                namespace,
                fabric,
                fabric_uid,
                data,
            } => {
                engine.upsert_config_map(region_directory_object(
                    namespace, fabric, fabric_uid, data,
                ));
            }
            Write::DeleteRegionDirectory { namespace, fabric } => {
                engine.remove_config_map(namespace, &format!("{fabric}-regions"));
            }
            Write::ReclaimPodRegion { namespace, pod, .. } => {
                let mut p = engine.pod(namespace, pod).unwrap().clone();
                p.region = None;
                p.region_reclaimed = true;
                engine.upsert_pod(p);
            }
            Write::Event(_) => {}
        }
    }
}

/// The heap a copy of `items` takes.
fn heap_of<T: Clone>(items: &[T]) -> usize {
    let before = HEAP.current_usage();
    let copy = items.to_vec();
    let size = HEAP.current_usage() - before;
    drop(copy);
    size
}

/// p50 and p99 of `samples`.
fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99))
}

fn main() {
    let nodes = env("SCALE_NODES", 100_000);
    let pods = env("SCALE_FABRIC_PODS", 100_000);
    let events = env("SCALE_EVENTS", 1_000);
    let namespaces = 1_000;
    let world = common::world(nodes, pods, namespaces, "1Mi", 1 << 20);
    let mut now = world.now;
    let mut engine = Incremental::new(PlanOptions::default());
    let start = Instant::now();
    engine.replace(world);
    let first = engine.plan(now);
    let cold = start.elapsed();
    println!(
        "{nodes} nodes, {pods} fabric pods in {namespaces} namespaces, 1 fabric (1,048,576 regions, maxUnavailable 10%)"
    );
    println!(
        "cold: objects taken and first full pass in {cold:.2?}: {} writes planned; heap {}",
        first.writes.len(),
        mib(HEAP.current_usage())
    );

    // Converge: 10 rollout steps of 10%, every write landing at once.
    let start = Instant::now();
    let mut plan = first;
    let mut passes = 1;
    while !plan.writes.is_empty() && passes < 40 {
        now += Duration::from_secs(1);
        land(&mut engine, &plan, now);
        plan = engine.plan(now);
        passes += 1;
    }
    assert!(plan.writes.is_empty(), "the world converges");
    let f = engine.figures();
    println!(
        "converged in {passes} passes, {:.2?} of planning and landing ({} full passes, {} incremental, {} fallbacks); heap {}",
        start.elapsed(),
        f.full_passes,
        f.incremental_plans,
        f.fallbacks,
        mib(HEAP.current_usage())
    );
    // A pass with nothing to do.
    let mut idle = Vec::new();
    for _ in 0..events {
        let t = Instant::now();
        let p = engine.plan(now);
        idle.push(t.elapsed());
        assert!(p.writes.is_empty());
    }
    let (p50, p99) = percentiles(idle);
    println!("nothing to do: p50 {p50:.2?}, p99 {p99:.2?}, 0 writes (target < 5 ms)");
    // Where the heap goes: each kind of object, measured by the heap a copy of it takes (after
    // the timed passes: freeing the copy disturbs the allocator for a while).
    let world = engine.world(now);
    println!(
        "  of which objects: nodes {}, pods {}, RoceNodes {}, directories {}; the rest is the planner's indexes",
        mib(heap_of(&world.nodes)),
        mib(heap_of(&world.pods)),
        mib(heap_of(&world.roce_nodes)),
        mib(heap_of(&world.config_maps))
    );
    drop(world);
    let r = &plan.report.fabrics[0];
    println!(
        "  status: {} of {} nodes configured, {} regions",
        r.configured_nodes, r.selected_nodes, r.region_count
    );

    // A new fabric pod, newest of all: its event taken and the pass planned.
    let mut samples = Vec::new();
    for i in 0..events {
        now += Duration::from_secs(1);
        let mut p = bench_cluster::pod(pods + i, namespaces, nodes);
        p.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        let (ns, name) = (
            p.metadata.namespace.clone().unwrap(),
            p.metadata.name.clone().unwrap(),
        );
        let t = Instant::now();
        engine.upsert_pod(p.into());
        let plan = engine.plan(now);
        samples.push(t.elapsed());
        assert!(
            plan.writes.iter().any(|w| matches!(w, Write::AnnotatePodRegion { namespace, pod, .. } if *namespace == ns && *pod == name)),
            "the new pod gets its window"
        );
        land(&mut engine, &plan, now);
        let settle = engine.plan(now);
        land(&mut engine, &settle, now);
    }
    let (p50, p99) = percentiles(samples);
    println!(
        "new fabric pod -> annotation write planned: p50 {p50:.2?}, p99 {p99:.2?} (target < 1 ms p99)"
    );
    let held = engine
        .pod("team-0000", &format!("worker-{:07}", pods))
        .and_then(|p| p.region.clone());
    assert!(held.is_some(), "the write landed");

    // A node leaves the fabric (its label changes) and comes back.
    let mut leave = Vec::new();
    let mut join = Vec::new();
    for i in 0..events {
        now += Duration::from_secs(1);
        let k = (i * 7919) % nodes;
        let mut n = CompactNode::from(bench_cluster::node(k));
        n.labels.insert("gpu", "maintenance");
        let t = Instant::now();
        engine.upsert_node(n);
        let plan = engine.plan(now);
        leave.push(t.elapsed());
        assert!(
            plan.writes
                .iter()
                .any(|w| matches!(w, Write::DeleteRoceNode { .. }))
        );
        land(&mut engine, &plan, now);
        let t = Instant::now();
        engine.upsert_node(bench_cluster::node(k).into());
        let plan = engine.plan(now);
        join.push(t.elapsed());
        assert!(
            plan.writes
                .iter()
                .any(|w| matches!(w, Write::ApplyRoceNode { .. }))
        );
        land(&mut engine, &plan, now);
        let settle = engine.plan(now);
        land(&mut engine, &settle, now);
    }
    let (p50, p99) = percentiles(leave);
    println!(
        "node label change (leaves) -> RoceNode delete planned: p50 {p50:.2?}, p99 {p99:.2?} (target < 1 ms p99)"
    );
    let (p50, p99) = percentiles(join);
    println!(
        "node label change (joins) -> RoceNode apply planned: p50 {p50:.2?}, p99 {p99:.2?} (target < 1 ms p99)"
    );

    let f = engine.figures();
    println!(
        "planner: {} full passes, {} incremental plans, {} changes, {} fallbacks; heap {}",
        f.full_passes,
        f.incremental_plans,
        f.changes,
        f.fallbacks,
        mib(HEAP.current_usage())
    );

    // The full pass over the same world, for comparison.
    let world = engine.world(now);
    let t = Instant::now();
    let full = rocefabric_operator::planner::plan(&world, &PlanOptions::default());
    println!(
        "full pass over the same world (the reference): {:.2?}, {} writes",
        t.elapsed(),
        full.writes.len()
    );
}

//! Planner benchmark: a 5,000-node fabric with 50,000 pods (first pass and steady state; time
//! and peak memory), allocating 100,000 regions, and 1M windows churned in a 16M-slot fabric.
//!
//! Run: `cargo bench -p rocefabric-operator --bench planner`. Memory is counted by a counting
//! global allocator (`peak_alloc`): the heap the world occupies, and the peak heap a plan adds
//! on top of it. That allocator copies on every `realloc`, so times are slightly pessimistic.
#![allow(clippy::unwrap_used)] // a benchmark fails loudly

mod common;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use rocefabric_operator::planner::writes::{
    region_directory_name, region_directory_object, roce_node_object,
};
use rocefabric_operator::planner::{Plan, PlanOptions, World, Write, plan};
use rocefabric_operator::regions::{Geometry, Request, Slots, allocate};
use rocefabric_operator_testing::objects::agent_status;

const NODES: usize = 5_000;
const PODS: usize = 50_000;
const NAMESPACES: usize = 100;
const REGIONS: u32 = 100_000;

#[global_allocator]
static HEAP: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Run `f`, returning its result and the peak heap it added above what was live before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    let out = f();
    (out, HEAP.peak_usage().saturating_sub(before))
}

fn world() -> World {
    common::world(NODES, PODS, NAMESPACES, "1Gi", 65_536)
}

/// Apply a plan's writes (as the API server would) and let every node report success.
fn apply(world: &mut World, p: &Plan) {
    let mut pods: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (i, pod) in world.pods.iter().enumerate() {
        pods.insert((pod.namespace.to_string(), pod.name.clone()), i);
    }
    for w in &p.writes {
        match w {
            Write::ApplyRoceNode {
                name,
                fabric_name,
                fabric_uid,
                spec,
            } => {
                world.roce_nodes.retain(|rn| rn.name != *name);
                world
                    .roce_nodes
                    .push(roce_node_object(name, fabric_name, fabric_uid, spec).into());
            }
            Write::ApplyFabricStatus { status, .. } => {
                world.fabrics[0].status = Some(status.clone())
            }
            Write::AnnotatePodRegion {
                namespace,
                pod,
                value,
                ..
            } => {
                let i = pods[&(namespace.clone(), pod.clone())];
                world.pods[i].region = Some(value.clone());
            }
            Write::RemovePodGate { namespace, pod, .. } => {
                let i = pods[&(namespace.clone(), pod.clone())];
                world.pods[i].gates.clear();
            }
            Write::ApplyRegionDirectory {
                namespace,
                fabric,
                fabric_uid,
                data,
            } => {
                let name = region_directory_name(fabric);
                world.config_maps.retain(|cm| {
                    !(cm.metadata.namespace.as_deref() == Some(namespace)
                        && cm.metadata.name.as_deref() == Some(&name))
                });
                world
                    .config_maps
                    .push(region_directory_object(namespace, fabric, fabric_uid, data));
            }
            _ => {}
        }
    }
    world.freed = p.freed.clone();
    for rn in &mut world.roce_nodes {
        rn.status = Some((&agent_status(rn.spec.fabric_generation, true, world.now)).into());
    }
}

fn timed<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, Duration, T) {
    let mut best = Duration::MAX;
    let mut total = Duration::ZERO;
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        let out = f();
        let took = start.elapsed();
        best = best.min(took);
        total += took;
        last = Some(black_box(out));
    }
    (best, total / runs as u32, last.unwrap())
}

fn main() {
    let opts = PlanOptions::default();
    let (mut w, world_heap) = peak_of(world);
    println!(
        "world: {NODES} nodes, {PODS} pods in {NAMESPACES} namespaces, 1 fabric (65,536 regions of 1Gi, \
         maxUnavailable 10%), {} of heap",
        mib(world_heap)
    );

    let (first, first_peak) = peak_of(|| plan(&w, &opts));
    let (best, mean, _) = timed(3, || plan(&w, &opts));
    println!(
        "first pass   (nothing written yet): best {best:.2?}, mean {mean:.2?} over 3; {} writes; peak heap +{} above the world",
        first.writes.len(),
        mib(first_peak)
    );

    // Converge: the rollout takes 10 passes of 500 nodes; regions are all assigned in the first.
    let mut passes = 0;
    let mut p = first;
    while !p.writes.is_empty() && passes < 50 {
        apply(&mut w, &p);
        p = plan(&w, &opts);
        passes += 1;
    }
    assert!(p.writes.is_empty(), "the benchmark world converges");
    drop(p);
    let (steady, steady_peak) = peak_of(|| plan(&w, &opts));
    let (best, mean, _) = timed(5, || plan(&w, &opts));
    println!(
        "steady state (converged after {passes} passes): best {best:.2?}, mean {mean:.2?} over 5; {} writes; \
         peak heap +{} above the world ({} with its RoceNodes, annotations and directories)",
        steady.writes.len(),
        mib(steady_peak),
        mib(HEAP.current_usage())
    );
    let f = &steady.report.fabrics[0];
    println!(
        "  status: {} nodes configured of {} selected, {} regions allocated of {}",
        f.configured_nodes, f.selected_nodes, f.regions_allocated, f.region_capacity
    );
    drop(w);

    // The region allocator alone.
    let g = Geometry::new(1 << 30, 1 << 20).unwrap();
    let fresh: Vec<Request> = (0..REGIONS)
        .map(|i| Request {
            existing: None,
            len: 1 + u32::from(i % 16 == 0),
            pinned: false,
        })
        .collect();
    let (a, alloc_peak) = peak_of(|| allocate(g, &fresh, &[]));
    let (best, mean, _) = timed(5, || allocate(g, &fresh, &[]));
    println!(
        "allocate {REGIONS} new regions (every 16th two slots) in 1,048,576 slots: best {best:.2?}, mean {mean:.2?}; \
         {} slots live; peak heap +{}",
        a.live_slots,
        mib(alloc_peak)
    );
    let recorded: Vec<Request> = a
        .outcomes
        .iter()
        .map(|o| Request {
            existing: o.slots(),
            len: 1,
            pinned: false,
        })
        .collect();
    let cooling: Vec<Slots> = (0..1_000)
        .map(|i| Slots {
            first: 500_000 + i * 3,
            len: 1,
        })
        .collect();
    let (best, mean, _) = timed(5, || allocate(g, &recorded, &cooling));
    println!(
        "rebuild {REGIONS} recorded regions with 1,000 cooling windows: best {best:.2?}, mean {mean:.2?}"
    );
    let full = Geometry::new(1 << 30, REGIONS).unwrap();
    let over: Vec<Request> = (0..2 * REGIONS)
        .map(|_| Request {
            existing: None,
            len: 1,
            pinned: false,
        })
        .collect();
    let (best, mean, a) = timed(5, || allocate(full, &over, &[]));
    println!(
        "allocate {} requests into {REGIONS} slots (half wait): best {best:.2?}, mean {mean:.2?}; {} waiting",
        2 * REGIONS,
        a.waiting()
    );
    churn_at_scale();
}

/// Issue 13's region target: 1M windows in a 16M-slot fabric allocated, half of them freed (their
/// windows cooling) and as many new ones allocated; every step checked for double booking.
fn churn_at_scale() {
    const SLOTS: u32 = 1 << 24;
    const WINDOWS: u32 = 1 << 20;
    let g = Geometry::new(1 << 20, SLOTS).unwrap();
    let start = Instant::now();
    let fresh: Vec<Request> = (0..WINDOWS)
        .map(|i| Request {
            existing: None,
            len: 1 + (i % 4),
            pinned: false,
        })
        .collect();
    let first = allocate(g, &fresh, &[]);
    let allocated = start.elapsed();
    // Every other pod ends: its window cools; the rest keep theirs; as many new pods arrive.
    let (kept, freed): (Vec<_>, Vec<_>) = first
        .outcomes
        .iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let cooling: Vec<Slots> = freed.iter().filter_map(|(_, o)| o.slots()).collect();
    let mut next: Vec<Request> = kept
        .iter()
        .map(|(_, o)| Request {
            existing: o.slots(),
            len: o.slots().map_or(1, |s| s.len),
            pinned: true,
        })
        .collect();
    next.extend((0..WINDOWS / 2).map(|i| Request {
        existing: None,
        len: 1 + (i % 4),
        pinned: false,
    }));
    let churned = Instant::now();
    let second = allocate(g, &next, &cooling);
    let churn = churned.elapsed();
    let total = start.elapsed();
    // No slot held twice, and no new window over a cooling one.
    let mut owner = vec![false; SLOTS as usize];
    for s in &cooling {
        for i in s.first..s.first + s.len {
            owner[i as usize] = true;
        }
    }
    let mut live = 0u64;
    for o in &second.outcomes {
        let s = o.slots().expect("room for every window");
        live += u64::from(s.len);
        for i in s.first..s.first + s.len {
            assert!(!owner[i as usize], "slot {i} double-booked");
            owner[i as usize] = true;
        }
    }
    println!(
        "regions at scale: {WINDOWS} windows (1-4 slots) in {SLOTS} slots {allocated:.2?}; free half and \
         allocate {} new {churn:.2?}; total {total:.2?}; {live} slots live, no slot double-booked",
        WINDOWS / 2
    );
}

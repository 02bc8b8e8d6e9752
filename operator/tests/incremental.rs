//! The incremental planner gives the full pass's plan after any sequence of changes.
//!
//! Random sequences of node, RoceNode, pod, fabric and directory changes, clock steps and
//! passes whose writes land in full, in part or not at all are applied to one world. After each
//! change the incremental planner is fed the objects that changed (as the watches would), and at
//! each pass its plan (writes in order, report, requeue) and its memory are compared with
//! [`plan`] over the same world and the full pass's own memory.
//!
//! `cargo test` runs 64 sequences of up to 80 steps; `ROCEFABRIC_PROPTEST_CASES=5000` runs more.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

mod support;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use rocefabric_operator::planner::incremental::Incremental;
use rocefabric_operator::planner::{Plan, PlanOptions, World, plan};
use rocefabric_operator_testing::objects::*;
use serde_json::Value;
use support::*;

#[derive(Clone, Debug)]
enum Op {
    /// A node with labels from `group` (0: none, 1: fabric a, 2: tier gpu, 3: both).
    Node {
        id: u8,
        group: u8,
    },
    RemoveNode(u8),
    /// The node agent reports on the node's RoceNode.
    Report {
        id: u8,
        applied: bool,
    },
    RemoveRoceNode(u8),
    /// A pod `created` seconds after the clock's start, member of fabric `member` (0: none,
    /// 1: a, 2: b), gated or not, with size request `size` (0: none, 1: "1", 2: "2", 3: bad).
    Pod {
        ns: u8,
        id: u8,
        created: u8,
        member: u8,
        gated: bool,
        size: u8,
    },
    /// Bind an ungated pod to a node.
    Schedule {
        ns: u8,
        id: u8,
    },
    Finish {
        ns: u8,
        id: u8,
    },
    Terminate {
        ns: u8,
        id: u8,
    },
    /// Its data plane gives up on the window (the container's termination message), or runs
    /// again.
    WindowFails {
        ns: u8,
        id: u8,
        failed: bool,
    },
    RemovePod {
        ns: u8,
        id: u8,
    },
    /// Copy one pod's annotation onto another.
    Copy {
        from: u8,
        to: u8,
    },
    /// 0: QoS edit, 1: budget, 2: grow the space, 3: drop shared memory, 4: fabric b appears,
    /// 5: fabric b goes, 6: per-namespace quota.
    Fabric(u8),
    RemoveDirectory {
        ns: u8,
    },
    Clock(u8),
    /// Plan; the writes land in full (0), the first half (1), none (2).
    Pass(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..10, 0u8..4).prop_map(|(id, group)| Op::Node { id, group }),
        1 => (0u8..10).prop_map(Op::RemoveNode),
        3 => (0u8..10, any::<bool>()).prop_map(|(id, applied)| Op::Report { id, applied }),
        1 => (0u8..10).prop_map(Op::RemoveRoceNode),
        6 => (0u8..3, 0u8..16, 0u8..60, 0u8..3, any::<bool>(), 0u8..4).prop_map(
            |(ns, id, created, member, gated, size)| Op::Pod { ns, id, created, member, gated, size }
        ),
        2 => (0u8..3, 0u8..16).prop_map(|(ns, id)| Op::Schedule { ns, id }),
        1 => (0u8..3, 0u8..16).prop_map(|(ns, id)| Op::Finish { ns, id }),
        1 => (0u8..3, 0u8..16).prop_map(|(ns, id)| Op::Terminate { ns, id }),
        1 => (0u8..3, 0u8..16, any::<bool>())
            .prop_map(|(ns, id, failed)| Op::WindowFails { ns, id, failed }),
        2 => (0u8..3, 0u8..16).prop_map(|(ns, id)| Op::RemovePod { ns, id }),
        1 => (0u8..16, 0u8..16).prop_map(|(from, to)| Op::Copy { from, to }),
        1 => (0u8..7).prop_map(Op::Fabric),
        1 => (0u8..3).prop_map(|ns| Op::RemoveDirectory { ns }),
        2 => (1u8..40).prop_map(Op::Clock),
        6 => (0u8..3).prop_map(Op::Pass),
    ]
}

fn node_name(id: u8) -> String {
    format!("n-{id:02}")
}

fn ns_name(ns: u8) -> String {
    format!("ns-{ns}")
}

fn pod_name(id: u8) -> String {
    format!("p-{id:02}")
}

/// One world, the reference memory, and the incremental planner fed its changes.
struct Sim {
    world: World,
    engine: Incremental,
    opts: PlanOptions,
    clock: i64,
    passes: usize,
}

impl Sim {
    fn new(opts: PlanOptions) -> Self {
        let a = with_shared_memory(fabric("a", 0, &[("fabric", "a")]), "1Mi", 12, &[]);
        let mut world = world(vec![a], Vec::new(), Vec::new());
        world.now = ts(T0 + 3600);
        let mut engine = Incremental::new(opts.clone());
        engine.replace(world.clone());
        Sim {
            world,
            engine,
            opts,
            clock: T0 + 3600,
            passes: 0,
        }
    }

    fn pod_mut(&mut self, ns: u8, id: u8) -> Option<&mut CompactPod> {
        let (ns, name) = (ns_name(ns), pod_name(id));
        self.world.pods.iter_mut().find(|p| p.key() == (&ns, &name))
    }

    fn apply(&mut self, op: &Op) {
        let before = self.world.clone();
        match op {
            Op::Node { id, group } => {
                let pairs: &[(&str, &str)] = match group {
                    0 => &[],
                    1 => &[("fabric", "a")],
                    2 => &[("tier", "gpu")],
                    _ => &[("fabric", "a"), ("tier", "gpu")],
                };
                let n = CompactNode::from(node(&node_name(*id), pairs));
                self.world.nodes.retain(|x| x.name != n.name);
                self.world.nodes.push(n);
            }
            Op::RemoveNode(id) => {
                let name = node_name(*id);
                self.world.nodes.retain(|n| n.name != name);
            }
            Op::Report { id, applied } => {
                let name = node_name(*id);
                agent_reports(&mut self.world, &[name.as_str()], *applied);
            }
            Op::RemoveRoceNode(id) => {
                let name = node_name(*id);
                self.world.roce_nodes.retain(|n| n.name != name);
            }
            Op::Pod {
                ns,
                id,
                created,
                member,
                gated,
                size,
            } => {
                let pairs: &[(&str, &str)] = match member {
                    0 => &[("app", "x")],
                    1 => &[("rocefabric.io/fabric", "a")],
                    _ => &[("rocefabric.io/fabric", "b")],
                };
                // Creation times run with the clock, so most new pods sort last.
                let at = self.clock - T0 - 60 + i64::from(*created);
                let mut p = pod(&ns_name(*ns), &pod_name(*id), at, pairs, *gated);
                p.metadata.uid = Some(format!("uid-{ns}-{id}-{}", self.clock));
                p.metadata.resource_version = Some("1".into());
                match size {
                    1 => p = with_size_request(p, "1Mi"),
                    2 => p = with_size_request(p, "2Mi"),
                    3 => p = with_size_request(p, "lots"),
                    _ => {}
                }
                let p = CompactPod::from(p);
                self.world.pods.retain(|x| x.key() != p.key());
                self.world.pods.push(p);
            }
            Op::Schedule { ns, id } => {
                let node = node_name(*id % 10);
                if let Some(p) = self.pod_mut(*ns, *id)
                    && p.gates.is_empty()
                {
                    edit(p, |p| scheduled(p, &node, &format!("10.0.{ns}.{id}")));
                    bump(p);
                }
            }
            Op::Finish { ns, id } => {
                if let Some(p) = self.pod_mut(*ns, *id) {
                    p.phase = Some("Succeeded".into());
                    bump(p);
                }
            }
            Op::Terminate { ns, id } => {
                if let Some(p) = self.pod_mut(*ns, *id) {
                    p.deleting = true;
                    bump(p);
                }
            }
            Op::WindowFails { ns, id, failed } => {
                if let Some(p) = self.pod_mut(*ns, *id) {
                    p.window_failed = *failed;
                    bump(p);
                }
            }
            Op::RemovePod { ns, id } => {
                let (ns, name) = (ns_name(*ns), pod_name(*id));
                self.world.pods.retain(|p| p.key() != (&ns, &name));
            }
            Op::Copy { from, to } => {
                let value = self.pod_mut(0, *from).and_then(|p| p.region.clone());
                if let (Some(v), Some(p)) = (value, self.pod_mut(0, *to)) {
                    edit(p, |p| with_annotation(p, &v));
                    bump(p);
                }
            }
            Op::Fabric(kind) => self.edit_fabric(*kind),
            Op::RemoveDirectory { ns } => {
                let ns = ns_name(*ns);
                self.world
                    .config_maps
                    .retain(|cm| cm.metadata.namespace.as_deref() != Some(&ns));
            }
            Op::Clock(secs) => {
                self.clock += i64::from(*secs);
                self.world.now = ts(self.clock);
            }
            Op::Pass(landed) => {
                self.pass(*landed);
                return;
            }
        }
        sync(&mut self.engine, &before, &self.world);
    }

    fn edit_fabric(&mut self, kind: u8) {
        let find = |w: &mut World, name: &str| -> Option<usize> {
            w.fabrics
                .iter()
                .position(|f| f.metadata.name.as_deref() == Some(name))
        };
        let bump_gen = |f: &mut rocefabric_api::RoceFabric| {
            f.metadata.generation = Some(f.metadata.generation.unwrap_or(1) + 1);
        };
        match kind {
            0 => {
                if let Some(i) = find(&mut self.world, "a") {
                    let f = &mut self.world.fabrics[i];
                    let dscp = if f.spec.qos.roce_dscp == 26 { 24 } else { 26 };
                    bump_dscp(f, dscp);
                }
            }
            1 => {
                if let Some(i) = find(&mut self.world, "a") {
                    let f = &mut self.world.fabrics[i];
                    f.spec.rollout.max_unavailable = match f.spec.rollout.max_unavailable {
                        IntOrString::Int(1) => IntOrString::Int(3),
                        _ => IntOrString::Int(1),
                    };
                    bump_gen(f);
                }
            }
            2 | 3 | 6 => {
                if let Some(i) = find(&mut self.world, "a") {
                    let f = &mut self.world.fabrics[i];
                    match (kind, f.spec.shared_memory.as_mut()) {
                        (2, Some(sm)) => sm.max_regions += 4,
                        (3, Some(_)) => f.spec.shared_memory = None,
                        (6, Some(sm)) => {
                            sm.max_regions_per_namespace = match sm.max_regions_per_namespace {
                                None => Some(3),
                                Some(_) => None,
                            }
                        }
                        (_, None) => {
                            *f = with_shared_memory(f.clone(), "1Mi", 12, &[]);
                        }
                        _ => {}
                    }
                    bump_gen(f);
                }
            }
            4 => {
                if find(&mut self.world, "b").is_none() {
                    let b = with_shared_memory(fabric("b", 10, &[("tier", "gpu")]), "1Mi", 6, &[]);
                    self.world.fabrics.push(b);
                }
            }
            _ => self
                .world
                .fabrics
                .retain(|f| f.metadata.name.as_deref() != Some("b")),
        }
    }

    fn pass(&mut self, landed: u8) {
        self.passes += 1;
        let reference = plan(&self.world, &self.opts);
        let incremental = self.engine.plan(self.world.now);
        compare(&reference, &incremental, &self.engine, self.passes);
        let before = self.world.clone();
        let n = match landed {
            0 => reference.writes.len(),
            1 => reference.writes.len() / 2,
            _ => 0,
        };
        apply_writes(&mut self.world, &reference.writes[..n]);
        for p in &mut self.world.pods {
            if before.pods.iter().any(|b| b.uid == p.uid && b != p) {
                bump(p);
            }
        }
        self.world.freed = reference.freed;
        sync(&mut self.engine, &before, &self.world);
    }
}

/// A write changes the resourceVersion, as the API server does.
fn bump(p: &mut CompactPod) {
    let rv: u64 = p
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    p.resource_version = Some((rv + 1).to_string());
}

fn compare(reference: &Plan, incremental: &Plan, engine: &Incremental, pass: usize) {
    if reference.writes != incremental.writes {
        let at = reference
            .writes
            .iter()
            .zip(&incremental.writes)
            .position(|(a, b)| a != b)
            .unwrap_or(reference.writes.len().min(incremental.writes.len()));
        panic!(
            "pass {pass}: writes differ at {at} of {} / {}:\nfull:        {}\nincremental: {}",
            reference.writes.len(),
            incremental.writes.len(),
            reference
                .writes
                .get(at)
                .map(|w| serde_json::to_string(w).unwrap())
                .unwrap_or_default(),
            incremental
                .writes
                .get(at)
                .map(|w| serde_json::to_string(w).unwrap())
                .unwrap_or_default(),
        );
    }
    assert_eq!(
        reference.report.fabrics, incremental.report.fabrics,
        "pass {pass}: fabric reports differ"
    );
    assert_eq!(
        reference.report.deleted_roce_nodes, incremental.report.deleted_roce_nodes,
        "pass {pass}: deleted RoceNodes differ"
    );
    assert_eq!(
        reference.requeue_after, incremental.requeue_after,
        "pass {pass}: requeue differs"
    );
    assert_eq!(
        reference.freed,
        engine.memory(),
        "pass {pass}: memory differs"
    );
}

/// Feed the engine every object that differs between `before` and `after`.
fn sync(engine: &mut Incremental, before: &World, after: &World) {
    fn by_key<T: serde::Serialize>(
        items: &[T],
        key: impl Fn(&T) -> (String, String),
    ) -> BTreeMap<(String, String), (Value, &T)> {
        items
            .iter()
            .map(|t| (key(t), (serde_json::to_value(t).unwrap(), t)))
            .collect()
    }
    macro_rules! diff {
        ($field:ident, $key:expr, $upsert:expr, $remove:expr) => {{
            let old = by_key(&before.$field, $key);
            let new = by_key(&after.$field, $key);
            for (k, _) in old.iter().filter(|(k, _)| !new.contains_key(*k)) {
                $remove(engine, k);
            }
            for (k, (v, t)) in &new {
                if old.get(k).map(|(ov, _)| ov) != Some(v) {
                    $upsert(engine, (*t).clone());
                }
            }
        }};
    }
    let name = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        (
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    };
    diff!(
        fabrics,
        |f: &rocefabric_api::RoceFabric| name(&f.metadata),
        |e: &mut Incremental, f| e.upsert_fabric(f),
        |e: &mut Incremental, k: &(String, String)| e.remove_fabric(&k.1)
    );
    diff!(
        nodes,
        |n: &CompactNode| (String::new(), n.name.clone()),
        |e: &mut Incremental, n| e.upsert_node(n),
        |e: &mut Incremental, k: &(String, String)| e.remove_node(&k.1)
    );
    diff!(
        roce_nodes,
        |n: &CompactRoceNode| (String::new(), n.name.clone()),
        |e: &mut Incremental, n| e.upsert_roce_node(n),
        |e: &mut Incremental, k: &(String, String)| e.remove_roce_node(&k.1)
    );
    diff!(
        pods,
        |p: &CompactPod| (p.namespace.to_string(), p.name.clone()),
        |e: &mut Incremental, p| e.upsert_pod(p),
        |e: &mut Incremental, k: &(String, String)| e.remove_pod(&k.0, &k.1)
    );
    diff!(
        config_maps,
        |c: &k8s_openapi::api::core::v1::ConfigMap| name(&c.metadata),
        |e: &mut Incremental, c| e.upsert_config_map(c),
        |e: &mut Incremental, k: &(String, String)| e.remove_config_map(&k.0, &k.1)
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: rocefabric_operator_testing::proptest_cases(), ..ProptestConfig::default() })]

    #[test]
    fn incremental_and_full_plans_are_equal(
        ops in proptest::collection::vec(op(), 1..80),
        hold in any::<bool>(),
    ) {
        let mut sim = Sim::new(PlanOptions {
            hold_after_takeover: hold,
            ..PlanOptions::default()
        });
        for op in &ops {
            sim.apply(op);
        }
        sim.apply(&Op::Pass(0));
    }
}

/// The fast paths are taken: in a settled fabric, a new pod, its annotation seen, a node
/// joining and its agent's report are each planned off the indexes, with no full pass.
#[test]
fn settled_changes_are_planned_without_a_full_pass() {
    let mut sim = settled();
    let settled = sim.engine.figures();
    sim.apply(&Op::Clock(1));
    sim.apply(&Op::Pod {
        ns: 0,
        id: 9,
        created: 59,
        member: 1,
        gated: true,
        size: 0,
    });
    sim.apply(&Op::Node { id: 7, group: 1 });
    sim.apply(&Op::Pass(0));
    sim.apply(&Op::Report {
        id: 7,
        applied: true,
    });
    sim.apply(&Op::Pass(0));
    sim.apply(&Op::Pass(0));
    let after = sim.engine.figures();
    assert_eq!(
        after.full_passes, settled.full_passes,
        "{settled:?} -> {after:?}"
    );
    assert_eq!(
        after.fallbacks, settled.fallbacks,
        "{settled:?} -> {after:?}"
    );
    assert!(after.incremental_plans >= settled.incremental_plans + 3);
    let pod = sim.pod_mut(0, 9).unwrap().clone();
    assert!(
        pod.region.is_some(),
        "the new pod got its region off the indexes"
    );
}

/// Six nodes and six pods of fabric `a`, every node reporting, every pod given its region.
fn settled() -> Sim {
    let mut sim = Sim::new(PlanOptions::default());
    for id in 0..6 {
        sim.apply(&Op::Node { id, group: 1 });
    }
    for id in 0..6 {
        sim.apply(&Op::Pod {
            ns: id % 2,
            id,
            created: 1,
            member: 1,
            gated: true,
            size: 0,
        });
    }
    for _ in 0..4 {
        sim.apply(&Op::Pass(0));
        for id in 0..6 {
            sim.apply(&Op::Report { id, applied: true });
        }
    }
    sim.apply(&Op::Pass(0));
    sim
}

/// An edit of what the nodes apply (QoS) or of the rollout's pace rolls out off the indexes:
/// on a large fabric a full pass costs seconds. (Each pass is checked against the full pass.)
#[test]
fn a_qos_or_rollout_edit_is_planned_without_a_full_pass() {
    let mut sim = settled();
    let settled = sim.engine.figures();
    let roll_out = |sim: &mut Sim| {
        for _ in 0..8 {
            sim.apply(&Op::Pass(0));
            for id in 0..6 {
                sim.apply(&Op::Report { id, applied: true });
            }
        }
        sim.apply(&Op::Pass(0));
    };
    // The QoS edit goes out: every node holds the new generation.
    sim.apply(&Op::Fabric(0));
    roll_out(&mut sim);
    let generation = sim.world.fabrics[0].metadata.generation;
    let held: Vec<_> = sim
        .world
        .roce_nodes
        .iter()
        .map(|rn| rn.spec.fabric_generation)
        .collect();
    assert!(
        held.iter().all(|g| Some(*g) == generation),
        "{held:?} against {generation:?}"
    );
    // A new pace (`maxUnavailable`) changes what nodes apply not at all.
    sim.apply(&Op::Fabric(1));
    roll_out(&mut sim);
    let after = sim.engine.figures();
    assert_eq!(
        (after.full_passes, after.fallbacks),
        (settled.full_passes, settled.fallbacks),
        "{settled:?} -> {after:?}"
    );
    assert!(after.incremental_plans >= settled.incremental_plans + 18);
}

/// The equality above is not won by falling back: over random sequences, a good share of the
/// plans are read off the indexes.
#[test]
fn random_sequences_mostly_take_the_fast_paths() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let (mut full, mut incremental) = (0, 0);
    for _ in 0..64 {
        let ops = proptest::collection::vec(op(), 40..80)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let mut sim = Sim::new(PlanOptions::default());
        for op in &ops {
            sim.apply(op);
        }
        let f = sim.engine.figures();
        full += f.full_passes;
        incremental += f.incremental_plans;
    }
    eprintln!("plans: {full} full, {incremental} incremental");
    assert!(
        incremental * 2 > full,
        "{full} full passes against {incremental} incremental plans"
    );
}

/// The `plan` command's per-node lists come from the full pass: an engine asked for a detailed
/// report never reads a plan off its indexes.
#[test]
fn a_detailed_report_always_comes_from_the_full_pass() {
    let opts = PlanOptions {
        detailed_report: true,
        ..PlanOptions::default()
    };
    let a = fabric("a", 0, &[("fabric", "a")]);
    let nodes = vec![
        node("n1", &[("fabric", "a")]),
        node("n2", &[("fabric", "a")]),
    ];
    let mut w = world(vec![a], nodes, Vec::new());
    w.now = now();
    let mut engine = Incremental::new(opts.clone());
    engine.replace(w.clone());
    let first = engine.plan(w.now);
    let second = engine.plan(w.now);
    assert_eq!(engine.figures().full_passes, 2);
    assert_eq!(second.report.nodes.len(), 2, "{:?}", second.report);
    assert_eq!(first.report.nodes.len(), plan(&w, &opts).report.nodes.len());
}

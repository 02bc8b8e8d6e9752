//! The central promise, as a property: two live pods never hold overlapping windows, and a
//! started pod's window never changes. The planner runs through random sequences of new pods,
//! deletions, finished pods, relabels, selector edits, `maxRegions` growth (the only geometry
//! edit the CRD allows), scheduling, clock steps past the grace period, failed writes and leader
//! changes whose new leader starts from empty memory and a stale cache. Writes reach a simulated
//! API server that enforces what the real one does: the annotation patch's uid and
//! resourceVersion preconditions, and the gate removal only on a pod carrying its annotation.
//!
//! `cargo test` runs 64 sequences of up to 60 steps; `ROCEFABRIC_PROPTEST_CASES=5000` runs more.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

mod support;

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use rocefabric_api::constants::REGION_SCHEDULING_GATE;
use rocefabric_formats::region::RegionAssignment;
use rocefabric_operator::planner::{PlanOptions, World, Write, plan};
use rocefabric_operator::regions::FreedRegions;
use rocefabric_operator_testing::objects::*;
use support::*;

const APP: (&str, &str) = ("app", "x");

#[derive(Clone, Debug)]
enum Op {
    /// A gated pod asking for `size` regions, labelled as a member and/or with `app: x`.
    NewPod {
        size: u8,
        member: bool,
        app: bool,
    },
    Delete(usize),
    Finish(usize),
    /// Toggle the member label (and `app: x`, so either selector can lose the pod).
    Relabel(usize),
    /// Bind an ungated pod to a node.
    Schedule(usize),
    /// Switch the fabric's pod selector between the default and `app: x`.
    ToggleSelector,
    GrowSpace,
    Clock(u64),
    /// The operator plans and writes; `fail` drops writes whose index bit is set.
    Pass {
        fail: u16,
    },
    /// Another replica takes over: no memory, and its first view is `lag` steps old.
    NewLeader {
        lag: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..=3, any::<bool>(), any::<bool>())
            .prop_map(|(size, member, app)| Op::NewPod { size, member, app }),
        1 => any::<usize>().prop_map(Op::Delete),
        1 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Relabel),
        2 => any::<usize>().prop_map(Op::Schedule),
        1 => Just(Op::ToggleSelector),
        1 => Just(Op::GrowSpace),
        2 => (1u64..=40).prop_map(Op::Clock),
        6 => any::<u16>().prop_map(|f| Op::Pass { fail: f & f.rotate_left(3) }),
        1 => (0usize..4).prop_map(|lag| Op::NewLeader { lag }),
    ]
}

/// The API server's truth, the operator's memory, and what the invariants remember.
struct Sim {
    truth: World,
    /// Snapshots of the pods after each step, newest last (the stale caches a new leader sees).
    history: Vec<Vec<CompactPod>>,
    /// The view of the next pass when a new leader starts from a stale cache.
    stale_view: Option<Vec<CompactPod>>,
    next_pod: u32,
    /// uid -> the annotation it had when first seen started.
    started: HashMap<String, String>,
    /// (uid, annotation) -> (window, when first seen): every window every pod was seen with.
    assigned: HashMap<(String, String), (RegionAssignment, k8s_openapi::jiff::Timestamp)>,
    /// Windows of pods gone or finished, and when they went.
    freed: Vec<(RegionAssignment, k8s_openapi::jiff::Timestamp)>,
    options: PlanOptions,
}

fn rv(p: &CompactPod) -> u64 {
    p.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn bump(p: &mut CompactPod) {
    p.resource_version = Some((rv(p) + 1).to_string());
}

fn is_gated(p: &CompactPod) -> bool {
    p.gates.iter().any(|g| g == REGION_SCHEDULING_GATE)
}

fn annotation(p: &CompactPod) -> Option<&String> {
    p.region.as_ref()
}

fn finished(p: &CompactPod) -> bool {
    matches!(p.phase.as_deref(), Some("Succeeded" | "Failed"))
}

impl Sim {
    fn new() -> Self {
        let fabric = with_shared_memory(fabric("f", 0, &[]), "1Gi", 6, &[]);
        let mut truth = world(vec![fabric], nodes("n", 1, &[]), vec![]);
        truth.freed = FreedRegions::default();
        Sim {
            truth,
            history: Vec::new(),
            stale_view: None,
            next_pod: 0,
            started: HashMap::new(),
            assigned: HashMap::new(),
            freed: Vec::new(),
            options: PlanOptions {
                hold_after_takeover: true,
                ..PlanOptions::default()
            },
        }
    }

    fn pod_mut(&mut self, i: usize) -> Option<&mut CompactPod> {
        let n = self.truth.pods.len();
        (n > 0).then(|| &mut self.truth.pods[i % n])
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::NewPod { size, member, app } => {
                let name = format!("p{}", self.next_pod);
                self.next_pod += 1;
                let mut labels = Vec::new();
                if member {
                    labels.push(MEMBER);
                }
                if app {
                    labels.push(APP);
                }
                let created = i64::from(self.next_pod);
                let mut p = pod("ns", &name, created, &labels, true);
                if size > 1 {
                    p = with_size_request(p, &format!("{size}Gi"));
                }
                let mut p = CompactPod::from(p);
                bump(&mut p);
                self.truth.pods.push(p);
            }
            Op::Delete(i) => {
                let n = self.truth.pods.len();
                if n > 0 {
                    let gone = self.truth.pods.remove(i % n);
                    // A finished pod's window went when it finished.
                    if !finished(&gone) {
                        self.went(&gone);
                    }
                }
            }
            Op::Finish(i) => {
                if let Some(p) = self.pod_mut(i)
                    && !finished(p)
                {
                    p.phase = Some("Succeeded".into());
                    bump(p);
                    let p = p.clone();
                    self.went(&p);
                }
            }
            Op::Relabel(i) => {
                if let Some(p) = self.pod_mut(i) {
                    edit(p, |mut p| {
                        let labels = p.metadata.labels.get_or_insert_default();
                        if labels.remove(MEMBER.0).is_none() {
                            labels.insert(MEMBER.0.into(), MEMBER.1.into());
                        }
                        if labels.remove(APP.0).is_none() {
                            labels.insert(APP.0.into(), APP.1.into());
                        }
                        p
                    });
                    bump(p);
                }
            }
            Op::Schedule(i) => {
                if let Some(p) = self.pod_mut(i)
                    && !is_gated(p)
                    && !finished(p)
                {
                    edit(p, |p| scheduled(p, "n0", "10.0.0.1"));
                    bump(p);
                }
            }
            Op::ToggleSelector => {
                let sm = self.truth.fabrics[0].spec.shared_memory.as_mut().unwrap();
                sm.pod_selector.match_labels = match sm.pod_selector.match_labels {
                    Some(_) => None,
                    None => labels(&[APP]),
                };
            }
            Op::GrowSpace => {
                let sm = self.truth.fabrics[0].spec.shared_memory.as_mut().unwrap();
                sm.max_regions = (sm.max_regions + 1).min(12);
            }
            Op::Clock(s) => self.truth.now += Duration::from_secs(s),
            Op::Pass { fail } => self.pass(fail),
            Op::NewLeader { lag } => {
                self.truth.freed = FreedRegions::default();
                let k = self.history.len().saturating_sub(lag + 1);
                self.stale_view = self.history.get(k).cloned();
            }
        }
        self.history.push(self.truth.pods.clone());
    }

    /// A pod left (deleted or finished): its window, if any, starts its grace period.
    fn went(&mut self, p: &CompactPod) {
        if let Some(a) = annotation(p).and_then(|a| RegionAssignment::parse(a).ok()) {
            self.freed.push((a, self.truth.now));
        }
    }

    /// One operator pass: plan over its view, then the shell's writes against the truth.
    fn pass(&mut self, fail: u16) {
        let mut view = self.truth.clone();
        if let Some(stale) = self.stale_view.take() {
            view.pods = stale;
        }
        let p = plan(&view, &self.options);
        let mut failed_annotations: Vec<(String, String)> = Vec::new();
        let mut others = Vec::new();
        for (i, w) in p.writes.iter().enumerate() {
            let dropped = fail & (1 << (i % 16)) != 0;
            match w {
                Write::AnnotatePodRegion {
                    namespace,
                    pod,
                    value,
                    uid,
                    resource_version,
                } => {
                    let target = self
                        .truth
                        .pods
                        .iter_mut()
                        .find(|p| p.key() == (namespace, pod));
                    // The API server's preconditions: same uid, unchanged since read.
                    let ok = !dropped
                        && target.as_ref().is_some_and(|t| {
                            uid.as_ref().is_none_or(|u| t.uid.as_ref() == Some(u))
                                && resource_version
                                    .as_ref()
                                    .is_none_or(|r| t.resource_version.as_ref() == Some(r))
                        });
                    match target {
                        Some(t) if ok => {
                            t.region = Some(value.clone());
                            bump(t);
                        }
                        _ => failed_annotations.push((namespace.clone(), pod.clone())),
                    }
                }
                Write::RemovePodGate { namespace, pod, .. } => {
                    if dropped || failed_annotations.contains(&(namespace.clone(), pod.clone())) {
                        continue;
                    }
                    // The shell reads the pod and keeps the gate unless it carries its annotation.
                    if let Some(t) = self
                        .truth
                        .pods
                        .iter_mut()
                        .find(|p| p.key() == (namespace, pod))
                        && annotation(t).is_some()
                    {
                        t.gates.retain(|g| g != REGION_SCHEDULING_GATE);
                        bump(t);
                    }
                }
                other if !dropped => others.push(other.clone()),
                _ => {}
            }
        }
        apply_writes(&mut self.truth, &others);
        self.truth.freed = p.freed.clone();
    }

    /// The promise, checked on the truth.
    fn check(&mut self, step: usize, ops: &[Op]) {
        let live: Vec<(&str, RegionAssignment)> = self
            .truth
            .pods
            .iter()
            .filter(|p| !finished(p))
            .filter_map(|p| {
                let a = RegionAssignment::parse(annotation(p)?).ok()?;
                Some((p.name.as_str(), a))
            })
            .collect();
        for (i, (a, wa)) in live.iter().enumerate() {
            for (b, wb) in &live[i + 1..] {
                let overlap = wa.base < wb.base + wb.size && wb.base < wa.base + wa.size;
                assert!(
                    !overlap,
                    "step {step}: {a} {wa:?} overlaps {b} {wb:?}\nops: {:#?}",
                    &ops[..=step]
                );
            }
        }
        // A window is handed out again only after the grace period of its last holder.
        let grace = self.options.region_grace;
        for p in self.truth.pods.iter().filter(|p| !finished(p)) {
            let Some(text) = annotation(p) else { continue };
            let Ok(a) = RegionAssignment::parse(text) else {
                continue;
            };
            let uid = p.uid.clone().unwrap_or_default();
            let (a, since) = self
                .assigned
                .entry((uid, text.clone()))
                .or_insert((a, self.truth.now))
                .clone();
            for (f, at) in &self.freed {
                let overlap = a.base < f.base + f.size && f.base < a.base + a.size;
                assert!(
                    !overlap || since >= *at + grace,
                    "step {step}: {:?} got {a:?} at {since}, within the grace period of {f:?} freed at {at}\nops: {:#?}",
                    p.name,
                    &ops[..=step]
                );
            }
        }
        for p in &self.truth.pods {
            if is_gated(p) {
                continue;
            }
            let uid = p.uid.clone().unwrap_or_default();
            let name = p.name.as_str();
            let now = annotation(p)
                .cloned()
                .unwrap_or_else(|| panic!("step {step}: {name} ungated without a window"));
            let first = self.started.entry(uid).or_insert_with(|| now.clone());
            assert_eq!(
                *first,
                now,
                "step {step}: started pod {name}'s window changed\nops: {:#?}",
                &ops[..=step]
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: rocefabric_operator_testing::proptest_cases(), ..ProptestConfig::default() })]

    #[test]
    fn no_two_live_pods_overlap_and_no_started_window_changes(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let mut sim = Sim::new();
        for (step, op) in ops.iter().enumerate() {
            sim.apply(op);
            sim.check(step, &ops);
        }
    }
}

/// The property is not vacuous: the simulation does assign windows and remove gates (once the
/// takeover hold of the first leader has passed).
#[test]
fn the_simulation_assigns_windows() {
    let mut sim = Sim::new();
    let ops = [
        Op::NewPod {
            size: 1,
            member: true,
            app: false,
        },
        Op::NewPod {
            size: 2,
            member: true,
            app: true,
        },
        Op::Pass { fail: 0 },
        Op::Clock(30),
        Op::Pass { fail: 0 },
    ];
    for (step, op) in ops.iter().enumerate() {
        sim.apply(op);
        sim.check(step, &ops);
    }
    let windows: Vec<_> = sim.truth.pods.iter().filter_map(annotation).collect();
    assert_eq!(windows.len(), 2, "{windows:?}");
    assert!(sim.truth.pods.iter().all(|p| !is_gated(p)));
}

//! A fabric shared by tenants: the namespaces a fabric serves, the default limits that keep one
//! namespace from taking the whole space, and the windows of pods that are never bound taken
//! back, each tried as a tenant would while another tenant is served.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

mod support;

use std::time::Duration;

use rocefabric_api::constants::reason;
use rocefabric_operator::objects::CompactPod;
use rocefabric_operator::planner::incremental::Incremental;
use rocefabric_operator::planner::{PlanOptions, Write};
use rocefabric_operator_testing::objects::*;
use support::*;

/// Fabric `f` with `max` regions of 1 GiB and no limits written: the defaults apply.
fn shm_defaults(max: u32) -> rocefabric_api::RoceFabric {
    let mut f = shm(max);
    let sm = f.spec.shared_memory.as_mut().unwrap();
    sm.max_regions_per_namespace = None;
    sm.max_regions_per_pod = None;
    f
}

/// Without limits written, one namespace holds at most a quarter of the space and one pod asks
/// for at most that: the rest stays for the other namespaces.
#[test]
fn by_default_one_namespace_holds_at_most_a_quarter_of_the_space() {
    let mut pods: Vec<_> = (0..4)
        .map(|i| pod("greedy", &format!("g{i}"), i, &[MEMBER], true))
        .collect();
    pods.push(with_size_request(
        pod("greedy", "huge", 5, &[MEMBER], true),
        "8Gi",
    ));
    pods.push(pod("team", "good", 9, &[MEMBER], true));
    let mut w = world(vec![shm_defaults(8)], nodes("n", 1, &[]), pods);
    step(&mut w);
    let served: Vec<bool> = (0..4)
        .map(|i| region_of(&w, "greedy", &format!("g{i}")).is_some())
        .collect();
    assert_eq!(
        served,
        [true, true, false, false],
        "2 of 8 regions for greedy"
    );
    assert!(gated(&w, "greedy", "huge"));
    assert!(region_of(&w, "team", "good").is_some() && !gated(&w, "team", "good"));
    let msg = condition_message(&w, "f", "Degraded");
    assert!(
        msg.contains("greedy/huge") && msg.contains("more than the 2 one pod may take"),
        "{msg}"
    );
    assert!(
        msg.contains("greedy/g2") && msg.contains("of its limit 2"),
        "{msg}"
    );

    // A limit written is the limit: the fabric's admin raises it for a big job.
    let mut f = shm_defaults(8);
    f.spec
        .shared_memory
        .as_mut()
        .unwrap()
        .max_regions_per_namespace = Some(8);
    let pods: Vec<_> = (0..4)
        .map(|i| pod("greedy", &format!("g{i}"), i, &[MEMBER], true))
        .collect();
    let mut w = world(vec![f], nodes("n", 1, &[]), pods);
    step(&mut w);
    assert!((0..4).all(|i| region_of(&w, "greedy", &format!("g{i}")).is_some()));
}

/// `sharedMemory.namespaces`: a pod of another namespace, labelled for the fabric and gated,
/// gets no window and is told why; the listed namespace's pods are served; a window held before
/// the list changed is kept.
#[test]
fn a_fabric_serves_only_the_namespaces_it_lists() {
    let mut f = shm(8);
    f.spec.shared_memory.as_mut().unwrap().namespaces = vec!["team".into()];
    let earlier = with_annotation(
        scheduled(
            pod("old", "running", 0, &[MEMBER], false),
            "n-000",
            "10.0.0.5",
        ),
        &rocefabric_formats::region::RegionAssignment {
            fabric: "f".into(),
            id: 7,
            base: 7 << 30,
            size: 1 << 30,
            uid: None,
        }
        .to_annotation(),
    );
    let pods = vec![
        pod("intruder", "p", 0, &[MEMBER], true),
        pod("team", "good", 1, &[MEMBER], true),
        earlier,
    ];
    let mut w = world(vec![f], nodes("n", 1, &[]), pods);
    let p = step(&mut w);
    assert!(gated(&w, "intruder", "p") && region_of(&w, "intruder", "p").is_none());
    assert!(region_of(&w, "team", "good").is_some() && !gated(&w, "team", "good"));
    assert_eq!(region_of(&w, "old", "running").unwrap().id, 7, "kept");
    let told: Vec<_> = events(&p)
        .into_iter()
        .filter(|e| e.regarding.namespace.as_deref() == Some("intruder"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].reason, reason::NO_FABRIC_SELECTS_POD);
    assert!(
        told[0].message.contains("sharedMemory.namespaces"),
        "{}",
        told[0].message
    );
}

fn reclaiming_after_60s(mut f: rocefabric_api::RoceFabric) -> rocefabric_api::RoceFabric {
    f.spec
        .shared_memory
        .as_mut()
        .unwrap()
        .reclaim_unbound_after_seconds = Some(60);
    f
}

/// The incremental planner fed `w`'s objects.
fn engine_over(w: &rocefabric_operator::planner::World) -> Incremental {
    let mut engine = Incremental::new(PlanOptions::default());
    engine.replace(w.clone());
    engine
}

fn reclaims_of(writes: &[Write]) -> Vec<(String, String, Option<String>)> {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::ReclaimPodRegion {
                namespace,
                pod,
                resource_version,
                ..
            } => Some((namespace.clone(), pod.clone(), resource_version.clone())),
            _ => None,
        })
        .collect()
}

/// A pod behind a gate of its own gets no window. A pod that gets its window but is never bound
/// to a node holds it for
/// `reclaimUnboundAfterSeconds`, counted from when the operator saw it so; then the window is
/// taken back as the pod was seen, the pod gets no other, and after the grace period a
/// well-behaved tenant's pod gets the space. A pod bound in time keeps its window.
#[test]
fn a_window_whose_pod_is_never_bound_is_reclaimed() {
    let f = reclaiming_after_60s(shm(2));
    let pods = vec![
        // Behind a gate of its own: it holds nothing while that gate stays.
        gated_behind("attacker", "behind", 0, &[MEMBER], "attacker.example/never"),
        // No node will ever take it (an impossible nodeSelector, say): it stays unbound.
        with_size_request(pod("attacker", "squat", 0, &[MEMBER], true), "1Gi"),
        pod("team", "runs", 1, &[MEMBER], true),
        pod("team", "waits", 2, &[MEMBER], true),
    ];
    let mut w = world(vec![f], nodes("n", 1, &[]), pods);
    step(&mut w);
    assert!(region_of(&w, "attacker", "behind").is_none());
    assert!(region_of(&w, "attacker", "squat").is_some());
    assert!(pod_of(&w, "attacker", "squat").gates.is_empty());
    assert!(gated(&w, "team", "waits"), "the space is full");
    // The scheduler binds the good pod; the attacker's pod stays unbound.
    find_pod(&mut w, "team", "runs").node_name = Some("n-000".into());

    let mut engine = engine_over(&w);
    let t0 = w.now;
    let (writes, next) = engine.reclaims(t0);
    assert!(writes.is_empty());
    assert_eq!(next, Some(Duration::from_secs(60)));
    assert_eq!(engine.unbound_pods(), 1, "the bound pod is not counted");
    let (writes, next) = engine.reclaims(ts(T0 + 3600 + 59));
    assert!(writes.is_empty());
    assert_eq!(next, Some(Duration::from_secs(1)));
    let at = ts(T0 + 3600 + 60);
    let (writes, _) = engine.reclaims(at);
    let rv = pod_of(&w, "attacker", "squat").resource_version.clone();
    assert_eq!(
        reclaims_of(&writes),
        [("attacker".into(), "squat".into(), rv)],
        "as seen: its resourceVersion is the precondition"
    );
    let Write::ReclaimPodRegion { event, .. } = &writes[0] else {
        unreachable!()
    };
    assert_eq!(event.reason, reason::REGION_RECLAIMED);
    assert!(event.message.contains("60s"), "{}", event.message);

    // The write lands: the pod has no window and gets none again; its window cools down, then
    // goes to the waiting pod.
    support::apply_writes(&mut w, &writes);
    let squat: CompactPod = pod_of(&w, "attacker", "squat").clone();
    assert!(squat.region.is_none() && squat.region_reclaimed);
    engine.upsert_pod(squat);
    assert_eq!(engine.unbound_pods(), 0);
    w.now = at;
    step(&mut w);
    assert!(region_of(&w, "attacker", "squat").is_none());
    assert!(
        gated(&w, "team", "waits"),
        "the freed window cools down first"
    );
    w.now = ts(T0 + 3600 + 60 + 31);
    step(&mut w);
    assert!(region_of(&w, "attacker", "squat").is_none(), "never again");
    assert!(!gated(&w, "team", "waits") && region_of(&w, "team", "waits").is_some());
    let mut incremental = engine_over(&w);
    let plan = incremental.plan(w.now);
    assert!(
        !plan.writes.iter().any(|x| matches!(x,
            Write::AnnotatePodRegion { pod, .. } if pod == "squat")),
        "the incremental planner gives it nothing either"
    );
}

/// A pod bound just before its deadline is forgotten by the count; one gone is forgotten too.
#[test]
fn a_pod_bound_or_gone_before_its_deadline_keeps_its_window() {
    let f = reclaiming_after_60s(shm(4));
    let pods = vec![
        pod("team", "late", 0, &[MEMBER], true),
        pod("team", "gone", 1, &[MEMBER], true),
    ];
    let mut w = world(vec![f], nodes("n", 1, &[]), pods);
    step(&mut w);
    let mut engine = engine_over(&w);
    assert_eq!(engine.reclaims(w.now).0.len(), 0);
    assert_eq!(engine.unbound_pods(), 2);
    let mut late = pod_of(&w, "team", "late").clone();
    late.gates.clear();
    late.node_name = Some("n-000".into());
    engine.upsert_pod(late);
    engine.remove_pod("team", "gone");
    let (writes, next) = engine.reclaims(ts(T0 + 3600 + 600));
    assert!(writes.is_empty() && next.is_none());
    assert_eq!(engine.unbound_pods(), 0);
}

/// A pod's labels cost the operator only the keys some fabric's pod selector reads: a tenant's
/// hundred long labels are not held. A fabric that comes to read a new key has the pods listed
/// again (their other labels were dropped).
#[test]
fn the_operator_holds_only_the_pod_labels_a_selector_reads() {
    let f = with_shared_memory(fabric("f", 0, &[]), "1Gi", 8, &[("app", "train")]);
    let mut w = world(vec![f], nodes("n", 1, &[]), Vec::new());
    let mut engine = engine_over(&w);
    let mut labels: Vec<(String, String)> = (0..100)
        .map(|i| (format!("tenant.example/k{i:03}"), "v".repeat(63)))
        .collect();
    labels.push(("app".into(), "train".into()));
    labels.push((MEMBER.0.into(), "f".into()));
    let pairs: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let p = CompactPod::from(pod("team", "many", 1, &pairs, true));
    assert_eq!(p.labels.len(), 102);
    engine.upsert_pod(p);
    let held = engine.pod("team", "many").unwrap();
    let keys: Vec<&str> = held.labels.iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["app", MEMBER.0]);

    // A relist strips them too.
    let p = CompactPod::from(pod("team", "relisted", 2, &pairs, true));
    w.pods.push(p);
    engine.replace_pods(w.pods.clone());
    assert_eq!(engine.pod("team", "relisted").unwrap().labels.len(), 2);

    // A selector reading another key: the pods are listed again to learn it.
    let _ = engine.take_selectors_grew();
    let tiered = with_shared_memory(
        fabric("g", 1, &[]),
        "1Gi",
        8,
        &[("tenant.example/k007", "x")],
    );
    engine.upsert_fabric(tiered);
    assert!(engine.take_selectors_grew());
    engine.replace_pods(w.pods.clone());
    let keys: Vec<String> = engine
        .pod("team", "relisted")
        .unwrap()
        .labels
        .iter()
        .map(|(k, _)| k.to_string())
        .collect();
    assert_eq!(keys, ["app", MEMBER.0, "tenant.example/k007"]);
}

//! The planner's region claims in conflict: two pods recording one window, a window recorded
//! for another fabric or another pod, a running pod that stops matching its selector, and a
//! running pod's window that cannot be kept (never handed to another pod while it runs).
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

mod support;

use std::time::Duration;

use rocefabric_api::constants::{condition, reason};
use rocefabric_formats::region::RegionAssignment;
use rocefabric_operator::planner::{EventType, REGION_CONFLICT, Write};
use rocefabric_operator_testing::objects::*;
use support::*;

/// Two pods recording one window: the older keeps it. A younger pod still behind its gate gets a
/// new window; a running one is never rewritten (its container read the window at start): it is
/// reported in an Event and the fabric's status instead.
#[test]
fn two_pods_claiming_one_window_the_older_keeps_it() {
    let shared = RegionAssignment {
        fabric: "f".into(),
        id: 1,
        base: GI,
        size: GI,
        uid: None,
    }
    .to_annotation();
    let pods = vec![
        with_annotation(
            scheduled(pod("ns", "running", 20, &[MEMBER], false), "n1", "10.0.0.2"),
            &shared,
        ),
        with_annotation(
            scheduled(pod("ns", "older", 10, &[MEMBER], false), "n1", "10.0.0.1"),
            &shared,
        ),
        with_annotation(pod("ns", "gated", 25, &[MEMBER], true), &shared),
        with_annotation(pod("ns", "garbage", 30, &[MEMBER], true), "not json"),
    ];
    let mut w = world(vec![shm(4)], vec![], pods);
    let p = step(&mut w);
    assert_eq!(region_of(&w, "ns", "older").unwrap().id, 1);
    assert_eq!(
        region_of(&w, "ns", "running").unwrap().id,
        1,
        "a running pod's window is never rewritten"
    );
    assert!(!p.writes.iter().any(
        |w| matches!(w, Write::AnnotatePodRegion { pod, .. } if pod == "older" || pod == "running")
    ));
    let gated = region_of(&w, "ns", "gated").unwrap().id;
    let garbage = region_of(&w, "ns", "garbage").unwrap().id;
    assert!(
        gated != 1 && garbage != 1 && gated != garbage,
        "{gated} {garbage}"
    );
    let of_reason = |r: &str| -> Vec<(String, EventType, String)> {
        events(&p)
            .into_iter()
            .filter(|e| e.reason == r)
            .map(|e| {
                (
                    e.regarding.name.clone().unwrap(),
                    e.type_,
                    e.message.clone(),
                )
            })
            .collect()
    };
    let reassigned = of_reason(reason::REGION_REASSIGNED);
    let names: Vec<&str> = reassigned.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["gated", "garbage"]);
    assert!(reassigned[0].2.contains("ns/older"), "{}", reassigned[0].2);
    // Reported in the fabric's status and an Event on it, naming the pod and the older holder.
    let conflicts = of_reason(REGION_CONFLICT);
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(conflicts[0].1, EventType::Warning);
    assert!(
        conflicts[0].2.contains("ns/running") && conflicts[0].2.contains("ns/older"),
        "{}",
        conflicts[0].2
    );
    let (state, reason_now) = condition_of(&w, "f", condition::DEGRADED);
    assert_eq!(
        (state.as_str(), reason_now.as_str()),
        ("True", REGION_CONFLICT)
    );
    // Nothing changes on the next pass: the running pod keeps its window, no write repeats.
    let again = step(&mut w);
    assert!(
        !again
            .writes
            .iter()
            .any(|w| matches!(w, Write::AnnotatePodRegion { .. })),
        "{:?}",
        again.writes
    );
}

#[test]
fn a_recorded_region_stays_with_its_fabric_even_when_invalid() {
    let older = with_shared_memory(
        fabric("older", 0, &[("x", "x")]),
        "1Gi",
        4,
        &[("app", "mpi")],
    );
    let younger = with_shared_memory(
        fabric("younger", 10, &[("x", "x")]),
        "1Gi",
        4,
        &[("app", "mpi")],
    );
    let recorded = RegionAssignment {
        fabric: "younger".into(),
        id: 2,
        base: 2 * GI,
        size: GI,
        uid: None,
    }
    .to_annotation();
    let pods = vec![with_annotation(
        pod("ns", "p", 0, &[("app", "mpi")], false),
        &recorded,
    )];
    let mut w = world(vec![older, younger], vec![], pods);
    let p = step(&mut w);
    assert!(
        !p.writes
            .iter()
            .any(|w| matches!(w, Write::AnnotatePodRegion { .. })),
        "the annotation is the truth: the pod stays with the fabric it records"
    );
    assert_eq!(
        fabric_of(&w, "younger")
            .status
            .as_ref()
            .unwrap()
            .regions
            .allocated,
        1
    );
    assert_eq!(
        fabric_of(&w, "older")
            .status
            .as_ref()
            .unwrap()
            .regions
            .allocated,
        0
    );

    // The recorded fabric becomes invalid: its pods are left alone, not moved to the other one.
    w.fabrics[1].spec.qos.mtu = 100;
    let p = step(&mut w);
    assert!(
        !p.writes
            .iter()
            .any(|w| matches!(w, Write::AnnotatePodRegion { .. })),
        "{:?}",
        p.writes
    );
    assert_eq!(region_of(&w, "ns", "p").unwrap().fabric, "younger");
}

/// A running pod whose label no longer matches the fabric's selector (someone removed it, or the
/// selector changed) keeps its window: it belongs to the fabric its annotation names, and its
/// window is never handed to another pod while it exists.
#[test]
fn a_running_pod_that_stops_matching_the_selector_keeps_its_window() {
    let mut w = world(
        vec![shm(1)],
        nodes("n", 1, &[]),
        vec![pod("ns", "a", 0, &[MEMBER], true)],
    );
    step(&mut w);
    let window = region_of(&w, "ns", "a").expect("a has a window");
    assert!(!gated(&w, "ns", "a"));
    let a = w.pods.iter_mut().find(|p| p.name == "a").unwrap();
    a.labels = Default::default();
    edit(a, |a| scheduled(a, "n0", "10.0.0.1"));
    w.pods
        .push(CompactPod::from(pod("ns", "b", 10, &[MEMBER], true)));
    for _ in 0..3 {
        step(&mut w);
        w.now += Duration::from_secs(31);
    }
    assert_eq!(region_of(&w, "ns", "a"), Some(window), "unchanged");
    assert!(gated(&w, "ns", "b"), "the only window is a's");
    assert_eq!(region_of(&w, "ns", "b"), None);
    let listed = directory_of(&w, "ns").expect("directory");
    assert_eq!(
        listed.iter().map(|e| e.pod.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
}

/// A manifest exported from a running pod keeps its `rocefabric.io/region` annotation, bound to
/// the original pod's uid: a pod created from it never gets that window honoured. Gated, it
/// gets its own window; already running (no gate), it is reported and the original keeps its
/// window.
#[test]
fn a_copied_annotation_is_never_honoured() {
    let mut w = world(
        vec![shm(4)],
        nodes("n", 1, &[]),
        vec![pod("ns", "orig", 0, &[MEMBER], true)],
    );
    w.now += Duration::from_secs(1);
    step(&mut w);
    let original = pod_of(&w, "ns", "orig").region.clone().unwrap();
    assert!(original.contains("\"uid\":\"uid-ns-orig\""), "{original}");
    let window = region_of(&w, "ns", "orig").unwrap();

    w.pods.push(CompactPod::from(with_annotation(
        pod("ns", "copy-gated", 5, &[MEMBER], true),
        &original,
    )));
    w.pods.push(CompactPod::from(with_annotation(
        scheduled(
            pod("ns", "copy-running", 6, &[MEMBER], false),
            "n0",
            "10.0.0.9",
        ),
        &original,
    )));
    step(&mut w);
    assert_eq!(
        region_of(&w, "ns", "orig").unwrap(),
        window,
        "the original keeps it"
    );
    let gated_copy = region_of(&w, "ns", "copy-gated").unwrap();
    assert_ne!(
        gated_copy.id, window.id,
        "the gated copy gets a window of its own"
    );
    let msg = condition_message(&w, "f", condition::DEGRADED);
    assert!(
        msg.contains("ns/copy-running") && msg.contains("written for another pod"),
        "{msg}"
    );
}

/// A running pod whose window the fabric cannot keep still uses it: its slots stay out of every
/// new allocation (an overlapping younger claim, or a window of another geometry), so no new pod
/// is given bytes a running pod reads and writes.
#[test]
fn a_running_pod_s_unkeepable_window_is_never_handed_to_a_new_pod() {
    let window = |id: u32, base: u64, size: u64| {
        RegionAssignment {
            fabric: "f".into(),
            id,
            base,
            size,
            uid: None,
        }
        .to_annotation()
    };
    let pods = vec![
        // Older A holds region 1; younger B records regions 0..3 (overlapping A) and runs.
        with_annotation(
            scheduled(pod("ns", "a", 0, &[MEMBER], false), "n0", "10.0.0.1"),
            &window(1, GI, GI),
        ),
        with_annotation(
            scheduled(pod("ns", "b", 1, &[MEMBER], false), "n0", "10.0.0.2"),
            &window(0, 0, 3 * GI),
        ),
        // In another namespace: the two recorded windows use up the quota of `ns`.
        pod("other", "c", 2, &[MEMBER], true),
    ];
    let mut w = world(vec![shm(4)], nodes("n", 1, &[]), pods);
    step(&mut w);
    assert_eq!(
        region_of(&w, "ns", "b").unwrap().id,
        0,
        "b is never rewritten"
    );
    assert_eq!(
        region_of(&w, "other", "c").unwrap().id,
        3,
        "c gets the only slot b does not use"
    );

    // A running pod whose window is not of this geometry (half a region off): the regions it
    // covers are reserved.
    let pods = vec![
        with_annotation(
            scheduled(pod("ns", "odd", 0, &[MEMBER], false), "n0", "10.0.0.1"),
            &window(0, GI / 2, GI),
        ),
        pod("ns", "d", 1, &[MEMBER], true),
        pod("ns", "e", 2, &[MEMBER], true),
    ];
    let mut w = world(vec![shm(4)], nodes("n", 1, &[]), pods);
    step(&mut w);
    let got: Vec<u32> = ["d", "e"]
        .iter()
        .map(|n| region_of(&w, "ns", n).unwrap().id)
        .collect();
    assert_eq!(got, [2, 3], "regions 0 and 1 hold odd's bytes");
    let msg = condition_message(&w, "f", condition::DEGRADED);
    assert!(msg.contains("ns/odd"), "{msg}");
}

//! The planner's shared memory regions: assignment, gate order, size requests and caps,
//! exhaustion, grace period of freed ids, rebuild after a restart, the takeover hold, pod
//! routing by selector and fabric age, pods no fabric selects.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

mod support;

use std::time::Duration;

use rocefabric_api::constants::{condition, reason};
use rocefabric_formats::directory::DirectoryEntry;
use rocefabric_formats::region::RegionAssignment;
use rocefabric_operator::planner::{
    EventType, PlanOptions, REGION_QUOTA_EXCEEDED, REGION_REQUEST_INVALID, WINDOW_FAILED, World,
    Write, plan,
};
use rocefabric_operator_testing::objects::*;
use support::*;

#[test]
fn each_pod_is_annotated_before_its_gate_is_removed() {
    let pods = vec![
        pod("ns", "gated", 1, &[MEMBER], true),
        scheduled(
            pod("ns", "running", 0, &[MEMBER], false),
            "n-000",
            "10.0.0.7",
        ),
        pod("other", "no-member", 0, &[], true),
    ];
    let mut w = world(vec![shm(8)], nodes("n", 1, &[]), pods);
    let p = step(&mut w);
    let pod_writes: Vec<(String, &str)> = p
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::AnnotatePodRegion { pod, .. } => Some((pod.clone(), "annotate")),
            Write::RemovePodGate {
                pod,
                remaining_gates,
                ..
            } => {
                assert!(remaining_gates.is_empty());
                Some((pod.clone(), "ungate"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        pod_writes,
        [
            ("gated".into(), "annotate"),
            ("gated".into(), "ungate"),
            ("running".into(), "annotate")
        ],
        "annotation first; no gate write for a pod without the gate; nothing for non-members"
    );
    // The older pod gets the lower id.
    assert_eq!(
        region_of(&w, "ns", "running"),
        Some(RegionAssignment {
            fabric: "f".into(),
            id: 0,
            base: 0,
            size: GI,
            uid: Some("uid-ns-running".into()),
        })
    );
    assert_eq!(
        region_of(&w, "ns", "gated"),
        Some(RegionAssignment {
            fabric: "f".into(),
            id: 1,
            base: GI,
            size: GI,
            uid: Some("uid-ns-gated".into()),
        })
    );
    assert!(!gated(&w, "ns", "gated"));
    assert!(gated(&w, "other", "no-member"), "not ours: left alone");
    assert_eq!(
        directory_of(&w, "ns").unwrap(),
        [
            DirectoryEntry {
                pod: "running".into(),
                node: Some("n-000".into()),
                pod_ip: Some("10.0.0.7".into()),
                id: 0,
                base: 0,
                size: GI,
                uid: Some("uid-ns-running".into()),
            },
            DirectoryEntry {
                pod: "gated".into(),
                node: None,
                pod_ip: None,
                id: 1,
                base: GI,
                size: GI,
                uid: Some("uid-ns-gated".into()),
            },
        ]
    );
    let st = fabric_of(&w, "f").status.clone().unwrap();
    assert_eq!((st.regions.allocated, st.regions.capacity), (2, 8));
    assert!(step(&mut w).writes.is_empty());
}

/// A pod held by another gate too (a job queue's admission) gets no window, and holds no space,
/// until ours is its last gate; then it gets one.
#[test]
fn a_window_waits_until_ours_is_the_last_gate() {
    let p = gated_behind("ns", "p", 0, &[MEMBER], "example.com/quota");
    let mut w = world(vec![shm(2)], vec![], vec![p]);
    let first = step(&mut w);
    assert!(region_of(&w, "ns", "p").is_none());
    assert!(!first.writes.iter().any(|w| matches!(
        w,
        Write::AnnotatePodRegion { .. } | Write::RemovePodGate { .. }
    )));
    let waiting = &first.report.waiting_pods;
    assert!(
        waiting
            .iter()
            .any(|x| x.pod == "p" && x.reason.contains("example.com/quota")),
        "{waiting:?}"
    );
    find_pod(&mut w, "ns", "p")
        .gates
        .retain(|g| g != "example.com/quota");
    let second = step(&mut w);
    assert!(region_of(&w, "ns", "p").is_some());
    assert!(second.writes.iter().any(|w| matches!(w,
        Write::RemovePodGate { remaining_gates, .. } if remaining_gates.is_empty())));
}

#[test]
fn a_size_request_gets_contiguous_whole_regions() {
    let pods = vec![
        pod("ns", "small", 0, &[MEMBER], true),
        with_size_request(pod("ns", "big", 1, &[MEMBER], true), "2.5Gi"),
        pod("ns", "after", 2, &[MEMBER], true),
    ];
    let mut w = world(vec![shm(8)], vec![], pods);
    step(&mut w);
    assert_eq!(
        region_of(&w, "ns", "big"),
        Some(RegionAssignment {
            fabric: "f".into(),
            id: 1,
            base: GI,
            size: 3 * GI,
            uid: Some("uid-ns-big".into()),
        })
    );
    assert_eq!(region_of(&w, "ns", "after").unwrap().id, 4);
    assert_eq!(
        fabric_of(&w, "f")
            .status
            .as_ref()
            .unwrap()
            .regions
            .allocated,
        5
    );
}

#[test]
fn a_request_the_space_cannot_hold_keeps_the_pod_gated_and_is_reported() {
    let pods = vec![
        with_size_request(pod("ns", "huge", 0, &[MEMBER], true), "5Gi"),
        with_size_request(pod("ns", "typo", 1, &[MEMBER], true), "2 gigs"),
    ];
    let mut w = world(vec![shm(4)], vec![], pods);
    let p = step(&mut w);
    assert!(gated(&w, "ns", "huge") && gated(&w, "ns", "typo"));
    assert_eq!(region_of(&w, "ns", "huge"), None);
    assert_eq!(condition_of(&w, "f", condition::DEGRADED).0, "True");
    let msg = &condition_message(&w, "f", condition::DEGRADED);
    assert!(
        msg.contains("ns/huge") && msg.contains("ns/typo") && msg.contains("\"2 gigs\""),
        "{msg}"
    );
    assert_eq!(
        events(&p)
            .iter()
            .filter(|e| e.reason == REGION_REQUEST_INVALID)
            .count(),
        1
    );
    assert_eq!(p.report.waiting_pods.len(), 2);
    assert!(step(&mut w).writes.is_empty(), "reported once");
}

/// Issue 39: a tenant's `region-size` text is never copied unbounded into the cluster-scoped
/// fabric status (a status write the API server refuses would blind every tenant), and a
/// well-behaved pod is served meanwhile.
#[test]
fn oversize_region_size_texts_stay_out_of_the_fabrics_status() {
    let hostile = "9".repeat(250 << 10);
    let mut pods: Vec<_> = (0..12)
        .map(|i| {
            with_size_request(
                pod("tenant", &format!("h{i}"), i, &[MEMBER], true),
                &hostile,
            )
        })
        .collect();
    pods.push(pod("good", "p", 20, &[MEMBER], true));
    let mut w = world(vec![shm(4)], vec![], pods);
    let p = step(&mut w);
    assert!(
        region_of(&w, "good", "p").is_some(),
        "the good pod gets a window"
    );
    assert!(gated(&w, "tenant", "h0"));
    let msg = condition_message(&w, "f", condition::DEGRADED);
    assert!(
        msg.contains("tenant/h0") && msg.contains("(256000 bytes)"),
        "{msg}"
    );
    assert!(msg.len() < 4096, "{} bytes of status message", msg.len());
    let status = serde_json::to_string(&fabric_of(&w, "f").status).expect("a status");
    assert!(status.len() < 16 << 10, "{} bytes of status", status.len());
    for e in events(&p) {
        assert!(e.message.len() < 4096, "{} bytes of event", e.message.len());
    }
}

#[test]
fn a_full_space_keeps_pods_gated_until_a_freed_window_has_cooled_down() {
    let pods = vec![
        pod("ns", "p0", 0, &[MEMBER], true),
        pod("ns", "p1", 1, &[MEMBER], true),
        pod("ns", "p2", 2, &[MEMBER], true),
    ];
    let mut w = world(vec![shm(2)], nodes("n", 1, &[]), pods);
    let p = step(&mut w);
    agent_reports_all(&mut w, true);
    assert!(gated(&w, "ns", "p2"));
    assert_eq!(region_of(&w, "ns", "p2"), None);
    assert!(!p.writes.iter().any(|w| matches!(w, Write::AnnotatePodRegion { pod, .. } | Write::RemovePodGate { pod, .. } if pod == "p2")));
    assert_eq!(
        condition_of(&w, "f", condition::DEGRADED),
        ("True".into(), reason::REGIONS_EXHAUSTED.into())
    );
    let exhausted: Vec<_> = events(&p)
        .into_iter()
        .filter(|e| e.reason == reason::REGIONS_EXHAUSTED)
        .collect();
    assert_eq!(exhausted.len(), 1);
    assert_eq!(exhausted[0].type_, EventType::Warning);
    assert_eq!(p.report.fabrics[0].pods_waiting, 1);
    step(&mut w); // the node reported configured
    assert!(
        step(&mut w).writes.is_empty(),
        "waiting is steady: no repeated Event"
    );

    // p0 is deleted: its window (id 0) cools down for the grace period.
    w.pods.retain(|p| p.name != "p0");
    let p = step(&mut w);
    assert!(gated(&w, "ns", "p2"), "the freed id is not reused at once");
    assert_eq!(p.requeue_after, Some(Duration::from_secs(30)));
    assert_eq!(p.report.fabrics[0].regions_cooling, 1);
    assert_eq!(
        fabric_of(&w, "f")
            .status
            .as_ref()
            .unwrap()
            .regions
            .allocated,
        1
    );

    w.now += Duration::from_secs(29);
    let p = step(&mut w);
    assert!(gated(&w, "ns", "p2"));
    assert_eq!(p.requeue_after, Some(Duration::from_secs(1)));

    w.now += Duration::from_secs(1);
    let p = step(&mut w);
    assert_eq!(region_of(&w, "ns", "p2").unwrap().id, 0);
    assert!(!gated(&w, "ns", "p2"));
    assert_eq!(p.requeue_after, None);
    assert_eq!(
        condition_of(&w, "f", condition::DEGRADED),
        ("False".into(), reason::AS_EXPECTED.into())
    );
}

#[test]
fn a_freed_id_is_skipped_while_other_ids_are_free() {
    let mut w = world(
        vec![shm(8)],
        vec![],
        vec![pod("ns", "old", 0, &[MEMBER], true)],
    );
    step(&mut w);
    assert_eq!(region_of(&w, "ns", "old").unwrap().id, 0);
    w.pods[0].phase = Some("Succeeded".into());
    w.pods
        .push(CompactPod::from(pod("ns", "new", 5, &[MEMBER], true)));
    step(&mut w);
    assert_eq!(
        region_of(&w, "ns", "new").unwrap().id,
        1,
        "id 0 is in its grace period"
    );
}

#[test]
fn a_pod_being_deleted_keeps_its_window_until_it_has_terminated() {
    let mut w = world(
        vec![shm(1)],
        vec![],
        vec![pod("ns", "old", 0, &[MEMBER], true)],
    );
    step(&mut w);
    assert_eq!(region_of(&w, "ns", "old").unwrap().id, 0);
    // Deleted, but still running out its termination grace period: the window stays taken.
    w.pods[0].deleting = true;
    w.pods
        .push(CompactPod::from(pod("ns", "new", 5, &[MEMBER], true)));
    step(&mut w);
    assert!(
        region_of(&w, "ns", "new").is_none(),
        "the only window is still held"
    );
    assert!(gated(&w, "ns", "new"));
    // It terminated: the window cools down, then goes to the waiting pod.
    w.pods.remove(0);
    let p = step(&mut w);
    assert!(region_of(&w, "ns", "new").is_none(), "grace period first");
    let wait = p
        .requeue_after
        .expect("requeued when the grace period ends");
    w.now += wait;
    step(&mut w);
    assert_eq!(region_of(&w, "ns", "new").unwrap().id, 0);
    assert!(!gated(&w, "ns", "new"));
}

#[test]
fn after_a_restart_the_map_is_rebuilt_from_annotations_and_directories() {
    let pods: Vec<_> = (0..4)
        .map(|i| pod("ns", &format!("p{i}"), i, &[MEMBER], true))
        .collect();
    let mut w = world(vec![shm(8)], vec![], pods);
    step(&mut w);
    // The operator restarts (no memory) and p1 was deleted while it was down.
    w.freed = Default::default();
    w.pods.retain(|p| p.name != "p1");
    w.pods
        .push(CompactPod::from(pod("ns", "p4", 10, &[MEMBER], true)));
    let p = step(&mut w);
    let ids: Vec<u32> = ["p0", "p2", "p3"]
        .iter()
        .map(|n| region_of(&w, "ns", n).unwrap().id)
        .collect();
    assert_eq!(ids, [0, 2, 3], "recorded regions stay");
    assert_eq!(
        region_of(&w, "ns", "p4").unwrap().id,
        4,
        "nothing handed out twice; p1's id 1 cools down"
    );
    assert_eq!(p.requeue_after, Some(Duration::from_secs(30)));
    let annotated: Vec<&str> = p
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::AnnotatePodRegion { pod, .. } => Some(pod.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(annotated, ["p4"]);
}

#[test]
fn pod_selectors_and_fabric_age_decide_which_fabric_serves_a_pod() {
    let explicit = with_shared_memory(
        fabric("explicit", 0, &[("x", "x")]),
        "1Gi",
        4,
        &[("app", "mpi")],
    );
    let younger = with_shared_memory(
        fabric("younger", 10, &[("x", "x")]),
        "2Gi",
        4,
        &[("app", "mpi")],
    );
    let by_label = with_shared_memory(fabric("f", 20, &[("x", "x")]), "1Gi", 4, &[]);
    let pods = vec![
        pod("a", "mpi", 0, &[("app", "mpi")], true),
        pod("b", "member", 0, &[MEMBER], true),
        pod("c", "neither", 0, &[("app", "web")], true),
        pod("d", "done", 0, &[("app", "mpi")], false),
    ];
    let mut w = world(vec![younger, by_label, explicit], vec![], pods);
    w.pods[3].phase = Some("Failed".into());
    step(&mut w);
    assert_eq!(
        region_of(&w, "a", "mpi").unwrap().fabric,
        "explicit",
        "the older of two selecting fabrics"
    );
    assert_eq!(
        region_of(&w, "b", "member").unwrap().fabric,
        "f",
        "empty podSelector: the fabric label"
    );
    assert_eq!(region_of(&w, "c", "neither"), None);
    assert_eq!(
        region_of(&w, "d", "done"),
        None,
        "finished pods get no region"
    );
}

/// After a takeover the operator's memory of freed windows is gone: a window the previous leader
/// freed a moment ago may be cooling and only it knew. So no new window is handed out for one
/// grace period after the first plan; recorded windows are kept, and the pass is requeued for
/// the end of the hold.
#[test]
fn after_a_takeover_new_windows_wait_one_grace_period() {
    let pods = vec![
        with_annotation(
            scheduled(pod("ns", "kept", 0, &[MEMBER], false), "n0", "10.0.0.1"),
            &RegionAssignment {
                fabric: "f".into(),
                id: 1,
                base: GI,
                size: GI,
                uid: None,
            }
            .to_annotation(),
        ),
        pod("ns", "new", 5, &[MEMBER], true),
    ];
    let mut w = world(vec![shm(4)], nodes("n", 1, &[]), pods);
    let held = PlanOptions {
        hold_after_takeover: true,
        ..opts()
    };
    let pass = |w: &mut World| {
        let p = plan(w, &held);
        apply(w, &p);
        w.freed = p.freed.clone();
        p
    };
    let p = pass(&mut w);
    assert!(
        gated(&w, "ns", "new"),
        "no new window right after a takeover"
    );
    assert_eq!(p.requeue_after, Some(Duration::from_secs(30)));
    assert_eq!(region_of(&w, "ns", "kept").unwrap().id, 1);
    w.now += Duration::from_secs(29);
    assert!(
        pass(&mut w)
            .writes
            .iter()
            .all(|x| !matches!(x, Write::AnnotatePodRegion { .. }))
    );
    w.now += Duration::from_secs(1);
    pass(&mut w);
    assert!(!gated(&w, "ns", "new"));
    assert_eq!(region_of(&w, "ns", "new").unwrap().id, 0);
    // Later pods do not wait: the hold follows the takeover only.
    w.now += Duration::from_secs(600);
    w.pods
        .push(CompactPod::from(pod("ns", "later", 700, &[MEMBER], true)));
    pass(&mut w);
    assert!(!gated(&w, "ns", "later"));
}

fn with_caps(
    mut f: rocefabric_api::RoceFabric,
    per_pod: Option<u32>,
    per_ns: Option<u32>,
) -> rocefabric_api::RoceFabric {
    let sm = f.spec.shared_memory.as_mut().unwrap();
    sm.max_regions_per_pod = per_pod;
    sm.max_regions_per_namespace = per_ns;
    f
}

/// A large `rocefabric.io/region-size` does not take the whole fabric: a request over
/// `maxRegionsPerPod` keeps the pod gated and is reported naming the field; a namespace's pods
/// together hold at most `maxRegionsPerNamespace` (oldest first), other namespaces unaffected.
#[test]
fn requests_are_capped_per_pod_and_per_namespace() {
    let pods = vec![
        with_size_request(pod("ns", "greedy", 0, &[MEMBER], true), "8Gi"),
        with_size_request(pod("ns", "two", 1, &[MEMBER], true), "2Gi"),
        pod("ns", "third", 2, &[MEMBER], true),
        pod("other", "own", 3, &[MEMBER], true),
    ];
    let mut w = world(
        vec![with_caps(shm(16), Some(4), Some(2))],
        nodes("n", 1, &[]),
        pods,
    );
    let p = step(&mut w);
    assert!(gated(&w, "ns", "greedy") && region_of(&w, "ns", "greedy").is_none());
    assert_eq!(region_of(&w, "ns", "two").unwrap().size, 2 * GI);
    assert!(gated(&w, "ns", "third"), "ns already holds its 2 regions");
    assert!(
        !gated(&w, "other", "own"),
        "another namespace has its own quota"
    );
    let msg = &condition_message(&w, "f", condition::DEGRADED);
    assert!(
        msg.contains("ns/greedy")
            && msg.contains("more than the 4 one pod may take (sharedMemory.maxRegionsPerPod"),
        "{msg}"
    );
    assert!(
        msg.contains("ns/third")
            && msg.contains("of its limit 2 (sharedMemory.maxRegionsPerNamespace"),
        "{msg}"
    );
    assert!(
        event_reasons(&p).contains(&REGION_QUOTA_EXCEEDED.to_string()),
        "{:?}",
        event_reasons(&p)
    );
    // The namespace's pod goes: its quota is free at once (its slots still cool down, so the
    // next pod gets other ones).
    let freed = region_of(&w, "ns", "two").unwrap();
    w.pods.retain(|p| p.name != "two");
    step(&mut w);
    assert!(!gated(&w, "ns", "third"));
    let third = region_of(&w, "ns", "third").unwrap();
    assert!(
        third.base + third.size <= freed.base || freed.base + freed.size <= third.base,
        "{third:?} reuses {freed:?} within its grace period"
    );
}

/// A gated pod no fabric selects is told so, once: otherwise it would sit Pending without a word.
#[test]
fn a_gated_pod_no_fabric_selects_gets_one_event() {
    let mut w = world(
        vec![shm(4)],
        nodes("n", 1, &[]),
        vec![pod("ns", "lost", 0, &[("app", "web")], true)],
    );
    let p = step(&mut w);
    let told: Vec<_> = events(&p)
        .into_iter()
        .filter(|e| e.reason == reason::NO_FABRIC_SELECTS_POD)
        .collect();
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].regarding.name.as_deref(), Some("lost"));
    assert_eq!(told[0].type_, EventType::Warning);
    assert!(
        told[0].message.contains("podSelector"),
        "{}",
        told[0].message
    );
    assert!(
        !event_reasons(&step(&mut w)).contains(&reason::NO_FABRIC_SELECTS_POD.to_string()),
        "told once"
    );
    assert!(gated(&w, "ns", "lost"));
}

/// `p` with one container whose data plane gave up on its window (as `rocefabric-dsm` writes its
/// termination message), waiting to restart; `running` makes it run again.
fn with_window_failure(
    mut p: k8s_openapi::api::core::v1::Pod,
    running: bool,
) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus,
    };
    let message = "rocefabric-dsm: local window of 67108864 bytes: cannot be pinned: registering \
        pins 71303168 bytes\nFORGED: a line a tenant wrote";
    let state = if running {
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }
    } else {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                ..ContainerStateWaiting::default()
            }),
            ..ContainerState::default()
        }
    };
    p.status.get_or_insert_default().container_statuses = Some(vec![ContainerStatus {
        name: "trainer".into(),
        state: Some(state),
        last_state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                message: Some(message.into()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }]);
    p
}

#[test]
fn a_pod_whose_window_cannot_be_pinned_is_named_in_the_fabrics_status_without_its_text() {
    let running =
        |name: &str, t: i64| scheduled(pod("ns", name, t, &[MEMBER], false), "n-000", "10.0.0.7");
    let mut w = world(
        vec![shm(8)],
        nodes("n", 1, &[]),
        vec![
            running("ok", 0),
            with_window_failure(running("unpinned", 1), false),
        ],
    );
    let p = step(&mut w);
    let (status, why) = condition_of(&w, "f", condition::DEGRADED);
    assert_eq!((status.as_str(), why.as_str()), ("True", WINDOW_FAILED));
    let msg = condition_message(&w, "f", condition::DEGRADED);
    assert!(msg.contains("1 pod cannot back or pin its window"), "{msg}");
    assert!(
        msg.contains("kubectl describe pod") && msg.contains("ns/unpinned"),
        "{msg}"
    );
    assert!(!msg.contains("ns/ok"), "{msg}");
    assert!(
        !msg.contains("FORGED") && !msg.contains("cannot be pinned"),
        "the pod's own text stays on the pod: {msg}"
    );
    assert_eq!(
        events(&p)
            .iter()
            .filter(|e| e.reason == WINDOW_FAILED)
            .count(),
        1,
        "one Warning when it starts"
    );
    // Its window is kept: a container that restarts with IPC_LOCK gets the same one.
    assert!(region_of(&w, "ns", "unpinned").is_some());
    // Running again (the fix landed, or it was pinned at last): the fabric is as expected.
    let fixed = with_window_failure(running("unpinned", 1), true);
    let fixed_region = pod_of(&w, "ns", "unpinned").region.clone();
    w.pods.retain(|p| p.name != "unpinned");
    let mut fixed = CompactPod::from(fixed);
    fixed.region = fixed_region;
    w.pods.push(fixed);
    step(&mut w);
    assert_eq!(condition_of(&w, "f", condition::DEGRADED).0, "False");
}

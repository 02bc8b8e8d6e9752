//! The planner: node selection and conflicts, rollout pacing, status aggregation and Events,
//! steady state, node and fabric removal, invalid specs.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

mod support;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rocefabric_api::constants::{condition, reason};
use rocefabric_operator::planner::{EventType, NodeAction, Write, plan};
use rocefabric_operator_testing::objects::*;
use support::*;

const GPU: (&str, &str) = ("gpu", "h100");

#[test]
fn selection_follows_match_labels_and_expressions() {
    let f = with_expressions(
        fabric("training", 0, &[GPU]),
        &[
            ("rack", "In", &["a", "b"]),
            ("zone", "NotIn", &["z9"]),
            ("rdma", "Exists", &[]),
            ("control-plane", "DoesNotExist", &[]),
        ],
    );
    let w = world(
        vec![f],
        vec![
            node("yes-1", &[GPU, ("rack", "a"), ("rdma", "1")]),
            node(
                "yes-2",
                &[GPU, ("rack", "b"), ("rdma", "1"), ("zone", "z1")],
            ),
            node("no-rack", &[GPU, ("rack", "c"), ("rdma", "1")]),
            node(
                "no-zone",
                &[GPU, ("rack", "a"), ("rdma", "1"), ("zone", "z9")],
            ),
            node("no-rdma", &[GPU, ("rack", "a")]),
            node(
                "no-cp",
                &[GPU, ("rack", "a"), ("rdma", "1"), ("control-plane", "")],
            ),
            node("no-gpu", &[("rack", "a"), ("rdma", "1")]),
        ],
        vec![],
    );
    let p = plan(&w, &opts());
    let selected: Vec<&str> = p.report.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(selected, ["yes-1", "yes-2"]);
    assert_eq!(p.report.fabrics[0].selected_nodes, 2);
}

#[test]
fn empty_node_selector_selects_every_node() {
    let w = world(vec![fabric("all", 0, &[])], nodes("n", 3, &[]), vec![]);
    let p = plan(&w, &opts());
    assert_eq!(p.report.fabrics[0].selected_nodes, 3);
}

#[test]
fn older_fabric_owns_a_shared_node_and_the_younger_reports_the_conflict_once() {
    let old = with_budget(fabric("old", 0, &[GPU]), IntOrString::String("100%".into()));
    let young = with_budget(
        fabric("young", 100, &[("rack", "a")]),
        IntOrString::String("100%".into()),
    );
    let mut w = world(
        vec![young, old],
        vec![
            node("shared", &[GPU, ("rack", "a")]),
            node("only-young", &[("rack", "a")]),
            node("only-old", &[GPU]),
        ],
        vec![],
    );
    let p = step(&mut w);
    let applies: Vec<(String, String)> = p
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::ApplyRoceNode {
                name, fabric_name, ..
            } => Some((name.clone(), fabric_name.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        applies,
        [
            ("only-old".into(), "old".into()),
            ("only-young".into(), "young".into()),
            ("shared".into(), "old".into())
        ]
    );
    let shared = p.report.nodes.iter().find(|n| n.name == "shared").unwrap();
    assert_eq!(shared.fabric, "old");
    assert_eq!(shared.conflicts_with, ["young"]);

    let st = fabric_of(&w, "young").status.clone().unwrap();
    assert_eq!(st.nodes.conflicting, 1);
    assert_eq!(st.nodes.selected, 1);
    assert_eq!(st.conflicting_nodes, ["shared"]);
    assert_eq!(
        condition_of(&w, "young", condition::DEGRADED),
        ("True".into(), reason::NODES_CONFLICTING.into())
    );
    let warnings: Vec<_> = events(&p)
        .into_iter()
        .filter(|e| e.reason == reason::NODES_CONFLICTING)
        .map(|e| (e.type_, e.regarding.name.clone().unwrap()))
        .collect();
    assert_eq!(warnings, [(EventType::Warning, "young".to_string())]);
    assert_eq!(
        fabric_of(&w, "old")
            .status
            .as_ref()
            .unwrap()
            .nodes
            .conflicting,
        0
    );

    // Nodes report; the conflict persists but is not announced again.
    agent_reports_all(&mut w, true);
    let p = step(&mut w);
    assert!(
        !event_reasons(&p).contains(&reason::NODES_CONFLICTING.to_string()),
        "{:?}",
        event_reasons(&p)
    );
}

#[test]
fn creation_time_tie_is_broken_by_name() {
    let mut w = world(
        vec![fabric("zeta", 0, &[]), fabric("alpha", 0, &[])],
        vec![node("n", &[])],
        vec![],
    );
    let p = step(&mut w);
    assert_eq!(p.report.nodes[0].fabric, "alpha");
    assert_eq!(p.report.nodes[0].conflicts_with, ["zeta"]);
    assert_eq!(
        fabric_of(&w, "zeta")
            .status
            .as_ref()
            .unwrap()
            .nodes
            .conflicting,
        1
    );
    assert_eq!(
        condition_of(&w, "zeta", condition::READY),
        ("False".into(), reason::NO_NODES_SELECTED.into())
    );
}

#[test]
fn rollout_with_budget_one_paces_one_node_at_a_time() {
    let mut w = world(vec![fabric("f", 0, &[])], nodes("n", 3, &[]), vec![]);
    let p = step(&mut w);
    assert_eq!(
        applied_nodes(&p),
        ["n-000"],
        "new nodes count against the budget"
    );
    assert_eq!(
        pending_nodes(&p),
        ["n-001", "n-002"],
        "the others get their RoceNode at once, pending, so their QoS gate holds"
    );
    assert!(
        w.roce_nodes
            .iter()
            .filter(|rn| rn.spec.pending)
            .all(|rn| rn.spec.fabric == "f" && rn.spec.qos == w.roce_nodes[0].spec.qos),
        "a placeholder names its fabric"
    );
    assert_eq!(
        condition_of(&w, "f", condition::PROGRESSING),
        ("True".into(), reason::ROLLOUT_IN_PROGRESS.into())
    );
    assert_eq!(event_reasons(&p), [reason::ROLLOUT_IN_PROGRESS]);

    // n-000 has not reported: nothing moves, nothing is written.
    let p = step(&mut w);
    assert!(p.writes.is_empty(), "{:?}", p.writes);

    agent_reports(&mut w, &["n-000"], true);
    let p = step(&mut w);
    assert_eq!(applied_nodes(&p), ["n-001"]);
    assert_eq!(
        fabric_of(&w, "f").status.as_ref().unwrap().nodes.configured,
        1
    );
    assert!(
        events(&p).is_empty(),
        "progress within a rollout raises no Event"
    );

    agent_reports(&mut w, &["n-001"], true);
    assert_eq!(applied_nodes(&step(&mut w)), ["n-002"]);
    agent_reports(&mut w, &["n-002"], true);
    let p = step(&mut w);
    assert!(applied_nodes(&p).is_empty());
    assert_eq!(
        condition_of(&w, "f", condition::READY),
        ("True".into(), reason::ALL_NODES_CONFIGURED.into())
    );
    assert_eq!(
        condition_of(&w, "f", condition::PROGRESSING),
        ("False".into(), reason::ROLLOUT_COMPLETE.into())
    );
    assert_eq!(event_reasons(&p), [reason::ALL_NODES_CONFIGURED]);
    assert!(step(&mut w).writes.is_empty());
}

#[test]
fn percentage_budget_rounds_up() {
    let f = with_budget(fabric("f", 0, &[]), IntOrString::String("25%".into()));
    let mut w = world(vec![f], nodes("n", 10, &[]), vec![]);
    let p = step(&mut w);
    assert_eq!(
        applied_nodes(&p),
        ["n-000", "n-001", "n-002"],
        "25% of 10 is 2.5, rounded up"
    );
    assert_eq!(p.report.fabrics[0].rollout_budget, 3);
    agent_reports(&mut w, &["n-000"], true);
    assert_eq!(applied_nodes(&step(&mut w)), ["n-003"], "one slot freed");
}

#[test]
fn a_spec_change_rolls_out_within_the_budget_and_counts_unsettled_nodes() {
    let f = with_budget(fabric("f", 0, &[]), IntOrString::Int(2));
    let mut w = world(vec![f], nodes("n", 4, &[]), vec![]);
    converge(&mut w);
    assert_eq!(condition_of(&w, "f", condition::READY).0, "True");

    bump_dscp(&mut w.fabrics[0], 24);
    let p = step(&mut w);
    assert_eq!(applied_nodes(&p), ["n-000", "n-001"]);
    for w in &p.writes {
        if let Write::ApplyRoceNode { spec, .. } = w {
            assert_eq!(spec.fabric_generation, 2);
            assert_eq!(spec.qos.roce_dscp, 24);
        }
    }
    let st = fabric_of(&w, "f").status.clone().unwrap();
    assert_eq!(st.observed_generation, Some(2));
    assert_eq!(st.traffic_class, Some(98));
    assert_eq!(
        st.nodes.configured, 0,
        "configured means configured for the current generation"
    );
    assert_eq!(
        condition_of(&w, "f", condition::READY),
        ("False".into(), reason::ROLLOUT_IN_PROGRESS.into())
    );
    assert!(event_reasons(&p).contains(&reason::ROLLOUT_IN_PROGRESS.to_string()));

    // A third generation while n-000 and n-001 still settle generation 2: they take it at once
    // (they are in progress already), the others keep waiting.
    bump_dscp(&mut w.fabrics[0], 22);
    let p = step(&mut w);
    assert_eq!(applied_nodes(&p), ["n-000", "n-001"]);
    assert_eq!(p.report.fabrics[0].in_progress_nodes, 2);
    assert_eq!(p.report.fabrics[0].waiting_nodes, 2);
}

/// Only a change of what the nodes apply rolls out: editing the rollout budget (or shared
/// memory) bumps the fabric's generation but writes no RoceNode and keeps every node configured.
#[test]
fn an_edit_that_leaves_the_node_config_alone_rolls_nothing() {
    let f = with_budget(fabric("f", 0, &[]), IntOrString::Int(1));
    let mut w = world(vec![f], nodes("n", 3, &[]), vec![]);
    converge(&mut w);
    let edited = with_budget(w.fabrics[0].clone(), IntOrString::String("50%".into()));
    w.fabrics[0] = edited;
    w.fabrics[0].metadata.generation = Some(2);
    let p = step(&mut w);
    assert!(applied_nodes(&p).is_empty(), "{:?}", p.writes);
    assert_eq!(p.report.fabrics[0].configured_nodes, 3);
    let st = fabric_of(&w, "f").status.clone().unwrap();
    assert_eq!(st.observed_generation, Some(2));
    assert_eq!(st.nodes.configured, 3);
    assert_eq!(condition_of(&w, "f", condition::READY).0, "True");
    // A QoS change afterwards still rolls out, at the new generation.
    bump_dscp(&mut w.fabrics[0], 24);
    let p = step(&mut w);
    assert!(!applied_nodes(&p).is_empty());
    for w in &p.writes {
        if let Write::ApplyRoceNode { spec, .. } = w {
            assert_eq!(spec.fabric_generation, 3);
        }
    }
}

#[test]
fn failures_beyond_the_budget_stop_the_rollout() {
    let mut w = world(vec![fabric("f", 0, &[])], nodes("n", 4, &[]), vec![]);
    assert_eq!(applied_nodes(&step(&mut w)), ["n-000"]);
    agent_reports(&mut w, &["n-000"], false);
    let p = step(&mut w);
    assert_eq!(
        applied_nodes(&p),
        ["n-001"],
        "one failure does not exceed a budget of one"
    );
    assert_eq!(
        condition_of(&w, "f", condition::DEGRADED),
        ("True".into(), reason::NODES_FAILED.into())
    );
    assert!(
        events(&p)
            .iter()
            .any(|e| e.reason == reason::NODES_FAILED && e.type_ == EventType::Warning)
    );

    agent_reports(&mut w, &["n-001"], false);
    let p = step(&mut w);
    assert!(
        applied_nodes(&p).is_empty(),
        "two failures exceed the budget: no node gets the spec"
    );
    assert_eq!(
        condition_of(&w, "f", condition::PROGRESSING),
        ("False".into(), reason::ROLLOUT_BLOCKED.into())
    );
    assert_eq!(
        condition_of(&w, "f", condition::READY),
        ("False".into(), reason::ROLLOUT_BLOCKED.into())
    );
    assert_eq!(
        condition_of(&w, "f", condition::DEGRADED),
        ("True".into(), reason::NODES_FAILED.into())
    );
    let st = fabric_of(&w, "f").status.clone().unwrap();
    assert_eq!(
        (st.nodes.failed, st.nodes.configured, st.nodes.selected),
        (2, 0, 4)
    );
    let blocked: Vec<_> = events(&p)
        .into_iter()
        .filter(|e| e.reason == reason::ROLLOUT_BLOCKED)
        .collect();
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].type_, EventType::Warning);
    assert!(p.report.fabrics[0].rollout_blocked);
    assert!(
        step(&mut w).writes.is_empty(),
        "blocked is a steady state too"
    );

    // Fixing one node unblocks the rollout.
    agent_reports(&mut w, &["n-001"], true);
    assert_eq!(applied_nodes(&step(&mut w)), ["n-002"]);
}

#[test]
fn status_aggregates_counts_traffic_class_and_generation() {
    let f = with_budget(fabric("f", 0, &[]), IntOrString::String("100%".into()));
    let mut w = world(vec![f], nodes("n", 3, &[]), vec![]);
    step(&mut w);
    agent_reports(&mut w, &["n-000", "n-001"], true);
    agent_reports(&mut w, &["n-002"], false);
    step(&mut w);
    let st = fabric_of(&w, "f").status.clone().unwrap();
    assert_eq!(
        (
            st.nodes.selected,
            st.nodes.configured,
            st.nodes.failed,
            st.nodes.conflicting
        ),
        (3, 2, 1, 0)
    );
    assert_eq!(st.traffic_class, Some(106));
    assert_eq!(st.observed_generation, Some(1));
    assert_eq!(
        condition_of(&w, "f", condition::READY),
        ("False".into(), reason::NODES_FAILED.into())
    );
    assert_eq!(
        condition_of(&w, "f", condition::PROGRESSING),
        ("False".into(), reason::ROLLOUT_COMPLETE.into())
    );
    let degraded = st
        .conditions
        .iter()
        .find(|c| c.type_ == condition::DEGRADED)
        .unwrap();
    assert!(degraded.message.contains("n-002"), "{}", degraded.message);
    assert!(
        st.conditions
            .iter()
            .all(|c| c.observed_generation == Some(1))
    );
}

#[test]
fn conditions_keep_their_transition_time_and_events_come_only_on_transitions() {
    let mut w = world(vec![fabric("f", 0, &[])], nodes("n", 1, &[]), vec![]);
    let first = step(&mut w);
    assert_eq!(event_reasons(&first), [reason::ROLLOUT_IN_PROGRESS]);
    w.now = ts(T0 + 7200);
    agent_reports_all(&mut w, true);
    let p = step(&mut w);
    assert_eq!(event_reasons(&p), [reason::ALL_NODES_CONFIGURED]);
    let st = fabric_of(&w, "f").status.clone().unwrap();
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .unwrap();
    assert_eq!(
        ready.last_transition_time.0,
        ts(T0 + 7200),
        "Ready flipped now"
    );
    let degraded = st
        .conditions
        .iter()
        .find(|c| c.type_ == condition::DEGRADED)
        .unwrap();
    assert_eq!(degraded.status, "False");
    assert_eq!(
        degraded.last_transition_time.0,
        ts(T0 + 3600),
        "Degraded did not change: its time stays"
    );
    w.now = ts(T0 + 9000);
    let p = step(&mut w);
    assert!(
        p.writes.is_empty(),
        "no Event and no status write without a transition: {:?}",
        p.writes
    );
}

/// Plan, apply and let every node report success until nothing is written.
fn converge(w: &mut rocefabric_operator::planner::World) {
    for _ in 0..50 {
        let p = step(w);
        agent_reports_all(w, true);
        if p.writes.is_empty() {
            return;
        }
    }
    panic!("the world did not converge");
}

#[test]
fn a_converged_world_plans_no_writes() {
    let f = with_shared_memory(fabric("f", 0, &[GPU]), "1Gi", 16, &[]);
    let pods = vec![
        pod("a", "p0", 10, &[("rocefabric.io/fabric", "f")], true),
        scheduled(
            pod("b", "p1", 11, &[("rocefabric.io/fabric", "f")], false),
            "n-000",
            "10.0.0.1",
        ),
    ];
    let mut w = world(
        vec![f, fabric("g", 5, &[("rack", "x")])],
        nodes("n", 3, &[GPU]),
        pods,
    );
    converge(&mut w);
    let again = plan(&w, &opts());
    assert!(again.writes.is_empty(), "{:?}", again.writes);
    assert_eq!(again.report.fabrics[0].configured_nodes, 3);
    assert_eq!(again.report.fabrics[0].region_count, 2);
    assert_eq!(again.requeue_after, None);
    // After an operator restart (no allocator memory) the same world still plans nothing.
    w.freed = Default::default();
    assert!(plan(&w, &opts()).writes.is_empty());
}

#[test]
fn nodes_leaving_the_selection_lose_their_roce_node() {
    let f = with_budget(fabric("f", 0, &[GPU]), IntOrString::String("100%".into()));
    let mut w = world(vec![f], nodes("n", 3, &[GPU]), vec![]);
    converge(&mut w);
    assert_eq!(w.roce_nodes.len(), 3);
    w.nodes[1].labels = [("gpu", "none")].into_iter().collect();
    w.nodes.remove(2);
    let p = step(&mut w);
    assert_eq!(deleted_nodes(&p), ["n-001", "n-002"]);
    assert_eq!(p.report.deleted_roce_nodes, ["n-001", "n-002"]);
    assert_eq!(
        fabric_of(&w, "f").status.as_ref().unwrap().nodes.selected,
        1
    );
    assert!(step(&mut w).writes.is_empty());
}

#[test]
fn a_deleted_fabric_leaves_no_roce_nodes_or_directories_behind() {
    let f = with_shared_memory(
        with_budget(fabric("f", 0, &[]), IntOrString::String("100%".into())),
        "1Gi",
        4,
        &[],
    );
    let pods = vec![pod("ns", "p", 1, &[("rocefabric.io/fabric", "f")], true)];
    let mut w = world(vec![f], nodes("n", 2, &[]), pods);
    converge(&mut w);
    assert_eq!(w.config_maps.len(), 1);
    w.fabrics.clear();
    let p = step(&mut w);
    assert_eq!(deleted_nodes(&p), ["n-000", "n-001"]);
    assert!(p.writes.contains(&Write::DeleteRegionDirectory {
        namespace: "ns".into(),
        fabric: "f".into()
    }));
    assert!(w.roce_nodes.is_empty() && w.config_maps.is_empty());
    assert!(step(&mut w).writes.is_empty());
}

#[test]
fn a_node_moves_to_the_younger_fabric_when_the_older_one_is_deleted() {
    let mut w = world(
        vec![fabric("old", 0, &[]), fabric("young", 10, &[])],
        vec![node("n", &[])],
        vec![],
    );
    converge(&mut w);
    assert_eq!(w.roce_nodes[0].spec.fabric, "old");
    w.fabrics
        .retain(|f| f.metadata.name.as_deref() == Some("young"));
    let p = step(&mut w);
    assert!(deleted_nodes(&p).is_empty(), "taken over, not deleted");
    assert_eq!(applied_nodes(&p), ["n"]);
    assert_eq!(w.roce_nodes[0].spec.fabric, "young");
    assert_eq!(
        w.roce_nodes[0].controller,
        Some(("young".into(), "uid-young".into()))
    );
    assert_eq!(
        fabric_of(&w, "young")
            .status
            .as_ref()
            .unwrap()
            .nodes
            .conflicting,
        0
    );
}

#[test]
fn an_invalid_fabric_reports_the_field_and_writes_nothing_for_its_nodes() {
    let mut w = world(vec![fabric("f", 0, &[])], nodes("n", 2, &[]), vec![]);
    converge(&mut w);
    let before = w.roce_nodes.clone();
    w.fabrics[0].spec.qos.roce_priority = 5; // not in pfcPriorities [3]
    w.fabrics[0].metadata.generation = Some(2);
    let p = step(&mut w);
    assert!(
        applied_nodes(&p).is_empty() && deleted_nodes(&p).is_empty(),
        "{:?}",
        p.writes
    );
    assert_eq!(
        serde_json::to_value(&w.roce_nodes).unwrap(),
        serde_json::to_value(&before).unwrap()
    );
    assert_eq!(
        condition_of(&w, "f", condition::READY),
        ("False".into(), reason::INVALID_SPEC.into())
    );
    assert_eq!(
        condition_of(&w, "f", condition::DEGRADED),
        ("True".into(), reason::INVALID_SPEC.into())
    );
    let st = fabric_of(&w, "f").status.clone().unwrap();
    let msg = &st
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .unwrap()
        .message;
    assert!(msg.contains("rocePriority"), "{msg}");
    assert_eq!(st.observed_generation, Some(2));
    assert!(!p.report.fabrics[0].valid);
    assert_eq!(event_reasons(&p), [reason::INVALID_SPEC]);
    assert!(
        step(&mut w).writes.is_empty(),
        "an invalid spec awaits a change"
    );
}

#[test]
fn a_bad_selector_operator_is_an_invalid_spec() {
    let f = with_expressions(fabric("f", 0, &[]), &[("gpu", "Matches", &["x"])]);
    let mut w = world(vec![f], nodes("n", 1, &[]), vec![]);
    let p = step(&mut w);
    assert!(applied_nodes(&p).is_empty());
    assert_eq!(p.report.fabrics[0].errors[0].field, "spec.nodeSelector");
    assert_eq!(
        condition_of(&w, "f", condition::READY).1,
        reason::INVALID_SPEC
    );
}

#[test]
fn no_selected_nodes_is_reported() {
    let mut w = world(vec![fabric("f", 0, &[GPU])], nodes("n", 2, &[]), vec![]);
    let p = step(&mut w);
    assert!(applied_nodes(&p).is_empty());
    assert_eq!(
        condition_of(&w, "f", condition::READY),
        ("False".into(), reason::NO_NODES_SELECTED.into())
    );
    assert_eq!(
        condition_of(&w, "f", condition::DEGRADED),
        ("True".into(), reason::NO_NODES_SELECTED.into())
    );
}

#[test]
fn roce_node_metadata_is_repaired_without_waiting_for_the_budget() {
    let mut w = world(vec![fabric("f", 0, &[])], nodes("n", 2, &[]), vec![]);
    converge(&mut w);
    w.roce_nodes[1].fabric_label = None;
    let p = step(&mut w);
    assert_eq!(applied_nodes(&p), ["n-001"]);
    assert_eq!(p.report.nodes[1].action, NodeAction::Update);
    assert!(step(&mut w).writes.is_empty());
}

#[test]
fn writes_come_in_a_fixed_order() {
    let f = with_shared_memory(
        with_budget(fabric("f", 0, &[]), IntOrString::String("100%".into())),
        "1Gi",
        4,
        &[],
    );
    let pods = vec![
        pod("ns", "b", 2, &[("rocefabric.io/fabric", "f")], true),
        pod("ns", "a", 1, &[("rocefabric.io/fabric", "f")], true),
    ];
    let mut w = world(vec![f], nodes("n", 2, &[]), pods);
    w.roce_nodes.push(
        rocefabric_operator::planner::writes::roce_node_object(
            "gone",
            "f",
            "uid-f",
            &rocefabric_api::RoceNodeSpec::default(),
        )
        .into(),
    );
    let p = plan(&w, &opts());
    let kinds: Vec<&str> = p.writes.iter().map(Write::kind).collect();
    assert_eq!(
        kinds,
        [
            "delete_roce_node",
            "apply_roce_node",
            "apply_roce_node",
            "annotate_pod_region",
            "remove_pod_gate",
            "annotate_pod_region",
            "remove_pod_gate",
            "apply_region_directory",
            "apply_fabric_status",
            "event",
        ]
    );
}

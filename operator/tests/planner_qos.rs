//! The fabric's QoS reaches every RoceNode as rendered: `qos.lossySoftRoce` is carried like the
//! other QoS fields, a change of it re-rolls the nodes, and a node whose agent accepted a
//! Soft-RoCE interface (`QosApplied` True, `Degraded` True) counts as configured.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

mod support;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rocefabric_api::constants::{condition, reason};
use rocefabric_api::{LossySoftRoce, RoceNodeSpec};
use rocefabric_operator::planner::Write;
use rocefabric_operator::planner::writes::roce_node_object;
use rocefabric_operator_testing::objects::*;
use support::*;

/// The RoceNode specs a plan writes (pending placeholders included), by node name.
fn specs(p: &rocefabric_operator::planner::Plan) -> Vec<(String, RoceNodeSpec)> {
    p.writes
        .iter()
        .filter_map(|w| match w {
            Write::ApplyRoceNode { name, spec, .. } => Some((name.clone(), spec.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn lossy_soft_roce_is_carried_into_every_roce_node_spec_and_its_change_re_rolls() {
    let mut f = with_budget(fabric("f", 0, &[]), IntOrString::String("100%".into()));
    f.spec.qos.lossy_soft_roce = LossySoftRoce::Accept;
    let mut w = world(vec![f], nodes("n", 2, &[]), vec![]);
    let p = step(&mut w);
    let written = specs(&p);
    assert_eq!(written.len(), 2, "{written:?}");
    for (name, spec) in &written {
        assert_eq!(spec.qos.lossy_soft_roce, LossySoftRoce::Accept, "{name}");
        let body = serde_json::to_value(roce_node_object(name, "f", "uid-f", spec)).unwrap();
        assert_eq!(body["spec"]["qos"]["lossySoftRoce"], "Accept", "{body}");
    }
    agent_reports_all(&mut w, true);
    assert!(specs(&step(&mut w)).is_empty(), "settled: nothing to write");

    // Back to the default: what the nodes apply changed, so both get the new spec.
    let f = &mut w.fabrics[0];
    f.spec.qos.lossy_soft_roce = LossySoftRoce::Refuse;
    f.metadata.generation = Some(2);
    let written = specs(&step(&mut w));
    assert_eq!(written.len(), 2, "{written:?}");
    for (name, spec) in &written {
        assert_eq!(
            (spec.fabric_generation, spec.qos.lossy_soft_roce),
            (2, LossySoftRoce::Refuse),
            "{name}"
        );
        let body = serde_json::to_value(roce_node_object(name, "f", "uid-f", spec)).unwrap();
        assert_eq!(
            body["spec"]["qos"]["lossySoftRoce"], "Refuse",
            "written out like every other default"
        );
    }
}

/// `QosApplied` True with reason `SoftRoceAccepted` and `Degraded` True, as the agent reports a
/// Soft-RoCE node under `Accept`: configured, not failed, and the fabric becomes Ready.
#[test]
fn a_node_reporting_soft_roce_accepted_counts_as_configured() {
    let mut f = fabric("f", 0, &[]);
    f.spec.qos.lossy_soft_roce = LossySoftRoce::Accept;
    let mut w = world(vec![f], nodes("n", 1, &[]), vec![]);
    step(&mut w);
    for rn in &mut w.roce_nodes {
        let mut status = agent_status(rn.spec.fabric_generation, true, ts(T0));
        status.conditions[0].reason = reason::SOFT_ROCE_ACCEPTED.into();
        status.conditions.push(Condition {
            type_: condition::DEGRADED.into(),
            status: "True".into(),
            reason: reason::SOFT_ROCE_ACCEPTED.into(),
            ..status.conditions[0].clone()
        });
        rn.status = Some((&status).into());
    }
    step(&mut w);
    let st = fabric_of(&w, "f").status.clone().unwrap();
    assert_eq!((st.nodes.configured, st.nodes.failed), (1, 0));
    assert_eq!(condition_of(&w, "f", condition::READY).0, "True");
}

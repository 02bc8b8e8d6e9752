//! The agent's pure side: a `RoceNode`'s status and conditions from the per-knob outcomes, and
//! drift against the last status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use rocefabric_api::conditions::{self, Desired as DesiredCondition};
use rocefabric_api::constants::{API_VERSION, condition, reason};
use rocefabric_api::{InterfaceStatus, Knob, KnobOutcome, KnobStatus, RoceNode, RoceNodeStatus};

use super::super::plan::Desired;

pub(super) fn knob_name(knob: Knob) -> String {
    serde_json::to_value(knob)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{knob:?}"))
}

pub(super) fn problems(
    interfaces: &[InterfaceStatus],
    outcome: KnobOutcome,
    which: impl Fn(Knob) -> bool + Copy,
) -> Vec<String> {
    interfaces
        .iter()
        .flat_map(|i| {
            i.knobs
                .iter()
                .filter(move |k| k.outcome == outcome && which(k.knob))
                .map(move |k| {
                    let why = k.error.as_deref().unwrap_or("no detail");
                    format!("{} {}: {why}", i.netdev, knob_name(k.knob))
                })
        })
        .collect()
}

/// At most `n` items, then "and N more".
pub(super) fn summarize(items: &[String], n: usize) -> String {
    let mut s = items.iter().take(n).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > n {
        s.push_str(&format!("; and {} more", items.len() - n));
    }
    s
}

/// Knobs without which the NIC is not lossless: if one of them cannot be set, RoCE traffic may
/// be dropped, so the node must not be reported as applied (and the device-plugin gate keeps its
/// HCAs unhealthy). The others (ECN, CNP, rdma_cm ToS) tune congestion control; the upstream mlx5
/// driver exposes no ECN enable files at all (the firmware enables DCQCN), so an unsupported one
/// degrades the node without blocking it.
pub fn is_lossless_knob(knob: Knob) -> bool {
    matches!(knob, Knob::Trust | Knob::DscpMap | Knob::Pfc | Knob::Mtu)
}

/// Whether an interface's report proves it lossless: no knob failed and every lossless knob
/// holds. The device-plugin gate admits exactly these interfaces.
pub fn interface_is_lossless(iface: &InterfaceStatus) -> bool {
    !iface.knobs.is_empty()
        && iface.knobs.iter().all(|k| {
            k.outcome.holds()
                || (k.outcome == KnobOutcome::Unsupported && !is_lossless_knob(k.knob))
        })
}

/// `QosApplied`, `Ready` and `Degraded` for a node's interfaces (pure).
///
/// `QosApplied` is True when no knob failed and every lossless knob ([`is_lossless_knob`])
/// holds. `Degraded` is True whenever anything failed or is unsupported, naming the knobs.
pub fn node_conditions(interfaces: &[InterfaceStatus]) -> Vec<DesiredCondition> {
    let failed = problems(interfaces, KnobOutcome::Failed, |_| true);
    let unsupported_lossless = problems(interfaces, KnobOutcome::Unsupported, is_lossless_knob);
    let unsupported_tuning = problems(interfaces, KnobOutcome::Unsupported, |k| {
        !is_lossless_knob(k)
    });
    let (qos_ok, qos_reason, qos_message) = if interfaces.is_empty() {
        (
            false,
            reason::NO_INTERFACES,
            "no RoCE interface on this node matches the fabric's nicSelector".to_string(),
        )
    } else if !failed.is_empty() {
        (
            false,
            reason::QOS_FAILED,
            format!("{} knob(s) failed: {}", failed.len(), summarize(&failed, 5)),
        )
    } else if !unsupported_lossless.is_empty() {
        (
            false,
            reason::QOS_UNSUPPORTED,
            format!(
                "{} knob(s) unsupported: {}",
                unsupported_lossless.len(),
                summarize(&unsupported_lossless, 5)
            ),
        )
    } else {
        (
            true,
            reason::QOS_APPLIED,
            format!("QoS holds on {} interface(s)", interfaces.len()),
        )
    };
    let down: Vec<String> = interfaces
        .iter()
        .filter(|i| i.link_state.as_deref() != Some("ACTIVE"))
        .map(|i| {
            format!(
                "{} is {}",
                i.netdev,
                i.link_state.as_deref().unwrap_or("in an unknown state")
            )
        })
        .collect();
    let ready = if !qos_ok {
        DesiredCondition::new(condition::READY, false, qos_reason, qos_message.clone())
    } else if !down.is_empty() {
        DesiredCondition::new(
            condition::READY,
            false,
            reason::LINK_DOWN,
            summarize(&down, 5),
        )
    } else {
        DesiredCondition::new(
            condition::READY,
            true,
            reason::AS_EXPECTED,
            qos_message.clone(),
        )
    };
    let degraded = if qos_ok && !unsupported_tuning.is_empty() {
        DesiredCondition::new(
            condition::DEGRADED,
            true,
            reason::QOS_UNSUPPORTED,
            format!(
                "lossless, but {} congestion-control knob(s) unsupported: {}",
                unsupported_tuning.len(),
                summarize(&unsupported_tuning, 5)
            ),
        )
    } else if qos_ok {
        DesiredCondition::new(condition::DEGRADED, false, reason::AS_EXPECTED, "")
    } else {
        DesiredCondition::new(condition::DEGRADED, true, qos_reason, qos_message.clone())
    };
    vec![
        DesiredCondition::new(condition::QOS_APPLIED, qos_ok, qos_reason, qos_message),
        ready,
        degraded,
    ]
}

/// The conditions the node's status holds now (merged with, to keep transition times).
pub(super) fn previous_conditions(node: &RoceNode) -> &[Condition] {
    node.status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default()
}

/// The status of a node waiting for its rollout slot (pure): nothing applied, `QosApplied`
/// and `Ready` False (`RolloutPending`) so the device plugin's gate holds the HCAs, and no
/// fabric generation reported (the operator must not read it as the outcome of the real spec).
pub fn pending_status(node: &RoceNode, now: &Time) -> RoceNodeStatus {
    let generation = node.metadata.generation;
    let previous = previous_conditions(node);
    let message = format!(
        "selected by fabric {}, waiting for a rollout slot: nothing applied yet",
        node.spec.fabric
    );
    let desired = vec![
        DesiredCondition::new(
            condition::QOS_APPLIED,
            false,
            reason::ROLLOUT_PENDING,
            message.clone(),
        ),
        DesiredCondition::new(condition::READY, false, reason::ROLLOUT_PENDING, message),
        DesiredCondition::new(condition::DEGRADED, false, reason::AS_EXPECTED, ""),
    ];
    RoceNodeStatus {
        observed_generation: generation,
        fabric_generation: None,
        conditions: conditions::merge(previous, &desired, generation, now),
        interfaces: Vec::new(),
        last_sync_time: Some(now.clone()),
    }
}

/// The status a pass writes (pure).
pub fn node_status(
    node: &RoceNode,
    interfaces: Vec<InterfaceStatus>,
    now: &Time,
) -> RoceNodeStatus {
    let generation = node.metadata.generation;
    let previous = previous_conditions(node);
    RoceNodeStatus {
        observed_generation: generation,
        fabric_generation: Some(node.spec.fabric_generation),
        conditions: conditions::merge(previous, &node_conditions(&interfaces), generation, now),
        interfaces,
        last_sync_time: Some(now.clone()),
    }
}

/// The server-side apply body of a status write.
pub fn status_patch(status: &RoceNodeStatus) -> serde_json::Value {
    serde_json::json!({ "apiVersion": API_VERSION, "kind": "RoceNode", "status": status })
}

/// Knobs that held at the previous pass for this same generation and had to be written again.
pub fn drifted(node: &RoceNode, now: &[InterfaceStatus]) -> Vec<(String, Knob)> {
    let Some(prev) = node.status.as_ref() else {
        return Vec::new();
    };
    if prev.observed_generation != node.metadata.generation || prev.observed_generation.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for iface in now {
        let Some(before) = prev.interfaces.iter().find(|p| p.netdev == iface.netdev) else {
            continue;
        };
        for k in iface
            .knobs
            .iter()
            .filter(|k| k.outcome == KnobOutcome::Applied)
        {
            if before
                .knobs
                .iter()
                .any(|b| b.knob == k.knob && b.outcome.holds())
            {
                out.push((iface.netdev.clone(), k.knob));
            }
        }
    }
    out
}

pub(super) fn failed_knobs(desired: &Desired, error: &str) -> Vec<KnobStatus> {
    desired
        .knobs()
        .into_iter()
        .map(|knob| KnobStatus {
            knob,
            outcome: KnobOutcome::Failed,
            mechanism: None,
            desired: None,
            observed: None,
            error: Some(error.to_string()),
        })
        .collect()
}

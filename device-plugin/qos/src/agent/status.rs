//! The agent's pure side: a `RoceNode`'s status and conditions from the per-knob outcomes, and
//! drift against the last status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use rocefabric_api::conditions::{self, Desired as DesiredCondition};
use rocefabric_api::constants::{API_VERSION, condition, reason};
use rocefabric_api::{
    InterfaceStatus, Knob, KnobOutcome, KnobStatus, LossySoftRoce, RoceNode, RoceNodeStatus,
};

use super::super::plan::Desired;
use super::lossless::{blocks, is_accepted_soft_roce};

pub(super) fn knob_name(knob: Knob) -> String {
    serde_json::to_value(knob)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{knob:?}"))
}

/// `"<netdev> <knob>: <why>"` for every knob of `interfaces` that `which` picks.
pub(super) fn problems(
    interfaces: &[InterfaceStatus],
    which: impl Fn(&InterfaceStatus, &KnobStatus) -> bool + Copy,
) -> Vec<String> {
    interfaces
        .iter()
        .flat_map(|i| {
            i.knobs.iter().filter(move |k| which(i, k)).map(move |k| {
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

/// `"<netdev> (<rdma device>)"`.
fn interface_name(iface: &InterfaceStatus) -> String {
    match &iface.rdma_device {
        Some(rdma) => format!("{} ({rdma})", iface.netdev),
        None => iface.netdev.clone(),
    }
}

/// `"eth0 (rxe0): trust, dscpMap, pfc unsupported"` for each Soft-RoCE interface admitted only
/// because `policy` accepts it.
fn accepted_soft_roce(interfaces: &[InterfaceStatus], policy: LossySoftRoce) -> Vec<String> {
    interfaces
        .iter()
        .filter(|i| is_accepted_soft_roce(i, policy))
        .map(|i| {
            let knobs: Vec<String> = i
                .knobs
                .iter()
                .filter(|k| k.outcome == KnobOutcome::Unsupported)
                .map(|k| knob_name(k.knob))
                .collect();
            format!("{}: {} unsupported", interface_name(i), knobs.join(", "))
        })
        .collect()
}

/// The Soft-RoCE interfaces kept out only because the fabric refuses lossy Soft-RoCE: the hint
/// that says what a test fabric can do about it.
fn refused_soft_roce_hint(interfaces: &[InterfaceStatus], policy: LossySoftRoce) -> String {
    if policy != LossySoftRoce::Refuse {
        return String::new();
    }
    let refused: Vec<String> = interfaces
        .iter()
        .filter(|i| {
            i.knobs
                .iter()
                .any(|k| blocks(policy, i, k) && !blocks(LossySoftRoce::Accept, i, k))
        })
        .map(interface_name)
        .collect();
    if refused.is_empty() {
        return String::new();
    }
    format!(
        "; {} is Soft-RoCE, which has no DCB and is never lossless: a test fabric may accept it \
         with spec.qos.lossySoftRoce: Accept",
        refused.join(", ")
    )
}

/// `QosApplied`: status, reason and message.
struct Verdict {
    ok: bool,
    reason: &'static str,
    message: String,
}

impl Verdict {
    fn new(ok: bool, reason: &'static str, message: String) -> Self {
        Self {
            ok,
            reason,
            message,
        }
    }
}

/// `QosApplied` for a node's interfaces under the fabric's Soft-RoCE policy (pure): failures
/// first, then knobs that block ([`blocks`]), then whether a Soft-RoCE interface counts only
/// because the fabric accepts it.
fn qos_verdict(interfaces: &[InterfaceStatus], policy: LossySoftRoce) -> Verdict {
    if interfaces.is_empty() {
        return Verdict::new(
            false,
            reason::NO_INTERFACES,
            "no RoCE interface on this node matches the fabric's nicSelector".to_string(),
        );
    }
    let failed = problems(interfaces, |_, k| k.outcome == KnobOutcome::Failed);
    if !failed.is_empty() {
        let message = format!("{} knob(s) failed: {}", failed.len(), summarize(&failed, 5));
        return Verdict::new(false, reason::QOS_FAILED, message);
    }
    let blocking = problems(interfaces, |i, k| {
        k.outcome == KnobOutcome::Unsupported && blocks(policy, i, k)
    });
    if !blocking.is_empty() {
        let message = format!(
            "{} knob(s) unsupported: {}{}",
            blocking.len(),
            summarize(&blocking, 5),
            refused_soft_roce_hint(interfaces, policy)
        );
        return Verdict::new(false, reason::QOS_UNSUPPORTED, message);
    }
    let soft = accepted_soft_roce(interfaces, policy);
    if soft.is_empty() {
        let message = format!("QoS holds on {} interface(s)", interfaces.len());
        return Verdict::new(true, reason::QOS_APPLIED, message);
    }
    let message = format!(
        "{} interface(s) configured, not lossless: {} Soft-RoCE interface(s) accepted by \
         spec.qos.lossySoftRoce: Accept: {}",
        interfaces.len(),
        soft.len(),
        summarize(&soft, 5)
    );
    Verdict::new(true, reason::SOFT_ROCE_ACCEPTED, message)
}

/// `Ready`: `QosApplied`, then every interface's link up.
fn ready_condition(interfaces: &[InterfaceStatus], qos: &Verdict) -> DesiredCondition {
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
    if !qos.ok {
        DesiredCondition::new(condition::READY, false, qos.reason, qos.message.clone())
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
            qos.message.clone(),
        )
    }
}

/// `Degraded`: whatever did not hold, even where `QosApplied` is True (congestion-control knobs
/// a lossless NIC lacks, or a Soft-RoCE interface the fabric accepts without lossless QoS).
fn degraded_condition(interfaces: &[InterfaceStatus], qos: &Verdict) -> DesiredCondition {
    if !qos.ok {
        return DesiredCondition::new(condition::DEGRADED, true, qos.reason, qos.message.clone());
    }
    let unsupported = problems(interfaces, |_, k| k.outcome == KnobOutcome::Unsupported);
    if unsupported.is_empty() {
        return DesiredCondition::new(condition::DEGRADED, false, reason::AS_EXPECTED, "");
    }
    let n = unsupported.len();
    let listed = summarize(&unsupported, 5);
    if qos.reason == reason::SOFT_ROCE_ACCEPTED {
        let message = format!(
            "not lossless, Soft-RoCE accepted by spec.qos.lossySoftRoce: Accept: {n} knob(s) \
             unsupported: {listed}"
        );
        return DesiredCondition::new(
            condition::DEGRADED,
            true,
            reason::SOFT_ROCE_ACCEPTED,
            message,
        );
    }
    let message = format!("lossless, but {n} congestion-control knob(s) unsupported: {listed}");
    DesiredCondition::new(condition::DEGRADED, true, reason::QOS_UNSUPPORTED, message)
}

/// `QosApplied`, `Ready` and `Degraded` for a node's interfaces under the fabric's Soft-RoCE
/// policy (`spec.qos.lossySoftRoce`; pure).
///
/// `QosApplied` is True when no knob failed and every lossless knob
/// ([`is_lossless_knob`](super::is_lossless_knob)) holds, except that `Accept` excuses, on a
/// virtual device only, the knobs no soft device can hold
/// ([`soft_roce_cannot_hold`](super::soft_roce_cannot_hold)): reason `SoftRoceAccepted` then.
/// `Degraded` is True whenever anything failed or is unsupported, naming the knobs.
pub fn node_conditions(
    interfaces: &[InterfaceStatus],
    policy: LossySoftRoce,
) -> Vec<DesiredCondition> {
    let qos = qos_verdict(interfaces, policy);
    let ready = ready_condition(interfaces, &qos);
    let degraded = degraded_condition(interfaces, &qos);
    vec![
        DesiredCondition::new(condition::QOS_APPLIED, qos.ok, qos.reason, qos.message),
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
        conditions: conditions::merge(
            previous,
            &node_conditions(&interfaces, node.spec.qos.lossy_soft_roce),
            generation,
            now,
        ),
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

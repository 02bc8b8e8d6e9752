//! A fabric's status: counts, conditions with reasons, and the Events its transitions deserve.
//!
//! Events are derived by comparing the status in the world with the new one, so an unchanged
//! world raises none. The `Degraded` condition carries every current problem in its message as
//! `Reason: detail` segments joined by `; `; its reason is the first problem's. A problem whose
//! reason was not in the previous message raises a Warning Event.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use rocefabric_api::conditions::{self, Desired};
use rocefabric_api::constants::{condition, reason};
use rocefabric_api::{NodeCounts, RegionCounts, RoceFabricStatus};

use super::rollout::RolloutCounts;
use super::selection::ParsedFabric;
use super::writes::{Event, EventType, Write};

/// Reason of a pod asking for a region size the fabric cannot serve.
pub const REGION_REQUEST_INVALID: &str = "RegionRequestInvalid";
/// Reason of a namespace whose region directory would exceed the size limit.
pub const REGION_DIRECTORY_TOO_LARGE: &str = "RegionDirectoryTooLarge";
/// Reason of pods waiting because their namespace holds `maxRegionsPerNamespace` regions.
pub const REGION_QUOTA_EXCEEDED: &str = "RegionQuotaExceeded";
/// Reason of running pods whose recorded windows the fabric cannot keep (overlap, or not of
/// this fabric's geometry): left as they are, never rewritten.
pub const REGION_CONFLICT: &str = "RegionConflict";
/// Reason of pods whose data plane could not back or pin its window (their containers' Last
/// State in `kubectl describe pod` says why and how to fix it).
pub const WINDOW_FAILED: &str = "WindowFailed";
/// Most names listed in a condition message.
const LISTED: usize = 10;
/// Most names in `status.conflictingNodes`.
pub const MAX_CONFLICTING_LISTED: usize = 100;

/// One thing wrong with a fabric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub reason: &'static str,
    pub detail: String,
}

/// What the status is computed from, for a valid fabric.
pub(crate) struct Facts {
    pub rollout: RolloutCounts,
    /// (node, owning fabric), by node name.
    pub conflicting: Vec<(String, String)>,
    pub regions: RegionCounts,
    pub exhausted: Vec<String>,
    pub bad_requests: Vec<(String, String)>,
    pub too_large: Vec<(String, usize, usize)>,
    /// Running pods whose windows were left unchanged although the fabric cannot place them.
    pub conflicts: Vec<(String, String)>,
    /// Pods waiting for their namespace's quota.
    pub over_quota: Vec<(String, String)>,
    /// Pods whose data plane could not back or pin its window, by `namespace/name` only: their
    /// own message stays on the pod (a tenant's text is never copied into the fabric's status).
    pub window_failed: Vec<String>,
}

/// List at most [`LISTED`] names, saying how many more there are.
pub(crate) fn list<S: AsRef<str>>(names: &[S]) -> String {
    let shown: Vec<&str> = names.iter().take(LISTED).map(AsRef::as_ref).collect();
    let mut out = shown.join(", ");
    if names.len() > LISTED {
        out.push_str(&format!(" (+{} more)", names.len() - LISTED));
    }
    out
}

/// `ns/pod: why` for each pod.
fn pods_with_reasons(pods: &[(String, String)]) -> Vec<String> {
    pods.iter().map(|(p, why)| format!("{p}: {why}")).collect()
}

fn plural(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The status of a valid fabric and its Events.
pub(crate) fn valid_status(
    fabric: &ParsedFabric<'_>,
    facts: &Facts,
    now: &Time,
) -> (Option<Write>, Vec<Event>) {
    let g = fabric.generation;
    let mut problems = rollout_problems(facts, g);
    problems.extend(region_problems(facts));
    if facts.rollout.selected == 0 {
        problems.push(Problem {
            reason: reason::NO_NODES_SELECTED,
            detail: if facts.conflicting.is_empty() {
                "no node matches spec.nodeSelector".into()
            } else {
                "every node spec.nodeSelector matches belongs to an older fabric".into()
            },
        });
    }
    let summary = format!(
        "{}/{} nodes configured for generation {g}: {} failed, {} in progress, {} waiting",
        facts.rollout.configured,
        facts.rollout.selected,
        facts.rollout.failed,
        facts.rollout.in_progress,
        facts.rollout.waiting
    );
    let ready = ready_condition(facts, g, &summary);
    let progressing = progressing_condition(facts, g, &summary);
    let status = RoceFabricStatus {
        observed_generation: Some(g),
        conditions: Vec::new(),
        nodes: NodeCounts {
            selected: facts.rollout.selected,
            configured: facts.rollout.configured,
            failed: facts.rollout.failed,
            conflicting: super::rollout::count(facts.conflicting.len()),
        },
        regions: facts.regions.clone(),
        traffic_class: Some(fabric.obj.spec.qos.traffic_class()),
        conflicting_nodes: facts
            .conflicting
            .iter()
            .take(MAX_CONFLICTING_LISTED)
            .map(|(n, _)| n.clone())
            .collect(),
    };
    finish(fabric, status, [ready, progressing], &problems, now)
}

/// What is wrong with the rollout of generation `g`: failed nodes, nodes another fabric owns.
fn rollout_problems(facts: &Facts, g: i64) -> Vec<Problem> {
    let mut problems = Vec::new();
    if facts.rollout.failed > 0 {
        let mut detail = format!(
            "{} failed generation {g}: {}",
            plural(facts.rollout.failed, "node", "nodes"),
            list(&facts.rollout.failed_names)
        );
        if facts.rollout.blocked {
            detail.push_str(&format!(
                " (rollout stopped: failures exceed the budget of {})",
                facts.rollout.budget
            ));
        }
        problems.push(Problem {
            reason: reason::NODES_FAILED,
            detail,
        });
    }
    if !facts.conflicting.is_empty() {
        let named: Vec<String> = facts
            .conflicting
            .iter()
            .map(|(n, f)| format!("{n} (owned by {f})"))
            .collect();
        problems.push(Problem {
            reason: reason::NODES_CONFLICTING,
            detail: format!(
                "{} selected by this fabric belong to an older fabric and are left alone: {}",
                plural(super::rollout::count(named.len()), "node", "nodes"),
                list(&named)
            ),
        });
    }
    problems
}

/// What is wrong with the regions: pods waiting for a slot, for their quota or with a request
/// the fabric cannot serve, windows it cannot keep, directories too large.
fn region_problems(facts: &Facts) -> Vec<Problem> {
    let mut problems = Vec::new();
    if !facts.exhausted.is_empty() {
        problems.push(Problem {
            reason: reason::REGIONS_EXHAUSTED,
            detail: format!(
                "{} wait for a region, {} of {} slots in use: {}",
                plural(super::rollout::count(facts.exhausted.len()), "pod", "pods"),
                facts.regions.allocated,
                facts.regions.capacity,
                list(&facts.exhausted)
            ),
        });
    }
    if !facts.bad_requests.is_empty() {
        let named = pods_with_reasons(&facts.bad_requests);
        problems.push(Problem {
            reason: REGION_REQUEST_INVALID,
            detail: list(&named),
        });
    }
    if !facts.over_quota.is_empty() {
        let named = pods_with_reasons(&facts.over_quota);
        problems.push(Problem {
            reason: REGION_QUOTA_EXCEEDED,
            detail: format!("pods wait for their namespace's quota: {}", list(&named)),
        });
    }
    if !facts.conflicts.is_empty() {
        let named = pods_with_reasons(&facts.conflicts);
        problems.push(Problem {
            reason: REGION_CONFLICT,
            detail: format!(
                "running pods keep windows the fabric cannot place (never rewritten): {}",
                list(&named)
            ),
        });
    }
    if !facts.window_failed.is_empty() {
        problems.push(Problem {
            reason: WINDOW_FAILED,
            detail: format!(
                "{} cannot back or pin {} window (kubectl describe pod: the container's Last \
                 State names the limit and the fix): {}",
                plural(
                    super::rollout::count(facts.window_failed.len()),
                    "pod",
                    "pods"
                ),
                if facts.window_failed.len() == 1 {
                    "its"
                } else {
                    "their"
                },
                list(&facts.window_failed)
            ),
        });
    }
    if !facts.too_large.is_empty() {
        let named: Vec<String> = facts
            .too_large
            .iter()
            .map(|(ns, n, bytes)| format!("namespace {ns} ({n} regions, {bytes} bytes)"))
            .collect();
        problems.push(Problem {
            reason: REGION_DIRECTORY_TOO_LARGE,
            detail: format!(
                "directory not updated, over {} bytes: {}",
                super::directory::MAX_DIRECTORY_BYTES,
                list(&named)
            ),
        });
    }
    problems
}

/// `Ready`: every selected node configured for generation `g` (`summary`: where the rollout
/// stands).
fn ready_condition(facts: &Facts, g: i64, summary: &str) -> Desired {
    if facts.rollout.selected == 0 {
        Desired::new(
            condition::READY,
            false,
            reason::NO_NODES_SELECTED,
            "no nodes selected",
        )
    } else if facts.rollout.configured == facts.rollout.selected {
        Desired::new(
            condition::READY,
            true,
            reason::ALL_NODES_CONFIGURED,
            format!(
                "all {} configured for generation {g}",
                plural(facts.rollout.selected, "node", "nodes")
            ),
        )
    } else if facts.rollout.blocked {
        Desired::new(
            condition::READY,
            false,
            reason::ROLLOUT_BLOCKED,
            summary.to_string(),
        )
    } else if facts.rollout.in_progress + facts.rollout.waiting == 0 {
        Desired::new(
            condition::READY,
            false,
            reason::NODES_FAILED,
            summary.to_string(),
        )
    } else {
        Desired::new(
            condition::READY,
            false,
            reason::ROLLOUT_IN_PROGRESS,
            summary.to_string(),
        )
    }
}

/// `Progressing`: the rollout of generation `g` goes on (`summary`: where it stands).
fn progressing_condition(facts: &Facts, g: i64, summary: &str) -> Desired {
    if facts.rollout.selected == 0 {
        Desired::new(
            condition::PROGRESSING,
            false,
            reason::NO_NODES_SELECTED,
            "no nodes selected",
        )
    } else if facts.rollout.blocked {
        Desired::new(
            condition::PROGRESSING,
            false,
            reason::ROLLOUT_BLOCKED,
            format!(
                "rollout of generation {g} stopped: {} failed, more than the budget of {}",
                plural(facts.rollout.failed, "node", "nodes"),
                facts.rollout.budget
            ),
        )
    } else if facts.rollout.in_progress + facts.rollout.waiting > 0 {
        Desired::new(
            condition::PROGRESSING,
            true,
            reason::ROLLOUT_IN_PROGRESS,
            format!(
                "rolling out generation {g}, at most {} at a time; {summary}",
                plural(facts.rollout.budget, "node", "nodes")
            ),
        )
    } else {
        Desired::new(
            condition::PROGRESSING,
            false,
            reason::ROLLOUT_COMPLETE,
            summary.to_string(),
        )
    }
}

/// The status of a fabric whose spec fails validation: nothing is written for its nodes.
pub(crate) fn invalid_status(fabric: &ParsedFabric<'_>, now: &Time) -> (Option<Write>, Vec<Event>) {
    let errors: Vec<String> = fabric.errors.iter().map(ToString::to_string).collect();
    let detail = format!("invalid spec, nothing is rolled out: {}", errors.join(", "));
    let old = fabric.obj.status.clone().unwrap_or_default();
    let status = RoceFabricStatus {
        observed_generation: Some(fabric.generation),
        conditions: Vec::new(),
        ..old
    };
    let ready = Desired::new(
        condition::READY,
        false,
        reason::INVALID_SPEC,
        detail.clone(),
    );
    let progressing = Desired::new(
        condition::PROGRESSING,
        false,
        reason::INVALID_SPEC,
        detail.clone(),
    );
    finish(
        fabric,
        status,
        [ready, progressing],
        &[Problem {
            reason: reason::INVALID_SPEC,
            detail,
        }],
        now,
    )
}

fn finish(
    fabric: &ParsedFabric<'_>,
    mut status: RoceFabricStatus,
    [ready, progressing]: [Desired; 2],
    problems: &[Problem],
    now: &Time,
) -> (Option<Write>, Vec<Event>) {
    let degraded = match problems.first() {
        Some(first) => Desired::new(
            condition::DEGRADED,
            true,
            first.reason,
            problems
                .iter()
                .map(|p| format!("{}: {}", p.reason, p.detail))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        None => Desired::new(
            condition::DEGRADED,
            false,
            reason::AS_EXPECTED,
            "no problems",
        ),
    };
    let empty = RoceFabricStatus::default();
    let old = fabric.obj.status.as_ref().unwrap_or(&empty);
    let g = Some(fabric.generation);
    status.conditions = conditions::merge(&old.conditions, &[ready, progressing, degraded], g, now);
    let events = transitions(fabric, &old.conditions, &status.conditions, problems);
    let unchanged = old.observed_generation == status.observed_generation
        && conditions::same_ignoring_time(&old.conditions, &status.conditions)
        && old.nodes == status.nodes
        && old.regions == status.regions
        && old.traffic_class == status.traffic_class
        && old.conflicting_nodes == status.conflicting_nodes;
    let write = (!unchanged).then(|| Write::ApplyFabricStatus {
        fabric: fabric.name.to_string(),
        status,
    });
    (write, events)
}

/// The problem reasons an old `Degraded` condition recorded.
fn old_problems(old: &[Condition]) -> Vec<&str> {
    match conditions::find(old, condition::DEGRADED) {
        Some(c) if c.status == "True" => c
            .message
            .split("; ")
            .filter_map(|seg| seg.split_once(": ").map(|(r, _)| r))
            .filter(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric()))
            .collect(),
        _ => Vec::new(),
    }
}

fn transitions(
    fabric: &ParsedFabric<'_>,
    old: &[Condition],
    new: &[Condition],
    problems: &[Problem],
) -> Vec<Event> {
    let regarding = ObjectReference {
        api_version: Some(rocefabric_api::constants::API_VERSION.into()),
        kind: Some("RoceFabric".into()),
        name: Some(fabric.name.to_string()),
        uid: (!fabric.uid.is_empty()).then(|| fabric.uid.to_string()),
        ..ObjectReference::default()
    };
    let event = |type_, reason: &str, message: String| Event {
        regarding: regarding.clone(),
        type_,
        reason: reason.to_string(),
        message,
    };
    let mut events = Vec::new();
    let before = old_problems(old);
    for p in problems {
        if !before.contains(&p.reason) {
            events.push(event(EventType::Warning, p.reason, p.detail.clone()));
        }
    }
    let was = |t: &str| conditions::find(old, t);
    let is = |t: &str| conditions::find(new, t);
    if problems.is_empty() && was(condition::DEGRADED).is_some_and(|c| c.status == "True") {
        events.push(event(
            EventType::Normal,
            reason::AS_EXPECTED,
            "no longer degraded".into(),
        ));
    }
    if let Some(r) = is(condition::READY)
        && r.status == "True"
        && was(condition::READY).is_none_or(|c| c.status != "True")
    {
        events.push(event(
            EventType::Normal,
            reason::ALL_NODES_CONFIGURED,
            r.message.clone(),
        ));
    }
    if let Some(p) = is(condition::PROGRESSING) {
        let before = was(condition::PROGRESSING);
        let changed = before
            .is_none_or(|b| b.reason != p.reason || b.observed_generation != p.observed_generation);
        if changed && p.reason == reason::ROLLOUT_IN_PROGRESS {
            events.push(event(
                EventType::Normal,
                reason::ROLLOUT_IN_PROGRESS,
                p.message.clone(),
            ));
        }
        if before.is_none_or(|b| b.reason != p.reason) && p.reason == reason::ROLLOUT_BLOCKED {
            events.push(event(
                EventType::Warning,
                reason::ROLLOUT_BLOCKED,
                p.message.clone(),
            ));
        }
    }
    events
}

//! Kubernetes-convention conditions: a pure merge that moves `lastTransitionTime` only when the
//! status changes, and stamps `observedGeneration`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition as computed, before it is merged into an object's list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Desired {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

fn status_str(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// Merge `desired` into `current`, returning the new list (sorted by type for stable output).
/// A condition whose status is unchanged keeps its `lastTransitionTime`; conditions of other
/// types are kept as they are.
pub fn merge(
    current: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = current
        .iter()
        .filter(|c| !desired.iter().any(|d| d.type_ == c.type_))
        .cloned()
        .collect();
    for d in desired {
        let previous = current.iter().find(|c| c.type_ == d.type_);
        let status = status_str(d.status);
        let last_transition_time = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => now.clone(),
        };
        out.push(Condition {
            type_: d.type_.to_string(),
            status: status.to_string(),
            reason: d.reason.to_string(),
            message: d.message.clone(),
            observed_generation: generation,
            last_transition_time,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// The condition of `type_` in `conditions`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `type_` is `True` (and, when `generation` is given, observed at that generation).
pub fn is_true(conditions: &[Condition], type_: &str, generation: Option<i64>) -> bool {
    find(conditions, type_).is_some_and(|c| {
        c.status == "True" && (generation.is_none() || c.observed_generation == generation)
    })
}

/// Same conditions, ignoring `lastTransitionTime`: what decides whether a status write is needed.
pub fn same_ignoring_time(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.type_ == y.type_
                && x.status == y.status
                && x.reason == y.reason
                && x.message == y.message
                && x.observed_generation == y.observed_generation
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("valid"))
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let first = merge(
            &[],
            &[Desired::new("Ready", false, "RolloutInProgress", "1/3")],
            Some(1),
            &t(10),
        );
        assert_eq!(first[0].last_transition_time, t(10));
        let same = merge(
            &first,
            &[Desired::new("Ready", false, "RolloutInProgress", "2/3")],
            Some(1),
            &t(20),
        );
        assert_eq!(
            same[0].last_transition_time,
            t(10),
            "status unchanged keeps the time"
        );
        assert_eq!(same[0].message, "2/3");
        let flipped = merge(
            &same,
            &[Desired::new("Ready", true, "AllNodesConfigured", "3/3")],
            Some(2),
            &t(30),
        );
        assert_eq!(flipped[0].last_transition_time, t(30));
        assert_eq!(flipped[0].observed_generation, Some(2));
        assert!(is_true(&flipped, "Ready", Some(2)));
        assert!(!is_true(&flipped, "Ready", Some(3)));
    }

    #[test]
    fn other_types_are_kept_and_output_is_sorted() {
        let a = merge(&[], &[Desired::new("Ready", true, "X", "")], None, &t(1));
        let b = merge(
            &a,
            &[Desired::new("Degraded", false, "AsExpected", "")],
            None,
            &t(2),
        );
        let types: Vec<_> = b.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Degraded", "Ready"]);
        assert!(same_ignoring_time(
            &b,
            &merge(&b, &[Desired::new("Ready", true, "X", "")], None, &t(9))
        ));
    }
}

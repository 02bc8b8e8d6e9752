//! Windows of pods that never run. A pod past its gate but not bound to a node (another gate of
//! its own, an impossible nodeSelector) holds its window for at most its fabric's
//! `sharedMemory.reclaimUnboundAfterSeconds`; then the window is taken back and the pod gets no
//! other.
//!
//! The count starts when this operator first sees the pod so, and lives in its memory like the
//! cooling windows: a restart starts it again (a pod has no field that says when its gate went,
//! and one it could write would not do). It is taken back only as the pod was seen: the write
//! carries its `uid` and `resourceVersion`, so a pod bound meanwhile keeps its window.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rocefabric_api::RoceFabric;
use rocefabric_api::constants::reason;

use super::super::pod::{PodRef, is_live};
use super::super::writes::{Event, EventType, Write};
use super::{Incremental, PodKey};
use crate::objects::CompactPod;

impl Incremental {
    /// The windows to take back at `now` from pods not bound to a node in time, and how long
    /// until the next is due. Apart from [`Incremental::plan`], which stays the reference
    /// planner's equal: the count is this planner's memory, as a long-running operator keeps it.
    pub fn reclaims(&mut self, now: Timestamp) -> (Vec<Write>, Option<Duration>) {
        let pods = &self.pods;
        self.unbound.due(now, |k| pods.get(k), &self.fabrics)
    }

    /// Pods holding a window past their gate, unbound (timed for reclaim).
    pub fn unbound_pods(&self) -> usize {
        self.unbound.len()
    }
}

/// The pods holding a window unbound, and since when this operator has seen them so (`None`:
/// not yet planned since).
#[derive(Debug, Default)]
pub(crate) struct Unbound {
    since: BTreeMap<PodKey, Option<Timestamp>>,
}

/// The fabric a pod's recorded window is of, when the pod holds one past its gate, unbound.
fn unbound_window(pod: &CompactPod) -> Option<String> {
    let p = PodRef::new(pod);
    let recorded = match &p.annotation {
        Some(Ok(a))
            if a.uid
                .as_deref()
                .is_none_or(|u| Some(u) == pod.uid.as_deref()) =>
        {
            a
        }
        _ => return None,
    };
    (!p.gated() && pod.node_name.is_none() && is_live(pod) && !pod.deleting)
        .then(|| recorded.fabric.to_string())
}

impl Unbound {
    /// The pod `key` as it is now (`None`: gone or no longer held).
    pub fn observe(&mut self, key: &PodKey, pod: Option<&CompactPod>) {
        if pod.and_then(unbound_window).is_some() {
            self.since.entry(key.clone()).or_insert(None);
        } else {
            self.since.remove(key);
        }
    }

    /// All pods as relisted: the pods still unbound keep their count, the others are dropped.
    pub fn relisted<'p>(&mut self, pods: impl Iterator<Item = &'p CompactPod>) {
        let mut old = std::mem::take(&mut self.since);
        for pod in pods.filter(|p| unbound_window(p).is_some()) {
            let key = (pod.namespace.to_string(), pod.name.clone());
            let since = old.remove(&key).flatten();
            self.since.insert(key, since);
        }
    }

    /// At `now`: the reclaims due (each write records its Event once done) and how long until
    /// the next one. `pod` looks a held pod up; `fabrics` give each window's time limit.
    pub fn due<'p>(
        &mut self,
        now: Timestamp,
        pod: impl Fn(&PodKey) -> Option<&'p CompactPod>,
        fabrics: &[RoceFabric],
    ) -> (Vec<Write>, Option<Duration>) {
        let mut writes = Vec::new();
        let mut next: Option<Duration> = None;
        for (key, since) in &mut self.since {
            let since = *since.get_or_insert(now);
            let Some(p) = pod(key) else { continue };
            let Some(limit) = unbound_window(p).and_then(|f| limit_of(fabrics, &f)) else {
                continue;
            };
            let deadline = since
                .checked_add(SignedDuration::try_from(limit).unwrap_or(SignedDuration::MAX))
                .unwrap_or(Timestamp::MAX);
            if deadline <= now {
                writes.push(reclaim(p, limit));
            } else {
                let left = Duration::try_from(deadline.duration_since(now)).unwrap_or_default();
                next = Some(next.map_or(left, |n| n.min(left)));
            }
        }
        (writes, next)
    }

    /// Pods counted now.
    pub fn len(&self) -> usize {
        self.since.len()
    }
}

/// `reclaimUnboundAfterSeconds` of fabric `name`, when it has shared memory and is not being
/// deleted.
fn limit_of(fabrics: &[RoceFabric], name: &str) -> Option<Duration> {
    let f = fabrics
        .iter()
        .find(|f| f.metadata.name.as_deref() == Some(name))?;
    if f.metadata.deletion_timestamp.is_some() {
        return None;
    }
    f.spec
        .shared_memory
        .as_ref()
        .map(|sm| sm.reclaim_unbound_after())
}

/// The write that takes back `pod`'s window after `limit`.
fn reclaim(pod: &CompactPod, limit: Duration) -> Write {
    let p = PodRef::new(pod);
    let message = format!(
        "not bound to a node {}s after its window was assigned (sharedMemory.\
         reclaimUnboundAfterSeconds): the window was reclaimed and this pod gets no other; \
         delete it and create it again to ask anew",
        limit.as_secs()
    );
    Write::ReclaimPodRegion {
        namespace: pod.namespace.to_string(),
        pod: pod.name.clone(),
        uid: pod.uid.clone(),
        resource_version: pod.resource_version.clone(),
        event: Event {
            regarding: p.reference(),
            type_: EventType::Warning,
            reason: reason::REGION_RECLAIMED.to_string(),
            message,
        },
    }
}

//! A pod as the planner reads it: its names, age and gates, the region its annotation records
//! and what that claims in a fabric, the size it asks for; and which pods hold (or may get) a
//! region at all.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::constants::REGION_SCHEDULING_GATE;
use serde::Deserialize;

use crate::objects::CompactPod;
use crate::regions::{self, Geometry, Slots};

/// A pod's `rocefabric.io/region` annotation, borrowed from the pod (the fields of
/// [`RegionAssignment`](rocefabric_formats::region::RegionAssignment)).
#[derive(Debug, Deserialize)]
pub(crate) struct Recorded<'a> {
    #[serde(borrow)]
    pub fabric: Cow<'a, str>,
    pub id: u32,
    pub base: u64,
    pub size: u64,
    /// The pod it was written for (absent in annotations of earlier versions).
    #[serde(default, borrow)]
    pub uid: Option<Cow<'a, str>>,
}

impl<'a> Recorded<'a> {
    fn parse(value: &'a str) -> Result<Self, String> {
        serde_json::from_str(value).map_err(|e| {
            regions::RegionError::BadAnnotation {
                value: value.to_string(),
                reason: e.to_string(),
            }
            .to_string()
        })
    }
}

/// A live pod routed to a fabric.
pub(crate) struct PodRef<'w> {
    pub pod: &'w CompactPod,
    pub namespace: &'w str,
    pub name: &'w str,
    pub created: Option<Timestamp>,
    /// The parsed `rocefabric.io/region` annotation, when present (or why it cannot be read).
    pub annotation: Option<Result<Recorded<'w>, String>>,
}

impl<'w> PodRef<'w> {
    pub fn new(pod: &'w CompactPod) -> Self {
        Self {
            pod,
            namespace: &pod.namespace,
            name: &pod.name,
            created: pod.created,
            annotation: pod.region.as_deref().map(Recorded::parse),
        }
    }

    pub(crate) fn gates(&self) -> &'w [String] {
        &self.pod.gates
    }

    pub(crate) fn gated(&self) -> bool {
        self.gates().iter().any(|g| g == REGION_SCHEDULING_GATE)
    }

    /// Gated by us and by someone else too (a job queue's admission, say): it could not use a
    /// window yet, so it gets none until ours is its last gate.
    pub(crate) fn behind_other_gates(&self) -> bool {
        self.gated() && self.gates().iter().any(|g| g != REGION_SCHEDULING_GATE)
    }

    /// The pod as the object an Event is about.
    pub(crate) fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(self.name.to_string()),
            namespace: Some(self.namespace.to_string()),
            uid: self.pod.uid.clone(),
            ..ObjectReference::default()
        }
    }

    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Past its gate or bound to a node: its containers may have read the window, so a window it
    /// records is never changed while it exists.
    pub(crate) fn started(&self) -> bool {
        !self.gated() || self.pod.node_name.is_some()
    }
}

/// Whether a pod holds (or may get) a region: not finished. A pod being deleted still runs
/// until its termination grace period ends (a training job may checkpoint into its window on
/// SIGTERM), so it keeps a region it holds until it has terminated or is gone; it gets no new one.
pub(crate) fn is_live(pod: &CompactPod) -> bool {
    let terminated = matches!(pod.phase.as_deref(), Some("Succeeded" | "Failed"));
    !terminated && (!pod.deleting || pod.region.is_some())
}

/// What a pod's annotation claims in a fabric.
pub(crate) enum Claim {
    None,
    Existing(Slots),
    /// An annotation that cannot stand: why.
    Bad(String),
}

/// What a pod's annotation claims in `fabric`.
pub(crate) fn claim_of(p: &PodRef<'_>, fabric: &str, geometry: Geometry) -> Claim {
    match &p.annotation {
        None => Claim::None,
        Some(Ok(a))
            if a.uid
                .as_deref()
                .is_some_and(|u| Some(u) != p.pod.uid.as_deref()) =>
        {
            Claim::Bad(format!(
                "it was written for another pod (uid {}): a copied annotation is never honoured",
                a.uid.as_deref().unwrap_or_default()
            ))
        }
        Some(Ok(a)) if a.fabric == fabric => match geometry.window_slots(a.id, a.base, a.size) {
            Ok(s) => Claim::Existing(s),
            Err(e) => Claim::Bad(e.to_string()),
        },
        Some(Ok(a)) => Claim::Bad(format!("it records a region of fabric {:?}", a.fabric)),
        Some(Err(e)) => Claim::Bad(e.clone()),
    }
}

/// The slots a pod needs should it get a new window (its size annotation within the per-pod
/// cap), or why it cannot be served.
pub(crate) fn request_len(
    p: &PodRef<'_>,
    geometry: Geometry,
    per_pod: Option<u32>,
) -> Result<u32, regions::RegionError> {
    let size_request = p.pod.region_size.as_deref();
    geometry
        .slots_for_annotation(size_request)
        .and_then(|len| match per_pod {
            Some(cap) if len > cap => Err(regions::RegionError::PodCap { slots: len, cap }),
            _ => Ok(len),
        })
}

/// The message of a pod over its namespace's quota.
pub(crate) fn over_quota_message(len: u32, namespace: &str, held: u64, cap: u32) -> String {
    format!(
        "needs {} region{}; namespace {} holds {held} of its limit {cap} (sharedMemory.maxRegionsPerNamespace, by default a quarter of maxRegions)",
        len,
        if len == 1 { "" } else { "s" },
        namespace
    )
}

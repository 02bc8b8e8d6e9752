//! Per fabric: rebuild the region map from the pods' annotations, cool down freed windows,
//! assign windows to new pods, and render the namespaces' directories.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rocefabric_api::constants::{REGION_SCHEDULING_GATE, REGION_SIZE_ANNOTATION, reason};
use rocefabric_formats::directory::{self, EntryRef};
use rocefabric_formats::names::DIRECTORY_KEY;
use rocefabric_formats::region::RegionAssignment;

use super::directory::MAX_DIRECTORY_BYTES;
use super::pod::PodRef;
use super::report::{RegionChange, RegionReport, WaitingPod};
use super::selection::ParsedFabric;
use super::writes::{Event, EventType, Write};
use crate::regions::{self, Cooling, Geometry, Ledger, Outcome, Request, Slots};

/// What the region planning of one fabric produced.
#[derive(Default)]
pub(crate) struct RegionsOutcome {
    /// Per pod, its writes (annotation, then gate), keyed for ordering by namespace/name.
    pub pod_writes: Vec<((String, String), Vec<Write>)>,
    pub directory_writes: Vec<Write>,
    pub events: Vec<Event>,
    pub ledger: Ledger,
    pub live_slots: u32,
    pub region_count: u32,
    pub cooling_slots: u32,
    /// Pods waiting because the space is full, `namespace/name`.
    pub exhausted: Vec<String>,
    /// Pods whose size request cannot be served: `namespace/name`, why.
    pub bad_requests: Vec<(String, String)>,
    /// Namespaces whose directory is too large: namespace, regions, bytes.
    pub too_large: Vec<(String, usize, usize)>,
    /// Started pods whose recorded window cannot be kept, left unchanged: `namespace/name`, why.
    pub conflicts: Vec<(String, String)>,
    /// Pods waiting because their namespace's quota is used: `namespace/name`, why.
    pub over_quota: Vec<(String, String)>,
    pub regions: Vec<RegionReport>,
    pub waiting: Vec<WaitingPod>,
}

pub(crate) enum Claim {
    None,
    Existing(Slots),
    /// An annotation that cannot stand: why.
    Bad(String),
}

/// Plan the regions of an active fabric with shared memory.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_regions(
    fabric: &ParsedFabric<'_>,
    geometry: Geometry,
    mut pods: Vec<PodRef<'_>>,
    directories: &BTreeMap<&str, &ConfigMap>,
    old: Option<&Ledger>,
    now: Timestamp,
    grace: Duration,
    hold_until: Option<Timestamp>,
    detailed: bool,
) -> RegionsOutcome {
    let mut out = RegionsOutcome::default();
    pods.sort_by(|a, b| {
        (a.created.is_none(), a.created, a.namespace, a.name).cmp(&(
            b.created.is_none(),
            b.created,
            b.namespace,
            b.name,
        ))
    });

    // The recorded claims and the size each pod needs should it get a new window.
    let (per_pod, per_namespace) = fabric
        .pods
        .as_ref()
        .map_or((None, None), |s| (s.per_pod, s.per_namespace));
    let mut claims = Vec::with_capacity(pods.len());
    let mut wanted: Vec<Option<Request>> = Vec::with_capacity(pods.len());
    let mut held: Vec<String> = Vec::new();
    for p in &pods {
        let claim = claim_of(p, fabric.name, geometry);
        let len = request_len(p, geometry, per_pod);
        let request = match (&claim, len) {
            (Claim::Existing(s), len) => Some(Request {
                existing: Some(*s),
                len: len.unwrap_or(s.len),
                pinned: p.started(),
            }),
            // A started pod whose window cannot be placed gets no other: see `reserved` below.
            (Claim::Bad(_), _) if p.started() => None,
            // Right after a takeover no new window is handed out (one the previous leader freed
            // may still be cooling): the pod waits without taking room from anyone.
            (_, Ok(_)) if hold_until.is_some() => {
                held.push(p.key());
                None
            }
            (_, Ok(len)) => Some(Request {
                existing: None,
                len,
                pinned: false,
            }),
            (_, Err(e)) => {
                out.bad_requests.push((p.key(), e.to_string()));
                None
            }
        };
        wanted.push(request);
        claims.push(claim);
    }
    // A namespace's quota: windows its pods hold count first, then new ones oldest first.
    if let Some(cap) = per_namespace {
        let mut used: HashMap<&str, u64> = HashMap::new();
        for (p, w) in pods.iter().zip(&wanted) {
            if let Some(Request {
                existing: Some(s), ..
            }) = w
            {
                *used.entry(p.namespace).or_default() += u64::from(s.len);
            }
        }
        for (p, w) in pods.iter().zip(wanted.iter_mut()) {
            let Some(r) = w.as_ref().filter(|r| r.existing.is_none()) else {
                continue;
            };
            let held = used.entry(p.namespace).or_default();
            if *held + u64::from(r.len) > u64::from(cap) {
                out.over_quota
                    .push((p.key(), over_quota_message(r.len, p.namespace, *held, cap)));
                *w = None;
            } else {
                *held += u64::from(r.len);
            }
        }
    }
    let mut requests = Vec::with_capacity(wanted.len());
    let request_of: Vec<Option<usize>> = wanted
        .into_iter()
        .map(|w| {
            w.map(|r| {
                requests.push(r);
                requests.len() - 1
            })
        })
        .collect();

    // Windows live at the last plan (memory, or the directories after a restart) that their
    // pod no longer claims start their grace period now.
    let until = now
        .checked_add(SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX);
    let mut cooling: Vec<Cooling> = old.map(|l| l.cooling.clone()).unwrap_or_default();
    cooling.retain(|c| c.until > now);
    let claimed: HashMap<(&str, &str), Slots> = pods
        .iter()
        .zip(&claims)
        .filter_map(|(p, c)| match c {
            Claim::Existing(s) => Some(((p.namespace, p.name), *s)),
            _ => None,
        })
        .collect();
    let freed = |slots: Slots, cooling: &mut Vec<Cooling>| match cooling
        .iter_mut()
        .find(|c| c.slots == slots)
    {
        Some(c) => c.until = c.until.max(until),
        None => cooling.push(Cooling { slots, until }),
    };
    if let Some(l) = old {
        for (key, slots) in &l.live {
            let (ns, pod) = key.split_once('/').unwrap_or((key, ""));
            if claimed.get(&(ns, pod)) != Some(slots) {
                freed(*slots, &mut cooling);
            }
        }
    }
    // Without memory (a restart), the directories tell which windows were live.
    for (ns, cm) in directories.iter().filter(|_| old.is_none()) {
        let listed = cm
            .data
            .as_ref()
            .and_then(|d| d.get(DIRECTORY_KEY))
            .and_then(|t| directory::parse(t).ok());
        for e in listed.into_iter().flatten() {
            let a = RegionAssignment {
                fabric: fabric.name.to_string(),
                id: e.id,
                base: e.base,
                size: e.size,
                uid: None,
            };
            let Ok(slots) = geometry.slots_of(&a) else {
                continue;
            };
            if claimed.get(&(*ns, e.pod.as_str())) != Some(&slots) {
                freed(slots, &mut cooling);
            }
        }
    }
    cooling.sort_by_key(|c| c.slots);
    let cooling_slots: Vec<Slots> = cooling.iter().map(|c| c.slots).collect();

    // A started pod's window that does not fit this geometry (another fabric's space of the same
    // name before a re-creation, a copied or hand-written annotation) is still in use: the
    // regions it covers are reserved, and cool down when it goes.
    let mut reserved = Vec::new();
    for (p, c) in pods.iter().zip(&claims) {
        if let (Claim::Bad(_), true, Some(Ok(a))) = (c, p.started(), &p.annotation)
            && a.fabric == fabric.name
            && let Some(s) = geometry.covering(a.base, a.size)
        {
            reserved.push(s);
            out.ledger.live.insert(p.key(), s);
        }
    }
    let allocation =
        regions::allocate_with_reserved(geometry, &requests, &reserved, &cooling_slots);
    out.live_slots = allocation.live_slots;

    // Who holds which kept window, to name the older owner in reassignment Events (built only
    // when some pod lost its window).
    let kept_by: BTreeMap<u32, (Slots, usize)> = if allocation.outcomes.iter().any(|o| {
        matches!(
            o,
            Outcome::Reassigned { .. } | Outcome::Waiting { lost: Some(_) }
        )
    }) {
        request_of
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match allocation.outcomes[(*r)?] {
                Outcome::Kept(s) => Some((s.first, (s, i))),
                _ => None,
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    let holder = |lost: Slots| -> Option<String> {
        kept_by
            .range(..lost.first.saturating_add(lost.len))
            .rev()
            .find(|(_, (s, _))| s.overlaps(lost))
            .map(|(_, (_, i))| pods[*i].key())
    };

    let mut by_namespace: BTreeMap<&str, Vec<EntryRef<'_>>> = BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        let Some(r) = request_of[i] else {
            if let (Claim::Bad(why), true) = (&claims[i], p.started()) {
                out.conflicts.push((
                    p.key(),
                    format!("its recorded window cannot be placed: {why}"),
                ));
            } else if detailed {
                let why = out
                    .bad_requests
                    .iter()
                    .chain(&out.over_quota)
                    .find(|(k, _)| *k == p.key())
                    .map(|(_, w)| w.clone())
                    .or_else(|| {
                        held.contains(&p.key()).then(|| {
                            format!(
                                "the operator took over recently: new windows wait until {}",
                                hold_until.unwrap_or(now)
                            )
                        })
                    });
                out.waiting
                    .push(waiting(p, fabric.name, why.unwrap_or_default()));
            }
            continue;
        };
        let outcome = allocation.outcomes[r];
        if p.started() && !matches!(claims[i], Claim::None) && !matches!(outcome, Outcome::Kept(_))
        {
            let why = match (&claims[i], outcome) {
                (Claim::Bad(why), _) => format!("its recorded window cannot be placed: {why}"),
                (_, Outcome::Reassigned { lost, .. } | Outcome::Waiting { lost: Some(lost) }) => {
                    let by = holder(lost)
                        .map(|h| format!(" held by older pod {h}"))
                        .unwrap_or_default();
                    format!("its region {} overlaps a window{by}", lost.first)
                }
                _ => "its recorded window cannot be kept".to_string(),
            };
            if let Claim::Existing(s) = claims[i] {
                // It still uses the window: cool it when the pod goes.
                out.ledger.live.insert(p.key(), s);
            }
            out.conflicts.push((p.key(), why));
            continue;
        }
        let (slots, change) = match (outcome, &claims[i]) {
            (Outcome::Kept(s), _) => (s, RegionChange::Kept),
            (Outcome::Assigned(s), Claim::None | Claim::Existing(_)) => (s, RegionChange::Assigned),
            (Outcome::Assigned(s), Claim::Bad(why)) => {
                out.events.push(reassigned_event(p, format!(
                    "recorded region is not valid ({why}); reassigned to region {} of fabric {}",
                    s.first, fabric.name
                )));
                (s, RegionChange::Reassigned)
            }
            (Outcome::Reassigned { lost, new }, _) => {
                let by = holder(lost)
                    .map(|h| format!(" held by older pod {h}"))
                    .unwrap_or_default();
                out.events.push(reassigned_event(
                    p,
                    format!(
                        "region {} of fabric {} overlaps a window{by}; reassigned to region {}",
                        lost.first, fabric.name, new.first
                    ),
                ));
                (new, RegionChange::Reassigned)
            }
            (Outcome::Waiting { .. }, _) => {
                out.exhausted.push(p.key());
                if detailed {
                    out.waiting.push(waiting(
                        p,
                        fabric.name,
                        format!(
                            "no room: {} free slots of {} are not enough or not contiguous",
                            geometry.max_regions.saturating_sub(allocation.live_slots),
                            geometry.max_regions
                        ),
                    ));
                }
                continue;
            }
        };
        let assignment = geometry.assignment(fabric.name, slots);
        let writes = pod_writes(p, &assignment, change == RegionChange::Kept);
        if !writes.is_empty() {
            out.pod_writes
                .push(((p.namespace.to_string(), p.name.to_string()), writes));
        }
        out.region_count += 1;
        out.ledger.live.insert(p.key(), slots);
        by_namespace
            .entry(p.namespace)
            .or_default()
            .push(entry_ref(p, &assignment));
        if detailed {
            out.regions.push(RegionReport {
                namespace: p.namespace.to_string(),
                pod: p.name.to_string(),
                fabric: fabric.name.to_string(),
                id: assignment.id,
                base: assignment.base,
                size: assignment.size,
                node: p.pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                change,
            });
        }
    }

    // Cooling windows still count until they expire; drop the ones a live region now covers.
    if !cooling.is_empty() {
        let live: std::collections::HashSet<Slots> = out.ledger.live.values().copied().collect();
        cooling.retain(|c| !live.contains(&c.slots));
    }
    out.cooling_slots = cooling.iter().map(|c| c.slots.len).sum();
    out.ledger.cooling = cooling;

    let used_namespaces: std::collections::HashSet<String> =
        by_namespace.keys().map(|ns| ns.to_string()).collect();
    for (ns, mut entries) in by_namespace {
        entries.sort_by_key(|e| e.id);
        let text = directory::render_refs(&entries);
        if text.len() > MAX_DIRECTORY_BYTES {
            out.too_large
                .push((ns.to_string(), entries.len(), text.len()));
            continue;
        }
        let up_to_date = directory_up_to_date(directories.get(ns).copied(), &text, fabric.uid);
        if !up_to_date {
            out.directory_writes.push(Write::ApplyRegionDirectory {
                namespace: ns.to_string(),
                fabric: fabric.name.to_string(),
                fabric_uid: fabric.uid.to_string(),
                data: BTreeMap::from([(DIRECTORY_KEY.to_string(), text)]),
            });
        }
    }
    for ns in directories.keys() {
        if !used_namespaces.contains(*ns) {
            out.directory_writes.push(Write::DeleteRegionDirectory {
                namespace: ns.to_string(),
                fabric: fabric.name.to_string(),
            });
        }
    }
    out.directory_writes
        .sort_by(|a, b| directory_key(a).cmp(directory_key(b)));
    out
}

/// What a pod's annotation claims in `fabric`.
pub(crate) fn claim_of(p: &PodRef<'_>, fabric: &str, geometry: Geometry) -> Claim {
    match &p.annotation {
        None => Claim::None,
        Some(Ok(a))
            if a.uid
                .as_deref()
                .is_some_and(|u| Some(u) != p.pod.metadata.uid.as_deref()) =>
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
    let size_request = p
        .pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REGION_SIZE_ANNOTATION))
        .map(String::as_str);
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
        "needs {} region{}; namespace {} holds {held} of sharedMemory.maxRegionsPerNamespace {cap}",
        len,
        if len == 1 { "" } else { "s" },
        namespace
    )
}

/// A pod's writes once it holds `assignment`: the annotation unless it already records it,
/// then the gate removal while it is gated.
pub(crate) fn pod_writes(
    p: &PodRef<'_>,
    assignment: &RegionAssignment,
    recorded: bool,
) -> Vec<Write> {
    let mut writes = Vec::new();
    if !recorded {
        writes.push(Write::AnnotatePodRegion {
            namespace: p.namespace.to_string(),
            pod: p.name.to_string(),
            value: assignment.to_annotation_of(p.pod.metadata.uid.as_deref()),
            uid: p.pod.metadata.uid.clone(),
            resource_version: p.pod.metadata.resource_version.clone(),
        });
    }
    if p.gated() {
        writes.push(Write::RemovePodGate {
            namespace: p.namespace.to_string(),
            pod: p.name.to_string(),
            remaining_gates: p
                .gates()
                .iter()
                .filter(|g| g.name != REGION_SCHEDULING_GATE)
                .map(|g| g.name.clone())
                .collect(),
        });
    }
    writes
}

/// A pod's line in its namespace's directory.
pub(crate) fn entry_ref<'w>(p: &PodRef<'w>, assignment: &RegionAssignment) -> EntryRef<'w> {
    EntryRef {
        pod: p.name,
        node: p.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        pod_ip: p.pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        id: assignment.id,
        base: assignment.base,
        size: assignment.size,
        uid: p.pod.metadata.uid.as_deref(),
    }
}

/// Whether `cm` already holds exactly `text`, owned by the fabric of `fabric_uid`.
pub(crate) fn directory_up_to_date(cm: Option<&ConfigMap>, text: &str, fabric_uid: &str) -> bool {
    cm.is_some_and(|cm| {
        cm.data
            .as_ref()
            .is_some_and(|d| d.len() == 1 && d.get(DIRECTORY_KEY).map(String::as_str) == Some(text))
            && cm
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.uid == fabric_uid))
    })
}

fn directory_key(w: &Write) -> &str {
    match w {
        Write::ApplyRegionDirectory { namespace, .. }
        | Write::DeleteRegionDirectory { namespace, .. } => namespace,
        _ => "",
    }
}

fn waiting(p: &PodRef<'_>, fabric: &str, reason: String) -> WaitingPod {
    WaitingPod {
        namespace: p.namespace.to_string(),
        pod: p.name.to_string(),
        fabric: fabric.to_string(),
        reason,
    }
}

/// A gated pod that no fabric selects: it would stay Pending without a word.
pub(crate) fn unmatched_event(p: &PodRef<'_>) -> Event {
    Event {
        regarding: p.reference(),
        type_: EventType::Warning,
        reason: reason::NO_FABRIC_SELECTS_POD.to_string(),
        message: format!(
            "the pod has the {REGION_SCHEDULING_GATE} scheduling gate but no RoceFabric's \
             sharedMemory.podSelector selects it (an empty podSelector selects pods labelled \
             {FABRIC}: <fabric>); it stays Pending until one does",
            FABRIC = rocefabric_api::constants::FABRIC_LABEL
        ),
    }
}

fn reassigned_event(p: &PodRef<'_>, message: String) -> Event {
    Event {
        regarding: p.reference(),
        type_: EventType::Warning,
        reason: reason::REGION_REASSIGNED.to_string(),
        message,
    }
}

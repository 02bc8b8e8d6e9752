//! Per fabric: rebuild the region map from the pods' annotations, cool down freed windows,
//! assign windows to new pods, and render the namespaces' directories.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rocefabric_api::constants::{REGION_SCHEDULING_GATE, reason};
use rocefabric_formats::directory::{self, EntryRef};
use rocefabric_formats::names::DIRECTORY_KEY;
use rocefabric_formats::region::RegionAssignment;

use super::directory::MAX_DIRECTORY_BYTES;
use super::pod::{Claim, PodRef, claim_of, over_quota_message, request_len};
use super::report::{RegionChange, RegionReport, WaitingPod};
use super::selection::ParsedFabric;
use super::writes::{Event, EventType, Write};
use crate::regions::{self, Allocation, Cooling, Geometry, Ledger, Outcome, Request, Slots};

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
    /// Pods whose data plane could not back or pin its window: `namespace/name`.
    pub window_failed: Vec<String>,
    pub regions: Vec<RegionReport>,
    pub waiting: Vec<WaitingPod>,
}

/// What the region planning of one fabric reads.
pub(crate) struct RegionInputs<'a, 'w> {
    pub fabric: &'a ParsedFabric<'w>,
    pub geometry: Geometry,
    /// The live pods routed to the fabric.
    pub pods: Vec<PodRef<'w>>,
    /// The fabric's region directories, by namespace.
    pub directories: &'a BTreeMap<&'w str, &'w ConfigMap>,
    /// The fabric's windows at the last plan (none after a restart).
    pub old: Option<&'a Ledger>,
    pub now: Timestamp,
    /// How long a freed window cools down before it is handed out again.
    pub grace: Duration,
    /// Until then no new window is handed out (right after a takeover).
    pub hold_until: Option<Timestamp>,
    /// Fill the report's rows of regions and waiting pods.
    pub detailed: bool,
}

/// Plan the regions of an active fabric with shared memory, in steps: what each pod asks for,
/// the namespaces' quotas, the windows cooling down, the windows reserved, the allocation, each
/// pod's outcome and writes, and the namespaces' directories.
pub(crate) fn plan_regions(input: RegionInputs<'_, '_>) -> RegionsOutcome {
    let mut plan = RegionPlan::new(input);
    let per_namespace = plan.fabric.pods.as_ref().and_then(|s| s.per_namespace);
    let mut wanted = plan.wanted();
    if let Some(cap) = per_namespace {
        plan.apply_quota(&mut wanted, cap);
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
    let mut cooling = plan.cooling();
    let cooling_slots: Vec<Slots> = cooling.iter().map(|c| c.slots).collect();
    let reserved = plan.reserve_unplaceable();
    let allocation =
        regions::allocate_with_reserved(plan.geometry, &requests, &reserved, &cooling_slots);
    plan.out.live_slots = allocation.live_slots;
    let holders = Holders::of(&allocation, &request_of);
    let mut by_namespace: BTreeMap<&str, Vec<EntryRef<'_>>> = BTreeMap::new();
    for (i, r) in request_of.iter().enumerate() {
        let outcome = r.map(|r| allocation.outcomes[r]);
        plan.settle(i, outcome, &holders, &mut by_namespace);
    }

    // Cooling windows still count until they expire; drop the ones a live region now covers.
    if !cooling.is_empty() {
        let live: HashSet<Slots> = plan.out.ledger.live.values().copied().collect();
        cooling.retain(|c| !live.contains(&c.slots));
    }
    plan.out.cooling_slots = cooling.iter().map(|c| c.slots.len).sum();
    plan.out.ledger.cooling = cooling;
    plan.directories(by_namespace);
    plan.out
}

/// One fabric's region planning under way: its inputs (pods oldest first), what each pod's
/// annotation claims, and the outcome so far.
struct RegionPlan<'a, 'w> {
    fabric: &'a ParsedFabric<'w>,
    geometry: Geometry,
    pods: Vec<PodRef<'w>>,
    directories: &'a BTreeMap<&'w str, &'w ConfigMap>,
    old: Option<&'a Ledger>,
    now: Timestamp,
    grace: Duration,
    hold_until: Option<Timestamp>,
    detailed: bool,
    /// Per pod: what its annotation claims.
    claims: Vec<Claim>,
    /// Pods that would get a new window but wait for the takeover hold, `namespace/name`.
    held: Vec<String>,
    out: RegionsOutcome,
}

/// Who holds which kept window, to name the older owner in reassignment Events (built only when
/// some pod lost its window): by first slot, the window and the pod's index.
struct Holders(BTreeMap<u32, (Slots, usize)>);

impl Holders {
    fn of(allocation: &Allocation, request_of: &[Option<usize>]) -> Self {
        let lost_any = allocation.outcomes.iter().any(|o| {
            matches!(
                o,
                Outcome::Reassigned { .. } | Outcome::Waiting { lost: Some(_) }
            )
        });
        if !lost_any {
            return Self(BTreeMap::new());
        }
        Self(
            request_of
                .iter()
                .enumerate()
                .filter_map(|(i, r)| match allocation.outcomes[(*r)?] {
                    Outcome::Kept(s) => Some((s.first, (s, i))),
                    _ => None,
                })
                .collect(),
        )
    }

    /// ` held by older pod ns/name` for the pod holding part of `lost`, or nothing.
    fn of_window(&self, lost: Slots, pods: &[PodRef<'_>]) -> String {
        self.0
            .range(..lost.first.saturating_add(lost.len))
            .rev()
            .find(|(_, (s, _))| s.overlaps(lost))
            .map(|(_, (_, i))| format!(" held by older pod {}", pods[*i].key()))
            .unwrap_or_default()
    }
}

impl<'a, 'w> RegionPlan<'a, 'w> {
    /// The pods oldest first (creation time, then namespace and name; unknown times last),
    /// with what their annotations claim.
    fn new(input: RegionInputs<'a, 'w>) -> Self {
        let RegionInputs {
            fabric,
            geometry,
            mut pods,
            directories,
            old,
            now,
            grace,
            hold_until,
            detailed,
        } = input;
        pods.sort_by(|a, b| {
            (a.created.is_none(), a.created, a.namespace, a.name).cmp(&(
                b.created.is_none(),
                b.created,
                b.namespace,
                b.name,
            ))
        });
        let claims = pods
            .iter()
            .map(|p| claim_of(p, fabric.name, geometry))
            .collect();
        Self {
            fabric,
            geometry,
            pods,
            directories,
            old,
            now,
            grace,
            hold_until,
            detailed,
            claims,
            held: Vec::new(),
            out: RegionsOutcome::default(),
        }
    }

    /// What each pod asks the allocator for: its recorded window (with the size it needs should
    /// it lose it), a new window, or nothing (a started pod whose window cannot be placed, a
    /// pod held back after a takeover, a size request that cannot be served).
    fn wanted(&mut self) -> Vec<Option<Request>> {
        let per_pod = self.fabric.pods.as_ref().and_then(|s| s.per_pod);
        let mut wanted = Vec::with_capacity(self.pods.len());
        for (p, claim) in self.pods.iter().zip(&self.claims) {
            if p.pod.window_failed {
                self.out.window_failed.push(p.key());
            }
            let len = request_len(p, self.geometry, per_pod);
            let request = match (claim, len) {
                (Claim::Existing(s), len) => Some(Request {
                    existing: Some(*s),
                    len: len.unwrap_or(s.len),
                    pinned: p.started(),
                }),
                // A started pod whose window cannot be placed gets no other: see
                // `reserve_unplaceable`.
                (Claim::Bad(_), _) if p.started() => None,
                // Its window was taken back (it was not bound in time): it gets no other.
                (Claim::None, _) if p.pod.region_reclaimed => None,
                // Held by another gate too: no window (no space held) until ours is the last.
                (Claim::None | Claim::Bad(_), _) if p.behind_other_gates() => None,
                // Right after a takeover no new window is handed out (one the previous leader
                // freed may still be cooling): the pod waits without taking room from anyone.
                (_, Ok(_)) if self.hold_until.is_some() => {
                    self.held.push(p.key());
                    None
                }
                (_, Ok(len)) => Some(Request {
                    existing: None,
                    len,
                    pinned: false,
                }),
                (_, Err(e)) => {
                    self.out.bad_requests.push((p.key(), e.to_string()));
                    None
                }
            };
            wanted.push(request);
        }
        wanted
    }

    /// A namespace's quota of `cap` slots: windows its pods hold count first, then new ones
    /// oldest first; a pod past the quota asks for nothing.
    fn apply_quota(&mut self, wanted: &mut [Option<Request>], cap: u32) {
        let mut used: HashMap<&str, u64> = HashMap::new();
        for (p, w) in self.pods.iter().zip(wanted.iter()) {
            if let Some(Request {
                existing: Some(s), ..
            }) = w
            {
                *used.entry(p.namespace).or_default() += u64::from(s.len);
            }
        }
        for (p, w) in self.pods.iter().zip(wanted.iter_mut()) {
            let Some(r) = w.as_ref().filter(|r| r.existing.is_none()) else {
                continue;
            };
            let held = used.entry(p.namespace).or_default();
            if *held + u64::from(r.len) > u64::from(cap) {
                self.out
                    .over_quota
                    .push((p.key(), over_quota_message(r.len, p.namespace, *held, cap)));
                *w = None;
            } else {
                *held += u64::from(r.len);
            }
        }
    }

    /// The windows cooling down, by first slot: those still cooling from before, and those live
    /// at the last plan (memory, or the directories after a restart) that their pod no longer
    /// claims, which start their grace period now.
    fn cooling(&self) -> Vec<Cooling> {
        let until = self
            .now
            .checked_add(SignedDuration::try_from(self.grace).unwrap_or(SignedDuration::MAX))
            .unwrap_or(Timestamp::MAX);
        let mut cooling: Vec<Cooling> = self.old.map(|l| l.cooling.clone()).unwrap_or_default();
        cooling.retain(|c| c.until > self.now);
        let claimed: HashMap<(&str, &str), Slots> = self
            .pods
            .iter()
            .zip(&self.claims)
            .filter_map(|(p, c)| match c {
                Claim::Existing(s) => Some(((p.namespace, p.name), *s)),
                _ => None,
            })
            .collect();
        let mut freed = |slots: Slots| match cooling.iter_mut().find(|c| c.slots == slots) {
            Some(c) => c.until = c.until.max(until),
            None => cooling.push(Cooling { slots, until }),
        };
        if let Some(l) = self.old {
            for (key, slots) in &l.live {
                let (ns, pod) = key.split_once('/').unwrap_or((key, ""));
                if claimed.get(&(ns, pod)) != Some(slots) {
                    freed(*slots);
                }
            }
        }
        // Without memory (a restart), the directories tell which windows were live.
        for (ns, cm) in self.directories.iter().filter(|_| self.old.is_none()) {
            let listed = cm
                .data
                .as_ref()
                .and_then(|d| d.get(DIRECTORY_KEY))
                .and_then(|t| directory::parse(t).ok());
            for e in listed.into_iter().flatten() {
                let a = RegionAssignment {
                    fabric: self.fabric.name.to_string(),
                    id: e.id,
                    base: e.base,
                    size: e.size,
                    uid: None,
                };
                let Ok(slots) = self.geometry.slots_of(&a) else {
                    continue;
                };
                if claimed.get(&(*ns, e.pod.as_str())) != Some(&slots) {
                    freed(slots);
                }
            }
        }
        cooling.sort_by_key(|c| c.slots);
        cooling
    }

    /// A started pod's window that does not fit this geometry (another fabric's space of the
    /// same name before a re-creation, a copied or hand-written annotation) is still in use:
    /// the regions it covers are reserved, and cool down when it goes.
    fn reserve_unplaceable(&mut self) -> Vec<Slots> {
        let mut reserved = Vec::new();
        for (p, c) in self.pods.iter().zip(&self.claims) {
            if let (Claim::Bad(_), true, Some(Ok(a))) = (c, p.started(), &p.annotation)
                && a.fabric == self.fabric.name
                && let Some(s) = self.geometry.covering(a.base, a.size)
            {
                reserved.push(s);
                self.out.ledger.live.insert(p.key(), s);
            }
        }
        reserved
    }

    /// Pod `i`'s outcome (`None`: it asked for nothing): its writes, its window in the ledger
    /// and its namespace's directory, or why it waits or keeps a window the fabric cannot place.
    fn settle(
        &mut self,
        i: usize,
        outcome: Option<Outcome>,
        holders: &Holders,
        by_namespace: &mut BTreeMap<&'w str, Vec<EntryRef<'w>>>,
    ) {
        let Some(outcome) = outcome else {
            self.asked_nothing(i);
            return;
        };
        let p = &self.pods[i];
        if p.started()
            && !matches!(self.claims[i], Claim::None)
            && !matches!(outcome, Outcome::Kept(_))
        {
            let why = match (&self.claims[i], outcome) {
                (Claim::Bad(why), _) => format!("its recorded window cannot be placed: {why}"),
                (_, Outcome::Reassigned { lost, .. } | Outcome::Waiting { lost: Some(lost) }) => {
                    let by = holders.of_window(lost, &self.pods);
                    format!("its region {} overlaps a window{by}", lost.first)
                }
                _ => "its recorded window cannot be kept".to_string(),
            };
            if let Claim::Existing(s) = self.claims[i] {
                // It still uses the window: cool it when the pod goes.
                self.out.ledger.live.insert(p.key(), s);
            }
            self.out.conflicts.push((p.key(), why));
            return;
        }
        if let Some((slots, change)) = self.placed(i, outcome, holders) {
            self.record(i, slots, change, by_namespace);
        }
    }

    /// A pod that asked for nothing: a started pod keeping a window the fabric cannot place is a
    /// conflict; any other waits (the report says why).
    fn asked_nothing(&mut self, i: usize) {
        let p = &self.pods[i];
        if let (Claim::Bad(why), true) = (&self.claims[i], p.started()) {
            self.out.conflicts.push((
                p.key(),
                format!("its recorded window cannot be placed: {why}"),
            ));
        } else if self.detailed {
            let why = self
                .out
                .bad_requests
                .iter()
                .chain(&self.out.over_quota)
                .find(|(k, _)| *k == p.key())
                .map(|(_, w)| w.clone())
                .or_else(|| {
                    p.behind_other_gates().then(|| {
                        let others: Vec<&str> = p
                            .gates()
                            .iter()
                            .map(String::as_str)
                            .filter(|g| *g != REGION_SCHEDULING_GATE)
                            .collect();
                        format!(
                            "waits for its other scheduling gates ({}) to be removed first",
                            others.join(", ")
                        )
                    })
                })
                .or_else(|| {
                    p.pod.region_reclaimed.then(|| {
                        format!(
                            "its window was reclaimed (see its {} annotation): it gets no other",
                            rocefabric_api::constants::REGION_RECLAIMED_ANNOTATION
                        )
                    })
                })
                .or_else(|| {
                    self.held.contains(&p.key()).then(|| {
                        format!(
                            "the operator took over recently: new windows wait until {}",
                            self.hold_until.unwrap_or(self.now)
                        )
                    })
                });
            self.out
                .waiting
                .push(waiting(p, self.fabric.name, why.unwrap_or_default()));
        }
    }

    /// The window pod `i` holds after `outcome`, and how it changed (a reassignment raises an
    /// Event); `None` when it waits for room.
    fn placed(
        &mut self,
        i: usize,
        outcome: Outcome,
        holders: &Holders,
    ) -> Option<(Slots, RegionChange)> {
        let p = &self.pods[i];
        let fabric = self.fabric.name;
        Some(match (outcome, &self.claims[i]) {
            (Outcome::Kept(s), _) => (s, RegionChange::Kept),
            (Outcome::Assigned(s), Claim::None | Claim::Existing(_)) => (s, RegionChange::Assigned),
            (Outcome::Assigned(s), Claim::Bad(why)) => {
                self.out.events.push(reassigned_event(p, format!(
                    "recorded region is not valid ({why}); reassigned to region {} of fabric {fabric}",
                    s.first
                )));
                (s, RegionChange::Reassigned)
            }
            (Outcome::Reassigned { lost, new }, _) => {
                let by = holders.of_window(lost, &self.pods);
                self.out.events.push(reassigned_event(
                    p,
                    format!(
                        "region {} of fabric {fabric} overlaps a window{by}; reassigned to region {}",
                        lost.first, new.first
                    ),
                ));
                (new, RegionChange::Reassigned)
            }
            (Outcome::Waiting { .. }, _) => {
                self.out.exhausted.push(p.key());
                if self.detailed {
                    let max = self.geometry.max_regions;
                    self.out.waiting.push(waiting(
                        p,
                        fabric,
                        format!(
                            "no room: {} free slots of {max} are not enough or not contiguous",
                            max.saturating_sub(self.out.live_slots),
                        ),
                    ));
                }
                return None;
            }
        })
    }

    /// Pod `i` holds `slots`: its writes, the ledger, its namespace's directory, the report.
    fn record(
        &mut self,
        i: usize,
        slots: Slots,
        change: RegionChange,
        by_namespace: &mut BTreeMap<&'w str, Vec<EntryRef<'w>>>,
    ) {
        let p = &self.pods[i];
        let assignment = self.geometry.assignment(self.fabric.name, slots);
        let writes = pod_writes(p, &assignment, change == RegionChange::Kept);
        if !writes.is_empty() {
            self.out
                .pod_writes
                .push(((p.namespace.to_string(), p.name.to_string()), writes));
        }
        self.out.region_count += 1;
        self.out.ledger.live.insert(p.key(), slots);
        by_namespace
            .entry(p.namespace)
            .or_default()
            .push(entry_ref(p, &assignment));
        if self.detailed {
            self.out.regions.push(RegionReport {
                namespace: p.namespace.to_string(),
                pod: p.name.to_string(),
                fabric: self.fabric.name.to_string(),
                id: assignment.id,
                base: assignment.base,
                size: assignment.size,
                node: p.pod.node_name.clone(),
                change,
            });
        }
    }

    /// The namespaces' directories: rendered for each namespace with regions (unless too
    /// large) and written when they differ; deleted in namespaces with none left.
    fn directories(&mut self, by_namespace: BTreeMap<&'w str, Vec<EntryRef<'w>>>) {
        let fabric = self.fabric;
        let used_namespaces: HashSet<String> =
            by_namespace.keys().map(|ns| ns.to_string()).collect();
        for (ns, mut entries) in by_namespace {
            entries.sort_by_key(|e| e.id);
            let text = directory::render_refs(&entries);
            if text.len() > MAX_DIRECTORY_BYTES {
                self.out
                    .too_large
                    .push((ns.to_string(), entries.len(), text.len()));
                continue;
            }
            let current = self.directories.get(ns).copied();
            if !directory_up_to_date(current, &text, fabric.uid) {
                self.out.directory_writes.push(Write::ApplyRegionDirectory {
                    namespace: ns.to_string(),
                    fabric: fabric.name.to_string(),
                    fabric_uid: fabric.uid.to_string(),
                    data: BTreeMap::from([(DIRECTORY_KEY.to_string(), text)]),
                });
            }
        }
        for ns in self.directories.keys() {
            if !used_namespaces.contains(*ns) {
                self.out
                    .directory_writes
                    .push(Write::DeleteRegionDirectory {
                        namespace: ns.to_string(),
                        fabric: fabric.name.to_string(),
                    });
            }
        }
        self.out
            .directory_writes
            .sort_by(|a, b| directory_key(a).cmp(directory_key(b)));
    }
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
            value: assignment.to_annotation_of(p.pod.uid.as_deref()),
            uid: p.pod.uid.clone(),
            resource_version: p.pod.resource_version.clone(),
        });
    }
    if p.gated() {
        writes.push(Write::RemovePodGate {
            namespace: p.namespace.to_string(),
            pod: p.name.to_string(),
            remaining_gates: p
                .gates()
                .iter()
                .filter(|g| *g != REGION_SCHEDULING_GATE)
                .cloned()
                .collect(),
        });
    }
    writes
}

/// A pod's line in its namespace's directory.
pub(crate) fn entry_ref<'w>(p: &PodRef<'w>, assignment: &RegionAssignment) -> EntryRef<'w> {
    EntryRef {
        pod: p.name,
        node: p.pod.node_name.as_deref(),
        pod_ip: p.pod.pod_ip.as_deref(),
        id: assignment.id,
        base: assignment.base,
        size: assignment.size,
        uid: p.pod.uid.as_deref(),
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
             sharedMemory.podSelector selects it in its namespace (an empty podSelector selects \
             pods labelled {FABRIC}: <fabric>; a fabric with sharedMemory.namespaces serves \
             only those); it stays Pending until one does",
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

//! One fabric's regions, kept between passes: the slot map after allocation, each pod's window,
//! the namespaces' directories and the writes they imply.
//!
//! A change is handled here only when its outcome is certainly the full pass's (see each method);
//! otherwise it answers [`Step::Full`] before touching anything, and the planner runs a full pass.
//! A fabric whose last full pass found conflicts or reassignments is not indexed: every plan is
//! a full pass while they last (conflicting windows cool down anew at each pass).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rocefabric_formats::directory::{self, DirectoryEntry, EntryRef};
use rocefabric_formats::names::DIRECTORY_KEY;

use super::super::RegionFindings;
use super::super::directory::MAX_DIRECTORY_BYTES;
use super::super::pod::{self, Claim, PodRef};
use super::super::pods;
use super::super::writes::{Write, region_directory_name};
use super::keyed::Keyed;
use crate::objects::CompactPod;
use crate::regions::{Cooling, Geometry, Ledger, SlotMap, Slots};

/// `(namespace, name)`.
pub(crate) type PodKey = (String, String);
/// The order of region planning: creation time (unknown last), namespace, name.
type SortKey = (bool, Option<Timestamp>, String, String);

/// Whether a fast path covered a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Step {
    Done,
    /// Not certainly the full pass's outcome: plan in full (nothing was changed here).
    Full,
}

/// Where a pod stands in its fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Its annotation records this window, kept.
    Kept(Slots),
    /// A new window (its annotation is not written, or not seen yet).
    Assigned(Slots),
    /// It asked for this many slots and found no room.
    Exhausted(u32),
    /// Its size request cannot be served.
    Bad,
    /// Its namespace's quota is used.
    OverQuota,
    /// Its window was reclaimed: it asks for nothing.
    Reclaimed,
    /// Held by another gate too: it asks for nothing yet.
    Behind,
}

struct PodEntry {
    sort: SortKey,
    held: Held,
    annotation: Option<String>,
    size: Option<String>,
    uid: Option<String>,
}

pub(crate) struct Regions {
    pub fabric: String,
    uid: String,
    geometry: Geometry,
    per_pod: Option<u32>,
    per_namespace: Option<u32>,
    /// Fast paths apply; otherwise every plan is a full pass.
    pub simple: bool,
    pods: HashMap<PodKey, PodEntry>,
    /// Pods whose request goes through the new-window phase (assigned, or waiting for room).
    phase3: BTreeSet<SortKey>,
    assigned: BTreeSet<PodKey>,
    map: SlotMap,
    quota: HashMap<String, u64>,
    exhausted: BTreeMap<SortKey, String>,
    bad: BTreeMap<SortKey, (String, String)>,
    over_quota: BTreeMap<SortKey, (String, String)>,
    /// Pods whose data plane could not back or pin its window.
    window_failed: BTreeMap<SortKey, String>,
    /// `namespace/pod` -> window, now.
    live: HashMap<String, Slots>,
    cooling: Vec<Cooling>,
    /// Pods that got their window since the last plan.
    uncommitted: HashSet<String>,
    /// Windows of the last plan whose pod went since: they cool down at the next plan.
    gone: Vec<(String, Slots)>,
    live_slots: u32,
    region_count: u32,
    cooling_slots: u32,
    pod_writes: BTreeMap<PodKey, Vec<Write>>,
    dirs: BTreeMap<String, BTreeMap<u32, DirectoryEntry>>,
    dir_writes: BTreeMap<String, Write>,
    too_large: BTreeMap<String, (usize, usize)>,
}

/// What [`Regions::build`] starts from: one fabric's part of a full pass.
pub(crate) struct FullPass<'a> {
    pub fabric: &'a str,
    pub uid: &'a str,
    pub geometry: Geometry,
    pub per_pod: Option<u32>,
    pub per_namespace: Option<u32>,
    pub pods: Vec<&'a CompactPod>,
    pub ledger: Ledger,
    pub findings: RegionFindings,
    pub pod_writes: BTreeMap<PodKey, Vec<Write>>,
    pub dir_writes: BTreeMap<String, Write>,
    /// Report figures of the pass.
    pub live_slots: u32,
    pub region_count: u32,
    pub cooling_slots: u32,
}

fn sort_key(p: &PodRef<'_>) -> SortKey {
    (
        p.created.is_none(),
        p.created,
        p.namespace.to_string(),
        p.name.to_string(),
    )
}

fn pod_key(p: &PodRef<'_>) -> PodKey {
    (p.namespace.to_string(), p.name.to_string())
}

impl Regions {
    /// Index one fabric after a full pass.
    pub fn build(pass: FullPass<'_>) -> Self {
        let mut r = Regions {
            fabric: pass.fabric.to_string(),
            uid: pass.uid.to_string(),
            geometry: pass.geometry,
            per_pod: pass.per_pod,
            per_namespace: pass.per_namespace,
            simple: pass.findings.conflicts.is_empty() && pass.findings.events == 0,
            pods: HashMap::new(),
            phase3: BTreeSet::new(),
            assigned: BTreeSet::new(),
            map: SlotMap::new(pass.geometry.max_regions),
            quota: HashMap::new(),
            exhausted: BTreeMap::new(),
            bad: BTreeMap::new(),
            over_quota: BTreeMap::new(),
            window_failed: BTreeMap::new(),
            live: pass.ledger.live,
            cooling: pass.ledger.cooling,
            uncommitted: HashSet::new(),
            gone: Vec::new(),
            live_slots: pass.live_slots,
            region_count: pass.region_count,
            cooling_slots: pass.cooling_slots,
            pod_writes: pass.pod_writes,
            dirs: BTreeMap::new(),
            dir_writes: pass.dir_writes,
            too_large: BTreeMap::new(),
        };
        if r.simple {
            r.simple = r.index(&pass.pods, &pass.findings);
        }
        if !r.simple {
            r.pods.clear();
            r.phase3.clear();
            r.assigned.clear();
            r.dirs.clear();
            r.window_failed.clear();
        }
        r
    }

    /// Fill the per-pod index from a full pass; false when the fabric is not simple after all.
    fn index(&mut self, routed: &[&CompactPod], findings: &RegionFindings) -> bool {
        let exhausted: HashSet<&str> = findings.exhausted.iter().map(String::as_str).collect();
        let bad: HashMap<&str, &str> = findings
            .bad_requests
            .iter()
            .map(|(k, w)| (k.as_str(), w.as_str()))
            .collect();
        let over: HashMap<&str, &str> = findings
            .over_quota
            .iter()
            .map(|(k, w)| (k.as_str(), w.as_str()))
            .collect();
        for pod in routed {
            let p = PodRef::new(pod);
            let key = p.key();
            let sort = sort_key(&p);
            self.note_window(pod, &sort);
            let claim = pod::claim_of(&p, &self.fabric, self.geometry);
            let held = match (self.live.get(&key), &claim) {
                (Some(&s), Claim::Existing(c)) if *c == s => Held::Kept(s),
                (Some(&s), Claim::None) => Held::Assigned(s),
                (Some(_), _) => return false,
                // A pod waiting with a recorded window may get it back in the claim phase.
                (None, Claim::Existing(_) | Claim::Bad(_)) => return false,
                (None, _) if exhausted.contains(key.as_str()) => {
                    match pod::request_len(&p, self.geometry, self.per_pod) {
                        Ok(len) => Held::Exhausted(len),
                        Err(_) => return false,
                    }
                }
                (None, Claim::None) if pod.region_reclaimed => Held::Reclaimed,
                (None, Claim::None) if p.behind_other_gates() => Held::Behind,
                (None, _) if bad.contains_key(key.as_str()) => Held::Bad,
                (None, _) if over.contains_key(key.as_str()) => Held::OverQuota,
                (None, _) => return false,
            };
            match held {
                Held::Kept(s) | Held::Assigned(s) => {
                    *self.quota.entry(p.namespace.to_string()).or_default() += u64::from(s.len);
                    if self.map.is_free(s) {
                        self.map.mark(s);
                    } else {
                        return false;
                    }
                    let a = self.geometry.assignment(&self.fabric, s);
                    self.dirs
                        .entry(p.namespace.to_string())
                        .or_default()
                        .insert(s.first, owned_entry(&pods::entry_ref(&p, &a)));
                    if matches!(held, Held::Assigned(_)) {
                        self.phase3.insert(sort.clone());
                        self.assigned.insert(pod_key(&p));
                    }
                }
                Held::Exhausted(len) => {
                    *self.quota.entry(p.namespace.to_string()).or_default() += u64::from(len);
                    self.phase3.insert(sort.clone());
                    self.exhausted.insert(sort.clone(), key.clone());
                }
                Held::Bad => {
                    let why = bad[key.as_str()].to_string();
                    self.bad.insert(sort.clone(), (key.clone(), why));
                }
                Held::OverQuota => {
                    let why = over[key.as_str()].to_string();
                    self.over_quota.insert(sort.clone(), (key.clone(), why));
                }
                Held::Reclaimed | Held::Behind => {}
            }
            self.pods.insert(
                pod_key(&p),
                PodEntry {
                    sort,
                    held,
                    annotation: pod.region.clone(),
                    size: pod.region_size.clone(),
                    uid: pod.uid.clone(),
                },
            );
        }
        // Cooling windows never overlap live ones here (a claim over a cooling window is kept
        // as recorded, which the fast paths do not model).
        if self.cooling.iter().any(|c| !self.map.is_free(c.slots)) {
            return false;
        }
        for c in self.cooling.clone() {
            self.map.mark(c.slots);
        }
        for (ns, (n, bytes)) in findings
            .too_large
            .iter()
            .map(|(ns, n, b)| (ns.clone(), (*n, *b)))
        {
            self.too_large.insert(ns, (n, bytes));
        }
        true
    }

    /// A new pod routed here. Covered when it has no annotation and sorts after every pod
    /// waiting for a new window or over its namespace's quota: then the full pass would hand it the first fit of the map as
    /// it stands, after everyone else.
    pub fn add(&mut self, pod: &CompactPod, configs: &Keyed<PodKey, ConfigMap>) -> Step {
        let p = PodRef::new(pod);
        let key = pod_key(&p);
        if !self.simple || p.annotation.is_some() || self.pods.contains_key(&key) {
            return Step::Full;
        }
        let sort = sort_key(&p);
        if self.phase3.last().is_some_and(|last| *last > sort) {
            return Step::Full;
        }
        // A pod over the quota later in the order counts this one's request in its message.
        if self.per_namespace.is_some()
            && self
                .over_quota
                .last_key_value()
                .is_some_and(|(last, _)| *last > sort)
        {
            return Step::Full;
        }
        let k = p.key();
        self.note_window(pod, &sort);
        let held = match pod::request_len(&p, self.geometry, self.per_pod) {
            _ if pod.region_reclaimed => Held::Reclaimed,
            _ if p.behind_other_gates() => Held::Behind,
            Err(e) => {
                self.bad.insert(sort.clone(), (k.clone(), e.to_string()));
                Held::Bad
            }
            Ok(len) => self.take(&p, &sort, len, configs),
        };
        self.pods.insert(
            key,
            PodEntry {
                sort,
                held,
                annotation: None,
                size: pod.region_size.clone(),
                uid: pod.uid.clone(),
            },
        );
        Step::Done
    }

    /// Whether the pod's data plane is down for its window, as the full pass lists it.
    fn note_window(&mut self, pod: &CompactPod, sort: &SortKey) {
        if pod.window_failed {
            let p = PodRef::new(pod);
            self.window_failed.insert(sort.clone(), p.key());
        } else {
            self.window_failed.remove(sort);
        }
    }

    /// The new-window phase for one pod at the end of the order: quota, then first fit.
    fn take(
        &mut self,
        p: &PodRef<'_>,
        sort: &SortKey,
        len: u32,
        configs: &Keyed<PodKey, ConfigMap>,
    ) -> Held {
        let k = p.key();
        if let Some(cap) = self.per_namespace {
            let used = self.quota.entry(p.namespace.to_string()).or_default();
            if *used + u64::from(len) > u64::from(cap) {
                let why = pod::over_quota_message(len, p.namespace, *used, cap);
                self.over_quota.insert(sort.clone(), (k, why));
                return Held::OverQuota;
            }
            *used += u64::from(len);
        } else {
            *self.quota.entry(p.namespace.to_string()).or_default() += u64::from(len);
        }
        self.phase3.insert(sort.clone());
        let Some(s) = self.map.allocate(len) else {
            self.exhausted.insert(sort.clone(), k);
            return Held::Exhausted(len);
        };
        self.assigned.insert(pod_key(p));
        self.uncommitted.insert(k.clone());
        self.live.insert(k, s);
        self.live_slots += s.len;
        self.region_count += 1;
        self.show(p, s, false, configs);
        Held::Assigned(s)
    }

    /// Set the pod's writes and directory line for window `s`.
    fn show(
        &mut self,
        p: &PodRef<'_>,
        s: Slots,
        recorded: bool,
        configs: &Keyed<PodKey, ConfigMap>,
    ) {
        let a = self.geometry.assignment(&self.fabric, s);
        let writes = pods::pod_writes(p, &a, recorded);
        if writes.is_empty() {
            self.pod_writes.remove(&pod_key(p));
        } else {
            self.pod_writes.insert(pod_key(p), writes);
        }
        self.dirs
            .entry(p.namespace.to_string())
            .or_default()
            .insert(s.first, owned_entry(&pods::entry_ref(p, &a)));
        self.refresh_directory(p.namespace, configs);
    }

    /// A pod of this fabric changed and stays here. Covered when nothing its request is made of
    /// changed (order, size request, uid, recorded window), or when the annotation now records
    /// exactly the window it was assigned (our write, seen).
    pub fn update(&mut self, pod: &CompactPod, configs: &Keyed<PodKey, ConfigMap>) -> Step {
        let p = PodRef::new(pod);
        let key = pod_key(&p);
        if !self.simple {
            return Step::Full;
        }
        let Some(entry) = self.pods.get(&key) else {
            return Step::Full;
        };
        let annotation = pod.region.clone();
        if entry.sort != sort_key(&p)
            || entry.size != pod.region_size.clone()
            || entry.uid != pod.uid
        {
            return Step::Full;
        }
        // Its other gates went: it asks for a window now, which the full pass places.
        if entry.held == Held::Behind && !p.behind_other_gates() {
            return Step::Full;
        }
        let held = entry.held;
        let sort = entry.sort.clone();
        if entry.annotation == annotation {
            self.note_window(pod, &sort);
            match held {
                Held::Kept(s) => self.show(&p, s, true, configs),
                Held::Assigned(s) => self.show(&p, s, false, configs),
                Held::Exhausted(_)
                | Held::Bad
                | Held::OverQuota
                | Held::Reclaimed
                | Held::Behind => {}
            }
            return Step::Done;
        }
        // Seen as recorded, the window counts first in the namespace's quota: the messages of
        // pods over the quota may change.
        let quota_messages = self.per_namespace.is_some() && !self.over_quota.is_empty();
        match (held, pod::claim_of(&p, &self.fabric, self.geometry)) {
            (Held::Assigned(s), Claim::Existing(c)) if c == s && !quota_messages => {
                let sort = entry.sort.clone();
                self.phase3.remove(&sort);
                self.assigned.remove(&key);
                if let Some(e) = self.pods.get_mut(&key) {
                    e.held = Held::Kept(s);
                    e.annotation = annotation;
                }
                self.note_window(pod, &sort);
                self.show(&p, s, true, configs);
                Step::Done
            }
            _ => Step::Full,
        }
    }

    /// A pod left this fabric (deleted, finished, or routed elsewhere).
    pub fn remove(&mut self, key: &PodKey, configs: &Keyed<PodKey, ConfigMap>) -> Step {
        if !self.simple {
            return Step::Full;
        }
        let Some(entry) = self.pods.get(key) else {
            return Step::Full;
        };
        let k = format!("{}/{}", key.0, key.1);
        let later_request = self
            .phase3
            .range((
                std::ops::Bound::Excluded(entry.sort.clone()),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .is_some();
        let gives_quota = matches!(
            entry.held,
            Held::Kept(_) | Held::Assigned(_) | Held::Exhausted(_)
        );
        if gives_quota && self.per_namespace.is_some() && !self.over_quota.is_empty() {
            return Step::Full; // a pod over the quota may fit now
        }
        let held = entry.held;
        let sort = entry.sort.clone();
        self.window_failed.remove(&sort);
        match held {
            Held::Kept(s) | Held::Assigned(s) => {
                let committed = !self.uncommitted.contains(&k);
                if !committed && later_request {
                    return Step::Full; // its window, free again, may go to a later pod
                }
                if committed {
                    self.gone.push((k.clone(), s));
                } else {
                    self.map.free(s);
                }
                self.phase3.remove(&sort);
                self.assigned.remove(key);
                self.uncommitted.remove(&k);
                self.live.remove(&k);
                self.live_slots -= s.len;
                self.region_count -= 1;
                self.unquota(&key.0, s.len);
                self.pod_writes.remove(key);
                if let Some(dir) = self.dirs.get_mut(&key.0) {
                    dir.remove(&s.first);
                }
                self.refresh_directory(&key.0, configs);
            }
            Held::Exhausted(len) => {
                self.phase3.remove(&sort);
                self.exhausted.remove(&sort);
                self.unquota(&key.0, len);
            }
            Held::Bad => {
                self.bad.remove(&sort);
            }
            Held::OverQuota => {
                self.over_quota.remove(&sort);
            }
            Held::Reclaimed | Held::Behind => {}
        }
        self.pods.remove(key);
        Step::Done
    }

    fn unquota(&mut self, namespace: &str, len: u32) {
        if let Some(used) = self.quota.get_mut(namespace) {
            *used = used.saturating_sub(u64::from(len));
            if *used == 0 {
                self.quota.remove(namespace);
            }
        }
    }

    /// Re-render one namespace's directory and compare it with the ConfigMap there.
    pub fn refresh_directory(&mut self, namespace: &str, configs: &Keyed<PodKey, ConfigMap>) {
        let cm = configs.get(&(namespace.to_string(), region_directory_name(&self.fabric)));
        let entries = self.dirs.get(namespace).filter(|d| !d.is_empty());
        let Some(entries) = entries else {
            self.dirs.remove(namespace);
            self.too_large.remove(namespace);
            if cm.is_some() {
                self.dir_writes.insert(
                    namespace.to_string(),
                    Write::DeleteRegionDirectory {
                        namespace: namespace.to_string(),
                        fabric: self.fabric.clone(),
                    },
                );
            } else {
                self.dir_writes.remove(namespace);
            }
            return;
        };
        let refs: Vec<EntryRef<'_>> = entries.values().map(EntryRef::from).collect();
        let text = directory::render_refs(&refs);
        if text.len() > MAX_DIRECTORY_BYTES {
            self.too_large
                .insert(namespace.to_string(), (refs.len(), text.len()));
            self.dir_writes.remove(namespace);
            return;
        }
        self.too_large.remove(namespace);
        if pods::directory_up_to_date(cm, &text, &self.uid) {
            self.dir_writes.remove(namespace);
        } else {
            self.dir_writes.insert(
                namespace.to_string(),
                Write::ApplyRegionDirectory {
                    namespace: namespace.to_string(),
                    fabric: self.fabric.clone(),
                    fabric_uid: self.uid.clone(),
                    data: BTreeMap::from([(DIRECTORY_KEY.to_string(), text)]),
                },
            );
        }
    }

    /// Whether the plan at `now` can be read off this index: no window assigned at an earlier
    /// plan still lacks its annotation (the full pass would move it), and no cooling window
    /// expires while pods wait for new windows (they could take it).
    pub fn can_commit(&self, now: Timestamp) -> bool {
        if !self.simple {
            // Conflicts and reserved windows cool down again at every pass: plan in full
            // while they last.
            return false;
        }
        let stale_assignment = self
            .assigned
            .iter()
            .any(|(ns, name)| !self.uncommitted.contains(&format!("{ns}/{name}")));
        let expiring = self.cooling.iter().any(|c| c.until <= now);
        !stale_assignment && (!expiring || self.phase3.is_empty())
    }

    /// Plan at `now` (after [`Self::can_commit`]): windows whose pod went start cooling,
    /// expired ones are free again, and this plan's windows become the memory.
    pub fn commit(&mut self, now: Timestamp, grace: Duration) {
        if !self.simple {
            return;
        }
        let until = now
            .checked_add(SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX))
            .unwrap_or(Timestamp::MAX);
        let before = self.cooling.len();
        self.cooling.retain(|c| c.until > now);
        let expired = self.cooling.len() != before;
        for (_, slots) in std::mem::take(&mut self.gone) {
            match self.cooling.iter_mut().find(|c| c.slots == slots) {
                Some(c) => c.until = c.until.max(until),
                None => self.cooling.push(Cooling { slots, until }),
            }
        }
        self.cooling.sort_by_key(|c| c.slots);
        if expired {
            let mut map = SlotMap::new(self.geometry.max_regions);
            for s in self.live.values() {
                map.mark(*s);
            }
            for c in &self.cooling {
                map.mark(c.slots);
            }
            self.map = map;
        }
        self.cooling_slots = self.cooling.iter().map(|c| c.slots.len).sum();
        self.uncommitted.clear();
    }

    /// The memory as of the last plan: windows got since then are not in it, windows whose
    /// pod went since are.
    pub fn ledger(&self) -> Ledger {
        let mut live: HashMap<String, Slots> = self
            .live
            .iter()
            .filter(|(k, _)| !self.uncommitted.contains(*k))
            .map(|(k, s)| (k.clone(), *s))
            .collect();
        for (k, s) in &self.gone {
            live.insert(k.clone(), *s);
        }
        Ledger {
            live,
            cooling: self.cooling.clone(),
        }
    }

    /// The next moment a cooling window frees.
    pub fn next_expiry(&self, now: Timestamp) -> Option<Timestamp> {
        self.cooling
            .iter()
            .map(|c| c.until)
            .filter(|u| *u > now)
            .min()
    }

    pub fn pod_writes(&self) -> impl Iterator<Item = (&PodKey, &Vec<Write>)> {
        self.pod_writes.iter()
    }

    pub fn directory_writes(&self) -> impl Iterator<Item = &Write> {
        self.dir_writes.values()
    }

    pub fn figures(&self) -> (u32, u32, u32) {
        (self.live_slots, self.region_count, self.cooling_slots)
    }

    /// The status findings, in the full pass's order.
    pub fn findings(&self) -> RegionFindings {
        RegionFindings {
            exhausted: self.exhausted.values().cloned().collect(),
            bad_requests: self.bad.values().cloned().collect(),
            over_quota: self.over_quota.values().cloned().collect(),
            conflicts: Vec::new(),
            window_failed: self.window_failed.values().cloned().collect(),
            too_large: self
                .too_large
                .iter()
                .map(|(ns, (n, b))| (ns.clone(), *n, *b))
                .collect(),
            events: 0,
        }
    }
}

fn owned_entry(e: &EntryRef<'_>) -> DirectoryEntry {
    DirectoryEntry {
        pod: e.pod.to_string(),
        node: e.node.map(str::to_string),
        pod_ip: e.pod_ip.map(str::to_string),
        id: e.id,
        base: e.base,
        size: e.size,
        uid: e.uid.map(str::to_string),
    }
}

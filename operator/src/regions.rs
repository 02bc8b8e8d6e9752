//! The shared memory region allocator of a fabric (pure).
//!
//! A fabric's address space is `maxRegions` slots of `regionSize` bytes. A region is a run of
//! contiguous slots: its id is its first slot and its window is `[first * regionSize,
//! (first + len) * regionSize)`. Ids therefore never collide between live regions, and keeping
//! a freed id out of use for a grace period keeps its whole window out of use.
//!
//! The pod annotation ([`RegionAssignment`], defined with the other cross-process formats in
//! `rocefabric-formats`) is the source of truth. [`allocate`] rebuilds the
//! slot map from the existing claims, oldest pod first (an overlapping younger claim loses), then
//! marks windows still in their grace period, then hands out first-fit windows to the pods that
//! have none, in the order given. The same claims always give the same map.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rocefabric_api::SharedMemorySpec;
use rocefabric_api::quantity;
use rocefabric_formats::region::RegionAssignment;
use serde::{Deserialize, Serialize};

/// What can be wrong with a fabric's geometry, a size request or a recorded claim.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    #[error("invalid sharedMemory.regionSize {value:?}: {reason}")]
    RegionSize { value: String, reason: String },
    #[error("invalid sharedMemory.maxRegions {value}: must be at least 1")]
    MaxRegions { value: u32 },
    #[error(
        "sharedMemory.maxRegions {max_regions} x regionSize {region_size} bytes exceeds the 64-bit address space"
    )]
    SpaceTooLarge { region_size: u64, max_regions: u32 },
    #[error("invalid annotation rocefabric.io/region-size {value:?}: {reason}")]
    SizeRequest { value: String, reason: String },
    #[error(
        "region size {requested} bytes needs {slots} regions, more than the {max_regions} the fabric has"
    )]
    RequestTooLarge {
        requested: u64,
        slots: u64,
        max_regions: u32,
    },
    #[error("invalid annotation rocefabric.io/region {value:?}: {reason}")]
    BadAnnotation { value: String, reason: String },
    #[error(
        "asks {slots} regions, more than the {cap} one pod may take (sharedMemory.maxRegionsPerPod, by default the namespace limit)"
    )]
    PodCap { slots: u32, cap: u32 },
    #[error("region {id} [{base}, +{size}) does not fit the fabric's geometry: {reason}")]
    Misaligned {
        id: u32,
        base: u64,
        size: u64,
        reason: &'static str,
    },
}

/// A run of contiguous slots: the region with id `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Slots {
    pub first: u32,
    pub len: u32,
}

impl Slots {
    /// One past the last slot.
    pub fn end(self) -> u64 {
        u64::from(self.first) + u64::from(self.len)
    }

    /// Whether two runs share a slot.
    pub fn overlaps(self, other: Slots) -> bool {
        u64::from(self.first) < other.end() && u64::from(other.first) < self.end()
    }
}

/// A fabric's address space: `max_regions` slots of `region_size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub region_size: u64,
    pub max_regions: u32,
}

impl Geometry {
    /// Check that the space is non-empty and addressable in 64 bits.
    pub fn new(region_size: u64, max_regions: u32) -> Result<Self, RegionError> {
        if region_size == 0 {
            return Err(RegionError::RegionSize {
                value: "0".into(),
                reason: "must be positive".into(),
            });
        }
        if max_regions == 0 {
            return Err(RegionError::MaxRegions { value: max_regions });
        }
        if region_size.checked_mul(u64::from(max_regions)).is_none() {
            return Err(RegionError::SpaceTooLarge {
                region_size,
                max_regions,
            });
        }
        Ok(Self {
            region_size,
            max_regions,
        })
    }

    /// The geometry of a fabric's `sharedMemory`.
    pub fn from_spec(spec: &SharedMemorySpec) -> Result<Self, RegionError> {
        let region_size =
            quantity::to_bytes(&spec.region_size).map_err(|e| RegionError::RegionSize {
                value: spec.region_size.0.clone(),
                reason: e.reason.to_string(),
            })?;
        Self::new(region_size, spec.max_regions)
    }

    /// Total bytes of the space.
    pub fn total_bytes(&self) -> u64 {
        // Checked in `new`.
        self.region_size.saturating_mul(u64::from(self.max_regions))
    }

    /// Slots for a pod: one region, or `requested` bytes rounded up to whole regions.
    pub fn slots_for(&self, requested: Option<u64>) -> Result<u32, RegionError> {
        let Some(bytes) = requested else { return Ok(1) };
        let slots = bytes.div_ceil(self.region_size).max(1);
        u32::try_from(slots)
            .ok()
            .filter(|s| *s <= self.max_regions)
            .ok_or(RegionError::RequestTooLarge {
                requested: bytes,
                slots,
                max_regions: self.max_regions,
            })
    }

    /// Slots for a pod from its `rocefabric.io/region-size` annotation, if any.
    pub fn slots_for_annotation(&self, value: Option<&str>) -> Result<u32, RegionError> {
        let requested = value
            .map(|v| {
                quantity::parse_bytes(v).map_err(|e| RegionError::SizeRequest {
                    value: v.to_string(),
                    reason: e.reason.to_string(),
                })
            })
            .transpose()?;
        self.slots_for(requested)
    }

    /// The assignment of `slots` in `fabric`, not yet bound to a pod.
    pub fn assignment(&self, fabric: &str, slots: Slots) -> RegionAssignment {
        RegionAssignment {
            fabric: fabric.to_string(),
            id: slots.first,
            base: u64::from(slots.first) * self.region_size,
            size: u64::from(slots.len) * self.region_size,
            uid: None,
        }
    }

    /// The slots a recorded assignment holds, if it fits this geometry exactly (aligned base,
    /// whole regions, id equal to the first slot, inside the space).
    pub fn slots_of(&self, a: &RegionAssignment) -> Result<Slots, RegionError> {
        self.window_slots(a.id, a.base, a.size)
    }

    /// The slots of this geometry that overlap the byte range `[base, base + size)`, clamped to
    /// the space; `None` when the range lies outside it or is empty.
    pub fn covering(&self, base: u64, size: u64) -> Option<Slots> {
        let first = base / self.region_size;
        let end = base
            .saturating_add(size)
            .div_ceil(self.region_size)
            .min(u64::from(self.max_regions));
        let first_u32 = u32::try_from(first).ok()?;
        let len = u32::try_from(end.checked_sub(first)?).ok()?;
        (size > 0 && len > 0).then_some(Slots {
            first: first_u32,
            len,
        })
    }

    /// [`Geometry::slots_of`] over the recorded fields.
    pub fn window_slots(&self, id: u32, base: u64, size: u64) -> Result<Slots, RegionError> {
        let bad = |reason| RegionError::Misaligned {
            id,
            base,
            size,
            reason,
        };
        if size == 0 || !size.is_multiple_of(self.region_size) {
            return Err(bad("size is not a positive whole number of regions"));
        }
        if !base.is_multiple_of(self.region_size) {
            return Err(bad("base is not a multiple of regionSize"));
        }
        if base / self.region_size != u64::from(id) {
            return Err(bad("id is not base / regionSize"));
        }
        let len = size / self.region_size;
        if u64::from(id) + len > u64::from(self.max_regions) {
            return Err(bad("window ends beyond maxRegions"));
        }
        let len = u32::try_from(len).map_err(|_| bad("window ends beyond maxRegions"))?;
        Ok(Slots { first: id, len })
    }
}

/// A bitmap of slots with first-fit allocation of contiguous runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotMap {
    words: Vec<u64>,
    max: u32,
    /// Every slot below `hint` is taken.
    hint: u32,
    taken: u32,
    /// The shortest run length that failed to allocate; runs this long or longer cannot fit
    /// until a slot is freed (slots are never freed within one map's life).
    failed_len: u32,
}

impl SlotMap {
    pub fn new(max: u32) -> Self {
        let words = usize::try_from(max.div_ceil(64)).unwrap_or(usize::MAX);
        Self {
            words: vec![0; words],
            max,
            hint: 0,
            taken: 0,
            failed_len: u32::MAX,
        }
    }

    /// Slots in the map.
    pub fn capacity(&self) -> u32 {
        self.max
    }

    /// Slots taken (live or cooling).
    pub fn taken(&self) -> u32 {
        self.taken
    }

    fn get(&self, slot: u32) -> bool {
        let i = slot as usize;
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, slot: u32) {
        let i = slot as usize;
        let w = &mut self.words[i / 64];
        let bit = 1 << (i % 64);
        if *w & bit == 0 {
            *w |= bit;
            self.taken += 1;
        }
    }

    fn in_bounds(&self, s: Slots) -> bool {
        s.len > 0 && s.end() <= u64::from(self.max)
    }

    /// Whether every slot of `s` is inside the map and free.
    pub fn is_free(&self, s: Slots) -> bool {
        self.in_bounds(s) && (s.first..s.first + s.len).all(|i| !self.get(i))
    }

    /// Take `s` if it is inside the map and entirely free.
    pub fn try_claim(&mut self, s: Slots) -> bool {
        if !self.is_free(s) {
            return false;
        }
        self.mark(s);
        true
    }

    /// Take every free slot of `s` that is inside the map (slots already taken stay as they are).
    pub fn mark(&mut self, s: Slots) {
        let end = u32::try_from(s.end().min(u64::from(self.max))).unwrap_or(self.max);
        for i in s.first..end {
            self.set(i);
        }
        while self.hint < self.max && self.get(self.hint) {
            self.hint += 1;
        }
    }

    /// Give back every slot of `s` inside the map (the incremental planner frees windows; a
    /// planning pass never does).
    pub fn free(&mut self, s: Slots) {
        let end = u32::try_from(s.end().min(u64::from(self.max))).unwrap_or(self.max);
        for i in s.first..end {
            let i = i as usize;
            let w = &mut self.words[i / 64];
            let bit = 1 << (i % 64);
            if *w & bit != 0 {
                *w &= !bit;
                self.taken -= 1;
            }
        }
        self.hint = self.hint.min(s.first);
        self.failed_len = u32::MAX;
    }

    /// The lowest run of `len` free slots, taken; `None` when no such run exists.
    pub fn allocate(&mut self, len: u32) -> Option<Slots> {
        if len == 0 || len > self.max || len >= self.failed_len {
            return None;
        }
        let mut i = self.hint;
        while i < self.max {
            // Skip taken slots a word at a time.
            let (w, b) = ((i / 64) as usize, i % 64);
            let free_bits = !self.words[w] >> b;
            if free_bits == 0 {
                i = (i - b).saturating_add(64);
                continue;
            }
            i += free_bits.trailing_zeros();
            if i >= self.max {
                break;
            }
            // Length of the free run starting at i (capped at len).
            let start = i;
            while i < self.max && i - start < len {
                let (w, b) = ((i / 64) as usize, i % 64);
                let taken_bits = self.words[w] >> b;
                let free_here = if taken_bits == 0 {
                    64 - b
                } else {
                    taken_bits.trailing_zeros().min(64 - b)
                };
                if free_here == 0 {
                    break;
                }
                i += free_here;
            }
            let run = i.min(self.max) - start;
            if run >= len {
                let s = Slots { first: start, len };
                self.mark(s);
                return Some(s);
            }
        }
        self.failed_len = self.failed_len.min(len);
        None
    }
}

/// One pod asking for a region, as [`allocate`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The window its annotation records, when that annotation fits the geometry.
    pub existing: Option<Slots>,
    /// Slots it needs when it has to get a new window.
    pub len: u32,
    /// A started pod: its recorded window is in use and never moves. When an older claim holds
    /// part of it, it gets no new window ([`Outcome::Waiting`] with `lost`) and its slots stay
    /// out of every new allocation all the same.
    pub pinned: bool,
}

/// What [`allocate`] decided for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The recorded window stays.
    Kept(Slots),
    /// A new window for a pod that had none.
    Assigned(Slots),
    /// The recorded window overlaps an older pod's: the pod gets a new one.
    Reassigned { lost: Slots, new: Slots },
    /// No room: the pod waits (`lost` is its recorded window when an older pod holds it).
    Waiting { lost: Option<Slots> },
}

impl Outcome {
    /// The window the pod holds after allocation.
    pub fn slots(&self) -> Option<Slots> {
        match *self {
            Outcome::Kept(s) | Outcome::Assigned(s) | Outcome::Reassigned { new: s, .. } => Some(s),
            Outcome::Waiting { .. } => None,
        }
    }
}

/// The result of [`allocate`]: one outcome per request, in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub outcomes: Vec<Outcome>,
    /// Slots held by live regions (cooling windows not counted).
    pub live_slots: u32,
}

impl Allocation {
    /// Requests left waiting for room.
    pub fn waiting(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Waiting { .. }))
            .count()
    }
}

/// Allocate regions for `requests`, given oldest first (the order decides who keeps a contested
/// window and who gets the lower new window). `cooling` windows (freed, in their grace period)
/// are never handed out; a recorded claim over them stays, as the annotation is the truth.
pub fn allocate(geometry: Geometry, requests: &[Request], cooling: &[Slots]) -> Allocation {
    allocate_with_reserved(geometry, requests, &[], cooling)
}

/// [`allocate`] with `reserved` windows: in use by pods that hold no window of this geometry
/// (a started pod whose annotation cannot be placed), never handed out, counted as live.
pub fn allocate_with_reserved(
    geometry: Geometry,
    requests: &[Request],
    reserved: &[Slots],
    cooling: &[Slots],
) -> Allocation {
    let mut map = SlotMap::new(geometry.max_regions);
    let mut outcomes: Vec<Option<Outcome>> = vec![None; requests.len()];
    let mut lost: Vec<Option<Slots>> = vec![None; requests.len()];
    for (i, r) in requests.iter().enumerate() {
        if let Some(s) = r.existing {
            if map.try_claim(s) {
                outcomes[i] = Some(Outcome::Kept(s));
            } else {
                lost[i] = Some(s);
            }
        }
    }
    // Windows in use whatever the claims say: pinned losers and reserved ranges.
    for (i, r) in requests.iter().enumerate() {
        if let (true, Some(l)) = (r.pinned, lost[i]) {
            map.mark(l);
            outcomes[i] = Some(Outcome::Waiting { lost: Some(l) });
        }
    }
    for s in reserved {
        map.mark(*s);
    }
    let live_before = map.taken();
    for s in cooling {
        map.mark(*s);
    }
    let cooling_slots = map.taken() - live_before;
    for (i, r) in requests.iter().enumerate() {
        if outcomes[i].is_some() {
            continue;
        }
        let outcome = match (map.allocate(r.len), lost[i]) {
            (Some(s), None) => Outcome::Assigned(s),
            (Some(s), Some(l)) => Outcome::Reassigned { lost: l, new: s },
            (None, l) => Outcome::Waiting { lost: l },
        };
        outcomes[i] = Some(outcome);
    }
    // Cooling marks only free slots and new windows never take cooling ones.
    let live_slots = map.taken() - cooling_slots;
    Allocation {
        outcomes: outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Waiting { lost: None }))
            .collect(),
        live_slots,
    }
}

/// A freed window in its grace period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cooling {
    pub slots: Slots,
    /// When the window may be handed out again.
    pub until: Timestamp,
}

/// The allocator memory the shell keeps from one plan to the next: per fabric, the windows live
/// at the last plan and the freed windows still in their grace period. After a restart it is
/// empty; the planner then also treats the windows listed in the region directories as
/// previously live, so a pod deleted while the operator was down still has its window cool down.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FreedRegions {
    pub(crate) fabrics: std::collections::BTreeMap<String, Ledger>,
    /// When this memory began: the first plan after a takeover (a restart or a new leader).
    pub(crate) since: Option<Timestamp>,
    /// Until when no new window is handed out (`since` + grace, see
    /// [`crate::planner::PlanOptions::hold_after_takeover`]), while that is in the future.
    pub(crate) hold_until: Option<Timestamp>,
    /// Gated pods (uids) already told that no fabric selects them: one Event each.
    pub(crate) unmatched: std::collections::BTreeSet<String>,
}

/// One fabric's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ledger {
    /// `namespace/pod` -> window, as of the last plan.
    pub(crate) live: std::collections::HashMap<String, Slots>,
    pub(crate) cooling: Vec<Cooling>,
}

impl FreedRegions {
    /// True when no fabric has anything remembered.
    pub fn is_empty(&self) -> bool {
        self.fabrics
            .values()
            .all(|l| l.live.is_empty() && l.cooling.is_empty())
    }

    /// The windows of `fabric` in their grace period.
    pub fn cooling(&self, fabric: &str) -> &[Cooling] {
        self.fabrics
            .get(fabric)
            .map(|l| l.cooling.as_slice())
            .unwrap_or_default()
    }

    /// The earliest moment a cooling window becomes free again, after `now`.
    pub fn next_expiry(&self, now: Timestamp) -> Option<Duration> {
        self.fabrics
            .values()
            .flat_map(|l| l.cooling.iter().map(|c| c.until))
            .chain(self.hold_until)
            .filter(|until| *until > now)
            .map(|until| until.duration_since(now).unsigned_abs())
            .min()
    }
}

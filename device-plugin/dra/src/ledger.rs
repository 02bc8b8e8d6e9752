//! One ledger of who holds each physical device of the node: DRA claims (prepared or being
//! prepared) and device plugin grants (ours in `both` mode, and the GPU resource's, NVIDIA's,
//! wherever GPUs are published). Devices are keyed by their physical
//! identity: the HCA's ID ([`rocefabric_node_model::model::Hca::id`]) or the GPU's PCI address, which both the
//! device plugin's IDs ([`rocefabric_node_model::ownership::devices_behind`]) and the DRA device list resolve to.
//!
//! - A DRA prepare takes its devices only when the device plugin holds none of them, and an
//!   Allocate grants only devices no claim holds. Both checks happen under one lock, so the two
//!   cannot pass at once for one device.
//! - The device plugin API has no Deallocate, so a grant's end is learned from the kubelet's pod
//!   resources API (the devices of live pods). Between an Allocate and the moment the kubelet
//!   lists the grant, the grant is held as pending, for [`PENDING_GRACE`].
//! - Claims come back from the checkpoint at start, before either side serves.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How long a device plugin grant counts as held before the pod resources API shows it: the
/// kubelet records a grant right after Allocate, so this only bridges that moment and a slow
/// refresh.
pub const PENDING_GRACE: Duration = Duration::from_secs(120);

/// Who holds a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A DRA claim, `namespace/name` (uid).
    Claim { claim: String, uid: String },
    /// A device plugin grant of a resource.
    DevicePlugin { resource: String },
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Claim { claim, uid } => write!(f, "DRA claim {claim} ({uid})"),
            Holder::DevicePlugin { resource } => write!(f, "a {resource} device plugin grant"),
        }
    }
}

/// A device someone else holds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device {device} is held by {holder}")]
pub struct Conflict {
    pub device: String,
    pub holder: Holder,
}

#[derive(Debug, Default)]
struct State {
    /// Claim uid -> (`namespace/name`, physical devices).
    claims: BTreeMap<String, (String, BTreeSet<String>)>,
    /// Devices of live pods' device plugin grants, per resource, from the pod resources API.
    live: BTreeMap<String, String>,
    /// Grants not yet seen live: device -> (resource, when granted).
    pending: BTreeMap<String, (String, Instant)>,
    /// The pod resources API could not be read (or not yet): any device the device plugin
    /// serves may be granted without our knowing.
    grants_unknown: bool,
}

impl State {
    fn device_plugin_holder(&self, device: &str, now: Instant) -> Option<&str> {
        if let Some(resource) = self.live.get(device) {
            return Some(resource);
        }
        self.pending
            .get(device)
            .filter(|(_, at)| now.duration_since(*at) < PENDING_GRACE)
            .map(|(resource, _)| resource.as_str())
    }

    fn claim_holder(&self, device: &str, except_uid: Option<&str>) -> Option<Holder> {
        self.claims
            .iter()
            .filter(|(uid, _)| Some(uid.as_str()) != except_uid)
            .find(|(_, (_, devices))| devices.contains(device))
            .map(|(uid, (claim, _))| Holder::Claim {
                claim: claim.clone(),
                uid: uid.clone(),
            })
    }
}

/// The shared ledger; [`Ledger::changes`] ticks whenever the set of held devices may have changed.
#[derive(Debug)]
pub struct Ledger {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            changed: watch::Sender::new(0),
        }
    }
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent across a panic (every update is one assignment).
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A ledger for a daemon that reads device plugin grants (`both` mode, and `dra` mode
    /// publishing GPUs): they are unknown until the first [`Ledger::set_live`].
    pub fn awaiting_grants() -> Self {
        let ledger = Self::default();
        ledger.lock().grants_unknown = true;
        ledger
    }

    /// Whether device plugin grants are known (always, when they are not read).
    pub fn grants_known(&self) -> bool {
        !self.lock().grants_unknown
    }

    /// The pod resources API could not be read: from now until the next [`Ledger::set_live`],
    /// any device the device plugin serves may be held.
    pub fn grants_lost(&self) {
        let was_unknown = std::mem::replace(&mut self.lock().grants_unknown, true);
        if !was_unknown {
            self.bump();
        }
    }

    /// A receiver that changes whenever holdings may have changed.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Record claim `uid` (`namespace/name`) as holding `devices`, unless the device plugin or
    /// another claim holds one of them. Taking the same devices again is a no-op.
    pub fn take_for_claim(
        &self,
        uid: &str,
        claim: &str,
        devices: &BTreeSet<String>,
        now: Instant,
    ) -> Result<(), Conflict> {
        let mut state = self.lock();
        for device in devices {
            if let Some(resource) = state.device_plugin_holder(device, now) {
                return Err(Conflict {
                    device: device.clone(),
                    holder: Holder::DevicePlugin {
                        resource: resource.to_string(),
                    },
                });
            }
            if let Some(holder) = state.claim_holder(device, Some(uid)) {
                return Err(Conflict {
                    device: device.clone(),
                    holder,
                });
            }
        }
        let entry = (claim.to_string(), devices.clone());
        if state.claims.get(uid) != Some(&entry) {
            state.claims.insert(uid.to_string(), entry);
            drop(state);
            self.bump();
        }
        Ok(())
    }

    /// Restore a claim from the checkpoint (no checks: it was granted before the restart).
    pub fn restore_claim(&self, uid: &str, claim: &str, devices: BTreeSet<String>) {
        self.lock()
            .claims
            .insert(uid.to_string(), (claim.to_string(), devices));
        self.bump();
    }

    /// Forget claim `uid` (unprepared).
    pub fn release_claim(&self, uid: &str) {
        if self.lock().claims.remove(uid).is_some() {
            self.bump();
        }
    }

    /// Grant `devices` to a container of `resource` unless a claim holds one of them; the grant
    /// is pending until the pod resources API lists it.
    pub fn grant(
        &self,
        resource: &str,
        devices: &BTreeSet<String>,
        now: Instant,
    ) -> Result<(), Conflict> {
        let mut state = self.lock();
        for device in devices {
            if let Some(holder) = state.claim_holder(device, None) {
                return Err(Conflict {
                    device: device.clone(),
                    holder,
                });
            }
        }
        for device in devices {
            state
                .pending
                .insert(device.clone(), (resource.to_string(), now));
        }
        drop(state);
        self.bump();
        Ok(())
    }

    /// The devices live pods hold through the device plugin (device -> resource), from the pod
    /// resources API. Pending grants now listed, and those past their grace, are dropped.
    pub fn set_live(&self, live: BTreeMap<String, String>, now: Instant) {
        let mut state = self.lock();
        let before: BTreeSet<String> = state.live.keys().cloned().collect();
        state.pending.retain(|device, (_, at)| {
            !live.contains_key(device) && now.duration_since(*at) < PENDING_GRACE
        });
        let was_unknown = std::mem::replace(&mut state.grants_unknown, false);
        let changed = was_unknown || before != live.keys().cloned().collect();
        state.live = live;
        drop(state);
        if changed {
            self.bump();
        }
    }

    /// Devices held by DRA claims.
    pub fn claimed(&self) -> BTreeSet<String> {
        self.lock()
            .claims
            .values()
            .flat_map(|(_, devices)| devices.iter().cloned())
            .collect()
    }

    /// Devices held through the device plugin (live or pending).
    pub fn granted(&self, now: Instant) -> BTreeSet<String> {
        let state = self.lock();
        let mut out: BTreeSet<String> = state.live.keys().cloned().collect();
        out.extend(
            state
                .pending
                .iter()
                .filter(|(_, (_, at))| now.duration_since(*at) < PENDING_GRACE)
                .map(|(d, _)| d.clone()),
        );
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_claimed_device_is_never_granted_and_the_other_way_round() {
        let ledger = Ledger::default();
        let now = Instant::now();
        ledger
            .take_for_claim("u1", "ns/c1", &set(&["hca-a", "gpu-a"]), now)
            .unwrap();
        let err = ledger
            .grant("rdma/hca", &set(&["hca-b", "hca-a"]), now)
            .unwrap_err();
        assert_eq!(err.device, "hca-a");
        assert!(err.to_string().contains("DRA claim ns/c1 (u1)"), "{err}");
        assert!(
            ledger.granted(now).is_empty(),
            "a refused grant holds nothing"
        );

        ledger.grant("rdma/hca", &set(&["hca-b"]), now).unwrap();
        let err = ledger
            .take_for_claim("u2", "ns/c2", &set(&["hca-b"]), now)
            .unwrap_err();
        assert_eq!(
            err.holder,
            Holder::DevicePlugin {
                resource: "rdma/hca".into()
            }
        );
        let err = ledger
            .take_for_claim("u2", "ns/c2", &set(&["gpu-a"]), now)
            .unwrap_err();
        assert!(matches!(err.holder, Holder::Claim { .. }));
        // The same claim again is fine (a retried prepare).
        ledger
            .take_for_claim("u1", "ns/c1", &set(&["hca-a", "gpu-a"]), now)
            .unwrap();
        ledger.release_claim("u1");
        ledger.grant("rdma/hca", &set(&["hca-a"]), now).unwrap();
    }

    #[test]
    fn grants_end_when_the_pod_resources_api_stops_listing_them() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        ledger.grant("rdma/hca", &set(&["hca-a"]), t0).unwrap();
        // Listed live, then the pod is gone: free at once, not after the grace.
        ledger.set_live(BTreeMap::from([("hca-a".into(), "rdma/hca".into())]), t0);
        assert_eq!(ledger.granted(t0), set(&["hca-a"]));
        ledger.set_live(BTreeMap::new(), t0 + Duration::from_secs(1));
        assert!(ledger.granted(t0 + Duration::from_secs(1)).is_empty());
        ledger
            .take_for_claim("u", "ns/c", &set(&["hca-a"]), t0 + Duration::from_secs(1))
            .unwrap();
    }

    #[test]
    fn a_pending_grant_holds_until_its_grace_ends() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        ledger.grant("rdma/hca", &set(&["hca-a"]), t0).unwrap();
        ledger.set_live(BTreeMap::new(), t0 + Duration::from_secs(5));
        assert!(
            ledger
                .take_for_claim("u", "ns/c", &set(&["hca-a"]), t0 + Duration::from_secs(5))
                .is_err()
        );
        let later = t0 + PENDING_GRACE + Duration::from_secs(1);
        assert!(ledger.granted(later).is_empty());
        ledger
            .take_for_claim("u", "ns/c", &set(&["hca-a"]), later)
            .unwrap();
    }

    #[test]
    fn changes_tick_when_holdings_change() {
        let ledger = Ledger::default();
        let mut rx = ledger.changes();
        rx.borrow_and_update();
        ledger
            .take_for_claim("u", "ns/c", &set(&["x"]), Instant::now())
            .unwrap();
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        ledger
            .take_for_claim("u", "ns/c", &set(&["x"]), Instant::now())
            .unwrap();
        assert!(
            !rx.has_changed().unwrap(),
            "an identical retake changes nothing"
        );
        ledger.release_claim("u");
        assert!(rx.has_changed().unwrap());
    }

    #[test]
    fn grants_are_unknown_until_the_first_list_and_after_a_failed_one() {
        let ledger = Ledger::awaiting_grants();
        let mut changes = ledger.changes();
        assert!(!ledger.grants_known());
        ledger.set_live(BTreeMap::new(), Instant::now());
        assert!(ledger.grants_known());
        assert!(changes.has_changed().unwrap(), "known again is a change");
        changes.mark_unchanged();
        ledger.grants_lost();
        assert!(!ledger.grants_known());
        assert!(changes.has_changed().unwrap());
        assert!(
            Ledger::default().grants_known(),
            "no device plugin: nothing unknown"
        );
    }
}

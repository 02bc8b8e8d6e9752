//! The ledger under random sequences of device plugin grants, DRA claims, releases, pod resources
//! answers, unknown-grant periods, daemon restarts and the passing of time: no device ever has two
//! holders, and every refusal names a real holder.

#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rocefabric_dra::ledger::{Holder, Ledger, PENDING_GRACE};

const DEVICES: usize = 6;

#[derive(Clone, Debug)]
enum Op {
    /// The device plugin's Allocate of these devices.
    Grant(Vec<usize>),
    /// A prepare of claim `uid` taking these devices.
    Take(usize, Vec<usize>),
    /// An unprepare.
    Release(usize),
    /// The pod resources API lists these devices as held by live pods.
    Live(Vec<usize>),
    /// The pod resources API cannot be read.
    Lost,
    /// The daemon restarts: claims come back from the checkpoint, grants are unknown.
    Restart,
    /// Time passes (seconds).
    Wait(u64),
}

fn devices() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0..DEVICES, 1..3)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => devices().prop_map(Op::Grant),
        4 => (0..4usize, devices()).prop_map(|(u, d)| Op::Take(u, d)),
        2 => (0..4usize).prop_map(Op::Release),
        2 => proptest::collection::vec(0..DEVICES, 0..3).prop_map(Op::Live),
        1 => Just(Op::Lost),
        1 => Just(Op::Restart),
        2 => (0..200u64).prop_map(Op::Wait),
    ]
}

fn names(ids: &[usize]) -> BTreeSet<String> {
    ids.iter().map(|i| format!("dev-{i}")).collect()
}

fn uid(u: usize) -> String {
    format!("uid-{u}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_device_ever_has_two_holders(ops in proptest::collection::vec(op(), 1..60)) {
        let start = Instant::now();
        let mut now = start;
        let mut ledger = Ledger::awaiting_grants();
        // What the checkpoint holds: claim uid -> devices.
        let mut claims: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for op in ops {
            let granted = ledger.granted(now);
            match op {
                Op::Grant(ids) => {
                    let wanted = names(&ids);
                    match ledger.grant("rdma/hca", &wanted, now) {
                        Ok(()) => prop_assert!(
                            wanted.iter().all(|d| claims.values().all(|c| !c.contains(d))),
                            "granted a device a claim holds"
                        ),
                        Err(conflict) => {
                            let Holder::Claim { uid, .. } = &conflict.holder else {
                                return Err(TestCaseError::fail("a grant refused for a grant"));
                            };
                            prop_assert!(claims[uid].contains(&conflict.device));
                        }
                    }
                }
                Op::Take(u, ids) => {
                    let wanted = names(&ids);
                    match ledger.take_for_claim(&uid(u), "ns/c", &wanted, now) {
                        Ok(()) => {
                            for d in &wanted {
                                prop_assert!(!granted.contains(d), "claimed a granted device");
                                prop_assert!(
                                    claims.iter().all(|(other, c)| *other == uid(u) || !c.contains(d)),
                                    "claimed another claim's device"
                                );
                            }
                            claims.insert(uid(u), wanted);
                        }
                        Err(conflict) => match &conflict.holder {
                            Holder::Claim { uid: other, .. } => {
                                prop_assert!(claims[other].contains(&conflict.device));
                            }
                            Holder::DevicePlugin { .. } => {
                                prop_assert!(granted.contains(&conflict.device));
                            }
                        },
                    }
                }
                Op::Release(u) => {
                    ledger.release_claim(&uid(u));
                    claims.remove(&uid(u));
                }
                Op::Live(ids) => {
                    // The kubelet lists only what it granted: a device a claim holds is never
                    // listed (the device plugin refused it).
                    let live: BTreeMap<String, String> = names(&ids)
                        .into_iter()
                        .filter(|d| claims.values().all(|c| !c.contains(d)))
                        .map(|d| (d, "rdma/hca".to_string()))
                        .collect();
                    ledger.set_live(live, now);
                    prop_assert!(ledger.grants_known());
                }
                Op::Lost => {
                    ledger.grants_lost();
                    prop_assert!(!ledger.grants_known());
                }
                Op::Restart => {
                    ledger = Ledger::awaiting_grants();
                    for (u, devices) in &claims {
                        ledger.restore_claim(u, "ns/c", devices.clone());
                    }
                    prop_assert!(!ledger.grants_known());
                }
                Op::Wait(secs) => now += Duration::from_secs(secs),
            }
            // The ledger's view of claims is the checkpoint's.
            let expected: BTreeSet<String> = claims.values().flatten().cloned().collect();
            prop_assert_eq!(ledger.claimed(), expected);
            // No device is both claimed and granted.
            let granted = ledger.granted(now);
            prop_assert!(
                ledger.claimed().is_disjoint(&granted),
                "claimed {:?} and granted {:?}", ledger.claimed(), granted
            );
        }
        prop_assert!(now.duration_since(start) < PENDING_GRACE * 1000);
    }
}

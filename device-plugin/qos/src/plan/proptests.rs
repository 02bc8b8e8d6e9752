#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use super::*;
use proptest::prelude::*;

fn reading<T: Clone + fmt::Debug + 'static>(
    v: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Reading<T>> {
    prop_oneof![
        4 => v.prop_map(|x| Reading::value(Mechanism::Sysfs, x)),
        1 => Just(Reading::unsupported("nope")),
        1 => Just(Reading::failed(Mechanism::Sysfs, "io")),
    ]
}

fn prios() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::btree_set(0u8..8, 0..8).prop_map(|s| s.into_iter().collect())
}

prop_compose! {
    fn observed()(
        trust in reading(prop_oneof![Just(Trust::Dscp), Just(Trust::Pcp)]),
        app in reading(proptest::collection::vec((0u8..64, 0u8..8).prop_map(|(d, p)| DcbApp::dscp(d, p)), 0..6)),
        pfc_en in reading(any::<u8>()),
        np in reading(prios()), rp in reading(prios()),
        cd in reading(0u8..64), cp in reading(0u8..8),
        tos in reading(proptest::option::of(any::<u8>())),
        mtu in reading(1280u32..9217),
    ) -> Observed {
        Observed {
            trust, app, pfc: pfc_en.map(|pfc_en| IeeePfc { pfc_en, ..Default::default() }),
            ecn_np: np, ecn_rp: rp, cnp_dscp: cd, cnp_priority: cp, roce_tos: tos,
            roce_mode: Reading::value(Mechanism::Configfs, Some("RoCE v2".into())),
            mtu, dcbx: None,
        }
    }
}

/// Apply a plan's writes to the observed state as an ideal driver would.
fn simulate(o: &Observed, p: &Plan) -> Observed {
    let mut o = o.clone();
    for w in &p.writes {
        match &w.write {
            Write::Trust(t) => o.trust = Reading::value(Mechanism::Sysfs, *t),
            Write::AddApps(a) => {
                if let Reading::Value { value, .. } = &mut o.app {
                    value.extend(a.iter().copied());
                }
            }
            Write::DelApps(a) => {
                if let Reading::Value { value, .. } = &mut o.app {
                    value.retain(|x| !a.contains(x));
                }
            }
            Write::Pfc(pfc) => o.pfc = Reading::value(Mechanism::DcbNetlink, *pfc),
            Write::Ecn {
                point,
                priority,
                enabled,
            } => {
                let r = match point {
                    EcnPoint::Notification => &mut o.ecn_np,
                    EcnPoint::Reaction => &mut o.ecn_rp,
                };
                if let Reading::Value { value, .. } = r {
                    value.retain(|p| p != priority);
                    if *enabled {
                        value.push(*priority);
                        value.sort_unstable();
                    }
                }
            }
            Write::CnpDscp { value, .. } => o.cnp_dscp = Reading::value(Mechanism::Sysfs, *value),
            Write::CnpPriority { value, .. } => {
                o.cnp_priority = Reading::value(Mechanism::Sysfs, *value)
            }
            Write::RoceMode(m) => {
                o.roce_mode = Reading::value(Mechanism::Configfs, Some(m.clone()))
            }
            Write::RoceTos(t) => o.roce_tos = Reading::value(Mechanism::Configfs, Some(*t)),
            Write::Mtu(m) => o.mtu = Reading::value(Mechanism::Rtnetlink, *m),
        }
    }
    // DCB-implied trust follows the APP table.
    if o.trust.mechanism() != Some(Mechanism::Sysfs)
        && let (Reading::Value { .. }, Some(app)) = (&o.trust, o.app.get())
    {
        let t = if app.iter().any(|a| a.selector == APP_SEL_DSCP) {
            Trust::Dscp
        } else {
            Trust::Pcp
        };
        o.trust = Reading::value(Mechanism::DcbNetlink, t);
    }
    o
}

proptest! {
    /// Planning is deterministic, and after an ideal driver carries out the writes, every
    /// supported and readable knob holds and a second plan writes nothing (idempotence).
    #[test]
    fn plans_converge_and_are_idempotent(o in observed(), q_pfc in prios().prop_filter("non-empty", |v| !v.is_empty())) {
        let q = QosSpec { roce_priority: q_pfc[0], pfc_priorities: q_pfc, ..QosSpec::default() };
        let d = Desired::from_spec(&q);
        let p1 = plan(&d, &o);
        prop_assert_eq!(&p1, &plan(&d, &o));
        let after = simulate(&o, &p1);
        let p2 = plan(&d, &after);
        prop_assert!(p2.writes.is_empty(), "second plan writes {:?}", p2.writes);
        for k in &p2.knobs {
            let first = p1.knob(k.knob).expect("same knobs");
            match &first.action {
                Action::Keep | Action::Change => prop_assert_eq!(&k.action, &Action::Keep, "{:?}", k.knob),
                _ => prop_assert_eq!(&k.action, &first.action),
            }
        }
    }
}

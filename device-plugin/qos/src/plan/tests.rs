#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use super::*;
use rocefabric_api::{CnpSpec, EcnSpec};

fn spec() -> QosSpec {
    QosSpec::default()
}

/// A ConnectX with the out-of-tree driver, configured exactly as the default spec wants.
fn correct(d: &Desired) -> Observed {
    Observed {
        trust: Reading::value(Mechanism::Sysfs, Trust::Dscp),
        app: Reading::value(Mechanism::DcbNetlink, d.dscp_map.clone()),
        pfc: Reading::value(
            Mechanism::DcbNetlink,
            IeeePfc {
                pfc_cap: 8,
                pfc_en: d.pfc_en,
                ..Default::default()
            },
        ),
        ecn_np: Reading::value(Mechanism::Sysfs, d.ecn.clone()),
        ecn_rp: Reading::value(Mechanism::Sysfs, d.ecn.clone()),
        cnp_dscp: Reading::value(Mechanism::Sysfs, d.cnp_dscp),
        cnp_priority: Reading::value(Mechanism::Sysfs, d.cnp_priority),
        roce_tos: Reading::value(Mechanism::Configfs, Some(d.roce_tos)),
        roce_mode: Reading::value(Mechanism::Configfs, Some(d.roce_mode.clone())),
        mtu: Reading::value(Mechanism::Rtnetlink, d.mtu),
        dcbx: Some(0x09),
    }
}

#[test]
fn desired_follows_the_standard_scheme() {
    let d = Desired::from_spec(&spec());
    assert_eq!(d.dscp_map, vec![DcbApp::dscp(26, 3), DcbApp::dscp(48, 6)]);
    assert_eq!(d.pfc_en, 0x08);
    assert_eq!(d.ecn, vec![3]);
    assert_eq!(d.roce_tos, 106);
    assert_eq!(d.mtu, 4200);
    assert_eq!(d.roce_mode, "RoCE v2");
}

#[test]
fn nothing_is_written_when_everything_holds() {
    let d = Desired::from_spec(&spec());
    let p = plan(&d, &correct(&d));
    assert!(p.writes.is_empty(), "{:?}", p.writes);
    assert!(p.holds());
    assert_eq!(p.knobs.len(), 10);
    assert!(p.knobs.iter().all(|k| k.action == Action::Keep));
}

#[test]
fn equal_pfc_is_never_rewritten_even_when_counters_and_other_fields_differ() {
    let d = Desired::from_spec(&spec());
    let mut o = correct(&d);
    let mut pfc = IeeePfc {
        pfc_cap: 8,
        pfc_en: 0x08,
        mbc: 1,
        delay: 100,
        ..Default::default()
    };
    pfc.requests[3] = 99;
    o.pfc = Reading::value(Mechanism::DcbNetlink, pfc);
    let p = plan(&d, &o);
    assert!(p.writes_for(Knob::Pfc).next().is_none());
    assert_eq!(p.knob(Knob::Pfc).unwrap().action, Action::Keep);
}

#[test]
fn pfc_change_keeps_cap_mbc_and_delay_and_zeroes_counters() {
    let d = Desired::from_spec(&spec());
    let mut o = correct(&d);
    let mut pfc = IeeePfc {
        pfc_cap: 8,
        pfc_en: 0x00,
        mbc: 0,
        delay: 7,
        ..Default::default()
    };
    pfc.indications[0] = 5;
    o.pfc = Reading::value(Mechanism::DcbNetlink, pfc);
    let p = plan(&d, &o);
    assert_eq!(
        p.writes,
        vec![PlannedWrite {
            knobs: vec![Knob::Pfc],
            write: Write::Pfc(IeeePfc {
                pfc_cap: 8,
                pfc_en: 0x08,
                mbc: 0,
                delay: 7,
                ..Default::default()
            })
        }]
    );
    let k = p.knob(Knob::Pfc).unwrap();
    assert_eq!(
        (k.desired.as_str(), k.observed.as_deref()),
        ("3", Some("none"))
    );
    assert_eq!(k.mechanism, Some(Mechanism::DcbNetlink));
}

#[test]
fn only_differing_ecn_priorities_are_written() {
    let d = Desired::from_spec(&spec());
    let mut o = correct(&d);
    // Out-of-tree default: ECN on every priority.
    o.ecn_np = Reading::value(Mechanism::Sysfs, (0..8).collect());
    let p = plan(&d, &o);
    let prios: Vec<(u8, bool)> = p
        .writes
        .iter()
        .map(|w| match w.write {
            Write::Ecn {
                point: EcnPoint::Notification,
                priority,
                enabled,
            } => (priority, enabled),
            ref other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        prios,
        vec![
            (0, false),
            (1, false),
            (2, false),
            (4, false),
            (5, false),
            (6, false),
            (7, false)
        ]
    );
    assert_eq!(p.knob(Knob::EcnReactionPoint).unwrap().action, Action::Keep);
}

#[test]
fn stale_dscp_entries_are_removed_after_the_new_ones_are_added() {
    let d = Desired::from_spec(&spec());
    let mut o = correct(&d);
    // mlx5 in DSCP trust lists all 64 DSCPs with prio = dscp >> 3; 26 -> 3 and 48 -> 6 hold there,
    // so use a table where 26 maps to 0.
    let mut table: Vec<DcbApp> = (0u8..64).map(|x| DcbApp::dscp(x, x >> 3)).collect();
    table[26] = DcbApp::dscp(26, 0);
    o.app = Reading::value(Mechanism::DcbNetlink, table);
    let p = plan(&d, &o);
    assert_eq!(
        p.writes.iter().map(|w| w.write.clone()).collect::<Vec<_>>(),
        vec![
            Write::AddApps(vec![DcbApp::dscp(26, 3)]),
            Write::DelApps(vec![DcbApp::dscp(26, 0)])
        ]
    );
    assert_eq!(
        p.knob(Knob::DscpMap).unwrap().observed.as_deref(),
        Some("26:0,48:6")
    );
    // The default mlx5 table already maps 26 -> 3 and 48 -> 6.
    o.app = Reading::value(
        Mechanism::DcbNetlink,
        (0u8..64).map(|x| DcbApp::dscp(x, x >> 3)).collect(),
    );
    assert!(plan(&d, &o).writes.is_empty());
}

#[test]
fn dcb_implied_trust_is_fixed_by_the_dscp_adds() {
    let d = Desired::from_spec(&spec());
    let mut o = correct(&d);
    o.trust = Reading::value(Mechanism::DcbNetlink, Trust::Pcp);
    o.app = Reading::value(Mechanism::DcbNetlink, vec![]);
    let p = plan(&d, &o);
    assert_eq!(
        p.writes,
        vec![PlannedWrite {
            knobs: vec![Knob::DscpMap, Knob::Trust],
            write: Write::AddApps(vec![DcbApp::dscp(26, 3), DcbApp::dscp(48, 6)])
        }]
    );
    assert_eq!(p.knob(Knob::Trust).unwrap().action, Action::Change);
    assert_eq!(
        p.knob(Knob::DscpMap).unwrap().observed.as_deref(),
        Some("26:-,48:-")
    );
}

#[test]
fn pcp_trust_drops_the_dscp_map_and_deletes_dscp_entries() {
    let q = QosSpec {
        trust: Trust::Pcp,
        ..spec()
    };
    let d = Desired::from_spec(&q);
    assert!(!d.knobs().contains(&Knob::DscpMap));
    let mut o = correct(&d);
    o.trust = Reading::value(Mechanism::DcbNetlink, Trust::Dscp);
    o.app = Reading::value(
        Mechanism::DcbNetlink,
        vec![
            DcbApp::dscp(26, 3),
            DcbApp {
                selector: 1,
                priority: 3,
                protocol: 0x8915,
            },
        ],
    );
    let p = plan(&d, &o);
    assert_eq!(
        p.writes,
        vec![PlannedWrite {
            knobs: vec![Knob::Trust],
            write: Write::DelApps(vec![DcbApp::dscp(26, 3)])
        }]
    );
    assert!(p.knob(Knob::DscpMap).is_none());
}

#[test]
fn writes_follow_the_documented_order() {
    let q = QosSpec {
        pfc_priorities: vec![3, 4],
        roce_priority: 3,
        ecn: EcnSpec {
            enabled: true,
            priorities: Some(vec![3, 4]),
        },
        cnp: CnpSpec {
            dscp: 46,
            priority: 5,
        },
        mtu: 9000,
        ..spec()
    };
    let d = Desired::from_spec(&q);
    let o = Observed {
        trust: Reading::value(Mechanism::Sysfs, Trust::Pcp),
        app: Reading::value(Mechanism::DcbNetlink, vec![]),
        pfc: Reading::value(Mechanism::DcbNetlink, IeeePfc::default()),
        ecn_np: Reading::value(Mechanism::Sysfs, vec![]),
        ecn_rp: Reading::value(Mechanism::Sysfs, vec![3]),
        cnp_dscp: Reading::value(Mechanism::Debugfs, 48),
        cnp_priority: Reading::value(Mechanism::Debugfs, 6),
        roce_tos: Reading::value(Mechanism::Configfs, None),
        roce_mode: Reading::value(Mechanism::Configfs, None),
        mtu: Reading::value(Mechanism::Rtnetlink, 1500),
        dcbx: None,
    };
    let p = plan(&d, &o);
    let order: Vec<String> = p.writes.iter().map(|w| w.write.to_string()).collect();
    assert_eq!(
        order,
        vec![
            "sysfs qos/trust <- dscp",
            "dcb app add dscp-prio 26:3,46:5",
            "dcb pfc set prio-pfc 3,4 (pfc_en 0x18)",
            "sysfs ecn/roce_np/enable/3 <- 1",
            "sysfs ecn/roce_np/enable/4 <- 1",
            "sysfs ecn/roce_rp/enable/4 <- 1",
            "debugfs cc_params/np_cnp_dscp <- 46",
            "debugfs cc_params/np_cnp_prio <- 5",
            "configfs rdma_cm default_roce_mode <- RoCE v2",
            "configfs rdma_cm default_roce_tos <- 106",
            "rtnetlink mtu <- 9000",
        ]
    );
    let knobs: Vec<Knob> = p.knobs.iter().map(|k| k.knob).collect();
    assert_eq!(knobs, d.knobs(), "report order");
    assert_eq!(
        p.knob(Knob::RoceTos).unwrap().observed.as_deref(),
        Some("not set (no rdma_cm entry)")
    );
}

#[test]
fn unsupported_and_unreadable_knobs_get_no_writes() {
    let d = Desired::from_spec(&spec());
    let no_dcb = "DCB netlink IEEE_GET on veth0: kernel returned EOPNOTSUPP".to_string();
    let o = Observed {
        trust: Reading::unsupported(no_dcb.clone()),
        app: Reading::unsupported(no_dcb.clone()),
        pfc: Reading::unsupported(no_dcb),
        ecn_np: Reading::unsupported("no ECN files"),
        ecn_rp: Reading::unsupported("no ECN files"),
        cnp_dscp: Reading::unsupported("no cnp files"),
        cnp_priority: Reading::failed(Mechanism::Debugfs, "permission denied"),
        roce_tos: Reading::unsupported("no RDMA device"),
        roce_mode: Reading::unsupported("no RDMA device"),
        mtu: Reading::value(Mechanism::Rtnetlink, 1500),
        dcbx: None,
    };
    let p = plan(&d, &o);
    assert_eq!(
        p.writes,
        vec![PlannedWrite {
            knobs: vec![Knob::Mtu],
            write: Write::Mtu(4200)
        }]
    );
    assert!(
        matches!(p.knob(Knob::Pfc).unwrap().action, Action::Unsupported(ref r) if r.contains("EOPNOTSUPP"))
    );
    assert_eq!(
        p.knob(Knob::CnpPriority).unwrap().action,
        Action::ReadFailed("permission denied".into())
    );
    assert_eq!(
        p.knob(Knob::CnpPriority).unwrap().mechanism,
        Some(Mechanism::Debugfs)
    );
    assert!(!p.holds());
}

#[test]
fn disabled_ecn_means_every_priority_off() {
    let q = QosSpec {
        ecn: EcnSpec {
            enabled: false,
            priorities: None,
        },
        ..spec()
    };
    let d = Desired::from_spec(&q);
    let mut o = correct(&d);
    o.ecn_rp = Reading::value(Mechanism::Sysfs, vec![3]);
    let p = plan(&d, &o);
    assert_eq!(
        p.writes.iter().map(|w| w.write.clone()).collect::<Vec<_>>(),
        vec![Write::Ecn {
            point: EcnPoint::Reaction,
            priority: 3,
            enabled: false
        }]
    );
    assert_eq!(p.knob(Knob::EcnReactionPoint).unwrap().desired, "none");
}

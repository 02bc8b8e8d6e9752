//! The QoS agent's hot parts: planning (pure), DCB netlink encoding/decoding of an mlx5-sized
//! APP table, and real netlink round trips on the loopback device (read-only: `RTM_GETLINK`,
//! and a DCB `IEEE_GET` that lo answers with EOPNOTSUPP).
//!
//! `cargo bench -p rocefabric-device-plugin --bench qos`
#![allow(clippy::unwrap_used)] // a benchmark fails loudly

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rocefabric_api::{Mechanism, QosSpec, Trust};
use rocefabric_qos_agent::Reading;
use rocefabric_qos_agent::apply::{self, Netlink};
use rocefabric_qos_agent::dcbnl::{
    self, DCB_ATTR_DCBX, DCB_ATTR_IEEE, DCB_ATTR_IEEE_APP, DCB_ATTR_IEEE_APP_TABLE,
    DCB_ATTR_IEEE_PFC, DCB_ATTR_IFNAME, DCB_CMD_IEEE_GET, RTM_GETDCB,
};
use rocefabric_qos_agent::driver_files::{NetdevFiles, Roots};
use rocefabric_qos_agent::model::{DcbApp, IeeePfc};
use rocefabric_qos_agent::netlink::MessageBuilder;
use rocefabric_qos_agent::plan::{Desired, Observed, plan};
use rocefabric_qos_agent::rtnl::LinkOps;

/// The IEEE_GET reply of an mlx5 port in DSCP trust: PFC plus all 64 DSCP APP entries.
fn mlx5_reply() -> Vec<u8> {
    let pfc = IeeePfc {
        pfc_cap: 8,
        pfc_en: 0x08,
        ..Default::default()
    };
    let mut b = MessageBuilder::new(RTM_GETDCB, 0, 1)
        .header(&dcbnl::dcbmsg(DCB_CMD_IEEE_GET))
        .attr(DCB_ATTR_IFNAME, b"enp24s0np0\0")
        .begin_nest(DCB_ATTR_IEEE)
        .attr(DCB_ATTR_IEEE_PFC, &pfc.encode())
        .begin_nest(DCB_ATTR_IEEE_APP_TABLE);
    for dscp in 0u8..64 {
        b = b.attr(DCB_ATTR_IEEE_APP, &DcbApp::dscp(dscp, dscp >> 3).encode());
    }
    b.end_nest()
        .end_nest()
        .attr(DCB_ATTR_DCBX, &[0x09])
        .finish()
}

fn observed(pfc_en: u8, mtu: u32) -> Observed {
    Observed {
        trust: Reading::value(Mechanism::Sysfs, Trust::Dscp),
        app: Reading::value(
            Mechanism::DcbNetlink,
            (0u8..64).map(|d| DcbApp::dscp(d, d >> 3)).collect(),
        ),
        pfc: Reading::value(
            Mechanism::DcbNetlink,
            IeeePfc {
                pfc_cap: 8,
                pfc_en,
                ..Default::default()
            },
        ),
        ecn_np: Reading::value(Mechanism::Sysfs, (0..8).collect()),
        ecn_rp: Reading::value(Mechanism::Sysfs, vec![3]),
        cnp_dscp: Reading::value(Mechanism::Sysfs, 48),
        cnp_priority: Reading::value(Mechanism::Sysfs, 6),
        roce_tos: Reading::value(Mechanism::Configfs, Some(106)),
        roce_mode: Reading::value(Mechanism::Configfs, Some("RoCE v2".into())),
        mtu: Reading::value(Mechanism::Rtnetlink, mtu),
        dcbx: Some(0x09),
    }
}

fn benches(c: &mut Criterion) {
    let desired = Desired::from_spec(&QosSpec::default());
    let holds = observed(0x08, 4200);
    let differs = observed(0x00, 1500);
    c.bench_function("plan (mlx5 port, nothing to change)", |b| {
        b.iter(|| plan(black_box(&desired), black_box(&holds)))
    });
    c.bench_function("plan (PFC, ECN and MTU differ)", |b| {
        b.iter(|| plan(black_box(&desired), black_box(&differs)))
    });

    let reply = mlx5_reply();
    c.bench_function("decode IEEE_GET reply (PFC + 64 DSCP apps)", |b| {
        b.iter(|| dcbnl::decode_ieee_get_reply(black_box(&reply)).unwrap())
    });
    let pfc = IeeePfc {
        pfc_cap: 8,
        pfc_en: 0x08,
        ..Default::default()
    };
    c.bench_function("encode IEEE_SET pfc", |b| {
        b.iter(|| dcbnl::encode_set_pfc(black_box("enp24s0np0"), &pfc, 1))
    });

    match Netlink::open() {
        Ok(mut netlink) => {
            c.bench_function("netlink RTM_GETLINK lo (round trip)", |b| {
                b.iter(|| netlink.link.get_link("lo").unwrap())
            });
            c.bench_function("netlink DCB IEEE_GET lo (EOPNOTSUPP round trip)", |b| {
                b.iter(|| dcbnl::DcbOps::ieee_get(&mut netlink.dcb, "lo").unwrap_err())
            });
            let files = NetdevFiles::resolve(&Roots::default(), "lo");
            c.bench_function("observe lo (every knob, read-only)", |b| {
                b.iter(|| apply::observe(&mut netlink.kernel(), black_box(&files)))
            });
        }
        Err(e) => eprintln!("no netlink socket here ({e}); skipping the round-trip benchmarks"),
    }
}

criterion_group!(qos, benches);
criterion_main!(qos);

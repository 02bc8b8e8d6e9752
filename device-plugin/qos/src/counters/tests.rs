#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use super::*;
use crate::apply::tests::FakeDcb;
use crate::driver_files::{RdmaPort, Roots};
use prometheus_client::registry::Registry;
use std::fs;

fn files(root: &std::path::Path, netdev: &str, ibdev: &str) -> NetdevFiles {
    let roots = Roots {
        sysfs: root.into(),
        debugfs: root.join("debug"),
        configfs: root.join("config"),
    };
    NetdevFiles::known(
        &roots,
        netdev,
        None,
        Some(RdmaPort {
            device: ibdev.into(),
            port: 1,
            is_virtual: false,
        }),
    )
}

#[test]
fn pfc_and_hw_counters_are_exported_with_interface_and_rdma_labels() {
    let dir = tempfile::tempdir().unwrap();
    let hw = dir
        .path()
        .join("class/infiniband/mlx5_0/ports/1/hw_counters");
    fs::create_dir_all(&hw).unwrap();
    fs::write(hw.join("np_cnp_sent"), "17\n").unwrap();
    fs::write(hw.join("rp_cnp_handled"), "5\n").unwrap();
    // np_ecn_marked_roce_packets missing: left out, not zero.
    let mut pfc = IeeePfc {
        pfc_cap: 8,
        pfc_en: 0x08,
        ..Default::default()
    };
    pfc.requests[3] = 11;
    pfc.indications[3] = 22;
    let targets = Arc::new(RwLock::new(vec![files(dir.path(), "enp24s0np0", "mlx5_0")]));
    let collector = FabricCounters::new(
        targets,
        Box::new(move || {
            Some(Box::new(FakeDcb {
                pfc: Some(pfc),
                ..FakeDcb::mlx5()
            }) as Box<dyn DcbOps>)
        }),
    )
    .with_driver_stats(Box::new(no_driver_stats));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("# TYPE rocefabric_pfc_pause_frames counter"),
        "{text}"
    );
    assert!(
        text.contains(
            r#"rocefabric_pfc_pause_frames_total{interface="enp24s0np0",rdma_device="mlx5_0",priority="3",direction="tx"} 11"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"priority="3",direction="rx"} 22"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"rocefabric_cnp_sent_total{interface="enp24s0np0",rdma_device="mlx5_0"} 17"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"rocefabric_cnp_handled_total{interface="enp24s0np0",rdma_device="mlx5_0"} 5"#
        ),
        "{text}"
    );
    assert!(!text.contains("rocefabric_ecn_marked_packets"), "{text}");
}

#[test]
fn no_dcb_leaves_pfc_out() {
    let dir = tempfile::tempdir().unwrap();
    let s = sample(
        Some(&mut FakeDcb::default()),
        &no_driver_stats,
        &files(dir.path(), "veth0", "none"),
    );
    assert_eq!(s.pfc, None);
    assert!(s.hw.is_empty());
    assert_eq!(s.driver, DriverCounters::default());
}

fn no_driver_stats(netdev: &str) -> Result<Vec<(String, u64)>, EthtoolError> {
    Err(EthtoolError::NoDriverStats {
        netdev: netdev.into(),
    })
}

/// An excerpt of `ethtool -S` on a ConnectX-7 port with PFC on priority 3.
fn mlx5_stats() -> Vec<(String, u64)> {
    [
        ("rx_packets", 1000),
        ("rx_prio3_bytes", 123_456),
        ("rx_prio3_packets", 99),
        ("rx_prio3_pause", 40),
        ("rx_prio3_pause_duration", 2_500_000),
        ("rx_prio3_pause_transition", 20),
        ("tx_prio3_pause", 7),
        ("tx_prio3_pause_duration", 1_250),
        ("tx_pause_storm_warning_events", 2),
        ("tx_pause_storm_error_events", 0),
        ("rx_pause_ctrl_phy", 5),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect()
}

#[test]
fn driver_statistic_names_are_classified_by_priority_direction_and_kind() {
    assert_eq!(
        classify("rx_prio3_pause_duration"),
        Some(DriverStat::PauseDurationMicros {
            priority: 3,
            direction: Direction::Rx
        })
    );
    assert_eq!(
        classify("tx_prio0_pause"),
        Some(DriverStat::PauseFrames {
            priority: 0,
            direction: Direction::Tx
        })
    );
    assert_eq!(
        classify("tx_prio7_pause_duration"),
        Some(DriverStat::PauseDurationMicros {
            priority: 7,
            direction: Direction::Tx
        })
    );
    assert_eq!(
        classify("tx_pause_storm_warning_events"),
        Some(DriverStat::PauseStormEvents(StormSeverity::Warning))
    );
    assert_eq!(
        classify("tx_pause_storm_error_events"),
        Some(DriverStat::PauseStormEvents(StormSeverity::Error))
    );
    for other in [
        "rx_prio3_pause_transition",
        "rx_prio3_bytes",
        "rx_prio8_pause",
        "rx_prio33_pause",
        "rx_prio_pause",
        "rx_prioX_pause",
        "rx_pause_ctrl_phy",
        "rx_prio3_pause_duration_x",
        "peer_ifindex",
        "",
    ] {
        assert_eq!(classify(other), None, "{other}");
    }
}

#[test]
fn driver_counters_keep_only_what_the_driver_lists() {
    let c = DriverCounters::from_stats(&mlx5_stats());
    assert_eq!(c.pause_frames[3], [Some(40), Some(7)]);
    assert_eq!(c.pause_duration_micros[3], [Some(2_500_000), Some(1_250)]);
    assert_eq!(c.pause_frames[4], [None, None], "no PFC on 4: not listed");
    assert_eq!(c.storm_warning_events, Some(2));
    assert_eq!(
        c.storm_error_events,
        Some(0),
        "a listed zero is a real zero"
    );
    assert_eq!(DriverCounters::from_stats(&[]), DriverCounters::default());
}

fn scrape(collector: FabricCounters) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

#[test]
fn driver_pause_durations_storms_and_frames_are_exported_preferring_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    // DCB disagrees on priority 3 (to see which wins) and has priority 4 too.
    let mut pfc = IeeePfc {
        pfc_cap: 8,
        pfc_en: 0x08,
        ..Default::default()
    };
    pfc.indications[3] = 1;
    pfc.requests[3] = 1;
    pfc.indications[4] = 9;
    let targets = Arc::new(RwLock::new(vec![
        files(dir.path(), "enp24s0np0", "mlx5_0"),
        files(dir.path(), "veth0", ""),
    ]));
    let collector = FabricCounters::new(
        targets,
        Box::new(move || {
            Some(Box::new(FakeDcb {
                pfc: Some(pfc),
                ..FakeDcb::mlx5()
            }) as Box<dyn DcbOps>)
        }),
    )
    .with_driver_stats(Box::new(|netdev| {
        if netdev == "enp24s0np0" {
            Ok(mlx5_stats())
        } else {
            Ok(vec![("peer_ifindex".into(), 4)])
        }
    }));
    let text = scrape(collector);
    let l = r#"interface="enp24s0np0",rdma_device="mlx5_0""#;
    for want in [
        "# TYPE rocefabric_pfc_pause_duration_seconds counter".to_string(),
        format!(
            r#"rocefabric_pfc_pause_duration_seconds_total{{{l},priority="3",direction="rx"}} 2.5"#
        ),
        format!(
            r#"rocefabric_pfc_pause_duration_seconds_total{{{l},priority="3",direction="tx"}} 0.00125"#
        ),
        "# TYPE rocefabric_pause_storm_events counter".to_string(),
        format!(r#"rocefabric_pause_storm_events_total{{{l},severity="warning"}} 2"#),
        format!(r#"rocefabric_pause_storm_events_total{{{l},severity="error"}} 0"#),
        // The driver's counters win over DCB's where both exist...
        format!(r#"rocefabric_pfc_pause_frames_total{{{l},priority="3",direction="rx"}} 40"#),
        format!(r#"rocefabric_pfc_pause_frames_total{{{l},priority="3",direction="tx"}} 7"#),
        // ...and DCB's fill the priorities the driver does not list.
        format!(r#"rocefabric_pfc_pause_frames_total{{{l},priority="4",direction="rx"}} 9"#),
    ] {
        assert!(text.contains(&want), "missing {want}\n{text}");
    }
    assert!(
        !text.contains(r#"priority="4",direction="rx"} 0"#),
        "no invented zero: {text}"
    );
    assert!(
        !text.contains(r#"rocefabric_pfc_pause_duration_seconds_total{interface="veth0""#),
        "the veth has no durations: {text}"
    );
    assert!(
        !text.contains(r#"rocefabric_pause_storm_events_total{interface="veth0""#),
        "{text}"
    );
    // Exactly the two listed durations, no per-priority fill-in.
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("rocefabric_pfc_pause_duration_seconds_total"))
            .count(),
        2,
        "{text}"
    );
}

#[test]
fn rxe_transport_counters_are_exported_from_its_hw_counters() {
    let (_dir, roots) = crate::fixture_tests::written_roots(
        &rocefabric_node_testing::fixtures::FixtureNode::vm_soft_roce(),
    );
    let hw = roots
        .sysfs
        .join("class/infiniband/rxe0/ports/1/hw_counters");
    for (file, value) in [
        ("sent_pkts", "4021"),
        ("rcvd_pkts", "3990"),
        ("duplicate_request", "3"),
        ("out_of_seq_request", "2"),
        ("completer_retry_err", "1"),
    ] {
        fs::write(hw.join(file), format!("{value}\n")).unwrap();
    }
    let targets = Arc::new(RwLock::new(vec![NetdevFiles::resolve(&roots, "eth0")]));
    let text = scrape(
        FabricCounters::new(targets, Box::new(|| None))
            .with_driver_stats(Box::new(no_driver_stats)),
    );
    for (metric, value) in [
        ("rocefabric_rdma_sent_packets_total", 4021),
        ("rocefabric_rdma_received_packets_total", 3990),
        ("rocefabric_rdma_duplicate_requests_total", 3),
        ("rocefabric_rdma_out_of_sequence_total", 2),
        ("rocefabric_rdma_retry_exceeded_total", 0),
        ("rocefabric_rdma_completer_retries_total", 1),
    ] {
        let line = format!(r#"{metric}{{interface="eth0",rdma_device="rxe0"}} {value}"#);
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    // rxe has no CNP or ECN counters: none invented.
    assert!(!text.contains("rocefabric_cnp"), "{text}");
}

/// A scrape reads every counter file: a FIFO or a huge value leaves that counter out (as a
/// missing one is) instead of blocking `/metrics` or `qos counters`.
#[test]
fn a_fifo_or_huge_counter_file_is_left_out_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let hw = dir
        .path()
        .join("class/infiniband/mlx5_0/ports/1/hw_counters");
    fs::create_dir_all(&hw).unwrap();
    rocefabric_node_testing::fixtures::replace_with_fifo(&hw.join("np_cnp_sent")).unwrap();
    fs::write(hw.join("rp_cnp_handled"), "5".repeat(1 << 20)).unwrap();
    fs::write(hw.join("np_ecn_marked_roce_packets"), "9\n").unwrap();
    let targets = Arc::new(RwLock::new(vec![files(dir.path(), "enp24s0np0", "mlx5_0")]));
    let text = scrape(
        FabricCounters::new(targets, Box::new(|| None))
            .with_driver_stats(Box::new(no_driver_stats)),
    );
    assert!(
        text.contains(
            r#"rocefabric_ecn_marked_packets_total{interface="enp24s0np0",rdma_device="mlx5_0"} 9"#
        ),
        "the readable counter is exported: {text}"
    );
    for left_out in [
        "rocefabric_cnp_sent_total{",
        "rocefabric_cnp_handled_total{",
    ] {
        assert!(!text.contains(left_out), "{left_out} in {text}");
    }
}

#[test]
fn no_driver_stats_and_no_dcb_export_no_pause_families() {
    let dir = tempfile::tempdir().unwrap();
    let targets = Arc::new(RwLock::new(vec![files(dir.path(), "veth0", "")]));
    let text = scrape(
        FabricCounters::new(targets, Box::new(|| None))
            .with_driver_stats(Box::new(no_driver_stats)),
    );
    assert!(!text.contains("rocefabric_pfc_pause"), "{text}");
    assert!(!text.contains("rocefabric_pause_storm"), "{text}");
}

#[test]
fn driver_pause_frames_are_exported_without_dcb() {
    let dir = tempfile::tempdir().unwrap();
    let targets = Arc::new(RwLock::new(vec![files(dir.path(), "enp24s0np0", "mlx5_0")]));
    let text = scrape(
        FabricCounters::new(targets, Box::new(|| None))
            .with_driver_stats(Box::new(|_| Ok(mlx5_stats()))),
    );
    assert!(
        text.contains(
            r#"rocefabric_pfc_pause_frames_total{interface="enp24s0np0",rdma_device="mlx5_0",priority="3",direction="rx"} 40"#
        ),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("rocefabric_pfc_pause_frames_total"))
            .count(),
        2,
        "only the listed priority 3 rx/tx: {text}"
    );
}

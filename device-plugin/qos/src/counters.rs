//! Fabric counters as Prometheus metrics, read at scrape time:
//!
//! - `rocefabric_pfc_pause_frames_total{interface,rdma_device,priority,direction}`: PFC pause frames
//!   per priority. Per priority and direction, the driver's own counter (`rx_prioN_pause` /
//!   `tx_prioN_pause` in `ethtool -S`, read over `SIOCETHTOOL` by [`super::ethtool`]) where the
//!   driver has one, else `struct ieee_pfc` over DCB netlink (`requests` are sent: `tx`,
//!   `indications` are received: `rx`). On mlx5 both come from the same port counters; the
//!   driver's is preferred because it is the named counter `ethtool -S` shows, while a driver may
//!   answer `ieee_getpfc` without filling the counters (zeros that would look like "no pause");
//!   mlx5 lists the per-priority counters only for PFC-enabled priorities, so the DCB ones still
//!   cover the others;
//! - `rocefabric_pfc_pause_duration_seconds_total{interface,rdma_device,priority,direction}`: time
//!   paused per priority, from the driver's `rx_prioN_pause_duration` (pauses received: this port
//!   held its transmission) and `tx_prioN_pause_duration` (pauses sent), in microseconds there;
//! - `rocefabric_pause_storm_events_total{interface,rdma_device,severity}`: the driver's
//!   `tx_pause_storm_warning_events` (`severity="warning"`: the port kept sending pause for a
//!   while) and `tx_pause_storm_error_events` (`severity="error"`: long enough to trigger the
//!   device's stall protection), the signature of a stuck receiver;
//! - `rocefabric_cnp_sent_total`, `rocefabric_cnp_handled_total`,
//!   `rocefabric_ecn_marked_packets_total{interface,rdma_device}`: the RDMA port's
//!   `hw_counters/np_cnp_sent`, `rp_cnp_handled`, `np_ecn_marked_roce_packets`;
//! - `rocefabric_rdma_sent_packets_total`, `rocefabric_rdma_received_packets_total`: RoCE packets
//!   of the RDMA port (`hw_counters/sent_pkts`/`rcvd_pkts` on rxe, else the IB port counters
//!   `counters/port_xmit_packets`/`port_rcv_packets`);
//! - `rocefabric_rdma_duplicate_requests_total`, `rocefabric_rdma_out_of_sequence_total`,
//!   `rocefabric_rdma_retry_exceeded_total`, `rocefabric_rdma_completer_retries_total`: the
//!   transport's retransmission signs (`duplicate_request`; `out_of_seq_request` on rxe,
//!   `out_of_sequence` on mlx5; `retry_exceeded_err`; `completer_retry_err`).
//!
//! A counter the device does not expose is left out (no zero is invented).

use std::fmt;
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use tracing::debug;

use super::dcbnl::DcbOps;
use super::driver_files::NetdevFiles;
use super::ethtool::{self, EthtoolError};
use super::model::{IeeePfc, MAX_PRIORITIES};

/// RDMA port counters: the files (relative to `ports/<n>/`, first readable wins) and the metric
/// each feeds.
const RDMA_PORT_COUNTERS: [(&[&str], &str, &str); 9] = [
    (
        &["hw_counters/np_cnp_sent"],
        "rocefabric_cnp_sent",
        "CNPs sent by the notification point (hw_counters/np_cnp_sent).",
    ),
    (
        &["hw_counters/rp_cnp_handled"],
        "rocefabric_cnp_handled",
        "CNPs handled by the reaction point (hw_counters/rp_cnp_handled).",
    ),
    (
        &["hw_counters/np_ecn_marked_roce_packets"],
        "rocefabric_ecn_marked_packets",
        "ECN-marked RoCE packets received (hw_counters/np_ecn_marked_roce_packets).",
    ),
    (
        &["hw_counters/sent_pkts", "counters/port_xmit_packets"],
        "rocefabric_rdma_sent_packets",
        "RoCE packets sent by the RDMA port (hw_counters/sent_pkts, counters/port_xmit_packets).",
    ),
    (
        &["hw_counters/rcvd_pkts", "counters/port_rcv_packets"],
        "rocefabric_rdma_received_packets",
        "RoCE packets received by the RDMA port (hw_counters/rcvd_pkts, counters/port_rcv_packets).",
    ),
    (
        &["hw_counters/duplicate_request"],
        "rocefabric_rdma_duplicate_requests",
        "Duplicate requests received: the sender retransmitted (hw_counters/duplicate_request).",
    ),
    (
        &[
            "hw_counters/out_of_seq_request",
            "hw_counters/out_of_sequence",
        ],
        "rocefabric_rdma_out_of_sequence",
        "Out-of-sequence packets received, a sign of loss (hw_counters/out_of_seq_request, out_of_sequence).",
    ),
    (
        &["hw_counters/retry_exceeded_err"],
        "rocefabric_rdma_retry_exceeded",
        "QPs that ran out of transport retries (hw_counters/retry_exceeded_err).",
    ),
    (
        &["hw_counters/completer_retry_err"],
        "rocefabric_rdma_completer_retries",
        "Requests the completer retried after a timeout or NAK (hw_counters/completer_retry_err).",
    ),
];

/// One interface's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub netdev: String,
    pub rdma_device: String,
    /// `None` when DCB (or `ieee_getpfc`) is not supported.
    pub pfc: Option<IeeePfc>,
    /// `(metric name, help, value)` for each readable hw counter.
    pub hw: Vec<(&'static str, &'static str, u64)>,
    /// The pause and pause-storm counters among the driver statistics (empty when it has none).
    pub driver: DriverCounters,
}

/// Traffic direction of a pause counter, as seen from this port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Rx,
    Tx,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Direction::Rx => "rx",
            Direction::Tx => "tx",
        }
    }

    fn index(self) -> usize {
        match self {
            Direction::Rx => 0,
            Direction::Tx => 1,
        }
    }
}

/// Pause-storm event counters (the driver's stall prevention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StormSeverity {
    Warning,
    Error,
}

/// What one driver statistic means here, by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverStat {
    /// `{rx,tx}_prio{N}_pause`.
    PauseFrames {
        priority: usize,
        direction: Direction,
    },
    /// `{rx,tx}_prio{N}_pause_duration` (microseconds).
    PauseDurationMicros {
        priority: usize,
        direction: Direction,
    },
    /// `tx_pause_storm_{warning,error}_events`.
    PauseStormEvents(StormSeverity),
}

/// Classify a driver statistic name; `None` for the (many) names not exported here.
pub fn classify(name: &str) -> Option<DriverStat> {
    match name {
        "tx_pause_storm_warning_events" => {
            return Some(DriverStat::PauseStormEvents(StormSeverity::Warning));
        }
        "tx_pause_storm_error_events" => {
            return Some(DriverStat::PauseStormEvents(StormSeverity::Error));
        }
        _ => {}
    }
    let (direction, rest) = if let Some(rest) = name.strip_prefix("rx_prio") {
        (Direction::Rx, rest)
    } else if let Some(rest) = name.strip_prefix("tx_prio") {
        (Direction::Tx, rest)
    } else {
        return None;
    };
    let (digits, kind) = rest.split_once('_')?;
    if digits.len() != 1 {
        return None;
    }
    let priority = digits
        .parse::<usize>()
        .ok()
        .filter(|p| *p < MAX_PRIORITIES)?;
    match kind {
        "pause" => Some(DriverStat::PauseFrames {
            priority,
            direction,
        }),
        "pause_duration" => Some(DriverStat::PauseDurationMicros {
            priority,
            direction,
        }),
        _ => None,
    }
}

/// `[priority][direction]` (rx = 0, tx = 1); `None` where the driver has no such counter.
pub type PerPriority = [[Option<u64>; 2]; MAX_PRIORITIES];

/// The pause counters found among one interface's driver statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverCounters {
    pub pause_frames: PerPriority,
    pub pause_duration_micros: PerPriority,
    pub storm_warning_events: Option<u64>,
    pub storm_error_events: Option<u64>,
}

impl DriverCounters {
    /// Pick the pause counters out of `(name, value)` driver statistics.
    pub fn from_stats(stats: &[(String, u64)]) -> Self {
        let mut out = DriverCounters::default();
        for (name, value) in stats {
            match classify(name) {
                Some(DriverStat::PauseFrames {
                    priority,
                    direction,
                }) => out.pause_frames[priority][direction.index()] = Some(*value),
                Some(DriverStat::PauseDurationMicros {
                    priority,
                    direction,
                }) => out.pause_duration_micros[priority][direction.index()] = Some(*value),
                Some(DriverStat::PauseStormEvents(StormSeverity::Warning)) => {
                    out.storm_warning_events = Some(*value)
                }
                Some(DriverStat::PauseStormEvents(StormSeverity::Error)) => {
                    out.storm_error_events = Some(*value)
                }
                None => {}
            }
        }
        out
    }

    fn has_durations(&self) -> bool {
        self.pause_duration_micros
            .iter()
            .flatten()
            .any(Option::is_some)
    }

    fn has_storms(&self) -> bool {
        self.storm_warning_events.is_some() || self.storm_error_events.is_some()
    }
}

impl Sample {
    /// Pause frames for `priority` and `direction`: the driver's counter, else DCB's.
    pub fn pause_frames(&self, priority: usize, direction: Direction) -> Option<u64> {
        self.driver.pause_frames[priority][direction.index()].or_else(|| {
            self.pfc.as_ref().map(|pfc| match direction {
                Direction::Rx => pfc.indications[priority],
                Direction::Tx => pfc.requests[priority],
            })
        })
    }

    fn labels(&self) -> Vec<(&'static str, String)> {
        vec![
            ("interface", self.netdev.clone()),
            ("rdma_device", self.rdma_device.clone()),
        ]
    }
}

/// Reads one interface's driver statistics (`ethtool -S`).
pub type DriverStatsFn = dyn Fn(&str) -> Result<Vec<(String, u64)>, EthtoolError> + Send + Sync;
/// An owned [`DriverStatsFn`].
pub type DriverStatsReader = Box<DriverStatsFn>;

/// Read one interface's counters (`dcb`: `None` when no netlink socket could be opened;
/// `driver_stats`: normally [`ethtool::driver_stats`]).
pub fn sample(
    dcb: Option<&mut dyn DcbOps>,
    driver_stats: &DriverStatsFn,
    files: &NetdevFiles,
) -> Sample {
    let driver = match driver_stats(&files.netdev) {
        Ok(stats) => DriverCounters::from_stats(&stats),
        Err(error) => {
            debug!(netdev = %files.netdev, %error, "no driver pause counters");
            DriverCounters::default()
        }
    };
    let pfc = match dcb.map(|d| d.ieee_get(&files.netdev)) {
        Some(Ok(state)) => state.pfc,
        Some(Err(error)) => {
            debug!(netdev = %files.netdev, %error, "no PFC counters");
            None
        }
        None => None,
    };
    let hw = RDMA_PORT_COUNTERS
        .iter()
        .filter_map(|(candidates, metric, help)| {
            let value = candidates.iter().find_map(|file| {
                let path = files.rdma_port_path(file)?;
                rocefabric_input::read::attr(&path)?.parse::<u64>().ok()
            })?;
            Some((*metric, *help, value))
        })
        .collect();
    Sample {
        netdev: files.netdev.clone(),
        rdma_device: files
            .rdma
            .as_ref()
            .map(|r| r.device.clone())
            .unwrap_or_default(),
        pfc,
        hw,
        driver,
    }
}

/// Encode samples in the exposition format (grouped by metric, as the format requires).
pub fn encode(samples: &[Sample], mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
    let directions = [Direction::Rx, Direction::Tx];
    let has_pause_frames = |s: &Sample| {
        (0..MAX_PRIORITIES).any(|p| directions.iter().any(|d| s.pause_frames(p, *d).is_some()))
    };
    if samples.iter().any(has_pause_frames) {
        let mut family = encoder.encode_descriptor(
            "rocefabric_pfc_pause_frames",
            "PFC pause frames per priority: the driver's rx/tx_prioN_pause counters (ethtool -S) \
             where present, else DCB netlink ieee_pfc (indications = rx, requests = tx).",
            None,
            MetricType::Counter,
        )?;
        for s in samples {
            for prio in 0..MAX_PRIORITIES {
                for direction in directions {
                    let Some(value) = s.pause_frames(prio, direction) else {
                        continue;
                    };
                    let mut labels = s.labels();
                    labels.push(("priority", prio.to_string()));
                    labels.push(("direction", direction.label().to_string()));
                    ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
    }
    if samples.iter().any(|s| s.driver.has_durations()) {
        let mut family = encoder.encode_descriptor(
            "rocefabric_pfc_pause_duration_seconds",
            "Time paused by PFC per priority, from the driver's rx/tx_prioN_pause_duration \
             (ethtool -S, microseconds): rx = pauses received (this port held its traffic), \
             tx = pauses sent.",
            None,
            MetricType::Counter,
        )?;
        for s in samples {
            for prio in 0..MAX_PRIORITIES {
                for direction in directions {
                    let Some(micros) = s.driver.pause_duration_micros[prio][direction.index()]
                    else {
                        continue;
                    };
                    let mut labels = s.labels();
                    labels.push(("priority", prio.to_string()));
                    labels.push(("direction", direction.label().to_string()));
                    ConstCounter::new(micros as f64 / 1e6)
                        .encode(family.encode_family(&labels)?)?;
                }
            }
        }
    }
    if samples.iter().any(|s| s.driver.has_storms()) {
        let mut family = encoder.encode_descriptor(
            "rocefabric_pause_storm_events",
            "Pause-storm events of the port's stall prevention, from the driver's \
             tx_pause_storm_warning_events (severity=warning) and tx_pause_storm_error_events \
             (severity=error) (ethtool -S).",
            None,
            MetricType::Counter,
        )?;
        for s in samples {
            for (severity, value) in [
                ("warning", s.driver.storm_warning_events),
                ("error", s.driver.storm_error_events),
            ] {
                let Some(value) = value else { continue };
                let mut labels = s.labels();
                labels.push(("severity", severity.to_string()));
                ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
    }
    for (_, metric, help) in RDMA_PORT_COUNTERS {
        if !samples
            .iter()
            .any(|s| s.hw.iter().any(|(m, _, _)| *m == metric))
        {
            continue;
        }
        let mut family = encoder.encode_descriptor(metric, help, None, MetricType::Counter)?;
        for s in samples {
            for (_, _, value) in s.hw.iter().filter(|(m, _, _)| *m == metric) {
                ConstCounter::new(*value).encode(family.encode_family(&s.labels())?)?;
            }
        }
    }
    Ok(())
}

/// Opens DCB access for one scrape.
pub type DcbFactory = Box<dyn Fn() -> Option<Box<dyn DcbOps>> + Send + Sync>;

/// A collector over the interfaces the agent currently manages.
pub struct FabricCounters {
    targets: Arc<RwLock<Vec<NetdevFiles>>>,
    dcb: DcbFactory,
    driver_stats: DriverStatsReader,
}

impl fmt::Debug for FabricCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FabricCounters").finish_non_exhaustive()
    }
}

impl FabricCounters {
    /// `targets` is shared with the agent, which replaces it when the selected interfaces change.
    /// Driver statistics are read over `SIOCETHTOOL` ([`ethtool::driver_stats`]).
    pub fn new(targets: Arc<RwLock<Vec<NetdevFiles>>>, dcb: DcbFactory) -> Self {
        Self {
            targets,
            dcb,
            driver_stats: Box::new(ethtool::driver_stats),
        }
    }

    /// Read driver statistics with `reader` instead (tests).
    pub fn with_driver_stats(mut self, reader: DriverStatsReader) -> Self {
        self.driver_stats = reader;
        self
    }

    /// Samples of every target now.
    pub fn samples(&self) -> Vec<Sample> {
        let targets = self.targets.read().map(|t| t.clone()).unwrap_or_default();
        let mut dcb = (self.dcb)();
        let mut out = Vec::with_capacity(targets.len());
        for files in &targets {
            out.push(match dcb.as_mut() {
                Some(d) => sample(Some(d.as_mut()), &self.driver_stats, files),
                None => sample(None, &self.driver_stats, files),
            });
        }
        out
    }
}

impl Collector for FabricCounters {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        encode(&self.samples(), encoder)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
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
        let (_dir, roots) =
            crate::fixture_tests::written_roots(&rocefabric_node_testing::fixtures::FixtureNode::vm_soft_roce());
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
}

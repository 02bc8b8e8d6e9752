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

/// A sample holding every counter this module can export (all zero): encoded, it lists every
/// family the collector can emit, which a real scrape shows only on a device that has them all.
/// The chart's alert rules and dashboard queries are checked against it.
pub fn sample_with_every_counter() -> Sample {
    let all = [[Some(0); 2]; MAX_PRIORITIES];
    Sample {
        netdev: "every0".into(),
        rdma_device: "every_0".into(),
        pfc: Some(IeeePfc::default()),
        hw: RDMA_PORT_COUNTERS
            .iter()
            .map(|(_, metric, help)| (*metric, *help, 0))
            .collect(),
        driver: DriverCounters {
            pause_frames: all,
            pause_duration_micros: all,
            storm_warning_events: Some(0),
            storm_error_events: Some(0),
        },
    }
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
mod tests;

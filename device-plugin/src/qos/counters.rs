//! Fabric counters as Prometheus metrics, read at scrape time:
//!
//! - `rocefabric_pfc_pause_frames_total{interface,rdma_device,priority,direction}`: PFC pause frames
//!   per priority, from `struct ieee_pfc` over DCB netlink (`requests` are sent: `tx`,
//!   `indications` are received: `rx`; mlx5 fills them from its `tx_prioN_pause` /
//!   `rx_prioN_pause` port counters);
//! - `rocefabric_cnp_sent_total`, `rocefabric_cnp_handled_total`,
//!   `rocefabric_ecn_marked_packets_total{interface,rdma_device}`: the RDMA port's
//!   `hw_counters/np_cnp_sent`, `rp_cnp_handled`, `np_ecn_marked_roce_packets`.
//!
//! A counter the device does not expose is left out (no zero is invented).

use std::fmt;
use std::fs;
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use tracing::debug;

use super::dcbnl::{DcbOps, IeeePfc, MAX_PRIORITIES};
use super::driver_files::NetdevFiles;

/// `hw_counters` file names and the metric each feeds.
const HW_COUNTERS: [(&str, &str, &str); 3] = [
    (
        "np_cnp_sent",
        "rocefabric_cnp_sent",
        "CNPs sent by the notification point (hw_counters/np_cnp_sent).",
    ),
    (
        "rp_cnp_handled",
        "rocefabric_cnp_handled",
        "CNPs handled by the reaction point (hw_counters/rp_cnp_handled).",
    ),
    (
        "np_ecn_marked_roce_packets",
        "rocefabric_ecn_marked_packets",
        "ECN-marked RoCE packets received (hw_counters/np_ecn_marked_roce_packets).",
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
}

/// Read one interface's counters (`dcb`: `None` when no netlink socket could be opened).
pub fn sample(dcb: Option<&mut dyn DcbOps>, files: &NetdevFiles) -> Sample {
    let pfc = match dcb.map(|d| d.ieee_get(&files.netdev)) {
        Some(Ok(state)) => state.pfc,
        Some(Err(error)) => {
            debug!(netdev = %files.netdev, %error, "no PFC counters");
            None
        }
        None => None,
    };
    let hw = HW_COUNTERS
        .iter()
        .filter_map(|(file, metric, help)| {
            let path = files.hw_counter_path(file)?;
            let value = fs::read_to_string(&path).ok()?.trim().parse::<u64>().ok()?;
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
    }
}

/// Encode samples in the exposition format (grouped by metric, as the format requires).
pub fn encode(samples: &[Sample], mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
    if samples.iter().any(|s| s.pfc.is_some()) {
        let mut family = encoder.encode_descriptor(
            "rocefabric_pfc_pause_frames",
            "PFC pause frames per priority (DCB netlink ieee_pfc: requests = tx, indications = rx).",
            None,
            MetricType::Counter,
        )?;
        for s in samples {
            let Some(pfc) = &s.pfc else { continue };
            for prio in 0..MAX_PRIORITIES {
                for (direction, value) in
                    [("rx", pfc.indications[prio]), ("tx", pfc.requests[prio])]
                {
                    let labels = vec![
                        ("interface", s.netdev.clone()),
                        ("rdma_device", s.rdma_device.clone()),
                        ("priority", prio.to_string()),
                        ("direction", direction.to_string()),
                    ];
                    ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
    }
    for (_, metric, help) in HW_COUNTERS {
        if !samples
            .iter()
            .any(|s| s.hw.iter().any(|(m, _, _)| *m == metric))
        {
            continue;
        }
        let mut family = encoder.encode_descriptor(metric, help, None, MetricType::Counter)?;
        for s in samples {
            for (_, _, value) in s.hw.iter().filter(|(m, _, _)| *m == metric) {
                let labels = vec![
                    ("interface", s.netdev.clone()),
                    ("rdma_device", s.rdma_device.clone()),
                ];
                ConstCounter::new(*value).encode(family.encode_family(&labels)?)?;
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
}

impl fmt::Debug for FabricCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FabricCounters").finish_non_exhaustive()
    }
}

impl FabricCounters {
    /// `targets` is shared with the agent, which replaces it when the selected interfaces change.
    pub fn new(targets: Arc<RwLock<Vec<NetdevFiles>>>, dcb: DcbFactory) -> Self {
        Self { targets, dcb }
    }

    /// Samples of every target now.
    pub fn samples(&self) -> Vec<Sample> {
        let targets = self.targets.read().map(|t| t.clone()).unwrap_or_default();
        let mut dcb = (self.dcb)();
        let mut out = Vec::with_capacity(targets.len());
        for files in &targets {
            out.push(match dcb.as_mut() {
                Some(d) => sample(Some(d.as_mut()), files),
                None => sample(None, files),
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
    use crate::qos::apply::tests::FakeDcb;
    use crate::qos::driver_files::{RdmaPort, Roots};
    use prometheus_client::registry::Registry;

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
        );
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
            &files(dir.path(), "veth0", "none"),
        );
        assert_eq!(s.pfc, None);
        assert!(s.hw.is_empty());
    }
}

//! `rocefabric-device-plugin qos show|apply`: read or apply the lossless RoCE QoS of one
//! netdev by hand, with the same code the agent uses.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, anyhow, bail};
use rocefabric_api::{InterfaceStatus, Knob};
use rocefabric_input::read::read_file;
use rocefabric_input::yaml;
use serde::Serialize;
use serde_json::{Value, json};

use rocefabric_node_model::config::CONFIG_FILE_LIMIT;
use rocefabric_qos_agent::Reading;
use rocefabric_qos_agent::apply::{self, Netlink};
use rocefabric_qos_agent::dcbnl::dcbx;
use rocefabric_qos_agent::driver_files::{NetdevFiles, Roots};
use rocefabric_qos_agent::model::{APP_SEL_DSCP, DcbApp};
use rocefabric_qos_agent::netlink::errno;
use rocefabric_qos_agent::plan::{Action, Desired, Observed, Plan};

/// Where sysfs, debugfs and configfs are mounted.
#[derive(Debug, Clone, clap::Args)]
pub struct RootArgs {
    /// Root of sysfs (driver files under class/net/<if>/ecn and qos, RDMA devices).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Root of debugfs (upstream mlx5 cc_params under mlx5/<BDF>/).
    #[arg(long, value_name = "DIR", default_value = "/sys/kernel/debug")]
    pub debugfs_root: PathBuf,
    /// Root of configfs (rdma_cm/<ibdev>/ports/<n>/default_roce_tos).
    #[arg(long, value_name = "DIR", default_value = "/sys/kernel/config")]
    pub configfs_root: PathBuf,
}

impl RootArgs {
    pub fn roots(&self) -> Roots {
        Roots {
            sysfs: self.sysfs_root.clone(),
            debugfs: self.debugfs_root.clone(),
            configfs: self.configfs_root.clone(),
        }
    }
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
}

/// Read or apply the RoCE QoS of one netdev.
#[derive(Debug, clap::Args)]
pub struct QosArgs {
    #[command(subcommand)]
    pub command: QosCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum QosCommand {
    /// Print every QoS knob of a netdev (like `mlnx_qos -i`).
    Show(ShowArgs),
    /// Apply a QoS block (the schema of RoceFabric.spec.qos) to a netdev. Exits 0 only when
    /// everything asked for holds afterwards.
    Apply(ApplyArgs),
    /// Print the fabric counters of a netdev (PFC, CNP/ECN, RDMA transport) in the Prometheus
    /// text format, exactly as the agent's `/metrics` exports them.
    Counters(CountersArgs),
}

#[derive(Debug, clap::Args)]
pub struct CountersArgs {
    /// Network interface.
    #[arg(long, value_name = "IF")]
    pub netdev: String,
    #[command(flatten)]
    pub roots: RootArgs,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// Network interface.
    #[arg(long, value_name = "IF")]
    pub netdev: String,
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub roots: RootArgs,
}

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// Network interface.
    #[arg(long, value_name = "IF")]
    pub netdev: String,
    /// YAML file with a QoS block, as in RoceFabric.spec.qos (defaults fill what is left out);
    /// at most 1 MiB.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Print the changes that would be made, and touch nothing. Exits 0 only when nothing would change.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub roots: RootArgs,
}

pub fn run(args: QosArgs) -> anyhow::Result<()> {
    match args.command {
        QosCommand::Show(a) => show(a),
        QosCommand::Apply(a) => apply_cmd(a),
        QosCommand::Counters(a) => counters_cmd(a),
    }
}

/// `qos counters`: the agent's collector, scraped once for one netdev.
fn counters_cmd(args: CountersArgs) -> anyhow::Result<()> {
    use std::sync::{Arc, RwLock};

    use rocefabric_qos_agent::counters::FabricCounters;
    use rocefabric_qos_agent::dcbnl::DcbOps;

    drop(open(&args.netdev)?);
    let files = NetdevFiles::resolve(&args.roots.roots(), &args.netdev);
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(FabricCounters::new(
        Arc::new(RwLock::new(vec![files])),
        Box::new(|| {
            Netlink::open()
                .ok()
                .map(|n| Box::new(n.dcb) as Box<dyn DcbOps>)
        }),
    )));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .context("failed to encode the counters")?;
    print!("{text}");
    Ok(())
}

/// Open netlink and make sure the interface exists.
fn open(netdev: &str) -> anyhow::Result<Netlink> {
    let mut netlink = Netlink::open().context("failed to open a NETLINK_ROUTE socket")?;
    if let Err(e) = rocefabric_qos_agent::rtnl::LinkOps::get_link(&mut netlink.link, netdev) {
        if e.source.errno() == Some(errno::ENODEV) {
            bail!("no network interface named {netdev:?} in this network namespace");
        }
        return Err(anyhow!(e).context(format!("failed to look up network interface {netdev:?}")));
    }
    Ok(netlink)
}

/// Parse and validate a `--config` QoS block: at most [`CONFIG_FILE_LIMIT`] bytes, strict YAML
/// (a key given twice is refused, not the last one kept), unknown fields refused (the API server
/// would prune them silently, which for a hand-written file hides typos), then the fabric's own
/// rules.
pub fn load_qos(path: &std::path::Path) -> anyhow::Result<rocefabric_api::QosSpec> {
    // The read error names the file itself.
    let text = read_file(path, CONFIG_FILE_LIMIT)?;
    let value: Value = yaml::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let value = if value.is_null() { json!({}) } else { value };
    // Unknown fields, set lists and ranges: the fabric's own checks, as the API server makes them.
    rocefabric_api::validate::qos_value(&value).map_err(|e| anyhow!("{}: {e}", path.display()))
}

fn knob_name(knob: Knob) -> String {
    serde_json::to_value(knob)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn mech_name(m: Option<rocefabric_api::Mechanism>) -> String {
    m.and_then(|m| serde_json::to_value(m).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "-".into())
}

/// One knob in `qos show`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ShownKnob {
    knob: String,
    supported: bool,
    mechanism: Option<rocefabric_api::Mechanism>,
    value: Option<Value>,
    error: Option<String>,
}

fn shown<T>(knob: Knob, r: &Reading<T>, v: impl Fn(&T) -> Value) -> ShownKnob {
    match r {
        Reading::Value { mechanism, value } => ShownKnob {
            knob: knob_name(knob),
            supported: true,
            mechanism: Some(*mechanism),
            value: Some(v(value)),
            error: None,
        },
        Reading::Unsupported { reason } => ShownKnob {
            knob: knob_name(knob),
            supported: false,
            mechanism: None,
            value: None,
            error: Some(reason.clone()),
        },
        Reading::Failed { mechanism, error } => ShownKnob {
            knob: knob_name(knob),
            supported: true,
            mechanism: Some(*mechanism),
            value: None,
            error: Some(error.clone()),
        },
    }
}

fn dscp_entries(app: &[DcbApp]) -> Value {
    let mut v: Vec<(u16, u8)> = app
        .iter()
        .filter(|a| a.selector == APP_SEL_DSCP)
        .map(|a| (a.protocol, a.priority))
        .collect();
    v.sort_unstable();
    Value::Array(
        v.into_iter()
            .map(|(d, p)| json!({ "dscp": d, "priority": p }))
            .collect(),
    )
}

/// `qos show` as data.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ShowReport {
    netdev: String,
    rdma_device: Option<String>,
    rdma_port: Option<u32>,
    pci_address: Option<String>,
    dcb: DcbSupport,
    knobs: Vec<ShownKnob>,
    /// Per-priority PFC pause frames, when DCB reports them.
    pfc_pause_frames: Option<Value>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DcbSupport {
    supported: bool,
    /// DCBX mode (`host,ieee`).
    dcbx: Option<String>,
    error: Option<String>,
}

fn show_report(files: &NetdevFiles, o: &Observed) -> ShowReport {
    let dcb = match &o.app {
        Reading::Value { .. } => DcbSupport {
            supported: true,
            dcbx: o.dcbx.map(dcbx::describe),
            error: None,
        },
        Reading::Unsupported { reason } => DcbSupport {
            supported: false,
            dcbx: None,
            error: Some(reason.clone()),
        },
        Reading::Failed { error, .. } => DcbSupport {
            supported: true,
            dcbx: None,
            error: Some(error.clone()),
        },
    };
    let prios = |v: &Vec<u8>| json!(v);
    let knobs = vec![
        shown(Knob::Trust, &o.trust, |t| json!(t)),
        shown(Knob::DscpMap, &o.app, |a| dscp_entries(a)),
        shown(Knob::Pfc, &o.pfc, |p| json!(p.enabled_priorities())),
        shown(Knob::EcnNotificationPoint, &o.ecn_np, prios),
        shown(Knob::EcnReactionPoint, &o.ecn_rp, prios),
        shown(Knob::CnpDscp, &o.cnp_dscp, |v| json!(v)),
        shown(Knob::CnpPriority, &o.cnp_priority, |v| json!(v)),
        shown(Knob::RoceTos, &o.roce_tos, |v| json!(v)),
        shown(Knob::RoceMode, &o.roce_mode, |v| json!(v)),
        shown(Knob::Mtu, &o.mtu, |v| json!(v)),
    ];
    ShowReport {
        netdev: files.netdev.clone(),
        rdma_device: files.rdma.as_ref().map(|r| r.device.clone()),
        rdma_port: files.rdma.as_ref().map(|r| r.port),
        pci_address: files.pci_address.clone(),
        dcb,
        knobs,
        pfc_pause_frames: o
            .pfc
            .get()
            .map(|p| json!({ "rx": p.indications, "tx": p.requests })),
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Null => "not set".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "none".into(),
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::Object(m) => format!(
                    "{}:{}",
                    m.get("dscp").map(Value::to_string).unwrap_or_default(),
                    m.get("priority").map(Value::to_string).unwrap_or_default()
                ),
                other => value_text(other),
            })
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

fn show_table(r: &ShowReport) -> String {
    let mut s = String::new();
    let dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(s, "Interface:    {}", r.netdev);
    let _ = writeln!(
        s,
        "RDMA device:  {}",
        r.rdma_device.as_ref().map_or_else(
            || "-".to_string(),
            |d| format!("{d} port {}", r.rdma_port.unwrap_or(1))
        )
    );
    let _ = writeln!(s, "PCI address:  {}", dash(&r.pci_address));
    match (&r.dcb.supported, &r.dcb.error) {
        (false, Some(e)) => {
            let _ = writeln!(s, "DCB:          not supported");
            let _ = writeln!(s, "  {e}");
        }
        (true, Some(e)) => {
            let _ = writeln!(s, "DCB:          unreadable: {e}");
        }
        _ => {
            let _ = writeln!(
                s,
                "DCB:          supported, DCBX mode {}",
                dash(&r.dcb.dcbx)
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:<22} {:<26} {:<12} NOTE", "KNOB", "VALUE", "MECHANISM");
    for k in &r.knobs {
        let value = match (&k.value, k.supported) {
            (Some(v), _) => value_text(v),
            (None, false) => "unsupported".into(),
            (None, true) => "unreadable".into(),
        };
        let _ = writeln!(
            s,
            "{:<22} {:<26} {:<12} {}",
            k.knob,
            value,
            mech_name(k.mechanism),
            k.error.clone().unwrap_or_default()
        );
    }
    if let Some(p) = &r.pfc_pause_frames {
        let _ = writeln!(s);
        let _ = writeln!(s, "PFC pause frames per priority:");
        for dir in ["rx", "tx"] {
            let v = p.get(dir).map(value_text).unwrap_or_default();
            let _ = writeln!(s, "  {dir}: {v}");
        }
    }
    s
}

fn show(args: ShowArgs) -> anyhow::Result<()> {
    let mut netlink = open(&args.netdev)?;
    let files = NetdevFiles::resolve(&args.roots.roots(), &args.netdev);
    let observed = apply::observe(&mut netlink.kernel(), &files);
    let report = show_report(&files, &observed);
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Table => print!("{}", show_table(&report)),
    }
    Ok(())
}

/// `qos apply --dry-run` as data.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DryRunReport {
    netdev: String,
    dry_run: bool,
    /// Everything asked for holds already.
    holds: bool,
    knobs: Vec<PlannedKnob>,
    /// The writes an apply would make, in order.
    changes: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PlannedKnob {
    knob: String,
    /// `keep`, `change`, `unsupported` or `failed` (unreadable).
    action: &'static str,
    mechanism: Option<rocefabric_api::Mechanism>,
    desired: String,
    observed: Option<String>,
    reason: Option<String>,
}

fn dry_run_report(netdev: &str, p: &Plan) -> DryRunReport {
    DryRunReport {
        netdev: netdev.to_string(),
        dry_run: true,
        holds: p.holds(),
        knobs: p
            .knobs
            .iter()
            .map(|k| {
                let (action, reason) = match &k.action {
                    Action::Keep => ("keep", None),
                    Action::Change => ("change", None),
                    Action::Unsupported(r) => ("unsupported", Some(r.clone())),
                    Action::ReadFailed(e) => ("failed", Some(e.clone())),
                };
                PlannedKnob {
                    knob: knob_name(k.knob),
                    action,
                    mechanism: k.mechanism,
                    desired: k.desired.clone(),
                    observed: k.observed.clone(),
                    reason,
                }
            })
            .collect(),
        changes: p.writes.iter().map(|w| w.write.to_string()).collect(),
    }
}

fn dry_run_table(r: &DryRunReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Dry run on {}: nothing is written.", r.netdev);
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<22} {:<12} {:<12} {:<14} {:<26} NOTE",
        "KNOB", "ACTION", "MECHANISM", "DESIRED", "OBSERVED"
    );
    for k in &r.knobs {
        let _ = writeln!(
            s,
            "{:<22} {:<12} {:<12} {:<14} {:<26} {}",
            k.knob,
            k.action,
            mech_name(k.mechanism),
            k.desired,
            k.observed.clone().unwrap_or_else(|| "-".into()),
            k.reason.clone().unwrap_or_default()
        );
    }
    let _ = writeln!(s);
    if r.changes.is_empty() {
        let _ = writeln!(s, "No changes.");
    } else {
        let _ = writeln!(s, "Would change:");
        for c in &r.changes {
            let _ = writeln!(s, "  {c}");
        }
    }
    s
}

/// `qos apply` as data: the interface's status entry plus the verdict.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ApplyReport {
    dry_run: bool,
    /// Everything asked for holds now.
    holds: bool,
    #[serde(flatten)]
    interface: InterfaceStatus,
    /// The writes made, in order.
    changes: Vec<String>,
}

fn apply_table(r: &ApplyReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<22} {:<16} {:<12} {:<14} {:<26} ERROR",
        "KNOB", "OUTCOME", "MECHANISM", "DESIRED", "OBSERVED"
    );
    for k in &r.interface.knobs {
        let _ = writeln!(
            s,
            "{:<22} {:<16} {:<12} {:<14} {:<26} {}",
            knob_name(k.knob),
            format!("{:?}", k.outcome),
            mech_name(k.mechanism),
            k.desired.clone().unwrap_or_default(),
            k.observed.clone().unwrap_or_else(|| "-".into()),
            k.error.clone().unwrap_or_default()
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{}: {}",
        r.interface.netdev,
        if r.holds {
            "every knob holds"
        } else {
            "not every knob holds"
        }
    );
    s
}

fn apply_cmd(args: ApplyArgs) -> anyhow::Result<()> {
    let qos = load_qos(&args.config)?;
    let desired = Desired::from_spec(&qos);
    let mut netlink = open(&args.netdev)?;
    let files = NetdevFiles::resolve(&args.roots.roots(), &args.netdev);
    if args.dry_run {
        let (_, p) = apply::dry_run(&mut netlink.kernel(), &files, &desired);
        let report = dry_run_report(&args.netdev, &p);
        match args.output {
            Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            Output::Table => print!("{}", dry_run_table(&report)),
        }
        if !p.holds() {
            let pending = p.knobs.iter().filter(|k| k.action != Action::Keep).count();
            bail!(
                "{pending} knob(s) on {} do not hold now (dry run: nothing was written)",
                args.netdev
            );
        }
        return Ok(());
    }
    let outcome = apply::apply(&mut netlink.kernel(), &files, &desired);
    let report = ApplyReport {
        dry_run: false,
        holds: outcome.holds(),
        interface: outcome.interface_status(&files, None),
        changes: outcome
            .plan
            .writes
            .iter()
            .map(|w| w.write.to_string())
            .collect(),
    };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Table => print!("{}", apply_table(&report)),
    }
    if !report.holds {
        let bad: Vec<String> = report
            .interface
            .knobs
            .iter()
            .filter(|k| !k.outcome.holds())
            .map(|k| format!("{} {:?}", knob_name(k.knob), k.outcome))
            .collect();
        bail!(
            "not every knob holds on {}: {}",
            args.netdev,
            bad.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn config_defaults_fill_what_is_left_out() {
        let q = load_qos(write("mtu: 9000\n").path()).unwrap();
        assert_eq!(q.mtu, 9000);
        assert_eq!(q.roce_dscp, 26);
        assert_eq!(
            load_qos(write("").path()).unwrap(),
            rocefabric_api::QosSpec::default()
        );
    }

    #[test]
    fn config_errors_name_the_field_and_value() {
        let e = load_qos(write("pfcPriorities: [4]\nrocePriority: 3\n").path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("rocePriority"), "{e}");
        let e = load_qos(write("mtu: 100\n").path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("mtu") && e.contains("100"), "{e}");
        let e = load_qos(write("qos:\n  mtu: 9000\n").path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("qos: unknown field \"qos\""), "{e}");
        let e = load_qos(write("cnp:\n  dscpp: 40\n").path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("cnp.dscpp"), "{e}");
        let e = load_qos(write("pfcPriorities: [3, 3]\n").path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("pfcPriorities[1]: Duplicate value: 3"), "{e}");
    }

    #[test]
    fn a_key_given_twice_is_refused_not_the_last_one_kept() {
        let f = write("roceDscp: 26\nroceDscp: 30\n");
        let e = load_qos(f.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: invalid YAML: document 1: duplicate key \"roceDscp\" at line 2",
                f.path().display()
            )
        );
    }

    #[test]
    fn a_file_over_the_limit_is_refused_unread() {
        let f = write("");
        // Sparse: one byte over 1 MiB without writing it.
        f.as_file().set_len(CONFIG_FILE_LIMIT + 1).unwrap();
        let e = load_qos(f.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("{} is larger than the 1 MiB limit", f.path().display())
        );
    }
}

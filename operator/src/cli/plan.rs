//! `rocefabric-operator plan`: the operator's planner over the cluster's objects, read from YAML
//! files or (`--from-cluster`) from the API server.
//!
//! Users run it before applying a fabric: which RoceNodes the operator would write, which nodes
//! conflict, which regions every matching pod gets. Objects without `creationTimestamp` (a
//! fabric not yet applied) count as the youngest. With `--from-cluster`, `--fabrics` files are
//! what `kubectl apply` would send: they replace the cluster's fabrics of the same name.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use k8s_openapi::jiff::Timestamp;
use rocefabric_input::shown::shown_within;
use serde::Serialize;

use crate::planner::{
    self, FabricReport, FieldErrorReport, NodeAction, PlanOptions, PlanReport, World, Write,
};
use crate::regions::FreedRegions;
use crate::snapshot::{Kind, Snapshot};
use rocefabric_api::RoceFabric;

/// Output format of `plan`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Human-readable tables.
    #[default]
    Table,
    /// One JSON document.
    Json,
}

/// Arguments of `plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// YAML file of RoceFabric objects (`kubectl get rocefabrics -o yaml`: a List, multi-document
    /// YAML or a single object). Repeatable. With `--from-cluster`: fabrics to plan as if
    /// applied (`kubectl apply -f FILE`), in place of the cluster's of the same name.
    #[arg(
        long = "fabrics",
        value_name = "FILE",
        required_unless_present = "from_cluster"
    )]
    pub fabrics: Vec<PathBuf>,
    /// YAML file of Node objects (`kubectl get nodes -o yaml`). Repeatable.
    #[arg(
        long = "nodes",
        value_name = "FILE",
        required_unless_present = "from_cluster",
        conflicts_with = "from_cluster"
    )]
    pub nodes: Vec<PathBuf>,
    /// YAML file of Pod objects (`kubectl get pods -A -o yaml`). Repeatable.
    #[arg(
        long = "pods",
        value_name = "FILE",
        required_unless_present = "from_cluster",
        conflicts_with = "from_cluster"
    )]
    pub pods: Vec<PathBuf>,
    /// YAML file of existing RoceNode objects (`kubectl get rocenodes -o yaml`), to see the
    /// rollout from where it stands. Repeatable.
    #[arg(
        long = "roce-nodes",
        value_name = "FILE",
        conflicts_with = "from_cluster"
    )]
    pub roce_nodes: Vec<PathBuf>,
    /// Read fabrics, nodes, pods, RoceNodes and region directories from the cluster (the
    /// kubeconfig as kubectl finds it: `KUBECONFIG`, `~/.kube/config`, or in-cluster), as the
    /// operator sees them. Read-only: lists, a page at a time.
    #[arg(long)]
    pub from_cluster: bool,
    /// Objects per list request with `--from-cluster` (`limit`; the rest follow with `continue`).
    #[arg(long, value_name = "N", default_value_t = super::cluster::DEFAULT_PAGE_SIZE,
        value_parser = clap::value_parser!(u32).range(1..))]
    pub page_size: u32,
    /// `table` (default) or `json`.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// With `--output json`, also list every write in full (`writeList`): the annotation values,
    /// directory texts and RoceNode specs the operator would send.
    #[arg(long)]
    pub writes: bool,
}

impl PlanArgs {
    /// The arguments of `rocefabric-operator plan ARGS...` (tests and tools that plan
    /// in-process).
    pub fn from_argv(args: &[&str]) -> Result<PlanArgs, clap::Error> {
        use clap::Parser as _;
        let argv = ["rocefabric-operator", "plan"].iter().chain(args);
        match super::Cli::try_parse_from(argv)?.command {
            super::Command::Plan(args) => Ok(args),
            super::Command::Run(_) => unreachable!("the subcommand is plan"),
        }
    }
}

/// What `plan --output json` prints.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanOutput {
    #[serde(flatten)]
    pub report: PlanReport,
    /// The writes the operator's first pass would send, counted by kind.
    pub writes: BTreeMap<&'static str, usize>,
    /// Every write in full, with `--writes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_list: Option<Vec<Write>>,
    /// Remarks on the input that are not errors (an object given twice).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Load the files and plan.
pub fn plan_files(args: &PlanArgs) -> anyhow::Result<PlanOutput> {
    let snapshot = load_files(args)?;
    Ok(plan_snapshot(snapshot, args.writes))
}

/// Read the cluster through `client`, put the `--fabrics` files in place of its fabrics, and plan.
pub async fn plan_cluster(client: &kube::Client, args: &PlanArgs) -> anyhow::Result<PlanOutput> {
    let proposed = load_files(args)?;
    let mut snapshot = super::cluster::snapshot(client, args.page_size).await?;
    apply_proposed(&mut snapshot, proposed);
    Ok(plan_snapshot(snapshot, args.writes))
}

/// The objects of the files `args` names.
fn load_files(args: &PlanArgs) -> anyhow::Result<Snapshot> {
    let mut snapshot = Snapshot::default();
    let groups: [(&[PathBuf], Kind); 4] = [
        (&args.fabrics, Kind::RoceFabric),
        (&args.nodes, Kind::Node),
        (&args.pods, Kind::Pod),
        (&args.roce_nodes, Kind::RoceNode),
    ];
    for (paths, kind) in groups {
        for path in paths {
            // The error names the file and the place in it.
            snapshot.load_file(path, &[kind])?;
        }
    }
    Ok(snapshot)
}

/// Put the fabrics of `proposed` in place of the cluster's of the same name, as `kubectl apply`
/// would: one already there keeps its uid, creation time and status, and its generation moves
/// on when its spec changes. The other objects of `proposed` are ignored.
pub fn apply_proposed(cluster: &mut Snapshot, proposed: Snapshot) {
    let name = |f: &RoceFabric| f.metadata.name.clone().unwrap_or_default();
    let mut replaced: BTreeMap<String, RoceFabric> = BTreeMap::new();
    let names: std::collections::BTreeSet<String> = proposed
        .fabrics
        .iter()
        .map(name)
        .chain(proposed.unreadable_fabrics.iter().map(|f| f.name.clone()))
        .collect();
    cluster.fabrics.retain(|f| {
        if names.contains(&name(f)) {
            replaced.insert(name(f), f.clone());
            false
        } else {
            true
        }
    });
    cluster
        .unreadable_fabrics
        .retain(|f| !names.contains(&f.name));
    for mut fabric in proposed.fabrics {
        if let Some(live) = replaced.get(&name(&fabric)) {
            let changed =
                serde_json::to_value(&fabric.spec).ok() != serde_json::to_value(&live.spec).ok();
            let meta = &mut fabric.metadata;
            meta.uid = live.metadata.uid.clone();
            meta.creation_timestamp = live.metadata.creation_timestamp.clone();
            meta.resource_version = live.metadata.resource_version.clone();
            meta.generation = live.metadata.generation.map(|g| g + i64::from(changed));
            fabric.status = live.status.clone();
        }
        cluster.fabrics.push(fabric);
    }
    cluster
        .unreadable_fabrics
        .extend(proposed.unreadable_fabrics);
}

/// Plan over `snapshot` as the operator does; the full writes with `writes`.
pub fn plan_snapshot(mut snapshot: Snapshot, writes: bool) -> PlanOutput {
    tracing::debug!(
        fabrics = snapshot.fabrics.len() + snapshot.unreadable_fabrics.len(),
        nodes = snapshot.nodes.len(),
        pods = snapshot.pods.len(),
        roce_nodes = snapshot.roce_nodes.len(),
        "snapshot loaded"
    );
    let world = World {
        fabrics: snapshot.fabrics,
        nodes: snapshot.nodes,
        roce_nodes: snapshot.roce_nodes,
        pods: snapshot.pods,
        config_maps: snapshot.config_maps,
        now: Timestamp::now(),
        freed: FreedRegions::default(),
    };
    let plan = planner::plan(
        &world,
        &PlanOptions {
            detailed_report: true,
            ..PlanOptions::default()
        },
    );
    let mut notes = std::mem::take(&mut snapshot.notes);
    if snapshot.notes_left_out > 0 {
        notes.push(format!(
            "{} more objects are given twice and counted once",
            snapshot.notes_left_out
        ));
    }
    let mut report = plan.report;
    for bad in snapshot.unreadable_fabrics {
        report.fabrics.push(FabricReport {
            name: bad.name,
            valid: false,
            errors: bad
                .errors
                .into_iter()
                .map(|e| FieldErrorReport {
                    field: e.field,
                    message: e.message,
                })
                .collect(),
            ..FabricReport::default()
        });
    }
    report.fabrics.sort_by(|a, b| a.name.cmp(&b.name));
    let mut counts = BTreeMap::new();
    for w in &plan.writes {
        *counts.entry(w.kind()).or_insert(0) += 1;
    }
    PlanOutput {
        report,
        writes: counts,
        write_list: writes.then_some(plan.writes),
        notes,
    }
}

/// Run `plan`, printing to stdout. Fails (after printing the plan) when a fabric is invalid or
/// the files hold no fabric, so scripts and CI can gate on it.
pub async fn run(args: PlanArgs) -> anyhow::Result<()> {
    let out = if args.from_cluster {
        let config = kube::Config::infer().await.map_err(|e| {
            anyhow::anyhow!(
                "no Kubernetes configuration found: set KUBECONFIG (or create ~/.kube/config): {e}"
            )
        })?;
        let client = kube::Client::try_from(config)
            .context("failed to build a Kubernetes client from the configuration")?;
        plan_cluster(&client, &args).await?
    } else {
        plan_files(&args)?
    };
    for note in &out.notes {
        eprintln!("rocefabric-operator: note: {note}");
    }
    let text = match args.output {
        OutputFormat::Json => {
            serde_json::to_string_pretty(&out).context("cannot render the plan as JSON")? + "\n"
        }
        OutputFormat::Table => render_table(&out),
    };
    print!("{text}");
    verdict(&out.report)
}

/// An error when no fabric was given or any fabric is invalid.
pub fn verdict(report: &PlanReport) -> anyhow::Result<()> {
    let invalid: Vec<String> = report
        .fabrics
        .iter()
        .filter(|f| !f.valid)
        .map(|f| rocefabric_input::shown(&f.name))
        .collect();
    if report.fabrics.is_empty() {
        anyhow::bail!(
            "the --fabrics files hold no RoceFabric (nor the cluster, with --from-cluster)"
        );
    }
    if !invalid.is_empty() {
        anyhow::bail!(
            "{} of {} fabrics invalid: {}",
            invalid.len(),
            report.fabrics.len(),
            invalid.join(", ")
        );
    }
    Ok(())
}

/// Bytes as a binary quantity when whole (`1Gi`), else plain bytes.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes == 0 {
        return "0".into();
    }
    for (unit, shift) in UNITS {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Longest cell shown: a Kubernetes name (253) fits; longer text is cut, saying its length.
const MAX_CELL_CHARS: usize = 253;

/// Align columns: every row has the header's number of cells. Cells are escaped (a name with a
/// newline or terminal escape cannot forge a row) and cut to [`MAX_CELL_CHARS`].
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| shown_within(c, MAX_CELL_CHARS)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            text.push_str(cell);
            let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
            text.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(out, &mut header.iter().copied());
    for row in &rows {
        line(out, &mut row.iter().map(String::as_str));
    }
}

/// The human-readable form: a table each of the fabrics, the nodes, the regions and the pods
/// left waiting, then the RoceNodes deleted.
pub fn render_table(out: &PlanOutput) -> String {
    let r = &out.report;
    let mut s = String::new();
    fabrics_table(&mut s, r);
    s.push('\n');
    nodes_table(&mut s, r);
    s.push('\n');
    regions_table(&mut s, r);
    waiting_table(&mut s, r);
    if !r.deleted_roce_nodes.is_empty() {
        let _ = writeln!(
            s,
            "\nRoceNodes deleted: {}",
            shown_within(&r.deleted_roce_nodes.join(", "), 4 * MAX_CELL_CHARS)
        );
    }
    s
}

/// The fabrics, then each invalid fabric's errors.
fn fabrics_table(s: &mut String, r: &PlanReport) {
    let rows: Vec<Vec<String>> = r
        .fabrics
        .iter()
        .map(|f| {
            vec![
                f.name.clone(),
                if f.deleting {
                    "deleting".into()
                } else if f.valid {
                    "yes".into()
                } else {
                    "NO".into()
                },
                f.selected_nodes.to_string(),
                f.conflicting_nodes.to_string(),
                f.configured_nodes.to_string(),
                format!("{}/{}", f.regions_allocated, f.region_capacity),
                f.pods_waiting.to_string(),
                f.traffic_class
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        s,
        &[
            "FABRIC",
            "VALID",
            "SELECTED",
            "CONFLICTING",
            "CONFIGURED",
            "REGIONS",
            "PODS WAITING",
            "TC",
        ],
        &rows,
    );
    for f in r.fabrics.iter().filter(|f| !f.errors.is_empty()) {
        for e in &f.errors {
            let _ = writeln!(
                s,
                "  {}: {}: {}",
                shown_within(&f.name, MAX_CELL_CHARS),
                shown_within(&e.field, MAX_CELL_CHARS),
                shown_within(&e.message, 4 * MAX_CELL_CHARS)
            );
        }
    }
}

fn nodes_table(s: &mut String, r: &PlanReport) {
    if r.nodes.is_empty() {
        s.push_str("No node is selected by any fabric.\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .nodes
            .iter()
            .map(|n| {
                let action = match n.action {
                    NodeAction::Create => "create",
                    NodeAction::Update => "update",
                    NodeAction::Unchanged => "unchanged",
                    NodeAction::Waiting => "waits for rollout",
                    NodeAction::Untouched => "untouched (fabric invalid or deleting)",
                };
                let conflicts = if n.conflicts_with.is_empty() {
                    "-".to_string()
                } else {
                    n.conflicts_with.join(",")
                };
                vec![
                    n.name.clone(),
                    n.fabric.clone(),
                    action.to_string(),
                    conflicts,
                ]
            })
            .collect();
        table(
            s,
            &["NODE", "FABRIC", "ROCENODE", "ALSO SELECTED BY"],
            &rows,
        );
    }
}

fn regions_table(s: &mut String, r: &PlanReport) {
    if r.regions.is_empty() {
        s.push_str("No pod gets a region.\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .regions
            .iter()
            .map(|g| {
                vec![
                    g.namespace.clone(),
                    g.pod.clone(),
                    g.fabric.clone(),
                    g.id.to_string(),
                    format_bytes(g.base),
                    format_bytes(g.size),
                    format!("{:?}", g.change).to_lowercase(),
                ]
            })
            .collect();
        table(
            s,
            &["NAMESPACE", "POD", "FABRIC", "ID", "BASE", "SIZE", "REGION"],
            &rows,
        );
    }
}

/// The pods left waiting, if any (after an empty line).
fn waiting_table(s: &mut String, r: &PlanReport) {
    if !r.waiting_pods.is_empty() {
        s.push('\n');
        let rows: Vec<Vec<String>> = r
            .waiting_pods
            .iter()
            .map(|w| {
                vec![
                    w.namespace.clone(),
                    w.pod.clone(),
                    w.fabric.clone(),
                    w.reason.clone(),
                ]
            })
            .collect();
        table(s, &["NAMESPACE", "POD WAITING", "FABRIC", "WHY"], &rows);
    }
}

//! `rocefabric-operator plan`: the planner offline over YAML files of Kubernetes objects.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

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
    /// YAML file(s) of RoceFabric objects (`kubectl get rocefabrics -o yaml`, a List, multi-document
    /// YAML or a single object). Repeatable.
    #[arg(long = "fabrics", value_name = "FILE", required = true)]
    pub fabrics: Vec<PathBuf>,
    /// YAML file(s) of Node objects (`kubectl get nodes -o yaml`). Repeatable.
    #[arg(long = "nodes", value_name = "FILE", required = true)]
    pub nodes: Vec<PathBuf>,
    /// YAML file(s) of Pod objects (`kubectl get pods -A -o yaml`). Repeatable.
    #[arg(long = "pods", value_name = "FILE", required = true)]
    pub pods: Vec<PathBuf>,
    /// YAML file(s) of existing RoceNode objects (`kubectl get rocenodes -o yaml`). Repeatable.
    #[arg(long = "roce-nodes", value_name = "FILE")]
    pub roce_nodes: Vec<PathBuf>,
    /// `table` (default) or `json`.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// Run `plan`, printing to stdout.
pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let _ = args;
    Ok(())
}

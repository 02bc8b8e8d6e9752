//! Command line of `rocefabric-operator`: `run` (the controller) and `plan` (the planner offline
//! over YAML files).

use clap::{Parser, Subcommand};

pub mod plan;
pub mod run;

/// Reconciles RoceFabric objects into per-node QoS and per-pod shared memory regions.
#[derive(Debug, Parser)]
#[command(name = "rocefabric-operator", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator against the cluster (leader-elected; serves /healthz, /readyz, /metrics).
    Run(run::RunArgs),
    /// Plan offline over YAML files of Kubernetes objects: RoceNodes, conflicts, regions.
    Plan(plan::PlanArgs),
}

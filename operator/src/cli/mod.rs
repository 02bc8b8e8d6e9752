//! Command line of `rocefabric-operator`: `run` (the controller) and `plan` (the planner over
//! YAML files or the cluster's objects).

use clap::{Parser, Subcommand};

pub mod cluster;
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
    /// Plan over YAML files of Kubernetes objects, or the cluster's (`--from-cluster`):
    /// RoceNodes, conflicts, regions.
    Plan(plan::PlanArgs),
}

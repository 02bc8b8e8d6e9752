//! Command-line surface of the node daemon. Each subcommand lives in its own module.

pub mod agent;
pub mod discover;
pub mod qos;
pub mod serve;

use clap::{Parser, Subcommand};

/// rocefabric node daemon: RDMA HCA and GPU discovery, kubelet device plugin, RoCE QoS agent.
#[derive(Debug, Parser)]
#[command(name = "rocefabric-device-plugin", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the RoCE HCAs, GPUs and their PCIe topology found in sysfs.
    Discover(discover::Args),
    // Subcommands are added by their modules: discover, serve, qos, agent.
    /// Serve the HCAs and GPUs to the kubelet (device plugin API v1beta1, DRA, or both).
    Serve(Box<serve::ServeArgs>),
    /// Show or apply the lossless RoCE QoS of one netdev (DCB netlink, rtnetlink, driver files).
    Qos(qos::QosArgs),
    /// Run the node QoS agent: apply this node's RoceNode and report it (needs CAP_NET_ADMIN).
    Agent(agent::AgentArgs),
}

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Discover(args) => discover::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Qos(args) => qos::run(args),
        Command::Agent(args) => agent::run(args),
    }
}

//! `rocefabric-device-plugin`: the node daemon (discovery, kubelet device plugin, QoS agent).

use clap::Parser;
use rocefabric_device_plugin::cli::{Cli, run};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    run(cli)
}

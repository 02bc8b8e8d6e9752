//! `rocefabric-device-plugin`: the node daemon (discovery, kubelet device plugin, QoS agent).

use std::process::ExitCode;

use clap::Parser;
use rocefabric_device_plugin::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "rocefabric-device-plugin: error: {}",
                rocefabric_api::errors::one_line(error.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

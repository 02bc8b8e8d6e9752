//! `rocefabric-device-plugin`: the node daemon (discovery, kubelet device plugin, QoS agent).

use std::process::ExitCode;

use clap::Parser;
use rocefabric_device_plugin::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the whole context chain on one line; no backtrace for operators.
            eprintln!("rocefabric-device-plugin: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

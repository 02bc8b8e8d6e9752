//! `rocefabric-operator`: see `rocefabric-operator --help`.

use std::process::ExitCode;

use clap::Parser;
use rocefabric_operator::cli::{Cli, Command, plan, run};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => {
            run::init_tracing(args.log_format);
            run::run(args).await
        }
        Command::Plan(args) => {
            run::init_tracing(run::LogFormat::Text);
            plan::run(args).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "rocefabric-operator: error: {}",
                rocefabric_api::errors::one_line(error.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

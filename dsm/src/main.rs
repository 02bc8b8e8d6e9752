//! `rocefabric-dsm`: serve this pod's window, one-shot reads/writes/atomics, a scripted session,
//! and a latency/bandwidth probe of the fabric's windows.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}

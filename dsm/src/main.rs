//! `rocefabric-dsm`: serve this pod's window, one-shot reads/writes/atomics, a scripted session,
//! and a latency/bandwidth probe of the fabric's windows.

mod cli;

/// Counts allocations (`probe` reports those of the hot path).
#[global_allocator]
static ALLOC: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

fn main() -> std::process::ExitCode {
    cli::main()
}

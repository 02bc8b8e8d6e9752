//! End-to-end suites for rocefabric (tests live in `tests/`):
//! - `chart`: renders `charts/rocefabric` with the real Helm engine and asserts least privilege;
//! - `node`: the node daemon binary against the DGX fixture tree, a kubelet emulator over a real
//!   unix socket, and QoS on a veth pair in a network namespace the test creates;
//! - `cluster`: the chart on a real cluster, built from source by `e2e/cluster/up` (runs when
//!   `KUBECONFIG` points at a cluster; `ROCEFABRIC_REQUIRE_CLUSTER=1` makes a missing one a failure);
//! - `monitoring`: the chart's alert rules and dashboard name only metrics the binaries export,
//!   and each alert's runbook link is a row of the README's troubleshooting table (no Helm needed;
//!   the chart suite renders them and runs promtool);
//! - `snapshot`: `rocefabric-operator plan` over the example cluster snapshot of the README demo;
//! - `soft_roce`: the node daemon on a real RDMA stack, Soft-RoCE in qemu VMs booted from
//!   Debian's kernel (`e2e/vm/`; `ROCEFABRIC_REQUIRE_SOFT_ROCE=1` makes a missing qemu a failure).
//!
//! This library holds what the suites share: locating the workspace and the Helm engine, parsing
//! rendered manifests, and reporting a skipped test by name. It is not used by the product.

use std::io::Write as _;
use std::path::{Path, PathBuf};

pub mod bounded;
pub mod cluster;
pub mod helm;
pub mod manifests;
pub mod monitoring;
pub mod node;
pub mod vm;

/// The workspace root (the directory holding `Cargo.lock`, `crds/` and `charts/`).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| here.to_path_buf())
}

/// Where `.ci/promtool` and `.ci/helm-check` keep the tools they build, once per machine and
/// outside every checkout: `$ROCEFABRIC_CACHE`, else `~/.cache/rocefabric`.
pub fn tool_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("ROCEFABRIC_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/rocefabric")
}

/// `program` as a child that dies with the thread that starts it: under `setpriv --pdeathsig KILL`
/// (util-linux) where that exists, so a VM or daemon a test starts ends when the test process
/// does, even when it is SIGKILLed and no `Drop` runs. The signal follows the *thread*: start
/// the child on the thread that waits for it (every test does).
pub fn child_of_this_test(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let setpriv = Path::new("/usr/bin/setpriv");
    if setpriv.exists() {
        let mut cmd = std::process::Command::new(setpriv);
        cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
        cmd
    } else {
        std::process::Command::new(program)
    }
}

/// Report that `test` did not run, and why, as a line `SKIPPED: <what> (<reason>): <test>`.
///
/// Written straight to the process's stderr (not through `eprintln!`, which the test harness
/// captures), so the line shows in a plain `cargo test` run and a skip is never a silent pass.
pub fn skip(what: &str, reason: &str, test: &str) {
    let line = format!("SKIPPED: {what} ({reason}): {test}\n");
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(line.as_bytes());
    let _ = err.flush();
}

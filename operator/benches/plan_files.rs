//! `rocefabric-operator plan` over JSON lists the size of a large cluster's `kubectl get -o
//! json` (20,000 nodes and 200,000 pods by default, a tenth of them in the fabric): the whole
//! process's wall time and peak resident set, as `/usr/bin/time` reports them. Asserts no
//! timing (it fails only when `plan` fails).
//!
//! Run: `cargo bench -p rocefabric-operator --bench plan_files`. Sizes from `SCALE_NODES`,
//! `SCALE_PODS`, `SCALE_FABRIC_PODS`, `SCALE_NAMESPACES` (as the scale harness's objects);
//! `PLAN_BIN` runs another build of the binary on the same files (a before/after), `PLAN_DIR`
//! keeps the files there instead of a temporary directory.
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;
use rocefabric_operator_testing::scale::cluster::{GeneratedCluster, NodeState, Sizes};

const DEFAULT: Sizes = Sizes {
    nodes: 20_000,
    pods: 200_000,
    fabric_pods: 20_000,
    namespaces: 200,
};

/// A `kind: List` of `items`, written one object at a time.
fn write_list(path: &Path, n: u32, item: impl Fn(u32) -> String) -> anyhow::Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("create {path:?}"))?;
    let mut out = std::io::BufWriter::new(file);
    out.write_all(br#"{"apiVersion":"v1","kind":"List","items":["#)?;
    for i in 0..n {
        if i > 0 {
            out.write_all(b",")?;
        }
        out.write_all(item(i).as_bytes())?;
    }
    out.write_all(b"]}")?;
    out.flush()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let sizes = Sizes::from_env(DEFAULT)?;
    let cluster = GeneratedCluster::new(sizes);
    let temp = tempfile::tempdir()?;
    let dir = std::env::var_os("PLAN_DIR").map_or_else(|| temp.path().to_path_buf(), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    let (fabrics, nodes, pods) = (
        dir.join("fabrics.json"),
        dir.join("nodes.json"),
        dir.join("pods.json"),
    );
    std::fs::write(&fabrics, cluster.fabric().to_string())?;
    let node = NodeState {
        rv: 1,
        labels: None,
    };
    write_list(&nodes, sizes.nodes, |i| cluster.node_json(i, &node, false))?;
    write_list(&pods, sizes.pods, |i| {
        cluster.pod_json(i, &cluster.initial_pod(i, 1))
    })?;
    let mib = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len() >> 20);
    let bin = std::env::var_os("PLAN_BIN").map_or_else(
        || env!("CARGO_BIN_EXE_rocefabric-operator").into(),
        PathBuf::from,
    );
    let timer = Path::new("/usr/bin/time");
    let mut cmd = if timer.exists() {
        let mut c = Command::new(timer);
        c.args(["-f", "%M %e"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    cmd.arg("plan")
        .arg("--fabrics")
        .arg(&fabrics)
        .arg("--nodes")
        .arg(&nodes)
        .arg("--pods")
        .arg(&pods)
        .args(["--output", "json"])
        .stdout(std::process::Stdio::null());
    println!(
        "plan over {} nodes ({} MiB) and {} pods ({} MiB, {} in the fabric): {}",
        sizes.nodes,
        mib(&nodes),
        sizes.pods,
        mib(&pods),
        sizes.fabric_pods,
        bin.display()
    );
    let start = Instant::now();
    let out = cmd.output().context("run plan")?;
    let wall = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "plan failed: {stderr}");
    let peak = stderr
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok());
    println!(
        "  wall {:.2} s (target < 2 s), peak RSS {} (target < 1 GiB)",
        wall.as_secs_f64(),
        peak.map_or_else(
            || "unknown (no /usr/bin/time)".into(),
            |k| format!("{} MiB", k >> 10)
        )
    );
    Ok(())
}

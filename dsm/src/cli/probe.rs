//! `rocefabric-dsm probe`: one-sided latency (p50, p99) and bandwidth to each peer's window.

use std::io::Write;
use std::time::Instant;

use anyhow::Result;
use rocefabric_dsm::{Access, Dsm};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Pods to probe (default: every other window in the directory).
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Latency samples per peer and operation.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Bytes per request in the bandwidth runs (clamped to the window).
    #[arg(long, default_value_t = 65536)]
    size: u64,
    /// Requests per bandwidth run (posted 64 at a time).
    #[arg(long, default_value_t = 256)]
    requests: usize,
    /// Also measure writes. They rewrite the first bytes of each window with what was read there
    /// a moment before: run it on idle windows only.
    #[arg(long)]
    write: bool,
    /// table or json.
    #[arg(long, default_value = "table")]
    output: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    pod: String,
    node: Option<String>,
    read_p50_us: f64,
    read_p99_us: f64,
    /// Heap allocations per 8-byte read, connected (the hot path makes none).
    read_allocs_per_op: f64,
    read_mib_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    write_p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    write_p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    write_allocs_per_op: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    write_mib_s: Option<f64>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0.0)
}

/// The 8-byte latency (p50, p99 in microseconds) of `n` accesses at `addr`, and the heap
/// allocations each made.
fn latencies(dsm: &mut Dsm, addr: u64, n: usize, write: bool) -> Result<Latency> {
    let mut word = [0u8; 8];
    dsm.read(addr, &mut word)?; // connect outside the timing
    let mut samples = Vec::with_capacity(n);
    let counted = stats_alloc::Region::new(crate::ALLOC);
    for _ in 0..n {
        let t = Instant::now();
        if write {
            dsm.write(addr, &word)?;
        } else {
            dsm.read(addr, &mut word)?;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let allocs = counted.change().allocations;
    samples.sort_by(f64::total_cmp);
    Ok(Latency {
        p50: percentile(&samples, 0.5),
        p99: percentile(&samples, 0.99),
        allocs_per_op: allocs as f64 / n.max(1) as f64,
    })
}

struct Latency {
    p50: f64,
    p99: f64,
    allocs_per_op: f64,
}

fn bandwidth(dsm: &mut Dsm, addr: u64, size: u64, requests: usize, write: bool) -> Result<f64> {
    let mut bufs: Vec<Vec<u8>> = (0..64.min(requests))
        .map(|_| vec![0u8; size as usize])
        .collect();
    // Writes put back what is there.
    dsm.read(addr, &mut bufs[0])?;
    let first = bufs[0].clone();
    for b in bufs.iter_mut() {
        b.copy_from_slice(&first);
    }
    let t = Instant::now();
    let mut done = 0;
    while done < requests {
        let k = bufs.len().min(requests - done);
        let mut ops: Vec<Access<'_>> = if write {
            bufs[..k]
                .iter()
                .map(|b| Access::Write { addr, data: b })
                .collect()
        } else {
            bufs[..k]
                .iter_mut()
                .map(|b| Access::Read { addr, buf: b })
                .collect()
        };
        dsm.batch(&mut ops)?;
        done += k;
    }
    Ok((size as f64 * requests as f64) / t.elapsed().as_secs_f64() / (1u64 << 20) as f64)
}

pub fn run(dsm: &mut Dsm, args: &Args, out: &mut impl Write) -> Result<()> {
    let me = dsm.window().base;
    let peers: Vec<_> = dsm
        .directory()
        .entries()
        .iter()
        .filter(|e| {
            if args.peers.is_empty() {
                e.base != me
            } else {
                args.peers.contains(&e.pod)
            }
        })
        .cloned()
        .collect();
    anyhow::ensure!(
        !peers.is_empty(),
        "no peer to probe in the directory{}",
        if args.peers.is_empty() {
            String::new()
        } else {
            format!(" among {:?}", args.peers)
        }
    );
    let mut rows = Vec::new();
    for e in peers {
        let size = args.size.min(e.size).max(1);
        let read = latencies(dsm, e.base, args.iterations, false)?;
        let read_bw = bandwidth(dsm, e.base, size, args.requests, false)?;
        let (write, write_bw) = if args.write {
            let w = latencies(dsm, e.base, args.iterations, true)?;
            (
                Some(w),
                Some(bandwidth(dsm, e.base, size, args.requests, true)?),
            )
        } else {
            (None, None)
        };
        rows.push(Row {
            pod: e.pod,
            node: e.node,
            read_p50_us: read.p50,
            read_p99_us: read.p99,
            read_allocs_per_op: read.allocs_per_op,
            read_mib_s: read_bw,
            write_p50_us: write.as_ref().map(|w| w.p50),
            write_p99_us: write.as_ref().map(|w| w.p99),
            write_allocs_per_op: write.as_ref().map(|w| w.allocs_per_op),
            write_mib_s: write_bw,
        });
    }
    if args.output == "json" {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "POD",
        "NODE",
        "READ p50",
        "READ p99",
        "READ MiB/s",
        "WRITE p50",
        "WRITE p99",
        "WRITE MiB/s"
    )?;
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    for r in rows {
        writeln!(
            out,
            "{:<24} {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            r.pod,
            r.node.as_deref().unwrap_or("-"),
            f(Some(r.read_p50_us)),
            f(Some(r.read_p99_us)),
            f(Some(r.read_mib_s)),
            f(r.write_p50_us),
            f(r.write_p99_us),
            f(r.write_mib_s)
        )?;
    }
    Ok(())
}

//! Software overhead of the library over raw verbs, and batched vs unbatched throughput, on one
//! RDMA device (a bench binary: it needs an HCA, so it runs where one is, e.g. the Soft-RoCE VM:
//! `dsm/bench-vm`). Without `ROCEFABRIC_DSM_BENCH_HCA=DEVICE` it says so and exits.
//!
//! Both sides of every measurement use the same device in the same run: the raw loop posts one
//! 8-byte RDMA read on a queue pair connected to a second one in this process and waits for its
//! completion; the library loop calls `Dsm::read` of 8 bytes of this pod's own window (bounds
//! check, connection lookup, staging copy, the same post and wait).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rocefabric_dsm::transport::{Op, Work};
use rocefabric_dsm::verbs::{Hca, Mapping};
use rocefabric_dsm::{Access, Config, Dsm};

const N: usize = 2560;
const ROUNDS: usize = 40;

fn main() {
    let Ok(device) = std::env::var("ROCEFABRIC_DSM_BENCH_HCA") else {
        println!(
            "dsm bench: skipped (set ROCEFABRIC_DSM_BENCH_HCA=DEVICE and NCCL_IB_GID_INDEX; see dsm/bench-vm)"
        );
        return;
    };
    let gid: u32 = std::env::var("NCCL_IB_GID_INDEX")
        .ok()
        .and_then(|g| g.parse().ok())
        .unwrap_or(1);
    let hca = Hca::open(&device, 1, gid, 0).expect("open the HCA");

    // Raw verbs: two connected queue pairs, one registered target.
    let target = hca
        .register(&Arc::new(Mapping::anonymous(1 << 20).expect("map")), true)
        .expect("register");
    let staging = hca
        .register(&Arc::new(Mapping::anonymous(1 << 20).expect("map")), false)
        .expect("register");
    let (mut q1, mut q2) = (
        hca.queue_pair(128).expect("qp"),
        hca.queue_pair(128).expect("qp"),
    );
    let (a1, a2) = (q1.address(), q2.address());
    q1.connect(a2).expect("connect");
    q2.connect(a1).expect("connect");
    let read = Work {
        id: 0,
        op: Op::Read,
        offset: 0,
        len: 8,
        remote: target.mapping.addr(),
        rkey: target.rkey(),
    };

    // The library, on its own window through its own endpoint.
    let dir = tempfile::tempdir().expect("tempdir");
    let directory = dir.path().join("regions.json");
    std::fs::write(
        &directory,
        r#"[{"pod":"bench","podIP":"127.0.0.1","id":0,"base":0,"size":1048576,"uid":"u"}]"#,
    )
    .expect("write");
    let cfg = Config {
        pod: "bench".into(),
        uid: "u".into(),
        namespace: "bench".into(),
        key: rocefabric_dsm::auth::FabricKey::new(&[7; 32]).expect("a key"),
        window: rocefabric_dsm::RegionAssignment {
            fabric: "f".into(),
            id: 0,
            base: 0,
            size: 1 << 20,
            uid: Some("u".into()),
        },
        directory,
        hca: device.clone(),
        port: 1,
        gid_index: gid,
        traffic_class: 0,
        listen: "127.0.0.1:0".parse().expect("addr"),
        hugepages: None,
        refresh: Duration::from_secs(1),
        expose: true,
        limits: Default::default(),
    };
    let mut dsm = Dsm::open(cfg).expect("open the library");
    let mut word = [0u8; 8];
    dsm.read(0, &mut word).expect("connect");
    // The four measures in alternating rounds, so that drift of the (emulated) machine hits
    // all alike; each reports its median round.
    let mut rounds: [Vec<f64>; 4] = Default::default();
    for _ in 0..ROUNDS {
        rounds[0].push(time(N / ROUNDS, || {
            q1.post(&staging, &[read]).expect("post");
            let started = Instant::now();
            assert!(q1.complete(1, Duration::from_secs(10), started).is_empty());
        }));
        rounds[1].push(time(N / ROUNDS, || dsm.read(0, &mut word).expect("read")));
        rounds[2].push(time(N / ROUNDS, || {
            dsm.fetch_add(64, 1).expect("add");
        }));
        rounds[3].push(
            time(N / ROUNDS / 32, || {
                let mut ops: Vec<Access<'_>> = (0..32)
                    .map(|_| Access::FetchAdd {
                        addr: 64,
                        add: 1,
                        prev: 0,
                    })
                    .collect();
                dsm.batch(&mut ops).expect("batch");
            }) / 32.0,
        );
    }
    let [raw, lib, unbatched, batched] = rounds.map(median);

    println!(
        "dsm bench on {device} (gid {gid}), {N} operations each, median of {ROUNDS} alternating rounds"
    );
    println!("  8-byte read, raw verbs      {:>9.2} us/op", raw);
    println!(
        "  8-byte read, library        {:>9.2} us/op   ratio {:.2}x",
        lib,
        lib / raw
    );
    println!(
        "  fetch_add, unbatched        {:>9.0} op/s",
        1e6 / unbatched
    );
    println!(
        "  fetch_add, batches of 32    {:>9.0} op/s   {:.1}x",
        1e6 / batched,
        unbatched / batched
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Microseconds per call of `f`, over `n` calls.
fn time(n: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

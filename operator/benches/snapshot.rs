//! Loading a `kubectl get pods -A -o json|yaml` snapshot: heap and time per file size.
//!
//! Run: `cargo bench -p rocefabric-operator --bench snapshot` (`SNAPSHOT_MB=200` for the size
//! of the report; default 50). Pods are written as kubectl writes them (containers with
//! env and resources, managedFields, a last-applied-configuration annotation, status with
//! conditions and container statuses), about 5 KiB each. Memory is the peak heap above what was
//! live before the load (a counting global allocator), against the file's size.
#![allow(clippy::unwrap_used)] // a benchmark fails loudly

use std::io::Write as _;
use std::time::Instant;

use rocefabric_operator::snapshot::{Kind, Snapshot};
use serde_json::json;

#[global_allocator]
static HEAP: peak_alloc::PeakAlloc = peak_alloc::PeakAlloc;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn pod(i: usize) -> serde_json::Value {
    let container = |n: usize| {
        let env: Vec<_> = (0..12)
            .map(|e| json!({"name": format!("ENV_{e}"), "value": format!("value-{e}-{i}")}))
            .collect();
        json!({"name": format!("c{n}"), "image": "nvcr.io/nvidia/pytorch:25.01-py3",
            "command": ["torchrun", "--nnodes=128", "--nproc-per-node=8", "pretrain.py"],
            "env": env,
            "resources": {"limits": {"nvidia.com/gpu": "8", "rdma/hca": "8", "memory": "512Gi"},
                          "requests": {"nvidia.com/gpu": "8", "rdma/hca": "8", "memory": "512Gi"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "shm", "mountPath": "/dev/shm"}]})
    };
    let conditions: Vec<_> = ["Ready", "Initialized", "ContainersReady", "PodScheduled"]
        .iter()
        .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": "2026-12-02T12:00:05Z"}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("trainer-{i}"), "namespace": format!("team-{}", i % 100),
            "uid": format!("00000000-0000-0000-0000-{i:012}"), "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": "2026-12-02T12:00:01Z",
            "labels": {"app": "pretrain", "rocefabric.io/fabric": "training", "job": format!("job-{}", i / 8)},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}".repeat(20),
                "rocefabric.io/region": format!("{{\"fabric\":\"training\",\"id\":{i},\"base\":{},\"size\":1073741824}}", i << 30)},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:containers": {"k:{\"name\":\"c0\"}": {".": {}, "f:image": {}}}}}}]},
        "spec": {"containers": [container(0), container(1)], "nodeName": format!("node-{}", i / 8),
            "restartPolicy": "Never", "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}]},
        "status": {"phase": "Running", "podIP": format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
            "conditions": conditions,
            "containerStatuses": [{"name": "c0", "ready": true, "restartCount": 0, "image": "nvcr.io/nvidia/pytorch:25.01-py3", "imageID": "sha256:0123456789abcdef", "containerID": "containerd://abcdef", "state": {"running": {"startedAt": "2026-12-02T12:00:04Z"}}}]}})
}

fn write_list(path: &std::path::Path, target: u64, yaml: bool) -> usize {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut written = 0u64;
    let mut n = 0;
    if yaml {
        writeln!(out, "apiVersion: v1\nkind: List\nitems:").unwrap();
    } else {
        write!(out, "{{\"apiVersion\": \"v1\", \"items\": [").unwrap();
    }
    while written < target {
        let text = if yaml {
            let y = yaml_serde::to_string(&pod(n)).unwrap();
            let mut s = String::new();
            for (j, line) in y.lines().enumerate() {
                s.push_str(if j == 0 { "- " } else { "  " });
                s.push_str(line);
                s.push('\n');
            }
            s
        } else {
            format!(
                "{}{}",
                if n > 0 { ",\n" } else { "\n" },
                serde_json::to_string_pretty(&pod(n)).unwrap()
            )
        };
        out.write_all(text.as_bytes()).unwrap();
        written += text.len() as u64;
        n += 1;
    }
    if !yaml {
        write!(
            out,
            "\n], \"kind\": \"List\", \"metadata\": {{\"resourceVersion\": \"\"}}}}"
        )
        .unwrap();
    }
    out.flush().unwrap();
    n
}

fn main() {
    let mb: u64 = std::env::var("SNAPSHOT_MB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    println!(
        "{:<5} {:>10} {:>9} {:>12} {:>12} {:>8} {:>9}",
        "form", "file", "pods", "peak heap", "kept heap", "peak/file", "time"
    );
    for (yaml, form) in [(false, "json"), (true, "yaml")] {
        // YAML is parsed a document at a time; keep it smaller so the bench stays quick.
        let size = if yaml { (mb / 4).max(1) } else { mb } << 20;
        let path = dir.path().join(format!("pods.{form}"));
        let pods = write_list(&path, size, yaml);
        let file = std::fs::metadata(&path).unwrap().len();
        let before = HEAP.current_usage();
        HEAP.reset_peak_usage();
        let t = Instant::now();
        let mut snap = Snapshot::default();
        snap.load_file(&path, &[Kind::Pod]).unwrap();
        let took = t.elapsed();
        let peak = HEAP.peak_usage().saturating_sub(before) as u64;
        let kept = HEAP.current_usage().saturating_sub(before) as u64;
        assert_eq!(snap.pods.len(), pods);
        println!(
            "{form:<5} {:>10} {pods:>9} {:>12} {:>12} {:>8.2}x {:>8.2}s",
            mib(file),
            mib(peak),
            mib(kept),
            peak as f64 / file as f64,
            took.as_secs_f64()
        );
        drop(snap);
    }
}

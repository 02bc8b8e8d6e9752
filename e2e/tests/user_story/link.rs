//! Step 5: a link goes down. Pulling the fabric NIC's cable of one worker (its VM's qemu monitor:
//! `set_link fabric off`) takes rxe0's port down; the node daemon reports the HCA unhealthy and the
//! real kubelet's allocatable `rdma/hca` of that node drops, as `kubectl get node` shows. Plugged
//! back, it returns. The node stays Ready throughout (its own NIC is another one).

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::Value;

use crate::kube::{HCA_SHARES as SHARED, Story, WAIT, eventually};

/// The node's allocatable `rdma/hca`, as `kubectl get node -o json` reports it.
pub fn allocatable(story: &Story, node: &str) -> Option<String> {
    let n: Value = serde_json::from_str(
        &story
            .try_kubectl(&["get", "node", node, "-o", "json"])
            .ok()?,
    )
    .ok()?;
    n["status"]["allocatable"]["rdma/hca"]
        .as_str()
        .map(str::to_string)
}

/// One command on a worker VM's qemu monitor (human monitor protocol).
fn monitor(story: &Story, worker: &str, command: &str) {
    let path = story.local.worker_monitor(worker);
    let mut s = UnixStream::connect(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    s.write_all(format!("{command}\n").as_bytes())
        .expect("monitor write");
    // Read the banner and the command's echo, so it ran before the socket closes.
    let mut buf = [0u8; 4096];
    let mut seen = String::new();
    while !seen.contains(command) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    std::thread::sleep(Duration::from_millis(300));
}

/// The monitor is root's alone: an unprivileged user cannot even reach its directory.
fn monitor_refuses_others(story: &Story, worker: &str) {
    let dir = story.local.worker_monitor(worker);
    let dir = dir.parent().expect("the worker's directory");
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "ls",
        ])
        .arg(dir)
        .output()
        .expect("setpriv (util-linux)");
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "nobody must not reach {}: {out:?}",
        dir.display()
    );
}

pub fn link_down_drops_allocatable(story: &mut Story) {
    let node = story.workers[1].clone();
    let other = story.workers[0].clone();
    monitor_refuses_others(story, &node);
    let before = allocatable(story, &node).expect("rdma/hca allocatable");
    assert_eq!(before, SHARED, "{node}: one rxe, shared by {SHARED} pods");

    monitor(story, &node, "set_link fabric off");
    eventually(
        &format!("{node}'s allocatable rdma/hca drops to 0"),
        WAIT,
        || (allocatable(story, &node)? == "0").then_some(()),
    );
    assert_eq!(
        allocatable(story, &other).as_deref(),
        Some(SHARED),
        "{other} is untouched"
    );
    let ready = story.kubectl(&[
        "get",
        "node",
        &node,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    assert_eq!(
        ready.trim(),
        "True",
        "{node} stays Ready: only its fabric NIC is down"
    );

    monitor(story, &node, "set_link fabric on");
    eventually(
        &format!("{node}'s allocatable rdma/hca returns to {SHARED}"),
        WAIT,
        || (allocatable(story, &node)? == SHARED).then_some(()),
    );
}

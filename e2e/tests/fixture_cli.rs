//! `rocefabric-fixture`, as a user runs it before `discover --sysfs-root`: the named node's trees
//! are written, an unknown name lists the valid ones, and a directory in use is left alone.

#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::process::{Command, Output};

fn fixture(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocefabric-fixture"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn writes_the_named_node_for_discover() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("dgx");
    let out = fixture(&["dgx-h100", target.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rdma: Vec<_> = std::fs::read_dir(target.join("sys/class/infiniband"))
        .unwrap()
        .collect();
    assert_eq!(rdma.len(), 14, "8 compute, 4 storage ports, 2 irdma");
    assert!(target.join("dev/infiniband/rdma_cm").exists());
    assert!(target.join("dev/nvidia7").exists());
}

#[test]
fn an_unknown_name_lists_the_valid_ones_and_a_used_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = fixture(&["dgx-a100", dir.path().join("x").to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dgx-h100") && err.contains("vm-soft-roce"),
        "{err}"
    );

    std::fs::write(dir.path().join("mine"), b"keep").unwrap();
    let out = fixture(&["dgx-h100", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
    assert_eq!(std::fs::read(dir.path().join("mine")).unwrap(), b"keep");
}

//! `rocefabric-dsm` as a user runs it, where no RDMA device is needed to see the answer: flags it
//! refuses, a hex read too long to print, a `--file` that is not there (both before the HCA is
//! opened), and an HCA that this machine does not have (or a libibverbs it cannot load).

#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::path::Path;
use std::process::{Command, Output};

/// Run the CLI with this pod's inputs in `dir` (a window at 0x200000 and a directory holding it)
/// and the HCA `nosuch0`.
fn dsm(dir: &Path, args: &[&str]) -> Output {
    let region = dir.join("region");
    let directory = dir.join("regions.json");
    std::fs::write(
        &region,
        r#"{"fabric":"f","id":1,"base":2097152,"size":2097152,"uid":"u-a"}"#,
    )
    .unwrap();
    std::fs::write(
        &directory,
        r#"[{"pod":"a","podIP":"127.0.0.1","id":1,"base":2097152,"size":2097152,"uid":"u-a"}]"#,
    )
    .unwrap();
    let key = dir.join("key");
    if !key.exists() {
        std::fs::create_dir(&key).unwrap();
        std::fs::write(key.join("key"), [7u8; 32]).unwrap();
        std::fs::write(key.join("namespace"), "ns").unwrap();
    }
    Command::new(env!("CARGO_BIN_EXE_rocefabric-dsm"))
        .args(["--region", region.to_str().unwrap()])
        .args(["--key-dir", key.to_str().unwrap()])
        .args(["--directory", directory.to_str().unwrap()])
        .args([
            "--hca",
            "nosuch0",
            "--gid-index",
            "1",
            "--pod",
            "a",
            "--uid",
            "u-a",
        ])
        .args(args)
        .env_remove("NCCL_IB_HCA")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn write_takes_one_source_and_a_missing_file_is_named_before_any_hca() {
    let dir = tempfile::tempdir().unwrap();
    let out = dsm(
        dir.path(),
        &["write", "--addr", "a", "--hex", "01", "--file", "-"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
    let missing = dir.path().join("missing.bin");
    let out = dsm(
        dir.path(),
        &["write", "--addr", "a", "--file", missing.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!("rocefabric-dsm: --file {}:", missing.display())),
        "{err}"
    );
    assert!(!err.contains("nosuch0"), "the HCA was not opened: {err}");
}

#[test]
fn a_read_too_long_for_hex_asks_for_out_before_any_hca() {
    let dir = tempfile::tempdir().unwrap();
    let out = dsm(dir.path(), &["read", "--addr", "a", "--len", "1048576"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("--len 1048576") && err.contains("--out -"),
        "{err}"
    );
}

#[test]
fn an_hca_this_machine_does_not_have_is_named_with_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let out = dsm(dir.path(), &["read", "--addr", "a+8", "--len", "8"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    // Without rdma-core: the library it could not load. With it: no such device, or no device
    // list at all (no RDMA subsystem).
    assert!(
        err.starts_with(
            "rocefabric-dsm: HCA nosuch0: loading libibverbs: cannot load libibverbs.so.1"
        ) || err.starts_with("rocefabric-dsm: HCA \"nosuch0\": no such RDMA device")
            || err.starts_with("rocefabric-dsm: HCA nosuch0: listing RDMA devices"),
        "{err}"
    );
}

#[test]
fn a_pod_without_the_fabric_key_is_told_which_secret_to_mount() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("key")).unwrap();
    let out = dsm(dir.path(), &["read", "--addr", "a", "--len", "8"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("cannot read the fabric key (mount the Secret f-key read-only at"),
        "{err}"
    );
    std::fs::write(dir.path().join("key/key"), [1u8; 8]).unwrap();
    std::fs::write(dir.path().join("key/namespace"), "ns").unwrap();
    let err = stderr(&dsm(dir.path(), &["read", "--addr", "a", "--len", "8"]));
    assert!(
        err.contains("8 bytes: a fabric key has at least 32"),
        "{err}"
    );
}

#[test]
fn an_endpoint_cap_that_is_not_a_positive_number_is_named_before_any_hca() {
    let dir = tempfile::tempdir().unwrap();
    let out = dsm(dir.path(), &["serve", "--max-peers", "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(r#"ROCEFABRIC_DSM_MAX_PEERS "0": must be at least 1"#),
        "{err}"
    );
    assert!(!err.contains("nosuch0"), "the HCA was not opened: {err}");
    let out = dsm(dir.path(), &["serve", "--max-peers-per-source", "many"]);
    let err = stderr(&out);
    assert!(
        err.contains(r#"ROCEFABRIC_DSM_MAX_PEERS_PER_SOURCE "many": not a number"#),
        "{err}"
    );
}

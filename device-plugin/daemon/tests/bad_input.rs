//! Bad input never hurts (issue 15), as a user meets it through the binary: a FIFO, a huge value or
//! a malformed one in a sysfs tree, a config file that never ends or names a key twice, a sysfs root
//! without `class/infiniband`. Each case ends with a message naming the file (and the key, line or
//! field) and the right exit status.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rocefabric_node_testing::fixtures::{self, FixtureNode, write_variant};
use serde_json::Value;

/// Only reached when the binary hangs (before the fix, a FIFO in the tree blocked discovery
/// forever): a failing test then ends instead of hanging CI. No test passes or fails on timing.
const HANG: Duration = Duration::from_secs(60);

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// The binary with `args`, its output captured in files (no pipe to fill), killed after [`HANG`].
fn run(args: &[&str]) -> Run {
    let out = tempfile::tempdir().unwrap();
    let (so, se) = (out.path().join("stdout"), out.path().join("stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocefabric-device-plugin"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{args:?} still running after {HANG:?}: {}",
                std::fs::read_to_string(&se).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code(),
        stdout: std::fs::read_to_string(&so).unwrap(),
        stderr: std::fs::read_to_string(&se).unwrap(),
    }
}

fn dgx_tree() -> tempfile::TempDir {
    let dir = fixtures::tempdir().unwrap();
    FixtureNode::dgx_h100().write_to(dir.path()).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_fifo_a_device_or_a_huge_value_in_sysfs_skips_that_device_naming_the_file() {
    let dir = dgx_tree();
    let ib = dir.path().join("class/infiniband");
    fixtures::replace_with_fifo(&ib.join("mlx5_0/ports/1/state")).unwrap();
    std::fs::write(ib.join("mlx5_1/device/numa_node"), "1".repeat(1 << 20)).unwrap();
    let zero = ib.join("mlx5_3/ports/1/link_layer");
    std::fs::remove_file(&zero).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    // Readable (under 16 KiB) but malformed and long: quoted cut, never whole.
    std::fs::write(
        ib.join("mlx5_2/device/vendor"),
        format!("0x{}", "f".repeat(5000)),
    )
    .unwrap();

    let r = run(&["discover", "--sysfs-root", s(dir.path()), "-o", "json"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    let names: Vec<&str> = v["hcas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 10, "{names:?}");
    for skipped in ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"] {
        assert!(!names.contains(&skipped), "{skipped} listed: {names:?}");
    }
    assert_eq!(v["gpus"].as_array().unwrap().len(), 8, "GPUs unaffected");

    let err = &r.stderr;
    let fifo = format!(
        "{} is a FIFO, not a regular file",
        ib.join("mlx5_0/ports/1/state").display()
    );
    assert!(err.contains(&fifo), "{err}");
    let device = format!(
        "{} is a character device, not a regular file",
        zero.display()
    );
    assert!(err.contains(&device), "{err}");
    assert!(
        err.contains("numa_node is larger than the 16 KiB limit"),
        "{err}"
    );
    assert!(err.contains("…(5002 bytes)"), "{err}");
    // Neither the 1 MiB value nor the 5000-character one reaches the log whole.
    assert!(!err.contains(&"1".repeat(100)), "huge value copied");
    assert!(!err.contains(&"f".repeat(100)), "long value copied");
    assert!(err.len() < 16 * 1024, "{} bytes of warnings", err.len());
}

#[test]
fn discover_without_a_readable_rdma_class_fails_naming_path_and_cause() {
    let dir = fixtures::tempdir().unwrap();
    FixtureNode::variant("dgx-h100-no-rdma")
        .unwrap()
        .write_to(dir.path())
        .unwrap();
    let class = dir.path().join("class/infiniband");

    // Present and empty: nothing registered, and that is the answer.
    let r = run(&["discover", "--sysfs-root", s(dir.path())]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.starts_with("RoCE HCAs\n  (none)\n"),
        "{}",
        r.stdout
    );

    std::fs::remove_dir(&class).unwrap();
    let r = run(&["discover", "--sysfs-root", s(dir.path())]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(
        r.stderr.trim_end(),
        format!(
            "rocefabric-device-plugin: error: cannot read {}: No such file or directory (os error 2): \
             no RDMA devices are registered (is the RDMA stack loaded?)",
            class.display()
        )
    );
    assert!(r.stdout.is_empty(), "no table: {}", r.stdout);

    std::fs::write(&class, "").unwrap();
    let r = run(&["discover", "--sysfs-root", s(dir.path())]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(
        r.stderr.contains(&format!(
            "cannot read {}: Not a directory (os error 20)",
            class.display()
        )),
        "{}",
        r.stderr
    );
}

#[test]
fn config_files_are_capped_at_1_mib() {
    let r = run(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100").unwrap().arg(),
        "--config",
        "/dev/zero",
    ]);
    assert_eq!(r.code, Some(1));
    assert_eq!(
        r.stderr.trim_end(),
        "rocefabric-device-plugin: error: cannot load config: /dev/zero is larger than the 1 MiB limit"
    );
    // Read (and refused) before any netlink socket: runs anywhere.
    let r = run(&[
        "qos",
        "apply",
        "--netdev",
        "lo",
        "--config",
        "/dev/zero",
        "--dry-run",
    ]);
    assert_eq!(r.code, Some(1));
    assert_eq!(
        r.stderr.trim_end(),
        "rocefabric-device-plugin: error: /dev/zero is larger than the 1 MiB limit"
    );
}

#[test]
fn a_key_given_twice_is_refused_naming_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let q = dir.path().join("q.yaml");
    std::fs::write(&q, "roceDscp: 26\nroceDscp: 30\n").unwrap();
    let r = run(&[
        "qos",
        "apply",
        "--netdev",
        "lo",
        "--config",
        s(&q),
        "--dry-run",
    ]);
    assert_eq!(r.code, Some(1));
    assert!(r.stdout.is_empty(), "nothing planned: {}", r.stdout);
    assert_eq!(
        r.stderr.trim_end(),
        format!(
            "rocefabric-device-plugin: error: {}: invalid YAML: document 1: duplicate key \"roceDscp\" at line 2",
            q.display()
        )
    );

    let c = dir.path().join("config.yaml");
    std::fs::write(&c, "hca:\n  sharedReplicas: 2\nhca:\n  sharedReplicas: 4\n").unwrap();
    let r = run(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100").unwrap().arg(),
        "--config",
        s(&c),
    ]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.stderr
            .contains("config.yaml: invalid YAML: document 1: duplicate key \"hca\" at line 3"),
        "{}",
        r.stderr
    );
}

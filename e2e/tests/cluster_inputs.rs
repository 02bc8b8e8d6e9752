//! `e2e/cluster/up` on a machine without the packages the workload image needs: its checks run in
//! a mount namespace of this test's where libibverbs, the rxe and mlx5 providers, perftest and
//! runc are hidden (tmpfs over their directories, `/dev/null` over their files) and `apt-get`
//! always fails. `up --check` must exit 1 naming each missing input and its Debian package, and
//! `up --build` must try to install exactly those packages, then fail naming them, before it
//! builds anything (it used to print the failure from a subshell, carry on and import a workload
//! image without them).
//!
//! Needs root and `unshare` (util-linux); without them the test prints `SKIPPED: cluster inputs
//! (<reason>): <test>`, and under `ROCEFABRIC_REQUIRE_CLUSTER=1` (`.ci/run`, as root) that is a
//! failure.

use std::process::Command;

use rocefabric_e2e::{cluster, skip, workspace_root};

const VERBS_LIB: &str = "/usr/lib/x86_64-linux-gnu";

/// Shell that hides the inputs in this (already unshared) mount namespace, then runs `up` with
/// the arguments given to it.
const HIDE_AND_RUN: &str = r#"
set -e
mount --make-rprivate /
for d in /etc/libibverbs.d "$VERBS_LIB/libibverbs"; do mkdir -p "$d" 2>/dev/null || true; mount -t tmpfs none "$d"; done
for f in "$VERBS_LIB/libibverbs.so.1" $(for p in ib_read_lat ib_write_lat ib_read_bw ib_write_bw runc; do command -v $p || true; done); do
  [ -e "$f" ] && mount --bind /dev/null "$f"
done
stub=$(mktemp); printf '#!/bin/sh\necho "apt-get: no package sources here" >&2\nexit 100\n' >"$stub"; chmod 755 "$stub"
for a in $(command -v apt-get || echo /usr/bin/apt-get); do [ -e "$a" ] && mount --bind "$stub" "$a"; done
set +e
"$UP" "$@"
"#;

/// Why this machine cannot run the test, if it cannot.
fn unavailable() -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    // /proc/self belongs to the process's effective uid.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root {
        return Some("needs root for a mount namespace".into());
    }
    let probe = Command::new("unshare").args(["-m", "true"]).status();
    match probe {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!("unshare -m true: {s}")),
        Err(e) => Some(format!("unshare: {e}")),
    }
}

/// `up ARGS` in a namespace without the inputs: (exit status, stdout + stderr).
fn up_without_inputs(args: &[&str]) -> (Option<i32>, String) {
    let up = workspace_root().join("e2e/cluster/up");
    let out = Command::new("unshare")
        .args(["-m", "bash", "-c", HIDE_AND_RUN, "up"])
        .args(args)
        .env("UP", &up)
        .env("VERBS_LIB", VERBS_LIB)
        .output()
        .expect("unshare runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

const NAMED: [&str; 6] = [
    "libibverbs.so.1 for the workload image (Debian package libibverbs1)",
    "the rxe provider's driver file (Debian package ibverbs-providers)",
    "the mlx5 provider (Debian package ibverbs-providers)",
    "ib_write_lat (Debian package perftest)",
    "ib_read_bw (Debian package perftest)",
    "runc (Debian package runc)",
];

/// The one line of `out` that fails naming what is missing; it names every input in [`NAMED`].
fn names_every_missing_input(out: &str) -> &str {
    let line = out
        .lines()
        .find(|l| l.starts_with("== cluster: FAILED: missing: "))
        .unwrap_or_else(|| panic!("one line names what is missing:\n{out}"));
    for named in NAMED {
        assert!(line.contains(named), "{named:?} in {line}");
    }
    line
}

fn available(test: &str) -> bool {
    match unavailable() {
        None => true,
        Some(reason) if cluster::required() => {
            panic!(
                "{test}: skipped although {} is set: {reason}",
                cluster::REQUIRE_ENV
            )
        }
        Some(reason) => {
            skip("cluster inputs", &reason, test);
            false
        }
    }
}

#[test]
fn up_check_names_every_missing_input_and_its_package() {
    if !available("up_check_names_every_missing_input_and_its_package") {
        return;
    }
    let (code, out) = up_without_inputs(&["--check"]);
    assert_eq!(code, Some(1), "up --check fails:\n{out}");
    let line = names_every_missing_input(&out);
    assert!(
        !line.contains("openssl") && !line.contains("iptables"),
        "only what is missing: {line}"
    );
}

#[test]
fn up_installs_the_missing_packages_or_fails_naming_them_before_building() {
    if !available("up_installs_the_missing_packages_or_fails_naming_them_before_building") {
        return;
    }
    let (code, out) = up_without_inputs(&["--build"]);
    assert_eq!(code, Some(1), "up --build fails:\n{out}");
    assert!(
        out.contains("== cluster: installing ibverbs-providers libibverbs1 perftest runc"),
        "it tries to install exactly the missing packages:\n{out}"
    );
    assert!(out.contains("apt-get: no package sources here"), "{out}");
    names_every_missing_input(&out);
    assert!(
        !out.contains("go build") && !out.contains("cargo build"),
        "nothing is built:\n{out}"
    );
}

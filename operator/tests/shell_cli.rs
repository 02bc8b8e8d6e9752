//! `rocefabric-operator run` as a user starts it: flags, and a clean failure without a cluster.

use std::process::{Command, Stdio};

fn operator() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rocefabric-operator"));
    cmd.stdin(Stdio::null());
    cmd
}

#[test]
fn run_without_any_kubernetes_configuration_fails_with_a_clear_message() {
    let home = tempfile::tempdir().expect("temp home");
    let out = operator()
        .args(["run", "--http-addr", "127.0.0.1:0", "--log-format", "json"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home.path())
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(1), "exit status");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: no Kubernetes configuration found"),
        "stderr: {stderr}"
    );
    assert!(stderr.contains("KUBECONFIG"), "says what to set: {stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn run_with_a_missing_kubeconfig_file_names_it() {
    let home = tempfile::tempdir().expect("temp home");
    let missing = home.path().join("nope.yaml");
    let out = operator()
        .args(["run", "--http-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &missing)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home.path())
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no Kubernetes configuration found"),
        "stderr: {stderr}"
    );
}

#[test]
fn run_help_lists_the_documented_flags() {
    let out = operator()
        .args(["run", "--help"])
        .output()
        .expect("binary runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--lease-name",
        "--lease-namespace",
        "--identity",
        "--http-addr",
        "--log-format",
        "[env: POD_NAMESPACE=]",
        "[env: POD_NAME=]",
        "[default: rocefabric-operator]",
        "[default: 0.0.0.0:8080]",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn bad_log_format_is_rejected_naming_the_value() {
    let out = operator()
        .args(["run", "--log-format", "xml"])
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("xml") && stderr.contains("--log-format"),
        "{stderr}"
    );
}

#[test]
fn a_bad_pod_label_selector_is_rejected_naming_the_value() {
    let out = operator()
        .args(["run", "--pod-label-selector", "app;rm"])
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("app;rm") && stderr.contains("--pod-label-selector"),
        "{stderr}"
    );
}

fn http_get(addr: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    raw.split_whitespace().nth(1)?.parse().ok()
}

/// With a kubeconfig whose API server refuses connections, the operator still serves
/// `/healthz`, is not ready (its caches cannot sync), logs JSON, and exits 0 on SIGTERM.
#[test]
fn run_serves_health_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n    namespace: ops\n\
         current-context: c\nusers:\n- name: u\n  user:\n    token: t\n",
    )
    .expect("write kubeconfig");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = operator()
        .args([
            "run",
            "--http-addr",
            &addr,
            "--log-format",
            "json",
            "--identity",
            "op-test",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let mut healthy = None;
    for _ in 0..250 {
        healthy = http_get(&addr, "/healthz");
        if healthy.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(healthy, Some(200), "/healthz answers");
    assert_eq!(
        http_get(&addr, "/readyz"),
        Some(503),
        "not ready without synced caches"
    );
    assert_eq!(http_get(&addr, "/metrics"), Some(200));

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let mut exited = None;
    for _ in 0..250 {
        if let Some(s) = child.try_wait().expect("wait") {
            exited = Some(s);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let Some(exit) = exited else {
        let _ = child.kill();
        panic!("did not exit within 5 s of SIGTERM");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert!(exit.success(), "exit {exit:?}; stderr:\n{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {l}"))
        })
        .collect();
    let messages: Vec<&str> = lines.iter().filter_map(|l| l["message"].as_str()).collect();
    assert!(
        messages.contains(&"starting rocefabric-operator"),
        "{messages:?}"
    );
    assert!(messages.contains(&"shutting down"), "{messages:?}");
    let start = lines
        .iter()
        .find(|l| l["message"] == "starting rocefabric-operator")
        .expect("start line");
    assert_eq!(start["identity"], "op-test");
    assert_eq!(
        start["namespace"], "ops",
        "lease namespace from the kubeconfig context"
    );
}

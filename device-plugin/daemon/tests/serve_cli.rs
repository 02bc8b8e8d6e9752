//! `rocefabric-device-plugin serve` driven as a user (or the DaemonSet) runs it: the built binary,
//! a fixture sysfs tree and the kubelet emulator.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use rocefabric_node_testing::fixtures::{self, FixtureNode};
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;

const WAIT: Duration = Duration::from_secs(10);

fn serve_command(sysfs: &Path, plugin_dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rocefabric-device-plugin"));
    cmd.arg("serve")
        .arg("--sysfs-root")
        .arg(sysfs)
        .arg("--dev-root")
        .arg(plugin_dir.parent().unwrap_or(plugin_dir))
        .arg("--plugin-dir")
        .arg(plugin_dir)
        .args(extra)
        // No cluster: no node name from the environment, no kubeconfig, not in a pod.
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", plugin_dir.parent().unwrap_or(plugin_dir))
        .env("RUST_LOG", "info");
    cmd
}

/// Only reached when `serve` does not exit by itself (before the fix it retried forever): the
/// failing test then ends instead of hanging CI. No test passes or fails on timing.
const HANG: Duration = Duration::from_secs(60);

/// Run `cmd` to its end, its output in files (no pipe to fill); killed after [`HANG`].
fn output_within_hang(mut cmd: Command) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = dir.path().join("stderr");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("run binary");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "serve still running after {HANG:?}: {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code(),
        std::fs::read_to_string(&err).expect("stderr"),
    )
}

fn run_with_config(yaml: &str) -> Output {
    let dir = fixtures::tempdir().expect("temp dir");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, yaml).expect("write config");
    let plugin_dir = dir.path().join("plugins");
    let mut cmd = serve_command(&dir.path().join("sys"), &plugin_dir, &[]);
    cmd.arg("--config").arg(&config);
    let out = cmd.stdin(Stdio::null()).output().expect("run binary");
    assert!(
        !plugin_dir.exists()
            || std::fs::read_dir(&plugin_dir).is_ok_and(|mut d| d.next().is_none()),
        "a rejected config must not leave sockets behind"
    );
    out
}

#[test]
fn a_bad_config_is_rejected_at_start_naming_field_and_value() {
    for (yaml, field, value) in [
        ("hca:\n  sharedReplicas: 0\n", "hca.sharedReplicas", "0"),
        ("pollInterval: 0s\n", "pollInterval", "0s"),
        ("gpu:\n  resourceName: gpu\n", "gpu.resourceName", "\"gpu\""),
        (
            "hca:\n  selector:\n    vendors: [\"mellanox\"]\n",
            "hca.selector.vendors",
            "mellanox",
        ),
    ] {
        let out = run_with_config(yaml);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted {yaml:?}");
        assert!(
            stderr.contains(field) && stderr.contains(value),
            "{yaml:?}: {stderr}"
        );
    }
}

#[test]
fn a_missing_config_file_is_named() {
    let dir = fixtures::tempdir().expect("temp dir");
    let missing = dir.path().join("nope.yaml");
    let mut cmd = serve_command(dir.path(), &dir.path().join("plugins"), &[]);
    let out = cmd
        .arg("--config")
        .arg(&missing)
        .output()
        .expect("run binary");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.yaml"));
}

#[test]
fn an_enabled_qos_gate_needs_the_node_name_and_the_api() {
    let dir = fixtures::tempdir().expect("temp dir");
    let sysfs = dir.path().join("sys");
    FixtureNode::dgx_h100().write_to(&sysfs).expect("fixture");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "qosGate: enabled\n").expect("config");
    let plugin_dir = dir.path().join("plugins");

    let out = serve_command(&sysfs, &plugin_dir, &[])
        .arg("--config")
        .arg(&config)
        .output();
    let out = out.expect("run binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("qosGate = enabled") && stderr.contains("--node-name"),
        "{stderr}"
    );

    let out = serve_command(&sysfs, &plugin_dir, &["--node-name", "dgx-01"])
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("qosGate = enabled needs the Kubernetes API"),
        "{stderr}"
    );
}

/// Kill the child on drop so a failing test leaves no daemon behind.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plain HTTP/1.1 GET on loopback; the whole response as text.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to metrics");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    response
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    assert!(status.is_ok_and(|s| s.success()), "kill -TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_registers_serves_and_cleans_up_on_sigterm() {
    let dir = fixtures::tempdir().expect("temp dir");
    let sysfs = dir.path().join("sys");
    FixtureNode::dgx_h100().write_to(&sysfs).expect("fixture");
    let plugin_dir = dir.path().join("plugins");
    let kubelet = KubeletEmulator::start(&plugin_dir).await.expect("emulator");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "pollInterval: 50ms\ntrafficClass: 106\ngpu:\n  enabled: true\n",
    )
    .expect("config");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let mut cmd = serve_command(
        &sysfs,
        &plugin_dir,
        &["--node-name", "dgx-01", "--metrics-addr", &metrics_addr],
    );
    cmd.arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut daemon = Daemon(cmd.spawn().expect("spawn serve"));

    let resources = ["rdma/hca", "nvidia.com/gpu"];
    kubelet
        .wait_for_resources(&resources, WAIT)
        .await
        .expect("registered by the binary");
    let response = kubelet
        .allocate("rdma/hca", &["0000:18:00.0"])
        .await
        .expect("allocate");
    assert_eq!(response.envs["NCCL_IB_HCA"], "=mlx5_0:1");
    assert_eq!(response.envs["NCCL_IB_TC"], "106");

    // A link goes down under the running binary.
    fixtures::set_port_state(&sysfs, "mlx5_0", 1, false).expect("link down");
    kubelet
        .wait_for_devices("rdma/hca", WAIT, |d| {
            d.iter()
                .any(|d| d.id == "0000:18:00.0" && d.health == "Unhealthy")
        })
        .await
        .expect("Unhealthy reported");

    let metrics = http_get(&metrics_addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains(
            r#"rocefabric_device_plugin_devices{resource="rdma/hca",health="Unhealthy"} 1"#
        ),
        "{metrics}"
    );
    assert!(http_get(&metrics_addr, "/healthz").ends_with("ok"));

    sigterm(&daemon.0);
    let mut status = None;
    for _ in 0..200 {
        if let Some(s) = daemon.0.try_wait().expect("wait") {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let status = status.expect("exited within 5 s of SIGTERM");
    assert!(status.success(), "{status}");
    let left: Vec<String> = std::fs::read_dir(&plugin_dir)
        .expect("plugin dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("rocefabric-"))
        .collect();
    assert!(left.is_empty(), "sockets left after SIGTERM: {left:?}");
    assert!(
        plugin_dir.join("kubelet.sock").exists(),
        "the kubelet's socket is not ours to remove"
    );
}

/// A plugin directory where no socket can be created ends `serve` after `--start-attempts`, with
/// the cause as its last word: here a path too long for a unix socket, which no privilege gets
/// around.
#[test]
fn an_unusable_plugin_directory_ends_serve_with_the_cause() {
    let dir = fixtures::tempdir().expect("temp dir");
    let sysfs = dir.path().join("sys");
    FixtureNode::dgx_h100().write_to(&sysfs).expect("fixture");
    let plugin_dir = dir.path().join("p".repeat(120));
    let (code, stderr) = output_within_hang(serve_command(
        &sysfs,
        &plugin_dir,
        &["--start-attempts", "2"],
    ));
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some(
            format!(
                "rocefabric-device-plugin: error: cannot serve rdma/hca after 2 attempts: cannot \
                 create socket {}: path must be shorter than SUN_LEN",
                plugin_dir.join("rocefabric-rdma_hca.sock").display()
            )
            .as_str()
        )
    );
    assert!(!stderr.contains("remove old socket"), "{stderr}");
}

/// The reported case: a read-only plugin directory. `unlink` of a socket that is not there fails
/// with EROFS there, which `serve` used to report as "failed to remove old socket" while retrying
/// forever. Making a read-only mount needs a mount namespace (`unshare -m`: root or unprivileged
/// user namespaces); the test says it is skipped otherwise.
#[test]
fn a_read_only_plugin_directory_names_the_real_cause() {
    if !Command::new("unshare")
        .args(["-m", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("a_read_only_plugin_directory_names_the_real_cause: skipped (no `unshare -m`)");
        return;
    }
    let dir = fixtures::tempdir().expect("temp dir");
    let sysfs = dir.path().join("sys");
    FixtureNode::dgx_h100().write_to(&sysfs).expect("fixture");
    let plugin_dir = dir.path().join("plugins");
    std::fs::create_dir(&plugin_dir).expect("plugin dir");
    let serve = serve_command(&sysfs, &plugin_dir, &["--start-attempts", "2"]);
    // Mounted in a private mount namespace: gone with the process.
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "sh",
        "-c",
        r#"mount -t tmpfs -o ro none "$0" && exec "$@""#,
    ])
    .arg(&plugin_dir)
    .arg(serve.get_program())
    .args(serve.get_args())
    .env_remove("NODE_NAME")
    .env_remove("KUBECONFIG")
    .env_remove("KUBERNETES_SERVICE_HOST")
    .env_remove("KUBERNETES_SERVICE_PORT")
    .env("RUST_LOG", "info");
    let (code, stderr) = output_within_hang(cmd);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some(
            format!(
                "rocefabric-device-plugin: error: cannot serve rdma/hca after 2 attempts: cannot \
                 create socket {}: Read-only file system (os error 30)",
                plugin_dir.join("rocefabric-rdma_hca.sock").display()
            )
            .as_str()
        )
    );
    assert!(!stderr.contains("remove old socket"), "{stderr}");
}

//! The daemon's life: kubelet and plugin restarts, deleted and stale sockets, registration
//! retries, the limits after which it exits, and the metrics that count all of it.

use std::time::{Duration, Instant};

use rocefabric_node_testing::fixtures;
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;

use crate::ALL;
use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_makes_every_resource_register_again_promptly() {
    let node = Node::dgx();
    let (mut kubelet, daemon) = start(&node, all_config(), &ALL).await;

    let restarted = Instant::now();
    kubelet.restart().await.expect("kubelet restart");
    // The daemon's fallback liveness check is set to an hour: only the inotify watch can make
    // this happen within the wait.
    let snapshot = kubelet
        .wait_for_resources(&ALL, WAIT)
        .await
        .expect("re-registered and listed");
    let elapsed = restarted.elapsed();
    assert_eq!(snapshot.generation, 1);
    for resource in ALL {
        let r = snapshot.registered()[resource];
        assert!(r.at >= restarted);
        assert!(
            node.plugin_dir.join(&r.request.endpoint).exists(),
            "socket recreated"
        );
    }
    assert!(
        elapsed < Duration::from_secs(2),
        "re-registration took {elapsed:?}"
    );
    // The new kubelet sees the devices and can allocate (a storage port: no GPU's rail).
    let response = kubelet
        .allocate(HCA, &["0000:29:00.0"])
        .await
        .expect("allocate after restart");
    assert_eq!(response.envs["NCCL_IB_HCA"], "=mlx5_1:1");
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_socket_of_ours_is_served_again() {
    let node = Node::dgx();
    let (kubelet, daemon) = start(&node, all_config(), &ALL).await;
    let socket = node.plugin_dir.join("rocefabric-rdma_hca.sock");
    std::fs::remove_file(&socket).expect("delete socket");
    kubelet
        .wait_until(WAIT, |s| {
            s.registrations
                .iter()
                .filter(|r| r.request.resource_name == HCA)
                .count()
                == 2
        })
        .await
        .expect("registered again");
    assert!(socket.exists());
    assert!(kubelet.allocate(HCA, &["0000:29:00.0"]).await.is_ok());
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_restart_replaces_its_stale_sockets() {
    let node = Node::dgx();
    std::fs::create_dir_all(&node.plugin_dir).expect("plugin dir");
    // A socket left by a killed earlier run (bound, never unlinked), one of a renamed resource,
    // and another plugin's socket that must be left alone.
    let stale = node.plugin_dir.join("rocefabric-rdma_hca.sock");
    let renamed = node.plugin_dir.join("rocefabric-example.com_old.sock");
    let foreign = node.plugin_dir.join("nvidia-gpu.sock");
    for path in [&stale, &renamed, &foreign] {
        drop(std::os::unix::net::UnixListener::bind(path).expect("bind"));
    }
    assert!(
        std::os::unix::net::UnixStream::connect(&stale).is_err(),
        "stale: nobody answers"
    );

    let (kubelet, daemon) = start(&node, all_config(), &ALL).await;
    assert!(
        kubelet
            .snapshot()
            .registrations
            .iter()
            .all(|r| r.accepted())
    );
    assert!(
        std::os::unix::net::UnixStream::connect(&stale).is_ok(),
        "served again"
    );
    assert!(!renamed.exists(), "stale socket of ours removed");
    assert!(foreign.exists(), "another plugin's socket kept");

    // Stop and start again (a plugin restart): the new run registers again and serves.
    daemon.stop().await.expect("clean stop");
    assert!(!stale.exists(), "shutdown removes our sockets");
    let daemon = Daemon::start(node.options(all_config()));
    kubelet
        .wait_until(WAIT, |s| {
            s.registrations.iter().filter(|r| r.accepted()).count() == 6
        })
        .await
        .expect("second run registered all three");
    assert!(kubelet.allocate(HCA, &["0000:29:00.0"]).await.is_ok());
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_is_retried_until_the_kubelet_appears() {
    let node = Node::dgx();
    let daemon = Daemon::start(node.options(all_config()));
    // Give the daemon time to fail at least once against the missing kubelet.sock.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    kubelet
        .wait_for_resources(&ALL, WAIT)
        .await
        .expect("registered once the kubelet is up");
    daemon.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_on_a_missing_sysfs_root() {
    let node = Node::dgx();
    let mut options = node.options(fast_config());
    options.sysfs_root = node.dir.path().join("nope");
    let err = Daemon::start(options).stop().await.expect_err("refused");
    assert!(err.to_string().contains("nope"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_devices_registrations_allocations_and_restarts() {
    let node = Node::dgx();
    let mut options = node.options(fast_config());
    let metrics = std::sync::Arc::clone(&options.metrics);
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    options.config.gpu_hca.enabled = true;
    let daemon = Daemon::start(options);
    kubelet
        .wait_for_resources(&[HCA, GPU_HCA], WAIT)
        .await
        .expect("registered");

    kubelet
        .allocate(HCA, &["0000:29:00.0"])
        .await
        .expect("allocate");
    kubelet
        .allocate(HCA, &["0000:99:00.0"])
        .await
        .expect_err("unknown");
    kubelet
        .allocate(HCA, &["0000:18:00.0"])
        .await
        .expect_err("a rail is the pair resource's");
    // A storage port (rdma/hca's) and a rail (its pair's) go down.
    fixtures::set_port_state(&node.sysfs, "mlx5_1", 1, false).expect("link down");
    fixtures::set_port_state(&node.sysfs, "mlx5_0", 1, false).expect("link down");
    kubelet
        .wait_for_devices(HCA, WAIT, |d| {
            health_of(d, "0000:29:00.0") == Some("Unhealthy")
        })
        .await
        .expect("down");
    kubelet
        .wait_for_devices(GPU_HCA, WAIT, |d| {
            health_of(d, "0000:1b:00.0_0000:18:00.0") == Some("Unhealthy")
        })
        .await
        .expect("pair down");
    kubelet.restart().await.expect("kubelet restart");
    kubelet
        .wait_for_resources(&[HCA, GPU_HCA], WAIT)
        .await
        .expect("registered again");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    for line in [
        r#"rocefabric_device_plugin_devices{resource="rdma/hca",health="Healthy"} 5"#,
        r#"rocefabric_device_plugin_devices{resource="rdma/hca",health="Unhealthy"} 1"#,
        r#"rocefabric_device_plugin_devices{resource="rdma/gpu-hca",health="Healthy"} 7"#,
        r#"rocefabric_device_plugin_allocations_total{resource="rdma/hca",result="success"} 1"#,
        r#"rocefabric_device_plugin_allocations_total{resource="rdma/hca",result="unknown_device"} 1"#,
        r#"rocefabric_device_plugin_allocations_total{resource="rdma/hca",result="not_owned"} 1"#,
        "rocefabric_device_plugin_kubelet_restarts_total 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(
        !text.contains("nvidia.com/gpu"),
        "a disabled resource is not reported"
    );
    daemon.stop().await.expect("clean stop");
}

/// A kubelet socket that never appears (the plugin directory was re-created on the host and this
/// process still sees the old one through its mount): after the limit, `serve` exits with the
/// reason, so the kubelet restarts the container with a fresh mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_when_never_registered_for_too_long() {
    let node = Node::dgx();
    let mut options = node.options(fast_config());
    options.liveness_interval = Duration::from_millis(50);
    options.exit_after_unregistered = Some(Duration::from_millis(300));
    let started = Instant::now();
    let err = Daemon::start(options)
        .stop_when_done()
        .await
        .expect_err("exits");
    let text = err.to_string();
    assert!(text.contains("not registered with the kubelet"), "{text}");
    assert!(text.contains("kubelet.sock"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "not before the limit"
    );
}

/// With a kubelet that accepts the registrations, the same limit never fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_daemon_does_not_exit() {
    let node = Node::dgx();
    let mut options = node.options(fast_config());
    options.liveness_interval = Duration::from_millis(50);
    options.exit_after_unregistered = Some(Duration::from_millis(300));
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    let daemon = Daemon::start(options);
    kubelet
        .wait_for_resources(&[HCA], WAIT)
        .await
        .expect("registered");
    tokio::time::sleep(Duration::from_millis(800)).await;
    daemon.stop().await.expect("still running, stops cleanly");
}

/// The plugin directory itself gone (deleted on the host): our sockets cannot even be bound, and
/// the daemon still exits after the limit instead of retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_when_the_plugin_directory_is_gone() {
    let node = Node::dgx();
    let kubelet = KubeletEmulator::start(&node.plugin_dir)
        .await
        .expect("emulator");
    let mut options = node.options(all_config());
    options.liveness_interval = Duration::from_millis(50);
    options.exit_after_unregistered = Some(Duration::from_millis(500));
    let daemon = Daemon::start(options);
    kubelet
        .wait_for_resources(&ALL, WAIT)
        .await
        .expect("registered");
    drop(kubelet);
    std::fs::remove_dir_all(&node.plugin_dir).expect("remove the plugin directory");
    let err = daemon.stop_when_done().await.expect_err("exits");
    assert!(
        err.to_string().contains("not registered with the kubelet"),
        "{err}"
    );
}

/// A resource whose socket cannot be created (here a directory sits where it goes) is not retried
/// forever: after `start_attempts` in a row `run` ends with the cause, naming the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gives_up_naming_the_cause_when_a_socket_cannot_be_created() {
    use rocefabric_device_plugin::serve::ServeError;
    use rocefabric_kubelet_api::registration::Backoff;
    let node = Node::dgx();
    let blocker = node.plugin_dir.join("rocefabric-rdma_hca.sock");
    std::fs::create_dir_all(blocker.join("not-ours")).expect("a directory where the socket goes");
    let mut options = node.options(fast_config());
    options.start_attempts = 2;
    options.registration_backoff = Backoff {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(1),
    };
    let err = Daemon::start(options)
        .stop_when_done()
        .await
        .expect_err("gives up");
    assert!(matches!(err, ServeError::Start { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot serve rdma/hca after 2 attempts: cannot remove old socket {}: Is a directory (os error 21)",
            blocker.display()
        )
    );
    assert!(blocker.join("not-ours").is_dir(), "left as it was");
}

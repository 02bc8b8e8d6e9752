//! Node-level end-to-end: the node daemon run as the binary users run (`rocefabric-device-plugin
//! serve`), over the DGX H100 fixture sysfs tree, talking to a kubelet emulator over real unix
//! sockets in a temp dir; and `qos apply`/`qos show` on a veth pair in a network namespace the test
//! creates. Runs everywhere; only the namespace test skips (with a message) where namespaces cannot
//! be made.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rocefabric_e2e::node::{DaemonProcess, NetNs, daemon_binary};
use rocefabric_e2e::skip;
use rocefabric_kubelet_api::pb;
use rocefabric_node_testing::fixtures::{self, FixtureNode};
use rocefabric_node_testing::kubelet_emulator::KubeletEmulator;

const HCA: &str = rocefabric_api::constants::HCA_RESOURCE;
const GPU: &str = rocefabric_api::constants::DEFAULT_GPU_RESOURCE;
const PAIR: &str = rocefabric_api::constants::GPU_HCA_RESOURCE;

/// Generous bound for things that take milliseconds; only reached when something is broken.
const WAIT: Duration = Duration::from_secs(10);

/// The DGX H100 fixture's RoCE HCAs (shared/reference/dgx-h100.md): the eight compute ConnectX-7,
/// the four ports of the two storage cards, and the Intel E810's two irdma devices.
const DGX_HCAS: [(&str, &str, i64); 14] = [
    ("0000:18:00.0", "mlx5_0", 0),
    ("0000:29:00.0", "mlx5_1", 0),
    ("0000:29:00.1", "mlx5_2", 0),
    ("0000:40:00.0", "mlx5_3", 0),
    ("0000:4f:00.0", "mlx5_4", 0),
    ("0000:5e:00.0", "mlx5_5", 0),
    ("0000:82:00.0", "irdma0", 1),
    ("0000:82:00.1", "irdma1", 1),
    ("0000:9a:00.0", "mlx5_6", 1),
    ("0000:aa:00.0", "mlx5_7", 1),
    ("0000:aa:00.1", "mlx5_8", 1),
    ("0000:c0:00.0", "mlx5_9", 1),
    ("0000:ce:00.0", "mlx5_10", 1),
    ("0000:dc:00.0", "mlx5_11", 1),
];

/// The compute ConnectX-7 of [`DGX_HCAS`]: each is one GPU's rail (PXB), so with `gpuHca` on the
/// pair resource owns it and `rdma/hca` does not list it.
const DGX_RAILS: [&str; 8] = [
    "0000:18:00.0",
    "0000:40:00.0",
    "0000:4f:00.0",
    "0000:5e:00.0",
    "0000:9a:00.0",
    "0000:c0:00.0",
    "0000:ce:00.0",
    "0000:dc:00.0",
];

/// The daemon's config in every test: a fast poll and the fabric's traffic class; the resources
/// are the defaults (`rdma/hca` only) unless a test adds one of the blocks below.
const BASE_CONFIG: &str = "pollInterval: 100ms\ntrafficClass: 106\n";
/// GPUs served by rocefabric (NVIDIA's plugin kept off the node), every HCA under `rdma/hca`.
const WITH_GPUS: &str = "gpu:\n  enabled: true\n";
/// All three resources: the rails and their GPUs served as pairs only.
const WITH_PAIRS: &str = "gpu:\n  enabled: true\ngpuHca:\n  enabled: true\n";

/// The eight H100 GPUs, in index order, with their NUMA node.
const DGX_GPUS: [(&str, i64); 8] = [
    ("0000:1b:00.0", 0),
    ("0000:43:00.0", 0),
    ("0000:52:00.0", 0),
    ("0000:61:00.0", 0),
    ("0000:9d:00.0", 1),
    ("0000:c3:00.0", 1),
    ("0000:d1:00.0", 1),
    ("0000:df:00.0", 1),
];

/// A node: the fixture tree, a fake /dev, a config, the emulated kubelet and the daemon binary.
struct Node {
    _tmp: tempfile::TempDir,
    sysfs: PathBuf,
    plugin_dir: PathBuf,
    /// The resources the config serves.
    resources: Vec<&'static str>,
    args: Vec<String>,
    log: PathBuf,
    kubelet: KubeletEmulator,
    daemon: Option<DaemonProcess>,
}

impl Node {
    /// The daemon with [`BASE_CONFIG`] plus `extra`, expected to serve `resources`.
    async fn start(extra: &str, resources: &[&'static str]) -> Node {
        let tmp = tempfile::tempdir().expect("temp dir");
        let sysfs = tmp.path().join("sys");
        FixtureNode::dgx_h100()
            .write_to(&sysfs)
            .expect("write the DGX fixture");
        let dev = tmp.path().join("dev");
        // uverbs0/1 are the irdma devices, mlx5_k has uverbs(k+2): 14 in all; 8 GPUs.
        fixtures::write_dev_nodes(&FixtureNode::dgx_h100(), &dev).expect("fake /dev");
        let config = tmp.path().join("config.yaml");
        std::fs::write(&config, format!("{BASE_CONFIG}{extra}")).expect("config");
        let plugin_dir = tmp.path().join("device-plugins");
        let kubelet = KubeletEmulator::start(&plugin_dir)
            .await
            .expect("kubelet emulator");
        let path = |p: &Path| p.display().to_string();
        let args = vec![
            "serve".to_string(),
            format!("--sysfs-root={}", path(&sysfs)),
            format!("--dev-root={}", path(&dev)),
            format!("--plugin-dir={}", path(&plugin_dir)),
            format!("--config={}", path(&config)),
            "--node-name=dgx-a01".to_string(),
        ];
        let log = tmp.path().join("daemon.log");
        let mut node = Node {
            _tmp: tmp,
            sysfs,
            plugin_dir,
            resources: resources.to_vec(),
            args,
            log,
            kubelet,
            daemon: None,
        };
        node.spawn_daemon();
        node
    }

    fn spawn_daemon(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.daemon =
            Some(DaemonProcess::spawn(&args, &self.log).unwrap_or_else(|e| panic!("{e}")));
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait until the config's resources are registered (current kubelet run) with device lists.
    async fn registered(&mut self) -> pb_snapshot::Snapshot {
        let result = self.kubelet.wait_for_resources(&self.resources, WAIT).await;
        let running = self.daemon.as_mut().is_some_and(DaemonProcess::running);
        result.unwrap_or_else(|e| {
            panic!(
                "resources not registered: {e} (daemon running: {running})\n{}",
                self.log()
            )
        })
    }

    async fn devices_until(
        &self,
        resource: &str,
        what: &str,
        condition: impl FnMut(&[pb::Device]) -> bool,
    ) -> Vec<pb::Device> {
        self.kubelet
            .wait_for_devices(resource, WAIT, condition)
            .await
            .unwrap_or_else(|e| panic!("{resource}: {what}: {e}\n{}", self.log()))
    }
}

/// The emulator's snapshot type, named for readability.
mod pb_snapshot {
    pub use rocefabric_node_testing::kubelet_emulator::Snapshot;
}

fn health_of<'a>(devices: &'a [pb::Device], id: &str) -> Option<&'a str> {
    devices
        .iter()
        .find(|d| d.id == id)
        .map(|d| d.health.as_str())
}

fn numa_of(device: &pb::Device) -> Vec<i64> {
    device
        .topology
        .as_ref()
        .map(|t| t.nodes.iter().map(|n| n.id).collect())
        .unwrap_or_default()
}

/// A device list as `{id: (health, NUMA nodes)}`.
fn by_id(devices: &[pb::Device]) -> BTreeMap<&str, (&str, Vec<i64>)> {
    devices
        .iter()
        .map(|d| (d.id.as_str(), (d.health.as_str(), numa_of(d))))
        .collect()
}

/// What [`by_id`] gives for `(id, NUMA node)` devices that are all Healthy.
fn healthy<'a>(
    devices: impl IntoIterator<Item = (&'a str, i64)>,
) -> BTreeMap<&'a str, (&'static str, Vec<i64>)> {
    devices
        .into_iter()
        .map(|(id, numa)| (id, ("Healthy", vec![numa])))
        .collect()
}

fn device_paths(response: &pb::ContainerAllocateResponse) -> BTreeSet<String> {
    for d in &response.devices {
        assert_eq!(
            d.container_path, d.host_path,
            "device nodes keep the host path in the container"
        );
        assert_eq!(d.permissions, "rw", "{}", d.host_path);
    }
    response
        .devices
        .iter()
        .map(|d| d.host_path.clone())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The default config: `rdma/hca` over every HCA, GPUs left to NVIDIA's device plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_only_rdma_hca_is_served_over_every_hca() {
    let mut node = Node::start("", &[HCA]).await;
    let snapshot = node.registered().await;
    let registered: BTreeSet<&str> = snapshot.registered().keys().copied().collect();
    assert_eq!(
        registered,
        BTreeSet::from([HCA]),
        "nvidia.com/gpu is NVIDIA's"
    );
    // rdma/hca: every RoCE HCA of the node, by PCI address, Healthy, on its NUMA node.
    let hcas = snapshot.devices_of(HCA).expect("HCA list");
    let got = by_id(hcas);
    let want = healthy(DGX_HCAS.iter().map(|(pci, _, numa)| (*pci, *numa)));
    assert_eq!(got, want, "rdma/hca devices");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_registers_every_resource_after_serving_it() {
    let mut node = Node::start(WITH_PAIRS, &[HCA, GPU, PAIR]).await;
    let snapshot = node.registered().await;

    // Every Register was accepted: the emulator dials the endpoint first and refuses a plugin that
    // is not serving yet, as the kubelet does.
    for r in &snapshot.registrations {
        assert!(
            r.accepted(),
            "registration {:?} refused: {:?}",
            r.request.resource_name,
            r.rejected
        );
    }
    let registered = snapshot.registered();
    assert_eq!(
        registered.keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([GPU, HCA, PAIR]),
        "one registration per resource"
    );
    for (resource, r) in &registered {
        assert_eq!(r.request.version, "v1beta1", "{resource}");
        let socket = node.plugin_dir.join(&r.request.endpoint);
        let meta =
            std::fs::metadata(&socket).unwrap_or_else(|e| panic!("{resource}: {socket:?}: {e}"));
        assert!(
            meta.file_type().is_socket(),
            "{resource}: endpoint {socket:?} is a socket"
        );
        let options = snapshot.options.get(*resource).expect("options fetched");
        assert!(
            options.get_preferred_allocation_available,
            "{resource} answers GetPreferredAllocation"
        );
    }
    let endpoints: BTreeSet<&str> = registered
        .values()
        .map(|r| r.request.endpoint.as_str())
        .collect();
    assert_eq!(endpoints.len(), 3, "one socket per resource: {endpoints:?}");

    // One device, one owner. rdma/gpu-hca: one device per GPU (each compute GPU has its PXB rail
    // NIC), owning the GPU and the rail.
    let pairs = snapshot.devices_of(PAIR).expect("pair list");
    assert_eq!(pairs.len(), 8, "rdma/gpu-hca devices: {pairs:?}");
    assert!(pairs.iter().all(|d| d.health == "Healthy"));
    let rails: BTreeSet<&str> = pairs
        .iter()
        .filter_map(|d| d.id.split_once('_').map(|(_, hca)| hca))
        .collect();
    assert_eq!(rails, DGX_RAILS.into_iter().collect());
    // rdma/hca: the HCAs that are no GPU's rail, by PCI address, Healthy, on their NUMA node.
    let hcas = snapshot.devices_of(HCA).expect("HCA list");
    let got = by_id(hcas);
    let want = healthy(
        DGX_HCAS
            .iter()
            .filter(|(pci, _, _)| !DGX_RAILS.contains(pci))
            .map(|(pci, _, numa)| (*pci, *numa)),
    );
    assert_eq!(got, want, "rdma/hca devices");
    // nvidia.com/gpu: registered, but every GPU has a rail and so belongs to a pair.
    let gpus = snapshot.devices_of(GPU).expect("GPU list");
    assert!(gpus.is_empty(), "nvidia.com/gpu devices: {gpus:?}");

    // A rail pair: the GPU and its PXB NIC together.
    let gpu0 = pairs
        .iter()
        .find(|d| d.id.contains("1b:00.0"))
        .expect("a pair device for GPU 0");
    let pair = node
        .kubelet
        .allocate(PAIR, &[gpu0.id.as_str()])
        .await
        .expect("allocate pair");
    let paths = device_paths(&pair);
    for p in [
        "/dev/nvidia0",
        "/dev/infiniband/uverbs2",
        "/dev/infiniband/rdma_cm",
    ] {
        assert!(paths.contains(p), "pair grant lacks {p}: {paths:?}");
    }
    assert_eq!(
        pair.envs.get("NCCL_IB_HCA").map(String::as_str),
        Some("=mlx5_0:1")
    );

    // The rail is the pair's: rdma/hca refuses it, naming the ID and the owner.
    let refused = node
        .kubelet
        .allocate(HCA, &["0000:18:00.0"])
        .await
        .expect_err("a rail HCA is not rdma/hca's");
    let text = refused.to_string();
    assert!(
        text.contains("0000:18:00.0") && text.contains(PAIR),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocation_hands_over_device_nodes_and_the_workload_environment() {
    let mut node = Node::start(WITH_GPUS, &[HCA, GPU]).await;
    let snapshot = node.registered().await;
    let gpus = snapshot.devices_of(GPU).expect("GPU list");
    let got = by_id(gpus);
    let want = healthy(DGX_GPUS.iter().copied());
    assert_eq!(got, want, "nvidia.com/gpu devices (gpuHca off: every GPU)");

    // Two compute rails: mlx5_0 (uverbs2) and mlx5_3 (uverbs5).
    let hca = node
        .kubelet
        .allocate(HCA, &["0000:18:00.0", "0000:40:00.0"])
        .await
        .unwrap_or_else(|e| panic!("allocate rdma/hca: {e}\n{}", node.log()));
    assert_eq!(
        device_paths(&hca),
        set(&[
            "/dev/infiniband/uverbs2",
            "/dev/infiniband/uverbs5",
            "/dev/infiniband/rdma_cm"
        ]),
        "the granted HCAs' uverbs and rdma_cm, never umad/issm"
    );
    let env = &hca.envs;
    let expect = [
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1"),
        ("UCX_NET_DEVICES", "mlx5_0:1,mlx5_3:1"),
        ("NCCL_IB_GID_INDEX", "3"),
        ("NCCL_IB_TC", "106"),
        ("UCX_IB_TRAFFIC_CLASS", "106"),
        ("PCIDEVICE_RDMA_HCA", "0000:18:00.0,0000:40:00.0"),
    ];
    for (key, value) in expect {
        assert_eq!(
            env.get(key).map(String::as_str),
            Some(value),
            "{key} in {env:?}"
        );
    }

    let gpu = node
        .kubelet
        .allocate(GPU, &["0000:1b:00.0"])
        .await
        .expect("allocate GPU 0");
    assert_eq!(
        device_paths(&gpu),
        set(&[
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ])
    );

    // The preferred pair of HCAs from the whole node shares one NUMA node.
    let all: Vec<&str> = DGX_HCAS.iter().map(|(pci, _, _)| *pci).collect();
    let preferred = node
        .kubelet
        .preferred_allocation(HCA, &all, &[], 2)
        .await
        .expect("preferred");
    assert_eq!(preferred.len(), 2, "{preferred:?}");
    let numa: BTreeSet<i64> = preferred
        .iter()
        .map(|id| {
            DGX_HCAS
                .iter()
                .find(|(pci, _, _)| pci == id)
                .map(|h| h.2)
                .expect("known HCA")
        })
        .collect();
    assert_eq!(numa.len(), 1, "preferred {preferred:?} spans NUMA nodes");

    // An ID the daemon never advertised is refused, not silently granted.
    assert!(node.kubelet.allocate(HCA, &["0000:ff:00.0"]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_going_down_and_coming_back_reaches_list_and_watch() {
    let mut node = Node::start("", &[HCA]).await;
    node.registered().await;
    let (pci, ibdev) = ("0000:40:00.0", "mlx5_3");

    fixtures::set_port_state(&node.sysfs, ibdev, 1, false).expect("link down");
    let started = Instant::now();
    let devices = node
        .devices_until(HCA, "port down -> Unhealthy", |d| {
            health_of(d, pci) == Some("Unhealthy")
        })
        .await;
    let down_after = started.elapsed();
    // Only that HCA changed.
    for d in &devices {
        if d.id != pci {
            assert_eq!(d.health, "Healthy", "{} changed with {pci}", d.id);
        }
    }

    fixtures::set_port_state(&node.sysfs, ibdev, 1, true).expect("link up");
    let started = Instant::now();
    node.devices_until(HCA, "port up -> Healthy", |d| {
        health_of(d, pci) == Some("Healthy")
    })
    .await;
    let up_after = started.elapsed();
    println!("port down seen after {down_after:?}, up after {up_after:?} (poll interval 100ms)");

    // A device that disappears from sysfs stays listed, as Unhealthy.
    fixtures::remove_rdma_device(&node.sysfs, "mlx5_4").expect("remove mlx5_4");
    node.devices_until(HCA, "removed -> Unhealthy", |d| {
        health_of(d, "0000:4f:00.0") == Some("Unhealthy")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_and_daemon_restart_re_register() {
    let mut node = Node::start(WITH_PAIRS, &[HCA, GPU, PAIR]).await;
    node.registered().await;

    // Kubelet restart: every socket in the directory is deleted and kubelet.sock recreated.
    let started = Instant::now();
    node.kubelet.restart().await.expect("kubelet restart");
    let snapshot = node.registered().await;
    let took = started.elapsed();
    assert_eq!(snapshot.generation, 1);
    assert_eq!(
        snapshot.registered().len(),
        3,
        "all three resources registered again"
    );
    assert_eq!(
        snapshot.devices_of(HCA).map(<[_]>::len),
        Some(DGX_HCAS.len() - DGX_RAILS.len())
    );
    println!("re-registered 3 resources {took:?} after the kubelet restart");

    // Daemon restart: SIGKILL leaves its sockets behind; the new process clears them and serves.
    let before = node.kubelet.snapshot().registrations.len();
    node.daemon = None; // killed on drop
    node.spawn_daemon();
    let snapshot = node
        .kubelet
        .wait_until(WAIT, |s| {
            s.registrations[before..]
                .iter()
                .filter(|r| r.accepted())
                .count()
                >= 3
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "daemon did not re-register after restart: {e}\n{}",
                node.log()
            )
        });
    let again: BTreeSet<&str> = snapshot.registrations[before..]
        .iter()
        .map(|r| r.request.resource_name.as_str())
        .collect();
    assert_eq!(again, BTreeSet::from([GPU, HCA, PAIR]));
    // A storage port: no GPU's rail, so rdma/hca's.
    let hca = node
        .kubelet
        .allocate(HCA, &["0000:29:00.0"])
        .await
        .expect("allocate after restart");
    assert_eq!(
        hca.envs.get("NCCL_IB_HCA").map(String::as_str),
        Some("=mlx5_1:1")
    );
}

/// `qos apply` on a veth pair: the MTU really changes (read back by `ip`), DCB is reported
/// unsupported (veth answers EOPNOTSUPP to DCB netlink), nothing is claimed as applied that was not,
/// and the exit status says the spec does not hold.
#[test]
fn qos_apply_on_a_veth_changes_the_mtu_and_reports_dcb_unsupported() {
    const TEST: &str = "qos_apply_on_a_veth_changes_the_mtu_and_reports_dcb_unsupported";
    let ns = match NetNs::create(&format!("rf-e2e-{}", std::process::id())) {
        Ok(ns) => ns,
        Err(reason) => {
            skip("netns", &reason, TEST);
            return;
        }
    };
    ns.ip(&[
        "link", "add", "rfv0", "type", "veth", "peer", "name", "rfv1",
    ])
    .expect("veth pair");
    ns.ip(&["link", "set", "rfv0", "up"]).expect("rfv0 up");
    ns.ip(&["link", "set", "rfv1", "up"]).expect("rfv1 up");
    assert!(
        ns.ip(&["-o", "link", "show", "rfv0"])
            .expect("show")
            .contains("mtu 1500")
    );

    let tmp = tempfile::tempdir().expect("temp dir");
    let config = tmp.path().join("qos.yaml");
    // A RoceFabric.spec.qos block: the standard lossless scheme with the MTU for RoCE 4096.
    std::fs::write(
        &config,
        "trust: dscp\nroceDscp: 26\nrocePriority: 3\npfcPriorities: [3]\n\
         ecn:\n  enabled: true\ncnp:\n  dscp: 48\n  priority: 6\nmtu: 4200\n",
    )
    .expect("qos config");
    let binary = daemon_binary().unwrap_or_else(|e| panic!("{e}"));
    let config_arg = config.display().to_string();

    // --dry-run changes nothing.
    let dry = ns
        .exec(
            &binary,
            &[
                "qos",
                "apply",
                "--netdev",
                "rfv0",
                "--config",
                &config_arg,
                "--dry-run",
            ],
        )
        .expect("qos apply --dry-run");
    assert!(
        ns.ip(&["-o", "link", "show", "rfv0"])
            .expect("show")
            .contains("mtu 1500"),
        "--dry-run changed the MTU:\n{}",
        String::from_utf8_lossy(&dry.stdout)
    );
    assert!(
        !dry.status.success(),
        "--dry-run with changes pending exits non-zero"
    );
    assert!(
        String::from_utf8_lossy(&dry.stdout).contains("4200"),
        "--dry-run prints the MTU change:\n{}",
        String::from_utf8_lossy(&dry.stdout)
    );

    let out = ns
        .exec(
            &binary,
            &[
                "qos",
                "apply",
                "--netdev",
                "rfv0",
                "--config",
                &config_arg,
                "--output",
                "json",
            ],
        )
        .expect("qos apply");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "PFC/APP/ECN cannot hold on a veth, so apply must fail:\n{stdout}\n{stderr}"
    );

    // The MTU really changed, as the kernel reports it.
    let link = ns.ip(&["-o", "link", "show", "rfv0"]).expect("show");
    assert!(
        link.contains("mtu 4200"),
        "MTU not applied: {link}\n{stdout}\n{stderr}"
    );

    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("qos apply --output json is not JSON ({e}):\n{stdout}\n{stderr}")
    });
    assert_eq!(
        report["holds"], false,
        "the report says the spec does not hold: {report}"
    );
    let knobs = knob_outcomes(&report);
    let mtu = &knobs["mtu"];
    assert_eq!(mtu["outcome"], "Applied", "mtu in {report}");
    assert_eq!(mtu["mechanism"], "Rtnetlink", "mtu in {report}");
    assert_eq!(mtu["observed"], "4200", "mtu read back in {report}");
    // DCB netlink answers EOPNOTSUPP on a veth: trust, the DSCP APP table and PFC are unsupported,
    // and so is ECN (no driver files).
    for knob in ["trust", "dscpMap", "pfc"] {
        let k = &knobs[knob];
        assert_eq!(k["outcome"], "Unsupported", "{knob} in {report}");
        let error = k["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("EOPNOTSUPP"),
            "{knob} error names EOPNOTSUPP: {error}"
        );
    }
    for knob in ["ecnNotificationPoint", "ecnReactionPoint"] {
        assert_eq!(knobs[knob]["outcome"], "Unsupported", "{knob} in {report}");
    }
    for (knob, k) in &knobs {
        if knob != "mtu" {
            assert_ne!(
                k["outcome"], "Applied",
                "{knob} claimed applied on a veth: {report}"
            );
            assert_ne!(
                k["outcome"], "AlreadyCorrect",
                "{knob} claimed correct on a veth: {report}"
            );
        }
    }

    // `qos show` says DCB is not supported there.
    let show = ns
        .exec(&binary, &["qos", "show", "--netdev", "rfv0"])
        .expect("qos show");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&show.stdout),
        String::from_utf8_lossy(&show.stderr)
    );
    assert!(
        text.to_lowercase().contains("not supported"),
        "qos show:\n{text}"
    );
    assert!(text.contains("4200"), "qos show reports the MTU:\n{text}");
}

/// `{knob: entry}` from a `qos apply --output json` report (`knobs[]` with `knob`, `outcome`,
/// `mechanism`, `desired`, `observed`, `error`).
fn knob_outcomes(report: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    report["knobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no knobs[] in {report}"))
        .iter()
        .map(|k| {
            (
                k["knob"].as_str().unwrap_or_default().to_string(),
                k.clone(),
            )
        })
        .collect()
}

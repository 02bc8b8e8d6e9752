//! The local test cluster of `e2e/cluster/up`, as the cluster suite sees it: where its node's paths
//! are (read from `cluster.env` beside the kubeconfig), how to run its `kubectl` and `helm`, how to
//! restart one of its components, and the node's fake hardware: a DGX H100 fixture sysfs tree, a
//! `/dev` of real character devices (mknod), and veth pairs for the fabric's NICs, so the chart's
//! DaemonSet runs unmodified against it.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rocefabric_api::NicSelector;
use rocefabric_node_model::allocation::{self, ResourceKind};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::inventory;
use rocefabric_node_testing::fixtures::FixtureNode;

use crate::bounded::{CALL_LIMIT, OutputWithin as _};
use crate::workspace_root;

/// When set (to anything but `0`), a missing cluster fails the suite instead of skipping it.
pub const REQUIRE_ENV: &str = "ROCEFABRIC_REQUIRE_CLUSTER";

/// Whether a missing cluster must fail the suite (CI) rather than skip it.
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The fixture netdevs that stand for the fabric's NICs, and the host veths that back them (the QoS
/// agent speaks netlink to these; every other fixture NIC exists only in sysfs). The names start
/// with `rfe2e` so `e2e/cluster/down` knows them as its own.
pub const FABRIC_NETDEVS: [(&str, &str); 2] =
    [("enp24s0np0", "rfe2e-n0"), ("enp64s0np0", "rfe2e-n1")];
/// The network namespace holding the far ends of the veths.
pub const WIRE_NETNS: &str = "rfe2e-wire";

/// What `e2e/cluster/up` wrote about its cluster.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    pub node_name: String,
    pub state: PathBuf,
    pub bin: PathBuf,
    pub plugin_dir: PathBuf,
    /// The kubelet's `--root-dir` (DRA plugin sockets, registration, pod resources).
    pub kubelet_root: PathBuf,
    /// Where the container runtime reads CDI specs.
    pub cdi_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub busybox_image: String,
    pub pause_image: String,
    /// The workload image (`rocefabric-dsm` and rdma-core's user space).
    pub workload_image: String,
    pub version: String,
    /// Worker nodes (`up --workers N`): qemu VMs with Soft-RoCE, tainted
    /// `rocefabric.io/vm-worker=true:NoSchedule`.
    pub workers: Vec<String>,
}

impl LocalCluster {
    /// The local cluster `kubeconfig` belongs to: `None` when there is no `cluster.env` beside it
    /// (another cluster), an error when there is one but it is unreadable.
    pub fn beside(kubeconfig: &Path) -> Option<Result<LocalCluster, String>> {
        let env_file = kubeconfig.parent()?.join("cluster.env");
        if !env_file.exists() {
            return None;
        }
        Some(Self::load(&env_file, kubeconfig))
    }

    fn load(env_file: &Path, kubeconfig: &Path) -> Result<LocalCluster, String> {
        let text =
            fs::read_to_string(env_file).map_err(|e| format!("{}: {e}", env_file.display()))?;
        let vars: BTreeMap<&str, &str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .collect();
        let get = |key: &str| {
            vars.get(key)
                .map(|v| v.to_string())
                .ok_or_else(|| format!("{}: no {key}", env_file.display()))
        };
        Ok(LocalCluster {
            node_name: get("NODE_NAME")?,
            state: PathBuf::from(get("STATE")?),
            bin: PathBuf::from(get("BIN")?),
            plugin_dir: PathBuf::from(get("PLUGIN_DIR")?),
            kubelet_root: PathBuf::from(get("KUBELET_ROOT")?),
            cdi_dir: PathBuf::from(get("CDI_DIR")?),
            kubeconfig: kubeconfig.to_path_buf(),
            busybox_image: get("BUSYBOX_IMAGE")?,
            pause_image: get("PAUSE_IMAGE")?,
            workload_image: get("WORKLOAD_IMAGE").unwrap_or_default(),
            version: get("K8S_VERSION")?,
            workers: vars
                .get("WORKERS")
                .map(|v| {
                    v.trim_matches('"')
                        .split_whitespace()
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// Root of the node's fake hardware: `sys/`, `dev/`, `debugfs/`, `configfs/`.
    pub fn node_root(&self) -> PathBuf {
        self.state.join("node")
    }

    pub fn sysfs(&self) -> PathBuf {
        self.node_root().join("sys")
    }

    pub fn dev(&self) -> PathBuf {
        self.node_root().join("dev")
    }

    /// The DRA driver's directory (`dra.sock`, `checkpoint.json`).
    pub fn dra_plugin_dir(&self) -> PathBuf {
        self.kubelet_root.join("plugins/rocefabric.io")
    }

    /// The qemu monitor socket of a worker VM (`set_link fabric off|on` pulls and plugs its
    /// fabric NIC's cable).
    pub fn worker_monitor(&self, worker: &str) -> PathBuf {
        self.state.join("workers").join(worker).join("monitor.sock")
    }

    /// The cluster's `kubectl` with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    /// The `helm` that `up` built, talking to this cluster.
    pub fn helm(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("helm"));
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.state.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.state.join("helm/config"))
            .env("HELM_DATA_HOME", self.state.join("helm/data"));
        cmd
    }

    /// The `grpcurl` that `up` built.
    pub fn grpcurl(&self) -> Command {
        Command::new(self.bin.join("grpcurl"))
    }

    /// Stop one component and leave it stopped (`e2e/cluster/up --stop NAME`) until
    /// [`LocalCluster::restart`] starts it again.
    pub fn stop(&self, component: &str) -> Result<(), String> {
        self.up(&["--stop", component])
    }

    /// Stop one component and start it again (`e2e/cluster/up --restart NAME`); returns when the
    /// node is Ready again.
    pub fn restart(&self, component: &str) -> Result<(), String> {
        self.up(&["--restart", component])
    }

    fn up(&self, args: &[&str]) -> Result<(), String> {
        let up = workspace_root().join("e2e/cluster/up");
        let out = Command::new(&up).args(args).output_within(CALL_LIMIT)?;
        check(&out, &format!("up {}", args.join(" ")))
    }

    /// The chart values that point the node DaemonSet at this node's fake hardware and the
    /// kubelet's plugin directory, and never pull an image.
    pub fn chart_values(&self) -> serde_json::Value {
        let root = self.node_root();
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        serde_json::json!({
            "operator": {"image": {"pullPolicy": "Never"}},
            "node": {
                "image": {"pullPolicy": "Never"},
                "hostPaths": {
                    "sysfs": path(root.join("sys")),
                    "dev": path(root.join("dev")),
                    "pluginDir": path(self.plugin_dir.clone()),
                    "debugfs": path(root.join("debugfs")),
                    "configfs": path(root.join("configfs")),
                    "kubeletPlugins": path(self.kubelet_root.join("plugins")),
                    "kubeletPluginsRegistry": path(self.kubelet_root.join("plugins_registry")),
                    "podResources": path(self.kubelet_root.join("pod-resources")),
                    "cdi": path(self.cdi_dir.clone()),
                },
                // Both APIs with one ledger: the device plugin tests and the DRA tests run on
                // one node daemon, as a cluster migrating to DRA would.
                "mode": "both",
                "config": {"pollInterval": "500ms"},
            }
        })
    }
}

/// The node's fixture: the DGX H100 tree with the fabric's netdevs renamed to the host veths.
pub fn fixture_node() -> FixtureNode {
    FABRIC_NETDEVS
        .iter()
        .fold(FixtureNode::dgx_h100(), |node, (old, new)| {
            node.with_netdev_renamed(old, new)
        })
}

/// Lay out the node's fake hardware under `cluster.node_root()`. Rewrites the sysfs tree in place
/// (a running DaemonSet's bind mounts keep seeing the same directory), makes the device nodes every
/// allocation can name, and creates the veth pairs when missing.
pub fn prepare_node(cluster: &LocalCluster) -> Result<FixtureNode, String> {
    let node = fixture_node();
    let sys = cluster.sysfs();
    fs::create_dir_all(&sys).map_err(|e| format!("{}: {e}", sys.display()))?;
    for entry in fs::read_dir(&sys).map_err(|e| format!("{}: {e}", sys.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed.map_err(|e| format!("{}: {e}", path.display()))?;
    }
    node.write_to(&sys)
        .map_err(|e| format!("writing the fixture to {}: {e}", sys.display()))?;
    // The directories the QoS agent mounts (mlx5's cc_params, rdma_cm's configfs).
    for dir in ["debugfs/mlx5", "configfs/rdma_cm"] {
        let path = cluster.node_root().join(dir);
        fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    make_device_nodes(&sys, &cluster.dev())?;
    make_veths()?;
    Ok(node)
}

/// Character devices for every node an allocation of any resource can hand out, with the major
/// numbers of the real drivers (uverbs 231, misc 10, nvidia 195, nvidia-uvm 510). Opening them
/// fails (no driver behind), but the runtime creates them in the container as it would on a node.
fn make_device_nodes(sys: &Path, dev: &Path) -> Result<(), String> {
    let inv = inventory::discover(sys, &NicSelector::default()).map_err(|e| e.to_string())?;
    // With `gpu` on and `gpuHca` off, every HCA and every GPU is some resource's: all the nodes any
    // configuration can hand out.
    let mut config = Config::default();
    config.gpu.enabled = true;
    let mut paths = Vec::new();
    for kind in [ResourceKind::Hca, ResourceKind::Gpu, ResourceKind::GpuHca] {
        let all: Vec<String> = allocation::advertised(kind, &inv, &config)
            .into_iter()
            .map(|d| d.id)
            .collect();
        if all.is_empty() {
            continue;
        }
        let grant = allocation::allocate(kind, &inv, &config, None, &all)
            .map_err(|e| format!("allocating every {kind:?} device of the fixture: {e}"))?;
        paths.extend(grant.devices.into_iter().map(|d| d.host_path));
    }
    paths.sort();
    paths.dedup();
    for path in paths {
        let relative = path.strip_prefix("/dev/").unwrap_or(&path);
        let (major, minor) = device_numbers(relative)
            .ok_or_else(|| format!("no device numbers known for {path}"))?;
        let target = dev.join(relative);
        if fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_char_device()) {
            continue;
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let _ = fs::remove_file(&target);
        run(Command::new("mknod")
            .args(["-m", "0666"])
            .arg(&target)
            .args(["c", &major.to_string(), &minor.to_string()]))?;
    }
    Ok(())
}

fn device_numbers(relative: &str) -> Option<(u32, u32)> {
    let number = |prefix: &str| relative.strip_prefix(prefix)?.parse::<u32>().ok();
    match relative {
        "infiniband/rdma_cm" => Some((10, 58)),
        "nvidiactl" => Some((195, 255)),
        "nvidia-modeset" => Some((195, 254)),
        "nvidia-uvm" => Some((510, 0)),
        "nvidia-uvm-tools" => Some((510, 1)),
        _ => {
            if let Some(n) = number("infiniband/uverbs") {
                Some((231, 192 + n))
            } else if let Some(n) = number("infiniband/umad") {
                Some((231, n))
            } else {
                number("nvidia").map(|n| (195, n))
            }
        }
    }
}

/// The fabric's NICs: veths whose far ends sit in a namespace of ours, both ends up.
fn make_veths() -> Result<(), String> {
    let exists = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .output_within(CALL_LIMIT)
            .is_ok_and(|o| o.status.success())
    };
    if !exists(&["netns", "pids", WIRE_NETNS]) {
        run(Command::new("ip").args(["netns", "add", WIRE_NETNS]))?;
    }
    for (i, (_, host)) in FABRIC_NETDEVS.iter().enumerate() {
        if !exists(&["link", "show", host]) {
            let peer = format!("w{i}");
            run(Command::new("ip").args([
                "link", "add", host, "type", "veth", "peer", "name", &peer, "netns", WIRE_NETNS,
            ]))?;
            run(Command::new("ip").args(["-n", WIRE_NETNS, "link", "set", &peer, "up"]))?;
        }
        run(Command::new("ip").args(["link", "set", host, "up"]))?;
    }
    Ok(())
}

/// The MTU of a host interface, as the kernel reports it.
pub fn host_mtu(netdev: &str) -> Result<u32, String> {
    let path = format!("/sys/class/net/{netdev}/mtu");
    fs::read_to_string(&path)
        .map_err(|e| format!("{path}: {e}"))?
        .trim()
        .parse()
        .map_err(|e| format!("{path}: {e}"))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let what = format!("{cmd:?}");
    let out = cmd.output_within(CALL_LIMIT)?;
    check(&out, &what)
}

/// Ok when the command succeeded, else an error with its stderr.
pub fn check(out: &Output, what: &str) -> Result<(), String> {
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

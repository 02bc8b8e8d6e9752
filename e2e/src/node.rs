//! Running the node daemon as the binary users run: build it once, lay out a fake `/dev` matching a
//! fixture sysfs tree, start `serve` as a child process, and reach network namespaces.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use crate::workspace_root;

/// Name of the node daemon's binary.
pub const DAEMON_BIN: &str = "rocefabric-device-plugin";

/// Failures of the harness itself (not of the daemon under test).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("failed to run {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("`cargo build -p rocefabric-device-plugin` failed:\n{0}")]
    Build(String),
    #[error("cargo reported no executable for {0}")]
    NoExecutable(&'static str),
    #[error("failed to write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The node daemon binary, built once per test process with the same cargo that runs the tests
/// (a no-op when `cargo test --workspace` already built it).
/// `ROCEFABRIC_NODE_BINARY` names a prebuilt binary instead.
pub fn daemon_binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| match std::env::var_os(BINARY_ENV) {
            Some(path) => Ok(PathBuf::from(path)),
            None => build_binary("rocefabric-device-plugin", DAEMON_BIN).map_err(|e| e.to_string()),
        })
        .clone()
}

/// Environment variable naming a prebuilt node daemon binary.
pub const BINARY_ENV: &str = "ROCEFABRIC_NODE_BINARY";

/// The data plane CLI `rocefabric-dsm`, built for this run (once per process).
pub fn dsm_binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| build_binary("rocefabric-dsm", "rocefabric-dsm").map_err(|e| e.to_string()))
        .clone()
}

/// `rocefabric-dsm-crossing` (someone crossing a rendezvous who may not), built for the VMs.
pub fn dsm_crossing_binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            build_binary("rocefabric-e2e", "rocefabric-dsm-crossing").map_err(|e| e.to_string())
        })
        .clone()
}

/// `cargo build` one binary of the workspace and return its path.
fn build_binary(package: &str, bin: &'static str) -> Result<PathBuf, HarnessError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(workspace_root())
        .args(["build", "-q", "-p", package, "--bin", bin])
        .args(["--message-format=json"])
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| HarnessError::Spawn {
            what: "cargo build".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(HarnessError::Build(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or(HarnessError::NoExecutable(bin))
}

/// A running daemon process, killed when dropped. Its stderr goes to a file kept for messages.
pub struct DaemonProcess {
    child: Child,
    log: PathBuf,
}

impl DaemonProcess {
    /// Start `rocefabric-device-plugin <args>` with its log in `log`, as a node of no cluster:
    /// the suite's kubeconfig (`.ci/run` exports the real cluster's) is hidden from it, so its
    /// QoS gate never waits on an API server that knows nothing of this fixture node.
    pub fn spawn(args: &[&str], log: &Path) -> Result<DaemonProcess, String> {
        let binary = daemon_binary()?;
        let file = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let no_cluster = log.with_file_name("no-kubeconfig");
        let child = crate::child_of_this_test(&binary)
            .args(args)
            .env("KUBECONFIG", &no_cluster)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(|e| format!("failed to start {}: {e}", binary.display()))?;
        Ok(DaemonProcess {
            child,
            log: log.to_path_buf(),
        })
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A network namespace created for one test and deleted when dropped.
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// `ip netns add <name>`; the error says why (commonly: not root, or no `ip`).
    pub fn create(name: &str) -> Result<NetNs, String> {
        // A namespace left over by a killed run of the same test would make `add` fail.
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        let out = Command::new("ip")
            .args(["netns", "add", name])
            .output()
            .map_err(|e| format!("cannot run `ip`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`ip netns add {name}` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(NetNs {
            name: name.to_string(),
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Run `program args` inside the namespace (`ip netns exec`, which also mounts a sysfs of the
    /// namespace over /sys for the command).
    pub fn exec(&self, program: &Path, args: &[&str]) -> Result<Output, String> {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg(program)
            .args(args)
            .output()
            .map_err(|e| format!("ip netns exec {} {}: {e}", self.name, program.display()))
    }

    /// Run `ip <args>` inside the namespace; an error carries ip's message.
    pub fn ip(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("ip")
            .args(["-n", &self.name])
            .args(args)
            .output()
            .map_err(|e| format!("ip -n {} {args:?}: {e}", self.name))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "ip -n {} {}: {}",
                self.name,
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

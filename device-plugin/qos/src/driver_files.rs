//! The knobs only a driver exposes, as files under root paths (so tests use fixture trees):
//!
//! - NVIDIA's out-of-tree mlx5 driver: `<sysfs>/class/net/<if>/ecn/roce_np/enable/<p>`,
//!   `ecn/roce_rp/enable/<p>`, `ecn/roce_np/cnp_dscp`, `ecn/roce_np/cnp_802p_prio`, `qos/trust`;
//! - the upstream mlx5 driver: `<debugfs>/mlx5/<BDF>/cc_params/np_cnp_dscp`, `np_cnp_prio`;
//! - rdma_cm (upstream): `<configfs>/rdma_cm/<ibdev>/ports/<n>/default_roce_tos` and
//!   `default_roce_mode`, after `mkdir <configfs>/rdma_cm/<ibdev>`.
//!
//! Reads return a [`Reading`]: the value and the mechanism it came from, "unsupported" when no
//! flavour's file exists, or the error. Writes never create files: a driver attribute that is
//! not there cannot be set by creating it. Reads go through [`read_attr`] (and writes open
//! non-blocking), so a FIFO in place of an attribute cannot stall `qos show` or the agent; values
//! quoted in errors are [`shown`].

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rocefabric_api::Mechanism;
use rocefabric_api::Trust;
use rocefabric_api::nic_selector::normalize_pci_address;
use rocefabric_input::read::{attr, read_attr};
use rocefabric_input::shown;

use super::model::{EcnPoint, Reading};

/// Where sysfs, debugfs and configfs are mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    pub sysfs: PathBuf,
    pub debugfs: PathBuf,
    pub configfs: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            sysfs: PathBuf::from("/sys"),
            debugfs: PathBuf::from("/sys/kernel/debug"),
            configfs: PathBuf::from("/sys/kernel/config"),
        }
    }
}

/// The RDMA device and port behind a netdev.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaPort {
    pub device: String,
    pub port: u32,
    /// A virtual RDMA device (Soft-RoCE `rxe`) with no PCI function: it has no DCB of its own.
    pub is_virtual: bool,
}

/// A file operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to {op} {}: {source}", path.display())]
pub struct FileError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// The driver files of one netdev.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetdevFiles {
    pub roots: Roots,
    pub netdev: String,
    /// PCI function of the netdev (`0000:18:00.0`), from the `device` link.
    pub pci_address: Option<String>,
    /// RDMA device and port of the netdev, when it has one.
    pub rdma: Option<RdmaPort>,
}

/// A configfs value that may not be readable yet because the rdma_cm entry does not exist.
pub type ConfigfsValue<T> = Option<T>;

impl NetdevFiles {
    /// Find the PCI function and RDMA device of `netdev` from sysfs.
    pub fn resolve(roots: &Roots, netdev: &str) -> Self {
        let net = roots.sysfs.join("class/net").join(netdev);
        let pci_address = fs::read_link(net.join("device"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
            .and_then(|n| normalize_pci_address(&n));
        let rdma = find_rdma_port(&net.join("device/infiniband"), netdev)
            .or_else(|| find_virtual_rdma_port(&roots.sysfs, netdev));
        Self {
            roots: roots.clone(),
            netdev: netdev.to_string(),
            pci_address,
            rdma,
        }
    }

    /// Build from what discovery already knows.
    pub fn known(
        roots: &Roots,
        netdev: &str,
        pci_address: Option<String>,
        rdma: Option<RdmaPort>,
    ) -> Self {
        Self {
            roots: roots.clone(),
            netdev: netdev.to_string(),
            pci_address,
            rdma,
        }
    }

    /// Whether the netdev's RDMA device is virtual (Soft-RoCE).
    pub fn is_virtual(&self) -> bool {
        self.rdma.as_ref().is_some_and(|r| r.is_virtual)
    }

    fn net_dir(&self) -> PathBuf {
        self.roots.sysfs.join("class/net").join(&self.netdev)
    }

    /// `<sysfs>/class/net/<if>/qos/trust` (out-of-tree driver).
    pub fn trust_path(&self) -> PathBuf {
        self.net_dir().join("qos/trust")
    }

    /// `<sysfs>/class/net/<if>/ecn/<point>/enable`.
    pub fn ecn_enable_dir(&self, point: EcnPoint) -> PathBuf {
        self.net_dir().join("ecn").join(point.name()).join("enable")
    }

    fn cc_params(&self) -> Option<PathBuf> {
        self.pci_address
            .as_ref()
            .map(|bdf| self.roots.debugfs.join("mlx5").join(bdf).join("cc_params"))
    }

    /// `<configfs>/rdma_cm`.
    pub fn rdma_cm_root(&self) -> PathBuf {
        self.roots.configfs.join("rdma_cm")
    }

    /// `<configfs>/rdma_cm/<ibdev>`.
    pub fn rdma_cm_dir(&self) -> Option<PathBuf> {
        self.rdma
            .as_ref()
            .map(|r| self.rdma_cm_root().join(&r.device))
    }

    fn rdma_cm_port_file(&self, name: &str) -> Option<PathBuf> {
        self.rdma.as_ref().map(|r| {
            self.rdma_cm_root()
                .join(&r.device)
                .join("ports")
                .join(r.port.to_string())
                .join(name)
        })
    }

    /// Trust from the out-of-tree driver's `qos/trust`; `None` when that file does not exist.
    pub fn read_trust(&self) -> Option<Reading<Trust>> {
        let path = self.trust_path();
        if !path.exists() {
            return None;
        }
        Some(match read_attr(&path) {
            Ok(text) => match parse_trust(&text) {
                Some(t) => Reading::value(Mechanism::Sysfs, t),
                None => Reading::failed(
                    Mechanism::Sysfs,
                    format!(
                        "{}: unrecognised trust \"{}\"",
                        path.display(),
                        shown(&text)
                    ),
                ),
            },
            Err(e) => Reading::failed(Mechanism::Sysfs, e.to_string()),
        })
    }

    pub fn write_trust(&self, trust: Trust) -> Result<(), FileError> {
        write_attr(&self.trust_path(), &trust.to_string())
    }

    /// Priorities with ECN enabled at `point` (out-of-tree driver's per-priority files).
    pub fn read_ecn(&self, point: EcnPoint) -> Reading<Vec<u8>> {
        let dir = self.ecn_enable_dir(point);
        if !dir.is_dir() {
            return Reading::unsupported(format!(
                "no ECN files at {} (needs NVIDIA's out-of-tree mlx5 driver, on the PF; the upstream \
                 driver leaves ECN enable to the firmware)",
                dir.display()
            ));
        }
        let mut enabled = Vec::new();
        for prio in 0u8..8 {
            let path = dir.join(prio.to_string());
            match read_attr(&path).map(|t| (parse_number(&t), t)) {
                Ok((Some(0), _)) => {}
                Ok((Some(_), _)) => enabled.push(prio),
                Ok((None, t)) => {
                    return Reading::failed(
                        Mechanism::Sysfs,
                        format!("{}: not a number: \"{}\"", path.display(), shown(&t)),
                    );
                }
                Err(e) => return Reading::failed(Mechanism::Sysfs, e.to_string()),
            }
        }
        Reading::value(Mechanism::Sysfs, enabled)
    }

    pub fn write_ecn(&self, point: EcnPoint, priority: u8, enabled: bool) -> Result<(), FileError> {
        let path = self.ecn_enable_dir(point).join(priority.to_string());
        write_attr(&path, if enabled { "1" } else { "0" })
    }

    /// The file holding the CNP DSCP: out-of-tree sysfs first, then upstream debugfs.
    pub fn cnp_dscp_file(&self) -> Result<(Mechanism, PathBuf), String> {
        self.cnp_file("cnp_dscp", "np_cnp_dscp")
    }

    /// The file holding the CNP priority: out-of-tree sysfs first, then upstream debugfs.
    pub fn cnp_priority_file(&self) -> Result<(Mechanism, PathBuf), String> {
        self.cnp_file("cnp_802p_prio", "np_cnp_prio")
    }

    fn cnp_file(
        &self,
        sysfs_name: &str,
        debugfs_name: &str,
    ) -> Result<(Mechanism, PathBuf), String> {
        let sys = self.net_dir().join("ecn/roce_np").join(sysfs_name);
        if sys.exists() {
            return Ok((Mechanism::Sysfs, sys));
        }
        match self.cc_params().map(|d| d.join(debugfs_name)) {
            Some(dbg) if dbg.exists() => Ok((Mechanism::Debugfs, dbg)),
            Some(dbg) => Err(format!(
                "neither {} (out-of-tree driver) nor {} (upstream debugfs) exists",
                sys.display(),
                dbg.display()
            )),
            None => Err(format!(
                "no {} (out-of-tree driver), and {} has no PCI device for the upstream debugfs cc_params",
                sys.display(),
                self.netdev
            )),
        }
    }

    /// Read a decimal value from a CNP file.
    pub fn read_number(file: Result<(Mechanism, PathBuf), String>) -> Reading<u8> {
        match file {
            Err(reason) => Reading::unsupported(reason),
            Ok((mech, path)) => match read_attr(&path) {
                Ok(text) => match parse_number(&text).and_then(|n| u8::try_from(n).ok()) {
                    Some(v) => Reading::value(mech, v),
                    None => {
                        let text = shown(&text);
                        Reading::failed(
                            mech,
                            format!("{}: not a number: \"{text}\"", path.display()),
                        )
                    }
                },
                Err(e) => Reading::failed(mech, e.to_string()),
            },
        }
    }

    pub fn read_cnp_dscp(&self) -> Reading<u8> {
        Self::read_number(self.cnp_dscp_file())
    }

    pub fn read_cnp_priority(&self) -> Reading<u8> {
        Self::read_number(self.cnp_priority_file())
    }

    /// Why configfs knobs cannot be set, if they cannot.
    fn configfs_unsupported(&self) -> Option<String> {
        if self.rdma.is_none() {
            return Some(format!(
                "{} has no RDMA device, so no rdma_cm settings",
                self.netdev
            ));
        }
        let root = self.rdma_cm_root();
        if !root.is_dir() {
            return Some(format!(
                "{} does not exist (configfs not mounted or rdma_cm not loaded)",
                root.display()
            ));
        }
        None
    }

    /// `default_roce_tos`; `Value(None)` when the rdma_cm entry of the device is not created yet.
    pub fn read_roce_tos(&self) -> Reading<ConfigfsValue<u8>> {
        self.read_configfs("default_roce_tos", |t| {
            parse_number(t).and_then(|n| u8::try_from(n).ok())
        })
    }

    /// `default_roce_mode` (`RoCE v2`, `IB/RoCE v1`).
    pub fn read_roce_mode(&self) -> Reading<ConfigfsValue<String>> {
        self.read_configfs("default_roce_mode", |t| Some(t.trim().to_string()))
    }

    fn read_configfs<T>(
        &self,
        name: &str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Reading<ConfigfsValue<T>> {
        if let Some(reason) = self.configfs_unsupported() {
            return Reading::unsupported(reason);
        }
        let (Some(dir), Some(path)) = (self.rdma_cm_dir(), self.rdma_cm_port_file(name)) else {
            return Reading::unsupported(format!("{} has no RDMA device", self.netdev));
        };
        if !dir.is_dir() {
            return Reading::value(Mechanism::Configfs, None);
        }
        match read_attr(&path) {
            Ok(text) => match parse(&text) {
                Some(v) => Reading::value(Mechanism::Configfs, Some(v)),
                None => Reading::failed(
                    Mechanism::Configfs,
                    format!("{}: unparsable \"{}\"", path.display(), shown(&text)),
                ),
            },
            Err(e) => Reading::failed(Mechanism::Configfs, e.to_string()),
        }
    }

    /// `mkdir <configfs>/rdma_cm/<ibdev>` when it does not exist (the kernel then creates `ports/`).
    pub fn ensure_rdma_cm_dir(&self) -> Result<bool, FileError> {
        let Some(dir) = self.rdma_cm_dir() else {
            return Err(FileError {
                op: "create",
                path: self.rdma_cm_root(),
                source: io::Error::new(io::ErrorKind::NotFound, "no RDMA device for this netdev"),
            });
        };
        if dir.is_dir() {
            return Ok(false);
        }
        fs::create_dir(&dir).map_err(|source| FileError {
            op: "mkdir",
            path: dir,
            source,
        })?;
        Ok(true)
    }

    pub fn write_roce_tos(&self, tos: u8) -> Result<(), FileError> {
        self.write_configfs("default_roce_tos", &tos.to_string())
    }

    pub fn write_roce_mode(&self, mode: &str) -> Result<(), FileError> {
        self.write_configfs("default_roce_mode", mode)
    }

    fn write_configfs(&self, name: &str, value: &str) -> Result<(), FileError> {
        self.ensure_rdma_cm_dir()?;
        let path = self
            .rdma_cm_port_file(name)
            .unwrap_or_else(|| self.rdma_cm_root().join(name));
        write_attr(&path, value)
    }

    /// `<sysfs>/class/infiniband/<ibdev>/ports/<n>/<relative>` (`hw_counters/sent_pkts`).
    pub fn rdma_port_path(&self, relative: &str) -> Option<PathBuf> {
        self.rdma.as_ref().map(|r| {
            self.roots
                .sysfs
                .join("class/infiniband")
                .join(&r.device)
                .join("ports")
                .join(r.port.to_string())
                .join(relative)
        })
    }
}

/// A virtual RDMA device (Soft-RoCE) on `netdev`: nothing under the netdev points to it, so look
/// for a `class/infiniband` device without a `device` link whose `parent` names the netdev, then
/// (a device on an upper netdev such as a VLAN lists it in its GID table) one whose GIDs do.
fn find_virtual_rdma_port(sysfs: &Path, netdev: &str) -> Option<RdmaPort> {
    let class = sysfs.join("class/infiniband");
    let mut devices: Vec<String> = fs::read_dir(&class)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|d| !class.join(d).join("device").exists())
        .collect();
    devices.sort();
    let by_parent = devices
        .iter()
        .find(|d| attr(&class.join(d).join("parent")).is_some_and(|p| p == netdev));
    let by_gid = || {
        devices.iter().find(|d| {
            fs::read_dir(class.join(d).join("ports/1/gid_attrs/ndevs"))
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .filter_map(|e| attr(&e.path()))
                .any(|n| n == netdev)
        })
    };
    by_parent.or_else(by_gid).map(|device| RdmaPort {
        device: device.clone(),
        port: 1,
        is_virtual: true,
    })
}

/// Find the RDMA device and port of `netdev` among `<function>/infiniband/*`: the port whose
/// `gid_attrs/ndevs/*` names the netdev, else port 1 of the only device.
fn find_rdma_port(infiniband_dir: &Path, netdev: &str) -> Option<RdmaPort> {
    let mut devices: Vec<String> = fs::read_dir(infiniband_dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    devices.sort();
    for device in &devices {
        let ports_dir = infiniband_dir.join(device).join("ports");
        let mut ports: Vec<u32> = fs::read_dir(&ports_dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        ports.sort_unstable();
        for port in &ports {
            let ndevs = ports_dir.join(port.to_string()).join("gid_attrs/ndevs");
            let names = fs::read_dir(&ndevs)
                .into_iter()
                .flatten()
                .filter_map(Result::ok);
            // Unused GID indexes fail to read (EINVAL): skip them.
            if names.filter_map(|e| attr(&e.path())).any(|n| n == netdev) {
                return Some(RdmaPort {
                    device: device.clone(),
                    port: *port,
                    is_virtual: false,
                });
            }
        }
    }
    match devices.as_slice() {
        [only] => Some(RdmaPort {
            device: only.clone(),
            port: 1,
            is_virtual: false,
        }),
        _ => None,
    }
}

/// Write a sysfs/configfs attribute as `echo VALUE > FILE` does (with a newline), never creating it.
pub fn write_attr(path: &Path, value: &str) -> Result<(), FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| FileError {
        op: "write",
        path: path.to_path_buf(),
        source,
    };
    // Non-blocking: a FIFO without a reader fails (ENXIO) instead of blocking the open forever.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(err)?;
    f.write_all(format!("{value}\n").as_bytes()).map_err(err)
}

/// The last run of decimal digits in `text` (`"106\n"`, `"Global tclass=106"`).
pub fn parse_number(text: &str) -> Option<u32> {
    let t = text.trim();
    let end = t.rfind(|c: char| c.is_ascii_digit())? + 1;
    // Counted in bytes: the character before the digits may be several bytes long.
    let start = end
        - t[..end]
            .bytes()
            .rev()
            .take_while(u8::is_ascii_digit)
            .count();
    t[start..end].parse().ok()
}

/// `dscp`/`pcp`, tolerating surrounding text (`"Priority trust state: dscp"`).
pub fn parse_trust(text: &str) -> Option<Trust> {
    let t = text.trim().to_ascii_lowercase();
    match (t.contains("dscp"), t.contains("pcp")) {
        (true, false) => Some(Trust::Dscp),
        (false, true) => Some(Trust::Pcp),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn a_soft_roce_parent_resolves_to_its_rxe_device_without_a_pci_function() {
        use rocefabric_node_testing::fixtures::FixtureNode;
        for (node, netdev) in [
            (FixtureNode::vm_soft_roce(), "eth0"),
            (
                FixtureNode::dgx_h100().with_soft_roce("rxe0", "eno3", Some(14)),
                "eno3",
            ),
        ] {
            let (_dir, roots) = crate::fixture_tests::written_roots(&node);
            let files = NetdevFiles::resolve(&roots, netdev);
            assert_eq!(
                files.rdma,
                Some(RdmaPort {
                    device: "rxe0".into(),
                    port: 1,
                    is_virtual: true,
                }),
                "{netdev}"
            );
        }
        // A ConnectX netdev keeps its own device even with an rxe elsewhere on the node.
        let (_dir, roots) = crate::fixture_tests::written_roots(
            &FixtureNode::dgx_h100().with_soft_roce("rxe0", "eno3", Some(14)),
        );
        let files = NetdevFiles::resolve(&roots, "enp24s0np0");
        assert_eq!(files.rdma.map(|r| r.device).as_deref(), Some("mlx5_0"));
    }

    /// `qos show` and the agent read these files on every pass: a FIFO, a huge value or a long
    /// malformed one fails that knob, naming the file, and never blocks or floods the report.
    #[test]
    fn fifos_and_huge_values_fail_their_knob_without_blocking() {
        use crate::fixture_tests::{Flavour, tree};
        use rocefabric_node_testing::fixtures::replace_with_fifo;
        let t = tree(Flavour::OutOfTree, true);
        let net = t.roots.sysfs.join("class/net/enp24s0np0");
        let gid0 = t
            .roots
            .sysfs
            .join("class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0");
        replace_with_fifo(&gid0).unwrap();
        let files = NetdevFiles::resolve(&t.roots, "enp24s0np0");
        assert_eq!(
            files.rdma.as_ref().map(|r| r.device.as_str()),
            Some("mlx5_0")
        );

        let trust = net.join("qos/trust");
        let ecn3 = net.join("ecn/roce_np/enable/3");
        replace_with_fifo(&trust).unwrap();
        replace_with_fifo(&ecn3).unwrap();
        fs::write(net.join("ecn/roce_np/cnp_dscp"), "4".repeat(1 << 20)).unwrap();
        fs::write(net.join("ecn/roce_np/cnp_802p_prio"), "x".repeat(10_000)).unwrap();
        fn failed<T: std::fmt::Debug>(r: Reading<T>) -> String {
            match r {
                Reading::Failed { error, .. } => error,
                other => panic!("expected a failed read, got {other:?}"),
            }
        }
        let fifo = |p: &Path| format!("{} is a FIFO, not a regular file", p.display());
        assert_eq!(failed(files.read_trust().unwrap()), fifo(&trust));
        assert_eq!(failed(files.read_ecn(EcnPoint::Notification)), fifo(&ecn3));
        assert_eq!(
            failed(files.read_cnp_dscp()),
            format!(
                "{} is larger than the 16 KiB limit",
                net.join("ecn/roce_np/cnp_dscp").display()
            )
        );
        assert_eq!(
            failed(files.read_cnp_priority()),
            format!(
                "{}: not a number: \"{}…(10000 bytes)\"",
                net.join("ecn/roce_np/cnp_802p_prio").display(),
                "x".repeat(64)
            )
        );
        // Writing opens non-blocking: a FIFO without a reader fails instead of hanging.
        let e = files.write_trust(Trust::Dscp).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("failed to write {}: ", trust.display())),
            "{e}"
        );
    }

    #[test]
    fn numbers_are_found_at_the_end() {
        assert_eq!(parse_number("106\n"), Some(106));
        assert_eq!(parse_number("Global tclass=106"), Some(106));
        assert_eq!(parse_number("0"), Some(0));
        assert_eq!(parse_number("none"), None);
        // Found by fuzz/ (sysfs_values): a multi-byte character right before the digits.
        assert_eq!(parse_number("tclass=\u{e9}106"), Some(106));
    }

    #[test]
    fn trust_text_is_recognised() {
        assert_eq!(parse_trust("dscp\n"), Some(Trust::Dscp));
        assert_eq!(parse_trust("Priority trust state: pcp"), Some(Trust::Pcp));
        assert_eq!(parse_trust("both dscp pcp"), None);
    }
}

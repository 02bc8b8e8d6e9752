//! Reading what a pod already has (pure parsers; the CLI feeds them flags, files and variables):
//! the device plugin's `NCCL_IB_HCA` / `NCCL_IB_GID_INDEX` / `NCCL_IB_TC`, and addresses.

use rocefabric_formats::env::{
    NCCL_IB_GID_INDEX, NCCL_IB_HCA, NCCL_IB_TC, POD_NAME, POD_UID, ROCEFABRIC_DIRECTORY,
    ROCEFABRIC_DSM_MAX_PEERS, ROCEFABRIC_DSM_MAX_PEERS_PER_SOURCE, ROCEFABRIC_DSM_PORT,
    ROCEFABRIC_HCA, ROCEFABRIC_KEY_DIR, ROCEFABRIC_REGION_FILE,
};
use rocefabric_formats::names::{FABRIC_KEY_KEY, FABRIC_KEY_NAMESPACE_KEY, FABRIC_KEY_SUFFIX};

use crate::auth::FabricKey;

use crate::directory::{self, Directory};
use crate::error::{DsmError, Result};

/// The first HCA port of an `NCCL_IB_HCA` value (`=mlx5_0:1,mlx5_3:1`, `mlx5_0`, `^mlx5_1` is an
/// exclusion list and names no device to use).
pub fn hca_from_nccl(value: &str) -> Result<(String, u8)> {
    let bad = |why: &str| DsmError::input(NCCL_IB_HCA, value, why);
    let v = value.trim();
    if v.starts_with('^') {
        return Err(bad("an exclusion list names no device: pass --hca"));
    }
    let first = v
        .trim_start_matches('=')
        .split(',')
        .next()
        .unwrap_or("")
        .trim();
    if first.is_empty() {
        return Err(bad("no device"));
    }
    hca_port(first).map_err(|_| bad("expected DEVICE[:PORT][,...]"))
}

/// `DEVICE[:PORT]` (port 1 by default).
pub fn hca_port(text: &str) -> Result<(String, u8)> {
    let bad = |why: &str| DsmError::input("HCA", text, why);
    let (name, port) = match text.split_once(':') {
        Some((n, p)) => (n, p.parse::<u8>().map_err(|_| bad("port must be 1..255"))?),
        None => (text, 1),
    };
    if name.is_empty() || port == 0 {
        return Err(bad("expected DEVICE[:PORT]"));
    }
    Ok((name.to_string(), port))
}

/// An integer in decimal or `0x` hex.
pub fn number(field: &str, text: &str) -> Result<u64> {
    let t = text.trim().replace('_', "");
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    r.map_err(|_| DsmError::input(field, text, "not a number (decimal or 0x hex)"))
}

/// A global address: a number, or `POD+OFFSET` / `POD` relative to the start of a pod's window in
/// `directory`.
pub fn address(text: &str, directory: &Directory) -> Result<u64> {
    let t = text.trim();
    if t.starts_with(|c: char| c.is_ascii_digit()) {
        return number("address", t);
    }
    let (pod, off) = match t.split_once('+') {
        Some((p, o)) => (p, number("address", o)?),
        None => (t, 0),
    };
    let e = directory.pod(pod).ok_or_else(|| {
        DsmError::input("address", text, format!("no pod {pod:?} in the directory"))
    })?;
    e.base
        .checked_add(off)
        .ok_or_else(|| DsmError::input("address", text, "overflows 64 bits"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_plugins_environment_names_the_granted_port() {
        assert_eq!(
            hca_from_nccl("=mlx5_0:1,mlx5_3:1").unwrap(),
            ("mlx5_0".into(), 1)
        );
        assert_eq!(hca_from_nccl("rxe0").unwrap(), ("rxe0".into(), 1));
        assert_eq!(hca_from_nccl("mlx5_2:2").unwrap(), ("mlx5_2".into(), 2));
        let e = hca_from_nccl("^mlx5_1").unwrap_err().to_string();
        assert!(e.starts_with("NCCL_IB_HCA \"^mlx5_1\""), "{e}");
        assert!(hca_from_nccl("=").is_err());
        assert!(
            hca_from_nccl("mlx5_0:x")
                .unwrap_err()
                .to_string()
                .contains("NCCL_IB_HCA")
        );
    }

    #[test]
    fn addresses_are_numbers_or_relative_to_a_pods_window() {
        let d = Directory::parse("d", r#"[{"pod":"b","id":1,"base":4096,"size":4096}]"#).unwrap();
        assert_eq!(address("0x1000", &d).unwrap(), 4096);
        assert_eq!(address("4_096", &d).unwrap(), 4096);
        assert_eq!(address("b", &d).unwrap(), 4096);
        assert_eq!(address("b+0x10", &d).unwrap(), 4112);
        let e = address("c+1", &d).unwrap_err().to_string();
        assert_eq!(e, "address \"c+1\": no pod \"c\" in the directory");
        assert!(
            address("0xzz", &d)
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
    }
}

/// Where the pod's inputs are, as flags or variables name them (strings, so errors can quote them).
#[derive(Clone, Debug)]
pub struct Inputs {
    /// The downward-API file of the `rocefabric.io/region` annotation.
    pub region_file: std::path::PathBuf,
    /// `regions.json` of the mounted `<fabric>-regions` ConfigMap.
    pub directory: std::path::PathBuf,
    /// The mounted `<fabric>-key` Secret (files `key` and `namespace`).
    pub key_dir: std::path::PathBuf,
    /// `DEVICE[:PORT]`; else the first port of `NCCL_IB_HCA`.
    pub hca: Option<String>,
    pub nccl_ib_hca: Option<String>,
    /// `NCCL_IB_GID_INDEX` (the RoCE v2 GID index the device plugin chose).
    pub gid_index: Option<String>,
    /// `NCCL_IB_TC` (the fabric's RoCE traffic class), 0 when unset.
    pub traffic_class: Option<String>,
    /// `POD_NAME`, else the host name.
    pub pod: Option<String>,
    /// `POD_UID`, else the annotation's uid.
    pub uid: Option<String>,
    pub listen: std::net::IpAddr,
    pub port: u16,
    pub hugepages: Option<std::path::PathBuf>,
    pub expose: bool,
    /// `ROCEFABRIC_DSM_MAX_PEERS` and `ROCEFABRIC_DSM_MAX_PEERS_PER_SOURCE`: the endpoint's caps,
    /// when not the defaults ([`crate::endpoint::Limits`]).
    pub max_peers: Option<String>,
    pub max_peers_per_source: Option<String>,
}

/// Default rendezvous port of the fabric's pods.
pub const DEFAULT_PORT: u16 = 18516;
pub const DEFAULT_REGION_FILE: &str = "/etc/rocefabric/region";
pub const DEFAULT_DIRECTORY: &str = "/etc/rocefabric/directory/regions.json";
pub const DEFAULT_KEY_DIR: &str = "/etc/rocefabric/key";

impl Inputs {
    /// The conventional pod: files at the default paths, the device plugin's variables,
    /// `ROCEFABRIC_REGION_FILE`, `ROCEFABRIC_DIRECTORY`, `ROCEFABRIC_HCA`, `ROCEFABRIC_DSM_PORT`,
    /// `ROCEFABRIC_DSM_MAX_PEERS[_PER_SOURCE]`, `POD_NAME`, `POD_UID` override.
    pub fn from_env() -> Result<Inputs> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let port = match var(ROCEFABRIC_DSM_PORT) {
            Some(p) => p
                .parse()
                .map_err(|_| DsmError::input(ROCEFABRIC_DSM_PORT, p, "not a port"))?,
            None => DEFAULT_PORT,
        };
        Ok(Inputs {
            region_file: var(ROCEFABRIC_REGION_FILE)
                .unwrap_or_else(|| DEFAULT_REGION_FILE.into())
                .into(),
            directory: var(ROCEFABRIC_DIRECTORY)
                .unwrap_or_else(|| DEFAULT_DIRECTORY.into())
                .into(),
            key_dir: var(ROCEFABRIC_KEY_DIR)
                .unwrap_or_else(|| DEFAULT_KEY_DIR.into())
                .into(),
            hca: var(ROCEFABRIC_HCA),
            nccl_ib_hca: var(NCCL_IB_HCA),
            gid_index: var(NCCL_IB_GID_INDEX),
            traffic_class: var(NCCL_IB_TC),
            pod: var(POD_NAME),
            uid: var(POD_UID),
            listen: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            port,
            hugepages: None,
            expose: true,
            max_peers: var(ROCEFABRIC_DSM_MAX_PEERS),
            max_peers_per_source: var(ROCEFABRIC_DSM_MAX_PEERS_PER_SOURCE),
        })
    }

    /// Read the region file and check every input, naming the one that is wrong.
    pub fn config(self) -> Result<crate::Config> {
        let field = self.region_file.display().to_string();
        // A downward-API file of one annotation: far below 1 MiB (the cap keeps /dev/zero out).
        let text = rocefabric_input::read::read_file(&self.region_file, 1 << 20).map_err(|e| {
            DsmError::input(&field, "", format!("cannot read this pod's region annotation (is the pod in a fabric with sharedMemory?): {e}"))
        })?;
        let window = directory::parse_assignment(&field, &text)?;
        let (hca, port) = match (&self.hca, &self.nccl_ib_hca) {
            (Some(h), _) => hca_port(h)?,
            (None, Some(n)) => hca_from_nccl(n)?,
            (None, None) => {
                return Err(DsmError::input(
                    NCCL_IB_HCA,
                    "",
                    "unset: request rdma/hca or pass --hca",
                ));
            }
        };
        let gid = self
            .gid_index
            .as_deref()
            .ok_or_else(|| DsmError::input(NCCL_IB_GID_INDEX, "", "unset: pass --gid-index"))?;
        let gid_index = u32::try_from(number(NCCL_IB_GID_INDEX, gid)?)
            .map_err(|_| DsmError::input(NCCL_IB_GID_INDEX, gid, "too large"))?;
        let traffic_class = match self.traffic_class.as_deref() {
            Some(t) => u8::try_from(number(NCCL_IB_TC, t)?)
                .map_err(|_| DsmError::input(NCCL_IB_TC, t, "must be 0..255"))?,
            None => 0,
        };
        let pod = match self.pod {
            Some(p) => p,
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .map_err(|e| {
                    DsmError::input(POD_NAME, "", format!("unset and no host name: {e}"))
                })?,
        };
        let uid = match (self.uid, &window.uid) {
            (Some(u), Some(w)) if &u != w => {
                return Err(DsmError::input(
                    &field,
                    text.trim(),
                    format!("written for pod uid {w}, this pod is {u}: a copied annotation"),
                ));
            }
            (Some(u), _) => u,
            (None, Some(w)) => w.clone(),
            (None, None) => {
                return Err(DsmError::input(
                    POD_UID,
                    "",
                    "unset and the annotation has no uid",
                ));
            }
        };
        let mut limits = crate::endpoint::Limits::default();
        for (var, value, cap) in [
            (
                ROCEFABRIC_DSM_MAX_PEERS,
                &self.max_peers,
                &mut limits.max_peers,
            ),
            (
                ROCEFABRIC_DSM_MAX_PEERS_PER_SOURCE,
                &self.max_peers_per_source,
                &mut limits.max_per_source,
            ),
        ] {
            if let Some(v) = value {
                *cap = match number(var, v)? {
                    0 => return Err(DsmError::input(var, v, "must be at least 1")),
                    n => usize::try_from(n).map_err(|_| DsmError::input(var, v, "too large"))?,
                };
            }
        }
        let (namespace, key) = read_key(&self.key_dir, &window.fabric)?;
        Ok(crate::Config {
            pod,
            uid,
            namespace,
            key,
            window,
            directory: self.directory,
            hca,
            port,
            gid_index,
            traffic_class,
            listen: std::net::SocketAddr::new(self.listen, self.port),
            hugepages: self.hugepages,
            refresh: std::time::Duration::from_secs(1),
            expose: self.expose,
            limits,
        })
    }
}

/// The fabric key and its namespace from the mounted `<fabric>-key` Secret at `dir`.
pub fn read_key(dir: &std::path::Path, fabric: &str) -> Result<(String, FabricKey)> {
    let read = |name: &str| {
        let path = dir.join(name);
        let mut bytes = Vec::new();
        rocefabric_input::read::open_file(&path, 4096)
            .map_err(|e| e.to_string())
            .and_then(|mut r| {
                std::io::Read::read_to_end(&mut r, &mut bytes).map_err(|e| e.to_string())
            })
            .map(|_| bytes)
            .map_err(|e| {
                DsmError::input(
                    path.display().to_string(),
                    "",
                    format!(
                        "cannot read the fabric key (mount the Secret {fabric}{FABRIC_KEY_SUFFIX} \
                     read-only at {}): {e}",
                        dir.display()
                    ),
                )
            })
    };
    let key_path = dir.join(FABRIC_KEY_KEY).display().to_string();
    let key = FabricKey::new(&read(FABRIC_KEY_KEY)?)
        .map_err(|why| DsmError::input(&key_path, "", why))?;
    let ns_path = dir.join(FABRIC_KEY_NAMESPACE_KEY).display().to_string();
    let namespace = String::from_utf8(read(FABRIC_KEY_NAMESPACE_KEY)?)
        .map_err(|_| DsmError::input(&ns_path, "", "not UTF-8"))?
        .trim()
        .to_string();
    if namespace.is_empty() {
        return Err(DsmError::input(&ns_path, "", "empty"));
    }
    Ok((namespace, key))
}

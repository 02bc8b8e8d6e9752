//! The prepared claims on disk, so a restart of the daemon neither leaks a claim's devices nor
//! prepares them twice.
//!
//! A prepare records the claim as `preparing` (with its devices) before it writes the CDI spec,
//! and as `prepared` after; an unprepare removes the spec, then the record. Every write replaces
//! the file atomically (temporary file, fsync, rename). After a crash:
//! - a `preparing` record holds its devices in the ledger until the kubelet retries the prepare
//!   (which completes it; the kubelet retries until it gets an answer) or unprepares it;
//! - a spec file without a record cannot come from a crash (a spec is written after its record
//!   and removed before it); one left by a lost checkpoint is removed at start.
//!
//! The format is still version 1. Records written before CDI devices were per request (one CDI
//! id per physical device, no `wholeClaim`) load unchanged and answer what they answered then; their
//! spec files stay as written until the claim is unprepared, so a container restarted in place
//! still finds the ids the kubelet kept. An older daemon reading a newer file ignores
//! `wholeClaim`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rocefabric_input::read::{ReadError, read_regular};
use serde::{Deserialize, Serialize};

/// Format version of the file.
pub const VERSION: u32 = 1;

/// Where a claim's prepare stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClaimState {
    /// Devices taken; CDI spec possibly not written yet.
    Preparing,
    /// CDI spec written; the answer was (or is being) sent.
    Prepared,
}

/// One device of a prepared claim, as the kubelet was (or will be) told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    /// HCA ID or GPU PCI address (the ledger's key).
    pub physical: String,
    pub cdi_device_ids: Vec<String>,
    /// Reached with `adminAccess` (monitoring): held by nobody in the ledger.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

impl PreparedDevice {
    /// Whether the claim owns the device (and the ledger holds it for the claim).
    pub fn owned(&self) -> bool {
        !self.admin_access
    }
}

/// The answer's whole-claim entry, as the kubelet was (or will be) told: the whole-claim CDI
/// device of a claim with several requests, on one of the claim's devices under a request name no
/// container can name, so that only a container given the whole claim gets it, after the
/// requests' devices (see [`crate::prepare`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WholeClaimDevice {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_device_ids: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    pub namespace: String,
    pub name: String,
    pub state: ClaimState,
    /// One per allocation result of ours (request and device), in the allocation's order.
    pub devices: Vec<PreparedDevice>,
    /// Answered after `devices`; absent for a claim of one request, and in records written before
    /// CDI devices were per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whole_claim: Option<WholeClaimDevice>,
}

impl ClaimRecord {
    /// `namespace/name`.
    pub fn claim(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The whole file: claim UID -> record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub version: u32,
    pub claims: BTreeMap<String, ClaimRecord>,
}

/// Why the checkpoint cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read checkpoint {path}: {source}")]
    Read { path: PathBuf, source: ReadError },
    #[error(
        "checkpoint {path} is not a valid checkpoint ({source}); move it away to start afresh \
         (claims prepared before are then unknown to the driver)"
    )]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("checkpoint {path} has version {found}, this daemon reads version {VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("cannot write checkpoint {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The largest checkpoint read: a record is a few hundred bytes, a node holds at most a few
/// hundred claims.
pub const LIMIT: u64 = 16 * 1024 * 1024;

/// Read the checkpoint; a missing file is an empty checkpoint. Bounded: a FIFO, a device or a
/// file over [`LIMIT`] planted at the path is refused without blocking or filling memory.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let text = match read_regular(path, LIMIT) {
        Ok(text) => text,
        Err(e) if e.io_kind() == Some(std::io::ErrorKind::NotFound) => {
            return Ok(Checkpoint {
                version: VERSION,
                claims: BTreeMap::new(),
            });
        }
        Err(source) => {
            return Err(CheckpointError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let checkpoint: Checkpoint =
        serde_json::from_str(&text).map_err(|source| CheckpointError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
    if checkpoint.version != VERSION {
        return Err(CheckpointError::Version {
            path: path.to_path_buf(),
            found: checkpoint.version,
        });
    }
    Ok(checkpoint)
}

/// Replace the checkpoint atomically and durably.
pub fn save(path: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    let write = || -> std::io::Result<()> {
        let mut text = serde_json::to_vec_pretty(checkpoint)?;
        text.push(b'\n');
        rocefabric_runtime::file::write_atomic(path, &text, 0o600)
    };
    write().map_err(|source| CheckpointError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        assert!(
            load(&path).unwrap().claims.is_empty(),
            "missing file: empty"
        );
        let mut cp = load(&path).unwrap();
        cp.claims.insert(
            "uid-1".into(),
            ClaimRecord {
                namespace: "ns".into(),
                name: "c".into(),
                state: ClaimState::Preparing,
                devices: vec![PreparedDevice {
                    request_names: vec!["hca".into()],
                    pool: "node".into(),
                    device: "hca-mlx5-0".into(),
                    physical: "0000:18:00.0".into(),
                    cdi_device_ids: vec!["rocefabric.io/claim=uid-1-hca".into()],
                    admin_access: false,
                }],
                whole_claim: Some(WholeClaimDevice {
                    request_names: vec!["rocefabric.io/whole-claim".into()],
                    pool: "node".into(),
                    device: "hca-mlx5-0".into(),
                    cdi_device_ids: vec!["rocefabric.io/claim=uid-1".into()],
                }),
            },
        );
        save(&path, &cp).unwrap();
        assert_eq!(load(&path).unwrap(), cp);

        std::fs::write(&path, "{not json").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.contains("checkpoint.json") && err.contains("not a valid checkpoint"),
            "{err}"
        );
        std::fs::write(&path, r#"{"version": 9, "claims": {}}"#).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("version 9"), "{err}");
    }

    /// A file written before CDI devices were per request: one CDI id per physical device, a
    /// device listed once for all its requests, no `wholeClaim`.
    const BEFORE_PER_REQUEST: &str = r#"{
  "version": 1,
  "claims": {
    "uid-1": {
      "namespace": "ns",
      "name": "pairs",
      "state": "prepared",
      "devices": [
        {
          "requestNames": ["gpu", "spare"],
          "pool": "node-a",
          "device": "gpu-0",
          "physical": "0000:1b:00.0",
          "cdiDeviceIds": ["rocefabric.io/claim=uid-1-gpu-0"]
        },
        {
          "requestNames": ["hca"],
          "pool": "node-a",
          "device": "hca-mlx5-0",
          "physical": "0000:18:00.0",
          "cdiDeviceIds": ["rocefabric.io/claim=uid-1-hca-mlx5-0"],
          "adminAccess": true
        }
      ]
    }
  }
}
"#;

    #[test]
    fn a_checkpoint_from_before_per_request_devices_loads_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        std::fs::write(&path, BEFORE_PER_REQUEST).unwrap();
        let cp = load(&path).unwrap();
        let record = &cp.claims["uid-1"];
        assert_eq!(record.whole_claim, None);
        assert_eq!(record.devices.len(), 2);
        assert_eq!(record.devices[0].request_names, ["gpu", "spare"]);
        assert_eq!(
            record.devices[1].cdi_device_ids,
            ["rocefabric.io/claim=uid-1-hca-mlx5-0"]
        );
        assert!(record.devices[0].owned() && !record.devices[1].owned());
        // Saved again, it says the same: nothing added, nothing lost.
        save(&path, &cp).unwrap();
        let again: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let before: serde_json::Value = serde_json::from_str(BEFORE_PER_REQUEST).unwrap();
        assert_eq!(again, before);
    }

    #[test]
    fn a_fifo_a_device_or_a_huge_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        std::fs::write(&path, "{}").unwrap();
        rocefabric_node_testing::fixtures::replace_with_fifo(&path).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.contains("FIFO") && err.contains("checkpoint.json"),
            "{err}"
        );

        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("character device"), "{err}");

        std::fs::remove_file(&path).unwrap();
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(LIMIT + 1).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.contains("checkpoint.json") && err.contains("16 MiB"),
            "{err}"
        );
    }
}

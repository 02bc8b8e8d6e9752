//! What can go wrong, named so a caller can act on it: every access error carries the global
//! address, and once the owner is known, the owning pod.

/// Errors of the data plane.
#[derive(Debug, thiserror::Error)]
pub enum DsmError {
    /// No window of the directory contains the address.
    #[error("address {addr:#x}: not assigned to any pod in the directory")]
    Unassigned { addr: u64 },
    /// The access starts in a window but runs past its end.
    #[error(
        "address {addr:#x} (+{len} bytes): out of window: pod {owner} holds [{base:#x}, {end:#x})"
    )]
    OutOfWindow {
        addr: u64,
        len: u64,
        owner: String,
        base: u64,
        end: u64,
    },
    /// Atomics work on naturally aligned 8-byte words.
    #[error("address {addr:#x}: {op} needs an 8-byte aligned address (owner {owner})")]
    Misaligned {
        addr: u64,
        op: &'static str,
        owner: String,
    },
    /// The owner cannot be reached or is no longer the pod the directory names.
    #[error("address {addr:#x}: owner {owner} is gone: {reason}")]
    OwnerGone {
        addr: u64,
        owner: String,
        reason: String,
    },
    /// This side could not connect a queue pair to the owner (its HCA refused a step).
    #[error("address {addr:#x}: cannot connect to owner {owner}: {source}")]
    Connect {
        addr: u64,
        owner: String,
        source: Box<DsmError>,
    },
    /// The RDMA transport gave up on a posted request (the connection is dropped).
    #[error("address {addr:#x}: transport to owner {owner} failed: {status}")]
    Transport {
        addr: u64,
        owner: String,
        status: String,
    },
    /// Another waiter broke the lock while this holder was in its critical section (the section
    /// outlived its lease): what it did may have overlapped another holder's.
    #[error(
        "lock at {addr:#x} was broken while held (the section outlived its lease; the word is now {now:#x})"
    )]
    LockBroken { addr: u64, now: u64 },
    /// A configuration input is wrong: the field (file, flag or variable) and its value.
    #[error("{field} {value:?}: {reason}")]
    Input {
        field: String,
        value: String,
        reason: String,
    },
    /// The local window cannot be backed or registered.
    #[error("local window of {size} bytes: {reason}")]
    Memory { size: u64, reason: String },
    /// The staging buffer of a process that exposes no window cannot be backed or registered.
    #[error("staging buffer of {size} bytes: {reason}")]
    Staging { size: u64, reason: String },
    /// A verbs call on the local HCA failed.
    #[error("HCA {device}: {what}: {reason}")]
    Verbs {
        device: String,
        what: &'static str,
        reason: String,
    },
}

impl DsmError {
    pub(crate) fn input(
        field: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        DsmError::Input {
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = DsmError> = std::result::Result<T, E>;

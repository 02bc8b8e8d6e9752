//! Lossless RoCE QoS on the node's NICs: read every knob, plan what differs, write only that,
//! read back, and report each knob's outcome.
//!
//! One pipeline, one module per step:
//! - [`plan`] (pure): desired [`QosSpec`](rocefabric_api::QosSpec) against the observed state ->
//!   ordered writes;
//! - [`dcbnl`] (DCB netlink: IEEE PFC and APP table), [`rtnl`] (MTU), [`driver_files`]
//!   (out-of-tree sysfs, upstream debugfs, rdma_cm configfs): the kernel interfaces, each behind a
//!   small trait or a root path so tests need no NIC;
//! - [`apply`]: observe -> plan -> write -> read back -> per-knob [`KnobStatus`](rocefabric_api::KnobStatus);
//! - [`counters`]: PFC, CNP and ECN counters as Prometheus metrics, with [`ethtool`] reading the
//!   driver statistics (`ethtool -S`: pause durations, pause-storm events) over `SIOCETHTOOL`;
//! - [`default_route`] (pure): the node's default-route interfaces, kept out of QoS unless named;
//! - [`agent`]: the Kubernetes shell that applies a `RoceNode` and writes its status;
//! - [`gate`]: the device plugin's view of which netdevs are lossless.

pub mod agent;
pub mod apply;
pub mod counters;
pub mod dcbnl;
pub mod default_route;
pub mod driver_files;
pub mod ethtool;
#[cfg(test)]
mod fixture_tests;
pub mod gate;
pub mod netlink;
pub mod plan;
pub mod rtnl;

use rocefabric_api::Mechanism;

/// One knob's value as read from the kernel: the value and where it came from, "this NIC or
/// driver has no way to read or set it", or a read that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading<T> {
    Value { mechanism: Mechanism, value: T },
    Unsupported { reason: String },
    Failed { mechanism: Mechanism, error: String },
}

impl<T> Reading<T> {
    pub fn value(mechanism: Mechanism, value: T) -> Self {
        Reading::Value { mechanism, value }
    }

    pub fn unsupported(reason: impl Into<String>) -> Self {
        Reading::Unsupported {
            reason: reason.into(),
        }
    }

    pub fn failed(mechanism: Mechanism, error: impl Into<String>) -> Self {
        Reading::Failed {
            mechanism,
            error: error.into(),
        }
    }

    /// The value, when it was read.
    pub fn get(&self) -> Option<&T> {
        match self {
            Reading::Value { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The mechanism, when one exists on this device.
    pub fn mechanism(&self) -> Option<Mechanism> {
        match self {
            Reading::Value { mechanism, .. } | Reading::Failed { mechanism, .. } => {
                Some(*mechanism)
            }
            Reading::Unsupported { .. } => None,
        }
    }

    /// Transform the value, keeping the mechanism.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Reading<U> {
        match self {
            Reading::Value { mechanism, value } => Reading::Value {
                mechanism,
                value: f(value),
            },
            Reading::Unsupported { reason } => Reading::Unsupported { reason },
            Reading::Failed { mechanism, error } => Reading::Failed { mechanism, error },
        }
    }

    /// Borrowing [`Reading::map`].
    pub fn as_ref(&self) -> Reading<&T> {
        match self {
            Reading::Value { mechanism, value } => Reading::Value {
                mechanism: *mechanism,
                value,
            },
            Reading::Unsupported { reason } => Reading::Unsupported {
                reason: reason.clone(),
            },
            Reading::Failed { mechanism, error } => Reading::Failed {
                mechanism: *mechanism,
                error: error.clone(),
            },
        }
    }
}

/// Comma-separated priorities (`3`, `3,4`), or `none`.
pub fn priority_list(prios: &[u8]) -> String {
    if prios.is_empty() {
        "none".into()
    } else {
        prios
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

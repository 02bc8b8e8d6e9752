//! The QoS vocabulary, pure: what a knob reads as ([`Reading`]), IEEE PFC, DCB APP entries and
//! ECN points. The planner reasons in these terms; the kernel codecs (`dcbnl`, `driver_files`)
//! import them and own the byte layouts and file names.

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

/// Number of traffic priorities (`IEEE_8021QAZ_MAX_TCS`).
pub const MAX_PRIORITIES: usize = 8;

/// `IEEE_8021QAZ_APP_SEL_DSCP`: the protocol field is a DSCP value.
pub const APP_SEL_DSCP: u8 = 5;

/// IEEE 802.1Qbb PFC state of a port (the kernel's `struct ieee_pfc`, whose byte layout the DCB
/// netlink codec owns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IeeePfc {
    pub pfc_cap: u8,
    /// Bit i = PFC on priority i.
    pub pfc_en: u8,
    pub mbc: u8,
    /// Used by mlx5 as the cable length for buffer thresholds.
    pub delay: u16,
    /// PFC frames sent per priority (mlx5: `tx_prioN_pause`).
    pub requests: [u64; MAX_PRIORITIES],
    /// PFC frames received per priority (mlx5: `rx_prioN_pause`).
    pub indications: [u64; MAX_PRIORITIES],
}

impl IeeePfc {
    /// Priorities with PFC enabled, ascending.
    pub fn enabled_priorities(&self) -> Vec<u8> {
        bits_to_priorities(self.pfc_en)
    }
}

/// Priorities of a bitmap (bit i = priority i), ascending.
pub fn bits_to_priorities(bits: u8) -> Vec<u8> {
    (0u8..8).filter(|p| bits & (1 << p) != 0).collect()
}

/// One entry of a port's DCB APP table (the kernel's `struct dcb_app`): traffic matching
/// `selector` and `protocol` goes to `priority`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DcbApp {
    pub selector: u8,
    pub priority: u8,
    pub protocol: u16,
}

impl DcbApp {
    /// A DSCP -> priority entry.
    pub fn dscp(dscp: u8, priority: u8) -> Self {
        Self {
            selector: APP_SEL_DSCP,
            priority,
            protocol: u16::from(dscp),
        }
    }
}

/// ECN notification point (receiver, sends CNPs) or reaction point (sender, slows down).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EcnPoint {
    Notification,
    Reaction,
}

impl EcnPoint {
    /// The driver's name for it (`roce_np`, `roce_rp`), as in its sysfs `ecn/` directory.
    pub fn name(self) -> &'static str {
        match self {
            EcnPoint::Notification => "roce_np",
            EcnPoint::Reaction => "roce_rp",
        }
    }
}

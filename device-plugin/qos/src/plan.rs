//! The QoS plan (pure): desired settings against what the NIC holds -> the knobs that differ and
//! the ordered writes that fix them. Nothing that already holds is written: a PFC write flaps
//! the link on ConnectX even when nothing changes in the driver's eyes, so equal means untouched.
//!
//! Write order, and why:
//! 1. trust (out-of-tree `qos/trust`, or removing DSCP APP entries for PCP trust);
//! 2. DSCP -> priority APP entries, adds before removals (on mlx5 the first DSCP entry switches the
//!    port to DSCP trust and removing the last switches it back, so a replacement must never pass
//!    through an empty table);
//! 3. PFC, once, after classification is in place, so that traffic lands on the lossless
//!    priority as soon as the link comes back from the PFC change;
//! 4. ECN enables (notification point, then reaction point), then the CNP DSCP and priority;
//! 5. rdma_cm defaults: mode before ToS (the ToS is used for connections of that mode);
//! 6. MTU last: mlx5 recomputes its receive buffers for the MTU with the PFC config in place.

use std::fmt;

use rocefabric_api::{Knob, Mechanism, QosSpec, Trust};

use super::model::{
    APP_SEL_DSCP, DcbApp, EcnPoint, IeeePfc, Reading, bits_to_priorities, priority_list,
};

/// `default_roce_mode` the fabric wants.
pub const ROCE_V2_MODE: &str = "RoCE v2";

/// What the spec asks of one interface, in kernel terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub trust: Trust,
    /// DSCP -> priority entries (RoCE and CNP); empty with PCP trust, where DSCP is not used.
    pub dscp_map: Vec<DcbApp>,
    /// PFC enable bitmap.
    pub pfc_en: u8,
    /// ECN-enabled priorities (exactly these; the others are disabled).
    pub ecn: Vec<u8>,
    pub cnp_dscp: u8,
    pub cnp_priority: u8,
    /// rdma_cm default ToS (`roceDscp << 2 | ECT(0)`).
    pub roce_tos: u8,
    pub roce_mode: String,
    pub mtu: u32,
}

impl Desired {
    pub fn from_spec(q: &QosSpec) -> Self {
        let dscp_map = match q.trust {
            Trust::Dscp => {
                let mut m = vec![
                    DcbApp::dscp(q.roce_dscp, q.roce_priority),
                    DcbApp::dscp(q.cnp.dscp, q.cnp.priority),
                ];
                m.sort_by_key(|a| a.protocol);
                m.dedup_by_key(|a| a.protocol);
                m
            }
            Trust::Pcp => Vec::new(),
        };
        Self {
            trust: q.trust,
            dscp_map,
            pfc_en: q.pfc_enable_bits(),
            ecn: q.ecn_priorities(),
            cnp_dscp: q.cnp.dscp,
            cnp_priority: q.cnp.priority,
            roce_tos: q.traffic_class(),
            roce_mode: ROCE_V2_MODE.to_string(),
            mtu: u32::from(q.mtu),
        }
    }

    /// Knobs this spec asks for, in report order.
    pub fn knobs(&self) -> Vec<Knob> {
        let mut k = vec![Knob::Trust];
        if self.trust == Trust::Dscp {
            k.push(Knob::DscpMap);
        }
        k.extend([
            Knob::Pfc,
            Knob::EcnNotificationPoint,
            Knob::EcnReactionPoint,
            Knob::CnpDscp,
            Knob::CnpPriority,
            Knob::RoceTos,
            Knob::RoceMode,
            Knob::Mtu,
        ]);
        k
    }
}

/// Every knob as read from one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// From `qos/trust` (sysfs) or, without it, implied by the APP table (DCB netlink: DSCP
    /// entries present means DSCP trust, as mlx5 implements it).
    pub trust: Reading<Trust>,
    /// The whole APP table.
    pub app: Reading<Vec<DcbApp>>,
    pub pfc: Reading<IeeePfc>,
    pub ecn_np: Reading<Vec<u8>>,
    pub ecn_rp: Reading<Vec<u8>>,
    pub cnp_dscp: Reading<u8>,
    pub cnp_priority: Reading<u8>,
    /// `None`: the rdma_cm entry of the device does not exist yet.
    pub roce_tos: Reading<Option<u8>>,
    pub roce_mode: Reading<Option<String>>,
    pub mtu: Reading<u32>,
    /// DCBX mode flags, when DCB answers.
    pub dcbx: Option<u8>,
}

/// What the plan does about one knob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Holds already: nothing is written.
    Keep,
    /// Differs: the plan's writes for this knob fix it.
    Change,
    /// No mechanism on this NIC/driver.
    Unsupported(String),
    /// The current value could not be read, so nothing is written.
    ReadFailed(String),
}

/// One knob: desired and observed values as text, and the action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobPlan {
    pub knob: Knob,
    pub mechanism: Option<Mechanism>,
    pub desired: String,
    pub observed: Option<String>,
    pub action: Action,
}

/// One kernel write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// `echo dscp > qos/trust` (out-of-tree driver).
    Trust(Trust),
    /// DCB `IEEE_SET` of APP entries.
    AddApps(Vec<DcbApp>),
    /// DCB `IEEE_DEL` of APP entries (only those still present when it runs).
    DelApps(Vec<DcbApp>),
    /// DCB `IEEE_SET` of PFC (the observed struct with a new `pfc_en`).
    Pfc(IeeePfc),
    /// One per-priority ECN enable file.
    Ecn {
        point: EcnPoint,
        priority: u8,
        enabled: bool,
    },
    CnpDscp {
        mechanism: Mechanism,
        value: u8,
    },
    CnpPriority {
        mechanism: Mechanism,
        value: u8,
    },
    /// `default_roce_mode` (after `mkdir` of the rdma_cm entry if needed).
    RoceMode(String),
    /// `default_roce_tos` (after `mkdir` of the rdma_cm entry if needed).
    RoceTos(u8),
    /// rtnetlink `IFLA_MTU`.
    Mtu(u32),
}

impl Write {
    pub fn mechanism(&self) -> Mechanism {
        match self {
            Write::Trust(_) | Write::Ecn { .. } => Mechanism::Sysfs,
            Write::AddApps(_) | Write::DelApps(_) | Write::Pfc(_) => Mechanism::DcbNetlink,
            Write::CnpDscp { mechanism, .. } | Write::CnpPriority { mechanism, .. } => *mechanism,
            Write::RoceMode(_) | Write::RoceTos(_) => Mechanism::Configfs,
            Write::Mtu(_) => Mechanism::Rtnetlink,
        }
    }
}

fn apps_text(apps: &[DcbApp]) -> String {
    apps.iter()
        .map(|a| format!("{}:{}", a.protocol, a.priority))
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Display for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Write::Trust(t) => write!(f, "sysfs qos/trust <- {t}"),
            Write::AddApps(a) => write!(f, "dcb app add dscp-prio {}", apps_text(a)),
            Write::DelApps(a) => write!(f, "dcb app del dscp-prio {}", apps_text(a)),
            Write::Pfc(p) => write!(
                f,
                "dcb pfc set prio-pfc {} (pfc_en 0x{:02x})",
                priority_list(&p.enabled_priorities()),
                p.pfc_en
            ),
            Write::Ecn {
                point,
                priority,
                enabled,
            } => write!(
                f,
                "sysfs ecn/{}/enable/{priority} <- {}",
                point.name(),
                u8::from(*enabled)
            ),
            Write::CnpDscp { mechanism, value } => match mechanism {
                Mechanism::Debugfs => write!(f, "debugfs cc_params/np_cnp_dscp <- {value}"),
                _ => write!(f, "sysfs ecn/roce_np/cnp_dscp <- {value}"),
            },
            Write::CnpPriority { mechanism, value } => match mechanism {
                Mechanism::Debugfs => write!(f, "debugfs cc_params/np_cnp_prio <- {value}"),
                _ => write!(f, "sysfs ecn/roce_np/cnp_802p_prio <- {value}"),
            },
            Write::RoceMode(m) => write!(f, "configfs rdma_cm default_roce_mode <- {m}"),
            Write::RoceTos(t) => write!(f, "configfs rdma_cm default_roce_tos <- {t}"),
            Write::Mtu(m) => write!(f, "rtnetlink mtu <- {m}"),
        }
    }
}

/// A write and the knobs it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedWrite {
    pub knobs: Vec<Knob>,
    pub write: Write,
}

/// Knob actions (report order) and the writes (execution order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub knobs: Vec<KnobPlan>,
    pub writes: Vec<PlannedWrite>,
}

impl Plan {
    /// Every knob holds already.
    pub fn holds(&self) -> bool {
        self.knobs.iter().all(|k| k.action == Action::Keep)
    }

    pub fn knob(&self, knob: Knob) -> Option<&KnobPlan> {
        self.knobs.iter().find(|k| k.knob == knob)
    }

    /// Writes that serve `knob`.
    pub fn writes_for(&self, knob: Knob) -> impl Iterator<Item = &PlannedWrite> {
        self.writes.iter().filter(move |w| w.knobs.contains(&knob))
    }
}

/// Priorities mapped to `dscp` in the APP table.
fn dscp_priorities(app: &[DcbApp], dscp: u16) -> Vec<u8> {
    let mut p: Vec<u8> = app
        .iter()
        .filter(|a| a.selector == APP_SEL_DSCP && a.protocol == dscp)
        .map(|a| a.priority)
        .collect();
    p.sort_unstable();
    p.dedup();
    p
}

fn dscp_map_text(app: &[DcbApp], wanted: &[DcbApp]) -> String {
    wanted
        .iter()
        .map(|w| {
            let p = dscp_priorities(app, w.protocol);
            let prios = if p.is_empty() {
                "-".to_string()
            } else {
                p.iter().map(u8::to_string).collect::<Vec<_>>().join("|")
            };
            format!("{}:{prios}", w.protocol)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Compare and plan. Pure; deterministic. One step per knob (or pair of knobs written
/// together), in the order the writes must happen; the report follows [`Desired::knobs`].
pub fn plan(desired: &Desired, observed: &Observed) -> Plan {
    let mut p = Planner {
        desired,
        observed,
        knobs: Vec::new(),
        writes: Vec::new(),
    };
    let trust = p.trust();
    p.dscp_map(trust);
    p.pfc();
    p.ecn();
    p.cnp();
    p.rdma_cm();
    p.mtu();
    p.finish()
}

/// A reading judged against what is wanted: `(mechanism, observed text, action)`.
type Judged = (Option<Mechanism>, Option<String>, Action);

/// Generic comparison: reading -> (mechanism, observed text, action).
fn judge<T>(
    reading: &Reading<T>,
    show: impl Fn(&T) -> String,
    holds: impl Fn(&T) -> bool,
) -> Judged {
    match reading {
        Reading::Value { mechanism, value } => {
            let action = if holds(value) {
                Action::Keep
            } else {
                Action::Change
            };
            (Some(*mechanism), Some(show(value)), action)
        }
        Reading::Unsupported { reason } => (None, None, Action::Unsupported(reason.clone())),
        Reading::Failed { mechanism, error } => {
            (Some(*mechanism), None, Action::ReadFailed(error.clone()))
        }
    }
}

/// What the trust step decided, for the DSCP map step: with DCB-implied trust, the DSCP map's
/// adds are what switch the port to DSCP trust.
#[derive(Clone, Copy)]
struct TrustStep {
    changes: bool,
    mechanism: Option<Mechanism>,
}

/// The plan being built.
struct Planner<'a> {
    desired: &'a Desired,
    observed: &'a Observed,
    knobs: Vec<KnobPlan>,
    writes: Vec<PlannedWrite>,
}

impl Planner<'_> {
    fn push(&mut self, knob: Knob, desired_text: String, judged: Judged) {
        let (mechanism, observed, action) = judged;
        self.knobs.push(KnobPlan {
            knob,
            mechanism,
            desired: desired_text,
            observed,
            action,
        });
    }

    fn write(&mut self, knobs: Vec<Knob>, write: Write) {
        self.writes.push(PlannedWrite { knobs, write });
    }

    /// 1. Trust.
    fn trust(&mut self) -> TrustStep {
        let (desired, observed) = (self.desired, self.observed);
        let trust = judge(&observed.trust, |t| t.to_string(), |t| *t == desired.trust);
        let step = TrustStep {
            changes: trust.2 == Action::Change,
            mechanism: trust.0,
        };
        self.push(Knob::Trust, desired.trust.to_string(), trust);
        if step.changes {
            match step.mechanism {
                Some(Mechanism::Sysfs) => {
                    self.write(vec![Knob::Trust], Write::Trust(desired.trust))
                }
                // DCB: PCP trust means no DSCP APP entries; DSCP trust comes with the DSCP map.
                _ if desired.trust == Trust::Pcp => {
                    if let Some(app) = observed.app.get() {
                        let dscp: Vec<DcbApp> = app
                            .iter()
                            .filter(|a| a.selector == APP_SEL_DSCP)
                            .copied()
                            .collect();
                        self.write(vec![Knob::Trust], Write::DelApps(dscp));
                    }
                }
                _ => {}
            }
        }
        step
    }

    /// 2. DSCP map.
    fn dscp_map(&mut self, trust: TrustStep) {
        let (desired, observed) = (self.desired, self.observed);
        if desired.dscp_map.is_empty() {
            return;
        }
        let wanted = &desired.dscp_map;
        let holds = |app: &Vec<DcbApp>| {
            wanted
                .iter()
                .all(|w| dscp_priorities(app, w.protocol) == [w.priority])
        };
        let judged = judge(&observed.app, |app| dscp_map_text(app, wanted), holds);
        let changes = judged.2 == Action::Change;
        self.push(Knob::DscpMap, apps_text(wanted), judged);
        let Some(app) = observed.app.get().filter(|_| changes) else {
            return;
        };
        let add: Vec<DcbApp> = wanted
            .iter()
            .filter(|w| !app.contains(w))
            .copied()
            .collect();
        let del: Vec<DcbApp> = app
            .iter()
            .filter(|a| a.selector == APP_SEL_DSCP)
            .filter(|a| {
                wanted
                    .iter()
                    .any(|w| w.protocol == a.protocol && w.priority != a.priority)
            })
            .copied()
            .collect();
        // With DCB-implied trust, the adds are what switches the port to DSCP trust.
        let mut add_knobs = vec![Knob::DscpMap];
        if trust.changes && trust.mechanism == Some(Mechanism::DcbNetlink) {
            add_knobs.push(Knob::Trust);
        }
        if !add.is_empty() {
            self.write(add_knobs, Write::AddApps(add));
        }
        if !del.is_empty() {
            self.write(vec![Knob::DscpMap], Write::DelApps(del));
        }
    }

    /// 3. PFC.
    fn pfc(&mut self) {
        let (desired, observed) = (self.desired, self.observed);
        let pfc = judge(
            &observed.pfc,
            |p| priority_list(&p.enabled_priorities()),
            |p| p.pfc_en == desired.pfc_en,
        );
        if pfc.2 == Action::Change
            && let Some(current) = observed.pfc.get()
        {
            let new = IeeePfc {
                pfc_en: desired.pfc_en,
                requests: [0; 8],
                indications: [0; 8],
                ..*current
            };
            self.write(vec![Knob::Pfc], Write::Pfc(new));
        }
        self.push(
            Knob::Pfc,
            priority_list(&bits_to_priorities(desired.pfc_en)),
            pfc,
        );
    }

    /// 4. ECN, per priority, only the files that differ.
    fn ecn(&mut self) {
        let (desired, observed) = (self.desired, self.observed);
        for (knob, point, reading) in [
            (
                Knob::EcnNotificationPoint,
                EcnPoint::Notification,
                &observed.ecn_np,
            ),
            (Knob::EcnReactionPoint, EcnPoint::Reaction, &observed.ecn_rp),
        ] {
            let judged = judge(reading, |v| priority_list(v), |v| *v == desired.ecn);
            if judged.2 == Action::Change
                && let Some(current) = reading.get()
            {
                for prio in 0u8..8 {
                    let want = desired.ecn.contains(&prio);
                    if current.contains(&prio) != want {
                        let write = Write::Ecn {
                            point,
                            priority: prio,
                            enabled: want,
                        };
                        self.write(vec![knob], write);
                    }
                }
            }
            self.push(knob, priority_list(&desired.ecn), judged);
        }
    }

    /// 5. CNP DSCP and priority.
    fn cnp(&mut self) {
        let (desired, observed) = (self.desired, self.observed);
        for (knob, reading, want) in [
            (Knob::CnpDscp, &observed.cnp_dscp, desired.cnp_dscp),
            (
                Knob::CnpPriority,
                &observed.cnp_priority,
                desired.cnp_priority,
            ),
        ] {
            let judged = judge(reading, |v| v.to_string(), |v| *v == want);
            if judged.2 == Action::Change
                && let Some(mechanism) = judged.0
            {
                let write = match knob {
                    Knob::CnpDscp => Write::CnpDscp {
                        mechanism,
                        value: want,
                    },
                    _ => Write::CnpPriority {
                        mechanism,
                        value: want,
                    },
                };
                self.write(vec![knob], write);
            }
            self.push(knob, want.to_string(), judged);
        }
    }

    /// 6. rdma_cm defaults: mode first, then ToS. Report order stays ToS, mode.
    fn rdma_cm(&mut self) {
        let (desired, observed) = (self.desired, self.observed);
        let unset = || "not set (no rdma_cm entry)".to_string();
        let tos = judge(
            &observed.roce_tos,
            |v| v.map_or_else(unset, |t| t.to_string()),
            |v| *v == Some(desired.roce_tos),
        );
        let mode = judge(
            &observed.roce_mode,
            |v| v.clone().unwrap_or_else(unset),
            |v| v.as_deref() == Some(desired.roce_mode.as_str()),
        );
        if mode.2 == Action::Change {
            self.write(
                vec![Knob::RoceMode],
                Write::RoceMode(desired.roce_mode.clone()),
            );
        }
        if tos.2 == Action::Change {
            self.write(vec![Knob::RoceTos], Write::RoceTos(desired.roce_tos));
        }
        self.push(Knob::RoceTos, desired.roce_tos.to_string(), tos);
        self.push(Knob::RoceMode, desired.roce_mode.clone(), mode);
    }

    /// 7. MTU.
    fn mtu(&mut self) {
        let (desired, observed) = (self.desired, self.observed);
        let mtu = judge(&observed.mtu, |v| v.to_string(), |v| *v == desired.mtu);
        if mtu.2 == Action::Change {
            self.write(vec![Knob::Mtu], Write::Mtu(desired.mtu));
        }
        self.push(Knob::Mtu, desired.mtu.to_string(), mtu);
    }

    /// Report in the order of `Desired::knobs`.
    fn finish(self) -> Plan {
        let Self {
            desired,
            mut knobs,
            writes,
            ..
        } = self;
        let order = desired.knobs();
        knobs.sort_by_key(|k| {
            order
                .iter()
                .position(|o| *o == k.knob)
                .unwrap_or(usize::MAX)
        });
        Plan { knobs, writes }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod proptests;

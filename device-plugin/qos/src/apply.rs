//! Observe -> plan -> write -> read back, for one interface. A knob is `Applied` only when it
//! was written and reads back as desired; one that reads back differently is `Failed`;
//! `Unsupported` and `Failed` are never reported as applied.

use rocefabric_api::{InterfaceStatus, Knob, KnobOutcome, KnobStatus, Mechanism, Trust};
use tracing::{debug, info, warn};

use super::dcbnl::{DcbError, DcbOps, Dcbnl};
use super::driver_files::NetdevFiles;
use super::model::{APP_SEL_DSCP, EcnPoint, Reading};
use super::netlink::RouteSocket;
use super::plan::{Action, Desired, Observed, Plan, Write, plan};
use super::rtnl::{LinkInfo, LinkOps, Rtnl};

/// The kernel interfaces apply needs: DCB netlink and rtnetlink (driver files come with the
/// interface's [`NetdevFiles`]).
pub struct Kernel<'a> {
    pub dcb: &'a mut dyn DcbOps,
    pub link: &'a mut dyn LinkOps,
}

impl std::fmt::Debug for Kernel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").finish_non_exhaustive()
    }
}

/// Real kernel access: one `NETLINK_ROUTE` socket for DCB netlink and one for rtnetlink.
#[derive(Debug)]
pub struct Netlink {
    pub dcb: Dcbnl<RouteSocket>,
    pub link: Rtnl<RouteSocket>,
}

impl Netlink {
    /// Open both sockets in the caller's network namespace.
    pub fn open() -> std::io::Result<Self> {
        Ok(Self {
            dcb: Dcbnl::new(RouteSocket::open()?),
            link: Rtnl::new(RouteSocket::open()?),
        })
    }

    pub fn kernel(&mut self) -> Kernel<'_> {
        Kernel {
            dcb: &mut self.dcb,
            link: &mut self.link,
        }
    }
}

/// Why DCB is unusable on a device, from an `IEEE_GET` failure.
fn dcb_reading<T>(err: &DcbError) -> Reading<T> {
    if err.is_unsupported() {
        Reading::unsupported(format!("DCB is not supported on {}: {err}", err.ifname))
    } else {
        Reading::failed(Mechanism::DcbNetlink, err.to_string())
    }
}

/// Read every knob of `files.netdev`.
pub fn observe(kernel: &mut Kernel<'_>, files: &NetdevFiles) -> Observed {
    let ifname = files.netdev.as_str();
    let ieee = kernel.dcb.ieee_get(ifname);
    let (app, pfc, dcbx) = match &ieee {
        Ok(state) => (
            Reading::value(Mechanism::DcbNetlink, state.app.clone()),
            match state.pfc {
                Some(p) => Reading::value(Mechanism::DcbNetlink, p),
                None => Reading::unsupported(format!(
                    "the driver of {ifname} reports no IEEE PFC over DCB netlink"
                )),
            },
            state.dcbx,
        ),
        Err(e) => (dcb_reading(e), dcb_reading(e), None),
    };
    let trust = files.read_trust().unwrap_or_else(|| {
        app.as_ref().map(|a| {
            if a.iter().any(|x| x.selector == APP_SEL_DSCP) {
                Trust::Dscp
            } else {
                Trust::Pcp
            }
        })
    });
    let mtu = match kernel.link.get_link(ifname) {
        Ok(LinkInfo { mtu, .. }) => Reading::value(Mechanism::Rtnetlink, mtu),
        Err(e) => Reading::failed(Mechanism::Rtnetlink, e.to_string()),
    };
    Observed {
        trust,
        app,
        pfc,
        ecn_np: files.read_ecn(EcnPoint::Notification),
        ecn_rp: files.read_ecn(EcnPoint::Reaction),
        cnp_dscp: files.read_cnp_dscp(),
        cnp_priority: files.read_cnp_priority(),
        roce_tos: files.read_roce_tos(),
        roce_mode: files.read_roce_mode(),
        mtu,
        dcbx,
    }
}

/// The error of one write, and whether it means "unsupported".
#[derive(Clone, Debug, PartialEq, Eq)]
struct WriteError {
    unsupported: bool,
    message: String,
}

fn execute(kernel: &mut Kernel<'_>, files: &NetdevFiles, write: &Write) -> Result<(), WriteError> {
    let ifname = files.netdev.as_str();
    let file_err = |e: super::driver_files::FileError| WriteError {
        unsupported: false,
        message: e.to_string(),
    };
    let dcb_err = |e: DcbError| WriteError {
        unsupported: e.is_unsupported(),
        message: e.to_string(),
    };
    match write {
        Write::Trust(t) => files.write_trust(*t).map_err(file_err),
        Write::AddApps(apps) => kernel.dcb.add_apps(ifname, apps).map_err(dcb_err),
        Write::DelApps(apps) => {
            // mlx5 replaces a DSCP entry itself when a new priority is set for it, so delete only
            // what is still there (deleting a missing entry fails with ENOENT).
            let current = kernel.dcb.ieee_get(ifname).map_err(dcb_err)?.app;
            let present: Vec<_> = apps
                .iter()
                .filter(|a| current.contains(a))
                .copied()
                .collect();
            if present.is_empty() {
                return Ok(());
            }
            kernel.dcb.del_apps(ifname, &present).map_err(dcb_err)
        }
        Write::Pfc(pfc) => kernel.dcb.set_pfc(ifname, pfc).map_err(dcb_err),
        Write::Ecn {
            point,
            priority,
            enabled,
        } => files
            .write_ecn(*point, *priority, *enabled)
            .map_err(file_err),
        Write::CnpDscp { mechanism, value } | Write::CnpPriority { mechanism, value } => {
            let file = if matches!(write, Write::CnpDscp { .. }) {
                files.cnp_dscp_file()
            } else {
                files.cnp_priority_file()
            };
            match file {
                Ok((m, path)) if m == *mechanism => {
                    super::driver_files::write_attr(&path, &value.to_string()).map_err(file_err)
                }
                Ok((m, _)) => Err(WriteError {
                    unsupported: false,
                    message: format!(
                        "the CNP file moved from {mechanism:?} to {m:?} while applying"
                    ),
                }),
                Err(reason) => Err(WriteError {
                    unsupported: true,
                    message: reason,
                }),
            }
        }
        Write::RoceMode(mode) => files.write_roce_mode(mode).map_err(file_err),
        Write::RoceTos(tos) => files.write_roce_tos(*tos).map_err(file_err),
        Write::Mtu(mtu) => kernel.link.set_mtu(ifname, *mtu).map_err(|e| WriteError {
            unsupported: e.source.errno() == Some(super::netlink::errno::EOPNOTSUPP),
            message: e.to_string(),
        }),
    }
}

/// The result of applying on one interface.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub netdev: String,
    /// The plan made from the state before any write.
    pub plan: Plan,
    /// Per-knob outcome, in report order.
    pub knobs: Vec<KnobStatus>,
    /// State read back after the writes.
    pub after: Observed,
}

impl Outcome {
    /// Everything asked for holds now.
    pub fn holds(&self) -> bool {
        self.knobs.iter().all(|k| k.outcome.holds())
    }

    /// Knobs that were written and read back equal.
    pub fn applied(&self) -> Vec<Knob> {
        self.knobs
            .iter()
            .filter(|k| k.outcome == KnobOutcome::Applied)
            .map(|k| k.knob)
            .collect()
    }

    /// The interface's status entry (identity fields from `files`, link state from the caller).
    pub fn interface_status(
        &self,
        files: &NetdevFiles,
        link_state: Option<String>,
    ) -> InterfaceStatus {
        interface_status(files, &self.after, self.knobs.clone(), link_state)
    }
}

/// An interface's status entry from what was read and the knob outcomes.
pub fn interface_status(
    files: &NetdevFiles,
    observed: &Observed,
    knobs: Vec<KnobStatus>,
    link_state: Option<String>,
) -> InterfaceStatus {
    InterfaceStatus {
        netdev: files.netdev.clone(),
        rdma_device: files.rdma.as_ref().map(|r| r.device.clone()),
        pci_address: files.pci_address.clone(),
        is_virtual: files.is_virtual(),
        link_state,
        trust: observed.trust.get().copied(),
        pfc_priorities: observed.pfc.get().map(|p| p.enabled_priorities()),
        ecn_priorities: observed.ecn_np.get().cloned(),
        roce_tos: observed.roce_tos.get().copied().flatten(),
        mtu: observed.mtu.get().copied(),
        knobs,
    }
}

/// Observe and plan only (`--dry-run`): nothing is written.
pub fn dry_run(
    kernel: &mut Kernel<'_>,
    files: &NetdevFiles,
    desired: &Desired,
) -> (Observed, Plan) {
    let before = observe(kernel, files);
    let p = plan(desired, &before);
    (before, p)
}

/// Observe, plan, write what differs, and read everything back.
pub fn apply(kernel: &mut Kernel<'_>, files: &NetdevFiles, desired: &Desired) -> Outcome {
    let before = observe(kernel, files);
    let the_plan = plan(desired, &before);
    let mut errors: Vec<(Knob, WriteError)> = Vec::new();
    for w in &the_plan.writes {
        // A knob whose earlier write failed gets no further writes.
        if w.knobs.iter().any(|k| errors.iter().any(|(e, _)| e == k)) {
            continue;
        }
        match execute(kernel, files, &w.write) {
            Ok(()) => info!(netdev = %files.netdev, knobs = ?w.knobs, write = %w.write, "wrote"),
            Err(e) => {
                warn!(netdev = %files.netdev, knobs = ?w.knobs, write = %w.write, error = %e.message, "write failed");
                for k in &w.knobs {
                    errors.push((*k, e.clone()));
                }
            }
        }
    }
    let after = if the_plan.writes.is_empty() {
        before
    } else {
        observe(kernel, files)
    };
    let check = plan(desired, &after);
    let knobs = the_plan
        .knobs
        .iter()
        .map(|k| {
            let now = check.knob(k.knob);
            let observed = now.and_then(|n| n.observed.clone());
            let holds_now = now.is_some_and(|n| n.action == Action::Keep);
            let (outcome, error) = match &k.action {
                Action::Unsupported(r) => (KnobOutcome::Unsupported, Some(r.clone())),
                Action::ReadFailed(e) => (KnobOutcome::Failed, Some(e.clone())),
                Action::Keep if holds_now => (KnobOutcome::AlreadyCorrect, None),
                Action::Keep => (
                    KnobOutcome::Failed,
                    Some(format!(
                        "changed while applying: reads back {}",
                        observed.as_deref().unwrap_or("nothing")
                    )),
                ),
                Action::Change => match errors.iter().find(|(e, _)| *e == k.knob) {
                    Some((_, e)) if e.unsupported => {
                        (KnobOutcome::Unsupported, Some(e.message.clone()))
                    }
                    Some((_, e)) => (KnobOutcome::Failed, Some(e.message.clone())),
                    None if holds_now => (KnobOutcome::Applied, None),
                    None => (
                        KnobOutcome::Failed,
                        Some(format!(
                            "wrote {} but reads back {}",
                            k.desired,
                            now.map(|n| match &n.action {
                                Action::ReadFailed(e) | Action::Unsupported(e) => e.clone(),
                                _ => n.observed.clone().unwrap_or_else(|| "nothing".into()),
                            })
                            .unwrap_or_else(|| "nothing".into())
                        )),
                    ),
                },
            };
            debug!(netdev = %files.netdev, knob = ?k.knob, ?outcome, "knob");
            KnobStatus {
                knob: k.knob,
                outcome,
                mechanism: k.mechanism,
                desired: Some(k.desired.clone()),
                observed,
                error,
            }
        })
        .collect();
    Outcome {
        netdev: files.netdev.clone(),
        plan: the_plan,
        knobs,
        after,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
pub(crate) mod tests {
    use super::*;
    use crate::dcbnl::IeeeState;
    use crate::model::{DcbApp, IeeePfc};
    use crate::netlink::{NetlinkError, errno};
    use crate::rtnl::LinkError;
    use rocefabric_api::QosSpec;

    /// An in-memory DCB device that behaves like mlx5: replacing a DSCP entry drops the old one.
    #[derive(Default)]
    pub(crate) struct FakeDcb {
        pub supported: bool,
        pub pfc: Option<IeeePfc>,
        pub app: Vec<DcbApp>,
        pub pfc_writes: usize,
        pub app_writes: usize,
        /// The driver silently ignores PFC writes (to test read-back).
        pub ignore_pfc: bool,
    }

    impl FakeDcb {
        pub(crate) fn mlx5() -> Self {
            Self {
                supported: true,
                pfc: Some(IeeePfc {
                    pfc_cap: 8,
                    ..Default::default()
                }),
                ..Default::default()
            }
        }
        fn check(&self, op: &'static str, ifname: &str) -> Result<(), DcbError> {
            if self.supported {
                Ok(())
            } else {
                Err(DcbError {
                    op,
                    ifname: ifname.into(),
                    source: NetlinkError::Errno(errno::EOPNOTSUPP),
                })
            }
        }
    }

    impl DcbOps for FakeDcb {
        fn ieee_get(&mut self, ifname: &str) -> Result<IeeeState, DcbError> {
            self.check("IEEE_GET", ifname)?;
            Ok(IeeeState {
                pfc: self.pfc,
                app: self.app.clone(),
                dcbx: Some(0x09),
            })
        }
        fn set_pfc(&mut self, ifname: &str, pfc: &IeeePfc) -> Result<(), DcbError> {
            self.check("IEEE_SET pfc", ifname)?;
            self.pfc_writes += 1;
            if !self.ignore_pfc {
                self.pfc = Some(*pfc);
            }
            Ok(())
        }
        fn add_apps(&mut self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
            self.check("IEEE_SET app", ifname)?;
            self.app_writes += 1;
            for a in apps {
                self.app
                    .retain(|x| !(x.selector == a.selector && x.protocol == a.protocol));
                self.app.push(*a);
            }
            Ok(())
        }
        fn del_apps(&mut self, ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
            self.check("IEEE_DEL app", ifname)?;
            self.app_writes += 1;
            for a in apps {
                let before = self.app.len();
                self.app.retain(|x| x != a);
                if before == self.app.len() {
                    return Err(DcbError {
                        op: "IEEE_DEL app",
                        ifname: ifname.into(),
                        source: NetlinkError::Errno(errno::ENOENT),
                    });
                }
            }
            Ok(())
        }
    }

    pub(crate) struct FakeLink {
        pub mtu: u32,
        pub writes: usize,
    }

    impl FakeLink {
        pub(crate) fn with_mtu(mtu: u32) -> Self {
            Self { mtu, writes: 0 }
        }
    }

    /// [`apply`] over the fakes.
    pub(crate) fn apply_fake(
        dcb: &mut FakeDcb,
        link: &mut FakeLink,
        files: &NetdevFiles,
        desired: &Desired,
    ) -> Outcome {
        apply(&mut Kernel { dcb, link }, files, desired)
    }

    impl LinkOps for FakeLink {
        fn get_link(&mut self, ifname: &str) -> Result<LinkInfo, LinkError> {
            Ok(LinkInfo {
                index: 2,
                name: ifname.into(),
                mtu: self.mtu,
                operstate: Some(6),
            })
        }
        fn set_mtu(&mut self, _ifname: &str, mtu: u32) -> Result<(), LinkError> {
            self.writes += 1;
            self.mtu = mtu;
            Ok(())
        }
    }

    fn files() -> NetdevFiles {
        // Roots that do not exist: no driver files at all.
        let roots = super::super::driver_files::Roots {
            sysfs: "/nonexistent/sys".into(),
            debugfs: "/nonexistent/debug".into(),
            configfs: "/nonexistent/config".into(),
        };
        NetdevFiles::resolve(&roots, "eth2")
    }

    #[test]
    fn dcb_knobs_are_applied_and_read_back() {
        let mut dcb = FakeDcb::mlx5();
        let mut link = FakeLink::with_mtu(1500);
        let desired = Desired::from_spec(&QosSpec::default());
        let out = apply_fake(&mut dcb, &mut link, &files(), &desired);
        let get = |k| out.knobs.iter().find(|s| s.knob == k).unwrap().outcome;
        assert_eq!(get(Knob::Pfc), KnobOutcome::Applied);
        assert_eq!(get(Knob::DscpMap), KnobOutcome::Applied);
        assert_eq!(
            get(Knob::Trust),
            KnobOutcome::Applied,
            "DSCP entries switch trust"
        );
        assert_eq!(get(Knob::Mtu), KnobOutcome::Applied);
        assert_eq!(get(Knob::EcnNotificationPoint), KnobOutcome::Unsupported);
        assert_eq!(dcb.pfc.unwrap().pfc_en, 0x08);
        assert_eq!(link.mtu, 4200);
        assert!(!out.holds(), "unsupported knobs do not hold");

        // Second run: nothing written at all, everything DCB already correct.
        let (pfc_writes, app_writes) = (dcb.pfc_writes, dcb.app_writes);
        let out = apply_fake(&mut dcb, &mut link, &files(), &desired);
        assert_eq!(
            (dcb.pfc_writes, dcb.app_writes, link.writes),
            (pfc_writes, app_writes, 1)
        );
        assert!(out.applied().is_empty());
        assert_eq!(
            out.knobs
                .iter()
                .find(|s| s.knob == Knob::Pfc)
                .unwrap()
                .outcome,
            KnobOutcome::AlreadyCorrect
        );
    }

    #[test]
    fn a_knob_that_reads_back_differently_is_failed_not_applied() {
        let mut dcb = FakeDcb {
            ignore_pfc: true,
            ..FakeDcb::mlx5()
        };
        let mut link = FakeLink::with_mtu(4200);
        let desired = Desired::from_spec(&QosSpec::default());
        let out = apply_fake(&mut dcb, &mut link, &files(), &desired);
        let pfc = out.knobs.iter().find(|s| s.knob == Knob::Pfc).unwrap();
        assert_eq!(pfc.outcome, KnobOutcome::Failed);
        assert_eq!(pfc.error.as_deref(), Some("wrote 3 but reads back none"));
        assert_eq!(pfc.observed.as_deref(), Some("none"));
        assert!(!out.applied().contains(&Knob::Pfc));
    }

    #[test]
    fn no_dcb_means_unsupported_never_applied() {
        let mut dcb = FakeDcb::default();
        let mut link = FakeLink::with_mtu(1500);
        let desired = Desired::from_spec(&QosSpec::default());
        let f = files();
        let out = apply_fake(&mut dcb, &mut link, &f, &desired);
        assert_eq!(out.applied(), vec![Knob::Mtu]);
        for k in [Knob::Trust, Knob::DscpMap, Knob::Pfc] {
            let s = out.knobs.iter().find(|s| s.knob == k).unwrap();
            assert_eq!(s.outcome, KnobOutcome::Unsupported, "{k:?}");
            assert!(
                s.error
                    .as_deref()
                    .unwrap()
                    .contains("DCB is not supported on eth2"),
                "{:?}",
                s.error
            );
            assert_eq!(s.mechanism, None);
        }
        let status = out.interface_status(&f, None);
        assert_eq!(status.mtu, Some(4200));
        assert_eq!(status.pfc_priorities, None);
        assert_eq!(status.trust, None);
    }

    #[test]
    fn dry_run_writes_nothing_and_plans_what_would_change() {
        let mut dcb = FakeDcb::mlx5();
        let mut link = FakeLink::with_mtu(1500);
        let desired = Desired::from_spec(&QosSpec::default());
        let (_, p) = dry_run(
            &mut Kernel {
                dcb: &mut dcb,
                link: &mut link,
            },
            &files(),
            &desired,
        );
        assert_eq!((dcb.pfc_writes, dcb.app_writes, link.writes), (0, 0, 0));
        assert_eq!(p.writes.len(), 3, "{:?}", p.writes);
        assert!(!p.holds());
    }
}

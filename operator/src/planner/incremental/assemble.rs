//! The plan read off the indexes: RoceNode deletions and applies, pod and directory writes,
//! the fabrics' statuses and Events, in the order of the full pass.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use rocefabric_api::RegionCounts;

use super::super::pod::PodRef;
use super::super::pods;
use super::super::report::{FabricReport, PlanReport};
use super::super::rollout::RolloutCounts;
use super::super::selection::ParsedFabric;
use super::super::writes::{Event, Write};
use super::super::{
    Plan, RegionFindings, directory_order, report_active, report_start, status, write_name,
};
use super::regions::{PodKey, Regions};
use super::{Incremental, State};
use crate::regions::FreedRegions;

/// One fabric's status: its report row, its status write and its Events.
type FabricStatus = (FabricReport, Option<Write>, Vec<Event>);

impl State {
    /// The plan now, read off the indexes (`world`: the objects the planner holds).
    pub(super) fn assemble(&mut self, world: &Incremental, now: Timestamp) -> Plan {
        let parsed: Vec<ParsedFabric<'_>> = world
            .fabrics
            .iter()
            .zip(&self.validation)
            .map(|(f, errors)| ParsedFabric::checked(f, errors.clone()))
            .collect();
        let mut writes: Vec<Write> = self
            .deletes
            .iter()
            .map(|name| Write::DeleteRoceNode { name: name.clone() })
            .collect();
        let mut counts = self.rollout_writes(world, &mut writes);
        self.region_writes(&mut writes);
        let mut by_name: Vec<usize> = (0..parsed.len()).collect();
        by_name.sort_by_key(|&f| parsed[f].name);
        let mut report = PlanReport::default();
        let mut fabric_events = Vec::new();
        for f in by_name {
            let (fr, write, events) = self.fabric_status(&parsed, f, counts[f].take(), now);
            report.fabrics.push(fr);
            writes.extend(write);
            fabric_events.extend(events);
        }
        writes.extend(fabric_events.into_iter().map(Write::Event));
        self.unmatched_events(world, &mut writes);
        report.deleted_roce_nodes = self.deletes.iter().cloned().collect();
        Plan {
            writes,
            report,
            freed: FreedRegions::default(),
            requeue_after: self.requeue_after(now),
        }
    }

    /// The active fabrics' RoceNode writes, by node name, onto `writes`; their rollout counts
    /// by fabric (`None`: inactive).
    fn rollout_writes(
        &self,
        world: &Incremental,
        writes: &mut Vec<Write>,
    ) -> Vec<Option<RolloutCounts>> {
        let mut roce_node_writes = Vec::new();
        let counts = self
            .rollouts
            .iter()
            .enumerate()
            .map(|(f, r)| {
                r.as_ref()
                    .map(|r| r.plan(&world.fabrics[f], &world.roce_nodes, &mut roce_node_writes))
            })
            .collect();
        roce_node_writes.sort_by(|a, b| write_name(a).cmp(write_name(b)));
        writes.extend(roce_node_writes);
        counts
    }

    /// The pods' writes (by namespace and name), then the directories' (by namespace and
    /// fabric), onto `writes`.
    fn region_writes(&self, writes: &mut Vec<Write>) {
        let mut pod_writes: Vec<(&PodKey, &Vec<Write>)> = self
            .regions
            .iter()
            .flatten()
            .flat_map(Regions::pod_writes)
            .collect();
        pod_writes.sort_by(|a, b| a.0.cmp(b.0));
        writes.extend(pod_writes.into_iter().flat_map(|(_, w)| w.iter().cloned()));

        let mut dir_writes: Vec<Write> = self
            .regions
            .iter()
            .flatten()
            .flat_map(Regions::directory_writes)
            .chain(&self.other_directory_writes)
            .cloned()
            .collect();
        dir_writes.sort_by(|a, b| directory_order(a).cmp(&directory_order(b)));
        writes.extend(dir_writes);
    }

    /// Fabric `f`'s report row, status write and Events (`rollout`: its counts; `None` when it
    /// is inactive).
    fn fabric_status(
        &self,
        parsed: &[ParsedFabric<'_>],
        f: usize,
        rollout: Option<RolloutCounts>,
        now: Timestamp,
    ) -> FabricStatus {
        let time = Time(now);
        let fabric = &parsed[f];
        let mut fr = report_start(fabric, self.owned[f], self.conflicting[f].len());
        let Some(rollout) = rollout else {
            if fabric.deleting {
                return (fr, None, Vec::new());
            }
            let (write, events) = status::invalid_status(fabric, &time);
            return (fr, write, events);
        };
        let (findings, (live_slots, region_count, cooling_slots)) = match &self.regions[f] {
            Some(r) => (r.findings(), r.figures()),
            None => (RegionFindings::default(), (0, 0, 0)),
        };
        let conflicting: Vec<(String, String)> = self.conflicting[f]
            .iter()
            .map(|(n, &o)| (n.clone(), parsed[o].name.to_string()))
            .collect();
        let facts = status::Facts {
            rollout,
            conflicting,
            regions: RegionCounts {
                allocated: live_slots,
                capacity: fr.region_capacity,
            },
            exhausted: findings.exhausted,
            bad_requests: findings.bad_requests,
            too_large: findings.too_large,
            conflicts: findings.conflicts,
            over_quota: findings.over_quota,
            window_failed: findings.window_failed,
        };
        let (write, events) = status::valid_status(fabric, &facts, &time);
        report_active(
            &mut fr,
            fabric,
            &facts,
            (live_slots, region_count, cooling_slots),
        );
        (fr, write, events)
    }

    /// Gated pods no fabric selects are told so, once each (by the id they are told by).
    fn unmatched_events(&mut self, world: &Incremental, writes: &mut Vec<Write>) {
        let mut told = BTreeSet::new();
        for (key, id) in &self.unmatched {
            if !self.told.contains(id)
                && let Some(pod) = world.pods.get(key)
            {
                writes.push(Write::Event(pods::unmatched_event(&PodRef::new(pod))));
            }
            told.insert(id.clone());
        }
        self.told = told;
    }

    /// When the next freed window leaves its grace period, from `now`.
    fn requeue_after(&self, now: Timestamp) -> Option<std::time::Duration> {
        self.regions
            .iter()
            .flatten()
            .filter_map(|r| r.next_expiry(now))
            .chain(
                self.kept_ledgers
                    .values()
                    .flat_map(|l| l.cooling.iter().map(|c| c.until).filter(|u| *u > now)),
            )
            .min()
            .map(|until| until.duration_since(now).unsigned_abs())
    }
}

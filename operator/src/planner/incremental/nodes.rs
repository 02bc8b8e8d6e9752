//! Node ownership and rollout pacing, kept per node: a node or RoceNode change costs a few map
//! operations, and a fabric's RoceNode writes are read off ordered sets.

use std::collections::{BTreeSet, HashMap};

use rocefabric_api::{RoceFabric, RoceNodeSpec};

use super::super::rollout::{self, Class, Report, RolloutCounts, count};
use super::super::selection::ParsedFabric;
use super::super::writes::Write;
use super::keyed::Keyed;
use crate::objects::{CompactNode, CompactRoceNode, Matcher};

/// Who owns a node, and which younger fabrics select it too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Owner {
    pub owner: Option<usize>,
    pub losers: Vec<usize>,
}

/// The node selectors of every fabric, oldest first.
pub(crate) struct NodeSelectors {
    /// (fabric index, selector) in age order.
    selectors: Vec<(usize, Matcher)>,
}

impl NodeSelectors {
    pub fn new(fabrics: &[ParsedFabric<'_>], age: &[usize]) -> Self {
        Self {
            selectors: age
                .iter()
                .filter_map(|&f| fabrics[f].node_selector.clone().map(|s| (f, s)))
                .collect(),
        }
    }

    /// The oldest fabric selecting `node` owns it; the others that select it lose it.
    pub fn owner_of(&self, node: &CompactNode) -> Owner {
        let mut out = Owner::default();
        for (f, sel) in &self.selectors {
            if !sel.matches(&node.labels) {
                continue;
            }
            match out.owner {
                None => out.owner = Some(*f),
                Some(_) => out.losers.push(*f),
            }
        }
        out
    }
}

/// One active fabric's nodes, classified as [`rollout::plan_rollout`] does, in sets that give
/// its writes without a pass over every node.
pub(crate) struct Rollout {
    desired: RoceNodeSpec,
    placeholder: RoceNodeSpec,
    fabric_name: String,
    fabric_uid: String,
    classes: HashMap<String, Class>,
    configured: u32,
    /// Current spec, not reported yet.
    pending: u32,
    failed: BTreeSet<String>,
    /// Older spec, still settling: in progress, they take the current spec without a slot.
    settling: BTreeSet<String>,
    /// New nodes and nodes holding a settled older spec, by name: the first get the free slots.
    waiting: BTreeSet<String>,
    /// Current spec, RoceNode lacking our label or owner reference.
    fix_metadata: BTreeSet<String>,
    /// Waiting new nodes whose RoceNode is not the placeholder yet.
    placeholders: BTreeSet<String>,
}

impl Rollout {
    pub fn new(fabric: &ParsedFabric<'_>) -> Self {
        let desired = rollout::desired_spec(fabric);
        Self {
            placeholder: rollout::placeholder(&desired),
            desired,
            fabric_name: fabric.name.to_string(),
            fabric_uid: fabric.uid.to_string(),
            classes: HashMap::new(),
            configured: 0,
            pending: 0,
            failed: BTreeSet::new(),
            settling: BTreeSet::new(),
            waiting: BTreeSet::new(),
            fix_metadata: BTreeSet::new(),
            placeholders: BTreeSet::new(),
        }
    }

    /// Add (or re-classify) an owned node by the RoceNode it holds.
    pub fn put(&mut self, name: &str, rn: Option<&CompactRoceNode>) {
        self.remove(name);
        let class = rollout::classify(rn, &self.desired, &self.fabric_name, &self.fabric_uid);
        let name = name.to_string();
        match class {
            Class::Current {
                report,
                fix_metadata,
            } => {
                match report {
                    Report::Applied => self.configured += 1,
                    Report::Failed => {
                        self.failed.insert(name.clone());
                    }
                    Report::Pending => self.pending += 1,
                }
                if fix_metadata {
                    self.fix_metadata.insert(name.clone());
                }
            }
            Class::Stale { settling: true } => {
                self.settling.insert(name.clone());
            }
            Class::Stale { settling: false } => {
                self.waiting.insert(name.clone());
            }
            Class::Missing => {
                self.waiting.insert(name.clone());
                if rn.map(|rn| &rn.spec) != Some(&self.placeholder) {
                    self.placeholders.insert(name.clone());
                }
            }
        }
        self.classes.insert(name, class);
    }

    /// Forget a node (it left the fabric, or is re-classified).
    pub fn remove(&mut self, name: &str) {
        let Some(class) = self.classes.remove(name) else {
            return;
        };
        match class {
            Class::Current { report, .. } => match report {
                Report::Applied => self.configured -= 1,
                Report::Failed => {
                    self.failed.remove(name);
                }
                Report::Pending => self.pending -= 1,
            },
            Class::Stale { settling: true } => {
                self.settling.remove(name);
            }
            Class::Stale { settling: false } | Class::Missing => {
                self.waiting.remove(name);
            }
        }
        self.fix_metadata.remove(name);
        self.placeholders.remove(name);
    }

    /// The counts and writes of the rollout now, as [`rollout::plan_rollout`] would give them.
    pub fn plan(
        &self,
        obj: &RoceFabric,
        roce_nodes: &Keyed<String, CompactRoceNode>,
        writes: &mut Vec<Write>,
    ) -> RolloutCounts {
        let selected = self.classes.len();
        let budget = count(obj.spec.rollout.budget(selected));
        let failed = count(self.failed.len());
        let waiting = count(self.waiting.len());
        let in_progress = self.pending + count(self.settling.len());
        let blocked = failed > budget && waiting > 0;
        let slots = if blocked {
            0
        } else {
            budget.saturating_sub(in_progress)
        };
        let taken: Vec<&String> = self.waiting.iter().take(slots as usize).collect();
        let apply = |name: &str, spec: RoceNodeSpec| Write::ApplyRoceNode {
            name: name.to_string(),
            fabric_name: self.fabric_name.clone(),
            fabric_uid: self.fabric_uid.clone(),
            spec,
        };
        for name in &taken {
            writes.push(apply(name, self.desired.clone()));
        }
        for name in &self.fix_metadata {
            let spec = roce_nodes
                .get(name)
                .map_or_else(|| self.desired.clone(), |rn| rn.spec.clone());
            writes.push(apply(name, spec));
        }
        if !blocked {
            for name in &self.settling {
                writes.push(apply(name, self.desired.clone()));
            }
        }
        let in_slot: BTreeSet<&String> = taken.iter().copied().collect();
        for name in self.placeholders.iter().filter(|n| !in_slot.contains(n)) {
            writes.push(apply(name, self.placeholder.clone()));
        }
        let k = count(taken.len());
        RolloutCounts {
            selected: count(selected),
            configured: self.configured,
            failed,
            in_progress: in_progress + k,
            waiting: waiting - k,
            budget,
            blocked,
            failed_names: self.failed.iter().cloned().collect(),
        }
    }
}

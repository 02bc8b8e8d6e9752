//! The change log watches are served from: every write, in resourceVersion order, kept up to a
//! byte budget. A watch that asks for a resourceVersion older than what the log still holds is
//! told `410 Gone` (as etcd compaction makes the API server do), and the watcher lists again.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::api::resource::Resource;
use crate::api::store::Labels;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One write as watches see it.
#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    pub resource: Resource,
    pub kind: ChangeType,
    pub namespace: Option<Arc<str>>,
    /// Labels before a modification (a selector watch turns a change of match into
    /// ADDED or DELETED).
    pub labels_before: Option<Labels>,
    pub labels: Labels,
    /// The object after the change (before, for a deletion), as JSON.
    pub object: Arc<str>,
}

/// The log.
#[derive(Debug)]
pub struct ChangeLog {
    entries: VecDeque<Change>,
    bytes: usize,
    budget: usize,
    /// Changes at or below this resourceVersion have been dropped.
    dropped_through: u64,
}

/// The asked-for resourceVersion is older than the log holds.
#[derive(Debug)]
pub struct Gone;

/// Bytes a change costs beyond its object.
const OVERHEAD: usize = 160;

impl ChangeLog {
    pub fn new(budget: usize, start_rv: u64) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            budget,
            dropped_through: start_rv,
        }
    }

    pub fn push(&mut self, change: Change) {
        self.bytes += change.object.len() + OVERHEAD;
        self.entries.push_back(change);
        while self.bytes > self.budget && self.entries.len() > 1 {
            if let Some(old) = self.entries.pop_front() {
                self.bytes -= old.object.len() + OVERHEAD;
                self.dropped_through = old.rv;
            }
        }
    }

    /// Changes after `rv`, oldest first.
    pub fn since(&self, rv: u64) -> Result<impl Iterator<Item = &Change>, Gone> {
        if rv < self.dropped_through {
            return Err(Gone);
        }
        let start = self.entries.partition_point(|c| c.rv <= rv);
        Ok(self.entries.range(start..))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(rv: u64, bytes: usize) -> Change {
        Change {
            rv,
            resource: Resource::Pods,
            kind: ChangeType::Modified,
            namespace: None,
            labels_before: None,
            labels: Labels::default(),
            object: "x".repeat(bytes).into(),
        }
    }

    #[test]
    fn old_changes_go_past_the_budget_and_watches_from_them_are_gone() {
        let mut log = ChangeLog::new(3 * (100 + OVERHEAD), 10);
        assert!(log.since(9).is_err(), "older than the start");
        for rv in 11..=15 {
            log.push(change(rv, 100));
        }
        assert_eq!(log.len(), 3);
        assert!(log.since(11).is_err());
        let rvs: Vec<u64> = log.since(12).unwrap().map(|c| c.rv).collect();
        assert_eq!(rvs, [13, 14, 15]);
        assert_eq!(log.since(15).unwrap().count(), 0);
    }
}

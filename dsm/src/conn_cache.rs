//! The initiator's cached connections, one per owner pod, in numbered slots: a batch keys its
//! per-owner work by slot, so the hot path neither clones pod names nor allocates once warm.

use std::collections::HashMap;

/// Values (connections) by owner pod, each in a slot whose number stays put until removed.
#[derive(Debug)]
pub(crate) struct ConnCache<C> {
    slots: Vec<Option<(String, C)>>,
    by_pod: HashMap<String, usize>,
}

impl<C> Default for ConnCache<C> {
    fn default() -> Self {
        ConnCache {
            slots: Vec::new(),
            by_pod: HashMap::new(),
        }
    }
}

impl<C> ConnCache<C> {
    /// The slot of `pod`'s connection (no allocation: looked up by `&str`).
    pub(crate) fn slot(&self, pod: &str) -> Option<usize> {
        self.by_pod.get(pod).copied()
    }

    pub(crate) fn get(&self, slot: usize) -> Option<&C> {
        self.slots.get(slot)?.as_ref().map(|(_, c)| c)
    }

    /// The connection in `slot` with the pod it was made for.
    pub(crate) fn get_named(&self, slot: usize) -> Option<(&str, &C)> {
        self.slots.get(slot)?.as_ref().map(|(p, c)| (p.as_str(), c))
    }

    pub(crate) fn get_mut(&mut self, slot: usize) -> Option<&mut C> {
        self.slots.get_mut(slot)?.as_mut().map(|(_, c)| c)
    }

    /// Cache `c` as `pod`'s connection (replacing one it had, in the same slot); its slot.
    pub(crate) fn insert(&mut self, pod: &str, c: C) -> usize {
        let slot = self.slot(pod).unwrap_or_else(|| {
            let free = self.slots.iter().position(Option::is_none);
            let slot = free.unwrap_or(self.slots.len());
            if free.is_none() {
                self.slots.push(None);
            }
            self.by_pod.insert(pod.to_string(), slot);
            slot
        });
        self.slots[slot] = Some((pod.to_string(), c));
        slot
    }

    /// Take the connection out of `slot`, with its pod; the slot is free for another pod.
    pub(crate) fn remove(&mut self, slot: usize) -> Option<(String, C)> {
        let (pod, c) = self.slots.get_mut(slot)?.take()?;
        self.by_pod.remove(&pod);
        Some((pod, c))
    }

    /// One past the highest slot number in use or free (per-slot scratch is this long).
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &C> {
        self.slots.iter().flatten().map(|(_, c)| c)
    }

    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.by_pod.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_keeps_its_slot_until_removed_and_a_freed_slot_is_reused() {
        let mut c = ConnCache::default();
        let a = c.insert("a", 1);
        let b = c.insert("b", 2);
        assert_ne!(a, b);
        assert_eq!(c.insert("a", 3), a, "a replaced connection keeps its slot");
        assert_eq!((c.slot("a"), c.get(a)), (Some(a), Some(&3)));
        assert_eq!(c.get_named(a), Some(("a", &3)));
        assert_eq!(c.remove(a), Some(("a".to_string(), 3)));
        assert_eq!((c.slot("a"), c.get(a)), (None, None));
        assert_eq!(c.remove(a), None);
        let d = c.insert("d", 4);
        assert_eq!(d, a, "the freed slot is reused, not a new one");
        assert_eq!(c.slots(), 2);
        assert_eq!(c.values().copied().collect::<Vec<_>>(), vec![4, 2]);
        *c.get_mut(b).unwrap() = 5;
        assert_eq!(c.get(b), Some(&5));
        c.clear();
        assert_eq!((c.slots(), c.slot("b")), (0, None));
    }
}

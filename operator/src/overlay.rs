//! Region annotations the operator wrote that the watch cache may not show yet, put back into
//! the pods as they arrive from the watch (see [`AnnotationOverlay`]). The executor records
//! them ([`crate::controller`]); the feed applies them ([`crate::feed`]).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::objects::CompactPod;

/// Pod annotations the operator wrote that the watch cache may not show yet.
///
/// A pass that ran on a cache still missing a just-written region annotation would see the pod
/// without a region and could hand it another one. The overlay puts the written value back into
/// that pod (same namespace, name and uid) until the cache shows it, and forgets it when the pod
/// is replaced by another of the same name, or after a TTL (the cache is then trusted; stale
/// entries are dropped once a pass), or when this replica stops leading.
#[derive(Debug, Default)]
pub struct AnnotationOverlay {
    entries: HashMap<(String, String), OverlayEntry>,
}

#[derive(Debug)]
struct OverlayEntry {
    value: String,
    uid: Option<String>,
    at: Instant,
}

impl AnnotationOverlay {
    const TTL: Duration = Duration::from_secs(120);

    /// Remember that `value` was written on `namespace/pod` whose uid is `uid`.
    pub fn record(&mut self, namespace: &str, pod: &str, uid: Option<String>, value: &str) {
        self.entries.insert(
            (namespace.to_string(), pod.to_string()),
            OverlayEntry {
                value: value.to_string(),
                uid,
                at: Instant::now(),
            },
        );
    }

    /// Forget entries past the TTL (those of pods that sent no event since: gone, or their
    /// event was missed and the cache is trusted now).
    pub fn forget_stale(&mut self) {
        self.entries.retain(|_, e| e.at.elapsed() < Self::TTL);
    }

    /// Put a remembered value into one pod as it arrives from the watch; forget the entry once
    /// the pod shows it, is replaced by another of the same name, or the entry is past the TTL.
    pub fn patch_one(&mut self, pod: &mut CompactPod) {
        if self.entries.is_empty() {
            return;
        }
        let key = (pod.namespace.to_string(), pod.name.clone());
        let Some(entry) = self.entries.get(&key) else {
            return;
        };
        let stale = entry.at.elapsed() >= Self::TTL;
        let replaced = entry.uid.is_some() && entry.uid != pod.uid;
        let shown = pod.region.as_ref() == Some(&entry.value);
        if stale || replaced || shown {
            self.entries.remove(&key);
            return;
        }
        pod.region = Some(entry.value.clone());
    }

    /// Forget everything (on a change of leadership: another leader may have written since).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Entries still held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, annotation: Option<&str>) -> CompactPod {
        CompactPod {
            namespace: crate::objects::intern(ns),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            region: annotation.map(str::to_string),
            ..CompactPod::default()
        }
    }

    fn region_of(p: &CompactPod) -> Option<&str> {
        p.region.as_deref()
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_fills_a_stale_cache_until_it_catches_up() {
        let mut o = AnnotationOverlay::default();
        o.record("ns", "a", Some("uid-a".into()), "{\"id\":1}");
        let (mut a, mut b) = (pod("ns", "a", None), pod("ns", "b", None));
        o.patch_one(&mut a);
        o.patch_one(&mut b);
        assert_eq!(region_of(&a), Some("{\"id\":1}"));
        assert!(b.region.is_none());
        assert_eq!(o.len(), 1, "kept until the cache shows it");
        o.patch_one(&mut pod("ns", "a", Some("{\"id\":1}")));
        assert!(o.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_forgets_old_entries() {
        let mut o = AnnotationOverlay::default();
        o.record("ns", "gone", None, "x");
        o.record("ns", "a", None, "x");
        tokio::time::advance(AnnotationOverlay::TTL / 2).await;
        o.record("ns", "young", None, "x");
        tokio::time::advance(AnnotationOverlay::TTL / 2).await;
        let mut a = pod("ns", "a", None);
        o.patch_one(&mut a);
        assert!(a.region.is_none(), "after the TTL the cache is trusted");
        o.forget_stale();
        assert_eq!(
            o.len(),
            1,
            "the gone pod's entry is dropped, the young one kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_does_not_leak_onto_a_recreated_pod_of_the_same_name() {
        let mut o = AnnotationOverlay::default();
        o.record("ns", "a", Some("uid-old".into()), "x");
        let mut a = pod("ns", "a", None); // uid-a: a new pod named a
        o.patch_one(&mut a);
        assert!(a.region.is_none());
        assert!(o.is_empty());
    }
}

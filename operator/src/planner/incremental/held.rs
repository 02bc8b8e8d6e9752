//! Which pods the planner holds, and what of them: pods it can ever act on, with only the labels
//! some fabric's pod selector reads.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use rocefabric_api::constants::FABRIC_LABEL;

use super::super::pod::PodRef;
use super::super::selection;
use super::Incremental;
use crate::objects::CompactPod;

impl Incremental {
    /// Whether the planner can ever act on `pod`: labelled for a fabric, holding a region,
    /// gated by us, or picked by a fabric's custom pod selector. Other pods (most of a large
    /// cluster) are not held at all; when a new custom selector comes, the pods are listed
    /// again ([`Self::take_selectors_grew`]).
    pub fn wants_pod(&self, pod: &CompactPod) -> bool {
        pod.labels.contains_key(FABRIC_LABEL)
            || pod.region.is_some()
            || PodRef::new(pod).gated()
            || self.pod_selectors.iter().any(|s| s.matches(&pod.labels))
    }

    /// Whether a custom pod selector came since last asked (the pods must be listed again).
    pub fn take_selectors_grew(&mut self) -> bool {
        std::mem::take(&mut self.selectors_grew)
    }

    pub(super) fn fabrics_changed(&mut self) {
        let specs: Vec<LabelSelector> = self
            .fabrics
            .iter()
            .filter_map(|f| f.spec.shared_memory.as_ref())
            .filter(|sm| !selection::is_empty_selector(&sm.pod_selector))
            .map(|sm| sm.pod_selector.clone())
            .collect();
        if specs.iter().any(|s| !self.pod_selector_specs.contains(s)) {
            self.selectors_grew = true;
        }
        self.pod_selectors = specs
            .iter()
            .filter_map(|s| selection::parse_selector(s).ok())
            .collect();
        let keys = specs.iter().flat_map(|s| {
            let labels = s.match_labels.iter().flat_map(|m| m.keys().cloned());
            let expressions = s.match_expressions.iter().flatten().map(|e| e.key.clone());
            labels.chain(expressions)
        });
        let keys: BTreeSet<String> = std::iter::once(FABRIC_LABEL.to_string())
            .chain(keys)
            .collect();
        // Pods held before were stripped of a key read now: list them again.
        if !keys.is_subset(&self.label_keys) {
            self.selectors_grew = true;
        }
        self.label_keys = keys;
        self.pod_selector_specs = specs;
    }

    /// `pod` with only the labels some selector reads.
    pub(super) fn read_labels_only(&self, mut pod: CompactPod) -> CompactPod {
        pod.labels.retain_keys(|k| self.label_keys.contains(k));
        pod
    }
}

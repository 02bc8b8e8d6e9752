//! The watches' events, fed into the incremental planner: the planner's own object maps are the
//! operator's only cache (no reflector stores beside them), so each object is held once.
//!
//! A watch's (re)list arrives as `Init`, `InitApply`.., `InitDone`: the listed objects are
//! buffered and replace that kind's objects at `InitDone` (a full pass follows). Single events
//! go to the planner as they come.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::Event;
use rocefabric_api::RoceFabric;

use crate::objects::{CompactNode, CompactPod, CompactRoceNode};
use crate::overlay::AnnotationOverlay;
use crate::planner::incremental::Incremental;

/// One event of one of the five watches (moved along once each, so their sizes may differ).
#[allow(clippy::large_enum_variant)]
pub enum Seen {
    Fabric(Event<RoceFabric>),
    Node(Event<CompactNode>),
    RoceNode(Event<CompactRoceNode>),
    Pod(Event<CompactPod>),
    ConfigMap(Event<ConfigMap>),
}

/// Buffers of lists in progress, one per kind.
#[derive(Default)]
struct Listing {
    fabrics: Option<Vec<RoceFabric>>,
    nodes: Option<Vec<CompactNode>>,
    roce_nodes: Option<Vec<CompactRoceNode>>,
    pods: Option<Vec<CompactPod>>,
    config_maps: Option<Vec<ConfigMap>>,
}

/// The planner and what the watches have shown it.
pub struct Feed {
    pub planner: Incremental,
    listing: Listing,
    /// Per kind (fabrics, nodes, RoceNodes, pods, ConfigMaps): listed once.
    synced: [bool; 5],
    /// The pod watch has begun (its list may have dropped pods a later selector picks).
    pods_seen: bool,
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl Feed {
    pub fn new(planner: Incremental) -> Self {
        Self {
            planner,
            listing: Listing::default(),
            synced: [false; 5],
            pods_seen: false,
        }
    }

    /// Whether the pods must be listed again: a fabric's pod selector now picks pods that were
    /// dropped when listed (at a cold start, pods may list before the fabrics). Asked once.
    pub fn take_pod_relist(&mut self) -> bool {
        self.planner.take_selectors_grew() && self.pods_seen
    }

    /// Every watch has listed once.
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    /// Take one event. Pods (decoded compact by the watch) get back a region
    /// annotation we wrote that the watch does not show yet (`overlay`). Returns whether the
    /// world changed.
    pub fn seen(&mut self, seen: Seen, overlay: &mut AnnotationOverlay) -> bool {
        // A listed pod the planner would not keep is dropped here, not buffered: the list of a
        // 1,000,000-pod cluster must not be held whole.
        self.pods_seen |= matches!(seen, Seen::Pod(_));
        let seen = match seen {
            Seen::Pod(Event::InitApply(mut pod)) => {
                overlay.patch_one(&mut pod);
                if self.planner.wants_pod(&pod) {
                    self.listing.pods.get_or_insert_default().push(pod);
                }
                return false;
            }
            other => other,
        };
        match seen {
            Seen::Fabric(e) => self.take(e, |f| f, &FABRICS),
            Seen::Node(e) => self.take(e, |n| n, &NODES),
            Seen::RoceNode(e) => self.take(e, |n| n, &ROCE_NODES),
            Seen::Pod(e) => self.take(
                e,
                |mut pod: CompactPod| {
                    overlay.patch_one(&mut pod);
                    pod
                },
                &PODS,
            ),
            Seen::ConfigMap(e) => self.take(
                e,
                |mut cm: ConfigMap| {
                    crate::trim::config_map(&mut cm);
                    cm
                },
                &CONFIG_MAPS,
            ),
        }
    }

    /// Take one event of a kind, its object turned by `map` into what the planner holds: a
    /// list's objects are buffered and replace the kind's at its end (the kind is then
    /// synced); single events go to the planner. Returns whether the world changed.
    fn take<K, T>(&mut self, event: Event<K>, mut map: impl FnMut(K) -> T, kind: &Kind<T>) -> bool {
        let planner = &mut self.planner;
        let buffer = (kind.listing)(&mut self.listing);
        match event {
            Event::Init => {
                *buffer = Some(Vec::new());
                false
            }
            Event::InitApply(obj) => {
                buffer.get_or_insert_default().push(map(obj));
                false
            }
            Event::InitDone => {
                let items = buffer.take().unwrap_or_default();
                (kind.replace)(planner, items);
                self.synced[kind.index] = true;
                // The list's pages were parsed and mostly dropped.
                crate::heap::give_back();
                true
            }
            Event::Apply(obj) => (kind.upsert)(planner, map(obj)),
            Event::Delete(obj) => (kind.remove)(planner, map(obj)),
        }
    }
}

/// How the events of one watched kind reach the planner.
struct Kind<T> {
    /// Its place in [`Feed::synced`].
    index: usize,
    /// Its buffer while a list is in progress.
    listing: fn(&mut Listing) -> &mut Option<Vec<T>>,
    /// An object added or changed; returns whether the world changed.
    upsert: fn(&mut Incremental, T) -> bool,
    /// An object deleted; returns whether the world changed.
    remove: fn(&mut Incremental, T) -> bool,
    /// A whole list.
    replace: fn(&mut Incremental, Vec<T>),
}

const FABRICS: Kind<RoceFabric> = Kind {
    index: 0,
    listing: |l| &mut l.fabrics,
    upsert: |p, f| {
        p.upsert_fabric(f);
        true
    },
    remove: |p, f| {
        p.remove_fabric(name_of(&f.metadata).1);
        true
    },
    replace: Incremental::replace_fabrics,
};

const NODES: Kind<CompactNode> = Kind {
    index: 1,
    listing: |l| &mut l.nodes,
    upsert: |p, n| {
        p.upsert_node(n);
        true
    },
    remove: |p, n| {
        p.remove_node(&n.name);
        true
    },
    replace: Incremental::replace_nodes,
};

const ROCE_NODES: Kind<CompactRoceNode> = Kind {
    index: 2,
    listing: |l| &mut l.roce_nodes,
    upsert: |p, n| {
        p.upsert_roce_node(n);
        true
    },
    remove: |p, n| {
        p.remove_roce_node(&n.name);
        true
    },
    replace: Incremental::replace_roce_nodes,
};

const PODS: Kind<CompactPod> = Kind {
    index: 3,
    listing: |l| &mut l.pods,
    upsert: Incremental::upsert_pod,
    remove: |p, pod| p.remove_pod(&pod.namespace, &pod.name),
    replace: Incremental::replace_pods,
};

const CONFIG_MAPS: Kind<ConfigMap> = Kind {
    index: 4,
    listing: |l| &mut l.config_maps,
    upsert: Incremental::upsert_config_map,
    remove: |p, cm| {
        let (ns, name) = name_of(&cm.metadata);
        p.remove_config_map(ns, name)
    },
    replace: Incremental::replace_config_maps,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::PlanOptions;

    fn pod(name: &str, labels: &[(&str, &str)]) -> CompactPod {
        CompactPod {
            namespace: crate::objects::intern("ns"),
            name: name.into(),
            labels: labels.iter().copied().collect(),
            ..CompactPod::default()
        }
    }

    #[test]
    fn a_list_keeps_only_pods_the_planner_can_act_on_and_marks_the_kind_synced() {
        let mut feed = Feed::new(Incremental::new(PlanOptions::default()));
        let mut overlay = AnnotationOverlay::default();
        assert!(!feed.seen(Seen::Pod(Event::Init), &mut overlay));
        for p in [
            pod("app", &[("app", "web")]),
            pod("member", &[("rocefabric.io/fabric", "f")]),
        ] {
            assert!(!feed.seen(Seen::Pod(Event::InitApply(p)), &mut overlay));
        }
        assert!(feed.seen(Seen::Pod(Event::InitDone), &mut overlay));
        assert!(feed.planner.pod("ns", "member").is_some());
        assert!(feed.planner.pod("ns", "app").is_none(), "not kept");
        assert!(!feed.synced(), "four watches have not listed yet");

        // Events of pods the planner neither holds nor wants ask for no pass.
        let web = || pod("web", &[("app", "web")]);
        assert!(!feed.seen(Seen::Pod(Event::Apply(web())), &mut overlay));
        assert!(!feed.seen(Seen::Pod(Event::Delete(web())), &mut overlay));

        // A pod that gains the label is kept from its next event on; a deleted one goes.
        assert!(feed.seen(
            Seen::Pod(Event::Apply(pod("app", &[("rocefabric.io/fabric", "f")]))),
            &mut overlay,
        ));
        assert!(feed.planner.pod("ns", "app").is_some());
        feed.seen(
            Seen::Pod(Event::Delete(pod(
                "member",
                &[("rocefabric.io/fabric", "f")],
            ))),
            &mut overlay,
        );
        assert!(feed.planner.pod("ns", "member").is_none());
    }

    fn fabric_picking(labels: &[(&str, &str)]) -> RoceFabric {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceFabric",
            "metadata": {"name": "f", "uid": "u"},
            "spec": {"sharedMemory": {"regionSize": "1Mi", "maxRegions": 8,
                "podSelector": {"matchLabels": labels.iter().copied()
                    .collect::<std::collections::BTreeMap<_, _>>()}}}
        }))
        .expect("valid fabric")
    }

    fn list_pods(feed: &mut Feed, overlay: &mut AnnotationOverlay, pods: Vec<CompactPod>) {
        feed.seen(Seen::Pod(Event::Init), overlay);
        for p in pods {
            feed.seen(Seen::Pod(Event::InitApply(p)), overlay);
        }
        feed.seen(Seen::Pod(Event::InitDone), overlay);
    }

    #[test]
    fn pods_listed_before_a_new_custom_selector_are_listed_again() {
        let mut feed = Feed::new(Incremental::new(PlanOptions::default()));
        let mut overlay = AnnotationOverlay::default();
        // At a cold start the pods may list before the fabrics: the selector is not known yet.
        let train = || vec![pod("train", &[("app", "train")])];
        list_pods(&mut feed, &mut overlay, train());
        assert!(feed.planner.pod("ns", "train").is_none());
        assert!(!feed.take_pod_relist());

        feed.seen(Seen::Fabric(Event::Init), &mut overlay);
        let f = fabric_picking(&[("app", "train")]);
        feed.seen(Seen::Fabric(Event::InitApply(f.clone())), &mut overlay);
        feed.seen(Seen::Fabric(Event::InitDone), &mut overlay);
        assert!(feed.take_pod_relist(), "a new selector asks for a relist");
        assert!(!feed.take_pod_relist(), "once");
        list_pods(&mut feed, &mut overlay, train());
        assert!(feed.planner.pod("ns", "train").is_some());

        // The same selector again (a relist of the fabrics) asks for nothing.
        feed.seen(Seen::Fabric(Event::Apply(f)), &mut overlay);
        assert!(!feed.take_pod_relist());
    }

    #[test]
    fn a_selector_known_before_the_pods_list_asks_for_no_relist() {
        let mut feed = Feed::new(Incremental::new(PlanOptions::default()));
        let mut overlay = AnnotationOverlay::default();
        let f = fabric_picking(&[("app", "train")]);
        feed.seen(Seen::Fabric(Event::Apply(f)), &mut overlay);
        assert!(!feed.take_pod_relist(), "no pod listed yet");
        list_pods(
            &mut feed,
            &mut overlay,
            vec![pod("train", &[("app", "train")])],
        );
        assert!(feed.planner.pod("ns", "train").is_some());
    }
}

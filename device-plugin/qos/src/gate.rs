//! The device plugin's gate, fed from the node's `RoceNode`: the fabric's traffic class, and the
//! netdevs whose QoS the agent reports holding for the current spec (lossless, or a Soft-RoCE
//! interface the fabric accepts without lossless QoS, `spec.qos.lossySoftRoce: Accept`). The kubelet-facing `serve`
//! process runs [`watch_fabric_view`] (read-only API access, no NET_ADMIN) and hands the receiver
//! to [`rocefabric_device_plugin::serve::run`].

use std::collections::BTreeSet;

use futures::{StreamExt, TryStreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use rocefabric_api::RoceNode;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::agent::interface_is_admitted;
use rocefabric_node_model::config::QosGate;
use rocefabric_node_model::fabric_view::FabricView;

/// The view a `RoceNode` gives: `None` (no RoceNode) is no gate; otherwise the spec's traffic
/// class and the netdevs the agent's report admits ([`interface_is_admitted`] under the spec's
/// `qos.lossySoftRoce`), reported for the node's current generation (a status from an older spec
/// admits nothing: the new spec is not applied yet).
pub fn fabric_view_from_roce_node(node: Option<&RoceNode>) -> FabricView {
    let Some(node) = node else {
        return FabricView::default();
    };
    let mut ready = BTreeSet::new();
    if let Some(status) = &node.status {
        let current = status.observed_generation == node.metadata.generation
            && status.fabric_generation == Some(node.spec.fabric_generation);
        if current {
            ready.extend(
                status
                    .interfaces
                    .iter()
                    .filter(|i| interface_is_admitted(i, node.spec.qos.lossy_soft_roce))
                    .map(|i| i.netdev.clone()),
            );
        }
    }
    FabricView {
        traffic_class: Some(node.spec.qos.traffic_class()),
        qos_ready: Some(ready),
        fabric_nics: Some(node.spec.nic_selector.clone()),
        fabric: Some(node.spec.fabric.clone()),
    }
}

/// [`fabric_view_from_roce_node`] under the config's gate setting: `auto` gates only when a
/// RoceNode exists, `enabled` always (no RoceNode admits nothing), `disabled` never (the traffic
/// class still comes from the RoceNode).
pub fn gated_view(node: Option<&RoceNode>, gate: QosGate) -> FabricView {
    let mut view = fabric_view_from_roce_node(node);
    match gate {
        QosGate::Auto => {}
        QosGate::Enabled => {
            view.qos_ready.get_or_insert_with(BTreeSet::new);
        }
        QosGate::Disabled => view.qos_ready = None,
    }
    view
}

/// The view before the API has answered: closed (nothing admitted) unless the gate is disabled,
/// so no pod lands on a NIC whose QoS is unknown.
pub fn initial_view(gate: QosGate) -> FabricView {
    match gate {
        QosGate::Disabled => FabricView::default(),
        QosGate::Auto | QosGate::Enabled => FabricView {
            traffic_class: None,
            qos_ready: Some(BTreeSet::new()),
            fabric_nics: None,
            fabric: None,
        },
    }
}

/// Follow `rocenodes/<node_name>` and publish the view on `tx` whenever it changes, until `tx`
/// has no receivers. Watch errors are retried with kube's default backoff.
pub async fn watch_fabric_view(
    client: Client,
    node_name: String,
    gate: QosGate,
    tx: watch::Sender<FabricView>,
) {
    let api: Api<RoceNode> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut current: Option<RoceNode> = None;
    let mut listing: Option<Option<RoceNode>> = None;
    loop {
        let event = tokio::select! {
            e = stream.try_next() => e,
            () = tx.closed() => return,
        };
        match event {
            Ok(Some(Event::Init)) => listing = Some(None),
            Ok(Some(Event::InitApply(node))) => listing = Some(Some(node)),
            Ok(Some(Event::InitDone)) => current = listing.take().flatten(),
            Ok(Some(Event::Apply(node))) => current = Some(node),
            Ok(Some(Event::Delete(_))) => current = None,
            Ok(None) => return,
            Err(error) => {
                warn!(node = %node_name, %error, "watching the RoceNode failed; retrying");
                continue;
            }
        }
        if listing.is_some() {
            continue;
        }
        let view = gated_view(current.as_ref(), gate);
        tx.send_if_modified(|old| {
            if *old == view {
                false
            } else {
                info!(node = %node_name, ?view, "fabric view from RoceNode");
                *old = view;
                true
            }
        });
    }
}

/// Start [`watch_fabric_view`] on the current runtime; the receiver starts at [`initial_view`].
pub fn spawn_fabric_view(
    client: Client,
    node_name: String,
    gate: QosGate,
) -> watch::Receiver<FabricView> {
    let (tx, rx) = watch::channel(initial_view(gate));
    tokio::spawn(watch_fabric_view(client, node_name, gate, tx));
    rx
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use rocefabric_api::{
        InterfaceStatus, Knob, KnobOutcome, KnobStatus, RoceNodeSpec, RoceNodeStatus,
    };

    fn knob(knob: Knob, outcome: KnobOutcome) -> KnobStatus {
        KnobStatus::new(knob, outcome)
    }

    fn node(generation: i64, observed: i64, interfaces: Vec<InterfaceStatus>) -> RoceNode {
        let mut n = RoceNode::new(
            "node-a",
            RoceNodeSpec {
                fabric: "f".into(),
                fabric_generation: 4,
                ..Default::default()
            },
        );
        n.metadata.generation = Some(generation);
        n.status = Some(RoceNodeStatus {
            observed_generation: Some(observed),
            fabric_generation: Some(4),
            interfaces,
            ..Default::default()
        });
        n
    }

    fn iface(netdev: &str, outcomes: &[KnobOutcome]) -> InterfaceStatus {
        InterfaceStatus {
            netdev: netdev.into(),
            knobs: outcomes.iter().map(|o| knob(Knob::Pfc, *o)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn no_roce_node_means_no_gate() {
        assert_eq!(fabric_view_from_roce_node(None), FabricView::default());
        assert_eq!(
            gated_view(None, QosGate::Enabled).qos_ready,
            Some(BTreeSet::new())
        );
        assert_eq!(gated_view(None, QosGate::Auto).qos_ready, None);
    }

    #[test]
    fn only_interfaces_whose_lossless_knobs_hold_are_ready() {
        let n = node(
            2,
            2,
            vec![
                iface(
                    "enp24s0np0",
                    &[KnobOutcome::Applied, KnobOutcome::AlreadyCorrect],
                ),
                iface(
                    "enp64s0np0",
                    &[KnobOutcome::Applied, KnobOutcome::Unsupported],
                ),
                iface("enp79s0np0", &[KnobOutcome::Failed]),
                iface("enp94s0np0", &[]),
            ],
        );
        let view = fabric_view_from_roce_node(Some(&n));
        assert_eq!(view.traffic_class, Some(106));
        assert_eq!(
            view.qos_ready,
            Some(["enp24s0np0".to_string()].into_iter().collect())
        );
        assert_eq!(gated_view(Some(&n), QosGate::Disabled).qos_ready, None);
        assert_eq!(
            gated_view(Some(&n), QosGate::Disabled).traffic_class,
            Some(106)
        );
    }

    #[test]
    fn unsupported_congestion_knobs_do_not_block_a_lossless_interface() {
        let mut upstream = iface("enp24s0np0", &[KnobOutcome::AlreadyCorrect]);
        upstream
            .knobs
            .push(knob(Knob::EcnNotificationPoint, KnobOutcome::Unsupported));
        let mut no_pfc = iface("enp64s0np0", &[KnobOutcome::Unsupported]);
        no_pfc.knobs.push(knob(Knob::Mtu, KnobOutcome::Applied));
        let view = fabric_view_from_roce_node(Some(&node(2, 2, vec![upstream, no_pfc])));
        assert_eq!(
            view.qos_ready,
            Some(["enp24s0np0".to_string()].into_iter().collect()),
            "upstream mlx5 (no ECN files) is lossless; a NIC without PFC is not"
        );
    }

    /// With `lossySoftRoce: Accept` the gate admits a Soft-RoCE netdev whose only unsupported
    /// knobs are those a soft device cannot hold; a ConnectX with unsupported PFC stays out, and
    /// under the default nothing that is not lossless gets in.
    #[test]
    fn an_accepted_soft_roce_interface_is_admitted_and_a_connectx_without_pfc_is_not() {
        let mut soft = iface("eth0", &[KnobOutcome::Unsupported]);
        soft.is_virtual = true;
        soft.knobs.push(knob(Knob::Mtu, KnobOutcome::Applied));
        let mut soft_bad_mtu = soft.clone();
        soft_bad_mtu.netdev = "eth1".into();
        soft_bad_mtu.knobs[1].outcome = KnobOutcome::Failed;
        let mut connectx = iface("enp24s0np0", &[KnobOutcome::Unsupported]);
        connectx.pci_address = Some("0000:18:00.0".into());
        connectx.knobs.push(knob(Knob::Mtu, KnobOutcome::Applied));
        let mut n = node(2, 2, vec![soft, soft_bad_mtu, connectx]);
        assert_eq!(
            fabric_view_from_roce_node(Some(&n)).qos_ready,
            Some(BTreeSet::new()),
            "Refuse (the default): none of them is lossless"
        );
        n.spec.qos.lossy_soft_roce = rocefabric_api::LossySoftRoce::Accept;
        assert_eq!(
            fabric_view_from_roce_node(Some(&n)).qos_ready,
            Some(["eth0".to_string()].into_iter().collect())
        );
    }

    #[test]
    fn a_status_for_an_older_generation_admits_nothing() {
        let n = node(3, 2, vec![iface("enp24s0np0", &[KnobOutcome::Applied])]);
        assert_eq!(
            fabric_view_from_roce_node(Some(&n)).qos_ready,
            Some(BTreeSet::new())
        );
        let mut n = node(2, 2, vec![iface("enp24s0np0", &[KnobOutcome::Applied])]);
        n.spec.fabric_generation = 5;
        assert_eq!(
            fabric_view_from_roce_node(Some(&n)).qos_ready,
            Some(BTreeSet::new())
        );
    }

    #[test]
    fn the_view_starts_closed_unless_the_gate_is_off() {
        assert_eq!(initial_view(QosGate::Auto).qos_ready, Some(BTreeSet::new()));
        assert_eq!(initial_view(QosGate::Disabled), FabricView::default());
    }

    /// The watcher against a mock API server: the listed RoceNode's view, then a status update,
    /// then deletion (no gate under `auto`).
    #[tokio::test]
    async fn watcher_streams_the_view_from_the_api() {
        use http::{Request, Response};
        use kube::client::Body;

        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let (tx, mut rx) = watch::channel(initial_view(QosGate::Auto));
        let task = tokio::spawn(watch_fabric_view(
            client,
            "node-a".into(),
            QosGate::Auto,
            tx,
        ));

        let mut n = node(2, 1, vec![iface("enp24s0np0", &[KnobOutcome::Applied])]);
        n.metadata.resource_version = Some("5".into());
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.uri().path(), "/apis/rocefabric.io/v1alpha1/rocenodes");
        assert!(
            req.uri()
                .query()
                .unwrap()
                .contains("fieldSelector=metadata.name%3Dnode-a"),
            "{}",
            req.uri()
        );
        let list = serde_json::json!({ "apiVersion": "rocefabric.io/v1alpha1", "kind": "RoceNodeList",
            "metadata": { "resourceVersion": "5" }, "items": [n] });
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&list).unwrap(),
        )));
        rx.changed().await.unwrap();
        // Status of generation 1 while the spec is at 2: nothing admitted yet.
        assert_eq!(
            *rx.borrow_and_update(),
            FabricView {
                traffic_class: Some(106),
                qos_ready: Some(BTreeSet::new()),
                fabric_nics: Some(Default::default()),
                fabric: Some("f".into()),
            }
        );

        let (req, send) = handle.next_request().await.unwrap();
        assert!(
            req.uri().query().unwrap().contains("watch=true"),
            "{}",
            req.uri()
        );
        let mut applied = n.clone();
        if let Some(s) = applied.status.as_mut() {
            s.observed_generation = Some(2);
        }
        let event = |kind: &str| {
            let mut line =
                serde_json::to_vec(&serde_json::json!({ "type": kind, "object": applied }))
                    .unwrap();
            line.push(b'\n');
            Response::new(Body::from(line))
        };
        send.send_response(event("MODIFIED"));
        rx.changed().await.unwrap();
        assert_eq!(
            rx.borrow_and_update().qos_ready,
            Some(["enp24s0np0".to_string()].into_iter().collect())
        );

        // The watch stream ended; the watcher resumes it, and the node is deleted.
        let (req, send) = handle.next_request().await.unwrap();
        assert!(
            req.uri().query().unwrap().contains("watch=true"),
            "{}",
            req.uri()
        );
        send.send_response(event("DELETED"));
        rx.changed().await.unwrap();
        assert_eq!(
            *rx.borrow_and_update(),
            FabricView::default(),
            "deleted: no gate"
        );
        drop(rx);
        // The task ends once nobody listens (it may be waiting on the re-watch).
        let _ = handle.next_request().await;
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}

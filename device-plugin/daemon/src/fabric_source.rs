//! Where the device plugin's and the DRA driver's [`FabricView`] comes from: the node's
//! `RoceNode` when this process knows its node name and can reach the API server (the QoS gate),
//! otherwise the config alone (no gate).

use anyhow::bail;
use tokio::sync::watch;

use rocefabric_node_model::config::{Config, QosGate};
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_qos_agent::gate;

/// A view that never changes: the config's traffic class and no gate. The sender is returned so
/// the channel stays open for as long as the caller keeps it (the daemon also copes with a closed
/// channel by keeping the last view).
pub fn static_view(config: &Config) -> (watch::Sender<FabricView>, watch::Receiver<FabricView>) {
    watch::channel(FabricView::from_config(config))
}

/// The node's fabric view, and the static view's sender to keep while the daemon runs (`None`
/// when the view follows the RoceNode). With `qosGate: enabled` the RoceNode is required and its
/// absence is an error at start.
pub async fn fabric_view(
    config: &Config,
    node_name: Option<&str>,
) -> anyhow::Result<(
    Option<watch::Sender<FabricView>>,
    watch::Receiver<FabricView>,
)> {
    let gate = config.qos_gate;
    let fixed = || {
        let (tx, rx) = static_view(config);
        (Some(tx), rx)
    };
    let Some(node) = node_name.map(str::to_string) else {
        if gate == QosGate::Enabled {
            bail!(
                "invalid config: qosGate = enabled needs the node name (--node-name or NODE_NAME) to follow the node's RoceNode"
            );
        }
        tracing::info!("no node name: QoS gate off, traffic class from the config");
        return Ok(fixed());
    };
    match kube::Client::try_default().await {
        Ok(client) => {
            tracing::info!(%node, ?gate, "following the node's RoceNode for the QoS gate");
            Ok((None, gate::spawn_fabric_view(client, node, gate)))
        }
        Err(error) if gate == QosGate::Enabled => Err(anyhow::Error::new(error)
            .context("qosGate = enabled needs the Kubernetes API to follow the node's RoceNode")),
        Err(error) => {
            tracing::warn!(%node, %error,
                "no Kubernetes API access: QoS gate off, traffic class from the config");
            Ok(fixed())
        }
    }
}

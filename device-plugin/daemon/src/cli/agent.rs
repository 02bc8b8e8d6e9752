//! `rocefabric-device-plugin agent --node-name NAME`: the node QoS agent (needs CAP_NET_ADMIN and
//! write access to the driver's sysfs/debugfs/configfs files; run it apart from `serve`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;

use rocefabric_runtime::{logging, shutdown};

use super::qos::RootArgs;
use rocefabric_node_model::config::duration_text;
use rocefabric_qos_agent::agent::{self, AgentContext, NetlinkKernel};
use rocefabric_qos_agent::apply::Netlink;
use rocefabric_qos_agent::counters::FabricCounters;
use rocefabric_qos_agent::dcbnl::DcbOps;

/// Apply the node's RoceNode QoS, report it in the RoceNode status, and keep it applied.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// This node's name; the RoceNode of the same name is applied.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: String,
    /// How often the NICs are re-checked against the spec (drift is corrected): `60s`, `5m`.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_interval)]
    pub resync_interval: Duration,
    /// Address of the Prometheus endpoint (`/metrics`, `/healthz`).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9464")]
    pub metrics_bind_address: SocketAddr,
    #[command(flatten)]
    pub roots: RootArgs,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = duration_text::parse(text)?;
    if d < Duration::from_secs(1) {
        return Err(format!(
            "{text:?} is too short; the resync interval must be at least 1s"
        ));
    }
    Ok(d)
}

pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    logging::init("RUST_LOG", "info", logging::Format::Text);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    runtime.block_on(async move {
        let client = kube::Client::try_default()
            .await
            .context("failed to create a Kubernetes client")?;
        let ctx = AgentContext::new(
            client,
            args.node_name.clone(),
            args.roots.roots(),
            Arc::new(NetlinkKernel),
        );
        let mut registry = Registry::default();
        ctx.metrics.register(&mut registry);
        registry.register_collector(Box::new(FabricCounters::new(
            ctx.counter_targets.clone(),
            Box::new(|| {
                Netlink::open()
                    .ok()
                    .map(|n| Box::new(n.dcb) as Box<dyn DcbOps>)
            }),
        )));
        let registry = Arc::new(registry);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let metrics = tokio::spawn(rocefabric_runtime::metrics_server::serve(
            args.metrics_bind_address,
            registry,
            async move {
                let mut rx = stop_rx;
                let _ = rx.wait_for(|stop| *stop).await;
            },
        ));
        let signal = shutdown::signal().context("failed to install the signal handlers")?;
        let result = agent::run(Arc::new(ctx), args.resync_interval, signal).await;
        let _ = stop_tx.send(true);
        match metrics.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "metrics endpoint failed"),
            Err(e) => tracing::warn!(error = %e, "metrics task failed"),
            Ok(Ok(())) => {}
        }
        result.map_err(anyhow::Error::from)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    #[test]
    fn resync_interval_takes_units_and_refuses_tiny_values() {
        assert_eq!(parse_interval("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_interval("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_interval("100ms").unwrap_err().contains("at least 1s"));
        assert!(parse_interval("60").is_err());
    }
}

//! Every metric family the node daemon can export, from the registries its commands build:
//! `serve`'s (device plugin, DRA driver) and `agent`'s (QoS agent, fabric counters). The fabric
//! counters are read at scrape time and a family shows only where a device has its counter, so
//! the catalog encodes them over a sample that has every one
//! ([`counters::sample_with_every_counter`]).
//!
//! Used by tests that check the chart's alert rules and dashboard name only exported metrics.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use rocefabric_dra::driver::DraMetrics;
use rocefabric_qos_agent::agent::AgentMetrics;
use rocefabric_qos_agent::counters;

use crate::serve::ServeMetrics;

/// The fabric counters over [`counters::sample_with_every_counter`].
#[derive(Debug)]
struct EveryCounter;

impl Collector for EveryCounter {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        counters::encode(&[counters::sample_with_every_counter()], encoder)
    }
}

/// The exposition (OpenMetrics text) of every family `serve` and `agent` register. A labelled
/// family shows only once it has a series, so each gets one (without labels).
pub fn exposition() -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    let serve = ServeMetrics::default();
    drop(serve.devices.get_or_create(&Vec::new()));
    drop(serve.registrations.get_or_create(&Vec::new()));
    drop(serve.allocations.get_or_create(&Vec::new()));
    serve.register(&mut registry);
    let dra = DraMetrics::default();
    drop(dra.prepares.get_or_create(&Vec::new()));
    drop(dra.unprepares.get_or_create(&Vec::new()));
    drop(dra.devices.get_or_create(&Vec::new()));
    dra.register(&mut registry);
    let agent = AgentMetrics::default();
    drop(agent.drift_corrections.get_or_create(&Vec::new()));
    drop(agent.syncs.get_or_create(&Vec::new()));
    drop(agent.knob_holds.get_or_create(&Vec::new()));
    drop(agent.node_fabric.get_or_create(&Vec::new()));
    agent.register(&mut registry);
    registry.register_collector(Box::new(EveryCounter));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_names_the_families_of_both_commands() {
        let text = exposition().expect("encodes");
        for family in [
            "# TYPE rocefabric_device_plugin_devices gauge",
            "# TYPE rocefabric_device_plugin_allocations counter",
            "# TYPE rocefabric_qos_node_fabric gauge",
            "# TYPE rocefabric_dra_prepares counter",
            "# TYPE rocefabric_qos_knob_holds gauge",
            "# TYPE rocefabric_pfc_pause_frames counter",
            "# TYPE rocefabric_pfc_pause_duration_seconds counter",
            "# TYPE rocefabric_pause_storm_events counter",
            "# TYPE rocefabric_rdma_completer_retries counter",
        ] {
            assert!(text.contains(family), "{family} missing from:\n{text}");
        }
    }
}

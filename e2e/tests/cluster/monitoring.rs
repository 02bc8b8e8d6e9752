//! The metrics the chart's alert rules and dashboard query, scraped from the real node daemon
//! (device plugin and QoS agent containers) and operator through the API server's pod proxy:
//! each queried name is exported there, except a family that only shows once its event happens
//! or where the device has the counter (named with the reason); and every family scraped is in
//! the catalog the fast tests check the queries against (`rocefabric_e2e::monitoring`).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use rocefabric_e2e::monitoring::{
    DASHBOARD, RULES_TEMPLATE, dashboard_queries, exported_series, metric_names, rule_exprs,
    series_names, template_without_actions,
};
use rocefabric_e2e::workspace_root;
use serde_json::Value;

use crate::{NAMESPACE, cluster, eventually, node_daemon_selector, operator_selector};

/// Ports of the chart's defaults: the QoS agent, the device plugin, the operator.
const AGENT_PORT: u16 = 9464;
const DEVICE_PLUGIN_PORT: u16 = 9465;
pub const OPERATOR_PORT: u16 = 8080;

/// Why a queried family may be absent from a healthy cluster's scrape, if it may.
fn may_be_absent(name: &str) -> Option<&'static str> {
    if name.starts_with("rocefabric_pfc_")
        || name.starts_with("rocefabric_pause_storm_")
        || name.starts_with("rocefabric_cnp_")
        || name.starts_with("rocefabric_ecn_")
        || name.starts_with("rocefabric_rdma_")
    {
        return Some(
            "a fabric counter shows only where the NIC has it (DCB, ethtool -S, hw_counters)",
        );
    }
    if name.starts_with("rocefabric_dra_") {
        return Some("the DRA driver's metrics show in node.mode dra or both only");
    }
    match name {
        "rocefabric_operator_reconcile_failures_total" => Some("no pass has failed"),
        "rocefabric_qos_drift_corrections_total" => Some("no drift was corrected"),
        _ => None,
    }
}

/// The `/metrics` text of every pod matching `selector`, on `port`, through the API server.
pub async fn scrape(client: &Client, selector: &str, port: u16) -> Result<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| e.to_string())?;
    if list.items.is_empty() {
        return Err(format!("no pod matches {selector}"));
    }
    let mut text = String::new();
    for pod in &list.items {
        let path = format!(
            "/api/v1/namespaces/{NAMESPACE}/pods/{}:{port}/proxy/metrics",
            pod.name_any()
        );
        let request = http::Request::get(&path)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        text.push_str(
            &client
                .request_text(request)
                .await
                .map_err(|e| format!("GET {path}: {e}"))?,
        );
        text.push('\n');
    }
    Ok(text)
}

fn queried() -> BTreeSet<String> {
    let read = |p: &str| std::fs::read_to_string(workspace_root().join(p)).expect("chart file");
    let rules: Value =
        yaml_serde::from_str(&template_without_actions(&read(RULES_TEMPLATE))).expect("rules");
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("dashboard");
    rule_exprs(&rules)
        .into_iter()
        .chain(dashboard_queries(&dashboard))
        .flat_map(|(_, q)| metric_names(&q))
        .collect()
}

#[test]
fn every_queried_metric_is_scraped_from_the_daemon_and_the_operator() {
    let test = "every_queried_metric_is_scraped_from_the_daemon_and_the_operator";
    let Some(ctx) = cluster(test) else {
        return;
    };
    let queried = queried();
    let catalog = exported_series();
    let client = ctx.client.clone();
    let scraped = ctx
        .rt
        .block_on(eventually("every queried metric scraped", || async {
            let mut text = scrape(&client, &node_daemon_selector(), AGENT_PORT).await?;
            text.push_str(&scrape(&client, &node_daemon_selector(), DEVICE_PLUGIN_PORT).await?);
            text.push_str(&scrape(&client, &operator_selector(), OPERATOR_PORT).await?);
            let scraped = series_names(&text);
            let missing: Vec<&String> = queried
                .iter()
                .filter(|n| !scraped.contains(*n) && may_be_absent(n).is_none())
                .collect();
            if missing.is_empty() {
                Ok(scraped)
            } else {
                Err(format!("not scraped: {missing:?}"))
            }
        }));
    for name in queried.iter().filter(|n| !scraped.contains(*n)) {
        eprintln!(
            "{test}: {name} not scraped here: {}",
            may_be_absent(name).unwrap_or_default()
        );
    }
    let unknown: Vec<&String> = scraped
        .iter()
        .filter(|n| n.starts_with("rocefabric_") && !catalog.contains(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "scraped families missing from the catalog the chart's queries are checked against: {unknown:?}"
    );
}

//! The chart's alert rules and Grafana dashboard, without Helm: every metric their queries name
//! is one the operator or the node daemon exports (the names come from the binaries' own
//! registries), and every alert's runbook link lands on a row of the README's troubleshooting
//! table. The chart suite (`--test chart`, `monitoring`) renders them with Helm and runs promtool.

use rocefabric_e2e::monitoring::{
    DASHBOARD, RULES_TEMPLATE, dashboard_queries, exported_series, rule_exprs,
    template_without_actions, unexported,
};
use rocefabric_e2e::workspace_root;
use serde_json::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join(path))
        .unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

fn rules() -> Value {
    let text = template_without_actions(&read(RULES_TEMPLATE));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{RULES_TEMPLATE}: {e}\n{text}"))
}

/// Every query of `what` names an exported metric.
fn assert_exported(what: &str, queries: &[(String, String)], at_least: usize) {
    assert!(queries.len() >= at_least, "{what}: {queries:?}");
    let missing = unexported(queries, &exported_series());
    assert!(
        missing.is_empty(),
        "{what} query metrics no binary exports: {missing:?}"
    );
}

#[test]
fn alert_rules_name_only_exported_metrics() {
    assert_exported("alert rules", &rule_exprs(&rules()), 10);
}

#[test]
fn dashboard_queries_name_only_exported_metrics() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("dashboard is JSON");
    assert_exported("dashboard panels", &dashboard_queries(&dashboard), 20);
}

#[test]
fn a_query_of_a_metric_nobody_exports_is_caught() {
    let queries = [(
        "test".to_string(),
        "rate(rocefabric_pfc_pause_frames_total[5m]) + rocefabric_pfc_pause_frames".to_string(),
    )];
    assert_eq!(
        unexported(&queries, &exported_series()),
        [(
            "test".to_string(),
            "rocefabric_pfc_pause_frames".to_string()
        )],
        "a counter is queried with its _total suffix"
    );
}

#[test]
fn every_alert_has_a_runbook_row_in_the_readme() {
    let readme = read("README.md");
    let rules = rules();
    for g in rules["spec"]["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            let alert = r["alert"].as_str().expect("alert rules only");
            let url = r["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert} has no runbook_url"));
            let (_, anchor) = url
                .split_once('#')
                .unwrap_or_else(|| panic!("{alert}: {url} has no anchor"));
            assert!(
                readme.contains(&format!("<a id=\"{anchor}\"></a>")),
                "{alert}: README.md has no troubleshooting row <a id=\"{anchor}\"></a>"
            );
            assert!(
                r["annotations"]["summary"].is_string()
                    && r["annotations"]["description"].is_string(),
                "{alert}: summary and description"
            );
        }
    }
}

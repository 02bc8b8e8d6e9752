//! The opt-in monitoring parts: the PrometheusRule and the Grafana dashboard ConfigMap, rendered
//! by Helm; their queries name only exported metrics; `promtool check rules` and `promtool test
//! rules` (`rules-test.yaml`: each alert firing and not firing) pass on the rendered rules.
//!
//! Without promtool the promtool test prints `SKIPPED: promtool (...)`; `.ci/run` installs it
//! (`.ci/promtool`) and sets `ROCEFABRIC_REQUIRE_PROMTOOL=1`, so CI never skips it.

use std::process::Command;

use rocefabric_e2e::manifests::of_kind;
use rocefabric_e2e::monitoring::{
    dashboard_queries, exported_series, promtool, promtool_required, rule_exprs, unexported,
};
use rocefabric_e2e::{skip, workspace_root};
use serde_json::{Value, json};

use crate::helpers::{NAMESPACE, engine, render};

fn monitoring_on() -> Value {
    json!({"monitoring": {"prometheusRule": {"enabled": true, "labels": {"release": "kps"}},
        "dashboard": {"enabled": true}}})
}

fn rule(objects: &[Value]) -> Value {
    let rules = of_kind(objects, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    rules[0].clone()
}

#[test]
fn monitoring_is_opt_in_and_labelled_for_its_selectors() {
    let Some(engine) = engine("monitoring_is_opt_in_and_labelled_for_its_selectors") else {
        return;
    };
    let off = render(&engine, Value::Null);
    assert!(of_kind(&off, "PrometheusRule").is_empty());
    assert!(
        !of_kind(&off, "ConfigMap")
            .iter()
            .any(|c| c["metadata"]["labels"]["grafana_dashboard"].is_string()),
        "no dashboard by default"
    );

    // Without the operator, no alert says it is not leading.
    let mut values = monitoring_on();
    values["operator"] = json!({"enabled": false});
    let alerts = rule_exprs(&rule(&render(&engine, values)));
    assert!(
        !alerts
            .iter()
            .any(|(a, _)| a.starts_with("RocefabricOperator"))
    );
    assert!(alerts.iter().any(|(a, _)| a == "RocefabricPfcStorm"));

    let on = render(&engine, monitoring_on());
    let rule = rule(&on);
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
    let dashboards: Vec<&Value> = of_kind(&on, "ConfigMap")
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect();
    assert_eq!(dashboards.len(), 1, "one dashboard ConfigMap");
    let text = dashboards[0]["data"]["rocefabric.json"]
        .as_str()
        .expect("rocefabric.json");
    let dashboard: Value = serde_json::from_str(text).expect("the dashboard is JSON");
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join(rocefabric_e2e::monitoring::DASHBOARD))
            .expect("dashboard file"),
    )
    .expect("JSON");
    assert_eq!(dashboard, file, "the ConfigMap carries the file unchanged");

    // The sidecar's label, its folder annotation and namespace are values.
    let custom = render(
        &engine,
        json!({"monitoring": {"dashboard": {"enabled": true,
            "labels": {"grafana_dashboard": "rdma"}, "annotations": {"grafana_folder": "RDMA"},
            "namespace": "monitoring"}}}),
    );
    let cm = of_kind(&custom, "ConfigMap")
        .into_iter()
        .find(|c| c["data"]["rocefabric.json"].is_string())
        .expect("dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "rdma");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "RDMA");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
}

#[test]
fn thresholds_are_values_and_bad_ones_are_refused() {
    let Some(engine) = engine("thresholds_are_values_and_bad_ones_are_refused") else {
        return;
    };
    let on = render(
        &engine,
        json!({"monitoring": {"prometheusRule": {"enabled": true, "gatedMinutes": 30,
            "losslessPriorities": "3|4", "runbookUrl": "https://wiki.example/rf"}}}),
    );
    let rule = rule(&on);
    let rules: Vec<&Value> = rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
        .collect();
    let gated = rules
        .iter()
        .find(|r| r["alert"] == "RocefabricPodsGated")
        .expect("RocefabricPodsGated");
    assert_eq!(gated["for"], "30m");
    let lossy = rules
        .iter()
        .find(|r| r["alert"] == "RocefabricPauseOnLossyPriority")
        .expect("RocefabricPauseOnLossyPriority");
    assert!(
        lossy["expr"]
            .as_str()
            .is_some_and(|e| e.contains(r#"priority!~"3|4""#)),
        "{lossy}"
    );
    assert!(rules.iter().all(|r| {
        r["annotations"]["runbook_url"]
            .as_str()
            .is_some_and(|u| u.starts_with("https://wiki.example/rf#rocefabric"))
    }));
    for bad in [
        json!({"monitoring": {"prometheusRule": {"losslessPriorities": "3|.*"}}}),
        json!({"monitoring": {"prometheusRule": {"gatedMinutes": 0}}}),
        json!({"monitoring": {"prometheusRule": {"regionsUsedRatio": 1.5}}}),
        json!({"monitoring": {"dashboard": {"labels": {"grafana_dashboard": 1}}}}),
    ] {
        assert!(
            engine
                .render(&crate::helpers::chart_dir(), &bad, "rf", NAMESPACE)
                .is_err(),
            "{bad} is refused by values.schema.json"
        );
    }
}

#[test]
fn rendered_rules_and_dashboard_name_only_exported_metrics() {
    let Some(engine) = engine("rendered_rules_and_dashboard_name_only_exported_metrics") else {
        return;
    };
    let on = render(&engine, monitoring_on());
    let exported = exported_series();
    let exprs = rule_exprs(&rule(&on));
    let missing = unexported(&exprs, &exported);
    assert!(missing.is_empty(), "{missing:?}");
    let cm = of_kind(&on, "ConfigMap")
        .into_iter()
        .find(|c| c["data"]["rocefabric.json"].is_string())
        .expect("dashboard ConfigMap");
    let dashboard: Value =
        serde_json::from_str(cm["data"]["rocefabric.json"].as_str().unwrap_or_default())
            .expect("JSON");
    let missing = unexported(&dashboard_queries(&dashboard), &exported);
    assert!(missing.is_empty(), "{missing:?}");
}

/// Run promtool with `args` in `dir`; its output, or a panic with it.
fn promtool_ok(tool: &std::path::Path, dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn promtool_checks_and_unit_tests_the_rendered_rules() {
    let test = "promtool_checks_and_unit_tests_the_rendered_rules";
    let tool = match promtool() {
        Ok(tool) => tool,
        Err(error) if promtool_required() => panic!("{test}: {error}"),
        Err(error) => {
            skip("promtool", &error, test);
            return;
        }
    };
    let Some(engine) = engine(test) else {
        return;
    };
    let spec = rule(&render(&engine, monitoring_on()))["spec"].clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, value: &Value| {
        let text = yaml_serde::to_string(value).expect("YAML");
        std::fs::write(dir.path().join(name), text).expect("write");
    };
    write("checked.yaml", &spec);
    let checked = promtool_ok(&tool, dir.path(), &["check", "rules", "checked.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    eprintln!("promtool check rules: {}", checked.trim());

    // The unit tests compare labels; their annotations (whose templates `check` validated) are
    // left out, so a reworded summary needs no test change.
    let mut unannotated = spec.clone();
    for g in unannotated["groups"].as_array_mut().expect("groups") {
        for r in g["rules"].as_array_mut().expect("rules") {
            if let Some(r) = r.as_object_mut() {
                r.remove("annotations");
            }
        }
    }
    write("rules.yaml", &unannotated);
    let tests = workspace_root().join("e2e/tests/chart/rules-test.yaml");
    std::fs::copy(&tests, dir.path().join("rules-test.yaml")).expect("copy rules-test.yaml");
    let tested = promtool_ok(&tool, dir.path(), &["test", "rules", "rules-test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    eprintln!("promtool test rules: {}", tested.trim());

    // Every alert has a test of it firing and one of it not firing.
    let text = std::fs::read_to_string(&tests).expect("rules-test.yaml");
    let cases: Value = yaml_serde::from_str(&text).expect("rules-test.yaml is YAML");
    for (alert, _) in rule_exprs(&spec) {
        let mut fired = false;
        let mut quiet = false;
        for t in cases["tests"].as_array().expect("tests") {
            for case in t["alert_rule_test"].as_array().into_iter().flatten() {
                if case["alertname"] == alert.as_str() {
                    let n = case["exp_alerts"].as_array().map_or(0, Vec::len);
                    fired |= n > 0;
                    quiet |= n == 0;
                }
            }
        }
        assert!(
            fired && quiet,
            "{alert}: fired tested {fired}, not firing tested {quiet}"
        );
    }
}

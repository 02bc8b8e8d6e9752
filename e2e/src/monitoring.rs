//! The chart's alert rules and Grafana dashboard against what the binaries export: the metric
//! names a PromQL query reads, the series names the operator's and the node daemon's registries
//! give (from the registries themselves, not a list kept by hand), and promtool.
//!
//! `.ci/promtool` builds promtool into the tool cache (`~/.cache/rocefabric/promtool`);
//! `ROCEFABRIC_PROMTOOL` names another.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

/// Environment variable naming a promtool binary.
pub const PROMTOOL_ENV: &str = "ROCEFABRIC_PROMTOOL";
/// When set (to anything but `0`), a missing promtool fails the rule tests instead of skipping.
pub const REQUIRE_PROMTOOL_ENV: &str = "ROCEFABRIC_REQUIRE_PROMTOOL";

/// The chart's dashboard file.
pub const DASHBOARD: &str = "charts/rocefabric/files/dashboards/rocefabric.json";
/// The chart's PrometheusRule template.
pub const RULES_TEMPLATE: &str = "charts/rocefabric/templates/prometheusrule.yaml";

/// Whether a missing promtool must fail the tests (CI) rather than skip them.
pub fn promtool_required() -> bool {
    std::env::var(REQUIRE_PROMTOOL_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// promtool: `$ROCEFABRIC_PROMTOOL`, else `.ci/promtool`'s install in the tool cache
/// ([`crate::tool_cache`]), else `promtool` on `PATH`. `Err` says where it looked.
pub fn promtool() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(PROMTOOL_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{PROMTOOL_ENV}={} does not exist", p.display()))
        };
    }
    let built = crate::tool_cache().join("promtool/promtool");
    if built.is_file() {
        return Ok(built);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    on_path.ok_or_else(|| {
        format!(
            "no promtool: {} missing and none on PATH (run .ci/promtool)",
            built.display()
        )
    })
}

/// The series names an exposition (OpenMetrics text) gives, from its `# TYPE` lines: a gauge
/// `name`, a counter `name_total`, a histogram `name_bucket`, `name_sum`, `name_count`.
pub fn series_names(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
            "summary" => &["", "_sum", "_count"],
            _ => &[""],
        };
        for s in suffixes {
            out.insert(format!("{name}{s}"));
        }
    }
    out
}

/// Every series name the operator and the node daemon (`serve` and `agent`) export, from their
/// registries.
pub fn exported_series() -> BTreeSet<String> {
    // A labelled family shows once it has a series: give each one.
    let operator = rocefabric_operator::metrics::Metrics::new();
    operator.failure("any");
    operator.write("any");
    operator.set_fabrics([(
        "any",
        &rocefabric_operator::metrics::FabricFigures::default(),
    )]);
    let operator = operator.render().unwrap_or_default();
    let daemon = rocefabric_device_plugin::metrics_catalog::exposition().unwrap_or_default();
    let mut names = series_names(&operator);
    names.extend(series_names(&daemon));
    names
}

/// PromQL words that are not metric names: keywords, binary operators, and aggregation
/// operators (a grouping clause may stand between them and their parenthesis).
const KEYWORDS: [&str; 29] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
    "start",
];

/// The metric names a PromQL query (or a Grafana variable query such as
/// `label_values(metric{...}, label)`) reads: every identifier that is not in a string, in a
/// label matcher, a range, a grouping clause, a function name or a keyword. Grafana's `$name`
/// variables are ignored.
pub fn metric_names(query: &str) -> BTreeSet<String> {
    let chars: Vec<char> = query.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    // Grouping clauses (`by (a, b)`) hold label names: skip the parenthesis after them.
    let mut skip_next_parens = false;
    // `label_values(X, label)`: only X is a query.
    let mut label_values_depth: Option<usize> = None;
    let mut depth = 0usize;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = after_string(&chars, i),
            '{' => {
                while i < chars.len() && chars[i] != '}' {
                    i = if matches!(chars[i], '"' | '\'' | '`') {
                        after_string(&chars, i)
                    } else {
                        i + 1
                    };
                }
                i += 1;
            }
            '[' => {
                while i < chars.len() && chars[i] != ']' {
                    i += 1;
                }
                i += 1;
            }
            '(' if skip_next_parens => {
                skip_next_parens = false;
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
            }
            '(' => {
                depth += 1;
                i += 1;
            }
            ')' => {
                if label_values_depth == Some(depth) {
                    label_values_depth = None;
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            ',' if label_values_depth == Some(depth) => {
                // The label argument of label_values: skip to its closing parenthesis.
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
            }
            '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let called = chars.get(j) == Some(&'(');
                let lower = word.to_ascii_lowercase();
                if matches!(
                    lower.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    skip_next_parens = called;
                } else if word == "label_values" && called {
                    label_values_depth = Some(depth + 1);
                } else if !called && !KEYWORDS.contains(&lower.as_str()) {
                    out.insert(word);
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // A number or a duration (`5m`): its letters are not names.
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// The index after the string literal opening at `start` (its quote, escapes honoured).
fn after_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// Every `expr` of a PrometheusRule's (or a rules file's) groups.
pub fn rule_exprs(rules: &Value) -> Vec<(String, String)> {
    let groups = rules
        .pointer("/spec/groups")
        .or_else(|| rules.get("groups"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for g in &groups {
        for r in g["rules"].as_array().into_iter().flatten() {
            let name = r["alert"]
                .as_str()
                .or_else(|| r["record"].as_str())
                .unwrap_or_default()
                .to_string();
            if let Some(expr) = r["expr"].as_str() {
                out.push((name, expr.to_string()));
            }
        }
    }
    out
}

/// Every query of a Grafana dashboard: each panel's (rows' nested panels included) target
/// `expr`, and each templating variable's query.
pub fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or_default();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push((format!("panel {title:?}"), expr.to_string()));
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let query = v["query"]["query"].as_str().or_else(|| v["query"].as_str());
        if let Some(q) = query {
            out.push((format!("variable {}", v["name"]), q.to_string()));
        }
    }
    out
}

/// The PrometheusRule template with every template action replaced: `{{ "text" }}` by the text,
/// others by `1`, lines holding only an action dropped. What is left parses as YAML, with every
/// `expr` as the chart renders it but for thresholds.
pub fn template_without_actions(template: &str) -> String {
    let mut out = String::new();
    for line in template.lines() {
        let t = line.trim();
        if t.starts_with("{{") && t.ends_with("}}") && t.matches("{{").count() == 1 {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let action = &rest[start..];
            // `{{ "text" }}` (text may hold braces) or any other action.
            let (text, len) = match action.strip_prefix("{{ \"") {
                Some(quoted) => match quoted.find("\" }}") {
                    Some(e) => (&quoted[..e], e + 8),
                    None => break,
                },
                None => match action.find("}}") {
                    Some(e) => ("1", e + 2),
                    None => break,
                },
            };
            out.push_str(text);
            rest = &rest[start + len..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// Queries naming a metric not in `exported`: `(where, metric)`.
pub fn unexported(
    queries: &[(String, String)],
    exported: &BTreeSet<String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (place, query) in queries {
        for name in metric_names(query) {
            if !exported.contains(&name) {
                out.push((place.clone(), name));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(q: &str) -> Vec<String> {
        metric_names(q).into_iter().collect()
    }

    #[test]
    fn names_are_found_outside_matchers_groupings_functions_and_strings() {
        assert_eq!(
            names(
                r#"sum by (node, interface) (rate(rocefabric_cnp_handled_total{node=~"$node", x="a b"}[$__rate_interval])) > 10"#
            ),
            ["rocefabric_cnp_handled_total"]
        );
        assert_eq!(
            names(
                "a / (b > 0) > 0.9 or vector(0) * on (node) group_left (fabric) c{fabric=~\"$f\"}"
            ),
            ["a", "b", "c"]
        );
        assert_eq!(
            names(r#"label_values(rocefabric_qos_node_fabric{fabric=~"$fabric"}, node)"#),
            ["rocefabric_qos_node_fabric"]
        );
        assert_eq!(
            names("increase(x[5m]) offset 1h > bool 1e3"),
            ["x"],
            "durations, numbers and keywords are not names"
        );
    }

    #[test]
    fn counters_and_histograms_give_their_sample_names() {
        let text = "# TYPE a counter\n# TYPE b gauge\n# TYPE c histogram\n";
        assert_eq!(
            series_names(text).into_iter().collect::<Vec<_>>(),
            ["a_total", "b", "c_bucket", "c_count", "c_sum"]
        );
    }

    #[test]
    fn template_actions_are_replaced() {
        let t = "{{- if .x }}\n  expr: a{p!~\"{{ $r.p }}\"} > {{ $r.t }}\n  s: {{ \"{{ $labels.n }}\" }} x\n{{- end }}\n";
        assert_eq!(
            template_without_actions(t),
            "  expr: a{p!~\"1\"} > 1\n  s: {{ $labels.n }} x\n"
        );
    }
}

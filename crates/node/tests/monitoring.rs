//! The alert rules and the Grafana dashboard in `docs/monitoring/` name only metrics a
//! replica registers: a renamed metric would otherwise silence an alert without anyone
//! noticing.

use redoubt_node::metrics::Metrics;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn docs(file: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/monitoring")
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `redoubt_*` and `process_*` names in a PromQL expression (histogram series reduced to
/// their family).
fn names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in expr.match_indices(['r', 'p']) {
        let rest = &expr[i..];
        if !(rest.starts_with("redoubt_") || rest.starts_with("process_")) {
            continue;
        }
        if i > 0 && expr[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_string();
        out.insert(family);
    }
    out
}

fn registered() -> BTreeSet<String> {
    let m = Metrics::new(0);
    // Labelled families appear once they have a series.
    m.rejected.with_label_values(&["bad_mac", "frame"]).inc();
    m.queue_depth
        .with_label_values(&["listener_inbound"])
        .set(0);
    m.queue_bytes
        .with_label_values(&["listener_inbound"])
        .set(0);
    m.frames_dropped.with_label_values(&["peer"]).inc();
    m.recovery_last_seconds
        .with_label_values(&["restart"])
        .set(0.0);
    m.registry
        .gather()
        .iter()
        .map(|f| f.name().to_string())
        .collect()
}

#[test]
fn alert_rules_name_only_registered_metrics() {
    let known = registered();
    let rules = docs("alerts.yml");
    let exprs: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect();
    assert!(exprs.len() >= 10, "{} rules", exprs.len());
    for e in exprs {
        for n in names(e) {
            assert!(known.contains(&n), "alerts.yml: {n} is not a metric ({e})");
        }
    }
    // The forged-traffic rule must tolerate the bad_mac bursts of ordinary restarts: it
    // requires rejections in every minute of a quarter of an hour.
    assert!(rules.contains("min_over_time(sum by (replica) (rate(redoubt_messages_rejected_total"));
}

#[test]
fn dashboard_names_only_registered_metrics() {
    let known = registered();
    let dash: serde_json::Value =
        serde_json::from_str(&docs("grafana-dashboard.json")).expect("JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    for p in panels {
        for t in p["targets"].as_array().expect("targets") {
            let e = t["expr"].as_str().expect("expr");
            for n in names(e) {
                assert!(
                    known.contains(&n),
                    "dashboard {}: {n} is not a metric",
                    p["title"]
                );
            }
        }
    }
}

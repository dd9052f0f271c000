//! The daemon's status (the JSON `Control::Status` answers) in Prometheus' text format, for
//! `redoubt overlay`'s metrics endpoint. Every figure of the status becomes a metric labelled
//! `node="<id>"`: the core's and the daemon's counters as `redoubt_overlay_<name>_total`, the
//! drops as `redoubt_overlay_drops_total{reason}`, each link's state as
//! `redoubt_overlay_link_<name>{neighbour}`, and the route to each node as its hop count
//! `redoubt_overlay_route_hops{destination}`.

use serde_json::Value;
use std::fmt::Write;

/// The status `status` in Prometheus' text format (see the module documentation).
pub fn prometheus_text(status: &Value) -> String {
    let node = status["node"].as_u64().unwrap_or(0);
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{{node=\"{node}\"{labels}}} {v}");
        }
    };
    family(
        "redoubt_overlay_uptime_seconds",
        "gauge",
        "Seconds since the daemon started.",
        vec![(
            String::new(),
            status["uptime_ms"].as_u64().unwrap_or(0) / 1000,
        )],
    );
    for (section, what) in [("core", "overlay node"), ("daemon", "daemon")] {
        let Some(fields) = status[section].as_object() else {
            continue;
        };
        for (k, v) in fields {
            if let Some(v) = v.as_u64() {
                family(
                    &format!("redoubt_overlay_{k}_total"),
                    "counter",
                    &format!(
                        "The {what}'s {} (see docs/operations.md).",
                        k.replace('_', " ")
                    ),
                    vec![(String::new(), v)],
                );
            }
        }
    }
    let drops = status["core"]["drops"]
        .as_object()
        .map(|d| {
            d.iter()
                .filter_map(|(r, v)| Some((format!(",reason=\"{r}\""), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    family(
        "redoubt_overlay_drops_total",
        "counter",
        "Datagrams, messages and payloads discarded, by reason.",
        drops,
    );
    let links = status["links"].as_array().cloned().unwrap_or_default();
    for (field, help) in [
        ("up", "1 while the link to the neighbour is up."),
        ("srtt_ms", "Smoothed round-trip time to the neighbour (ms)."),
        ("loss_permille", "Recent loss on the link (per mille)."),
        ("queued_msgs", "Messages queued for the link."),
        (
            "in_flight_frames",
            "Reliable frames sent and not yet acknowledged.",
        ),
    ] {
        let samples = links
            .iter()
            .filter_map(|l| {
                let v = match &l[field] {
                    Value::Bool(b) => u64::from(*b),
                    v => v.as_u64()?,
                };
                Some((format!(",neighbour=\"{}\"", l["neighbour"].as_u64()?), v))
            })
            .collect();
        family(
            &format!("redoubt_overlay_link_{field}"),
            "gauge",
            help,
            samples,
        );
    }
    let routes = status["routes"]
        .as_object()
        .map(|r| {
            r.iter()
                .filter_map(|(dst, hops)| {
                    let n = hops.as_array()?.len().saturating_sub(1) as u64;
                    Some((format!(",destination=\"{dst}\""), n))
                })
                .collect()
        })
        .unwrap_or_default();
    family(
        "redoubt_overlay_route_hops",
        "gauge",
        "Hops of the route chosen to each destination (ODSBR).",
        routes,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_of_the_status_becomes_a_labelled_metric() {
        let status = serde_json::json!({
            "node": 2, "uptime_ms": 61_500,
            "core": {"frames_sent": 7, "drops": {"frame_bad_mac": 3}},
            "daemon": {"datagrams_received": 9},
            "links": [{"neighbour": 1, "up": true, "srtt_ms": 4, "loss_permille": 0,
                       "queued_msgs": 0, "in_flight_frames": 2}],
            "routes": {"0": [2, 1, 0]},
        });
        let text = prometheus_text(&status);
        for line in [
            "redoubt_overlay_uptime_seconds{node=\"2\"} 61",
            "redoubt_overlay_frames_sent_total{node=\"2\"} 7",
            "redoubt_overlay_datagrams_received_total{node=\"2\"} 9",
            "redoubt_overlay_drops_total{node=\"2\",reason=\"frame_bad_mac\"} 3",
            "redoubt_overlay_link_up{node=\"2\",neighbour=\"1\"} 1",
            "redoubt_overlay_link_in_flight_frames{node=\"2\",neighbour=\"1\"} 2",
            "redoubt_overlay_route_hops{node=\"2\",destination=\"0\"} 2",
            "# TYPE redoubt_overlay_frames_sent_total counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}

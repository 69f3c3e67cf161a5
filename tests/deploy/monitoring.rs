//! `deploy/grafana/` and `deploy/prometheus/`: the dashboard and the alert rules query only
//! metrics the code exports, and the leader's gauges only from the leader.

use super::*;

/// Every name `cairn_[a-z_]+` in `text` that starts at a word boundary, in order.
fn cairn_refs(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("cairn_").map(|p| p + i) {
        let boundary = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let end = at + text[at..].bytes().take_while(|b| b.is_ascii_lowercase() || *b == b'_').count();
        if boundary {
            out.push(text[at..end].trim_end_matches('_').to_string());
        }
        i = end.max(at + 1);
    }
    out
}

/// Names `cairn_[a-z_]+` in `text`, each starting at a word boundary.
fn cairn_names(text: &str) -> BTreeSet<String> {
    cairn_refs(text).into_iter().collect()
}

/// How a query keeps the series of the leader (or of a lone metaserver, which has no Raft
/// metrics) and drops the other replicas'.
const FROM_THE_LEADER: &str = "unless on(instance) (cairn_meta_raft_is_leader == 0)";

/// The metaserver's cluster gauges (docs/metrics.md: all of `cairn_meta_*` but its Raft metrics,
/// `cairn_repair_*`, `cairn_health`) come from the leader only, and a replica that led before
/// goes on exporting the last values it set: every read of one in `expr` must be followed by
/// [`FROM_THE_LEADER`], or a former leader's stale value shows (and pages) for ever.
fn check_reads_the_leader(what: &str, expr: &str) {
    let leader_only = |name: &String| {
        let meta = name.starts_with("cairn_meta_") && !name.starts_with("cairn_meta_raft_");
        (meta || name.starts_with("cairn_repair_") || name == "cairn_health") && !name.ends_with("_total")
    };
    let reads = cairn_refs(expr).iter().filter(|n| leader_only(n)).count();
    let filtered = expr.matches(FROM_THE_LEADER).count();
    assert!(
        filtered >= reads,
        "{what}: {expr}\nreads {reads} leader-only gauges, {filtered} of them with `{FROM_THE_LEADER}`"
    );
}

fn exprs(panels: &[serde_json::Value], out: &mut Vec<String>) {
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().expect("target expr").to_string());
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {}", p["title"]);
        }
        if let Some(inner) = p["panels"].as_array() {
            exprs(inner, out);
        }
    }
}

/// The exported metric a queried series belongs to: a histogram's `_bucket`, `_sum` and
/// `_count` series are its own.
fn exported_base<'a>(name: &'a str, exported: &BTreeSet<String>) -> &'a str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix).filter(|b| exported.contains(*b)))
        .unwrap_or(name)
}

#[test]
fn grafana_dashboard_queries_only_exported_metrics() {
    let dash: serde_json::Value = serde_json::from_str(&read("deploy/grafana/cairn-dashboard.json")).unwrap();
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    assert!(dash["__inputs"].as_array().unwrap().iter().any(|i| i["name"] == "DS_PROMETHEUS"));
    let panels = dash["panels"].as_array().unwrap();
    let mut all = Vec::new();
    exprs(panels, &mut all);
    assert!(all.len() >= 20, "{} expressions", all.len());

    let mut exported = BTreeSet::new();
    for rel in ["net", "metaserver", "chunkserver", "client-fuse"] {
        exported.extend(cairn_names(&read(&format!("{rel}/src/metrics.rs"))));
    }
    assert!(exported.contains("cairn_client_fuse_op_seconds"), "{exported:?}");
    let mut used = BTreeSet::new();
    for e in &all {
        for name in cairn_names(e) {
            let base = exported_base(&name, &exported);
            assert!(
                exported.contains(base),
                "the dashboard queries {name}, which no metrics.rs exports:\n{e}"
            );
            used.insert(base.to_string());
        }
        assert_eq!(e.matches('(').count(), e.matches(')').count(), "unbalanced parentheses: {e}");
        check_reads_the_leader("the dashboard", e);
    }
    // What an operator looks at first is there.
    for must in [
        "histogram_quantile(0.99, sum by (op, le) (rate(cairn_client_fuse_op_seconds_bucket",
        "cairn_rpc_requests_total{code!=\"Ok\"}",
        "cairn_chunk_shard_reads_total{tier=\"ssd\"}",
        "cairn_repair_unrecoverable_stripes",
        "cairn_meta_rocksdb{property=\"write_stopped\"}",
        "max by (instance) (cairn_meta_raft_is_leader)",
        "rate(cairn_meta_raft_commit_seconds_bucket",
    ] {
        assert!(all.iter().any(|e| e.contains(must)), "no panel queries {must}");
    }
    assert!(used.len() >= 30, "{used:?}");

    // Panels have distinct ids and do not overlap on the 24-column grid.
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id {}", p["id"]);
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24, "panel {} is wider than the grid", p["title"]);
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "panel {} overlaps another", p["title"]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------- prometheus

#[test]
fn alert_rules_use_exported_metrics_and_page_on_stripes_that_can_lose_nothing() {
    let rules = yaml_docs("deploy/prometheus/cairn-alerts.yml");
    assert_eq!(rules.len(), 1);
    let mut exported = BTreeSet::new();
    for rel in ["net", "metaserver", "chunkserver", "client-fuse"] {
        exported.extend(cairn_names(&read(&format!("{rel}/src/metrics.rs"))));
    }
    let mut critical = Vec::new();
    let groups = rules[0]["groups"].as_sequence().expect("groups");
    for rule in groups.iter().flat_map(|g| g["rules"].as_sequence().expect("rules")) {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        let expr = rule["expr"].as_str().unwrap_or_else(|| panic!("{name}: expr"));
        for metric in cairn_names(expr) {
            let base = exported_base(&metric, &exported);
            assert!(exported.contains(base), "{name} uses {metric}, which no metrics.rs exports");
        }
        assert_eq!(expr.matches('(').count(), expr.matches(')').count(), "{name}: {expr}");
        check_reads_the_leader(name, expr);
        let severity = rule["labels"]["severity"].as_str().unwrap_or_else(|| panic!("{name}: severity"));
        assert!(["warning", "critical"].contains(&severity), "{name}: {severity}");
        assert!(rule["annotations"]["summary"].as_str().is_some(), "{name}: summary");
        if severity == "critical" {
            critical.push(expr.to_string());
        }
    }
    assert!(
        critical.iter().any(|e| e.contains("cairn_repair_reduced_stripes{can_lose=\"0\"}")),
        "no critical alert on stripes that can lose 0 more shards: {critical:?}"
    );
}

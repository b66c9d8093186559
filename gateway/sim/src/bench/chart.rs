//! Results across runs: `--csv` appends one row per policy of a run (the trace, its
//! offered load, the summary), and `--chart` draws every row of that file as an SVG: per
//! trace and load, each policy's hit rate and its mean TTFT against `cache_aware`'s of the
//! same run, so the comparison reads at a glance.
//!
//! The SVG is written directly (rectangles and labels at fixed places): plotters' SVG
//! backend lays text out with a font library, which this build leaves out.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::report::Summary;

/// One row of the CSV.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The trace's file stem.
    pub trace: String,
    /// Offered load (share of the prefill capacity; see `trace::offered_load`).
    pub load: f64,
    /// The policy.
    pub policy: String,
    /// Requests answered.
    pub requests: usize,
    /// Cached prompt tokens / prompt tokens.
    pub hit_rate: f64,
    /// Mean time to first token, ms.
    pub ttft_mean_ms: f64,
    /// Median time to first token, ms.
    pub ttft_p50_ms: f64,
    /// 99th percentile time to first token, ms.
    pub ttft_p99_ms: f64,
    /// Requests that failed.
    pub errors: usize,
}

/// Appends `summaries` of a run over `trace` at `load` to the CSV at `path` (with a header
/// when the file is new).
pub fn append(path: &Path, trace: &Path, load: f64, summaries: &[Summary]) -> anyhow::Result<()> {
    let new = !path.exists();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut w = csv::WriterBuilder::new().has_headers(new).from_writer(file);
    let name = trace
        .file_stem()
        .map_or_else(|| "trace".into(), |s| s.to_string_lossy().into_owned());
    for s in summaries {
        w.serialize(Row {
            trace: name.clone(),
            load: (load * 100.0).round() / 100.0,
            policy: s.policy.clone(),
            requests: s.requests,
            hit_rate: s.hit_rate,
            ttft_mean_ms: s.ttft_mean_ms,
            ttft_p50_ms: s.ttft_p50_ms,
            ttft_p99_ms: s.ttft_p99_ms,
            errors: s.errors,
        })?;
    }
    w.flush()?;
    Ok(())
}

/// `moongate bench-chart` settings: draw a CSV of runs without running anything.
#[derive(Debug, Clone, clap::Args)]
pub struct ChartConfig {
    /// The CSV `bench-routing --csv` wrote.
    #[arg(long)]
    pub csv: std::path::PathBuf,
    /// Where to write the SVG.
    #[arg(long)]
    pub out: std::path::PathBuf,
}

/// `moongate bench-chart`.
pub fn run(cfg: &ChartConfig) -> anyhow::Result<()> {
    let rows = read(&cfg.csv)?;
    anyhow::ensure!(!rows.is_empty(), "{} has no rows", cfg.csv.display());
    std::fs::write(&cfg.out, svg(&rows)).with_context(|| format!("writing {}", cfg.out.display()))
}

/// Every row of the CSV at `path`.
pub fn read(path: &Path) -> anyhow::Result<Vec<Row>> {
    let mut r =
        csv::Reader::from_path(path).with_context(|| format!("opening {}", path.display()))?;
    r.deserialize()
        .map(|row| row.with_context(|| format!("reading {}", path.display())))
        .collect()
}

const COLOURS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];

/// The chart of `rows` as SVG text (see the module doc): one group per (trace, load), the
/// last row of a policy in a group winning.
pub fn svg(rows: &[Row]) -> String {
    let mut groups: BTreeMap<(String, u64), BTreeMap<String, Row>> = BTreeMap::new();
    let mut policies: Vec<String> = Vec::new();
    for r in rows {
        if !policies.contains(&r.policy) {
            policies.push(r.policy.clone());
        }
        let key = (r.trace.clone(), (r.load * 100.0).round() as u64);
        groups
            .entry(key)
            .or_default()
            .insert(r.policy.clone(), r.clone());
    }
    let (bar, gap, top, panel) = (14.0, 22.0, 40.0, 160.0);
    let group_w = bar * policies.len() as f64 + gap;
    let width = 90.0 + group_w * groups.len() as f64 + 20.0;
    let height = top + 2.0 * panel + 220.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="10" y="18" font-size="13">Hit rate (top, 0 to 100%) and mean TTFT against cache_aware's (bottom, 0 to 2x; the line is 1x), per trace and offered load</text>"#
    );
    let y_hit = top + panel;
    let y_ttft = top + 2.0 * panel + 20.0;
    for (y, label) in [(y_hit, "hit"), (y_ttft, "TTFT")] {
        let _ = write!(
            s,
            r#"<line x1="80" y1="{y}" x2="{x2}" y2="{y}" stroke="black"/><text x="10" y="{ty}">{label}</text>"#,
            x2 = width - 10.0,
            ty = y - panel / 2.0
        );
    }
    let one = y_ttft - panel / 2.0;
    let _ = write!(
        s,
        r##"<line x1="80" y1="{one}" x2="{x2}" y2="{one}" stroke="#999" stroke-dasharray="4"/>"##,
        x2 = width - 10.0
    );
    for (g, ((trace, load), by)) in groups.iter().enumerate() {
        let x0 = 90.0 + g as f64 * group_w;
        let base = by.get("cache_aware").map(|r| r.ttft_mean_ms);
        for (i, p) in policies.iter().enumerate() {
            let Some(r) = by.get(p) else { continue };
            let x = x0 + i as f64 * bar;
            let c = COLOURS[i % COLOURS.len()];
            let h = (r.hit_rate.clamp(0.0, 1.0)) * panel;
            let _ = write!(
                s,
                r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{c}"><title>{p}: {pct:.1}%</title></rect>"#,
                y = y_hit - h,
                w = bar - 1.0,
                pct = 100.0 * r.hit_rate
            );
            if let Some(b) = base.filter(|b| *b > 0.0) {
                let ratio = r.ttft_mean_ms / b;
                let h = (ratio / 2.0).clamp(0.0, 1.0) * panel;
                let _ = write!(
                    s,
                    r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{c}"><title>{p}: {ratio:.2}x ({ms:.0} ms)</title></rect>"#,
                    y = y_ttft - h,
                    w = bar - 1.0,
                    ms = r.ttft_mean_ms
                );
            }
        }
        let _ = write!(
            s,
            r#"<text x="{x}" y="{y}" transform="rotate(45 {x} {y})">{trace} {l:.1}x</text>"#,
            x = x0,
            y = y_ttft + 14.0,
            trace = escape(trace),
            l = *load as f64 / 100.0
        );
    }
    for (i, p) in policies.iter().enumerate() {
        let x = 90.0 + i as f64 * 130.0;
        let y = height - 12.0;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{ry}" width="10" height="10" fill="{c}"/><text x="{tx}" y="{y}">{p}</text>"#,
            ry = y - 9.0,
            c = COLOURS[i % COLOURS.len()],
            tx = x + 14.0,
            p = escape(p)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(policy: &str, hit: f64, ttft: f64) -> Summary {
        Summary {
            policy: policy.into(),
            requests: 10,
            hit_rate: hit,
            ttft_mean_ms: ttft,
            ttft_p50_ms: ttft,
            ttft_p99_ms: ttft,
            e2e_mean_ms: ttft,
            throughput_rps: 1.0,
            errors: 0,
            store_hit_rate: None,
            store_evicted: None,
            store_lookup_ms: None,
            store_disk: None,
            ttft_by_tier: None,
            routed_on: None,
        }
    }

    #[test]
    fn rows_append_and_draw() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("runs.csv");
        let trace = Path::new("/x/chat.jsonl");
        append(
            &csv,
            trace,
            0.5,
            &[
                summary("cache_aware", 0.5, 100.0),
                summary("kv_aware", 0.6, 70.0),
            ],
        )
        .unwrap();
        append(&csv, trace, 1.0, &[summary("cache_aware", 0.4, 200.0)]).unwrap();
        let rows = read(&csv).unwrap();
        assert_eq!(rows.len(), 3, "one header, three rows");
        assert_eq!(
            (rows[1].trace.as_str(), rows[1].policy.as_str()),
            ("chat", "kv_aware")
        );
        let text = std::fs::read_to_string(&csv).unwrap();
        assert_eq!(text.lines().filter(|l| l.starts_with("trace,")).count(), 1);
        let svg = svg(&rows);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(
            svg.contains("kv_aware: 60.0%") && svg.contains("kv_aware: 0.70x"),
            "{svg}"
        );
        assert!(svg.contains("chat 0.5x") && svg.contains("chat 1.0x"));
    }
}

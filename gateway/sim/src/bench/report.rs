//! What a replay measured, per policy: the summary (table and `--json`) and the TTFT CDF
//! (`--plot`, a PNG drawn with plotters' bitmap backend: lines only, no text, so it needs no
//! font library; the legend is printed).

use std::path::Path;

use serde::Serialize;

/// One request's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Prompt tokens.
    pub prompt: u64,
    /// Of which cached on the worker that computed it.
    pub cached: u64,
    /// Of the cached, tokens the worker loaded from the store (its
    /// `meta_info.cached_tokens_details.storage`; 0 without a store).
    pub from_store: u64,
    /// Time to first token, ms (on the trace's clock).
    pub ttft_ms: f64,
    /// Time to the last token, ms (on the trace's clock).
    pub e2e_ms: f64,
}

/// One policy's summary (`--json` writes a list of these).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The policy (with ` x2` when two gateways split the requests).
    pub policy: String,
    /// Requests answered.
    pub requests: usize,
    /// Cached prompt tokens / prompt tokens.
    pub hit_rate: f64,
    /// Mean time to first token.
    pub ttft_mean_ms: f64,
    /// Median time to first token.
    pub ttft_p50_ms: f64,
    /// 99th percentile time to first token.
    pub ttft_p99_ms: f64,
    /// Mean time to the last token.
    pub e2e_mean_ms: f64,
    /// Requests answered per second of the trace's clock.
    pub throughput_rps: f64,
    /// Requests that failed.
    pub errors: usize,
    /// With `--kv-store`: prompt tokens loaded from the store / prompt tokens (part of
    /// `hit_rate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_hit_rate: Option<f64>,
    /// With `--kv-store`: objects the store evicted to make room (lost, or written to the
    /// disk tier first with `--kv-store-disk`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_evicted: Option<u64>,
    /// With `--kv-store`: mean wall-clock time of a prompt's store lookup and load, in
    /// milliseconds (not scaled by `--speedup`: the store's I/O is real).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_lookup_ms: Option<f64>,
    /// With `--kv-store-disk`: objects written to the workers' disk tiers, and objects
    /// read back from there into memory for another worker (or promoted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_disk: Option<[u64; 2]>,
    /// `kv_aware`: each tier's share of the prompt tokens, as the gateway expected them
    /// cached at the worker it chose (`device`, `host`, `store`, `store_disk`,
    /// `estimated`); `hit_rate` is what the workers found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routed_on: Option<std::collections::BTreeMap<String, f64>>,
    /// With `--kv-store`: requests and their mean TTFT by the deepest tier their prompt
    /// needed: `computed` (nothing cached), `device` (cached on the worker's GPU only),
    /// `store` (pages loaded from the store).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_by_tier: Option<std::collections::BTreeMap<String, TierTtft>>,
}

/// Requests of one tier and their time to first token ([`Summary::ttft_by_tier`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TierTtft {
    /// Requests.
    pub requests: usize,
    /// Their mean time to first token.
    pub ttft_mean_ms: f64,
}

/// [`Summary::ttft_by_tier`] of `samples`.
pub fn ttft_by_tier(samples: &[Sample]) -> std::collections::BTreeMap<String, TierTtft> {
    let mut by: std::collections::BTreeMap<String, (usize, f64)> = Default::default();
    for s in samples {
        let tier = match (s.cached, s.from_store) {
            (0, _) => "computed",
            (_, 0) => "device",
            _ => "store",
        };
        let e = by.entry(tier.to_owned()).or_default();
        e.0 += 1;
        e.1 += s.ttft_ms;
    }
    by.into_iter()
        .map(|(t, (n, sum))| {
            let ttft_mean_ms = sum / n as f64;
            (
                t,
                TierTtft {
                    requests: n,
                    ttft_mean_ms,
                },
            )
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl Summary {
    /// Summarizes `samples` of a run that took `secs` on the trace's clock.
    pub fn of(policy: String, samples: &[Sample], errors: usize, secs: f64) -> Self {
        let n = samples.len();
        let mut ttft: Vec<f64> = samples.iter().map(|s| s.ttft_ms).collect();
        ttft.sort_by(f64::total_cmp);
        let mean = |f: fn(&Sample) -> f64| {
            if n == 0 {
                0.0
            } else {
                samples.iter().map(f).sum::<f64>() / n as f64
            }
        };
        let prompt: u64 = samples.iter().map(|s| s.prompt).sum();
        let cached: u64 = samples.iter().map(|s| s.cached).sum();
        Summary {
            policy,
            requests: n,
            hit_rate: if prompt == 0 {
                0.0
            } else {
                cached as f64 / prompt as f64
            },
            ttft_mean_ms: mean(|s| s.ttft_ms),
            ttft_p50_ms: percentile(&ttft, 0.5),
            ttft_p99_ms: percentile(&ttft, 0.99),
            e2e_mean_ms: mean(|s| s.e2e_ms),
            throughput_rps: if secs > 0.0 { n as f64 / secs } else { 0.0 },
            errors,
            store_hit_rate: None,
            store_evicted: None,
            store_lookup_ms: None,
            store_disk: None,
            routed_on: None,
            ttft_by_tier: None,
        }
    }
}

/// The summaries as an aligned table.
pub fn table(rows: &[Summary]) -> String {
    let mut out = format!(
        "{:<18} {:>8} {:>8} {:>11} {:>11} {:>11} {:>11} {:>9} {:>6}\n",
        "policy",
        "requests",
        "hit",
        "ttft mean",
        "ttft p50",
        "ttft p99",
        "e2e mean",
        "req/s",
        "errors"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<18} {:>8} {:>7.1}% {:>9.0}ms {:>9.0}ms {:>9.0}ms {:>9.0}ms {:>9.2} {:>6}\n",
            r.policy,
            r.requests,
            r.hit_rate * 100.0,
            r.ttft_mean_ms,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.e2e_mean_ms,
            r.throughput_rps,
            r.errors
        ));
        if let Some(s) = r.store_hit_rate {
            let mut note = format!("  (from the store {:.1}%", s * 100.0);
            if let Some(ms) = r.store_lookup_ms {
                note.push_str(&format!(", {ms:.1} ms a lookup"));
            }
            if let Some(e) = r.store_evicted {
                note.push_str(&format!(", evicted {e}"));
            }
            if let Some([to, back]) = r.store_disk {
                note.push_str(&format!(", to disk {to}, back {back}"));
            }
            note.push(')');
            out.insert_str(out.len() - 1, &note);
        }
        if let Some(tiers) = &r.routed_on {
            let shares: Vec<String> = ["device", "host", "store", "store_disk", "estimated"]
                .iter()
                .filter_map(|t| Some(format!("{t} {:.1}%", tiers.get(*t)? * 100.0)))
                .collect();
            out.push_str(&format!("  routed on: {}\n", shares.join(", ")));
        }
        if let Some(tiers) = &r.ttft_by_tier {
            let parts: Vec<String> = tiers
                .iter()
                .map(|(t, x)| format!("{t} {} at {:.0} ms", x.requests, x.ttft_mean_ms))
                .collect();
            out.push_str(&format!("  TTFT by tier: {}\n", parts.join(", ")));
        }
    }
    out
}

/// Line colours of the plot, in policy order (printed as the legend).
pub const COLOURS: [(&str, (u8, u8, u8)); 6] = [
    ("blue", (31, 119, 180)),
    ("orange", (255, 127, 14)),
    ("green", (44, 160, 44)),
    ("red", (214, 39, 40)),
    ("purple", (148, 103, 189)),
    ("brown", (140, 86, 75)),
];

/// Draws the TTFT CDF of each run (x: TTFT up to the largest p99, linear; y: 0..1) to
/// `path`; returns the legend.
pub fn plot(path: &Path, runs: &[(String, Vec<f64>)]) -> anyhow::Result<String> {
    use plotters::prelude::*;
    let xmax = runs
        .iter()
        .map(|(_, v)| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            percentile(&v, 0.99)
        })
        .fold(1.0f64, f64::max);
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(30)
        .build_cartesian_2d(0f64..xmax, 0f64..1f64)?;
    let axes = [vec![(0.0, 0.0), (xmax, 0.0)], vec![(0.0, 0.0), (0.0, 1.0)]];
    for a in axes {
        chart.draw_series(LineSeries::new(a, &BLACK))?;
    }
    for q in [0.25, 0.5, 0.75, 1.0] {
        chart.draw_series(LineSeries::new(
            vec![(0.0, q), (xmax, q)],
            &RGBColor(220, 220, 220),
        ))?;
    }
    let mut legend = String::new();
    for (i, (name, v)) in runs.iter().enumerate() {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len().max(1) as f64;
        let (cname, (r, g, b)) = COLOURS[i % COLOURS.len()];
        let pts = v
            .iter()
            .enumerate()
            .map(|(k, &x)| (x.min(xmax), (k + 1) as f64 / n));
        chart.draw_series(LineSeries::new(pts, RGBColor(r, g, b).stroke_width(2)))?;
        legend.push_str(&format!("{cname}: {name}\n"));
    }
    root.present()?;
    Ok(format!(
        "TTFT CDF, x from 0 to {xmax:.0} ms (the largest p99), y from 0 to 1 (grey lines: \
         quartiles)\n{legend}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_plot() {
        let s: Vec<Sample> = (1..=100)
            .map(|i| Sample {
                prompt: 100,
                cached: 25,
                from_store: u64::try_from(i % 2).unwrap() * 10,
                ttft_ms: f64::from(i),
                e2e_ms: f64::from(2 * i),
            })
            .collect();
        let r = Summary::of("p".into(), &s, 1, 10.0);
        assert_eq!((r.requests, r.errors), (100, 1));
        assert!((r.hit_rate - 0.25).abs() < 1e-9);
        assert_eq!((r.ttft_p50_ms, r.ttft_p99_ms), (51.0, 99.0));
        assert!((r.throughput_rps - 10.0).abs() < 1e-9);
        // Odd requests loaded from the store (mean TTFT of 1, 3, ..., 99), even ones not.
        let tiers = ttft_by_tier(&s);
        assert_eq!(tiers.keys().collect::<Vec<_>>(), ["device", "store"]);
        assert_eq!(
            (tiers["store"].requests, tiers["store"].ttft_mean_ms),
            (50, 50.0)
        );
        assert_eq!(
            (tiers["device"].requests, tiers["device"].ttft_mean_ms),
            (50, 51.0)
        );
        let r = Summary {
            ttft_by_tier: Some(tiers),
            ..r
        };
        assert!(
            table(std::slice::from_ref(&r))
                .contains("TTFT by tier: device 50 at 51 ms, store 50 at 50 ms")
        );
        assert!(table(&[r]).contains("25.0%"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdf.png");
        let legend = plot(
            &path,
            &[("p".into(), s.iter().map(|x| x.ttft_ms).collect())],
        )
        .unwrap();
        assert!(legend.contains("blue: p"));
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }
}

//! `gateway-scale` as a user runs it, tiny: a row per policy and fleet size, every cost
//! measured, and the SVG drawn with every policy named; a row per decade of the
//! `kv_aware` index, drawn too.

use std::process::Command;

/// The rows of a CSV of numbers, its header left out.
fn numeric_rows(text: &str) -> Vec<Vec<f64>> {
    text.lines()
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect()
}

#[test]
fn gateway_scale_times_every_policy_at_every_fleet_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gateway-scale"))
        .args(["--max-workers", "100", "--picks", "50", "--warm", "50"])
        .args([
            "--max-blocks",
            "10000",
            "--max-tree-bytes",
            "10000000",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .expect("run gateway-scale");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("selection.csv")).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let policies = [
        "random",
        "round_robin",
        "power_of_two",
        "cache_aware",
        "kv_aware",
        "consistent_hashing",
        "manual",
        "least_load",
        "bucket",
    ];
    assert_eq!(rows.len(), 2 * policies.len(), "{text}");
    for (policy, workers) in policies.iter().flat_map(|p| [(p, "10"), (p, "100")]) {
        let row = rows
            .iter()
            .find(|r| r[0] == *policy && r[1] == workers)
            .unwrap_or_else(|| panic!("no {policy} at {workers} workers:\n{text}"));
        let (mean, p99): (f64, f64) = (row[2].parse().unwrap(), row[3].parse().unwrap());
        assert!(mean > 0.0 && p99 >= mean * 0.5, "{text}");
    }
    let drawn = std::fs::read_to_string(dir.path().join("selection.svg")).unwrap();
    for p in policies {
        assert!(drawn.contains(p), "no {p} in the plot");
    }
    let text = std::fs::read_to_string(dir.path().join("kv_index.csv")).unwrap();
    let rows = numeric_rows(&text);
    assert_eq!(rows.len(), 2, "{text}");
    // Whole events of 32 pages: 1,024 and 10,016 blocks.
    assert_eq!((rows[0][0], rows[1][0]), (1_024.0, 10_016.0), "{text}");
    for row in &rows {
        assert!(row.iter().all(|v| *v > 0.0), "{text}");
        assert!(row[1] < 1_000.0, "heap bytes per block: {text}");
    }
    let drawn = std::fs::read_to_string(dir.path().join("kv_index.svg")).unwrap();
    assert!(drawn.contains("heap bytes per block") && drawn.contains("match, 32 pages"));
    let text = std::fs::read_to_string(dir.path().join("tree.csv")).unwrap();
    let rows = numeric_rows(&text);
    assert_eq!(rows.len(), 2, "{text}");
    for (row, at_least) in rows.iter().zip([1e6, 1e7]) {
        assert!(row[0] >= at_least && row.iter().all(|v| *v > 0.0), "{text}");
    }
    let drawn = std::fs::read_to_string(dir.path().join("tree.svg")).unwrap();
    assert!(drawn.contains("heap bytes per prompt byte"));
}

#[test]
fn gateway_scale_refuses_a_fleet_too_small_to_measure() {
    let out = Command::new(env!("CARGO_BIN_EXE_gateway-scale"))
        .args(["--max-workers", "9"])
        .output()
        .expect("run gateway-scale");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-workers must be at least 10"), "{err}");
}

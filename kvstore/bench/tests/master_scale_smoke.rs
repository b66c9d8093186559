//! `master-scale` as a user runs it, tiny: a row per decade in the CSV, every figure
//! measured (none zero or missing), and the SVG drawn with every curve named.

use std::process::Command;

#[test]
fn master_scale_writes_a_row_per_decade_and_draws_every_curve() {
    let dir = tempfile::tempdir().unwrap();
    let (csv, svg) = (dir.path().join("m.csv"), dir.path().join("m.svg"));
    let out = Command::new(env!("CARGO_BIN_EXE_master-scale"))
        .args(["--max", "10000", "--samples", "500", "--segments", "8"])
        .args(["--clients", "50", "--threads", "2", "--csv"])
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .output()
        .expect("run master-scale");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    for (row, objects) in rows.iter().zip([1_000.0, 10_000.0]) {
        assert_eq!(row.len(), header.len(), "{text}");
        assert_eq!(row[0], objects);
        for (name, v) in header.iter().zip(row) {
            assert!(*v > 0.0, "{name} is {v} at {objects} objects:\n{text}");
        }
        let evicted = row[header.iter().position(|h| *h == "evicted_objects").unwrap()];
        assert!(evicted >= objects * 0.01, "{text}");
    }
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg"), "{drawn:.200}");
    for curve in [
        "put_start+put_end",
        "get_replicas, 2 threads",
        "exists",
        "heap bytes per object",
        "takeover: restore from records",
        "one eviction round",
    ] {
        assert!(drawn.contains(curve), "no {curve} in the plot");
    }
}

#[test]
fn master_scale_refuses_a_run_too_small_to_measure() {
    let out = Command::new(env!("CARGO_BIN_EXE_master-scale"))
        .args(["--max", "999"])
        .output()
        .expect("run master-scale");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max must be at least 1000"));
}

//! `store-bench` as a user runs it (a spawned master process, the bench client holding the
//! segment), tiny: every operation runs, every value reads back exactly, the table lists
//! each (operation, size).

use std::process::Command;

#[test]
fn store_bench_runs_every_operation_and_verifies_the_bytes() {
    let out = Command::new(env!("CARGO_BIN_EXE_store-bench"))
        .args([
            "--sizes", "4K,100K", "--ops", "130", "--batch", "16", "--rounds", "1",
        ])
        .args(["--segment-size", "64M", "--json"])
        .output()
        .expect("run store-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for op in [
        "put",
        "get",
        "put_from",
        "get_into",
        "batch_put",
        "batch_get",
        "batch_put_from",
        "batch_get_into",
    ] {
        for size in [4096, 102_400] {
            let line = stdout
                .lines()
                .find(|l| {
                    l.contains(&format!("\"op\":\"{op}\""))
                        && l.contains(&format!("\"value_bytes\":{size},"))
                })
                .unwrap_or_else(|| panic!("no result for {op} {size}:\n{stdout}"));
            assert!(line.contains("\"errors\":0,\"bad\":0"), "{line}");
        }
    }
}

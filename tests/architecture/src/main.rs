//! `cargo run -p architecture [-- ROOT]`: checks the workspace (default: the one this crate
//! is in) and prints the findings; exits 1 when something does not hold.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let root = match std::env::args_os().nth(1) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."),
    };
    let root = root.canonicalize()?;
    let findings = architecture::report::check(&root)?;
    print!("{}", architecture::report::render(&findings, &root));
    if !findings.ok() {
        std::process::exit(1);
    }
    Ok(())
}

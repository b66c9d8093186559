//! The book's command-line reference (`docs/src/reference/cli.md`) is generated from the
//! clap definitions, so no flag or default is written twice; this fails when the committed
//! file is stale. `UPDATE_DOCS=1 cargo test -p moongate --test cli_reference` rewrites it.

use std::path::Path;

#[test]
fn the_command_line_reference_is_generated_and_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/reference/cli.md");
    let fresh = moongate::reference();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &fresh).expect("write the reference");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{} is stale: run `UPDATE_DOCS=1 cargo test -p moongate --test cli_reference`",
        path.display()
    );
}

#[test]
fn the_reference_names_every_subcommand_and_a_default() {
    let r = moongate::reference();
    for sub in [
        "serve",
        "master",
        "openapi",
        "demo",
        "sim-worker",
        "store",
        "bench-routing",
    ] {
        assert!(r.contains(&format!("`moongate {sub}`")), "{sub} missing");
    }
    assert!(r.contains("--worker-urls"), "serve's flags are listed");
    assert!(r.contains("Default value:"), "defaults are rendered");
}

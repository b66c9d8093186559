//! Headless Debian Chromium for the tests that open a page as a user would (feature
//! `browser`): the DOM after a page's scripts ran, with the browser's log, and
//! screenshots.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The Chromium binary: `MOONGATE_CHROMIUM`, else `chromium` on the `PATH`. Panics when
/// there is none: a test that needs a browser fails without one, it does not skip.
pub fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("MOONGATE_CHROMIUM") {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromium"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "the `browser` feature is on but chromium is not installed \
             (apt-get install chromium, or set MOONGATE_CHROMIUM)"
        )
    })
}

/// Runs Chromium headless on `url` with a fresh profile, `virtual_ms` of virtual time
/// for the page's timers, and `args` (what to produce); answers its stdout and its log.
async fn run(url: &str, virtual_ms: u32, args: &[String]) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--virtual-time-budget={virtual_ms}"))
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("chromium finished within 120 s")
        .expect("chromium started");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "chromium failed: {}\n{log}",
        out.status
    );
    (String::from_utf8_lossy(&out.stdout).into_owned(), log)
}

/// Loads `url` and answers the DOM once the page's scripts had `virtual_ms` of virtual
/// time, and the browser's log.
pub async fn dump_dom(url: &str, virtual_ms: u32) -> (String, String) {
    run(url, virtual_ms, &["--dump-dom".to_string()]).await
}

/// Loads `url` in a `width` × `height` window and writes a PNG screenshot to `path` once
/// the page had `virtual_ms` of virtual time; answers the browser's log.
pub async fn screenshot(
    url: &str,
    virtual_ms: u32,
    (width, height): (u32, u32),
    path: &Path,
) -> String {
    let args = [
        format!("--window-size={width},{height}"),
        format!("--screenshot={}", path.display()),
    ];
    let (_, log) = run(url, virtual_ms, &args).await;
    let png = std::fs::read(path).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000,
        "not a PNG of a page: {} bytes",
        png.len()
    );
    log
}

/// The lines of the page's own console in a browser log (`CONSOLE` lines: script errors,
/// Content-Security-Policy refusals, failed loads).
pub fn console_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("CONSOLE")).collect()
}

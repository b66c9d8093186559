//! The disk tier on a file system that fills up (ENOSPC), for real: a 4 MiB tmpfs this test
//! mounts (root only: `#[ignore]`d, `.ci/run` runs it as root). A full disk fails the
//! write that hit it (the partial file gone), lowers the tier's bound to what is written,
//! and the next writes make room by dropping the least recently used records; every record
//! left reads back whole.
//!
//! ```text
//! cargo test -p kvclient --test disk_full -- --ignored
//! ```

use std::path::Path;
use std::process::Command;

use kvclient::disk::{DiskError, DiskStore};

const MIB: usize = 1 << 20;

/// A tmpfs of `size` mounted at a new directory, unmounted when dropped.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs needs root");
        Tmpfs(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

fn value(i: usize) -> Vec<u8> {
    vec![i as u8 ^ 0xa5; MIB - 4096]
}

#[test]
#[ignore = "root: mounts a tmpfs"]
fn a_full_disk_fails_one_write_lowers_the_bound_and_serves_what_it_holds() {
    let fs = Tmpfs::mount("4m");
    // A bound far above what the file system holds.
    let (d, _) = DiskStore::open(fs.path(), 64 * MIB as u64).unwrap();
    let mut written = Vec::new();
    let full = loop {
        let i = written.len();
        assert!(i < 16, "a 4 MiB file system took {i} MiB records");
        match d.write(&format!("k{i}"), &value(i)) {
            Ok(dropped) => {
                assert!(dropped.is_empty());
                written.push(i);
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&full, DiskError::Io(e) if e.kind() == std::io::ErrorKind::StorageFull),
        "{full}"
    );
    assert!(!written.is_empty());
    // The failed write left no file behind, and the bound is now what is written.
    let files = std::fs::read_dir(fs.path()).unwrap().count();
    assert_eq!(files, written.len());
    let (used, records) = d.usage();
    assert_eq!((d.capacity(), records), (used, written.len()));
    assert_eq!(
        d.counters()
            .write_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // The next write makes room: the least recently used record goes.
    let n = written.len();
    let dropped = d.write(&format!("k{n}"), &value(n)).unwrap();
    assert_eq!(dropped, vec!["k0".to_string()]);
    // Everything held reads back whole.
    let mut out = Vec::new();
    for i in 1..=n {
        d.read(&format!("k{i}"), &mut out).unwrap();
        assert!(out == value(i), "k{i} came back different");
    }
    // Reopened (a restart), the same records are found.
    drop(d);
    let (_, found) = DiskStore::open(fs.path(), 64 * MIB as u64).unwrap();
    assert_eq!(found.len(), n);
}

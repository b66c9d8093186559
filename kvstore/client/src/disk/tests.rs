use super::*;

fn value(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

fn open(dir: &Path, cap: u64) -> (DiskStore, Vec<DiskRecord>) {
    DiskStore::open(dir, cap).unwrap()
}

#[test]
fn a_record_reads_back_and_survives_a_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tier");
    let (d, found) = open(&dir, 1 << 20);
    assert!(found.is_empty());
    assert_eq!(
        fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let v = value(10_000, 7);
    assert!(d.write("k/1", &v).unwrap().is_empty());
    d.sync().unwrap();
    let mut out = Vec::new();
    d.read("k/1", &mut out).unwrap();
    assert_eq!(out, v);
    assert!(matches!(
        d.read("k/2", &mut out),
        Err(DiskError::Missing(_))
    ));
    drop(d);
    let (d, found) = open(&dir, 1 << 20);
    assert_eq!(
        found,
        vec![DiskRecord {
            key: "k/1".into(),
            length: 10_000
        }]
    );
    d.read("k/1", &mut out).unwrap();
    assert_eq!(out, v);
    assert_eq!(d.counters().adopted.load(Ordering::Relaxed), 1);
}

#[test]
fn a_corrupt_value_is_a_miss_never_served_and_its_record_goes() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, _) = open(tmp.path(), 1 << 20);
    d.write("k", &value(4096, 1)).unwrap();
    let path = d.path("k");
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0xff], data_offset(1) + 100).unwrap();
    let mut out = Vec::new();
    let e = d.read("k", &mut out).unwrap_err();
    assert!(
        matches!(e, DiskError::Corrupt { ref why, .. } if why == "value checksum"),
        "{e}"
    );
    assert!(!path.exists());
    assert!(!d.contains("k"));
    assert_eq!(d.counters().corrupt.load(Ordering::Relaxed), 1);
}

#[test]
fn torn_records_and_partial_writes_are_removed_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, _) = open(tmp.path(), 1 << 20);
    d.write("whole", &value(1000, 2)).unwrap();
    d.write("torn", &value(1000, 3)).unwrap();
    let torn = d.path("torn");
    OpenOptions::new()
        .write(true)
        .open(&torn)
        .unwrap()
        .set_len(500)
        .unwrap();
    let partial = d.path("late").with_extension(PARTIAL);
    fs::write(&partial, b"half a record").unwrap();
    // A record renamed to another key's name is not served as that key.
    let moved = d.path("moved");
    fs::copy(d.path("whole"), &moved).unwrap();
    drop(d);
    let (d, found) = open(tmp.path(), 1 << 20);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].key, "whole");
    assert!(!torn.exists() && !partial.exists() && !moved.exists());
    assert_eq!(d.counters().corrupt.load(Ordering::Relaxed), 2);
}

#[test]
fn writing_past_the_capacity_drops_the_least_recently_used() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = record_bytes(2, 1000);
    assert_eq!(rec, 2 * ALIGN);
    let (d, _) = open(tmp.path(), rec * 3);
    for k in ["k1", "k2", "k3"] {
        assert!(d.write(k, &value(1000, 4)).unwrap().is_empty());
    }
    let mut out = Vec::new();
    d.read("k1", &mut out).unwrap(); // k2 is now the least recently used
    assert_eq!(
        d.write("k4", &value(1000, 5)).unwrap(),
        vec!["k2".to_string()]
    );
    assert_eq!(d.usage(), (rec * 3, 3));
    assert!(!d.path("k2").exists());
    assert!(matches!(
        d.write("big", &value(6 * 4096, 6)),
        Err(DiskError::TooLarge(24576))
    ));
    d.delete("k1");
    assert_eq!(d.usage(), (rec * 2, 2));
    assert!(!d.path("k1").exists());
}

#[test]
fn a_directory_others_may_write_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let e = DiskStore::open(tmp.path(), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("not be writable by others"), "{e}");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o700)).unwrap();
    DiskStore::open(tmp.path(), 1 << 20).unwrap();
}

#[tokio::test]
async fn records_go_between_registered_memory_and_the_disk_directly() {
    let cfg = transfer::EngineConfig::listening_on("127.0.0.1:0".parse().unwrap());
    let engine = transfer::TransferEngine::new(cfg).await.unwrap();
    let memory = engine.alloc(1 << 20).unwrap();
    let v = value(300_000, 9);
    memory.write_at(4096, &v).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (d, _) = open(tmp.path(), 1 << 30);
    assert!(
        d.write_from("m", &memory, 4096, v.len())
            .unwrap()
            .is_empty()
    );
    // Read back by the slice form and by the direct one, elsewhere in the memory.
    let mut out = Vec::new();
    d.read("m", &mut out).unwrap();
    assert_eq!(out, v);
    d.read_into("m", &memory, 500_000, v.len()).unwrap();
    assert_eq!(memory.to_vec(500_000, v.len()).unwrap(), v);
    // An aligned destination takes the whole blocks itself, and the tail after them.
    let aligned = 128 * ALIGN as usize;
    memory.write_at(aligned, &vec![0xee; v.len() + 10]).unwrap();
    d.read_into("m", &memory, aligned, v.len()).unwrap();
    assert_eq!(memory.to_vec(aligned, v.len()).unwrap(), v);
    assert_eq!(
        memory.to_vec(aligned + v.len(), 10).unwrap(),
        vec![0xee; 10]
    );
    // A length other than the record's, and a range outside the memory, are refused.
    assert!(d.read_into("m", &memory, 0, 10).is_err());
    assert!(d.write_from("n", &memory, 900_000, 300_000).is_err());
    // A flipped byte on disk: a miss, the record gone, the memory not trusted.
    let f = OpenOptions::new().write(true).open(d.path("m")).unwrap();
    f.write_all_at(&[0x55], data_offset(1) + 7).unwrap();
    let e = d.read_into("m", &memory, 500_000, v.len()).unwrap_err();
    assert!(matches!(e, DiskError::Corrupt { .. }), "{e}");
    assert!(!d.contains("m"));
}

#[tokio::test]
async fn a_record_larger_than_the_bounce_buffer_reads_in_pieces() {
    let cfg = transfer::EngineConfig::listening_on("127.0.0.1:0".parse().unwrap());
    let engine = transfer::TransferEngine::new(cfg).await.unwrap();
    let memory = engine.alloc(16 << 20).unwrap();
    // Past the bounce buffer and not a whole number of blocks.
    let v = value(direct::BOUNCE * 2 + 1234, 11);
    let tmp = tempfile::tempdir().unwrap();
    let (d, _) = open(tmp.path(), 1 << 30);
    d.write("big", &v).unwrap();
    let mut out = Vec::new();
    d.read("big", &mut out).unwrap();
    assert!(out == v);
    // An aligned destination (the whole blocks land there directly) and one that is not,
    // each with a guard byte after it.
    for at in [ALIGN as usize, 4 * ALIGN as usize + 100] {
        memory.write_at(at + v.len(), &[0xab]).unwrap();
        d.read_into("big", &memory, at, v.len()).unwrap();
        assert!(memory.to_vec(at, v.len()).unwrap() == v, "at {at}");
        assert_eq!(memory.to_vec(at + v.len(), 1).unwrap(), vec![0xab]);
    }
    // Written from registered memory too, aligned (the whole blocks go from there) and
    // not, then read back whole.
    for (k, at) in [
        ("from-aligned", 2 * ALIGN as usize),
        ("from-odd", 3 * ALIGN as usize + 7),
    ] {
        memory.write_at(at, &v).unwrap();
        d.write_from(k, &memory, at, v.len()).unwrap();
        assert_eq!(
            fs::metadata(d.path(k)).unwrap().len(),
            record_bytes(k.len(), v.len() as u64)
        );
        d.read(k, &mut out).unwrap();
        assert!(out == v, "{k}");
    }
    // Cut inside the value: a miss, never a short value.
    let f = OpenOptions::new().write(true).open(d.path("big")).unwrap();
    f.set_len(data_offset(3) + 3 * ALIGN).unwrap();
    assert!(matches!(
        d.read("big", &mut out),
        Err(DiskError::Corrupt { .. })
    ));
}

#[test]
fn a_value_read_as_bytes_is_a_view_of_a_pooled_buffer() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, _) = open(tmp.path(), 1 << 30);
    let (small, big) = (value(100_000, 3), value(direct::BOUNCE + 5, 4));
    d.write("small", &small).unwrap();
    d.write("big", &big).unwrap();
    let idle = d.reader.idle();
    let a = d.read_bytes("small").unwrap();
    assert!(a[..] == small[..]);
    // The buffer is the value's until the value goes.
    assert_eq!(d.reader.idle(), idle.saturating_sub(1));
    let b = a.clone();
    drop(a);
    assert!(b[..] == small[..]);
    drop(b);
    assert_eq!(d.reader.idle(), idle.max(1));
    // Past the bounce buffer: a vector of its own.
    assert!(d.read_bytes("big").unwrap()[..] == big[..]);
    // A flipped byte: a miss, the buffer back in the pool.
    let f = OpenOptions::new()
        .write(true)
        .open(d.path("small"))
        .unwrap();
    f.write_all_at(&[0x77], data_offset(5) + 99_999).unwrap();
    assert!(matches!(
        d.read_bytes("small"),
        Err(DiskError::Corrupt { .. })
    ));
    assert!(d.reader.idle() >= 1);
}

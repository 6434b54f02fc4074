//! Format compatibility (after redb's `tests/backward_compatibility.rs`): a shard directory
//! written by format version 1 is committed under `tests/fixtures/shard-v1/` and must keep
//! opening with exactly the records, ids and held lsns it was written with. On a deliberate
//! format change, bump `SHARD_FORMAT_VERSION`, keep this fixture and its test, and add one for
//! the new version.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use roost_shards::{
    Applied, CompactOptions, CompactProgress, FrameSummary, Shard, ShardError, ShardOptions, Txn,
    TxnOp,
};

/// Small enough that the four frames below take two segments.
const SEGMENT_BYTES: u64 = 256;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shard-v1")
}

fn rec(id: u64) -> Vec<u8> {
    format!("{{\"name\":\"user-{id}\"}}").into_bytes()
}

fn create(id: u64) -> TxnOp {
    TxnOp::Create {
        id,
        record: rec(id),
    }
}

/// What the fixture holds: four transactions at claim lsns with gaps (other shards took the
/// lsns between), two creates in one frame, deletes of ids created in earlier frames, and a
/// roll to a second segment before lsn 9.
fn txns() -> Vec<Txn> {
    vec![
        Txn {
            lsn: 3,
            ops: vec![create(1), create(2)],
        },
        Txn {
            lsn: 5,
            ops: vec![create(3)],
        },
        Txn {
            lsn: 9,
            ops: vec![TxnOp::Delete { id: 2 }, create(4)],
        },
        Txn {
            lsn: 10,
            ops: vec![create(5), TxnOp::Delete { id: 3 }],
        },
    ]
}

fn opts(read_only: bool) -> ShardOptions {
    ShardOptions {
        segment_bytes: SEGMENT_BYTES,
        read_only,
        synced_through_lsn: None,
        ..ShardOptions::default()
    }
}

/// Regenerates the fixture with today's code. Run it only on a deliberate format change
/// (see the file's doc): `cargo test -p roost-shards --test format_fixture -- --ignored`.
/// The bytes are deterministic (no clocks, no randomness; preallocated space is zeros), so
/// running it without a format change leaves `git status` clean.
#[test]
#[ignore = "regenerates tests/fixtures/shard-v1"]
fn regenerate_shard_v1_fixture() {
    let dir = fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let mut shard = Shard::open(&dir, opts(false)).unwrap();
    for txn in txns() {
        assert_eq!(shard.apply(&txn).unwrap(), Applied::Written);
        shard.flush().unwrap();
    }
    drop(shard);
    // The lock file is not part of the format.
    std::fs::remove_file(dir.join(roost_shards::LOCK_FILE)).unwrap();
}

fn expected_summaries() -> Vec<FrameSummary> {
    let summary = |lsn, creates: &[u64], deletes: &[u64]| FrameSummary {
        lsn,
        creates: creates.to_vec(),
        deletes: deletes.to_vec(),
    };
    vec![
        summary(3, &[1, 2], &[]),
        summary(5, &[3], &[]),
        summary(9, &[4], &[2]),
        summary(10, &[5], &[3]),
    ]
}

/// Goal: the committed version 1 shard opens read-only (plain reads, no lock, nothing
/// written) with exactly its records, ids, held lsns and frames. Method: compare everything
/// the public API reports against what the generator wrote.
#[test]
fn shard_v1_fixture_still_opens() {
    let shard = Shard::open(fixture_dir(), opts(true)).unwrap();
    let report = shard.open_report();
    assert_eq!(report.segments, 2);
    assert_eq!(report.frames, 4);
    assert_eq!(report.records, 3);
    assert_eq!(report.deletes, 2);
    assert_eq!(report.torn_bytes_dropped, 0);
    assert_eq!(report.max_lsn, 10);
    assert_eq!(shard.held_lsns().unwrap(), vec![3, 5, 9, 10]);
    assert!(shard.holds(9).unwrap() && !shard.holds(4).unwrap());
    assert_eq!(shard.max_lsn(), 10);
    assert_eq!(shard.max_id(), 5);
    assert_eq!(shard.len(), 3);
    let want: Vec<(u64, Vec<u8>)> = [1, 4, 5].into_iter().map(|id| (id, rec(id))).collect();
    assert_eq!(shard.scan().unwrap(), want);
    assert_eq!(shard.get(2).unwrap(), None);
    assert_eq!(shard.get(3).unwrap(), None);
    assert_eq!(shard.get(4).unwrap(), Some(rec(4)));
    assert_eq!(shard.frame_summaries().unwrap(), expected_summaries());
}

/// Goal: a version 1 shard is not only readable but writable by today's code: held lsns are
/// still no-ops, ids ever created are still refused, and a new frame lands after the old
/// ones. Method: the same checks on a writable copy in a temporary directory.
#[test]
fn shard_v1_fixture_accepts_new_frames() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("users");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let mut shard = Shard::open(&dir, opts(false)).unwrap();
    assert_eq!(shard.apply(&txns()[2]).unwrap(), Applied::AlreadyHeld);
    let reuse = Txn {
        lsn: 11,
        ops: vec![create(2)],
    };
    assert!(matches!(
        shard.apply(&reuse),
        Err(ShardError::DuplicateId { id: 2, lsn: 11 })
    ));
    let next = Txn {
        lsn: 11,
        ops: vec![create(6), TxnOp::Delete { id: 1 }],
    };
    assert_eq!(shard.apply(&next).unwrap(), Applied::Written);
    shard.flush().unwrap();
    drop(shard);
    let shard = Shard::open(&dir, opts(true)).unwrap();
    assert_eq!(shard.held_lsns().unwrap(), vec![3, 5, 9, 10, 11]);
    let want: Vec<(u64, Vec<u8>)> = [4, 5, 6].into_iter().map(|id| (id, rec(id))).collect();
    assert_eq!(shard.scan().unwrap(), want);
}

// Format version 2: a shard directory holding a compacted segment.

fn fixture_v2_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shard-v2")
}

/// The version 1 history, then more deletes and creates; compacting it (everything vouched)
/// merges the first three segments into one compacted segment, `0000000003.seg`.
fn txns_v2() -> Vec<Txn> {
    let mut t = txns();
    t.push(Txn {
        lsn: 12,
        ops: vec![TxnOp::Delete { id: 1 }, create(6)],
    });
    t.push(Txn {
        lsn: 13,
        ops: vec![TxnOp::Delete { id: 6 }],
    });
    t.push(Txn {
        lsn: 15,
        ops: vec![create(7)],
    });
    t.push(Txn {
        lsn: 16,
        ops: vec![create(8)],
    });
    t
}

/// Regenerates `tests/fixtures/shard-v2` (see `regenerate_shard_v1_fixture`):
/// `cargo test -p roost-shards --test format_fixture -- --ignored`.
#[test]
#[ignore = "regenerates tests/fixtures/shard-v2"]
fn regenerate_shard_v2_fixture() {
    let dir = fixture_v2_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let mut shard = Shard::open(&dir, opts(false)).unwrap();
    for txn in txns_v2() {
        assert_eq!(shard.apply(&txn).unwrap(), Applied::Written);
        shard.flush().unwrap();
    }
    let o = CompactOptions {
        budget_bytes: 1 << 20,
        horizon_lsn: 16,
        dead_fraction_min: 0.3,
    };
    while shard.compact_step(&o).unwrap() != CompactProgress::Idle {}
    assert!(shard.compaction_stats().compactions >= 1);
    drop(shard);
    std::fs::remove_file(dir.join(roost_shards::LOCK_FILE)).unwrap();
}

/// Goal: the committed version 2 shard (a compacted segment, then transaction segments)
/// opens read-only and writable with exactly its records, max id, held lsns (frames and the
/// compacted range) and id rules. Method: compare against what the generator wrote.
#[test]
fn shard_v2_fixture_still_opens() {
    let shard = Shard::open(fixture_v2_dir(), opts(true)).unwrap();
    let want: Vec<(u64, Vec<u8>)> = [4, 5, 7, 8].into_iter().map(|id| (id, rec(id))).collect();
    assert_eq!(shard.scan().unwrap(), want);
    assert_eq!((shard.max_id(), shard.max_lsn()), (8, 16));
    // Lsns 3 to 15 are held compacted (4, 6, 7, 8, 11 and 14 were other shards' lsns: inside
    // the range they read as held; docs/shard-format.md says why that is safe); 16 is a frame.
    assert_eq!(shard.compacted_ranges(), vec![(3, 15)]);
    assert_eq!(shard.held_lsns().unwrap(), vec![16]);
    assert!(
        shard.holds(3).unwrap()
            && shard.holds(14).unwrap()
            && shard.holds(16).unwrap()
            && !shard.holds(2).unwrap()
    );
    assert_eq!(shard.open_report().segments, 2);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("users");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture_v2_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let mut shard = Shard::open(&dir, opts(false)).unwrap();
    assert_eq!(shard.scan().unwrap(), want);
    for txn in txns_v2() {
        assert_eq!(shard.apply(&txn).unwrap(), Applied::AlreadyHeld);
    }
    for id in [1, 2, 3, 6] {
        let r = shard.apply(&Txn {
            lsn: 17,
            ops: vec![create(id)],
        });
        assert!(
            matches!(r, Err(ShardError::DuplicateId { .. })),
            "{id}: {r:?}"
        );
    }
}

// Index files, version 1 (issue 44): sealed segments' `.idx` files and the `dead` file.

fn fixture_idx_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shard-idx-v1")
}

/// Regenerates `tests/fixtures/shard-idx-v1` (see `regenerate_shard_v1_fixture`): the version
/// 2 history without compaction, so that rolls seal segments, write their index files and
/// the `dead` file (deletes of records in sealed segments among them).
#[test]
#[ignore = "regenerates tests/fixtures/shard-idx-v1"]
fn regenerate_shard_idx_fixture() {
    let dir = fixture_idx_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let mut shard = Shard::open(&dir, opts(false)).unwrap();
    for txn in txns_v2() {
        assert_eq!(shard.apply(&txn).unwrap(), Applied::Written);
        shard.flush().unwrap();
    }
    drop(shard);
    // Neither the lock nor the spare segment is part of the format.
    std::fs::remove_file(dir.join(roost_shards::LOCK_FILE)).unwrap();
    std::fs::remove_file(dir.join("SPARE")).unwrap();
}

/// Goal: the committed index files (version 1) and `dead` file are read by today's code, not
/// rebuilt: a copy whose sealed segments' first frame is damaged still opens (its frames are
/// not read) with exactly the records written, read-only and writable, and the files are
/// left as they were; opened without index files, the same copy is refused as corrupt (so
/// the files were what was used). Method: compare against what the generator wrote.
#[test]
fn shard_idx_fixture_is_read_not_rebuilt() {
    let files: Vec<String> = std::fs::read_dir(fixture_idx_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        files.iter().filter(|f| f.ends_with(".idx")).count() >= 2,
        "{files:?}"
    );
    assert!(files.iter().any(|f| f == "dead"), "{files:?}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("users");
    std::fs::create_dir_all(&dir).unwrap();
    for f in &files {
        std::fs::copy(fixture_idx_dir().join(f), dir.join(f)).unwrap();
    }
    let seg = dir.join("0000000001.seg");
    let mut b = std::fs::read(&seg).unwrap();
    b[40] ^= 0x01; // inside the first frame, not the last one (the anchor)
    std::fs::write(&seg, b).unwrap();
    let want: Vec<(u64, Vec<u8>)> = [4, 5, 7, 8].into_iter().map(|id| (id, rec(id))).collect();
    let before: Vec<Vec<u8>> = files
        .iter()
        .filter(|f| f.ends_with(".idx") || *f == "dead")
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();
    for read_only in [true, false] {
        let shard = Shard::open(&dir, opts(read_only)).unwrap();
        assert_eq!(shard.scan().unwrap(), want, "read_only {read_only}");
        assert_eq!((shard.max_id(), shard.max_lsn()), (8, 16));
    }
    let after: Vec<Vec<u8>> = files
        .iter()
        .filter(|f| f.ends_with(".idx") || *f == "dead")
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();
    assert_eq!(before, after, "the index files were rewritten");
    let scan_all = ShardOptions {
        index_files: false,
        ..opts(true)
    };
    assert!(matches!(Shard::open(&dir, scan_all), Err(e) if e.is_corruption()));
}

//! Format compatibility (after redb's `tests/backward_compatibility.rs`): a shard directory
//! written by format version 1 is committed under `tests/fixtures/shard-v1/` and must keep
//! opening with exactly the records, ids and held lsns it was written with. On a deliberate
//! format change, bump `SHARD_FORMAT_VERSION`, keep this fixture and its test, and add one for
//! the new version.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use roost_shards::{Applied, FrameSummary, Shard, ShardError, ShardOptions, Txn, TxnOp};

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
    assert_eq!(shard.held_lsns().collect::<Vec<_>>(), vec![3, 5, 9, 10]);
    assert!(shard.holds(9) && !shard.holds(4));
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
    assert_eq!(shard.held_lsns().collect::<Vec<_>>(), vec![3, 5, 9, 10, 11]);
    let want: Vec<(u64, Vec<u8>)> = [4, 5, 6].into_iter().map(|id| (id, rec(id))).collect();
    assert_eq!(shard.scan().unwrap(), want);
}

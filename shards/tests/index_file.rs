//! Black-box tests of the shard's index file (`INDEX`, docs/shard-format.md "Index file"): an
//! open that starts from it answers exactly as a full scan does (creates, deletes, the frames
//! past it, torn tails), a damaged, old-version or stale file means a full scan and never a
//! wrong answer, and a crash at every step of its write opens to the same answers.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{opts, sim_dir};
use std::sync::Arc;

use roost_shards::{Shard, ShardOptions, Txn, TxnOp, INDEX_FILE, INDEX_FORMAT_VERSION};
use roost_storage::{CrashMode, SimFaults, SimStorage};

const SEG: u64 = 2048;

fn with_tail_min(index_tail_min: u64) -> ShardOptions {
    ShardOptions {
        index_tail_min,
        ..opts(SEG)
    }
}

fn open(disk: &SimStorage, o: ShardOptions) -> Shard {
    Shard::open_with(Arc::new(disk.clone()), sim_dir(), o).unwrap()
}

/// Never writes the index file on its own (only `write_index_file` does).
fn open_sim(disk: &SimStorage) -> Shard {
    open(disk, with_tail_min(u64::MAX))
}

/// Every frame scanned, the index file neither read nor written.
fn open_scan(disk: &SimStorage) -> Shard {
    open(
        disk,
        ShardOptions {
            index_file: false,
            ..opts(SEG)
        },
    )
}

fn rec(id: u64) -> Vec<u8> {
    format!("{{\"name\":\"user-{id}\",\"n\":{}}}", id * 7).into_bytes()
}

/// Transaction `i` (lsn `3i + 1`: gaps, as other shards take lsns): two creates, and a delete
/// of an id from four transactions back (on an earlier segment now and then).
fn txn(i: u64) -> Txn {
    let mut ops = vec![
        TxnOp::Create {
            id: 2 * i + 1,
            record: rec(2 * i + 1),
        },
        TxnOp::Create {
            id: 2 * i + 2,
            record: rec(2 * i + 2),
        },
    ];
    if i >= 4 && i.is_multiple_of(2) {
        ops.push(TxnOp::Delete {
            id: 2 * (i - 4) + 1,
        });
    }
    Txn {
        lsn: 3 * i + 1,
        ops,
    }
}

fn apply(s: &mut Shard, range: std::ops::Range<u64>) {
    for i in range {
        s.apply(&txn(i)).unwrap();
    }
    s.flush().unwrap();
}

/// Everything a reader can ask: the records, ids absent, max id and lsn, the lsns held, the
/// space accounting.
fn answers(s: &Shard) -> String {
    let held: Vec<u64> = (0..=s.max_lsn() + 1).filter(|l| s.holds(*l)).collect();
    let absent: Vec<u64> = (1..=s.max_id() + 1).filter(|id| !s.contains(*id)).collect();
    let c = s.compaction_stats();
    format!(
        "records {:?}\nabsent {absent:?}\nmax_id {} max_lsn {} len {}\nheld {held:?}\nspace {} {} {}",
        s.scan().unwrap(),
        s.max_id(),
        s.max_lsn(),
        s.len(),
        c.used_bytes,
        c.dead_bytes,
        c.segments
    )
}

/// Goal: an open from the index file reads only the frames past it and answers exactly as a
/// full scan, deleted records included (deleted under the file's cover, and past it, of
/// records the file holds live). Method: write the file at transaction 40, apply 25 more
/// (several segment rolls), reopen both ways and compare everything a reader can ask.
#[test]
fn open_from_the_index_file_answers_as_a_full_scan_and_reads_only_the_tail() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk);
    apply(&mut s, 0..40);
    assert!(s.write_index_file().unwrap());
    assert!(!s.write_index_file().unwrap(), "nothing new to cover");
    apply(&mut s, 40..65);
    let before = answers(&s);
    drop(s);
    let disk = disk.crash(CrashMode::PowerDrop);
    let s = open_sim(&disk);
    let r = s.open_report().clone();
    assert_eq!(r.indexed_frames, 40, "{r:?}");
    assert_eq!(r.frames, 65, "{r:?}");
    assert!(r.segments > 2, "the history rolls segments: {r:?}");
    assert_eq!(answers(&s), before);
    assert!(
        !s.contains(1) && s.contains(2),
        "id 1 deleted under the cover"
    );
    assert!(!s.contains(2 * 40 + 1 - 8), "deleted past the cover");
    drop(s);
    assert_eq!(answers(&open_scan(&disk)), before);
}

/// Goal: the frames past the file's cover keep the torn-tail rule: a torn last frame after
/// the cover is dropped, and the file still serves the rest.
#[test]
fn a_torn_frame_past_the_cover_is_dropped() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk);
    apply(&mut s, 0..10);
    assert!(s.write_index_file().unwrap());
    apply(&mut s, 10..12);
    s.apply(&txn(12)).unwrap(); // never flushed
    drop(s);
    let disk = disk.crash(CrashMode::PowerTear { seed: 3 });
    let s = open_sim(&disk);
    assert_eq!(s.open_report().indexed_frames, 10);
    assert!(s.max_lsn() == txn(11).lsn || s.max_lsn() == txn(12).lsn);
    let want = answers(&s);
    drop(s);
    assert_eq!(answers(&open_scan(&disk)), want);
}

/// Goal: a damaged, cut, other-version or stale file is never trusted: the open scans every
/// frame, answers as before, and writes a fresh file (when due). Method: each damage in turn
/// on a copy of the disk.
#[test]
fn a_damaged_old_or_stale_index_file_means_a_full_scan() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk);
    apply(&mut s, 0..30);
    assert!(s.write_index_file().unwrap());
    let want = answers(&s);
    drop(s);
    let path = sim_dir().join(INDEX_FILE);
    let good = disk.file_bytes(&path).unwrap();
    assert_eq!(good[8], INDEX_FORMAT_VERSION);
    let damages: Vec<(&str, Vec<u8>)> = vec![
        ("a flipped entry byte", flip(&good, good.len() - 7)),
        ("a flipped header byte", flip(&good, 20)),
        ("a cut file", good[..good.len() - 20].to_vec()),
        ("another version", {
            let mut v = good.clone();
            v[8] = INDEX_FORMAT_VERSION + 1;
            v
        }),
        ("an empty file", Vec::new()),
    ];
    for (what, bytes) in damages {
        let d = disk.crash(CrashMode::Process);
        d.put_file_bytes(&path, bytes.clone());
        let s = open(&d, with_tail_min(0));
        assert_eq!(s.open_report().indexed_frames, 0, "{what}");
        assert_eq!(answers(&s), want, "{what}");
        drop(s);
        assert_ne!(d.file_bytes(&path), Some(bytes), "{what}: a fresh file");
        assert_eq!(open_sim(&d).open_report().indexed_frames, 30, "{what}");
    }
    // Stale: a file from before a truncate must not bring back what was cut.
    let d = disk.crash(CrashMode::Process);
    let mut s = open_sim(&d);
    assert_eq!(s.truncate_from(txn(20).lsn).unwrap(), 10);
    let cut = answers(&s);
    drop(s);
    let s = open_sim(&d);
    assert_eq!(
        s.open_report().indexed_frames,
        0,
        "truncate removed the file"
    );
    assert_eq!(answers(&s), cut);
    assert!(!s.holds(txn(25).lsn));
}

fn flip(b: &[u8], at: usize) -> Vec<u8> {
    let mut v = b.to_vec();
    v[at] ^= 0x40;
    v
}

/// Goal: a crash at every step of the index file's write (its temporary's write and
/// fdatasync, the rename, the directory fsync) opens to the same answers: the new file, the
/// old one, or none, never a torn one trusted. Method: fail each sync of the write (a process
/// crash before it) and freeze durability at each (a power loss there while the process runs
/// on), then crash in every mode and reopen; the file in place must then serve the open.
#[test]
fn crash_at_every_step_of_the_index_file_write_opens_to_the_same_answers() {
    let base = SimStorage::new();
    let mut s = open_sim(&base);
    apply(&mut s, 0..20);
    assert!(s.write_index_file().unwrap());
    apply(&mut s, 20..45);
    let want = answers(&s);
    drop(s);
    // The syncs one write takes (the temporary, the directory), on a copy.
    let syncs = {
        let d = base.crash(CrashMode::Process);
        let mut s = open_sim(&d);
        let before = d.sync_count();
        assert!(s.write_index_file().unwrap());
        d.sync_count() - before
    };
    assert!(syncs >= 2, "data and directory synced: {syncs}");
    let mut seen_new = false;
    for n in 1..=syncs + 1 {
        for fault in ["fail", "freeze"] {
            let disk = base.crash(CrashMode::Process);
            let mut s = open_sim(&disk);
            let at = disk.sync_count() + n;
            disk.set_faults(SimFaults {
                fail_sync_at: (fault == "fail").then_some(at),
                freeze_after_syncs: (fault == "freeze").then_some(at - 1),
                ..SimFaults::default()
            });
            let _ = s.write_index_file();
            drop(s);
            for mode in [
                CrashMode::Process,
                CrashMode::PowerDrop,
                CrashMode::PowerTear { seed: n },
            ] {
                let what = format!("{fault} at index sync {n}, {mode:?}");
                let s = open_sim(&disk.crash(mode));
                let indexed = s.open_report().indexed_frames;
                assert!(indexed == 20 || indexed == 45, "{what}: {indexed}");
                seen_new |= indexed == 45;
                assert_eq!(answers(&s), want, "{what}");
            }
        }
    }
    assert!(seen_new, "some schedule kept the new file");
}

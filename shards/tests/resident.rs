//! What a shard keeps resident of its segments' maps on the real disk (issue 44): open's scan,
//! a `scan` and many reads must not leave the segments' pages counted in the process's
//! resident set. Measured per mapping from `/proc/self/smaps`, so other tests running in the
//! same process do not blur it.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use roost_shards::{Shard, ShardOptions, Txn, TxnOp, RELEASE_PAGES_AFTER_READS};

/// KiB resident (`Rss:` in `/proc/self/smaps`) of every mapping of a file under `dir`, and how
/// many such mappings there are.
fn resident_kib(dir: &Path) -> (u64, usize) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let dir = format!("{}/", dir.to_str().unwrap());
    let (mut kib, mut maps, mut inside) = (0, 0, false);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            inside = line
                .split_whitespace()
                .nth(5)
                .is_some_and(|p| p.starts_with(&dir));
            maps += usize::from(inside);
        } else if inside {
            if let Some(v) = line.strip_prefix("Rss:") {
                kib += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
    }
    (kib, maps)
}

fn record(id: u64) -> Vec<u8> {
    format!("{{\"n\":{id},\"pad\":\"{}\"}}", "x".repeat(200)).into_bytes()
}

/// Transaction `lsn` of [`filled`]: the 16 records after those of the transactions before.
fn txn_of(lsn: u64) -> Txn {
    let ops = (1..=16)
        .map(|i| {
            let id = (lsn - 1) * 16 + i;
            TxnOp::Create {
                id,
                record: record(id),
            }
        })
        .collect();
    Txn { lsn, ops }
}

/// A shard of several 64 KiB segments, each frame 16 records of about 220 bytes.
fn filled(dir: &Path) -> (ShardOptions, u64) {
    let opts = ShardOptions {
        segment_bytes: 64 << 10,
        first_segment_bytes: 64 << 10,
        ..ShardOptions::default()
    };
    let mut s = Shard::open(dir, opts.clone()).unwrap();
    let mut id = 0;
    for lsn in 1..=100 {
        let ops = (0..16)
            .map(|_| {
                id += 1;
                TxnOp::Create {
                    id,
                    record: record(id),
                }
            })
            .collect();
        s.apply(&Txn { lsn, ops }).unwrap();
    }
    s.flush().unwrap();
    (opts, id)
}

#[test]
fn open_scan_and_reads_leave_no_segment_pages_resident() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shard");
    let (opts, ids) = filled(&dir);
    let s = Shard::open(&dir, opts).unwrap();
    let (kib, maps) = resident_kib(&dir);
    assert!(maps >= 5, "expected several mapped segments, found {maps}");
    assert_eq!(kib, 0, "open's scan left {kib} KiB of segments resident");

    // A get reads with a positioned read, never the map: nothing resident after many.
    for id in 1..RELEASE_PAGES_AFTER_READS as u64 * 2 {
        assert_eq!(
            s.get(id * 7 % ids + 1).unwrap().unwrap(),
            record(id * 7 % ids + 1)
        );
    }
    let (kib, _) = resident_kib(&dir);
    assert_eq!(kib, 0, "gets left {kib} KiB of segments resident");
    // Recovery's check of a held frame reads through the map (the measure sees it) ...
    let mut s = s;
    for lsn in 1..RELEASE_PAGES_AFTER_READS as u64 {
        let t = txn_of(lsn % 100 + 1);
        assert_eq!(s.apply(&t).unwrap(), roost_shards::Applied::AlreadyHeld);
    }
    let (kib, _) = resident_kib(&dir);
    assert!(
        kib > 0,
        "re-applies left nothing resident: the measure sees nothing"
    );
    // ... and the read that reaches the bound lets go of them.
    assert_eq!(
        s.apply(&txn_of(1)).unwrap(),
        roost_shards::Applied::AlreadyHeld
    );
    let (kib, _) = resident_kib(&dir);
    assert_eq!(kib, 0, "{kib} KiB resident after the bound's read");

    // A scan reads every record and leaves nothing resident either.
    let all = s.scan().unwrap();
    assert_eq!(all.len() as u64, ids);
    assert!(all.iter().all(|(id, r)| *r == record(*id)));
    let (kib, _) = resident_kib(&dir);
    assert_eq!(kib, 0, "a scan left {kib} KiB of segments resident");
}

/// `index_bytes` (what `status.memory.shard_index_bytes` sums) does not grow with the records
/// a shard keeps: a sealed segment's entries and frames are in its index file on disk, and
/// memory holds only each 4 KiB page's first key and checksum (under 0.1 B a record), plus
/// the segment being written (up to 1 MiB of 56-byte frames here, at 36 B each). Twice the
/// records cost at most one more segment's worth; a reopen holds the same.
#[test]
fn index_bytes_do_not_grow_with_the_records_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shard");
    let opts = ShardOptions {
        segment_bytes: 1 << 20,
        first_segment_bytes: 1 << 20,
        ..ShardOptions::default()
    };
    let mut s = Shard::open(&dir, opts.clone()).unwrap();
    let (half, frames): (u64, u64) = (100_000, 200_000);
    let one_segment = (1 << 20) / 56 * 48;
    let mut at_half = 0;
    for lsn in 1..=frames {
        let ops = vec![TxnOp::Create {
            id: lsn,
            record: b"{}".to_vec(),
        }];
        s.apply(&Txn { lsn, ops }).unwrap();
        if lsn == half {
            at_half = s.index_bytes() as u64;
        }
    }
    let at_full = s.index_bytes() as u64;
    assert!(
        at_half <= one_segment + 16_384,
        "{at_half} B at {half} records"
    );
    assert!(
        at_full <= one_segment + 32_768,
        "{at_full} B at {frames} records"
    );
    // All in memory, as before index files, it was 44 B a record.
    assert!(
        at_full < frames * 44 / 8,
        "{at_full} B for {frames} records"
    );
    s.flush().unwrap();
    drop(s);
    let s = Shard::open(&dir, opts).unwrap();
    assert_eq!(s.index_bytes() as u64, at_full, "after a reopen");
    assert_eq!(s.len() as u64, frames);
    assert!(s.contains(1).unwrap() && s.contains(frames).unwrap());
}

//! Black-box tests of the log through its public API, on the simulated disk and on real
//! temporary directories.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{all, last_segment, open, opts};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use roost_storage::{CrashMode, RealStorage, SimFaults, SimStorage, Storage};
use roost_wal::format::{
    frame_len, probe, Header, Probe, LEN_OFFSET, RECORD_HEADER_LEN, WAL_FORMAT_VERSION,
};
use roost_wal::{Wal, WalError, WalOptions};

fn payload(i: u64) -> Vec<u8> {
    format!("record-{i}-")
        .repeat((i % 7 + 1) as usize)
        .into_bytes()
}

/// Goal: what goes in comes out, in order, across segment rolls and a reopen.
#[test]
fn round_trip_across_segments_and_reopen() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(512)).unwrap();
    for i in 1..=100u64 {
        assert_eq!(wal.append(1, &payload(i)).unwrap(), i);
    }
    drop(wal);
    let wal = open(&disk, opts(512)).unwrap();
    assert!(
        wal.recovery_report().segments > 5,
        "rolled: {:?}",
        wal.recovery_report()
    );
    let got = all(&wal);
    assert_eq!(got.len(), 100);
    for (i, (lsn, p)) in got.iter().enumerate() {
        assert_eq!(*lsn, i as u64 + 1);
        assert_eq!(p, &payload(*lsn));
    }
    assert_eq!(wal.append(1, b"more").unwrap(), 101);
    // Replay from the middle starts at the right record.
    let from: Vec<u64> = wal.replay(57).map(|r| r.unwrap().lsn).collect();
    assert_eq!(from, (57..=101).collect::<Vec<_>>());
}

/// Goal: `append_many_nowait` gives the lsns and bytes that one append per record would,
/// across segment rolls (a batch of frames that does not fit is split at the roll), mixed
/// with single appends, and after a reopen; one write per segment touched.
#[test]
fn append_many_matches_single_appends_across_rolls() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(512)).unwrap();
    let mut want = Vec::new();
    let mut next = 1u64;
    for round in 0..20u64 {
        let batch: Vec<Vec<u8>> = (0..(round % 9)).map(|i| payload(next + i)).collect();
        let recs: Vec<(u8, &[u8])> = batch.iter().map(|p| (1u8, p.as_slice())).collect();
        let before = wal.append_count();
        let lsns = wal.append_many_nowait(&recs).unwrap();
        assert_eq!(lsns, (next..next + batch.len() as u64).collect::<Vec<_>>());
        assert_eq!(wal.append_count() - before, batch.len() as u64);
        next += recs.len() as u64;
        want.extend(lsns.into_iter().zip(batch));
        let single = payload(next);
        assert_eq!(wal.append_nowait(1, &single).unwrap(), next);
        want.push((next, single));
        next += 1;
    }
    wal.sync_to(next - 1).unwrap();
    assert_eq!(all(&wal), want);
    drop(wal);
    let wal = open(&disk, opts(512)).unwrap();
    assert!(wal.recovery_report().segments > 5, "rolled");
    assert_eq!(all(&wal), want);
    let too_big = vec![0u8; 4096 + 1];
    assert!(matches!(
        wal.append_many_nowait(&[(1, b"ok"), (1, &too_big)]),
        Err(WalError::TooLarge { .. })
    ));
    assert_eq!(
        wal.next_lsn(),
        next,
        "nothing of a refused batch is written"
    );
}

/// Goal: the same on a real directory, including preallocated segment files on disk.
#[test]
fn round_trip_on_real_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = Wal::open(tmp.path(), opts(4096)).unwrap();
    for i in 1..=50u64 {
        wal.append(1, &payload(i)).unwrap();
    }
    drop(wal);
    let names: Vec<String> = RealStorage.list(tmp.path()).unwrap();
    // Segments, and the spare segment preallocated ahead of the next roll.
    assert!(
        names
            .iter()
            .all(|n| (n.ends_with(".wal") && n.len() == 24) || n == "SPARE"),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n == "SPARE"), "{names:?}");
    for n in &names {
        assert_eq!(
            std::fs::metadata(tmp.path().join(n)).unwrap().len(),
            4096,
            "preallocated"
        );
    }
    let wal = Wal::open(tmp.path(), opts(4096)).unwrap();
    assert_eq!(all(&wal).len(), 50);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
    /// Goal: a torn last record, cut at any byte offset (and the rest of the preallocated
    /// space zero), recovers exactly the earlier records, and the cut is durable before the
    /// next append.
    #[test]
    fn torn_tail_at_any_offset_recovers_earlier_records(n in 1u64..12, cut_frac in 0.0f64..1.0) {
        let disk = SimStorage::new();
        let wal = open(&disk, opts(1 << 16)).unwrap();
        for i in 1..=n { wal.append(1, &payload(i)).unwrap(); }
        drop(wal);
        let seg = last_segment(&disk);
        let mut bytes = disk.file_bytes(&seg).unwrap();
        let last_start: usize = (1..n).map(|i| frame_len(payload(i).len())).sum();
        let last_len = frame_len(payload(n).len());
        let cut = last_start + ((last_len as f64) * cut_frac) as usize;
        for b in &mut bytes[cut..] { *b = 0; }
        disk.put_file_bytes(&seg, bytes);
        let wal = open(&disk, opts(1 << 16)).unwrap();
        let got = all(&wal);
        let expect = if cut >= last_start + RECORD_HEADER_LEN + payload(n).len() { n } else { n - 1 };
        prop_assert_eq!(got.len() as u64, expect);
        // The cut must already be durable: a power loss right after open keeps it.
        prop_assert_eq!(wal.append(1, b"after").unwrap(), expect + 1);
        drop(wal);
        let wal = open(&disk.crash(CrashMode::PowerDrop), opts(1 << 16)).unwrap();
        let got = all(&wal);
        prop_assert_eq!(got.last().unwrap(), &(expect + 1, b"after".to_vec()));
    }
}

/// Goal: a torn tail cut at every byte offset of the last record, exhaustively for one size.
#[test]
fn torn_tail_every_byte_offset() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 14)).unwrap();
    for i in 1..=3u64 {
        wal.append(1, &payload(i)).unwrap();
    }
    drop(wal);
    let seg = last_segment(&disk);
    let orig = disk.file_bytes(&seg).unwrap();
    let last_start = frame_len(payload(1).len()) + frame_len(payload(2).len());
    let last_len = RECORD_HEADER_LEN + payload(3).len();
    for cut in last_start..last_start + last_len {
        let d = SimStorage::new();
        let mut bytes = orig.clone();
        for b in &mut bytes[cut..] {
            *b = 0;
        }
        d.put_file_bytes(&seg, bytes);
        let wal = open(&d, opts(1 << 14)).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(all(&wal).len(), 2, "cut at {cut}");
    }
}

/// Goal: one flipped byte in a middle record is corruption, reported with the segment, the
/// offset of that record and its lsn; never silently truncated.
#[test]
fn flipped_byte_in_middle_record_is_corruption_at_its_offset() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 14)).unwrap();
    for i in 1..=5u64 {
        wal.append(1, &payload(i)).unwrap();
    }
    drop(wal);
    let seg = last_segment(&disk);
    let mut bytes = disk.file_bytes(&seg).unwrap();
    let third: usize = (1..3).map(|i| frame_len(payload(i).len())).sum();
    bytes[third + RECORD_HEADER_LEN + 3] ^= 0x01;
    disk.put_file_bytes(&seg, bytes);
    match open(&disk, opts(1 << 14)) {
        Err(WalError::Corrupt {
            segment,
            offset,
            lsn,
            reason,
        }) => {
            assert_eq!(segment, seg);
            assert_eq!(offset, third as u64);
            assert_eq!(lsn, 3);
            assert!(reason.contains("followed by valid"), "{reason}");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    // Read-only open refuses the same way: no salvage by default anywhere.
    let ro = WalOptions {
        read_only: true,
        ..opts(1 << 14)
    };
    assert!(matches!(open(&disk, ro), Err(WalError::Corrupt { .. })));
}

/// Goal: damage in a sealed (not the newest) segment is corruption even at its end.
#[test]
fn damage_in_sealed_segment_is_corruption() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    for i in 1..=20u64 {
        wal.append(1, &payload(i)).unwrap();
    }
    drop(wal);
    let mut segs: Vec<PathBuf> = disk.paths();
    segs.sort();
    let first = &segs[0];
    let mut bytes = disk.file_bytes(first).unwrap();
    let first_len = frame_len(payload(1).len());
    bytes[first_len + 5] ^= 0xff; // second record of the first segment, its last
    disk.put_file_bytes(first, bytes);
    let err = open(&disk, opts(256)).unwrap_err();
    assert!(
        matches!(err, WalError::Corrupt { ref segment, .. } if segment == first),
        "{err}"
    );
}

/// Goal (issue 25): with `scan_sealed = false` open reads only the newest segment, so it
/// costs the same however many sealed segments there are; it still knows where the log
/// ends and appends after it; a damaged sealed record is found when it is read (and by a
/// scanning open). Method: 20 records over many 256-byte segments, a damaged record in the
/// first segment, opened both ways.
#[test]
fn an_open_that_skips_sealed_segments_scans_only_the_newest() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    for i in 1..=20u64 {
        wal.append(1, &payload(i)).unwrap();
    }
    let segments = wal.segments().len();
    drop(wal);
    let whole = open(&disk, opts(256))
        .unwrap()
        .recovery_report()
        .bytes_scanned;
    let trusting = WalOptions {
        scan_sealed: false,
        ..opts(256)
    };
    let wal = open(&disk, trusting.clone()).unwrap();
    assert!(segments > 3, "{segments} segments");
    assert_eq!(wal.next_lsn(), 21, "the log's end is known");
    assert!(
        wal.recovery_report().bytes_scanned <= 256,
        "scanned only the newest segment"
    );
    assert!(
        whole > 3 * 256,
        "a scanning open reads every segment: {whole}"
    );
    wal.append(1, &payload(21)).unwrap();
    assert_eq!(all(&wal).len(), 21);
    drop(wal);
    let mut segs: Vec<PathBuf> = disk.paths();
    segs.sort();
    let mut bytes = disk.file_bytes(&segs[0]).unwrap();
    bytes[5] ^= 0xff; // the first record
    disk.put_file_bytes(&segs[0], bytes);
    let wal = open(&disk, trusting).expect("the damage is not read at open");
    let err = wal
        .replay(1)
        .find_map(|r| r.err())
        .expect("a read finds the damage");
    assert!(matches!(err, WalError::Corrupt { .. }), "{err}");
    drop(wal);
    assert!(matches!(
        open(&disk, opts(256)),
        Err(WalError::Corrupt { .. })
    ));
}

/// Goal: a header that claims a 4 GiB payload is corruption (or a torn tail when last and
/// nothing follows), never an allocation of 4 GiB.
#[test]
fn four_gib_length_is_rejected_before_allocation() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 14)).unwrap();
    for i in 1..=3u64 {
        wal.append(1, &payload(i)).unwrap();
    }
    drop(wal);
    let seg = last_segment(&disk);
    let mut bytes = disk.file_bytes(&seg).unwrap();
    let second = frame_len(payload(1).len());
    bytes[second + LEN_OFFSET..second + LEN_OFFSET + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    disk.put_file_bytes(&seg, bytes);
    let err = open(&disk, opts(1 << 14)).unwrap_err();
    match err {
        WalError::Corrupt { offset, reason, .. } => {
            assert_eq!(offset, second as u64);
            assert!(reason.contains("length over limit"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// Goal: group commit. N threads appending at once all find their records after reopen, and
/// the log made fewer syncs than records (counted through the seam and by the log).
#[test]
fn concurrent_appends_share_syncs() {
    let disk = SimStorage::new();
    disk.set_faults(SimFaults {
        sync_latency: Some(std::time::Duration::from_millis(1)),
        ..SimFaults::default()
    });
    let wal = Arc::new(open(&disk, opts(1 << 20)).unwrap());
    let threads = 16u64;
    let per = 50u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                (0..per)
                    .map(|i| wal.append(1, format!("t{t}-{i}").as_bytes()).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut lsns: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    lsns.sort();
    assert_eq!(lsns, (1..=threads * per).collect::<Vec<_>>());
    let records = threads * per;
    let syncs = wal.sync_count();
    let disk_syncs = disk.sync_count();
    eprintln!("group commit: {records} records, {syncs} wal syncs, {disk_syncs} disk syncs");
    assert!(syncs < records, "{syncs} syncs for {records} records");
    assert!(disk_syncs < records);
    drop(wal);
    // Everything acknowledged survives a power loss.
    let wal = open(&disk.crash(CrashMode::PowerDrop), opts(1 << 20)).unwrap();
    let mut got: Vec<String> = all(&wal)
        .into_iter()
        .map(|(_, p)| String::from_utf8(p).unwrap())
        .collect();
    got.sort();
    let mut want: Vec<String> = (0..threads)
        .flat_map(|t| (0..per).map(move |i| format!("t{t}-{i}")))
        .collect();
    want.sort();
    assert_eq!(got, want);
}

/// Goal: a failed sync poisons the log: the caller gets the error, and every later append is
/// refused with the distinct `Poisoned` error, without another sync attempt.
#[test]
fn failed_sync_poisons_the_log() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 14)).unwrap();
    wal.append(1, b"one").unwrap();
    let before = disk.sync_count();
    disk.set_faults(SimFaults {
        fail_sync_at: Some(before + 1),
        ..SimFaults::default()
    });
    assert!(matches!(
        wal.append(1, b"two"),
        Err(WalError::Poisoned(_)) | Err(WalError::Io { .. })
    ));
    let after = disk.sync_count();
    assert!(matches!(
        wal.append(1, b"three"),
        Err(WalError::Poisoned(_))
    ));
    assert!(matches!(wal.sync_to(2), Err(WalError::Poisoned(_))));
    assert_eq!(disk.sync_count(), after, "fsync is never retried");
}

/// Goal: a failed write poisons the log too.
#[test]
fn failed_write_poisons_the_log() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 14)).unwrap();
    wal.append(1, b"one").unwrap();
    disk.set_faults(SimFaults {
        fail_write_at: Some(disk.write_count() + 1),
        ..SimFaults::default()
    });
    assert!(matches!(
        wal.append(1, b"two"),
        Err(WalError::Io { op: "write", .. })
    ));
    assert!(matches!(
        wal.append(1, b"three"),
        Err(WalError::Poisoned(_))
    ));
}

/// Goal: a power loss frozen at every sync point keeps exactly the acknowledged records
/// (those whose append returned before the freeze), and recovery opens cleanly. Every sync
/// of the run, the rolls' among them (seal, spare renamed, directory, next spare made).
#[test]
fn power_loss_at_every_sync_keeps_acknowledged_records() {
    let total = {
        let disk = SimStorage::new();
        let wal = open(&disk, opts(300)).unwrap();
        for i in 1..=25u64 {
            wal.append(1, &payload(i)).unwrap();
        }
        assert!(
            wal.recovery_report().segments == 0 && disk.paths().len() > 6,
            "it rolls"
        );
        disk.sync_count()
    };
    for freeze in 0..=total {
        for mode in [
            CrashMode::PowerDrop,
            CrashMode::PowerTear {
                seed: freeze * 31 + 1,
            },
        ] {
            let disk = SimStorage::new();
            disk.set_faults(SimFaults {
                freeze_after_syncs: Some(freeze),
                ..SimFaults::default()
            });
            let wal = open(&disk, opts(300)).unwrap();
            let mut acked = 0;
            for i in 1..=25u64 {
                wal.append(1, &payload(i)).unwrap();
                if disk.sync_count() <= freeze {
                    acked = i;
                }
            }
            drop(wal);
            let wal = open(&disk.crash(mode), opts(300))
                .unwrap_or_else(|e| panic!("freeze {freeze} {mode:?}: {e}"));
            let got = all(&wal);
            assert!(
                got.len() as u64 >= acked,
                "freeze {freeze}: {} < {acked}",
                got.len()
            );
            for (lsn, p) in &got {
                assert_eq!(p, &payload(*lsn));
            }
        }
    }
}

/// Goal: retiring removes whole segments below an lsn, keeps the rest replayable.
#[test]
fn retire_below_removes_whole_old_segments() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    for i in 1..=40u64 {
        wal.append(1, &payload(i)).unwrap();
    }
    let before = disk.paths().len();
    let removed = wal.retire_below(20).unwrap();
    assert!(removed > 0 && disk.paths().len() == before - removed);
    let first = wal.replay(1).next().unwrap().unwrap().lsn;
    assert!(first <= 20 && first > 1, "first kept lsn {first}");
    drop(wal);
    let wal = open(&disk.crash(CrashMode::PowerDrop), opts(256)).unwrap();
    assert_eq!(wal.replay(1).last().unwrap().unwrap().lsn, 40);
}

fn fixture_dir(version: u8) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/wal-v{version}"))
}

/// The fixture's records: lsn 1..=12, each with `payload(lsn)`.
fn fixture_records() -> Vec<(u64, Vec<u8>)> {
    (1..=12u64).map(|i| (i, payload(i))).collect()
}

/// Writes the current version's fixture when `ROOST_WRITE_FIXTURES` is set, never an older
/// one: `ROOST_WRITE_FIXTURES=1 cargo test -p roost-wal fixture` after a deliberate format
/// change (and a bump of `WAL_FORMAT_VERSION`, so the old fixture stays beside it). Appends
/// without waiting and syncs every third record, so the synced marks differ from record to
/// record.
fn maybe_write_fixture(version: u8) {
    if version != WAL_FORMAT_VERSION || std::env::var_os("ROOST_WRITE_FIXTURES").is_none() {
        return;
    }
    let _ = std::fs::remove_dir_all(fixture_dir(version));
    let wal = Wal::open(fixture_dir(version), opts(512)).unwrap();
    for (lsn, p) in fixture_records() {
        assert_eq!(wal.append_nowait(1, &p).unwrap(), lsn);
        if lsn % 3 == 0 {
            wal.sync_to(lsn).unwrap();
        }
    }
    wal.sync_to(12).unwrap();
    drop(wal);
    // The spare segment is preallocated space, not part of the format.
    std::fs::remove_file(fixture_dir(version).join(roost_storage::SPARE_FILE)).unwrap();
}

fn open_fixture(version: u8) -> Wal {
    maybe_write_fixture(version);
    let ro = WalOptions {
        read_only: true,
        ..opts(512)
    };
    let wal = Wal::open(fixture_dir(version), ro).unwrap();
    assert_eq!(all(&wal), fixture_records());
    assert!(wal.recovery_report().segments >= 2);
    wal
}

/// Every record header of a log directory on the real disk, oldest first.
fn headers(dir: &Path) -> Vec<Header> {
    let mut names = RealStorage.list(dir).unwrap();
    names.sort();
    let mut out = Vec::new();
    for n in names {
        let bytes = std::fs::read(dir.join(n)).unwrap();
        let mut pos = 0;
        while let Probe::Valid(h) = probe(&bytes[pos..], 4096) {
            pos += frame_len(h.len as usize);
            out.push(h);
        }
    }
    out
}

/// Goal: a WAL written by format version 1 is committed in the repo and must still replay,
/// byte for byte; its headers carry no synced mark.
#[test]
fn fixture_v1_still_replays() {
    open_fixture(1);
    let hs = headers(&fixture_dir(1));
    assert_eq!(hs.len(), 12);
    assert!(hs.iter().all(|h| h.version == 1 && h.synced_back == 0));
}

/// Goal: a WAL written by format version 2 is committed in the repo and must still replay,
/// byte for byte, with the synced marks its writer stamped: every record vouches for what
/// was synced before it (every third record, and the sealed segment at each roll).
#[test]
fn fixture_v2_still_replays_with_its_synced_marks() {
    open_fixture(2);
    let hs = headers(&fixture_dir(2));
    assert_eq!(hs.len(), 12);
    let mut synced = 0;
    for h in &hs {
        assert_eq!(h.version, 2);
        let mark = h.lsn - u64::from(h.synced_back);
        assert!(
            h.synced_back > 0 && mark >= synced,
            "{h:?} after sync {synced}"
        );
        assert!(
            mark >= (h.lsn - 1) / 3 * 3,
            "{h:?}: the last sync_to is vouched for"
        );
        synced = mark;
    }
}

/// Goal: a WAL written by format version 3 (version 2's header; the version tells readers
/// that the daemon's payloads may hold a record type version 2 did not have) is committed
/// and must still replay byte for byte, with its synced marks.
#[test]
fn fixture_v3_still_replays_with_its_synced_marks() {
    open_fixture(3);
    let hs = headers(&fixture_dir(3));
    assert_eq!(hs.len(), 12);
    assert!(
        hs.iter().all(|h| h.version == 3 && h.synced_back > 0),
        "{hs:?}"
    );
}

/// Goal (issue 13, item 5): after a failed fsync the kernel marks the pages clean, so the
/// cache shows a record the disk never got and no later fsync writes it. A restart must read
/// what the disk holds, not build on that record.
/// Method: record 1 synced; record 2 appended and its sync fails (the log latches); the
/// process dies (the cache survives). The reopened log must end at record 1, and stay so
/// after a power loss.
#[test]
fn a_record_whose_sync_failed_is_not_read_back_from_the_cache() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 16)).unwrap();
    wal.append(1, b"one").unwrap();
    let syncs = disk.sync_count();
    disk.set_faults(SimFaults {
        fail_sync_at: Some(syncs + 1),
        ..SimFaults::default()
    });
    assert!(wal.append(1, b"two").is_err(), "the sync fails");
    drop(wal);
    let disk = disk.crash(CrashMode::Process);
    let wal = open(&disk, opts(1 << 16)).unwrap();
    let got: Vec<Vec<u8>> = all(&wal).into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        got,
        vec![b"one".to_vec()],
        "read back a record the disk never got"
    );
    assert_eq!(wal.next_lsn(), 2);
    drop(wal);
    let wal = open(&disk.crash(CrashMode::PowerDrop), opts(1 << 16)).unwrap();
    assert_eq!(all(&wal).len(), 1);
}

/// Goal: a full disk shows first as a missing spare segment (appends still work, in the
/// segment the spare became), then as `NoSpace` on the roll that has no spare: nothing
/// written, the log not latched, every record kept; once there is room, the spare is made
/// again and appends go on, and everything survives a reopen.
/// Method: room for exactly three segments of 256 bytes (the spare counts).
#[test]
fn a_full_disk_is_a_missing_spare_then_no_space_never_a_latch() {
    let disk = SimStorage::new();
    disk.set_faults(SimFaults {
        space_bytes_max: Some(3 * 256),
        ..SimFaults::default()
    });
    let wal = open(&disk, opts(256)).unwrap();
    assert!(wal.spare_missing().is_none(), "spare made at open");
    let mut lsn = 0;
    let err = loop {
        match wal.append(1, &payload(lsn + 1)) {
            Ok(l) => lsn = l,
            Err(e) => break e,
        }
        assert!(lsn < 1000, "the disk never filled");
    };
    let WalError::NoSpace(why) = &err else {
        panic!("expected NoSpace, got {err}");
    };
    assert_eq!(why.needed_bytes, 256);
    assert!(wal.spare_missing().is_some(), "{err}");
    assert!(!wal.refill_spare().unwrap(), "still no room");
    assert_eq!(wal.next_lsn(), lsn + 1, "nothing was written");
    disk.set_faults(SimFaults::default());
    assert!(wal.refill_spare().unwrap());
    assert!(wal.spare_missing().is_none());
    assert_eq!(wal.append(1, &payload(lsn + 1)).unwrap(), lsn + 1);
    drop(wal);
    let wal = open(&disk, opts(256)).unwrap();
    let got = all(&wal);
    assert_eq!(got.len() as u64, lsn + 1);
    for (l, p) in got {
        assert_eq!(p, payload(l));
    }
}

/// Goal: one record read by its lsn and offset (what a duplicate answer needs) without a
/// segment scan, in any segment; a wrong offset is an error naming what is there, a retired
/// record is `Missing`.
#[test]
fn read_record_finds_one_record_by_lsn_and_offset() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    let mut at = Vec::new();
    for i in 1..=30u64 {
        let (lsn, offset) = wal.append_nowait_at(1, &payload(i)).unwrap();
        assert_eq!(lsn, i);
        at.push((lsn, offset));
    }
    wal.sync_to(30).unwrap();
    for (lsn, offset) in &at {
        let r = wal.read_record(*lsn, *offset).unwrap();
        assert_eq!((r.lsn, r.payload.clone()), (*lsn, payload(*lsn)));
    }
    let (lsn, offset) = at[5];
    assert!(matches!(
        wal.read_record(lsn + 1, offset),
        Err(WalError::Corrupt { .. })
    ));
    assert!(matches!(
        wal.read_record(31, 0),
        Err(WalError::Missing { lsn: 31 })
    ));
    wal.retire_below(20).unwrap();
    assert!(wal.first_lsn() > 1 && wal.first_lsn() <= 20);
    assert!(matches!(
        wal.read_record(1, 0),
        Err(WalError::Missing { lsn: 1 })
    ));
    let (lsn, offset) = at[25];
    assert_eq!(wal.read_record(lsn, offset).unwrap().payload, payload(lsn));
}

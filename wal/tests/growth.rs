//! Segments that grow with use (issue 43): a new log's first segment is small, each next one
//! twice the last up to `segment_bytes`, the spare always the size of the segment after the
//! active one. Checked here: the sizes, a reopen that goes on from them, logs of full-size
//! segments opened with growth and the other way, a record larger than the spare, a full
//! disk, [`Wal::reserve`], an empty segment that must grow, a torn tail, and a power loss at
//! every sync of a growing log.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{all, dir, last_segment, open};

use roost_storage::{CrashMode, SimFaults, SimStorage, SPARE_FILE};
use roost_wal::format::frame_len;
use roost_wal::{Wal, WalError, WalOptions};

const KIB: u64 = 1024;

/// A log whose segments start at `first` bytes and grow to `max`.
fn grow_opts(first: u64, max: u64) -> WalOptions {
    WalOptions {
        segment_bytes: max,
        first_segment_bytes: first,
        payload_bytes_max: 16 << 10,
        ..WalOptions::default()
    }
}

/// About 500 bytes, different for each lsn.
fn payload(i: u64) -> Vec<u8> {
    format!("record-{i:06}-").repeat(36).into_bytes()
}

fn segment_sizes(wal: &Wal) -> Vec<u64> {
    wal.segment_files().into_iter().map(|(_, _, b)| b).collect()
}

fn spare_len(disk: &SimStorage) -> Option<u64> {
    disk.file_bytes(&dir().join(SPARE_FILE))
        .map(|b| b.len() as u64)
}

/// Bytes every file on the simulated disk takes (the spare and segments are allocated over
/// their whole length).
fn used(disk: &SimStorage) -> u64 {
    disk.paths()
        .iter()
        .filter_map(|p| disk.file_bytes(p))
        .map(|b| b.len() as u64)
        .sum()
}

/// No more room on `disk` than it uses now.
fn fill(disk: &SimStorage) {
    disk.set_faults(SimFaults {
        space_bytes_max: Some(used(disk)),
        ..SimFaults::default()
    });
}

/// Appends records from `from` until the log has `segments` segments; returns the next lsn.
fn append_until(wal: &Wal, from: u64, segments: usize) -> u64 {
    let mut i = from;
    while wal.segment_files().len() < segments {
        assert_eq!(wal.append(1, &payload(i)).unwrap(), i);
        i += 1;
        assert!(
            i < from + 10_000,
            "the log never rolled to {segments} segments"
        );
    }
    i
}

/// Goal: 4, 8, 16, 32, 64, 64 KiB segments; the spare is always the size of the segment
/// after the active one; `disk_bytes` counts what the files take; a reopen goes on doubling
/// from the last segment's length and replays everything.
#[test]
fn segments_double_up_to_segment_bytes_and_the_spare_is_the_next_one() {
    let disk = SimStorage::new();
    let o = grow_opts(4 * KIB, 64 * KIB);
    let wal = open(&disk, o.clone()).unwrap();
    assert_eq!(
        spare_len(&disk),
        Some(4 * KIB),
        "a new log's spare: the first segment"
    );
    assert_eq!(wal.disk_bytes(), 4 * KIB);
    let mut next = 1;
    let expect = [4, 8, 16, 32, 64, 64].map(|k| k * KIB);
    for n in 1..=expect.len() {
        next = append_until(&wal, next, n);
        assert_eq!(segment_sizes(&wal), expect[..n], "after {n} rolls");
        let after = (expect[n - 1] * 2).min(64 * KIB);
        assert_eq!(spare_len(&disk), Some(after), "the spare after {n} rolls");
        assert_eq!(wal.disk_bytes(), expect[..n].iter().sum::<u64>() + after);
    }
    drop(wal);
    // Reopened where the segments were 4 and 8 KiB: it goes on at 16.
    let disk = SimStorage::new();
    let wal = open(&disk, o.clone()).unwrap();
    next = append_until(&wal, 1, 2);
    drop(wal);
    let wal = open(&disk, o.clone()).unwrap();
    assert_eq!(spare_len(&disk), Some(16 * KIB), "the spare after a reopen");
    append_until(&wal, next, 3);
    assert_eq!(segment_sizes(&wal), [4 * KIB, 8 * KIB, 16 * KIB]);
    let got = all(&wal);
    assert_eq!(got.len() as u64, wal.next_lsn() - 1);
    for (lsn, p) in got {
        assert_eq!(p, payload(lsn));
    }
}

/// Goal: segment sizes are not part of the format. A log of full-size segments (what every
/// log was before issue 43) opens with growth: every record replays, its spare is kept at its
/// size and new segments stay full size; and a log of growing segments opens with full-size
/// options: every record replays and the small active segment is filled to its own length.
#[test]
fn logs_of_either_segment_sizes_open_with_the_other_options() {
    let full = grow_opts(32 * KIB, 32 * KIB);
    let growing = grow_opts(4 * KIB, 32 * KIB);
    let disk = SimStorage::new();
    let wal = open(&disk, full.clone()).unwrap();
    let next = append_until(&wal, 1, 3);
    drop(wal);
    let wal = open(&disk, growing.clone()).unwrap();
    assert_eq!(all(&wal).len() as u64, next - 1);
    assert_eq!(spare_len(&disk), Some(32 * KIB));
    let next = append_until(&wal, next, 4);
    assert_eq!(segment_sizes(&wal), [32 * KIB; 4]);
    assert_eq!(all(&wal).len() as u64, next - 1);

    let disk = SimStorage::new();
    let wal = open(&disk, growing).unwrap();
    let next = append_until(&wal, 1, 2);
    drop(wal);
    let wal = open(&disk, full).unwrap();
    assert_eq!(all(&wal).len() as u64, next - 1);
    let next = append_until(&wal, next, 3);
    assert_eq!(
        segment_sizes(&wal)[..2],
        [4 * KIB, 8 * KIB],
        "filled, then rolled"
    );
    assert_eq!(all(&wal).len() as u64, next - 1);
}

/// Goal: a record larger than the spare makes a segment of its own and leaves the spare for
/// the next roll. On a full disk such a record is `NoSpace` with nothing written (a leader
/// pauses intake), the spare is still there, and a record it holds rolls into it.
#[test]
fn a_record_larger_than_the_spare_gets_its_own_segment_and_the_spare_stays() {
    let disk = SimStorage::new();
    let wal = open(&disk, grow_opts(4 * KIB, 64 * KIB)).unwrap();
    wal.append(1, &payload(1)).unwrap();
    assert_eq!(spare_len(&disk), Some(8 * KIB));
    let big = vec![7u8; 10_000];
    assert_eq!(wal.append(1, &big).unwrap(), 2);
    assert_eq!(
        segment_sizes(&wal),
        [4 * KIB, 12 * KIB],
        "at least the record, in pages"
    );
    assert_eq!(
        spare_len(&disk),
        Some(24 * KIB),
        "the spare follows the new segment"
    );

    let disk = SimStorage::new();
    let wal = open(&disk, grow_opts(4 * KIB, 64 * KIB)).unwrap();
    wal.append(1, &payload(1)).unwrap();
    fill(&disk);
    match wal.append(1, &vec![7u8; 10_000]) {
        Err(WalError::NoSpace(why)) => assert_eq!(why.needed_bytes, 12 * KIB),
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert_eq!(wal.next_lsn(), 2, "nothing written");
    assert_eq!(spare_len(&disk), Some(8 * KIB), "the spare is kept");
    let lsn = append_until(&wal, 2, 2) - 1;
    assert_eq!(
        segment_sizes(&wal),
        [4 * KIB, 8 * KIB],
        "the spare became the next one"
    );
    assert!(wal.spare_missing().is_some(), "no room for the one after");
    assert_eq!(all(&wal).len() as u64, lsn);
}

/// Goal: after [`Wal::reserve`] the reserved bytes of appends need no room the disk does not
/// have: with the disk full right after it, they all go in (rolling into the grown spare).
/// Without the reservation the same appends meet the full disk. A reservation the disk has
/// no room for is `NoSpace` and leaves the spare missing (intake pauses) until made.
#[test]
fn reserved_appends_never_meet_a_full_disk() {
    let records: Vec<Vec<u8>> = (1..=60).map(payload).collect();
    let bytes: u64 = records.iter().map(|p| frame_len(p.len()) as u64).sum();
    assert!(bytes > 16 * KIB, "more than the spare holds: {bytes}");
    let run = |reserve: bool| {
        let disk = SimStorage::new();
        let wal = open(&disk, grow_opts(4 * KIB, 64 * KIB)).unwrap();
        wal.append(1, b"first").unwrap();
        if reserve {
            wal.reserve(bytes).unwrap();
        }
        fill(&disk);
        let done = records
            .iter()
            .map(|p| wal.append(1, p))
            .take_while(Result::is_ok)
            .count();
        (done, wal)
    };
    let (done, wal) = run(true);
    assert_eq!(done, records.len(), "every reserved append went in");
    assert_eq!(all(&wal).len(), records.len() + 1);
    let (done, _) = run(false);
    assert!(
        done < records.len(),
        "without a reservation the disk fills first"
    );

    let disk = SimStorage::new();
    let wal = open(&disk, grow_opts(4 * KIB, 64 * KIB)).unwrap();
    wal.append(1, b"first").unwrap();
    fill(&disk);
    assert!(matches!(wal.reserve(bytes), Err(WalError::NoSpace(_))));
    assert!(wal.spare_missing().is_some(), "intake would pause");
    disk.set_faults(SimFaults::default());
    assert!(wal.refill_spare().unwrap());
    assert!(
        spare_len(&disk).unwrap() >= bytes,
        "made at the reserved size"
    );
}

/// Goal: an active segment that holds no record and is too small for the next one (a log
/// made by `create_at`) grows in place: the record keeps its lsn, and the log reopens.
#[test]
fn an_empty_segment_grows_in_place_for_a_larger_record() {
    let disk = SimStorage::new();
    let o = grow_opts(4 * KIB, 64 * KIB);
    Wal::create_at(&disk, &dir(), &o, 100).unwrap();
    let wal = open(&disk, o.clone()).unwrap();
    assert_eq!(wal.append(1, &vec![3u8; 10_000]).unwrap(), 100);
    assert_eq!(segment_sizes(&wal), [12 * KIB]);
    assert_eq!(wal.append(1, b"next").unwrap(), 101);
    drop(wal);
    let wal = open(&disk.crash(CrashMode::PowerDrop), o).unwrap();
    let got = all(&wal);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], (100, vec![3u8; 10_000]));
}

/// Goal: a torn tail is cut and the segment preallocated again to its own length, not to
/// `segment_bytes`.
#[test]
fn a_torn_tail_keeps_the_segment_length() {
    let disk = SimStorage::new();
    let o = grow_opts(4 * KIB, 64 * KIB);
    let wal = open(&disk, o.clone()).unwrap();
    for i in 1..=3 {
        wal.append(1, &payload(i)).unwrap();
    }
    drop(wal);
    let seg = last_segment(&disk);
    let mut bytes = disk.file_bytes(&seg).unwrap();
    let end = 3 * frame_len(payload(1).len());
    bytes[end - 10] ^= 0xff;
    disk.put_file_bytes(&seg, bytes);
    let wal = open(&disk, o).unwrap();
    assert_eq!(wal.recovery_report().records, 2, "the torn record is cut");
    assert_eq!(disk.file_bytes(&seg).unwrap().len() as u64, 4 * KIB);
    assert_eq!(segment_sizes(&wal), [4 * KIB]);
}

/// Goal: a power loss frozen at every sync of a log whose segments grow (seals, spares
/// renamed, spares grown and made) keeps every acknowledged record, and recovery opens.
#[test]
fn power_loss_at_every_sync_of_a_growing_log_keeps_acknowledged_records() {
    let o = grow_opts(4 * KIB, 32 * KIB);
    let n = 120u64;
    let total = {
        let disk = SimStorage::new();
        let wal = open(&disk, o.clone()).unwrap();
        for i in 1..=n {
            wal.append(1, &payload(i)).unwrap();
        }
        assert!(wal.segment_files().len() >= 4, "it grows to full size");
        disk.sync_count()
    };
    for freeze in 0..=total {
        for mode in [
            CrashMode::PowerDrop,
            CrashMode::PowerTear { seed: freeze + 7 },
        ] {
            let disk = SimStorage::new();
            disk.set_faults(SimFaults {
                freeze_after_syncs: Some(freeze),
                ..SimFaults::default()
            });
            let wal = open(&disk, o.clone()).unwrap();
            let mut acked = 0;
            for i in 1..=n {
                wal.append(1, &payload(i)).unwrap();
                if disk.sync_count() <= freeze {
                    acked = i;
                }
            }
            drop(wal);
            let wal = open(&disk.crash(mode), o.clone())
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
            // It goes on growing after the crash.
            let next = wal.next_lsn();
            wal.append(1, &payload(next)).unwrap();
        }
    }
}

//! The log's replication primitives through the public API, on the simulated disk: epochs of
//! appends, replicated appends, ranged reads for a follower, and truncation of the log's end
//! (with power losses at every sync of a truncation followed by new appends).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{all, open, opts};

use std::sync::Arc;

use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_wal::format::{probe, Probe};
use roost_wal::WalOptions;
use roost_wal::{Lsn, Record, Wal, WalError};

fn old(lsn: Lsn) -> Vec<u8> {
    format!("old-{lsn}-")
        .repeat((lsn % 5 + 1) as usize)
        .into_bytes()
}

fn new(lsn: Lsn) -> Vec<u8> {
    format!("NEW:{lsn}:")
        .repeat((lsn % 3 + 2) as usize)
        .into_bytes()
}

/// (lsn, epoch, payload) of every record.
fn records(wal: &Wal) -> Vec<(Lsn, u32, Vec<u8>)> {
    wal.replay(1)
        .map(|r| r.map(|r| (r.lsn, r.epoch, r.payload)))
        .collect::<Result<_, _>>()
        .expect("replay")
}

/// Goal: later appends carry the epoch set, it never goes down, and the last record's epoch
/// is tracked by appends and found again by a reopen; a local append below the log's last
/// epoch is refused (a restarted node must set its epoch before appending).
#[test]
fn set_epoch_stamps_later_appends_and_last_record_epoch_survives_reopen() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    assert_eq!((wal.epoch(), wal.last_record_epoch()), (1, 0));
    wal.append(1, b"a").unwrap();
    wal.set_epoch(3).unwrap();
    assert_eq!(wal.last_record_epoch(), 1);
    wal.append(1, b"b").unwrap();
    assert_eq!((wal.epoch(), wal.last_record_epoch()), (3, 3));
    assert!(matches!(wal.set_epoch(2), Err(WalError::Config(_))));
    wal.set_epoch(3).unwrap();
    let got: Vec<u32> = records(&wal).iter().map(|r| r.1).collect();
    assert_eq!(got, vec![1, 3]);
    drop(wal);
    let wal = open(&disk, opts(256)).unwrap();
    assert_eq!(wal.last_record_epoch(), 3);
    assert!(matches!(
        wal.append(1, b"c"),
        Err(WalError::EpochRegress {
            lsn: 3,
            epoch: 1,
            last: 3
        })
    ));
    wal.set_epoch(4).unwrap();
    assert_eq!(wal.append(1, b"c").unwrap(), 3);
}

/// Goal: a follower's copy holds the leader's records with the same lsn, epoch, type and
/// payload, across segment rolls and a reopen, while each header's synced mark is the
/// follower's own; a wrong lsn or a lower epoch is refused with nothing written.
#[test]
fn append_replicated_copies_fields_but_stamps_its_own_synced_mark() {
    let (ld, fd) = (SimStorage::new(), SimStorage::new());
    let leader = open(&ld, opts(256)).unwrap();
    let follower = open(&fd, opts(256)).unwrap();
    for lsn in 1..=30u64 {
        if lsn == 12 {
            leader.set_epoch(2).unwrap();
        }
        leader.append(lsn as u8 % 4, &old(lsn)).unwrap();
    }
    for r in leader.replay(1) {
        let r = r.unwrap();
        let got = follower.append_replicated(r.lsn, r.epoch, r.record_type, &r.payload);
        assert_eq!(got.unwrap(), r.lsn);
        if r.lsn % 10 == 0 {
            follower.sync_to(r.lsn).unwrap();
        }
    }
    follower.sync_to(30).unwrap();
    assert!(matches!(
        follower.append_replicated(30, 2, 1, b"x"),
        Err(WalError::OutOfOrder {
            expected: 31,
            got: 30
        })
    ));
    assert!(matches!(
        follower.append_replicated(31, 1, 1, b"x"),
        Err(WalError::EpochRegress {
            lsn: 31,
            epoch: 1,
            last: 2
        })
    ));
    assert_eq!(follower.next_lsn(), 31);
    assert!(follower.segments().len() > 3, "it rolls");
    drop(follower);
    let follower = open(&fd, opts(256)).unwrap();
    let key = |r: Record| (r.lsn, r.epoch, r.record_type, r.payload);
    let lead: Vec<_> = leader.replay(1).map(|r| key(r.unwrap())).collect();
    let foll: Vec<_> = follower.replay(1).map(|r| key(r.unwrap())).collect();
    assert_eq!(lead, foll);
    assert_eq!(follower.last_record_epoch(), 2);
    // The leader synced every record before the next one (mark 1); the follower synced
    // every ten, so its marks reach further back.
    let marks = |wal: &Wal, disk: &SimStorage| -> Vec<u16> {
        let mut out = Vec::new();
        for (_, path) in wal.segments() {
            let bytes = disk.file_bytes(&path).unwrap();
            for r in wal
                .replay(1)
                .map(Result::unwrap)
                .filter(|r| r.segment == path)
            {
                match probe(&bytes[r.offset as usize..], 4096) {
                    Probe::Valid(h) => out.push(h.synced_back),
                    other => panic!("{other:?}"),
                }
            }
        }
        out
    };
    assert!(marks(&leader, &ld).iter().all(|m| *m == 1));
    assert!(marks(&follower, &fd).iter().any(|m| *m > 1));
}

/// Goal: a follower streaming with increasing `from` gets every record once, in order, at
/// least one per call and no more once `max_bytes` is reached, across segments; reading back
/// (the cursor does not fit) works too; retired or absent lsns are `Missing`.
#[test]
fn read_from_streams_every_record_across_segments() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    for lsn in 1..=60u64 {
        wal.append(1, &old(lsn)).unwrap();
    }
    for max in [0usize, 1, 40, 100, 10_000] {
        let mut from = 1;
        let mut calls = 0;
        while from < 61 {
            let got = wal.read_from(from, 61, max).unwrap();
            assert!(!got.is_empty());
            let before_last: usize = got[..got.len() - 1].iter().map(|r| r.payload.len()).sum();
            assert!(before_last < max.max(1), "stopped once max_bytes reached");
            for (i, r) in got.iter().enumerate() {
                assert_eq!(
                    (r.lsn, &r.payload),
                    (from + i as u64, &old(from + i as u64))
                );
            }
            from += got.len() as u64;
            calls += 1;
        }
        assert!(max < 10_000 || calls == 1, "max {max}: one call reads all");
    }
    let back = wal.read_from(7, 9, usize::MAX).unwrap();
    assert_eq!(back.iter().map(|r| r.lsn).collect::<Vec<_>>(), vec![7, 8]);
    assert!(wal.read_from(5, 5, 10).unwrap().is_empty());
    assert_eq!(
        wal.read_from(60, 100, 10).unwrap().len(),
        1,
        "until past the end"
    );
    assert!(matches!(
        wal.read_from(61, 62, 10),
        Err(WalError::Missing { lsn: 61 })
    ));
    wal.retire_below(30).unwrap();
    let first = wal.first_lsn();
    assert!(first > 1);
    assert!(matches!(
        wal.read_from(first - 1, 61, 10),
        Err(WalError::Missing { .. })
    ));
    assert_eq!(wal.read_from(first, first + 1, 10).unwrap()[0].lsn, first);
}

/// Goal: with the cursor never fitting (reads going backwards), any record of a segment
/// larger than one chunk of the header walk is found, wherever its header falls.
#[test]
fn read_from_finds_any_lsn_when_the_cursor_does_not_fit() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 20)).unwrap();
    for lsn in 1..=6000u64 {
        wal.append_nowait(1, &old(lsn)).unwrap();
    }
    wal.sync_to(6000).unwrap();
    assert_eq!(wal.segments().len(), 1, "one segment of more than a chunk");
    let mut lsn = 6000;
    while lsn > 0 {
        let got = wal.read_from(lsn, lsn + 2, 1).unwrap();
        assert_eq!((got[0].lsn, &got[0].payload), (lsn, &old(lsn)));
        lsn = lsn.saturating_sub(397);
    }
}

/// Goal: a follower reading on from where it stopped starts at the cursor, not at the
/// segment's start: with the headers of the records already read destroyed (in the page
/// cache), reading on still works, while reading back (a walk from the start) reports the
/// damage with its segment, offset and lsn.
#[test]
fn read_from_continues_from_its_cursor_without_walking_the_segment() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 16)).unwrap();
    for lsn in 1..=40u64 {
        wal.append_nowait(1, &old(lsn)).unwrap();
    }
    wal.sync_to(40).unwrap();
    let first = wal.read_from(1, 21, usize::MAX).unwrap();
    assert_eq!(first.len(), 20);
    let seg = first[0].segment.clone();
    let mut bytes = disk.file_bytes(&seg).unwrap();
    for b in &mut bytes[..first[19].offset as usize + 8] {
        *b = 0xAA;
    }
    disk.put_file_bytes(&seg, bytes);
    let next = wal.read_from(21, 41, usize::MAX).unwrap();
    assert_eq!(next.first().map(|r| r.lsn), Some(21));
    assert_eq!(next.len(), 20);
    match wal.read_from(5, 41, usize::MAX) {
        Err(WalError::Corrupt {
            segment,
            offset,
            lsn,
            ..
        }) => assert_eq!((segment, offset, lsn), (seg, 0, 1)),
        other => panic!("expected the walk from the start to fail: {other:?}"),
    }
}

/// Goal: two followers reading on in turn, each from where it stopped, never walk record
/// headers: each continues at its own cursor (issue 42: with one cursor for all, every
/// fetch of the standby behind walked its segment from the start). A fifth reader beyond
/// the bound still reads right, walking from the segment's start.
#[test]
fn two_followers_reading_in_turn_walk_no_headers() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 20)).unwrap();
    for lsn in 1..=400u64 {
        wal.append_nowait(1, &old(lsn)).unwrap();
    }
    wal.sync_to(400).unwrap();
    assert_eq!(wal.segments().len(), 1);
    let (mut a, mut b) = (1u64, 1u64);
    for _ in 0..20 {
        for (from, n) in [(&mut a, 13u64), (&mut b, 7u64)] {
            let got = wal.read_from(*from, *from + n, usize::MAX).unwrap();
            assert_eq!(got.first().map(|r| r.lsn), Some(*from));
            assert_eq!(got.len() as u64, n);
            *from += n;
        }
    }
    assert_eq!((a, b), (261, 141));
    assert_eq!(
        wal.headers_walked(),
        0,
        "each follower continued at its cursor"
    );
    // Four readers near the segment's start, going back (so each needs a cursor of its own),
    // push the two followers' cursors out: the read at `b` then walks from the nearest one
    // left (at 5).
    for from in (1..=4u64).rev() {
        wal.read_from(from, from + 1, usize::MAX).unwrap();
    }
    let walked = wal.headers_walked();
    assert_eq!(
        walked,
        1 + 2 + 3,
        "readers at 2, 3 and 4 walked from the start"
    );
    let got = wal.read_from(b, b + 1, usize::MAX).unwrap();
    assert_eq!((got[0].lsn, &got[0].payload), (b, &old(b)));
    assert_eq!(
        wal.headers_walked() - walked,
        b - 5,
        "b's cursor was dropped"
    );
}

/// Goal: two followers in step (both caught up, as two standbys in sync under
/// `ack = "standby"` are) each continue at a cursor of their own although both stopped at the
/// same place: with one cursor kept per place, the second walked from an older one, reading a
/// large chunk of the segment for a few headers on every fetch (issue 42: 12 % of a loaded
/// leader's samples were that copy).
#[test]
fn two_followers_in_step_walk_no_headers() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 20)).unwrap();
    let mut end = 1u64;
    for _ in 0..30 {
        for _ in 0..3 {
            wal.append_nowait(1, &old(end)).unwrap();
            end += 1;
        }
        wal.sync_to(end - 1).unwrap();
        for _ in 0..2 {
            let from = end - 3;
            let got = wal.read_from(from, end, usize::MAX).unwrap();
            assert_eq!(
                got.first().map(|r| (r.lsn, &r.payload)),
                Some((from, &old(from)))
            );
            assert_eq!(got.len(), 3);
        }
    }
    assert_eq!(
        wal.headers_walked(),
        0,
        "each follower continued at a cursor of its own"
    );
}

/// Goal: a reader keeps up with a writer: every record below the synced lsn can be read
/// while appends go on after it in the same segment.
#[test]
fn read_from_while_appending() {
    let disk = SimStorage::new();
    let wal = Arc::new(open(&disk, opts(4096)).unwrap());
    let writer = {
        let wal = wal.clone();
        std::thread::spawn(move || {
            for lsn in 1..=300u64 {
                wal.append(1, &old(lsn)).unwrap();
            }
        })
    };
    let mut from = 1;
    while from <= 300 {
        let end = wal.synced_lsn() + 1;
        if from < end {
            for r in wal.read_from(from, end, 200).unwrap() {
                assert_eq!((r.lsn, r.payload), (from, old(from)));
                from += 1;
            }
        }
    }
    writer.join().unwrap();
}

/// Builds a log of `n` records (epoch 1 up to `lsn` 9, then 2), every one synced.
fn log_of(disk: &SimStorage, n: u64) -> Wal {
    let wal = open(disk, opts(256)).unwrap();
    for lsn in 1..=n {
        if lsn == 10 {
            wal.set_epoch(2).unwrap();
        }
        wal.append(1, &old(lsn)).unwrap();
    }
    wal
}

/// Goal: after `truncate_from` the log is exactly what a fresh open of it finds (next lsn,
/// records, last epoch), and the next append writes at the cut lsn: for a cut inside the
/// newest segment, at a segment's first record, in an older segment, at the first record,
/// and at the end (a no-op); a cut beyond the end or below the first lsn is `Missing`.
#[test]
fn truncate_from_matches_a_fresh_open() {
    let probe_disk = SimStorage::new();
    let segs: Vec<Lsn> = log_of(&probe_disk, 30)
        .segments()
        .iter()
        .map(|s| s.0)
        .collect();
    assert!(segs.len() > 4);
    let cuts = [29, segs[segs.len() - 1], segs[2] + 1, segs[1], 10, 9, 1, 31];
    for cut in cuts {
        let disk = SimStorage::new();
        let wal = log_of(&disk, 30);
        assert_eq!(wal.truncate_from(cut).unwrap(), 31 - cut, "cut {cut}");
        assert_eq!(wal.next_lsn(), cut);
        assert!(wal.synced_lsn() < cut);
        assert!(
            matches!(wal.sync_to(cut), Err(WalError::Missing { .. })),
            "cut away"
        );
        let want_epoch = match cut {
            1 => 0,
            2..=10 => 1,
            _ => 2,
        };
        assert_eq!(wal.last_record_epoch(), want_epoch, "cut {cut}");
        let kept = records(&wal);
        assert_eq!(kept.len() as u64, cut - 1);
        assert!(matches!(
            wal.truncate_from(cut + 1),
            Err(WalError::Missing { .. })
        ));
        let reopened = open(&disk.crash(CrashMode::PowerDrop), opts(256)).unwrap();
        assert_eq!(
            reopened.next_lsn(),
            cut,
            "cut {cut}: durable before it returned"
        );
        assert_eq!(records(&reopened), kept);
        assert_eq!(reopened.last_record_epoch(), want_epoch);
        drop(reopened);
        wal.set_epoch(3).unwrap();
        for lsn in cut..cut + 12 {
            assert_eq!(wal.append_replicated(lsn, 3, 2, &new(lsn)).unwrap(), lsn);
        }
        wal.sync_to(cut + 11).unwrap();
        let in_memory = (wal.next_lsn(), records(&wal), wal.last_record_epoch());
        drop(wal);
        let wal = open(&disk.crash(CrashMode::PowerDrop), opts(256)).unwrap();
        assert_eq!(
            (wal.next_lsn(), records(&wal), wal.last_record_epoch()),
            in_memory
        );
    }
    let wal = log_of(&SimStorage::new(), 30);
    wal.retire_below(20).unwrap();
    let first = wal.first_lsn();
    assert!(matches!(
        wal.truncate_from(first - 1),
        Err(WalError::Missing { .. })
    ));
    assert_eq!(wal.truncate_from(first).unwrap(), 31 - first);
    assert_eq!(
        wal.last_record_epoch(),
        0,
        "nothing left, as a reopen would say"
    );
}

/// Goal: records appended after a cut vouch (synced mark) only for lsns this log synced
/// below the cut, never for the new records at lsns the old ones had synced: a mark that
/// reached them would turn a hole among the new, unsynced records into "corruption".
#[test]
fn records_after_a_cut_vouch_only_for_what_was_synced_below_it() {
    let disk = SimStorage::new();
    let wal = log_of(&disk, 30);
    assert_eq!(wal.synced_lsn(), 30);
    let cut = wal.segments().last().unwrap().0;
    wal.truncate_from(cut).unwrap();
    assert_eq!(wal.synced_lsn(), cut - 1);
    for lsn in cut..cut + 6 {
        wal.append_replicated(lsn, 3, 1, &[lsn as u8]).unwrap();
    }
    // Only the cut segment: a roll syncs the segment it seals, and later records may then
    // vouch for the new records in it.
    let path = wal.replay(cut).next().unwrap().unwrap().segment;
    let bytes = disk.file_bytes(&path).unwrap();
    let mut seen = 0;
    for r in wal.replay(cut).map(Result::unwrap) {
        let bytes = if r.segment == path { &bytes } else { continue };
        seen += 1;
        match probe(&bytes[r.offset as usize..], 4096) {
            Probe::Valid(h) => {
                assert!(!h.vouches_for(cut), "record {} vouches for {cut}", h.lsn);
                assert!(h.vouches_for(cut - 1));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, 6, "the cut segment holds the new records");
}

/// What a truncation crash test checks on the reopened log: no corruption, the kept prefix
/// intact, then either only old records or only new ones (never an old one after a new one),
/// and every record acknowledged before the power went.
fn check_after_crash(got: &[(Lsn, u32, Vec<u8>)], cut: Lsn, old_acked: Lsn, new_acked: Lsn) {
    for (i, (lsn, _, _)) in got.iter().enumerate() {
        assert_eq!(*lsn, i as u64 + 1);
    }
    let tail = &got[(cut - 1).min(got.len() as u64) as usize..];
    let all_old = tail.iter().all(|(l, e, p)| *p == old(*l) && *e <= 2);
    let all_new = tail.iter().all(|(l, e, p)| *p == new(*l) && *e == 3);
    assert!(all_old || all_new, "mixed tail after cut {cut}: {tail:?}");
    for (l, _, p) in &got[..(cut - 1).min(got.len() as u64) as usize] {
        assert_eq!(p, &old(*l));
    }
    let last = got.last().map_or(0, |r| r.0);
    assert!(
        last >= old_acked.min(cut - 1),
        "lost acknowledged old records"
    );
    assert!(
        last >= new_acked,
        "lost acknowledged new records: {last} < {new_acked}"
    );
    if new_acked >= cut {
        assert!(all_new);
    }
}

/// Goal: a power loss at any sync of "truncate, append new records at the same lsns, sync"
/// (both power-loss modes of the simulated disk, each followed by a restart and a second
/// power loss; the last old records unsynced at the cut)
/// reopens to the old records or to the cut log followed by a prefix of the new ones: never
/// corruption, never an old record after a new one, never a stale record vouching for a
/// position a new one holds; acknowledged records are kept.
#[test]
fn power_loss_at_every_sync_of_truncate_then_append() {
    let probe_disk = SimStorage::new();
    let segs: Vec<Lsn> = log_of(&probe_disk, 30)
        .segments()
        .iter()
        .map(|s| s.0)
        .collect();
    for cut in [28, segs[segs.len() - 1], segs[2] + 1, segs[1], 1] {
        let run = |freeze: Option<u64>| {
            let disk = SimStorage::new();
            let wal = log_of(&disk, 30);
            for lsn in 31..=33 {
                wal.append_replicated(lsn, 2, 1, &old(lsn)).unwrap(); // never synced
            }
            let start = disk.sync_count();
            disk.set_faults(SimFaults {
                freeze_after_syncs: freeze.map(|f| start + f),
                ..SimFaults::default()
            });
            let mut new_acked = 0;
            wal.truncate_from(cut).unwrap();
            for lsn in cut..cut + 8 {
                wal.append_replicated(lsn, 3, 1, &new(lsn)).unwrap();
                if lsn % 3 == 0 || lsn == cut + 7 {
                    wal.sync_to(lsn).unwrap();
                    if freeze.is_none_or(|f| disk.sync_count() <= start + f) {
                        new_acked = lsn;
                    }
                }
            }
            drop(wal);
            let syncs = disk.sync_count() - start;
            (disk, syncs, new_acked)
        };
        let (_, total, _) = run(None);
        for freeze in 0..=total {
            let (disk, _, new_acked) = run(Some(freeze));
            // Not `CrashMode::Process`: a frozen disk means the power went, and a process
            // crash keeps writes made after that which no sync can make durable any more.
            for mode in [
                CrashMode::PowerDrop,
                CrashMode::PowerTear {
                    seed: freeze * 7 + cut,
                },
                CrashMode::PowerTear {
                    seed: freeze * 13 + cut + 1,
                },
            ] {
                let restarted = disk.crash(mode);
                let wal = open(&restarted, opts(256))
                    .unwrap_or_else(|e| panic!("cut {cut} freeze {freeze} {mode:?}: {e}"));
                let mut got = records(&wal);
                check_after_crash(&got, cut, 30, new_acked);
                assert_eq!(wal.last_record_epoch(), got.last().map_or(0, |r| r.1));
                let next = wal.next_lsn();
                wal.set_epoch(4).unwrap();
                assert_eq!(wal.append(1, b"after").unwrap(), next);
                drop(wal);
                // Then a power loss: what the restart accepted, and the record acknowledged
                // after it, stay.
                let wal = open(&restarted.crash(CrashMode::PowerDrop), opts(256)).unwrap();
                got.push((next, 4, b"after".to_vec()));
                assert_eq!(records(&wal), got, "cut {cut} freeze {freeze} {mode:?}");
            }
        }
        let (_, _, acked) = run(None);
        assert_eq!(acked, cut + 7);
    }
}

/// Goal: `all` (the shared helper) agrees with `read_from` over a whole log.
#[test]
fn read_from_agrees_with_replay() {
    let disk = SimStorage::new();
    let wal = log_of(&disk, 30);
    let a: Vec<(Lsn, Vec<u8>)> = wal
        .read_from(1, 31, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|r| (r.lsn, r.payload))
        .collect();
    assert_eq!(a, all(&wal));
}

/// Goal: the same truncation on a real directory: the cut, the appends after it and a reopen
/// agree (ftruncate and fallocate on a real file system).
#[test]
fn truncate_from_on_real_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let o = WalOptions {
        segment_bytes: 4096,
        payload_bytes_max: 1024,
        ..WalOptions::default()
    };
    let wal = Wal::open(tmp.path(), o.clone()).unwrap();
    for lsn in 1..=400u64 {
        wal.append_nowait(1, &old(lsn)).unwrap();
    }
    wal.sync_to(400).unwrap();
    assert!(wal.segments().len() > 3);
    let cut = wal.segments()[1].0 + 2;
    assert_eq!(wal.truncate_from(cut).unwrap(), 401 - cut);
    wal.set_epoch(2).unwrap();
    for lsn in cut..cut + 50 {
        wal.append_replicated(lsn, 2, 1, &new(lsn)).unwrap();
    }
    wal.sync_to(cut + 49).unwrap();
    let before = (wal.next_lsn(), records(&wal), wal.last_record_epoch());
    drop(wal);
    let wal = Wal::open(tmp.path(), o).unwrap();
    assert_eq!(
        (wal.next_lsn(), records(&wal), wal.last_record_epoch()),
        before
    );
    let got = records(&wal);
    assert!(got
        .iter()
        .all(|(l, _, p)| *p == if *l < cut { old(*l) } else { new(*l) }));
}

/// Copies the first `len` bytes of every file `extent` names into `to` (zeros after, the
/// file as large as the original), as a base backup does.
fn copy_extent(
    disk: &SimStorage,
    extent: &[(std::path::PathBuf, Option<u64>)],
    to: &std::path::Path,
) {
    use roost_storage::{OpenMode, Storage};
    disk.create_dir_all(to).unwrap();
    for (path, len) in extent.iter().cloned() {
        let src = disk.open(&path, OpenMode::Read).unwrap();
        let size = src.len().unwrap();
        let mut buf = vec![0u8; len.unwrap_or(size) as usize];
        src.read_at(&mut buf, 0).unwrap();
        let dst = disk
            .open(&to.join(path.file_name().unwrap()), OpenMode::CreateNew)
            .unwrap();
        dst.allocate(size).unwrap();
        dst.write_at(&buf, 0).unwrap();
        dst.sync_data().unwrap();
    }
    disk.sync_dir(to).unwrap();
}

/// Goal: `extent` names the bytes of the records appended before it was taken, synced or
/// not. A copy of them made after more appends landed (as a base backup copies while the
/// daemon runs) opens as exactly those records; and `create_at` makes an empty log whose
/// first append takes the given lsn.
#[test]
fn extent_copies_open_as_the_records_before_them_and_create_at_starts_at_its_lsn() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    for i in 0..9u64 {
        wal.append_nowait(1, &old(i + 1)).unwrap();
    }
    wal.sync_to(5).unwrap();
    let extent = wal.extent();
    assert!(extent.len() > 1, "the records span segments: {extent:?}");
    assert!(
        extent.last().unwrap().1.is_some_and(|l| l < 256),
        "the active segment is copied in part"
    );
    assert!(extent[0].1.is_none(), "a sealed segment is copied whole");
    for i in 10..13u64 {
        wal.append_nowait(1, &old(i)).unwrap();
    }
    let to = std::path::PathBuf::from("/sim/copy");
    copy_extent(&disk, &extent, &to);
    let copy = Wal::open_with(Arc::new(disk.clone()), &to, opts(256)).unwrap();
    let got: Vec<(Lsn, Vec<u8>)> = records(&copy).into_iter().map(|r| (r.0, r.2)).collect();
    let want: Vec<(Lsn, Vec<u8>)> = (1..=9).map(|l| (l, old(l))).collect();
    assert_eq!(got, want);

    let fresh = std::path::PathBuf::from("/sim/fresh");
    Wal::create_at(&disk, &fresh, &opts(256), 40).unwrap();
    let w = Wal::open_with(Arc::new(disk.clone()), &fresh, opts(256)).unwrap();
    assert_eq!(
        (w.first_lsn(), w.next_lsn(), w.last_record_epoch()),
        (40, 40, 0)
    );
    assert_eq!(w.append(1, b"x").unwrap(), 40);
    drop(w);
    let w = Wal::open_with(Arc::new(disk.clone()), &fresh, opts(256)).unwrap();
    assert_eq!(w.next_lsn(), 41);
    assert!(
        Wal::create_at(&disk, &fresh, &opts(256), 50).is_err(),
        "not over a log"
    );
}

/// Goal (issue 42): the hook set by `on_synced` hears every move of the synced lsn — a
/// group commit, a roll (which syncs the sealed segment), a truncation (which lowers it) —
/// with the value `synced_lsn()` then reads; a second hook is refused.
#[test]
fn the_synced_hook_hears_every_move_of_the_synced_lsn() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    let heard = Arc::new(std::sync::Mutex::new(Vec::<Lsn>::new()));
    let sink = Arc::clone(&heard);
    let hook: roost_wal::SyncedHook = Arc::new(move |lsn| sink.lock().unwrap().push(lsn));
    assert!(wal.on_synced(hook));
    assert!(!wal.on_synced(Arc::new(|_| {})), "one hook per log");
    let last_heard = || *heard.lock().unwrap().last().expect("a call");
    let lsn = wal.append(1, b"a").unwrap();
    assert_eq!((last_heard(), wal.synced_lsn()), (lsn, lsn));
    // Appends without a sync until the segment rolls: the roll syncs what it seals.
    let before = heard.lock().unwrap().len();
    let segments = wal.segments().len();
    while wal.segments().len() == segments {
        wal.append_nowait(1, &old(7)).unwrap();
    }
    assert!(
        heard.lock().unwrap().len() > before,
        "the roll's sync was heard"
    );
    assert_eq!(last_heard(), wal.synced_lsn());
    let end = wal.next_lsn() - 1;
    wal.sync_to(end).unwrap();
    assert_eq!(last_heard(), end);
    wal.truncate_from(lsn + 1).unwrap();
    assert_eq!((last_heard(), wal.synced_lsn()), (lsn, lsn));
}

/// Goal: a follower that goes on from where it stopped reads its next records with one call
/// to the disk, however many there are (issue 42: each record took two reads, its header then
/// its frame, after a lookup of the segment's length: six calls per batch on a leader with two
/// standbys). A record larger than one read, or one that does not verify, is still read on
/// its own, with the error naming it.
#[test]
fn a_follower_reads_its_next_records_in_one_call() {
    let disk = SimStorage::new();
    let o = WalOptions {
        payload_bytes_max: 256 << 10,
        ..opts(1 << 20)
    };
    let wal = open(&disk, o).unwrap();
    for lsn in 1..=60u64 {
        wal.append_nowait(1, &old(lsn)).unwrap();
    }
    wal.sync_to(60).unwrap();
    wal.read_from(1, 2, usize::MAX).unwrap();
    let mut from = 2u64;
    for n in [1u64, 5, 20, 30] {
        let r0 = disk.read_count();
        let got = wal.read_from(from, from + n, usize::MAX).unwrap();
        let want: Vec<(Lsn, Vec<u8>)> = (from..from + n).map(|l| (l, old(l))).collect();
        let have: Vec<(Lsn, Vec<u8>)> = got.into_iter().map(|r| (r.lsn, r.payload)).collect();
        assert_eq!(have, want);
        assert_eq!(
            disk.read_count() - r0,
            1,
            "calls to read {n} records from lsn {from}"
        );
        from += n;
    }
    // Appended since: the active segment's new records, then one over a whole read.
    let big = vec![7u8; 100 << 10];
    wal.append_nowait(1, &old(61)).unwrap();
    wal.append_nowait(1, &big).unwrap();
    wal.sync_to(62).unwrap();
    assert_eq!(from, 58);
    let r0 = disk.read_count();
    let got = wal.read_from(from, 63, usize::MAX).unwrap();
    let have: Vec<(Lsn, usize)> = got.iter().map(|r| (r.lsn, r.payload.len())).collect();
    let want: Vec<(Lsn, usize)> = (58..=61u64).map(|l| (l, old(l).len())).collect();
    assert_eq!(&have[..4], &want[..]);
    assert_eq!(have[4], (62, big.len()));
    assert_eq!(got[4].payload, big);
    // One read for the run, then the large record's header and frame.
    assert_eq!(
        disk.read_count() - r0,
        3,
        "calls to read four records and a large one"
    );
    // A frame that does not verify in the window is read on its own, and named.
    for lsn in 63..=64u64 {
        wal.append_nowait(1, &old(lsn)).unwrap();
    }
    wal.sync_to(64).unwrap();
    let seg = got[0].segment.clone();
    let at = wal.read_from(63, 64, usize::MAX).unwrap()[0].offset;
    let mut bytes = disk.file_bytes(&seg).unwrap();
    let next = at as usize + roost_wal::format::frame_len(old(63).len());
    bytes[next + roost_wal::format::RECORD_HEADER_LEN] ^= 0xFF;
    disk.put_file_bytes(&seg, bytes);
    match wal.read_from(64, 65, usize::MAX) {
        Err(WalError::Corrupt {
            segment,
            offset,
            lsn,
            ..
        }) => assert_eq!((segment, offset, lsn), (seg, next as u64, 64)),
        other => panic!("expected the damaged record to be named: {other:?}"),
    }
}

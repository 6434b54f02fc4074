//! The leader-epoch file (`LeaderEpochs`) through its public API on the simulated disk: its
//! bytes round trip, a damaged or missing file is rebuilt from the WAL, open reconciles it
//! with the WAL, `end_offset_for` answers as Kafka's `endOffsetFor`, and a power loss at any
//! sync of an `assign` leaves the old list or the new one.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{open, opts};

use std::path::PathBuf;
use std::sync::Arc;

use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_wal::epochs::{decode, encode};
use roost_wal::{LeaderEpochs, Lsn, Wal, WalError};

fn path() -> PathBuf {
    PathBuf::from("/sim/leader-epochs")
}

fn epochs(disk: &SimStorage, wal: &Wal) -> LeaderEpochs {
    LeaderEpochs::open(Arc::new(disk.clone()), path(), wal).expect("open leader epochs")
}

/// A log whose records have epoch 1 for lsns 1..=9, 2 for 10..=19 and 5 from 20 to `n`.
fn log_of(disk: &SimStorage, n: Lsn) -> Wal {
    let wal = open(disk, opts(256)).unwrap();
    for lsn in 1..=n {
        match lsn {
            10 => wal.set_epoch(2).unwrap(),
            20 => wal.set_epoch(5).unwrap(),
            _ => {}
        }
        wal.append(1, format!("r{lsn}").as_bytes()).unwrap();
    }
    wal
}

/// Goal: a missing file is built from the WAL and written; what `assign` and
/// `truncate_from_end` persist is what the next open reads; the rules of `assign` (same
/// epoch a no-op, never backwards, a start equal to the latest's replaces it).
#[test]
fn leader_epochs_round_trip_through_the_file() {
    let disk = SimStorage::new();
    let wal = log_of(&disk, 25);
    let mut le = epochs(&disk, &wal);
    assert_eq!(le.entries(), &[(1, 1), (2, 10), (5, 20)]);
    assert_eq!(
        decode(&disk.file_bytes(&path()).unwrap()).unwrap(),
        le.entries()
    );
    le.assign(5, 30).unwrap();
    assert_eq!(le.latest(), Some((5, 20)), "the latest epoch again: no-op");
    assert!(matches!(le.assign(4, 30), Err(WalError::Config(_))));
    assert!(matches!(le.assign(6, 19), Err(WalError::Config(_))));
    le.assign(6, 26).unwrap();
    le.assign(7, 26).unwrap();
    assert_eq!(le.entries(), &[(1, 1), (2, 10), (5, 20), (7, 26)]);
    wal.set_epoch(7).unwrap();
    wal.append(1, b"r26").unwrap();
    drop(le);
    let mut le = epochs(&disk, &wal);
    assert_eq!(le.entries(), &[(1, 1), (2, 10), (5, 20), (7, 26)]);
    le.truncate_from_end(15).unwrap();
    assert_eq!(le.entries(), &[(1, 1), (2, 10)]);
    assert_eq!(
        decode(&disk.file_bytes(&path()).unwrap()).unwrap(),
        vec![(1, 1), (2, 10)]
    );
    le.truncate_from_end(100).unwrap();
    assert_eq!(le.entries(), &[(1, 1), (2, 10)]);
}

/// Goal: a file that fails its checksum, has an unknown version, is cut short, or holds
/// entries out of order is rebuilt from the WAL (and written again), never trusted.
#[test]
fn damaged_leader_epochs_file_is_rebuilt_from_the_wal() {
    let good = encode(&[(1, 1), (2, 10), (5, 20)]);
    let mut bad_version = encode(&[(1, 1)]);
    bad_version[0] = 9;
    let mut flipped = good.clone();
    flipped[7] ^= 1;
    let out_of_order = {
        let mut b = encode(&[(1, 1), (2, 10)]);
        b[5..17].copy_from_slice(&[2, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0]);
        let n = b.len() - 4;
        let crc = crc32(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
        b
    };
    for damaged in [
        flipped,
        bad_version,
        good[..good.len() - 1].to_vec(),
        vec![],
        out_of_order,
    ] {
        assert!(decode(&damaged).is_err());
        let disk = SimStorage::new();
        let wal = log_of(&disk, 25);
        disk.put_file_bytes(&path(), damaged);
        let le = epochs(&disk, &wal);
        assert_eq!(le.entries(), &[(1, 1), (2, 10), (5, 20)]);
        assert_eq!(disk.file_bytes(&path()).unwrap(), good);
    }
}

fn crc32(b: &[u8]) -> u32 {
    // The file's CRC is the IEEE CRC-32; recompute it bitwise, independently of the code.
    let mut crc = !0u32;
    for byte in b {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Goal: open reconciles the file with the WAL: entries at or past the log's end go (a
/// truncated log); a WAL whose last record is of a newer epoch than the file knows is
/// caught up from the records (a crash between an append and the file's write), keeping
/// the start of an epoch whose first records were retired; an entry no record confirms
/// goes; entries below the first lsn stay.
#[test]
fn leader_epochs_open_reconciles_with_the_wal() {
    let disk = SimStorage::new();
    let wal = log_of(&disk, 25);
    disk.put_file_bytes(&path(), encode(&[(1, 1), (2, 10), (5, 20), (6, 26)]));
    assert_eq!(epochs(&disk, &wal).entries(), &[(1, 1), (2, 10), (5, 20)]);
    assert_eq!(
        decode(&disk.file_bytes(&path()).unwrap()).unwrap(),
        vec![(1, 1), (2, 10), (5, 20)],
        "persisted"
    );
    disk.put_file_bytes(&path(), encode(&[(1, 1)]));
    assert_eq!(epochs(&disk, &wal).entries(), &[(1, 1), (2, 10), (5, 20)]);
    // An epoch below the log's end that no record has (the last record is of epoch 5).
    disk.put_file_bytes(&path(), encode(&[(1, 1), (2, 10), (5, 20), (9, 24)]));
    assert_eq!(epochs(&disk, &wal).entries(), &[(1, 1), (2, 10), (5, 20)]);
    // Retire below lsn 22: the file keeps its older entries; a newer epoch after them is
    // caught up without losing where epoch 5 began (lsn 20, now retired).
    assert!(wal.retire_below(22).unwrap() > 0);
    let first = wal.first_lsn();
    assert!(first > 10 && first <= 22, "{first}");
    assert_eq!(epochs(&disk, &wal).entries(), &[(1, 1), (2, 10), (5, 20)]);
    wal.set_epoch(8).unwrap();
    wal.append(1, b"r26").unwrap();
    assert_eq!(
        epochs(&disk, &wal).entries(),
        &[(1, 1), (2, 10), (5, 20), (8, 26)]
    );
    // No file and a retired head: built from what the WAL still holds.
    let disk2 = SimStorage::new();
    let wal2 = log_of(&disk2, 25);
    wal2.retire_below(22).unwrap();
    let first2 = wal2.first_lsn();
    let want: Vec<(u32, Lsn)> = if first2 < 20 {
        vec![(2, first2), (5, 20)]
    } else {
        vec![(5, first2)]
    };
    assert_eq!(epochs(&disk2, &wal2).entries(), want.as_slice());
}

/// Goal: `end_offset_for` is Kafka's `endOffsetFor`: the largest epoch held at or below the
/// one asked, ending where the next held epoch starts, or at the log's end for the latest;
/// nothing when every held epoch is above the one asked.
#[test]
fn end_offset_for_answers_like_kafka() {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(256)).unwrap();
    let mut le = epochs(&disk, &wal);
    assert_eq!(le.end_offset_for(3, 1), None, "empty");
    le.assign(2, 5).unwrap();
    le.assign(4, 20).unwrap();
    le.assign(7, 40).unwrap();
    let table: [(u32, Option<(u32, Lsn)>); 9] = [
        (0, None),
        (1, None),
        (2, Some((2, 20))),
        (3, Some((2, 20))),
        (4, Some((4, 40))),
        (5, Some((4, 40))),
        (6, Some((4, 40))),
        (7, Some((7, 55))),
        (9, Some((7, 55))),
    ];
    for (asked, want) in table {
        assert_eq!(le.end_offset_for(asked, 55), want, "epoch {asked}");
    }
}

/// Goal: a power loss (dropped or torn) at any sync of an `assign` leaves
/// a file that decodes to the old list or the new one, never damage or a mix.
#[test]
fn power_loss_at_every_sync_of_assign_keeps_old_or_new() {
    let run = |freeze: Option<u64>| {
        let disk = SimStorage::new();
        let wal = log_of(&disk, 25);
        let mut le = epochs(&disk, &wal);
        let start = disk.sync_count();
        disk.set_faults(SimFaults {
            freeze_after_syncs: freeze.map(|f| start + f),
            ..SimFaults::default()
        });
        le.assign(6, 26).unwrap();
        let syncs = disk.sync_count() - start;
        (disk, syncs)
    };
    let old = vec![(1, 1), (2, 10), (5, 20)];
    let new = vec![(1, 1), (2, 10), (5, 20), (6, 26)];
    let (_, total) = run(None);
    assert!(total >= 2, "the file and its directory");
    let mut seen = (false, false);
    for freeze in 0..=total {
        let (disk, _) = run(Some(freeze));
        for mode in [
            CrashMode::PowerDrop,
            CrashMode::PowerTear { seed: freeze + 3 },
            CrashMode::PowerTear { seed: freeze * 11 },
        ] {
            let bytes = disk.crash(mode).file_bytes(&path());
            let got = decode(&bytes.unwrap_or_default())
                .unwrap_or_else(|why| panic!("freeze {freeze} {mode:?}: {why}"));
            assert!(
                got == old || got == new,
                "freeze {freeze} {mode:?}: {got:?}"
            );
            seen.0 |= got == old;
            seen.1 |= got == new;
        }
    }
    assert!(seen.0 && seen.1, "both outcomes occur: {seen:?}");
}

/// Goal: the same file on a real directory: built at open, replaced by `assign`, read back
/// by the next open, no temporary left behind.
#[test]
fn leader_epochs_on_real_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let storage: Arc<dyn roost_storage::Storage> = roost_storage::RealStorage::shared();
    let wal = Wal::open(tmp.path().join("wal"), opts(4096)).unwrap();
    wal.append(1, b"a").unwrap();
    let file = tmp.path().join("leader-epochs");
    let mut le = LeaderEpochs::open(storage.clone(), file.clone(), &wal).unwrap();
    assert_eq!(le.entries(), &[(1, 1)]);
    le.assign(3, 2).unwrap();
    wal.set_epoch(3).unwrap();
    wal.append(1, b"b").unwrap();
    drop(le);
    let le = LeaderEpochs::open(storage, file.clone(), &wal).unwrap();
    assert_eq!(le.entries(), &[(1, 1), (3, 2)]);
    assert_eq!(
        decode(&std::fs::read(&file).unwrap()).unwrap(),
        vec![(1, 1), (3, 2)]
    );
    assert!(!tmp.path().join("leader-epochs.tmp").exists());
}

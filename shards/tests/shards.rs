//! Black-box tests of a shard through its public API, on the simulated disk (power loss,
//! torn frames, ENOSPC) and on real temporary directories (mmap, locking).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{opts, sim_dir};
use std::collections::BTreeMap;
use std::sync::Arc;

use roost_shards::frame::encoded_len;
use roost_shards::{Applied, Shard, ShardError, ShardOptions, Txn, TxnOp};
use roost_storage::{CrashMode, SimFaults, SimStorage};

fn open_sim(disk: &SimStorage, segment_bytes: u64) -> Result<Shard, ShardError> {
    Shard::open_with(Arc::new(disk.clone()), sim_dir(), opts(segment_bytes))
}

fn rec(id: u64) -> Vec<u8> {
    format!("{{\"name\":\"user-{id}\"}}").into_bytes()
}

fn create_txn(lsn: u64, ids: &[u64]) -> Txn {
    Txn {
        lsn,
        ops: ids
            .iter()
            .map(|id| TxnOp::Create {
                id: *id,
                record: rec(*id),
            })
            .collect(),
    }
}

fn contents(s: &Shard) -> Vec<u64> {
    s.scan()
        .unwrap()
        .into_iter()
        .map(|(id, r)| {
            assert_eq!(r, rec(id));
            id
        })
        .collect()
}

/// Goal: NoPartialShard on the real format. The last frame (a 3-op transaction) is cut at
/// every byte offset, with the rest zero as a crash leaves preallocated space; every reopen
/// shows either none of its ops or all of them, and the earlier frames intact.
#[test]
fn torn_frame_at_every_byte_offset_is_all_or_nothing() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 1 << 14).unwrap();
    s.apply(&create_txn(1, &[1, 2])).unwrap();
    s.apply(&Txn {
        lsn: 2,
        ops: vec![
            TxnOp::Delete { id: 1 },
            TxnOp::Create {
                id: 3,
                record: rec(3),
            },
        ],
    })
    .unwrap();
    let before_last = s.scan().unwrap();
    s.apply(&Txn {
        lsn: 3,
        ops: vec![
            TxnOp::Create {
                id: 4,
                record: rec(4),
            },
            TxnOp::Delete { id: 2 },
            TxnOp::Create {
                id: 5,
                record: rec(5),
            },
        ],
    })
    .unwrap();
    s.flush().unwrap();
    let after_last = s.scan().unwrap();
    drop(s);
    let seg = sim_dir().join("0000000001.seg");
    let orig = disk.file_bytes(&seg).unwrap();
    let end = orig.iter().rposition(|b| *b != 0).unwrap() + 1;
    let t1 = create_txn(1, &[1, 2]);
    let t2 = Txn {
        lsn: 2,
        ops: vec![
            TxnOp::Delete { id: 1 },
            TxnOp::Create {
                id: 3,
                record: rec(3),
            },
        ],
    };
    let last_start = encoded_len(&t1) + encoded_len(&t2);
    assert!(end > last_start);
    let mut cuts = 0;
    for cut in last_start..=end {
        let d = SimStorage::new();
        let mut b = orig.clone();
        b[cut..].iter_mut().for_each(|x| *x = 0);
        d.put_file_bytes(&seg, b);
        let s = Shard::open_with(Arc::new(d.clone()), sim_dir(), opts(1 << 14))
            .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        let got = s.scan().unwrap();
        assert!(
            got == before_last || got == after_last,
            "cut {cut}: partial transaction {got:?}"
        );
        if cut < end {
            assert_eq!(got, before_last, "cut {cut} inside the frame must drop it");
        }
        cuts += 1;
        // The repair is durable: a power loss right after open changes nothing.
        drop(s);
        let again = Shard::open_with(
            Arc::new(d.crash(CrashMode::PowerDrop)),
            sim_dir(),
            opts(1 << 14),
        )
        .unwrap();
        assert_eq!(again.scan().unwrap(), got);
    }
    assert!(cuts > 40);
}

/// Goal: re-applying a held lsn changes nothing, and a create of an id already created is a
/// refused duplicate, never a second record.
#[test]
fn reapply_is_a_no_op() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 1 << 14).unwrap();
    assert_eq!(
        s.apply(&create_txn(5, &[10, 11])).unwrap(),
        Applied::Written
    );
    let writes = disk.write_count();
    assert_eq!(
        s.apply(&create_txn(5, &[10, 11])).unwrap(),
        Applied::AlreadyHeld
    );
    assert_eq!(disk.write_count(), writes);
    assert!(matches!(
        s.apply(&create_txn(6, &[11])),
        Err(ShardError::DuplicateId { id: 11, .. })
    ));
    assert!(matches!(
        s.apply(&create_txn(4, &[99])),
        Err(ShardError::OutOfOrder { .. })
    ));
    assert_eq!(contents(&s), vec![10, 11]);
    assert!(s.holds(5).unwrap() && !s.holds(4).unwrap());
}

/// Goal: thousands of transactions on a real, memory-mapped directory, rolling across
/// segments, with deletes, reopen to exactly the same records (an independent model).
#[test]
fn reopen_after_thousands_of_transactions_on_real_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("users");
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut s = Shard::open(&dir, opts(64 << 10)).unwrap();
    let mut next_id = 1;
    for lsn in 1..=3000u64 {
        let mut ops = Vec::new();
        for _ in 0..(lsn % 4 + 1) {
            ops.push(TxnOp::Create {
                id: next_id,
                record: rec(next_id),
            });
            model.insert(next_id, rec(next_id));
            next_id += 1;
        }
        if lsn % 3 == 0 {
            let victim = *model.keys().nth((lsn as usize * 7) % model.len()).unwrap();
            if !ops
                .iter()
                .any(|o| matches!(o, TxnOp::Create { id, .. } if *id == victim))
            {
                ops.push(TxnOp::Delete { id: victim });
                model.remove(&victim);
            }
        }
        s.apply(&Txn { lsn, ops }).unwrap();
        if lsn % 100 == 0 {
            s.flush().unwrap();
        }
    }
    s.flush().unwrap();
    let live: Vec<(u64, Vec<u8>)> = model.clone().into_iter().collect();
    assert_eq!(s.scan().unwrap(), live);
    drop(s);
    let segs = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".seg")
        })
        .count();
    assert!(segs > 3, "rolled across {segs} segments");
    let s = Shard::open(&dir, opts(64 << 10)).unwrap();
    assert_eq!(s.scan().unwrap(), live);
    assert_eq!(s.max_lsn(), 3000);
    assert_eq!(s.open_report().records as usize, model.len());
    for id in [1u64, 2, 3] {
        assert_eq!(s.get(id).unwrap(), model.get(&id).cloned(), "get {id}");
    }
}

/// Goal: deletes stay hidden after reopen, and after a power loss once flushed.
#[test]
fn deletes_survive_reopen_and_power_loss() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 1 << 14).unwrap();
    s.apply(&create_txn(1, &[1, 2, 3])).unwrap();
    s.apply(&Txn {
        lsn: 2,
        ops: vec![TxnOp::Delete { id: 2 }],
    })
    .unwrap();
    s.flush().unwrap();
    s.apply(&Txn {
        lsn: 3,
        ops: vec![TxnOp::Delete { id: 3 }],
    })
    .unwrap(); // not flushed
    drop(s);
    let s = open_sim(&disk.crash(CrashMode::Process), 1 << 14).unwrap();
    assert_eq!(contents(&s), vec![1]);
    let s = open_sim(&disk.crash(CrashMode::PowerDrop), 1 << 14).unwrap();
    assert_eq!(
        contents(&s),
        vec![1, 3],
        "unflushed delete lost, flushed one kept"
    );
    assert_eq!(s.get(2).unwrap(), None);
}

/// Goal: power loss at every sync, dropped or torn: every flushed transaction survives, and
/// every reopened state is a prefix of whole transactions.
#[test]
fn power_loss_at_every_sync_is_a_prefix_of_whole_transactions() {
    // Every sync of the run, the rolls' among them (spare renamed, next spare made).
    let total = {
        let disk = SimStorage::new();
        let mut s = open_sim(&disk, 512).unwrap();
        for lsn in 1..=20u64 {
            s.apply(&create_txn(lsn, &[lsn * 10, lsn * 10 + 1]))
                .unwrap();
            s.flush().unwrap();
        }
        disk.sync_count()
    };
    for freeze in 0..=total {
        for mode in [
            CrashMode::PowerDrop,
            CrashMode::PowerTear { seed: freeze + 11 },
        ] {
            let disk = SimStorage::new();
            disk.set_faults(SimFaults {
                freeze_after_syncs: Some(freeze),
                ..SimFaults::default()
            });
            let mut s = open_sim(&disk, 512).unwrap();
            let mut flushed_lsn = 0;
            for lsn in 1..=20u64 {
                s.apply(&create_txn(lsn, &[lsn * 10, lsn * 10 + 1]))
                    .unwrap();
                s.flush().unwrap();
                if disk.sync_count() <= freeze {
                    flushed_lsn = lsn;
                }
            }
            drop(s);
            let s = open_sim(&disk.crash(mode), 512)
                .unwrap_or_else(|e| panic!("{freeze} {mode:?}: {e}"));
            let max = s.max_lsn();
            assert!(
                max >= flushed_lsn,
                "freeze {freeze}: lost flushed lsn {flushed_lsn}, have {max}"
            );
            let want: Vec<u64> = (1..=max).flat_map(|l| [l * 10, l * 10 + 1]).collect();
            assert_eq!(contents(&s), want);
        }
    }
}

/// Goal: truncate back to "everything below lsn X" across segments, and it persists.
#[test]
fn truncate_to_lsn() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 256).unwrap();
    for lsn in 1..=30u64 {
        s.apply(&create_txn(lsn, &[lsn])).unwrap();
    }
    s.apply(&Txn {
        lsn: 31,
        ops: vec![TxnOp::Delete { id: 3 }],
    })
    .unwrap();
    s.flush().unwrap();
    assert_eq!(s.truncate_from(12).unwrap(), 20);
    assert_eq!(s.max_lsn(), 11);
    assert_eq!(
        contents(&s),
        (1..=11).collect::<Vec<_>>(),
        "delete at lsn 31 undone too"
    );
    s.apply(&create_txn(12, &[500])).unwrap();
    s.flush().unwrap();
    drop(s);
    let s = open_sim(&disk.crash(CrashMode::PowerDrop), 256).unwrap();
    let mut want: Vec<u64> = (1..=11).collect();
    want.push(500);
    assert_eq!(contents(&s), want);
}

/// Goal: ENOSPC when a new segment is preallocated is an error, not a crash; the shard keeps
/// serving reads, and takes writes again once space returns.
#[test]
fn enospc_on_growth_is_an_error_and_reads_still_work() {
    let disk = SimStorage::new();
    disk.set_faults(SimFaults {
        space_bytes_max: Some(300),
        ..SimFaults::default()
    });
    let mut s = open_sim(&disk, 256).unwrap();
    let mut lsn = 0;
    let err = loop {
        lsn += 1;
        match s.apply(&create_txn(lsn, &[lsn])) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    match &err {
        ShardError::Io {
            op: "allocate",
            source,
            ..
        } => assert_eq!(source.raw_os_error(), Some(28)),
        other => panic!("{other}"),
    }
    assert_eq!(contents(&s), (1..lsn).collect::<Vec<_>>());
    disk.set_faults(SimFaults::default());
    s.apply(&create_txn(lsn, &[lsn])).unwrap();
    assert!(s.contains(lsn).unwrap());
}

/// Goal: two writers can never map the same shard: the second open is refused.
#[test]
fn second_writer_is_locked_out() {
    let tmp = tempfile::tempdir().unwrap();
    let _a = Shard::open(tmp.path().join("s"), opts(4096)).unwrap();
    assert!(matches!(
        Shard::open(tmp.path().join("s"), opts(4096)),
        Err(ShardError::Locked { .. })
    ));
    let ro = Shard::open(
        tmp.path().join("s"),
        ShardOptions {
            read_only: true,
            ..opts(4096)
        },
    );
    assert!(ro.is_ok(), "readers need no lock");
}

/// Goal: damage before the last valid frame is corruption, named with segment and offset.
#[test]
fn damage_before_a_valid_frame_is_corruption() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 1 << 14).unwrap();
    for lsn in 1..=3 {
        s.apply(&create_txn(lsn, &[lsn])).unwrap();
    }
    s.flush().unwrap();
    drop(s);
    let seg = sim_dir().join("0000000001.seg");
    let mut b = disk.file_bytes(&seg).unwrap();
    b[40] ^= 0x10; // inside the first frame's body
    disk.put_file_bytes(&seg, b);
    match open_sim(&disk, 1 << 14) {
        Err(ShardError::Corrupt {
            segment, offset, ..
        }) => {
            assert_eq!(segment, seg);
            assert_eq!(offset, 0);
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

/// Goal: a gap among frames never flushed (a power loss kept a later page of the map and not
/// an earlier one) is dropped with everything after it when the caller vouches that every
/// frame up to some lsn was flushed and all of them were read; damage at or before that lsn
/// stays corruption, as does any gap when nothing is vouched for.
#[test]
fn gap_among_unflushed_frames_is_a_torn_tail_only_past_the_synced_lsn() {
    let build = || {
        let disk = SimStorage::new();
        let mut s = open_sim(&disk, 1 << 14).unwrap();
        for lsn in 1..=2 {
            s.apply(&create_txn(lsn, &[lsn])).unwrap();
        }
        s.flush().unwrap();
        for lsn in 3..=5 {
            s.apply(&create_txn(lsn, &[lsn])).unwrap();
        }
        drop(s);
        disk
    };
    let seg = sim_dir().join("0000000001.seg");
    let frame = encoded_len(&create_txn(1, &[1]));
    // Frame 3 (never flushed) lost; frames 4 and 5 (never flushed either) on the disk.
    let with_gap = |disk: &SimStorage| {
        let mut b = disk.file_bytes(&seg).unwrap();
        b[2 * frame..3 * frame].fill(0);
        disk.put_file_bytes(&seg, b);
    };
    let open = |disk: &SimStorage, t: Option<u64>| {
        Shard::open_with(
            Arc::new(disk.clone()),
            sim_dir(),
            ShardOptions {
                synced_through_lsn: t,
                ..opts(1 << 14)
            },
        )
    };
    for t in [Some(0), Some(1), Some(2)] {
        let disk = build();
        with_gap(&disk);
        let mut s = open(&disk, t).unwrap_or_else(|e| panic!("synced through {t:?}: {e}"));
        assert_eq!(contents(&s), vec![1, 2], "synced through {t:?}");
        assert_eq!(s.max_lsn(), 2);
        assert!(s.open_report().torn_bytes_dropped >= 2 * frame as u64);
        // The caller re-applies 3, 4, 5 from its log; the dropped frames are gone for good.
        for lsn in 3..=5 {
            assert_eq!(s.apply(&create_txn(lsn, &[lsn])).unwrap(), Applied::Written);
        }
        s.flush().unwrap();
        drop(s);
        let s = open(&disk, None).unwrap();
        assert_eq!(contents(&s), vec![1, 2, 3, 4, 5]);
    }
    // The gap is at or before what was vouched flushed: corruption, not a tail to drop.
    for t in [None, Some(3), Some(4)] {
        let disk = build();
        with_gap(&disk);
        match open(&disk, t) {
            Err(ShardError::Corrupt { offset, .. }) => assert_eq!(offset, 2 * frame as u64),
            other => panic!("synced through {t:?}: expected corruption, got {other:?}"),
        }
    }
}

/// Goal: the index keeps working when ids do not arrive in increasing order and when more
/// than half of them are deleted (compaction), checked against a model after reopen too.
#[test]
fn index_out_of_order_ids_and_mass_deletes() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 1 << 20).unwrap();
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut lsn = 0;
    for chunk in [(5000u64..7000), (1..2000), (9000..9500)] {
        lsn += 1;
        let ops: Vec<TxnOp> = chunk
            .clone()
            .rev()
            .map(|id| TxnOp::Create {
                id,
                record: rec(id),
            })
            .collect();
        for id in chunk {
            model.insert(id, rec(id));
        }
        s.apply(&Txn { lsn, ops }).unwrap();
    }
    lsn += 1;
    let victims: Vec<u64> = model.keys().copied().filter(|id| id % 3 != 0).collect();
    for id in &victims {
        model.remove(id);
    }
    s.apply(&Txn {
        lsn,
        ops: victims.iter().map(|id| TxnOp::Delete { id: *id }).collect(),
    })
    .unwrap();
    s.flush().unwrap();
    let want: Vec<(u64, Vec<u8>)> = model.clone().into_iter().collect();
    assert_eq!(s.scan().unwrap(), want);
    assert_eq!(s.get(6001).unwrap(), None);
    assert_eq!(s.get(6003).unwrap(), Some(rec(6003)));
    drop(s);
    let s = open_sim(&disk, 1 << 20).unwrap();
    assert_eq!(s.scan().unwrap(), want);
    assert_eq!(s.len(), model.len());
}

/// Goal (issue 13, "recovery never builds on the page cache"): frames applied but never
/// flushed survive a process crash in the page cache; a writable reopen must make them
/// durable before it counts them as held, so a power loss after the reopen cannot take them.
/// Method: apply two frames, flush only the first, crash the process (the cache survives),
/// reopen writable and close, then cut the power: both frames must be there. Without the
/// sync at open the second frame is lost while recovery had already treated it as held.
#[test]
fn frames_read_after_a_process_crash_are_made_durable_at_open() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 1 << 16).unwrap();
    s.apply(&create_txn(1, &[1])).unwrap();
    s.flush().unwrap();
    s.apply(&create_txn(2, &[2])).unwrap();
    drop(s);
    let disk = disk.crash(CrashMode::Process);
    let s = open_sim(&disk, 1 << 16).unwrap();
    assert!(
        s.holds(2).unwrap(),
        "the unflushed frame is readable after a process crash"
    );
    drop(s);
    let disk = disk.crash(CrashMode::PowerDrop);
    let s = open_sim(&disk, 1 << 16).unwrap();
    assert!(
        s.holds(1).unwrap() && s.holds(2).unwrap(),
        "held lsns after the power cut: {:?}",
        s.held_lsns().unwrap()
    );
    assert_eq!(contents(&s), vec![1, 2]);
}

/// Goal: a re-apply of a held lsn is a no-op only when it carries the same transaction; a
/// different one at that lsn means the WAL and the shard disagree and must fail loudly
/// (corruption), never be answered as applied.
#[test]
fn reapplying_a_held_lsn_with_other_ops_is_refused() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 1 << 16).unwrap();
    s.apply(&create_txn(1, &[1])).unwrap();
    s.apply(&create_txn(2, &[2, 3])).unwrap();
    assert_eq!(
        s.apply(&create_txn(2, &[2, 3])).unwrap(),
        Applied::AlreadyHeld
    );
    let e = s.apply(&create_txn(2, &[4])).unwrap_err();
    assert!(matches!(e, ShardError::HeldDiffers { lsn: 2, .. }), "{e}");
    assert!(e.is_corruption());
    let e = s
        .apply(&Txn {
            lsn: 1,
            ops: vec![TxnOp::Delete { id: 1 }],
        })
        .unwrap_err();
    assert!(matches!(e, ShardError::HeldDiffers { lsn: 1, .. }), "{e}");
    assert_eq!(contents(&s), vec![1, 2, 3], "nothing changed");
}

/// Goal: the segment size may change between runs. A shard written with 16 KiB segments and
/// reopened with 64 KiB ones (and back with 8 KiB) goes on writing: a segment is used up to
/// its own length, never the configured one (a mapped segment written past its length
/// would fail and poison the shard). Method: on a real disk (mapped segments), frames until
/// several segments, reopen larger, more frames, reopen smaller, more frames; every record
/// readable after each reopen.
#[test]
fn segment_size_may_change_between_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("users");
    let mut lsn = 0u64;
    let mut ids = Vec::new();
    for seg in [16u64 << 10, 64 << 10, 8 << 10] {
        let mut s = Shard::open(&dir, opts(seg)).unwrap();
        assert_eq!(contents(&s), ids, "reopened with {seg}-byte segments");
        for _ in 0..400 {
            lsn += 1;
            let id = lsn;
            s.apply(&create_txn(lsn, &[id]))
                .unwrap_or_else(|e| panic!("lsn {lsn} with {seg}-byte segments: {e}"));
            ids.push(id);
        }
        s.flush().unwrap();
        assert_eq!(contents(&s), ids);
    }
}

/// Allocated bytes (`st_blocks` × 512) and lengths of the files in `dir`, by name.
fn files_in(dir: &std::path::Path) -> BTreeMap<String, (u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .expect("list")
        .map(|e| {
            let e = e.expect("entry");
            let m = e.metadata().expect("stat");
            let name = e.file_name().to_string_lossy().into_owned();
            (name, (m.blocks() * 512, m.len()))
        })
        .collect()
}

/// A transaction creating `id` with a record of about 60 KiB.
fn big_txn(lsn: u64) -> Txn {
    let record = format!("{{\"b\":\"{}\"}}", "x".repeat(60_000 + lsn as usize % 7));
    Txn {
        lsn,
        ops: vec![TxnOp::Create {
            id: lsn,
            record: record.into_bytes(),
        }],
    }
}

/// The live ids of the shard in `dir`, opened again with `o`.
fn ids_after_reopen(dir: &std::path::Path, o: ShardOptions) -> Vec<u64> {
    let s = Shard::open(dir, o).expect("reopen");
    s.scan()
        .expect("scan")
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Goal (issue 25, item 3): a new shard takes little disk. With the default 16 MiB segments
/// a shard holding one record allocates well under 1 MiB (a 64 KiB first segment and a
/// 128 KiB spare, not 16 MiB each); as it fills, each segment is twice the last, up to
/// `segment_bytes`; it reopens with every record; and a shard whose segments are all full
/// size (as an older binary made them) goes on with full-size segments.
#[test]
fn a_new_shard_starts_small_and_its_segments_double() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("s");
    let mut s = Shard::open(&dir, ShardOptions::default()).expect("open");
    s.apply(&create_txn(1, &[1])).expect("apply");
    s.flush().expect("flush");
    let total: u64 = files_in(&dir).values().map(|(b, _)| b).sum();
    assert!(
        total < 1 << 20,
        "a one-record shard allocates {total} bytes"
    );
    for lsn in 2..40 {
        s.apply(&big_txn(lsn)).expect("apply");
    }
    s.flush().expect("flush");
    drop(s);
    let lens: Vec<u64> = files_in(&dir)
        .iter()
        .filter(|(n, _)| n.ends_with(".seg"))
        .map(|(_, (_, len))| *len)
        .collect();
    // Each segment is allocated at twice the last; a rolled one is then cut to its frames
    // (the frame that did not fit left less than one `big_txn` unused).
    let doubling = [64 << 10, 128 << 10, 256 << 10, 512 << 10];
    let near = |len: u64, alloc: u64| len <= alloc && len + (64 << 10) > alloc;
    assert!(
        lens.iter().zip(doubling).all(|(l, a)| near(*l, a)),
        "{lens:?}"
    );
    let ids = ids_after_reopen(&dir, ShardOptions::default());
    assert_eq!(ids, (1..40).collect::<Vec<_>>());
    let old = tmp.path().join("old");
    let full = |first_segment_bytes| ShardOptions {
        segment_bytes: 256 << 10,
        first_segment_bytes,
        ..ShardOptions::default()
    };
    let mut s = Shard::open(&old, full(256 << 10)).expect("open old");
    for lsn in 1..8 {
        s.apply(&big_txn(lsn)).expect("apply");
    }
    drop(s);
    let mut s = Shard::open(&old, full(64 << 10)).expect("reopen old");
    for lsn in 8..16 {
        s.apply(&big_txn(lsn)).expect("apply");
    }
    drop(s);
    let files = files_in(&old);
    let seg_lens: Vec<u64> = files
        .iter()
        .filter(|(n, _)| n.ends_with(".seg"))
        .map(|(_, (_, len))| *len)
        .collect();
    let (sealed, last) = seg_lens.split_at(seg_lens.len() - 1);
    assert!(
        sealed.iter().all(|l| near(*l, 256 << 10)) && last == [256 << 10],
        "{seg_lens:?}"
    );
    assert_eq!(
        ids_after_reopen(&old, full(64 << 10)),
        (1..16).collect::<Vec<_>>()
    );
}

/// Goal: a truncate makes the frames it keeps durable even when they were applied and never
/// flushed. Method: three frames applied without a flush, a truncate from the third, a power
/// loss. The zeros' own `msync` covers only the third frame's range, so without the truncate's
/// flush of the dirty range the first two frames would be lost while `truncate_from` answered
/// Ok (a simulator whose flush synced the whole file could not see it).
#[test]
fn truncate_keeps_unflushed_frames_before_the_cut_durable() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 1 << 14).unwrap();
    for lsn in 1..=3u64 {
        s.apply(&create_txn(lsn, &[lsn])).unwrap();
    }
    assert_eq!(s.truncate_from(3).unwrap(), 1);
    assert!(!s.unflushed());
    drop(s);
    let s = open_sim(&disk.crash(CrashMode::PowerDrop), 1 << 14).unwrap();
    assert_eq!(contents(&s), vec![1, 2]);
    assert_eq!(s.max_lsn(), 2);
}

/// The segment files of a shard directory, by name.
fn segment_bytes_of(names: &[String], read: impl Fn(&str) -> Vec<u8>) -> BTreeMap<String, Vec<u8>> {
    names.iter().map(|n| (n.clone(), read(n))).collect()
}

/// Opens, applies, flushes, rolls, truncates and reopens a shard: the same calls on any disk.
fn same_calls(storage: Arc<dyn roost_storage::Storage>, dir: &std::path::Path) {
    let mut s = Shard::open_with(storage.clone(), dir, opts(1 << 13)).unwrap();
    for lsn in 1..=200u64 {
        s.apply(&create_txn(lsn, &[lsn * 2, lsn * 2 + 1])).unwrap();
        if lsn % 7 == 0 {
            s.flush().unwrap();
        }
    }
    assert_eq!(s.truncate_from(195).unwrap(), 6);
    s.apply(&create_txn(195, &[1000])).unwrap();
    s.flush().unwrap();
    drop(s);
    let s = Shard::open_with(storage, dir, opts(1 << 13)).unwrap();
    assert_eq!(s.max_lsn(), 195);
    assert_eq!(s.len(), 194 * 2 + 1);
}

/// Goal: a writable shard makes the same calls through the seam on the simulated and the
/// real disk (mapped segments, range flushes), so the crash tests run what production runs.
/// Method: one history on each; every segment file ends byte for byte the same.
#[test]
fn a_shard_writes_the_same_segments_on_the_simulator_and_the_real_disk() {
    let disk = SimStorage::new();
    same_calls(Arc::new(disk.clone()), &sim_dir());
    let tmp = tempfile::tempdir().unwrap();
    let real_dir = tmp.path().join("users");
    same_calls(roost_storage::RealStorage::shared(), &real_dir);
    let mut names: Vec<String> = std::fs::read_dir(&real_dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(roost_shards::SEGMENT_SUFFIX))
        .collect();
    names.sort();
    assert!(names.len() >= 3, "the history rolls segments: {names:?}");
    let real = segment_bytes_of(&names, |n| std::fs::read(real_dir.join(n)).unwrap());
    let sim = segment_bytes_of(&names, |n| disk.file_bytes(&sim_dir().join(n)).unwrap());
    for n in &names {
        assert_eq!(real[n].len(), sim[n].len(), "{n}: length");
        assert!(
            real[n] == sim[n],
            "{n}: bytes differ between the real disk and the simulator"
        );
    }
}

/// Transaction `l` of the index files' workload: three creates, and (from the fifth on) the
/// delete of a record four transactions older, most often in an older, sealed segment.
fn churn_txn(l: u64) -> Txn {
    let mut ops: Vec<TxnOp> = (0..3)
        .map(|i| TxnOp::Create {
            id: 3 * l + i,
            record: rec(3 * l + i),
        })
        .collect();
    if l > 4 {
        ops.push(TxnOp::Delete {
            id: 3 * (l - 4) + 1,
        });
    }
    Txn { lsn: l, ops }
}

/// The live ids after transactions `1..=m` of [`churn_txn`].
fn churn_live(m: u64) -> Vec<u64> {
    let mut live: std::collections::BTreeSet<u64> = std::collections::BTreeSet::new();
    for l in 1..=m {
        live.extend((0..3).map(|i| 3 * l + i));
        if l > 4 {
            live.remove(&(3 * (l - 4) + 1));
        }
    }
    live.into_iter().collect()
}

/// Goal (issue 44): sealed segments' index files and the `dead` file lose nothing and
/// resurrect nothing, whatever sync a power loss stops at: every reopened state is exactly the
/// state after a prefix of whole transactions, at least every flushed one; and a second open
/// (now from the files the first one wrote, or a scan where it wrote none) agrees. Method: a
/// workload that seals many 512-byte segments and deletes records of sealed ones; the
/// simulated disk freezes after every sync in turn, then drops or tears the power.
#[test]
fn index_files_power_loss_at_every_sync_keeps_every_delete() {
    power_loss_at_every_sync_keeps_every_delete(opts(512));
}

/// The same when segments roll because their run in memory is full, not their bytes: each
/// rolled segment is mapped again and cut to its frames (`index_entries_max`), and a power
/// loss around that cut loses and resurrects nothing either.
#[test]
fn a_full_run_rolls_its_segment_and_power_loss_at_every_sync_keeps_every_delete() {
    let o = ShardOptions {
        index_entries_max: 12,
        ..opts(64 << 10)
    };
    let disk = SimStorage::new();
    let mut s = Shard::open_with(Arc::new(disk.clone()), sim_dir(), o.clone()).unwrap();
    for l in 1..=30 {
        s.apply(&churn_txn(l)).unwrap();
        s.flush().unwrap();
    }
    drop(s);
    let lens = seg_lens(&disk);
    let sealed = &lens[..lens.len() - 1];
    assert!(
        sealed.len() >= 5,
        "segments {lens:?}: the runs must roll them"
    );
    assert!(
        sealed.iter().all(|l| *l == 4096),
        "segments {lens:?}: each rolled one cut to its frames' page"
    );
    power_loss_at_every_sync_keeps_every_delete(o);
}

/// The length of each segment file on `disk`, in name order.
fn seg_lens(disk: &SimStorage) -> Vec<u64> {
    use roost_storage::{OpenMode, Storage};
    files_ending(disk, ".seg")
        .iter()
        .map(|p| disk.open(p, OpenMode::Read).unwrap().len().unwrap())
        .collect()
}

fn power_loss_at_every_sync_keeps_every_delete(o: ShardOptions) {
    let n = 30u64;
    let open = |disk: &SimStorage| Shard::open_with(Arc::new(disk.clone()), sim_dir(), o.clone());
    let total = {
        let disk = SimStorage::new();
        let mut s = open(&disk).unwrap();
        for l in 1..=n {
            s.apply(&churn_txn(l)).unwrap();
            s.flush().unwrap();
        }
        let idx = disk
            .paths()
            .iter()
            .filter(|p| p.to_string_lossy().ends_with(".idx"))
            .count();
        assert!(
            idx >= 5,
            "{idx} index files: the workload must seal segments"
        );
        assert!(
            disk.paths().iter().any(|p| p.ends_with("dead")),
            "no dead file"
        );
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
            let mut s = open(&disk).unwrap();
            let mut flushed = 0;
            for l in 1..=n {
                s.apply(&churn_txn(l)).unwrap();
                s.flush().unwrap();
                if disk.sync_count() <= freeze {
                    flushed = l;
                }
            }
            drop(s);
            let what = format!("freeze {freeze} {mode:?}");
            let crashed = disk.crash(mode);
            let s = open(&crashed).unwrap_or_else(|e| panic!("{what}: {e}"));
            let max = s.max_lsn();
            assert!(
                max >= flushed,
                "{what}: lost flushed lsn {flushed}, have {max}"
            );
            assert_eq!(contents(&s), churn_live(max), "{what}: first open");
            assert_eq!(s.len(), churn_live(max).len(), "{what}: len");
            drop(s);
            let s = open(&crashed).unwrap_or_else(|e| panic!("{what}: again: {e}"));
            assert_eq!(contents(&s), churn_live(max), "{what}: second open");
        }
    }
}

/// The shard's index files, in name order.
fn idx_files(disk: &SimStorage) -> Vec<std::path::PathBuf> {
    files_ending(disk, ".idx")
}

/// The files on `disk` whose names end with `suffix`, in name order.
fn files_ending(disk: &SimStorage, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = disk
        .paths()
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

type Harm = Box<dyn Fn(&SimStorage)>;

/// Flips a byte (at `at(length)`) of the index file `pick` chooses.
fn flip(at: fn(usize) -> usize, pick: fn(&[std::path::PathBuf]) -> std::path::PathBuf) -> Harm {
    Box::new(move |disk: &SimStorage| {
        let p = pick(&idx_files(disk));
        let mut b = disk.file_bytes(&p).unwrap();
        let i = at(b.len());
        b[i] ^= 0x40;
        disk.put_file_bytes(&p, b);
    })
}

/// Puts the index files of a twin history in place: the same workload up to `n`, but each
/// transaction deletes another record (frames of the same lengths at the same offsets).
fn twin_index_files(n: u64) -> Harm {
    Box::new(move |disk: &SimStorage| {
        let other = SimStorage::new();
        let mut s = open_sim(&other, 512).unwrap();
        for l in 1..=n {
            let mut t = churn_txn(l);
            if let Some(TxnOp::Delete { id }) = t.ops.last_mut() {
                *id += 1;
            }
            s.apply(&t).unwrap();
        }
        s.flush().unwrap();
        drop(s);
        for p in idx_files(disk) {
            disk.put_file_bytes(&p, other.file_bytes(&p).unwrap());
        }
    })
}

/// What [`a_damaged_or_stale_index_file_is_rebuilt_not_trusted`] does to a shard of `n`
/// transactions.
fn stale_harms(n: u64) -> Vec<(&'static str, Harm)> {
    let dead = || sim_dir().join("dead");
    vec![
        ("header", flip(|_| 40, |f| f[0].clone())),
        ("directory", flip(|len| len - 9, |f| f[2].clone())),
        (
            "dead file flipped",
            Box::new(move |disk: &SimStorage| {
                let mut b = disk.file_bytes(&dead()).unwrap();
                b[40] ^= 1;
                disk.put_file_bytes(&dead(), b);
            }),
        ),
        (
            "dead file removed",
            Box::new(move |disk: &SimStorage| {
                roost_storage::Storage::remove(disk, &dead()).unwrap()
            }),
        ),
        (
            "index file of other frames at the same place",
            twin_index_files(n),
        ),
        (
            "index file of another segment",
            Box::new(|disk: &SimStorage| {
                let files = idx_files(disk);
                let other = disk.file_bytes(&files[0]).unwrap();
                disk.put_file_bytes(&files[3], other);
            }),
        ),
    ]
}

/// Goal (issue 44): an index file or `dead` file that is damaged, stale or missing is never
/// trusted: open scans the segment (or replays the deletes) and answers exactly as before.
/// Method: a shard with sealed segments and deletes of their records; then each of
/// [`stale_harms`]: a flipped byte in an index file's header or directory, or in the `dead`
/// file; the `dead` file removed; the index files of a twin history; an index file put beside
/// another segment. Every reopen must hold the same records, and every record must read back.
/// (A flipped byte in a page is found when the page is read: see the next test.)
#[test]
fn a_damaged_or_stale_index_file_is_rebuilt_not_trusted() {
    let n = 40u64;
    let want = churn_live(n);
    for (what, harm) in stale_harms(n) {
        let disk = SimStorage::new();
        let mut s = open_sim(&disk, 512).unwrap();
        for l in 1..=n {
            s.apply(&churn_txn(l)).unwrap();
        }
        s.flush().unwrap();
        drop(s);
        harm(&disk);
        let s = open_sim(&disk, 512).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(contents(&s), want, "{what}");
        assert_eq!(s.len(), want.len(), "{what}: len");
        for id in &want {
            assert_eq!(s.get(*id).unwrap(), Some(rec(*id)), "{what}: get {id}");
        }
        assert_eq!(s.get(3 * 5 + 1).unwrap(), None, "{what}: a deleted record");
    }
}

/// Goal (issue 44): a damaged page of an index file is an error that names the file and the
/// page when a read meets it, never a wrong answer; removing the file (it is derived from its
/// segment) makes the next open scan the segment and answer again.
#[test]
fn a_damaged_index_page_is_an_error_naming_the_file() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 512).unwrap();
    for l in 1..=40u64 {
        s.apply(&churn_txn(l)).unwrap();
    }
    s.flush().unwrap();
    drop(s);
    let mut files: Vec<_> = disk
        .paths()
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".idx"))
        .collect();
    files.sort();
    let victim = files[1].clone();
    let mut b = disk.file_bytes(&victim).unwrap();
    b[4096 + 16] ^= 0x40; // the second entry's id
    disk.put_file_bytes(&victim, b);
    let s = open_sim(&disk, 512).unwrap();
    let errors: Vec<String> = churn_live(40)
        .iter()
        .filter_map(|id| s.get(*id).err().map(|e| e.to_string()))
        .collect();
    assert!(!errors.is_empty(), "no read met the damaged page");
    let name = victim.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        errors
            .iter()
            .all(|e| e.contains(&name) && e.contains("page 0")),
        "{errors:?}"
    );
    drop(s);
    roost_storage::Storage::remove(&disk, &victim).unwrap();
    let s = open_sim(&disk, 512).unwrap();
    assert_eq!(contents(&s), churn_live(40));
}

/// Goal (issue 44): an open reads sealed segments through their index files, so it no longer
/// checks their frames (that is `roost verify`'s job), and `index_files: false` (what verify
/// opens with) reads and checks every frame as before. Method: a flipped byte in the first
/// frame of the first sealed segment: a read-only and a writable open both open; the same
/// read-only open without index files refuses it as corruption naming the segment.
#[test]
fn index_files_skip_sealed_frames_and_verify_reads_them_all() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 512).unwrap();
    for l in 1..=40u64 {
        s.apply(&churn_txn(l)).unwrap();
    }
    s.flush().unwrap();
    drop(s);
    let first = sim_dir().join("0000000001.seg");
    let mut b = disk.file_bytes(&first).unwrap();
    b[40] ^= 0x01;
    disk.put_file_bytes(&first, b);
    let open_with = |read_only: bool, index_files: bool| {
        let o = ShardOptions {
            read_only,
            index_files,
            ..opts(512)
        };
        Shard::open_with(Arc::new(disk.clone()), sim_dir(), o)
    };
    let ro = open_with(true, true).unwrap();
    assert_eq!(ro.get(3 * 40).unwrap(), Some(rec(3 * 40)));
    drop(ro);
    match open_with(true, false) {
        Err(e) => assert!(
            e.is_corruption() && e.to_string().contains("0000000001.seg"),
            "{e}"
        ),
        Ok(_) => panic!("a read of every frame must find the flipped byte"),
    }
    let rw = open_with(false, true).unwrap();
    assert_eq!(rw.len(), churn_live(40).len());
}

/// Goal (issue 44): `roost verify` finds a `dead` file that marks a live record dead, which a
/// writable open would trust (the record would vanish). Method: set the bit of live id 3 in
/// the first run's bits and fix the file's checksum; a scan of every frame
/// (`index_files: false`, as verify opens) then reports it, naming the id, while an open that
/// trusts the file has lost the record; an intact shard reports nothing.
#[test]
fn verify_finds_a_dead_file_that_marks_a_live_record_dead() {
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 512).unwrap();
    for l in 1..=40u64 {
        s.apply(&churn_txn(l)).unwrap();
    }
    s.flush().unwrap();
    drop(s);
    let scan_all = || {
        let o = ShardOptions {
            read_only: true,
            index_files: false,
            ..opts(512)
        };
        Shard::open_with(Arc::new(disk.clone()), sim_dir(), o).unwrap()
    };
    assert_eq!(scan_all().index_file_problems(), Vec::<String>::new());
    let path = sim_dir().join("dead");
    let mut b = disk.file_bytes(&path).unwrap();
    // Header 32 B; the first run: seq, ident, entries, bytes, by_seq, words, then its words.
    assert_eq!(
        u64::from_le_bytes(b[32..40].try_into().unwrap()),
        1,
        "first run is seq 1"
    );
    b[80] |= 1; // rank 0 of segment 1: id 3, live
    let n = b.len() - 4;
    let crc = crc32fast::hash(&b[..n]);
    b[n..].copy_from_slice(&crc.to_le_bytes());
    disk.put_file_bytes(&path, b);
    let problems = scan_all().index_file_problems();
    assert!(
        problems.len() == 1 && problems[0].contains("marks live id 3"),
        "{problems:?}"
    );
    let trusting = open_sim(&disk, 512).unwrap();
    assert_eq!(
        trusting.get(3).unwrap(),
        None,
        "the trusted file hides id 3"
    );
    // A compaction's segment too (its file lists its kept deletes sorted): nothing to report.
    let disk = SimStorage::new();
    let mut s = open_sim(&disk, 512).unwrap();
    for l in 1..=40u64 {
        s.apply(&churn_txn(l)).unwrap();
    }
    s.flush().unwrap();
    let o = roost_shards::CompactOptions {
        budget_bytes: 1 << 20,
        horizon_lsn: s.max_lsn(),
        dead_fraction_min: 0.1,
    };
    let mut compacted = 0;
    while let Ok(p) = s.compact_step(&o) {
        match p {
            roost_shards::CompactProgress::Idle => break,
            roost_shards::CompactProgress::Finished { .. } => compacted += 1,
            roost_shards::CompactProgress::Working { .. } => {}
        }
    }
    drop(s);
    assert!(compacted > 0, "nothing was compacted");
    let o = ShardOptions {
        read_only: true,
        index_files: false,
        ..opts(512)
    };
    let scanned = Shard::open_with(Arc::new(disk.clone()), sim_dir(), o).unwrap();
    assert_eq!(scanned.index_file_problems(), Vec::<String>::new());
}

//! A crash at every seam call of a standby's re-seed from a base backup, and of its cut
//! (`Cutter`), on the simulated disk (issue 46): every file those two write now goes through
//! the storage seam, so the simulator sees each step. After each crash (the process stopped
//! at the n-th changing call, or the power lost at the n-th sync, unsynced writes dropped or
//! torn) the node starts again as `roost serve` does (`reseed::resume`, then the cut, then the
//! engine opens as a standby) and must end with the primary's records, shard contents and
//! audit rows (each claim's rows once) and `verify` clean: never a mix of the old state and
//! the backup, never a record lost or repeated.
//! The base backup itself is the primary's `EngineBackup`, read through the primary's seam;
//! a crash while the primary begins one (its checkpoint) is scheduled the same way.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use roost::config::Config;
use roost::pipeline::{Engine, EngineOptions};
use roost::replica::base_backup::EngineBackup;
use roost::replica::cut::Cutter;
use roost::replica::reseed::{reseed_with, resume_with};
use roost_replication::{
    Entry, FollowerLog, SnapshotDone, SnapshotFile, SnapshotSink, SnapshotSource,
};
use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_tests::*;
use serde_json::json;

const SHARDS: [&str; 2] = ["s1", "s2"];

/// A base backup as the primary sent it: each file and its bytes, and the lsn the
/// standby's log starts at.
struct Backup {
    files: Vec<(SnapshotFile, Vec<u8>)>,
    wal_from: u64,
}

/// Batch `i` of a history `tag`: creates over both shards, every fourth a delete.
fn batch(tag: &str, i: u64) -> roost::batch::Batch {
    let v = if i % 4 == 3 {
        json!({"request_key": format!("{tag}{i}"), "ops": [
            {"op": "delete", "shard": SHARDS[0], "id": 1}]})
    } else {
        json!({"request_key": format!("{tag}{i}"), "ops": [
            {"op": "create", "shard": SHARDS[(i % 2) as usize], "record": {tag: i}},
            {"op": "create", "shard": SHARDS[0], "record": {"j": i, "t": tag}}]})
    };
    parse(&v)
}

fn run(e: &Engine, tag: &str, range: std::ops::Range<u64>) {
    for i in range {
        e.one_file(&batch(tag, i), &format!("{tag}{i}.json"))
            .expect("submit");
    }
    e.sync().expect("sync");
}

/// The WAL records of `e` from `from` on, as a standby fetches them.
fn entries(e: &Engine, from: u64) -> Vec<Entry> {
    let end = e.wal().synced_lsn() + 1;
    let recs = e.wal().read_from(from, end, usize::MAX).expect("read");
    recs.into_iter()
        .map(|r| Entry {
            lsn: r.lsn,
            epoch: r.epoch,
            kind: r.record_type,
            payload: r.payload,
        })
        .collect()
}

/// The primary: 6 batches, a base backup (its checkpoint), 6 more; its records from the
/// backup's lsn on.
fn primary() -> (SimStorage, Backup, Vec<Entry>) {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("primary");
    run(&e, "p", 0..6);
    let mut src = EngineBackup::begin(&e, "standby").expect("begin a base backup");
    let mut files = Vec::new();
    while let Some(f) = src.next_file().expect("next file") {
        let mut bytes = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = src.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..n]);
        }
        assert_eq!(bytes.len() as u64, f.len, "{}", f.path);
        files.push((f, bytes));
    }
    let wal_from = src.wal_from();
    drop(src);
    assert!(wal_from > 1, "the backup starts past lsn {wal_from}");
    assert!(files.iter().any(|(f, _)| f.path.starts_with("shards/")));
    run(&e, "p", 6..12);
    let rest = entries(&e, wal_from);
    drop(e);
    (disk, Backup { files, wal_from }, rest)
}

/// The standby's own earlier history, which the backup replaces: 5 batches of its own.
fn old_standby() -> SimStorage {
    let disk = SimStorage::new();
    run(&open_engine(&disk, no_crash()).expect("old"), "o", 0..5);
    disk
}

fn standby_config() -> Config {
    let mut c = test_config();
    c.replication.follow = Some("127.0.0.1:9".into());
    c
}

/// Writes `b` into `sink` as the protocol does.
fn send(
    b: &Backup,
    sink: &mut dyn SnapshotSink,
) -> Result<SnapshotDone, roost::error::EngineError> {
    let err = |e: String| roost::error::EngineError::Replication(e);
    for (f, bytes) in &b.files {
        sink.begin_file(f).map_err(err)?;
        for piece in bytes.chunks(1000) {
            sink.write(piece).map_err(err)?;
        }
        sink.end_file().map_err(err)?;
    }
    Ok(SnapshotDone {
        leader_epoch: 1,
        wal_from: b.wal_from,
        files: b.files.len() as u32,
        bytes: b.files.iter().map(|(_, x)| x.len() as u64).sum(),
    })
}

fn reseed(disk: &SimStorage, b: &Backup) -> Result<SnapshotDone, roost::error::EngineError> {
    reseed_with(Arc::new(disk.clone()), &standby_config(), |sink| {
        send(b, sink)
    })
}

/// A start as `roost serve` makes it: an interrupted install finished (or a partial
/// backup removed), the cut past the WAL's end, the engine open as a standby.
fn open_standby(disk: &SimStorage) -> Engine {
    let cfg = standby_config();
    resume_with(disk, &cfg).expect("resume");
    let cut = Cutter::open_with(Arc::new(disk.clone()), &cfg).expect("cutter");
    cut.cut_past_end().expect("cut past end");
    drop(cut);
    Engine::open(EngineOptions {
        storage: Arc::new(disk.clone()),
        config: Arc::new(cfg),
        crash: no_crash(),
        log_role: Arc::new(roost::replica::Opener::default()),
    })
    .expect("open standby")
}

/// Applies `entries` from the standby's WAL end on, 3 records at a time.
fn apply(e: &Engine, entries: &[Entry]) {
    let from = e.wal().next_lsn();
    let rest: Vec<Entry> = entries.iter().filter(|x| x.lsn >= from).cloned().collect();
    for c in rest.chunks(3) {
        e.standby().apply_replicated(c).expect("apply");
    }
}

/// What a standby holds: records (lsn, epoch, type, payload) from `from` on, shard contents,
/// each claim's audit rows.
type State = (
    Vec<(u64, u32, u8, Vec<u8>)>,
    Contents,
    BTreeMap<u64, Vec<u32>>,
);

fn state(disk: &SimStorage, from: u64) -> State {
    let w = roost_wal::Wal::open_with(
        Arc::new(disk.clone()),
        data_dir().join("wal"),
        roost_wal::WalOptions {
            read_only: true,
            ..roost_wal::WalOptions::default()
        },
    )
    .expect("wal");
    let recs = w
        .replay(from.max(w.first_lsn()))
        .map(|r| r.expect("record"))
        .map(|r| (r.lsn, r.epoch, r.record_type, r.payload))
        .collect();
    let mut audit: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for (_, row) in audit_rows(Arc::new(disk.clone()), &data_dir()) {
        audit.entry(row.claim_lsn).or_default().push(row.op_index);
    }
    (recs, contents(disk, &SHARDS), audit)
}

fn verified(disk: &SimStorage, what: &str) {
    let report = roost::ops::verify::verify(Arc::new(disk.clone()), &data_dir());
    assert!(report.ok(), "{what}: {:?}", report.violations);
}

/// A disk holding what `base` holds, all of it durable, its counters at zero.
fn copy_of(base: &SimStorage, faults: SimFaults) -> SimStorage {
    let d = SimStorage::new();
    for p in base.paths() {
        d.put_file_bytes(&p, base.file_bytes(&p).expect("bytes"));
    }
    d.set_faults(faults);
    d
}

/// The crash modes of one schedule step `n`: the process stopped after `n` changing calls,
/// or the power lost after `n` syncs (dropped or torn), each on a copy of `base`.
fn crashed(base: &SimStorage, n: u64, run_on: impl Fn(&SimStorage)) -> Vec<(String, SimStorage)> {
    let mut out = Vec::new();
    let stop = SimFaults {
        stop_after_ops: Some(n),
        ..SimFaults::default()
    };
    let freeze = SimFaults {
        freeze_after_syncs: Some(n),
        ..SimFaults::default()
    };
    for (faults, modes) in [
        (stop, vec![CrashMode::Process]),
        (
            freeze,
            vec![CrashMode::PowerDrop, CrashMode::PowerTear { seed: n }],
        ),
    ] {
        let disk = copy_of(base, faults.clone());
        run_on(&disk);
        for m in modes {
            out.push((format!("{m:?} at {n} ({faults:?})"), disk.crash(m)));
        }
    }
    out
}

/// Goal: see the module comment, for the re-seed. Method: the standby's old state and the
/// primary's backup; count the changing calls and syncs of a whole re-seed; for every n,
/// crash there, start again: the old state whole (then a second re-seed, as the follower
/// would ask for one again) or the backup whole, then fetch the primary's records.
#[test]
fn a_crash_at_every_step_of_a_reseed_leaves_the_old_state_or_the_backup() {
    let (pdisk, backup, rest) = primary();
    let old = old_standby();
    let old_state = state(&old, 1);
    let whole = copy_of(&old, SimFaults::default());
    reseed(&whole, &backup).expect("a whole re-seed");
    let (ops, syncs) = (whole.op_count(), whole.sync_count());
    assert!(
        ops > 30 && syncs > 10,
        "a re-seed makes {ops} calls, {syncs} syncs"
    );
    apply(&open_standby(&whole), &rest);
    let want = state(&pdisk, backup.wal_from);
    assert_eq!(state(&whole, backup.wal_from), want, "a clean re-seed");
    let (mut old_kept, mut installed) = (0, 0);
    for n in 0..ops.max(syncs) {
        let start = |d: &SimStorage| {
            let _ = reseed(d, &backup);
        };
        for (what, after) in crashed(&old, n, start) {
            resume_with(&after, &standby_config()).expect("resume");
            if state(&after, 1) == old_state {
                verified(&after, &what);
                old_kept += 1;
                reseed(&after, &backup).unwrap_or_else(|e| panic!("{what}: again: {e}"));
            } else {
                installed += 1;
            }
            apply(&open_standby(&after), &rest);
            assert_eq!(state(&after, backup.wal_from), want, "{what}");
            verified(&after, &what);
        }
    }
    println!("re-seed: {ops} changing calls, {syncs} syncs; {old_kept} runs kept the old state, {installed} the backup");
    assert!(
        old_kept > 10 && installed > 10,
        "old {old_kept}, installed {installed}"
    );
}

/// A standby that applied all of `entries` (stopped: its effects in the page cache).
fn standby_of(entries: &[Entry]) -> SimStorage {
    let disk = SimStorage::new();
    apply(&open_standby(&disk), entries);
    disk
}

/// Opens the cutter on `disk` and reconciles with a primary whose log ends before `keep`.
fn cut(disk: &SimStorage, keep: u64) -> Result<(), roost::error::EngineError> {
    let cutter = Cutter::open_with(Arc::new(disk.clone()), &standby_config())?;
    cutter.cut_past_end()?;
    cutter.truncate_to(keep)
}

/// Goal: see the module comment, for the cut. Method: a standby that applied 12 batches of
/// a primary whose successor holds only the records before `keep` (the middle claim);
/// count the changing calls and syncs of the cut; for every n, crash there, start again and
/// cut again (the follower reconciles again), then fetch the successor's records: the
/// standby holds exactly what a standby that only ever applied those holds.
#[test]
fn a_crash_at_every_step_of_a_cut_leaves_the_primarys_prefix() {
    let full: Vec<Entry> = {
        let disk = SimStorage::new();
        let e = open_engine(&disk, no_crash()).expect("primary");
        run(&e, "p", 0..12);
        entries(&e, 1)
    };
    // The primary writes `done` records after a run of claims: the cut goes through the
    // middle claim, so that claims (and their effects) go with it.
    let claims: Vec<u64> = full
        .iter()
        .filter(|e| e.kind == roost::pipeline::records::RecordType::Claim as u8)
        .map(|e| e.lsn)
        .collect();
    let keep = claims[claims.len() / 2];
    let prefix: Vec<Entry> = full.iter().filter(|x| x.lsn < keep).cloned().collect();
    let reference = SimStorage::new();
    apply(&open_standby(&reference), &prefix);
    let want = state(&reference, 1);
    let base = standby_of(&full);
    assert_ne!(
        contents(&base, &SHARDS),
        want.1,
        "the standby holds effects to cut"
    );
    let whole = copy_of(&base, SimFaults::default());
    cut(&whole, keep).expect("a whole cut");
    let (ops, syncs) = (whole.op_count(), whole.sync_count());
    assert!(
        ops > 5 && syncs > 3,
        "a cut makes {ops} calls, {syncs} syncs"
    );
    apply(&open_standby(&whole), &prefix);
    assert_eq!(state(&whole, 1), want, "a clean cut");
    let mut runs = 0;
    for n in 0..ops.max(syncs) {
        let start = |d: &SimStorage| {
            let _ = cut(d, keep);
        };
        for (what, after) in crashed(&base, n, start) {
            cut(&after, keep).unwrap_or_else(|e| panic!("{what}: cut again: {e}"));
            apply(&open_standby(&after), &prefix);
            assert_eq!(state(&after, 1), want, "{what}");
            verified(&after, &what);
            runs += 1;
        }
    }
    println!("cut from lsn {keep}: {ops} changing calls, {syncs} syncs, {runs} runs");
    assert!(runs > 30, "only {runs} runs");
}

/// Goal: a crash while the primary begins a base backup (it takes a checkpoint first)
/// loses nothing: the primary opens again with its shards and audit rows, verify clean, and
/// a backup begins. Method: a primary with 6 batches; count the changing calls and syncs of
/// `EngineBackup::begin`; for every n, stop the process or lose the power there.
#[test]
fn a_crash_at_every_step_of_a_base_backup_keeps_the_primary_whole() {
    let base = SimStorage::new();
    run(&open_engine(&base, no_crash()).expect("primary"), "p", 0..6);
    let want = state(&base, 1);
    let whole = copy_of(&base, SimFaults::default());
    let e = open_engine(&whole, no_crash()).expect("open");
    let (ops0, syncs0) = (whole.op_count(), whole.sync_count());
    drop(EngineBackup::begin(&e, "standby").expect("a whole backup"));
    let (ops, syncs) = (whole.op_count() - ops0, whole.sync_count() - syncs0);
    assert!(
        ops > 5 && syncs > 2,
        "a backup's start makes {ops} calls, {syncs} syncs"
    );
    drop(e);
    let mut runs = 0;
    for n in 0..ops.max(syncs) {
        for (mode, power) in [
            (CrashMode::Process, false),
            (CrashMode::PowerDrop, true),
            (CrashMode::PowerTear { seed: n }, true),
        ] {
            let d = copy_of(&base, SimFaults::default());
            let e = open_engine(&d, no_crash()).expect("open");
            d.set_faults(SimFaults {
                stop_after_ops: (!power).then(|| d.op_count() + n),
                freeze_after_syncs: power.then(|| d.sync_count() + n),
                ..SimFaults::default()
            });
            let _ = EngineBackup::begin(&e, "standby").map(drop);
            drop(e);
            let after = d.crash(mode);
            let what = format!("{mode:?} at {n}");
            let e = open_engine(&after, no_crash()).unwrap_or_else(|err| panic!("{what}: {err}"));
            EngineBackup::begin(&e, "standby").unwrap_or_else(|err| panic!("{what}: {err}"));
            drop(e);
            let (_, shards, audit) = state(&after, 1);
            assert_eq!((shards, audit), (want.1.clone(), want.2.clone()), "{what}");
            verified(&after, &what);
            runs += 1;
        }
    }
    println!("base backup: {ops} changing calls, {syncs} syncs, {runs} runs");
    assert!(runs > 15, "only {runs} runs");
}

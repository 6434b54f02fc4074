//! Idle shards give back their maps and file descriptors (issue 25, item 3): a shard idle
//! past `shard_idle_close_ms` is closed by its owner, the next batch naming it reopens it
//! transparently (a delete's existence check included), and a crash at any moment after
//! recovers every answered batch. On a real directory the process's descriptors are counted;
//! on the simulated disk the crashes are a process kill and a power loss.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roost::batch::{Batch, BatchResult, Status};
use roost::config::Config;
use roost::pipeline::{Engine, EngineOptions};
use roost_storage::{CrashMode, RealStorage, SimStorage};
use roost_tests::*;
use serde_json::json;

/// The idle close of these tests (the smallest the configuration takes).
const IDLE_MS: u64 = 100;

fn idle_config(c: &mut Config) {
    c.shard_idle_close_ms = IDLE_MS;
}

fn creates(key: &str, shard: &str, n: usize) -> Batch {
    let ops: Vec<_> = (0..n)
        .map(|i| json!({"op": "create", "shard": shard, "record": {"k": key, "i": i}}))
        .collect();
    parse(&json!({"request_key": key, "ops": ops}))
}

fn delete(key: &str, shard: &str, id: u64) -> Batch {
    parse(&json!({"request_key": key, "ops": [{"op": "delete", "shard": shard, "id": id}]}))
}

/// The ids a committed batch's ops name.
fn ids(r: &BatchResult) -> Vec<u64> {
    match r {
        BatchResult::Committed { ops, .. } => ops.iter().map(|o| o.id).collect(),
        other => panic!("expected a commit, got {other:?}"),
    }
}

/// Runs the durability round the serve loop would (a shard closes only once everything it
/// holds is flushed), then waits (up to 10 s) until `closed()` holds: the pool's tick
/// closes an idle shard. On the simulated disk (`sim`) its clock is moved as the wait goes
/// (the idle time and the tick run by it; a real directory's clock moves by itself).
fn wait_closed(e: &Engine, sim: Option<&SimStorage>, what: &str, closed: impl Fn() -> bool) {
    if let Err(err) = e.settle() {
        panic!("durability round: {err}");
    }
    let until = Instant::now() + Duration::from_secs(10);
    while !closed() {
        assert!(Instant::now() < until, "{what}: never closed while idle");
        if let Some(disk) = sim {
            disk.advance(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// File descriptors of this process open on a file under `dir`.
fn fds_under(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    rd.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

fn is_open(e: &Engine, shard: &str) -> bool {
    e.shards().figures().get(shard).is_some_and(|f| f.open)
}

/// Goal: an idle shard holds no file descriptor, and once used again answers as it would
/// have open. Method: the engine on a real temporary directory with `shard_idle_close_ms =
/// 100`; a batch creates three records on shard `s`, whose segment, spare and lock are then
/// open; once idle, no descriptor of this process points into `shards/s` and the engine
/// says it is closed, its record count kept. Then a delete of an existing id commits (the
/// planner's existence check reopens it), a delete of an id never on it is rejected, a
/// create commits, and the shard read as `roost get` reads it holds exactly what the
/// answers say; it closes again when idle.
#[test]
fn an_idle_shard_holds_no_descriptor_and_reopens_for_the_next_batch() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut cfg = test_config();
    cfg.data_dir = tmp.path().join("data");
    idle_config(&mut cfg);
    let shard_dir = cfg.data_dir.join("shards").join("s");
    let e = Engine::open(EngineOptions {
        storage: RealStorage::shared(),
        config: Arc::new(cfg),
        crash: no_crash(),
        log_role: std::sync::Arc::new(roost::replica::Opener::default()),
    })
    .expect("open");
    let made = ids(&e
        .one_detached(&creates("a", "s", 3), "bulk/f/1")
        .expect("a"));
    assert!(fds_under(&shard_dir) >= 2, "segment and lock open in use");
    wait_closed(&e, None, "s", || fds_under(&shard_dir) == 0);
    assert!(!is_open(&e, "s"), "the engine says s is closed");
    assert_eq!(
        e.shards().figures().get("s").map(|f| f.records),
        Some(3),
        "count kept while closed"
    );
    assert_eq!(e.figures().shards_open, 0);

    let d = e.one_detached(&delete("b", "s", made[1]), "bulk/f/2");
    assert_eq!(d.expect("b").status(), Status::Committed, "the id exists");
    assert!(is_open(&e, "s") && fds_under(&shard_dir) >= 2, "reopened");
    wait_closed(&e, None, "s again", || fds_under(&shard_dir) == 0);
    let never = e.one_detached(&delete("c", "s", 999_999), "bulk/f/3");
    assert!(
        matches!(never.expect("c"), BatchResult::Rejected { op_index: 0, .. }),
        "a delete of an id never created is rejected on a reopened shard"
    );
    let more = ids(&e
        .one_detached(&creates("d", "s", 1), "bulk/f/4")
        .expect("d"));
    assert!(more[0] > made[2], "ids go on from the largest");
    wait_closed(&e, None, "s a third time", || !is_open(&e, "s"));
    let live: Vec<u64> = roost_shards::Shard::open_with(
        RealStorage::shared(),
        &shard_dir,
        roost_shards::ShardOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .expect("read s")
    .scan()
    .expect("scan")
    .into_iter()
    .map(|(id, _)| id)
    .collect();
    assert_eq!(live, vec![made[0], made[2], more[0]]);
    assert_eq!(e.shards().figures().get("s").map(|f| f.records), Some(3));
}

/// The records of shard `s` on `disk`, by id.
fn ids_on(disk: &SimStorage, shard: &str) -> Vec<u64> {
    contents(disk, &[shard])[shard].keys().copied().collect()
}

/// Goal: closing and reopening idle shards loses nothing a crash could take from an open
/// one. Method: on the simulated disk with `shard_idle_close_ms = 100`, batches on shards
/// `a` and `b`; both close while idle; a batch deleting one of `a`'s records and creating
/// on `a` runs on the reopened shard; then, with `a` open and `b` closed, the disk is
/// crashed as a process kill and as a power loss. Each copy reopens (recovery), holds
/// exactly the answered records, passes `roost verify`, and takes a new batch on both
/// shards; the live engine goes on too, its shards closing again.
#[test]
fn closed_and_reopened_shards_recover_after_a_process_kill_and_a_power_loss() {
    let disk = SimStorage::new();
    let e = open_engine_with(&disk, no_crash(), idle_config).expect("open");
    let on_a = ids(&e
        .one_detached(&creates("a1", "a", 2), "bulk/f/1")
        .expect("a1"));
    let on_b = ids(&e
        .one_detached(&creates("b1", "b", 2), "bulk/f/2")
        .expect("b1"));
    wait_closed(&e, Some(&disk), "a and b", || e.figures().shards_open == 0);
    let del = e.one_detached(&delete("a2", "a", on_a[0]), "bulk/f/3");
    assert_eq!(del.expect("a2").status(), Status::Committed);
    let late = ids(&e
        .one_detached(&creates("a3", "a", 1), "bulk/f/4")
        .expect("a3"));
    assert!(
        is_open(&e, "a") && !is_open(&e, "b"),
        "a reopened, b still closed"
    );
    let want_a = vec![on_a[1], late[0]];
    for mode in [CrashMode::Process, CrashMode::PowerDrop] {
        let copy = disk.crash(mode);
        let r = open_engine_with(&copy, no_crash(), idle_config)
            .unwrap_or_else(|err| panic!("{mode:?}: recovery failed: {err}"));
        let again = r.one_detached(&delete("a2", "a", on_a[0]), "bulk/f/3");
        assert_eq!(again.expect("a2 again").status(), Status::Committed);
        let next = r.one_detached(&creates("n", "b", 1), "bulk/f/5");
        assert_eq!(next.expect("n").status(), Status::Committed, "{mode:?}");
        drop(r);
        assert_eq!(ids_on(&copy, "a"), want_a, "{mode:?}");
        assert_eq!(ids_on(&copy, "b").len(), 3, "{mode:?}");
        assert!(ids_on(&copy, "b").starts_with(&on_b), "{mode:?}");
        let report = roost::ops::verify::verify(Arc::new(copy.clone()), &data_dir());
        assert!(report.ok(), "{mode:?}: {:?}", report.violations);
    }
    wait_closed(&e, Some(&disk), "a after its reopen", || {
        e.figures().shards_open == 0
    });
    let gone = e.one_detached(&delete("a4", "a", on_a[0]), "bulk/f/6");
    assert!(
        matches!(gone.expect("a4"), BatchResult::Rejected { .. }),
        "deleted before the close"
    );
    assert_eq!(ids_on(&disk, "a"), want_a);
}

/// What `status` reports as the shards' bytes on disk.
fn shard_bytes(e: &Engine) -> u64 {
    match e
        .disk_bytes()
        .into_iter()
        .find(|(part, _)| *part == "shards")
    {
        Some((_, b)) => b,
        None => panic!("status has no shards part"),
    }
}

/// Goal: a restart opens no shard it does not need (issue 44: lazy open), and a shard
/// opened later still never gets an id it holds. Method: on the simulated disk, batches
/// create on shards `a`, `b` and `c`; the engine settles, takes a checkpoint and is dropped.
/// Reopened, it has opened no shard (`figures` lists the shards opened since start); a
/// create on `c` opens `c` alone, and its id is above every id made before. The shards'
/// bytes on disk that `status` shows are the same before and after the restart.
#[test]
fn a_restart_opens_no_shard_until_a_batch_names_it() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let mut made = Vec::new();
    for shard in ["a", "b", "c"] {
        let key = format!("k-{shard}");
        made.extend(ids(&e
            .one_detached(&creates(&key, shard, 2), "bulk/f/1")
            .expect("create")));
    }
    e.settle().expect("settle");
    e.checkpoint().expect("checkpoint");
    let on_disk = shard_bytes(&e);
    assert!(on_disk > 0, "the three shards take disk");
    drop(e);
    let r = open_engine(&disk, no_crash()).expect("reopen");
    let opened: Vec<String> = r.shards().figures().into_keys().collect();
    assert!(
        opened.is_empty(),
        "shards opened by the restart: {opened:?}"
    );
    assert_eq!(
        shard_bytes(&r),
        on_disk,
        "status counts the shards not opened too"
    );
    let next = ids(&r
        .one_detached(&creates("k-next", "c", 1), "bulk/f/2")
        .expect("next"));
    let opened: Vec<String> = r.shards().figures().into_keys().collect();
    assert_eq!(opened, vec!["c".to_owned()]);
    let largest = made.iter().copied().max().expect("ids");
    assert!(next[0] > largest, "id {} after {largest}", next[0]);
}

/// Goal: ids stay unique even when the id counter a restart resumes from is behind a
/// shard's records (the counter is the checkpoint's; a shard's largest id is folded in when
/// the shard opens, before any id is minted). Method: records on shard `a`, a checkpoint
/// past them, and then the `CHECKPOINT` file's counter rewritten to 1 (its checksum made
/// anew); after the restart a create on `a` must get an id above all of `a`'s, and `a`
/// then holds every id once.
#[test]
fn a_counter_behind_a_shard_never_mints_an_id_it_holds() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let made = ids(&e
        .one_detached(&creates("k1", "a", 3), "bulk/f/1")
        .expect("k1"));
    e.settle().expect("settle");
    let last = e.last_lsn();
    e.checkpoint().expect("checkpoint");
    drop(e);
    let path = data_dir().join("CHECKPOINT");
    let bytes = disk.file_bytes(&path).expect("a checkpoint file");
    let mut ckpt = roost::pipeline::records::decode_checkpoint(&bytes).expect("decode");
    assert!(ckpt.wal_from > last, "the checkpoint is past every claim");
    assert!(ckpt.next_id > made[2], "the counter as written");
    ckpt.next_id = 1;
    let behind = roost::pipeline::records::encode_checkpoint(&ckpt).expect("encode");
    disk.put_file_bytes(&path, behind);
    let r = open_engine(&disk, no_crash()).expect("reopen");
    let next = ids(&r
        .one_detached(&creates("k2", "a", 2), "bulk/f/2")
        .expect("k2"));
    assert!(
        next[0] > made[2],
        "minted {next:?} on a shard holding {made:?}"
    );
    r.settle().expect("settle");
    drop(r);
    let want: Vec<u64> = made.iter().chain(&next).copied().collect();
    assert_eq!(ids_on(&disk, "a"), want);
}

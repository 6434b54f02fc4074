//! The durability tail in rounds shared across groups (issue 30, "not slower";
//! `engine/src/pipeline/settle.rs`): answers never wait for a round, a round settles every
//! claim answered since the last (each touched shard flushed once, one audit sync, the
//! `done` records), what needs a claim closed runs the round itself, and a crash anywhere
//! among several batches waiting for their round keeps every invariant.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use roost::batch::{Batch, BatchResult, Status};
use roost::pipeline::crash::NthCrash;
use roost::pipeline::records::WalEntry;
use roost::pipeline::Engine;
use roost_storage::{CrashMode, SimStorage, Storage};
use roost_tests::*;
use serde_json::json;

const SHARDS: &[&str] = &["s1", "s2"];

fn dones(disk: &SimStorage) -> usize {
    wal_entries(Arc::new(disk.clone()), &data_dir())
        .iter()
        .filter(|(_, e)| matches!(e, WalEntry::Done(_)))
        .count()
}

fn figures(e: &Engine) -> (u64, u64, u64, u64) {
    let s = &e.stats;
    (
        s.tail_rounds.load(Ordering::Relaxed),
        s.tail_settled.load(Ordering::Relaxed),
        s.tail_waiting.load(Ordering::Relaxed),
        s.shard_flushes.load(Ordering::Relaxed),
    )
}

/// Runs `f` on a thread and waits at most 20 s for it: a step that waits for a round that
/// never comes fails here instead of hanging the suite.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: still waiting after 20 s"))
}

/// Goal: under the default configuration a batch's answer does not wait for its tail, and
/// one round settles every batch answered since the last: each touched shard flushed once,
/// the `done` records of all of them.
/// Method: five batches over two shards, each answered; nothing flushed and no `done`
/// record yet; one round; then two flushes (one per shard, not ten) and five `done`s.
#[test]
fn one_round_settles_every_batch_answered_since_the_last_with_one_flush_per_shard() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    assert_eq!(
        e.config().tail_round_claims,
        64,
        "the default configuration"
    );
    for i in 0..5 {
        let b = parse(&create_on(&format!("k{i}"), SHARDS));
        let r = e.one_file(&b, &format!("f{i}.json")).expect("batch");
        assert_eq!(r.status(), Status::Committed);
        assert!(visible_result(&disk, &format!("f{i}.json"))
            .unwrap()
            .is_some());
    }
    assert_eq!(figures(&e), (0, 0, 5, 0), "answered, none settled yet");
    assert_eq!(dones(&disk), 0, "no done record before the round");
    // Work waits: with no progress allowed at all, the watchdog must not call this healthy.
    assert!(!e.healthy(Duration::ZERO), "batches wait for a round");
    assert_eq!(e.settle().expect("round"), 5);
    assert_eq!(figures(&e), (1, 5, 0, 2), "one round, one flush per shard");
    assert!(e.healthy(Duration::ZERO), "nothing waits");
    assert_eq!(dones(&disk), 5);
    assert_eq!(e.settle().expect("nothing waits"), 0);
}

/// Goal: what waits for a round is bounded by `tail_round_claims`: the worker that hands in
/// the last claim of the count runs the round.
/// Method: `tail_round_claims = 3`, four batches: the third runs a round of three, the
/// fourth waits.
#[test]
fn the_batch_that_fills_the_count_runs_the_round() {
    let disk = SimStorage::new();
    let e = open_engine_with(&disk, no_crash(), |c| c.tail_round_claims = 3).expect("open");
    for i in 0..4 {
        let b = parse(&create_on(&format!("k{i}"), &["s1"]));
        e.one_file(&b, &format!("f{i}.json")).expect("batch");
        let (rounds, settled, waiting, _) = figures(&e);
        let want = if i < 2 { (0, 0, i + 1) } else { (1, 3, i - 2) };
        assert_eq!((rounds, settled, waiting), want, "after batch {i}");
    }
}

/// Goal: a duplicate of a batch answered and waiting for its round gets the original answer
/// at once, without a round.
#[test]
fn a_duplicate_is_answered_before_the_round() {
    let disk = SimStorage::new();
    let e = Arc::new(open_engine(&disk, no_crash()).expect("open"));
    let b = parse(&create_on("k", SHARDS));
    let first = e.one_file(&b, "a.json").expect("first");
    let e2 = e.clone();
    let again = within("the duplicate", move || e2.one_file(&b, "b.json"));
    let again = again.expect("duplicate");
    assert_eq!(again.status(), Status::Committed);
    assert_eq!(again.ops(), first.ops(), "the original ids");
    assert_eq!(e.stats.duplicate.load(Ordering::Relaxed), 1);
    assert_eq!(figures(&e).0, 0, "no round was needed");
}

/// Goal: a spool name reused while the earlier batch under it waits for its round runs that
/// round first (its `done` durable), so a power loss after the later answer never lets
/// recovery finish the earlier batch again and bring back its answer, consumed long since.
/// Method: X answered as `n.json` (waiting), its answer consumed; Y under `n.json`
/// answered, its answer consumed too; power loss: X's `done` is in the WAL, and recovery
/// does not bring X's answer back. (Y's own `done` waits for its round: a power loss may
/// finish Y again and publish its answer again, the same bytes, as a `done` not yet synced
/// always could.)
#[test]
fn a_reused_name_runs_the_round_its_earlier_batch_waits_for() {
    let disk = SimStorage::new();
    let e = Arc::new(open_engine(&disk, no_crash()).expect("open"));
    let x = parse(&create_on("x", &["s1"]));
    let rx = e.one_file(&x, "n.json").expect("x");
    let out = data_dir().join("spool").join("out");
    disk.remove(&out.join("n.json")).expect("consume");
    disk.sync_dir(&out).expect("sync out/");
    let y = parse(&create_on("y", &["s2"]));
    let e2 = e.clone();
    let ry = within("the reused name", move || e2.one_file(&y, "n.json")).expect("y");
    assert_eq!(ry.request_key(), Some("y"));
    assert_eq!(figures(&e).0, 1, "x's round ran before y's answer");
    disk.remove(&out.join("n.json")).expect("consume y's");
    disk.sync_dir(&out).expect("sync out/");
    drop(e);
    let after = disk.crash(CrashMode::PowerDrop);
    let x_lsn = match rx {
        BatchResult::Committed { lsn, .. } => lsn,
        other => panic!("x: {other:?}"),
    };
    let x_done = wal_entries(Arc::new(after.clone()), &data_dir())
        .iter()
        .any(|(_, e)| matches!(e, WalEntry::Done(d) if d.claim_lsn == x_lsn));
    assert!(x_done, "x's done was not durable before y's answer");
    drop(open_engine(&after, no_crash()).expect("recovery"));
    let back = visible_result(&after, "n.json").unwrap();
    assert!(
        back.as_ref().and_then(|r| r.request_key()) != Some("x"),
        "x's consumed answer came back: {back:?}"
    );
}

/// Goal: the serve loop's round (`Engine::settle_due`) comes once the oldest claim waiting
/// has waited `tail_round_ms` by the storage's clock, not by the real one: on the simulated
/// disk nothing comes due while its clock stands still, however long the test really waits,
/// and it is due the moment the clock has moved `tail_round_ms`, with no real wait.
/// Method: a batch answered, its claim waiting; a real sleep of twice `tail_round_ms`;
/// the clock moved one millisecond short of it, then by that millisecond; a round.
#[test]
fn a_round_comes_due_by_the_storage_clock_not_the_real_one() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let wait = Duration::from_millis(e.config().tail_round_ms);
    assert!(!e.settle_due(), "nothing waits");
    let b = parse(&create_on("k", SHARDS));
    e.one_file(&b, "f.json").expect("batch");
    assert_eq!(figures(&e).2, 1, "the claim waits for its round");
    assert!(!e.settle_due(), "just handed in");
    std::thread::sleep(wait * 2);
    assert!(
        !e.settle_due(),
        "due after a real wait, with the disk's clock standing still"
    );
    disk.advance(wait - Duration::from_millis(1));
    assert!(!e.settle_due(), "due a millisecond early");
    disk.advance(Duration::from_millis(1));
    assert!(e.settle_due(), "not due once the clock moved tail_round_ms");
    assert_eq!(e.settle().expect("round"), 1);
    assert!(!e.settle_due(), "nothing waits after the round");
}

fn c(shard: &str, tag: &str) -> serde_json::Value {
    json!({"op": "create", "shard": shard, "record": {"tag": tag}})
}

/// The sequence the crash schedule runs: creates and a delete over two shards, a reused
/// name (`r0.json` twice, its first answer consumed in between) and a duplicate
/// (`dup.json`, the batch of `r1.json`). With `tail_round_claims = 3`, the reuse runs the
/// round its first batch waits for, the fourth batch runs one of three, and the duplicate
/// waits for the last.
fn sequence() -> Vec<(Batch, &'static str)> {
    sequence_json()
        .into_iter()
        .map(|(v, name)| (parse(&v), name))
        .collect()
}

/// [`sequence`] as the JSON the client drops into `new/`.
fn sequence_json() -> Vec<(serde_json::Value, &'static str)> {
    let b = |key: &str, ops: Vec<serde_json::Value>| json!({"request_key": key, "ops": ops});
    let del = json!({"op": "delete", "shard": "s1", "id": 1});
    vec![
        (b("q0", vec![c("s1", "a"), c("s2", "b")]), "r0.json"),
        (b("q3", vec![c("s1", "e"), c("s2", "f")]), "r0.json"),
        (b("q1", vec![c("s2", "c")]), "r1.json"),
        (b("q2", vec![c("s1", "d"), del]), "r2.json"),
        (b("q1", vec![c("s2", "c")]), "dup.json"),
    ]
}

fn tuned(disk: &SimStorage, crash: Arc<dyn roost::pipeline::crash::CrashHook>) -> Engine {
    open_engine_with(disk, crash, |c| c.tail_round_claims = 3).expect("open")
}

/// Runs the sequence and the last round; the answers by request key (a duplicate's too).
/// The client consumes `out/r0.json` before it reuses the name; `done` counts the batches
/// answered (so whether that answer was consumed before a crash).
fn run_sequence(
    disk: &SimStorage,
    e: &Engine,
    done: &AtomicUsize,
) -> Result<Vec<(String, BatchResult)>, roost::error::EngineError> {
    let mut answers = Vec::new();
    let new = data_dir().join("spool").join("new");
    for (i, ((b, name), (v, _))) in sequence().into_iter().zip(sequence_json()).enumerate() {
        // The client drops `new/NAME` (durably), as `roost submit` does.
        disk.put_file_bytes(&new.join(name), v.to_string().into_bytes());
        answers.push((b.request_key.clone(), e.one_file(&b, name)?));
        done.store(i + 1, Ordering::SeqCst);
        if i == 0 {
            let out = data_dir().join("spool").join("out");
            disk.remove(&out.join(name)).expect("consume");
            disk.sync_dir(&out).expect("sync out/");
        }
    }
    e.settle()?;
    Ok(answers)
}

/// [`run_sequence`] on a tuned engine over `disk`, within 20 s; and how many batches were
/// answered.
fn bounded(
    disk: &SimStorage,
    crash: Arc<dyn roost::pipeline::crash::CrashHook>,
) -> (Result<Vec<(String, BatchResult)>, String>, usize) {
    let disk = disk.clone();
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    let r = within("the sequence", move || {
        run_sequence(&disk, &tuned(&disk, crash), &d).map_err(|e| e.to_string())
    });
    (r, done.load(Ordering::SeqCst))
}

/// What a client could see in `out/` now, by request key.
fn visible(disk: &SimStorage) -> BTreeMap<String, BatchResult> {
    let mut seen = BTreeMap::new();
    for name in ["r0.json", "r1.json", "r2.json", "dup.json"] {
        if let Some(r) = visible_result(disk, name).expect("whole result") {
            seen.insert(r.request_key().expect("a key").to_owned(), r);
        }
    }
    seen
}

/// The shards after the whole sequence, from its answers: the base (id 1 on s1) minus the
/// delete, plus each create under its answered id; and no audit row twice.
fn check_converged(disk: &SimStorage, answers: &[(String, BatchResult)]) -> Result<(), String> {
    let mut want: BTreeMap<String, BTreeMap<u64, Vec<u8>>> = BTreeMap::new();
    want.entry("s1".into())
        .or_default()
        .insert(1, br#"{"tag":"base"}"#.to_vec());
    for ((_, r), (b, _)) in answers.iter().zip(sequence()) {
        if r.status() != Status::Committed {
            return Err(format!("{:?} answered {r:?}", b.request_key));
        }
        for (op, res) in b.ops.iter().zip(r.ops()) {
            let m = want.entry(op.shard().to_owned()).or_default();
            match op {
                roost::batch::BatchOp::Create { record, .. } => {
                    m.insert(res.id, record.clone());
                }
                roost::batch::BatchOp::Delete { id, .. } => {
                    m.remove(id);
                }
            }
        }
    }
    let now = contents(disk, SHARDS);
    if now != want {
        return Err(format!("shards {now:?}, expected {want:?}"));
    }
    let mut rows = BTreeSet::new();
    for (_, row) in audit_rows(Arc::new(disk.clone()), &data_dir()) {
        if !rows.insert((row.claim_lsn, row.op_index)) {
            return Err(format!("audit row written twice: {row:?}"));
        }
    }
    let report = roost::ops::verify::verify(Arc::new(disk.clone()), Path::new(DATA));
    match report.ok() {
        true => Ok(()),
        false => Err(format!("verify: {:?}", report.violations)),
    }
}

fn base_disk() -> SimStorage {
    let disk = SimStorage::new();
    let e = tuned(&disk, no_crash());
    let base = parse(&json!({"request_key": "base", "ops": [c("s1", "base")]}));
    assert_eq!(e.one_file(&base, "base.json").expect("base").ops()[0].id, 1);
    e.settle().expect("round");
    disk
}

/// Goal: a crash at any point among several batches answered and waiting for their round,
/// during a round, or during the round a reused name runs, loses no answer a client saw and
/// makes no record twice.
/// Method: the sequence above with `tail_round_claims = 3`; a crash at every point it
/// reaches, each as a process crash, a power loss and a torn power loss; recovery; the
/// whole sequence again. Every answer seen before the crash is the retry's answer, the
/// shards are what the retry's answers say, no audit row is written twice, and `roost
/// verify` passes.
#[test]
fn a_crash_anywhere_among_batches_waiting_for_their_round_keeps_the_invariants() {
    let base = base_disk();
    let count = {
        let copy = base.crash(CrashMode::Process);
        let hook = Arc::new(NthCrash::new(None));
        let clean = bounded(&copy, hook.clone()).0.expect("clean run");
        check_converged(&copy, &clean).expect("the clean run");
        let names = hook.reached();
        assert_reached(
            &names,
            &[
                "after_flush.1",
                "after_audit_sync",
                "after_done",
                "after_result",
            ],
        );
        names.len() as u64
    };
    let mut failures = Vec::new();
    let mut seed = 0;
    for at in 1..=count {
        for mode in [
            CrashMode::Process,
            CrashMode::PowerDrop,
            CrashMode::PowerTear { seed },
        ] {
            seed += 1;
            let disk = base.crash(CrashMode::Process);
            let (crashed, answered) = bounded(&disk, Arc::new(NthCrash::new(Some(at))));
            assert!(crashed.is_err(), "crash point {at} not reached");
            let after = disk.crash(mode);
            let seen = visible(&after);
            // Recovery alone: q0's answer, consumed once q0 was answered, never comes back
            // (q3 reused its name only once q0's `done` was durable).
            drop(tuned(&after, no_crash()));
            let r0 = visible_result(&after, "r0.json").expect("whole result");
            if answered >= 1 && r0.as_ref().and_then(|r| r.request_key()) == Some("q0") {
                failures.push(format!(
                    "crash {at} {mode:?}: q0's consumed answer came back"
                ));
            }
            let retry = bounded(&after, no_crash())
                .0
                .unwrap_or_else(|err| panic!("retry after {at}: {err}"));
            if let Err(err) = check_converged(&after, &retry) {
                failures.push(format!("crash {at} {mode:?}: {err}"));
            }
            for (key, r) in &retry {
                if seen.get(key).is_some_and(|s| s != r) {
                    failures.push(format!(
                        "crash {at} {mode:?}: {key} was seen as {:?}, now {r:?}",
                        seen[key]
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} schedules failed, e.g. {}",
        failures.len(),
        3 * count,
        failures[0]
    );
    eprintln!("tail rounds: {} schedules", 3 * count);
}

//! The tests of `pipeline/owner.rs`.

use super::*;
use crate::error::ErrorClass;
use crate::pipeline::backup_gate::BackupGate;
use crate::pipeline::crash::NthCrash;
use roost_storage::SimStorage;

/// An owner over a simulated disk whose crash hook fails at its `crash_at`th point.
fn slot(crash_at: Option<u64>) -> ShardSlot {
    slot_on(&SimStorage::new(), crash_at, None)
}

/// [`slot`] on `disk`, its shard closed after `idle_close` idle.
fn slot_on(disk: &SimStorage, crash_at: Option<u64>, idle_close: Option<Duration>) -> ShardSlot {
    slot_with(disk, Arc::new(NthCrash::new(crash_at)), idle_close)
}

/// No tick asked for (a new cell asks for one): only a full tick, every
/// `FULL_TICK_EVERY` ticks, would run the shard on the pool unasked.
fn untick(s: &ShardSlot) {
    s.cell.tick.store(false, Ordering::Relaxed);
}

/// [`slot_on`] with its own crash hook.
fn slot_with(
    disk: &SimStorage,
    crash: Arc<dyn CrashHook>,
    idle_close: Option<Duration>,
) -> ShardSlot {
    let opener = ShardOpener {
        storage: Arc::new(disk.clone()),
        dir: PathBuf::from("/sim/s"),
        // As `ShardSet::slot` opens a shard recovery found nothing flushed on.
        opts: ShardOptions {
            synced_through_lsn: Some(0),
            ..ShardOptions::default()
        },
    };
    let shard = opener.open("s").expect("open");
    let clock = Clock::of(Arc::new(disk.clone()));
    let ctx = OwnerContext {
        pool: ShardPool::start(2, clock.clone()).expect("pool"),
        crash,
        stats: Arc::new(Stats::default()),
        opened: clock.now(),
        clock,
        horizon: Arc::new(AtomicU64::new(0)),
        gate: Arc::new(BackupGate::default()),
        compact_rate: 0,
        compact_dead: 0.5,
        idle_close,
    };
    ShardSlot::spawn("s", shard, opener, ctx)
}

/// One create per lsn, of id = lsn.
fn creates(lsns: &[u64]) -> Vec<Turn> {
    lsns.iter()
        .map(|&lsn| Turn {
            lsn,
            k: 0,
            ops: vec![TxnOp::Create {
                id: lsn,
                record: b"{}".to_vec(),
            }],
        })
        .collect()
}

const PATIENCE: Duration = Duration::from_secs(5);

/// The one answer to a message, within [`PATIENCE`] (`what` names it when none comes).
fn answer(rx: &mpsc::Receiver<Result<(), EngineError>>, what: &str) -> Result<(), EngineError> {
    rx.recv_timeout(PATIENCE)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn crashed(r: &Result<(), EngineError>) -> bool {
    matches!(r, Err(EngineError::Crashed(_)))
}

#[test]
fn one_message_applies_every_turn_in_lsn_order_and_answers_once() {
    let s = slot(None);
    let rx = s.send_apply(creates(&[3, 1, 2])).expect("send");
    let r = answer(&rx, "an answer");
    assert!(r.is_ok(), "{r:?}");
    for id in 1..=3 {
        assert!(s.contains(id).expect("contains"), "id {id}");
    }
    let rx = s.send_apply(Vec::new()).expect("send nothing");
    assert!(answer(&rx, "an answer to nothing").is_ok());
}

/// A crash hook that records the thread each point is reached on.
#[derive(Default)]
struct OnThread(Mutex<Vec<std::thread::ThreadId>>);

impl CrashHook for OnThread {
    fn hit(&self, _: CrashPoint) -> Result<(), EngineError> {
        lock(&self.0).push(std::thread::current().id());
        Ok(())
    }
}

/// Goal: an apply to a shard no pool thread has runs the owner's round on the caller's
/// thread (no pool thread woken), and its answer is there when `send_apply` returns;
/// other messages still go to the pool.
#[test]
fn an_apply_to_an_idle_shard_runs_on_the_callers_thread() {
    let hook = Arc::new(OnThread::default());
    let s = slot_with(&SimStorage::new(), hook.clone(), None);
    untick(&s);
    let me = std::thread::current().id();
    for lsn in 1..=3 {
        let rx = s.send_apply(creates(&[lsn])).expect("send");
        assert!(
            matches!(rx.try_recv(), Ok(Ok(()))),
            "lsn {lsn}: answered on return"
        );
    }
    let points = lock(&hook.0).clone();
    assert_eq!(points.len(), 3, "one commit point per apply");
    assert!(
        points.iter().all(|t| *t == me),
        "applied on the caller's thread"
    );
    let rx = s.send_flush(0).expect("flush");
    assert!(answer(&rx, "a flush").is_ok());
    let flushed_on = lock(&hook.0).last().copied();
    assert!(
        flushed_on.is_some_and(|t| t != me),
        "a flush runs on the pool"
    );
}

#[test]
fn a_failure_before_the_last_turn_answers_the_message() {
    // The second transaction's crash point fails: the third is never applied, and the
    // one reply (held by the third) carries the failure rather than never coming.
    let s = slot(Some(2));
    let rx = s.send_apply(creates(&[1, 2, 3])).expect("send");
    let r = answer(&rx, "an answer, not a hang");
    assert!(crashed(&r), "{r:?}");
    assert!(
        !s.contains(3).expect("contains"),
        "applied after the failure"
    );
    let rx = s.send_apply(creates(&[4])).expect("send after");
    let r = answer(&rx, "a dead owner answers");
    assert!(crashed(&r), "{r:?}");
    let rx = s.send_apply(Vec::new()).expect("send nothing after");
    let r = answer(&rx, "a dead owner answers nothing too");
    assert!(crashed(&r), "{r:?}");
}

#[test]
fn the_reply_waits_for_the_largest_lsn_whatever_the_message_order() {
    // Sent unordered; the third applied (lsn 3) fails: the answer is that failure, not
    // the success of whichever came last in the message.
    let s = slot(Some(3));
    let rx = s.send_apply(creates(&[3, 1, 2])).expect("send");
    let r = answer(&rx, "an answer");
    assert!(crashed(&r), "{r:?}");
    assert!(
        s.contains(2).expect("contains"),
        "lsn 2 applied before the failure"
    );
}

/// Waits until the owner says its shard is closed, moving `disk`'s clock a tick at a time
/// (the owner's idle time and the pool's tick run by it).
fn wait_closed(disk: &SimStorage, s: &ShardSlot) {
    let until = Instant::now() + PATIENCE;
    while s.stats().expect("stats").open {
        assert!(Instant::now() < until, "never closed while idle");
        disk.advance(TICK);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Goal: a shard's idle close runs by the storage's clock, not the real one: on the
/// simulated disk, a shard idle for ten times its `idle_close` in real time stays open
/// while the disk's clock stands still (rounds run on the pool meanwhile, each looking at
/// the idle close), and closes once the clock is moved past it.
#[test]
fn an_idle_close_waits_for_the_storage_clock() {
    let disk = SimStorage::new();
    let s = slot_on(&disk, None, Some(Duration::from_millis(20)));
    let rx = s.send_apply(creates(&[1])).expect("send");
    assert!(answer(&rx, "applied").is_ok());
    let rx = s.send_flush(0).expect("flush");
    assert!(answer(&rx, "flushed").is_ok());
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        // Each poll is a round on the pool, ending with the idle close's check.
        assert!(
            s.stats().expect("stats").open,
            "closed with the clock standing still"
        );
    }
    wait_closed(&disk, &s);
}

#[test]
fn a_shard_closed_while_idle_reopens_and_a_failed_reopen_keeps_its_class() {
    // Two frames applied and flushed, then the shard closes while idle, keeping its
    // figures; a read reopens it. Closed again, its first frame is damaged on disk: the
    // reopen finds damage below the lsn it closed at (corruption, not a torn tail), and
    // every asker gets it with class Corruption (exit 65), the apply and the read alike.
    let disk = SimStorage::new();
    let s = slot_on(&disk, None, Some(Duration::from_millis(20)));
    let rx = s.send_apply(creates(&[1, 2])).expect("send");
    assert!(answer(&rx, "applied").is_ok());
    let rx = s.send_flush(0).expect("flush");
    assert!(answer(&rx, "flushed").is_ok());
    wait_closed(&disk, &s);
    let kept = s.stats().expect("stats");
    assert_eq!((kept.records, kept.max_id, kept.open), (2, 2, false));
    assert!(s.contains(2).expect("reopened"), "answers as before");
    assert!(s.stats().expect("stats").open);
    wait_closed(&disk, &s);
    let seg = PathBuf::from("/sim/s/0000000001.seg");
    let mut bytes = disk.file_bytes(&seg).expect("segment");
    let at = bytes.windows(2).position(|w| w == b"{}").expect("frame 1");
    bytes[at] = b'[';
    disk.put_file_bytes(&seg, bytes);
    let rx = s.send_apply(creates(&[3])).expect("send after");
    let r = answer(&rx, "a failed reopen answers");
    assert!(
        r.as_ref()
            .is_err_and(|e| e.class() == ErrorClass::Corruption),
        "{r:?}"
    );
    let c = s.contains(1);
    assert!(
        c.as_ref()
            .is_err_and(|e| e.class() == ErrorClass::Corruption),
        "{c:?}"
    );
}

//! One owner thread per shard: the only code that touches a shard's mmap and files. Workers
//! talk to it by message. It applies transactions strictly in lsn order (the turns the planner
//! registered at claim time) and answers each once it is applied (readable, not yet durable).
//! Durability is a separate request: a worker asks for a flush once its result is published,
//! and the owner flushes once for every request of a round, so concurrent batches on one shard
//! share an msync + fdatasync (group flush) the way claims share WAL syncs. A batch's `done`
//! record is appended only after its flushes: until then recovery applies it again from its
//! claim (a held lsn is a no-op).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roost_shards::{CompactOptions, CompactProgress, CompactionStats, Shard, Txn, TxnOp};
use roost_storage::NoRoom;
use roost_wal::Lsn;

use super::crash::{CrashHook, CrashPoint, Step};
use super::metrics::Stats;
use crate::error::EngineError;

/// Messages a shard's owner answers. Bounded channel: a worker blocks rather than queue
/// without limit.
pub enum ShardMsg {
    /// Apply each transaction when its lsn is this shard's next turn; reply once the last
    /// is applied (or with the first failure). One message carries a whole group's
    /// transactions for this shard: one send, one wake-up and one reply for all of them.
    Apply {
        txns: Vec<Turn>,
        reply: Sender<Result<(), EngineError>>,
    },
    /// Make everything applied so far durable, then reply.
    Flush {
        k: usize,
        reply: Sender<Result<(), EngineError>>,
    },
    Contains {
        id: u64,
        reply: Sender<bool>,
    },
    /// (live records, largest id ever created)
    Stats {
        reply: Sender<(usize, u64)>,
    },
    Compaction {
        reply: Sender<CompactionStats>,
    },
    /// Make the spare segment if it is missing; Ok(true) once there is one.
    Refill {
        reply: Sender<Result<bool, EngineError>>,
    },
}

/// One shard transaction to apply in its turn. `k` is the shard's position in its batch
/// (names the crash points `after_commit.K`, `after_flush.K`).
pub struct Turn {
    pub lsn: Lsn,
    pub k: usize,
    pub ops: Vec<TxnOp>,
}

/// Claimed lsns not yet applied (see [`ShardSlot::turns`]).
type Turns = Arc<Mutex<BTreeSet<Lsn>>>;
/// Why the shard has no spare segment (see [`ShardSlot::room`]).
type Room = Arc<Mutex<Option<NoRoom>>>;

/// What the engine keeps per shard.
pub struct ShardSlot {
    name: String,
    tx: Option<SyncSender<ShardMsg>>,
    /// Claimed lsns touching this shard, not yet applied; the smallest goes next. The planner
    /// inserts under its lock (so in lsn order); the owner removes each once it is applied.
    pub turns: Turns,
    /// Why the shard has no spare segment (`None`: it has one), kept current by the owner.
    pub room: Room,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the owner needs from the engine: the crash hook and the progress clock.
#[derive(Clone)]
pub struct OwnerContext {
    pub crash: Arc<dyn CrashHook>,
    pub stats: Arc<Stats>,
    pub opened: Instant,
    /// Compaction: only lsns at or below this (the last checkpoint) are compacted.
    pub horizon: Arc<AtomicU64>,
    /// Compaction waits while a base backup copies the segments.
    pub gate: Arc<super::backup::BackupGate>,
    /// Compaction: bytes per second (0: off) and the dead fraction that triggers it.
    pub compact_rate: u64,
    pub compact_dead: f64,
}

impl OwnerContext {
    fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
        self.stats
            .last_progress_ms
            .store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.crash.hit(point)
    }
}

const QUEUE_MAX: usize = 1024;

/// The most bytes one compaction step reads (a few milliseconds of the owner's time).
const COMPACT_STEP_MAX: u64 = 1 << 20;

impl ShardSlot {
    pub fn spawn(name: &str, shard: Shard, ctx: OwnerContext) -> std::io::Result<ShardSlot> {
        let (tx, rx) = mpsc::sync_channel(QUEUE_MAX);
        let turns = Arc::new(Mutex::new(BTreeSet::new()));
        let room = Arc::new(Mutex::new(shard.spare_missing()));
        let shared = (turns.clone(), room.clone());
        let n = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("shard-{name}"))
            .spawn(move || owner(n, shard, rx, shared, ctx))?;
        Ok(ShardSlot {
            name: name.to_owned(),
            tx: Some(tx),
            turns,
            room,
            thread: Some(thread),
        })
    }

    fn send(&self, msg: ShardMsg) -> Result<(), EngineError> {
        self.tx
            .as_ref()
            .ok_or(EngineError::Failed)?
            .send(msg)
            .map_err(|_| EngineError::Failed)
    }

    /// Hands transactions to the owner, each to be applied in its turn; one answer, once
    /// all are applied, comes on the returned receiver (see [`ShardSlot::wait`]).
    pub fn send_apply(
        &self,
        txns: Vec<Turn>,
    ) -> Result<mpsc::Receiver<Result<(), EngineError>>, EngineError> {
        let (reply, rx) = mpsc::channel();
        self.send(ShardMsg::Apply { txns, reply })?;
        Ok(rx)
    }

    /// Asks the owner to flush everything applied so far (the caller's transaction among it);
    /// the answer comes on the returned receiver.
    pub fn send_flush(
        &self,
        k: usize,
    ) -> Result<mpsc::Receiver<Result<(), EngineError>>, EngineError> {
        let (reply, rx) = mpsc::channel();
        self.send(ShardMsg::Flush { k, reply })?;
        Ok(rx)
    }

    /// Waits for an apply or a flush. Gives up with `Failed` when `failed()` says the
    /// pipeline stopped (an earlier batch whose turn this one waits for will then never
    /// arrive).
    pub fn wait(
        &self,
        rx: &mpsc::Receiver<Result<(), EngineError>>,
        failed: &dyn Fn() -> bool,
    ) -> Result<(), EngineError> {
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(r) => return r,
                Err(RecvTimeoutError::Timeout) if failed() => return Err(EngineError::Failed),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Err(EngineError::Failed),
            }
        }
    }

    pub fn contains(&self, id: u64) -> Result<bool, EngineError> {
        let (reply, rx) = mpsc::channel();
        self.send(ShardMsg::Contains { id, reply })?;
        rx.recv().map_err(|_| EngineError::Failed)
    }

    pub fn stats(&self) -> Result<(usize, u64), EngineError> {
        let (reply, rx) = mpsc::channel();
        self.send(ShardMsg::Stats { reply })?;
        rx.recv().map_err(|_| EngineError::Failed)
    }

    pub fn compaction(&self) -> Result<CompactionStats, EngineError> {
        let (reply, rx) = mpsc::channel();
        self.send(ShardMsg::Compaction { reply })?;
        rx.recv().map_err(|_| EngineError::Failed)
    }

    /// Asks the owner to make a missing spare segment; Ok(true) once there is one.
    pub fn refill(&self) -> Result<bool, EngineError> {
        let (reply, rx) = mpsc::channel();
        self.send(ShardMsg::Refill { reply })?;
        rx.recv().map_err(|_| EngineError::Failed)?
    }
}

impl Drop for ShardSlot {
    /// Closing the channel stops the owner; joining it releases the shard (its maps and its
    /// directory lock) before the engine is gone.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!(shard = %self.name, "shard owner thread panicked");
            }
        }
    }
}

/// Where a worker waits for its shard transaction to be applied, or flushed.
type Reply = Sender<Result<(), EngineError>>;

/// The owner thread's state: the only holder of its `Shard`.
struct Owner {
    name: String,
    shard: Shard,
    turns: Turns,
    room: Room,
    ctx: OwnerContext,
    /// Transactions received, waiting for their turn, by lsn; the last of a message holds
    /// its reply.
    pending: BTreeMap<Lsn, (usize, Vec<TxnOp>, Option<Reply>)>,
    /// Flush requests of this round (shard position in the batch, reply).
    flushes: Vec<(usize, Reply)>,
    /// Once a step fails (I/O, or an injected crash), this owner answers every later request
    /// with the failure (its class kept) and writes nothing more.
    dead: Option<EngineError>,
    /// When compaction last ran (its budget is the rate times the time since).
    compacted_at: Instant,
}

fn owner(
    name: String,
    shard: Shard,
    rx: Receiver<ShardMsg>,
    (turns, room): (Turns, Room),
    ctx: OwnerContext,
) {
    let mut o = Owner {
        name,
        shard,
        turns,
        room,
        ctx,
        pending: BTreeMap::new(),
        flushes: Vec::new(),
        dead: None,
        compacted_at: Instant::now(),
    };
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(m) => o.take(m),
            Err(RecvTimeoutError::Timeout) => o.compact_idle(),
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(m) = rx.try_recv() {
            o.take(m);
        }
        if o.dead.is_some() {
            o.refuse_all();
            continue;
        }
        let mut failure = o.apply_turns();
        o.flush_round(&mut failure);
        if let Some(e) = failure {
            tracing::warn!(shard = %o.name, error = %e, "shard owner stopped");
            o.dead = Some(e);
        }
        o.compact_idle();
    }
}

impl Owner {
    /// Queues an apply or a flush; answers a read at once.
    fn take(&mut self, m: ShardMsg) {
        match m {
            ShardMsg::Apply { mut txns, reply } => {
                // Applied in lsn order: the largest lsn is the message's last, and a failure
                // before it leaves it pending, refused with the failure (`refuse_all`).
                let mut reply = Some(reply);
                txns.sort_unstable_by_key(|t| t.lsn);
                for t in txns.into_iter().rev() {
                    self.pending.insert(t.lsn, (t.k, t.ops, reply.take()));
                }
                if let Some(r) = reply {
                    let _ = r.send(
                        self.dead
                            .as_ref()
                            .map_or(Ok(()), |e| Err(e.clone_for_reply())),
                    );
                }
            }
            ShardMsg::Flush { k, reply } => self.flushes.push((k, reply)),
            ShardMsg::Contains { id, reply } => {
                let _ = reply.send(self.shard.contains(id));
            }
            ShardMsg::Stats { reply } => {
                let _ = reply.send((self.shard.len(), self.shard.max_id()));
            }
            ShardMsg::Compaction { reply } => {
                let _ = reply.send(self.shard.compaction_stats());
            }
            ShardMsg::Refill { reply } => {
                let _ = reply.send(self.refill());
            }
        }
    }

    /// Makes a missing spare segment (a dead owner writes nothing and says why).
    fn refill(&mut self) -> Result<bool, EngineError> {
        if let Some(why) = &self.dead {
            return Err(why.clone_for_reply());
        }
        let r = self
            .shard
            .refill_spare()
            .map_err(|source| EngineError::Shard {
                shard: self.name.clone(),
                source,
            });
        *lock(&self.room) = self.shard.spare_missing();
        r
    }

    /// Between rounds, with nothing queued: one compaction step, its budget the rate times
    /// the time since the last, at most [`COMPACT_STEP_MAX`] (a step holds the owner, so a
    /// small one keeps a batch's wait short). A failure stops the owner like any write
    /// failure.
    fn compact_idle(&mut self) {
        let rate = self.ctx.compact_rate;
        let elapsed = self.compacted_at.elapsed();
        if rate == 0
            || self.dead.is_some()
            || !self.pending.is_empty()
            || elapsed < Duration::from_millis(10)
        {
            return;
        }
        self.compacted_at = Instant::now();
        let budget = (rate as f64 * elapsed.as_secs_f64()) as u64;
        let o = CompactOptions {
            budget_bytes: budget.clamp(1, COMPACT_STEP_MAX),
            horizon_lsn: self.ctx.horizon.load(Ordering::Relaxed),
            dead_fraction_min: self.ctx.compact_dead,
        };
        if !self.ctx.gate.try_compact() {
            return;
        }
        let step = self.shard.compact_step(&o);
        self.ctx.gate.compaction_done();
        match step {
            Ok(CompactProgress::Finished {
                reclaimed_bytes, ..
            }) => {
                tracing::info!(shard = %self.name, reclaimed_bytes, "shard: compacted");
            }
            Ok(_) => {}
            Err(source) => {
                let e = EngineError::Shard {
                    shard: self.name.clone(),
                    source,
                };
                tracing::warn!(shard = %self.name, error = %e, "shard owner stopped");
                self.dead = Some(e);
            }
        }
    }

    /// A dead owner answers every queued request with its failure.
    fn refuse_all(&mut self) {
        let Some(why) = &self.dead else { return };
        let replies = std::mem::take(&mut self.pending)
            .into_values()
            .filter_map(|(_, _, r)| r)
            .chain(
                std::mem::take(&mut self.flushes)
                    .into_iter()
                    .map(|(_, r)| r),
            );
        for reply in replies {
            let _ = reply.send(Err(why.clone_for_reply()));
        }
    }

    /// Applies every pending transaction whose turn it is, in lsn order; the first failure
    /// stops the round.
    fn apply_turns(&mut self) -> Option<EngineError> {
        let mut applied = 0u64;
        let mut failure = None;
        while let Some((&lsn, _)) = self.pending.first_key_value() {
            // Recovery registers no turns; otherwise an earlier claimed lsn goes first.
            if lock(&self.turns).first().is_some_and(|t| *t < lsn) {
                tracing::debug!(shard = %self.name, lsn, pending = self.pending.len(), "owner waits for an earlier turn");
                break;
            }
            let Some((_, (k, ops, reply))) = self.pending.pop_first() else {
                break;
            };
            let r = self
                .shard
                .apply(&Txn { lsn, ops })
                .map_err(|source| EngineError::Shard {
                    shard: self.name.clone(),
                    source,
                })
                .and_then(|_| self.ctx.hit(Step::AfterCommit.nth(k)));
            match r {
                Ok(()) => {
                    lock(&self.turns).remove(&lsn);
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(()));
                    }
                    applied += 1;
                }
                Err(e) => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(e.clone_for_reply()));
                    }
                    failure = Some(e);
                    break;
                }
            }
        }
        if applied > 0 {
            // A roll may have taken the spare without room for the next one.
            *lock(&self.room) = self.shard.spare_missing();
            tracing::debug!(shard = %self.name, applied, "owner round");
            self.ctx
                .stats
                .shard_txns
                .fetch_add(applied, Ordering::Relaxed);
        }
        failure
    }

    /// One flush for every request of the round: each asker's transaction was applied before
    /// it asked. After a failure, every asker gets it.
    fn flush_round(&mut self, failure: &mut Option<EngineError>) {
        if self.flushes.is_empty() {
            return;
        }
        if failure.is_none() {
            if let Err(source) = self.shard.flush() {
                *failure = Some(EngineError::Shard {
                    shard: self.name.clone(),
                    source,
                });
            }
            self.ctx.stats.shard_flushes.fetch_add(1, Ordering::Relaxed);
        }
        for (k, reply) in std::mem::take(&mut self.flushes) {
            let r = match failure.as_ref() {
                Some(e) => Err(e.clone_for_reply()),
                None => self.ctx.hit(Step::AfterFlush.nth(k)),
            };
            if let Err(e) = &r {
                failure.get_or_insert_with(|| e.clone_for_reply());
            }
            let _ = reply.send(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::backup::BackupGate;
    use crate::pipeline::crash::NthCrash;
    use roost_shards::ShardOptions;
    use roost_storage::SimStorage;

    /// An owner over a simulated disk whose crash hook fails at its `crash_at`th point.
    fn slot(crash_at: Option<u64>) -> ShardSlot {
        let disk = Arc::new(SimStorage::new());
        let shard = Shard::open_with(disk, "/sim/s", ShardOptions::default()).expect("open");
        let ctx = OwnerContext {
            crash: Arc::new(NthCrash::new(crash_at)),
            stats: Arc::new(Stats::default()),
            opened: Instant::now(),
            horizon: Arc::new(AtomicU64::new(0)),
            gate: Arc::new(BackupGate::default()),
            compact_rate: 0,
            compact_dead: 0.5,
        };
        ShardSlot::spawn("s", shard, ctx).expect("spawn")
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
    fn answer(rx: &Receiver<Result<(), EngineError>>, what: &str) -> Result<(), EngineError> {
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
}

//! Shard owners on a bounded pool of threads (issue 25, item 3: a client that names many
//! shards must not get a thread each). Each shard's `Owner` is the only code that touches its
//! mmap and files; workers talk to it by message, into the shard's mailbox, and a shard with
//! mail is queued once on the pool (`shard_threads` threads): one pool thread at a time runs
//! its round (every message in arrival order, then the applies whose turn it is, then one
//! flush), so each shard is still a single writer and its messages keep their order. An
//! apply that finds no round of its shard queued or running runs the round on its own
//! worker instead (`Cell::post`): the same round under the same token, without waking a
//! pool thread and waiting for its answer (four of each per batch of four shards). It
//! applies transactions strictly in lsn order (the turns the planner registered at claim
//! time) and answers each once it is applied (readable, not yet durable). Durability is a
//! separate request: a durability round (`settle.rs`) asks for a flush once the results of
//! the claims it settles are published, and the owner
//! flushes once for every request of a round, so concurrent batches on one shard share an
//! msync + fdatasync (group flush) the way claims share WAL syncs. A batch's `done` record is
//! appended only after its flushes: until then recovery applies it again from its claim (a
//! held lsn is a no-op). No round ever waits for another shard, so a few threads serve any
//! number of shards; a shard waiting for an earlier turn, or compacting, is also run on the
//! pool's tick (every [`TICK`]), as the thread per shard woke every 200 ms.
//!
//! An owner whose shard has been idle for `shard_idle_close_ms`, with nothing pending (no
//! message, no turn, nothing applied and not flushed, no compaction under way), closes it:
//! the `Shard` is dropped (maps, segment file descriptors, directory lock), and only its
//! figures are kept ([`Held`]). The next message that needs the shard reopens it through the
//! same [`ShardOpener`] the first use took, recovering its segments, before it is handled; a
//! failure to reopen stops the owner like a failed write, and its askers get the failure
//! with its class.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roost_shards::{
    CompactOptions, CompactProgress, CompactionStats, Shard, ShardOptions, Txn, TxnOp,
};
use roost_storage::{lock, NoRoom, Storage};
use roost_wal::Lsn;

use super::crash::{CrashHook, CrashPoint, Step};
use super::stats::Stats;
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
    /// Whether the shard holds `id` (the planner's check for a delete): reopens a closed
    /// shard, so it can fail.
    Contains {
        id: u64,
        reply: Sender<Result<bool, EngineError>>,
    },
    /// The shard's figures; a closed shard answers from those kept when it closed.
    Stats {
        reply: Sender<ShardFigures>,
    },
    Compaction {
        reply: Sender<CompactionStats>,
    },
    /// Make the spare segment if it is missing; Ok(true) once there is one.
    Refill {
        reply: Sender<Result<bool, EngineError>>,
    },
    /// Make the spare hold a frame of `bytes` (`Shard::reserve`): reopens a closed shard.
    /// Ok(false) when the disk has no room.
    Reserve {
        bytes: u64,
        reply: Sender<Result<bool, EngineError>>,
    },
}

/// What `Stats` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardFigures {
    /// Live records.
    pub records: usize,
    /// The largest id ever created on the shard.
    pub max_id: u64,
    /// Whether the `Shard` is open (false: closed while idle; its index is not in memory).
    pub open: bool,
}

/// How a shard is opened: at its first use (`Engine::slot`) and, after an idle close, by its
/// owner again, the same way (its segments recovered, its directory created and locked).
pub struct ShardOpener {
    pub storage: Arc<dyn Storage>,
    pub dir: PathBuf,
    /// `synced_through_lsn` is recovery's figure for this shard at first; an idle close
    /// raises it to the shard's last lsn, every frame of which was flushed before it closed.
    pub opts: ShardOptions,
}

impl ShardOpener {
    pub fn open(&self, name: &str) -> Result<Shard, EngineError> {
        Shard::open_with(self.storage.clone(), self.dir.clone(), self.opts.clone()).map_err(
            |source| EngineError::Shard {
                shard: name.to_owned(),
                source,
            },
        )
    }
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
    /// The shard's mailbox and its owner, run on the pool.
    cell: Arc<Cell>,
    /// Claimed lsns touching this shard, not yet applied; the smallest goes next. The planner
    /// inserts under its lock (so in lsn order); the owner removes each once it is applied.
    pub turns: Turns,
    /// Why the shard has no spare segment (`None`: it has one), kept current by the owner.
    pub room: Room,
    /// The bytes its spare segment holds (`Shard::spare_have`), kept current by the owner:
    /// a frame up to this size needs no [`ShardSlot::reserve`] message.
    spare_have: Arc<AtomicU64>,
}

/// What the owner needs from the engine: the crash hook, the progress clock and the pool.
#[derive(Clone)]
pub struct OwnerContext {
    /// The threads the owner's rounds run on.
    pub pool: Arc<ShardPool>,
    pub crash: Arc<dyn CrashHook>,
    pub stats: Arc<Stats>,
    pub opened: Instant,
    /// Compaction: only lsns at or below this (the last checkpoint) are compacted.
    pub horizon: Arc<AtomicU64>,
    /// Compaction waits while a base backup copies the segments.
    pub gate: Arc<super::backup_gate::BackupGate>,
    /// Compaction: bytes per second (0: off) and the dead fraction that triggers it.
    pub compact_rate: u64,
    pub compact_dead: f64,
    /// Close the shard after this long idle (`shard_idle_close_ms`; `None`: never).
    pub idle_close: Option<Duration>,
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
    /// Hands `shard` (just opened by `opener`, which reopens it after an idle close) to a
    /// new owner whose rounds run on `ctx.pool`.
    pub fn spawn(name: &str, shard: Shard, opener: ShardOpener, ctx: OwnerContext) -> ShardSlot {
        let turns = Arc::new(Mutex::new(BTreeSet::new()));
        let room = Arc::new(Mutex::new(shard.spare_missing()));
        let spare_have = Arc::new(AtomicU64::new(shard.spare_have()));
        let pool = Arc::downgrade(&ctx.pool);
        let owner = Owner {
            name: name.to_owned(),
            held: Held::new(shard, opener, ctx.stats.clone()),
            used_at: Instant::now(),
            turns: turns.clone(),
            room: room.clone(),
            spare_have: spare_have.clone(),
            ctx,
            pending: BTreeMap::new(),
            flushes: Vec::new(),
            dead: None,
            compacted_at: Instant::now(),
        };
        let cell = Arc::new(Cell {
            name: name.to_owned(),
            mailbox: Mutex::new(Mailbox::default()),
            space: Condvar::new(),
            owner: Mutex::new(Some(owner)),
            pool,
            tick: AtomicBool::new(true),
        });
        if let Some(p) = cell.pool.upgrade() {
            lock(&p.cells).push(Arc::downgrade(&cell));
        }
        ShardSlot {
            name: name.to_owned(),
            cell,
            turns,
            room,
            spare_have,
        }
    }

    fn send(&self, msg: ShardMsg) -> Result<(), EngineError> {
        self.cell.post(msg, Where::Pool)
    }

    /// Hands transactions to the owner, each to be applied in its turn; one answer, once
    /// all are applied, comes on the returned receiver (see [`ShardSlot::wait`]). When no
    /// pool thread has the shard, the caller runs the owner's round itself ([`Cell::post`]):
    /// no pool thread is woken, and an apply whose turn it is has its answer on the receiver
    /// before this returns.
    pub fn send_apply(
        &self,
        txns: Vec<Turn>,
    ) -> Result<mpsc::Receiver<Result<(), EngineError>>, EngineError> {
        let (reply, rx) = mpsc::channel();
        self.cell
            .post(ShardMsg::Apply { txns, reply }, Where::Here)?;
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
        rx.recv().map_err(|_| EngineError::Failed)?
    }

    pub fn stats(&self) -> Result<ShardFigures, EngineError> {
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

    /// Before a claim: makes sure a frame of `bytes` will need no room the disk may not
    /// have (its spare holds it; grown by the owner when it does not yet). Ok(false) when the
    /// disk has no room: the batch must wait (intake pauses).
    pub fn reserve(&self, bytes: u64) -> Result<bool, EngineError> {
        if bytes <= self.spare_have.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let (reply, rx) = mpsc::channel();
        self.send(ShardMsg::Reserve { bytes, reply })?;
        rx.recv().map_err(|_| EngineError::Failed)?
    }
}

impl Drop for ShardSlot {
    /// Closes the mailbox and drops the owner once no pool thread runs it: the shard (its
    /// maps and its directory lock) is released before the engine is gone. Requests still
    /// queued are dropped, so their askers see `Failed`.
    fn drop(&mut self) {
        tracing::trace!(shard = %self.name, "shard owner closed");
        self.cell.close();
    }
}

/// How often the pool runs the shards that asked for it (an owner waiting for an earlier
/// turn, or compacting) with no message for them; every [`FULL_TICK_EVERY`] ticks it runs
/// every shard once (a checkpoint may have made compaction possible).
pub const TICK: Duration = Duration::from_millis(200);
const FULL_TICK_EVERY: u64 = 25;

/// A shard's mail, and whether the shard is queued on (or running on) the pool.
#[derive(Default)]
struct Mailbox {
    msgs: VecDeque<ShardMsg>,
    /// Queued or running: a sender does not queue it again, so at most one pool thread runs
    /// it at a time (the single writer).
    scheduled: bool,
    /// The slot was dropped (or its owner panicked): nothing more is taken.
    closed: bool,
}

/// One shard on the pool: its mailbox and its owner.
struct Cell {
    name: String,
    mailbox: Mutex<Mailbox>,
    /// Signalled when the mailbox has room again (a full one blocks its senders: bounded).
    space: Condvar,
    /// `None` once closed.
    owner: Mutex<Option<Owner>>,
    pool: Weak<ShardPool>,
    /// Run this shard on the next tick (it waits for a turn, or compaction has work).
    tick: AtomicBool,
}

/// Who runs the round that a message starts, when no round of its shard is queued or running.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Where {
    /// A pool thread.
    Pool,
    /// The sender, before [`Cell::post`] returns.
    Here,
}

impl Cell {
    /// Queues `msg` (blocking while the mailbox is full); if no round of the shard is queued
    /// or running, starts one `at` the pool or here. Either way `scheduled` is taken first,
    /// so one thread at a time runs the owner (the single writer), and a message that comes
    /// during a round run here is handed to the pool when it ends ([`Cell::run`]).
    fn post(self: &Arc<Self>, msg: ShardMsg, at: Where) -> Result<(), EngineError> {
        let mut mb = lock(&self.mailbox);
        while mb.msgs.len() >= QUEUE_MAX && !mb.closed {
            mb = self.space.wait(mb).unwrap_or_else(|p| p.into_inner());
        }
        if mb.closed {
            return Err(EngineError::Failed);
        }
        mb.msgs.push_back(msg);
        let start = !std::mem::replace(&mut mb.scheduled, true);
        drop(mb);
        match (start, at) {
            (false, _) => Ok(()),
            (true, Where::Pool) => self.queue(),
            (true, Where::Here) => {
                self.clone().run_caught(Where::Here);
                Ok(())
            }
        }
    }

    fn queue(self: &Arc<Self>) -> Result<(), EngineError> {
        let pool = self.pool.upgrade().ok_or(EngineError::Failed)?;
        pool.push(self.clone());
        Ok(())
    }

    /// On a tick: queues the shard unless it is queued already or closed.
    fn poke(self: &Arc<Self>) {
        let mut mb = lock(&self.mailbox);
        if mb.scheduled || mb.closed {
            return;
        }
        mb.scheduled = true;
        drop(mb);
        let _ = self.queue();
    }

    /// One round `at` a pool thread or the sender's: the mail so far, then the owner's round;
    /// queued on the pool if more mail came meanwhile.
    fn run(self: Arc<Self>, at: Where) {
        let (msgs, was_full) = {
            let mut mb = lock(&self.mailbox);
            let full = mb.msgs.len() >= QUEUE_MAX;
            (mb.msgs.drain(..).collect::<Vec<ShardMsg>>(), full)
        };
        // Only a full mailbox has senders waiting (a notify is a syscall even with none).
        if was_full {
            self.space.notify_all();
        }
        if let Some(owner) = lock(&self.owner).as_mut() {
            let again = owner.round(msgs, at);
            match at {
                Where::Pool => self.tick.store(again, Ordering::Relaxed),
                // A round on a worker leaves compaction and the idle close to the pool's
                // tick: it may ask for the tick, never take back a request for one.
                Where::Here => {
                    self.tick.fetch_or(again, Ordering::Relaxed);
                }
            }
        }
        let mut mb = lock(&self.mailbox);
        if mb.msgs.is_empty() || mb.closed {
            mb.scheduled = false;
            return;
        }
        drop(mb);
        let _ = self.queue();
    }

    /// [`Cell::run`]; a panic in the round closes the shard (its askers see `Failed`) and
    /// the caller goes on; in the daemon the panic hook has stopped the process with 70
    /// before that.
    fn run_caught(self: Arc<Self>, at: Where) {
        let c = self.clone();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.run(at))).is_err() {
            tracing::error!(shard = %self.name, "shard owner panicked");
            self.close();
        }
    }

    /// Takes nothing more and drops the owner (waiting for a round that runs now).
    fn close(&self) {
        let left = {
            let mut mb = lock(&self.mailbox);
            mb.closed = true;
            std::mem::take(&mut mb.msgs)
        };
        self.space.notify_all();
        drop(left);
        drop(lock(&self.owner).take());
    }
}

/// The threads every shard's rounds run on (`shard_threads`), and the shards to tick.
pub struct ShardPool {
    queue: Mutex<VecDeque<Arc<Cell>>>,
    ready: Condvar,
    stop: AtomicBool,
    /// Every shard owner started on this pool (dropped ones are pruned on a tick).
    cells: Mutex<Vec<Weak<Cell>>>,
    /// When the last tick ran, and how many ran.
    ticked: Mutex<(Instant, u64)>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl ShardPool {
    /// Starts `threads` pool threads (at least one).
    pub fn start(threads: usize) -> std::io::Result<Arc<ShardPool>> {
        let pool = Arc::new(ShardPool {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            cells: Mutex::new(Vec::new()),
            ticked: Mutex::new((Instant::now(), 0)),
            threads: Mutex::new(Vec::new()),
        });
        for i in 0..threads.max(1) {
            let p = Arc::downgrade(&pool);
            let t = std::thread::Builder::new()
                .name(format!("shards-{i}"))
                .spawn(move || work(p))?;
            lock(&pool.threads).push(t);
        }
        Ok(pool)
    }

    fn push(&self, cell: Arc<Cell>) {
        lock(&self.queue).push_back(cell);
        self.ready.notify_one();
    }

    /// The next shard to run, waiting up to a tick for one.
    fn next(&self) -> Option<Arc<Cell>> {
        let mut q = lock(&self.queue);
        if q.is_empty() && !self.stop.load(Ordering::Relaxed) {
            q = self
                .ready
                .wait_timeout(q, TICK)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        q.pop_front()
    }

    /// Once per [`TICK`] (one thread does it): queues the shards that asked for a tick, and
    /// every shard every [`FULL_TICK_EVERY`] ticks.
    fn tick_if_due(&self) {
        let n = {
            let Ok(mut t) = self.ticked.try_lock() else {
                return;
            };
            if t.0.elapsed() < TICK {
                return;
            }
            *t = (Instant::now(), t.1 + 1);
            t.1
        };
        let cells: Vec<Arc<Cell>> = {
            let mut reg = lock(&self.cells);
            reg.retain(|w| w.strong_count() > 0);
            reg.iter().filter_map(Weak::upgrade).collect()
        };
        let all = n % FULL_TICK_EVERY == 0;
        for c in cells {
            if all || c.tick.load(Ordering::Relaxed) {
                c.poke();
            }
        }
    }

    /// Stops the threads (each finishes its round) and waits for them.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.ready.notify_all();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            if t.join().is_err() {
                tracing::error!("shard pool thread panicked");
            }
        }
    }
}

/// The engine's hold on its pool: dropping it stops the threads (after the shards, which
/// the engine drops first).
pub struct PoolHandle(pub Arc<ShardPool>);

impl Drop for PoolHandle {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// A pool thread: runs queued shards' rounds ([`Cell::run_caught`]), and the tick.
fn work(pool: Weak<ShardPool>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        if p.stop.load(Ordering::SeqCst) {
            return;
        }
        p.tick_if_due();
        let Some(cell) = p.next() else { continue };
        drop(p);
        cell.run_caught(Where::Pool);
    }
}

/// Where a worker waits for its shard transaction to be applied, or flushed.
type Reply = Sender<Result<(), EngineError>>;

/// A shard owner's state: the only holder of its `Shard`, run by one pool thread at a time.
struct Owner {
    name: String,
    /// The shard, open or closed while idle.
    held: Held,
    /// When a message last needed the shard (an apply, a flush, a read, a refill; not a
    /// status poll): the idle close counts from here.
    used_at: Instant,
    turns: Turns,
    room: Room,
    spare_have: Arc<AtomicU64>,
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

impl Owner {
    /// One round: `msgs` in order, then (unless dead) every apply whose turn it is, one
    /// flush for the round's flush requests, and, on the pool, a compaction step and the
    /// idle close (a worker's round leaves them to the tick: they are not the client's wait).
    /// Returns whether the shard wants the pool's next tick (a transaction waits for an
    /// earlier turn, compaction has work, or an idle close may come before a full tick).
    fn round(&mut self, msgs: Vec<ShardMsg>, at: Where) -> bool {
        for m in msgs {
            self.take(m);
        }
        if self.dead.is_none() {
            let mut failure = self.apply_turns();
            self.flush_round(&mut failure);
            if let Some(e) = failure {
                tracing::warn!(shard = %self.name, error = %e, "shard owner stopped");
                self.dead = Some(e);
            }
        }
        if self.dead.is_some() {
            self.refuse_all();
            return false;
        }
        if at == Where::Here {
            return !self.pending.is_empty() || self.close_soon();
        }
        let compacting = self.compact_idle();
        if !compacting {
            self.close_if_idle();
        }
        !self.pending.is_empty() || compacting || self.close_soon()
    }

    /// Closes the shard once it has been idle for `idle_close` with nothing pending: no
    /// transaction or flush queued, no claimed turn not yet applied, nothing applied and not
    /// flushed (so every frame it holds is durable, and the reopen may vouch for them), no
    /// compaction under way, its spare segment made (a refill never needs to reopen it).
    /// Messages that came after this round's started reopen it in the next round.
    fn close_if_idle(&mut self) {
        let Some(after) = self.ctx.idle_close else {
            return;
        };
        let Some(shard) = self.held.shard.as_ref() else {
            return;
        };
        let busy = self.dead.is_some()
            || !self.pending.is_empty()
            || !self.flushes.is_empty()
            || !lock(&self.turns).is_empty()
            || shard.unflushed()
            || shard.compaction_stats().in_progress
            || shard.spare_missing().is_some();
        if busy || self.used_at.elapsed() < after {
            return;
        }
        self.held.close();
        tracing::debug!(shard = %self.name, idle_ms = self.used_at.elapsed().as_millis() as u64, "shard closed while idle");
    }

    /// An open shard whose idle close comes sooner than the pool's full tick asks for every
    /// tick, so it closes within a tick of it (a short `shard_idle_close_ms`, as in tests).
    fn close_soon(&self) -> bool {
        let full = TICK * FULL_TICK_EVERY as u32;
        self.held.shard.is_some() && self.ctx.idle_close.is_some_and(|d| d < full)
    }

    /// Whether the shard holds `id`, reopening it if it was closed. A failure to reopen stops
    /// the owner (a dead owner reopens nothing).
    fn contains(&mut self, id: u64) -> Result<bool, EngineError> {
        if let (Some(why), None) = (&self.dead, &self.held.shard) {
            return Err(why.clone_for_reply());
        }
        match self.held.open(&self.name) {
            Ok(shard) => Ok(shard.contains(id)),
            Err(e) => {
                tracing::warn!(shard = %self.name, error = %e, "shard owner stopped: reopen failed");
                let r = Err(e.clone_for_reply());
                self.dead = Some(e);
                r
            }
        }
    }
}

/// An owner's hold on its shard: open, or closed after `shard_idle_close_ms` idle, keeping
/// what the engine asks of a shard without needing it (`Stats` and `Compaction` answer from
/// it: status and memory polls neither reopen a shard nor keep it open).
struct Held {
    /// `None` while closed: no map, no file descriptor, no directory lock.
    shard: Option<Shard>,
    /// The figures of the shard when it closed.
    records: usize,
    max_id: u64,
    compaction: CompactionStats,
    opener: ShardOpener,
    /// Counts open shards (`shards_open`), closes and reopens.
    stats: Arc<Stats>,
}

impl Held {
    fn new(shard: Shard, opener: ShardOpener, stats: Arc<Stats>) -> Held {
        stats.shards_open.fetch_add(1, Ordering::Relaxed);
        Held {
            shard: Some(shard),
            records: 0,
            max_id: 0,
            compaction: CompactionStats::default(),
            opener,
            stats,
        }
    }

    /// The shard, reopened first if it was closed (the open a first use takes: its segments
    /// recovered, its directory locked).
    fn open(&mut self, name: &str) -> Result<&mut Shard, EngineError> {
        if self.shard.is_none() {
            let shard = self.opener.open(name)?;
            self.stats.shards_open.fetch_add(1, Ordering::Relaxed);
            self.stats.shard_reopens.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(shard = name, "shard reopened");
            self.shard = Some(shard);
        }
        self.shard.as_mut().ok_or(EngineError::Failed)
    }

    /// Drops the shard (unmapping its segments, closing its files, releasing its lock),
    /// keeping its figures. The caller saw it flushed: every frame up to its last lsn is
    /// durable, so the reopen vouches for them (`synced_through_lsn`), and damage below it
    /// found then is corruption, not a torn tail.
    fn close(&mut self) {
        let Some(shard) = self.shard.take() else {
            return;
        };
        self.records = shard.len();
        self.max_id = shard.max_id();
        self.compaction = shard.compaction_stats();
        let opts = &mut self.opener.opts;
        opts.synced_through_lsn = Some(opts.synced_through_lsn.unwrap_or(0).max(shard.max_lsn()));
        drop(shard);
        self.stats.shards_open.fetch_sub(1, Ordering::Relaxed);
        self.stats.shard_idle_closes.fetch_add(1, Ordering::Relaxed);
    }

    fn figures(&self) -> ShardFigures {
        match &self.shard {
            Some(s) => ShardFigures {
                records: s.len(),
                max_id: s.max_id(),
                open: true,
            },
            None => ShardFigures {
                records: self.records,
                max_id: self.max_id,
                open: false,
            },
        }
    }

    fn compaction(&self) -> CompactionStats {
        self.shard
            .as_ref()
            .map_or_else(|| self.compaction.clone(), Shard::compaction_stats)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.shard.is_some() {
            self.stats.shards_open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Owner {
    /// Queues an apply or a flush; answers a read at once.
    fn take(&mut self, m: ShardMsg) {
        match m {
            ShardMsg::Apply { mut txns, reply } => {
                self.used_at = Instant::now();
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
            ShardMsg::Flush { k, reply } => {
                self.used_at = Instant::now();
                self.flushes.push((k, reply));
            }
            ShardMsg::Contains { id, reply } => {
                self.used_at = Instant::now();
                let _ = reply.send(self.contains(id));
            }
            ShardMsg::Stats { reply } => {
                let _ = reply.send(self.held.figures());
            }
            ShardMsg::Compaction { reply } => {
                let _ = reply.send(self.held.compaction());
            }
            ShardMsg::Refill { reply } => {
                self.used_at = Instant::now();
                let _ = reply.send(self.refill());
            }
            ShardMsg::Reserve { bytes, reply } => {
                self.used_at = Instant::now();
                let _ = reply.send(self.reserve(bytes));
            }
        }
    }

    /// The spare's state where the engine reads it: why it is missing (the gate) and what
    /// it holds (the planner's reservations).
    fn note_room(&self) {
        let shard = self.held.shard.as_ref();
        *lock(&self.room) = shard.and_then(Shard::spare_missing);
        if let Some(shard) = shard {
            self.spare_have.store(shard.spare_have(), Ordering::Relaxed);
        }
    }

    /// Grows the spare to hold a frame of `bytes`, reopening a closed shard (a dead owner
    /// writes nothing and says why).
    fn reserve(&mut self, bytes: u64) -> Result<bool, EngineError> {
        if let Some(why) = &self.dead {
            return Err(why.clone_for_reply());
        }
        let r = match self.held.open(&self.name) {
            Ok(shard) => shard.reserve(bytes).map_err(|source| EngineError::Shard {
                shard: self.name.clone(),
                source,
            }),
            Err(e) => {
                tracing::warn!(shard = %self.name, error = %e, "shard owner stopped: reopen failed");
                let r = Err(e.clone_for_reply());
                self.dead = Some(e);
                return r;
            }
        };
        self.note_room();
        r
    }

    /// Makes a missing spare segment (a dead owner writes nothing and says why).
    fn refill(&mut self) -> Result<bool, EngineError> {
        if let Some(why) = &self.dead {
            return Err(why.clone_for_reply());
        }
        // A shard closes only with its spare made: nothing to refill.
        let Some(shard) = self.held.shard.as_mut() else {
            return Ok(true);
        };
        let r = shard.refill_spare().map_err(|source| EngineError::Shard {
            shard: self.name.clone(),
            source,
        });
        self.note_room();
        r
    }

    /// Between rounds, with nothing queued: one compaction step, its budget the rate times
    /// the time since the last, at most [`COMPACT_STEP_MAX`] (a step holds the owner, so a
    /// small one keeps a batch's wait short). A failure stops the owner like any write
    /// failure.
    /// Returns whether compaction may have more to do (a step that did something, or one
    /// not due yet).
    fn compact_idle(&mut self) -> bool {
        let rate = self.ctx.compact_rate;
        let elapsed = self.compacted_at.elapsed();
        // A closed shard is not reopened to compact: it compacts once a message reopens it.
        let Some(shard) = self.held.shard.as_mut() else {
            return false;
        };
        if rate == 0 || self.dead.is_some() || !self.pending.is_empty() {
            return false;
        }
        if elapsed < Duration::from_millis(10) {
            return true;
        }
        self.compacted_at = Instant::now();
        let budget = (rate as f64 * elapsed.as_secs_f64()) as u64;
        let o = CompactOptions {
            budget_bytes: budget.clamp(1, COMPACT_STEP_MAX),
            horizon_lsn: self.ctx.horizon.load(Ordering::Relaxed),
            dead_fraction_min: self.ctx.compact_dead,
        };
        if !self.ctx.gate.try_compact() {
            return true;
        }
        let step = shard.compact_step(&o);
        self.ctx.gate.compaction_done();
        match step {
            Ok(CompactProgress::Finished {
                reclaimed_bytes, ..
            }) => {
                tracing::info!(shard = %self.name, reclaimed_bytes, "shard: compacted");
                true
            }
            Ok(CompactProgress::Working { .. }) => true,
            Ok(CompactProgress::Idle) => false,
            Err(source) => {
                let e = EngineError::Shard {
                    shard: self.name.clone(),
                    source,
                };
                tracing::warn!(shard = %self.name, error = %e, "shard owner stopped");
                self.dead = Some(e);
                false
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
                .held
                .open(&self.name)
                .and_then(|shard| {
                    shard
                        .apply(&Txn { lsn, ops })
                        .map_err(|source| EngineError::Shard {
                            shard: self.name.clone(),
                            source,
                        })
                })
                .and_then(|_| self.ctx.hit(Step::AfterCommit.nth(k)));
            match r {
                Ok(()) => {
                    lock(&self.turns).remove(&lsn);
                    // A roll may have taken the spare without room for the next one: known
                    // before the asker goes on, so the next batch's gate sees it (`room.rs`).
                    self.note_room();
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
        // A closed shard was flushed before it closed, and nothing was applied since (an
        // apply reopens it): nothing to flush.
        if let (None, Some(shard)) = (failure.as_ref(), self.held.shard.as_mut()) {
            if let Err(source) = shard.flush() {
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
    use crate::error::ErrorClass;
    use crate::pipeline::backup_gate::BackupGate;
    use crate::pipeline::crash::NthCrash;
    use roost_storage::SimStorage;

    /// An owner over a simulated disk whose crash hook fails at its `crash_at`th point.
    fn slot(crash_at: Option<u64>) -> ShardSlot {
        slot_on(&SimStorage::new(), crash_at, None)
    }

    /// [`slot`] on `disk`, its shard closed after `idle_close` idle.
    fn slot_on(
        disk: &SimStorage,
        crash_at: Option<u64>,
        idle_close: Option<Duration>,
    ) -> ShardSlot {
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
            // As `Engine::slot` opens a shard recovery found nothing flushed on.
            opts: ShardOptions {
                synced_through_lsn: Some(0),
                ..ShardOptions::default()
            },
        };
        let shard = opener.open("s").expect("open");
        let ctx = OwnerContext {
            pool: ShardPool::start(2).expect("pool"),
            crash,
            stats: Arc::new(Stats::default()),
            opened: Instant::now(),
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

    /// Waits until the owner says its shard is closed.
    fn wait_closed(s: &ShardSlot) {
        let until = Instant::now() + PATIENCE;
        while s.stats().expect("stats").open {
            assert!(Instant::now() < until, "never closed while idle");
            std::thread::sleep(Duration::from_millis(10));
        }
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
        wait_closed(&s);
        let kept = s.stats().expect("stats");
        assert_eq!((kept.records, kept.max_id, kept.open), (2, 2, false));
        assert!(s.contains(2).expect("reopened"), "answers as before");
        assert!(s.stats().expect("stats").open);
        wait_closed(&s);
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
}

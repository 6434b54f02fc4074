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
//! An owner whose shard has been idle for `shard_idle_close_ms` (by the storage's clock, as
//! is the pool's tick), with nothing pending (no message, no turn, nothing applied and not
//! flushed, no compaction under way), closes it: the `Shard` is dropped (maps, segment file
//! descriptors, directory lock), and only its figures are kept ([`Held`]). The next message that needs the shard reopens it through the
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
use roost_storage::{lock, Clock, NoRoom, Storage};
use roost_wal::Lsn;

use super::crash::{CrashHook, CrashPoint, Step};
use super::stats::Stats;
use crate::error::EngineError;

mod pool;
mod run;

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
    /// Bytes its in-memory index takes (0 when closed).
    pub index_bytes: u64,
}

/// How a shard is opened: at its first use (`ShardSet::slot`) and, after an idle close, by its
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

/// What the owner needs from the engine: the crash hook, the storage's clock and the moment
/// of open (progress, the idle close, compaction's budget) and the pool.
#[derive(Clone)]
pub struct OwnerContext {
    /// The threads the owner's rounds run on.
    pub pool: Arc<ShardPool>,
    pub crash: Arc<dyn CrashHook>,
    pub stats: Arc<Stats>,
    /// The storage's clock: every time the owner reads.
    pub clock: Clock,
    /// A reading of `clock` at the engine's open.
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
        self.stats.last_progress_ms.store(
            self.clock.since(self.opened).as_millis() as u64,
            Ordering::Relaxed,
        );
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
        let now = ctx.clock.now();
        let owner = Owner {
            name: name.to_owned(),
            held: Held::new(shard, opener, ctx.stats.clone()),
            used_at: now,
            turns: turns.clone(),
            room: room.clone(),
            spare_have: spare_have.clone(),
            ctx,
            pending: BTreeMap::new(),
            flushes: Vec::new(),
            dead: None,
            compacted_at: now,
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

/// The threads every shard's rounds run on (`shard_threads`), and the shards to tick.
pub struct ShardPool {
    queue: Mutex<VecDeque<Arc<Cell>>>,
    ready: Condvar,
    stop: AtomicBool,
    /// Every shard owner started on this pool (dropped ones are pruned on a tick).
    cells: Mutex<Vec<Weak<Cell>>>,
    /// The storage's clock, which says when a tick is due.
    clock: Clock,
    /// When the last tick ran (by `clock`), and how many ran.
    ticked: Mutex<(Instant, u64)>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The engine's hold on its pool: dropping it stops the threads (after the shards, which
/// the engine drops first).
pub struct PoolHandle(pub Arc<ShardPool>);

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

#[cfg(test)]
mod owner_tests;

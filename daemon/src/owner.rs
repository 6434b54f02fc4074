//! One owner thread per shard: the only code that touches a shard's mmap and files. Workers
//! talk to it by message. It applies transactions strictly in lsn order (the turns the planner
//! registered at claim time) and answers each once it is applied (readable, not yet durable).
//! Durability is a separate request: a worker asks for a flush once its result is published,
//! and the owner flushes once for every request of a round, so concurrent batches on one shard
//! share an msync + fdatasync (group flush) the way claims share WAL syncs. A batch's `done`
//! record is appended only after its flushes: until then recovery applies it again from its
//! claim (a held lsn is a no-op).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roost_shards::{Shard, Txn, TxnOp};
use roost_wal::Lsn;

use crate::crash::CrashHook;
use crate::engine::{EngineError, Stats};

/// Messages a shard's owner answers. Bounded channel: a worker blocks rather than queue
/// without limit.
pub enum ShardMsg {
    /// Apply when `lsn` is this shard's next turn, then reply. `k` is the shard's position
    /// in its batch (names the crash points `after_commit.K`, `after_flush.K`).
    Apply {
        lsn: Lsn,
        k: usize,
        ops: Vec<TxnOp>,
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
}

/// What the engine keeps per shard.
pub struct ShardSlot {
    name: String,
    tx: Option<SyncSender<ShardMsg>>,
    /// Claimed lsns touching this shard, not yet applied; the smallest goes next. The planner
    /// inserts under its lock (so in lsn order); the owner removes after the flush.
    pub turns: Arc<Mutex<BTreeSet<Lsn>>>,
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
}

impl OwnerContext {
    fn hit(&self, point: &str) -> Result<(), EngineError> {
        self.stats
            .last_progress_ms
            .store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.crash.hit(point)
    }
}

const QUEUE_MAX: usize = 1024;

impl ShardSlot {
    pub fn spawn(name: &str, shard: Shard, ctx: OwnerContext) -> std::io::Result<ShardSlot> {
        let (tx, rx) = mpsc::sync_channel(QUEUE_MAX);
        let turns = Arc::new(Mutex::new(BTreeSet::new()));
        let t = turns.clone();
        let n = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("shard-{name}"))
            .spawn(move || owner(n, shard, rx, t, ctx))?;
        Ok(ShardSlot {
            name: name.to_owned(),
            tx: Some(tx),
            turns,
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

    /// Hands one transaction to the owner, to be applied in its turn; the answer comes on the
    /// returned receiver (see [`ShardSlot::wait`]).
    pub fn send_apply(
        &self,
        lsn: Lsn,
        k: usize,
        ops: Vec<TxnOp>,
    ) -> Result<mpsc::Receiver<Result<(), EngineError>>, EngineError> {
        let (reply, rx) = mpsc::channel();
        self.send(ShardMsg::Apply { lsn, k, ops, reply })?;
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
type Pending = BTreeMap<Lsn, (usize, Vec<TxnOp>, Reply)>;

fn owner(
    name: String,
    mut shard: Shard,
    rx: Receiver<ShardMsg>,
    turns: Arc<Mutex<BTreeSet<Lsn>>>,
    ctx: OwnerContext,
) {
    let mut pending: Pending = BTreeMap::new();
    let mut flushes: Vec<(usize, Reply)> = Vec::new();
    // Once a step fails (I/O, or an injected crash), this owner answers every later apply
    // with the failure and writes nothing more.
    let mut dead: Option<String> = None;
    loop {
        let first = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let handle = |m: ShardMsg, pending: &mut Pending, flushes: &mut Vec<(usize, Reply)>| match m
        {
            ShardMsg::Apply { lsn, k, ops, reply } => {
                pending.insert(lsn, (k, ops, reply));
            }
            ShardMsg::Flush { k, reply } => flushes.push((k, reply)),
            ShardMsg::Contains { id, reply } => {
                let _ = reply.send(shard.contains(id));
            }
            ShardMsg::Stats { reply } => {
                let _ = reply.send((shard.len(), shard.max_id()));
            }
        };
        if let Some(m) = first {
            handle(m, &mut pending, &mut flushes);
        }
        while let Ok(m) = rx.try_recv() {
            handle(m, &mut pending, &mut flushes);
        }
        if let Some(why) = &dead {
            let replies = std::mem::take(&mut pending)
                .into_values()
                .map(|(_, _, r)| r)
                .chain(std::mem::take(&mut flushes).into_iter().map(|(_, r)| r));
            for reply in replies {
                let _ = reply.send(Err(EngineError::Poisoned(why.clone())));
            }
            continue;
        }
        // Apply every pending transaction whose turn it is, in lsn order.
        let mut applied = 0usize;
        let mut failure: Option<EngineError> = None;
        while let Some((&lsn, _)) = pending.first_key_value() {
            // Recovery registers no turns; otherwise an earlier claimed lsn goes first.
            if lock(&turns).first().is_some_and(|t| *t < lsn) {
                tracing::debug!(shard = %name, lsn, first_turn = ?lock(&turns).first(), pending = pending.len(), "owner waits for an earlier turn");
                break;
            }
            let Some((_, (k, ops, reply))) = pending.pop_first() else {
                break;
            };
            let r = shard
                .apply(&Txn { lsn, ops })
                .map_err(|source| EngineError::Shard {
                    shard: name.clone(),
                    source,
                })
                .and_then(|_| ctx.hit(&ctx.crash.nth("after_commit", k)));
            match r {
                Ok(()) => {
                    lock(&turns).remove(&lsn);
                    let _ = reply.send(Ok(()));
                    applied += 1;
                }
                Err(e) => {
                    let _ = reply.send(Err(e.clone_for_reply()));
                    failure = Some(e);
                    break;
                }
            }
        }
        if applied > 0 {
            tracing::debug!(shard = %name, applied, "owner round");
            ctx.stats
                .shard_txns
                .fetch_add(applied as u64, Ordering::Relaxed);
        }
        // One flush for every request of the round: each asker's transaction was applied
        // before it asked.
        if !flushes.is_empty() {
            if failure.is_none() {
                if let Err(source) = shard.flush() {
                    failure = Some(EngineError::Shard {
                        shard: name.clone(),
                        source,
                    });
                }
                ctx.stats.shard_flushes.fetch_add(1, Ordering::Relaxed);
            }
            for (k, reply) in std::mem::take(&mut flushes) {
                let r = match &failure {
                    Some(e) => Err(e.clone_for_reply()),
                    None => ctx.hit(&ctx.crash.nth("after_flush", k)),
                };
                if let Err(e) = &r {
                    failure.get_or_insert_with(|| e.clone_for_reply());
                }
                let _ = reply.send(r);
            }
        }
        if let Some(e) = failure {
            tracing::warn!(shard = %name, error = %e, "shard owner stopped");
            dead = Some(e.to_string());
        }
    }
}

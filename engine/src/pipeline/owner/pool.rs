//! The shard pool: each shard's mailbox and cell, and the threads that run their rounds
//! (`shard_threads` of them; the module comment of `owner.rs` says how).

use super::*;
impl Cell {
    /// Queues `msg` (blocking while the mailbox is full); if no round of the shard is queued
    /// or running, starts one `at` the pool or here. Either way `scheduled` is taken first,
    /// so one thread at a time runs the owner (the single writer), and a message that comes
    /// during a round run here is handed to the pool when it ends ([`Cell::run`]).
    pub(super) fn post(self: &Arc<Self>, msg: ShardMsg, at: Where) -> Result<(), EngineError> {
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

    pub(super) fn queue(self: &Arc<Self>) -> Result<(), EngineError> {
        let pool = self.pool.upgrade().ok_or(EngineError::Failed)?;
        pool.push(self.clone());
        Ok(())
    }

    /// On a tick: queues the shard unless it is queued already or closed.
    pub(super) fn poke(self: &Arc<Self>) {
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
    pub(super) fn run(self: Arc<Self>, at: Where) {
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
    pub(super) fn run_caught(self: Arc<Self>, at: Where) {
        let c = self.clone();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.run(at))).is_err() {
            tracing::error!(shard = %self.name, "shard owner panicked");
            self.close();
        }
    }

    /// Takes nothing more and drops the owner (waiting for a round that runs now).
    pub(super) fn close(&self) {
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

impl ShardPool {
    /// Starts `threads` pool threads (at least one), ticking by `clock`.
    pub fn start(threads: usize, clock: Clock) -> std::io::Result<Arc<ShardPool>> {
        let pool = Arc::new(ShardPool {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            cells: Mutex::new(Vec::new()),
            ticked: Mutex::new((clock.now(), 0)),
            clock,
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

    pub(super) fn push(&self, cell: Arc<Cell>) {
        lock(&self.queue).push_back(cell);
        self.ready.notify_one();
    }

    /// The next shard to run, waiting up to a tick for one.
    pub(super) fn next(&self) -> Option<Arc<Cell>> {
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

    /// Once per [`TICK`] by the storage's clock (one thread does it): queues the shards that
    /// asked for a tick, and every shard every [`FULL_TICK_EVERY`] ticks.
    pub(super) fn tick_if_due(&self) {
        let n = {
            let Ok(mut t) = self.ticked.try_lock() else {
                return;
            };
            let now = self.clock.now();
            if now.saturating_duration_since(t.0) < TICK {
                return;
            }
            *t = (now, t.1 + 1);
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

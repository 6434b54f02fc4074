//! A shard owner's state and its round: the only holder of its `Shard`, run by one pool
//! thread at a time (`pool.rs`), applying turns in lsn order, flushing, compacting and
//! closing the shard while idle.

use super::*;
impl Owner {
    /// One round: `msgs` in order, then (unless dead) every apply whose turn it is, one
    /// flush for the round's flush requests, and, on the pool, a compaction step and the
    /// idle close (a worker's round leaves them to the tick: they are not the client's wait).
    /// Returns whether the shard wants the pool's next tick (a transaction waits for an
    /// earlier turn, compaction has work, or an idle close may come before a full tick).
    pub(super) fn round(&mut self, msgs: Vec<ShardMsg>, at: Where) -> bool {
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
    pub(super) fn close_if_idle(&mut self) {
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
        let idle = self.ctx.clock.since(self.used_at);
        if busy || idle < after {
            return;
        }
        self.held.close();
        tracing::debug!(shard = %self.name, idle_ms = idle.as_millis() as u64, "shard closed while idle");
    }

    /// An open shard whose idle close comes sooner than the pool's full tick asks for every
    /// tick, so it closes within a tick of it (a short `shard_idle_close_ms`, as in tests).
    pub(super) fn close_soon(&self) -> bool {
        let full = TICK * FULL_TICK_EVERY as u32;
        self.held.shard.is_some() && self.ctx.idle_close.is_some_and(|d| d < full)
    }

    /// Whether the shard holds `id`, reopening it if it was closed. A failure to reopen stops
    /// the owner (a dead owner reopens nothing).
    pub(super) fn contains(&mut self, id: u64) -> Result<bool, EngineError> {
        if let (Some(why), None) = (&self.dead, &self.held.shard) {
            return Err(why.clone_for_reply());
        }
        match self.held.open(&self.name) {
            Ok(shard) => shard.contains(id).map_err(|source| EngineError::Shard {
                shard: self.name.clone(),
                source,
            }),
            Err(e) => {
                tracing::warn!(shard = %self.name, error = %e, "shard owner stopped: reopen failed");
                let r = Err(e.clone_for_reply());
                self.dead = Some(e);
                r
            }
        }
    }
}

impl Held {
    pub(super) fn new(shard: Shard, opener: ShardOpener, stats: Arc<Stats>) -> Held {
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
    pub(super) fn open(&mut self, name: &str) -> Result<&mut Shard, EngineError> {
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
    pub(super) fn close(&mut self) {
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

    pub(super) fn figures(&self) -> ShardFigures {
        match &self.shard {
            Some(s) => ShardFigures {
                records: s.len(),
                max_id: s.max_id(),
                open: true,
                index_bytes: s.index_bytes() as u64,
            },
            None => ShardFigures {
                records: self.records,
                max_id: self.max_id,
                open: false,
                index_bytes: 0,
            },
        }
    }

    pub(super) fn compaction(&self) -> CompactionStats {
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
    pub(super) fn take(&mut self, m: ShardMsg) {
        let now = self.ctx.clock.now();
        match m {
            ShardMsg::Apply { mut txns, reply } => {
                self.used_at = now;
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
                self.used_at = now;
                self.flushes.push((k, reply));
            }
            ShardMsg::Contains { id, reply } => {
                self.used_at = now;
                let _ = reply.send(self.contains(id));
            }
            ShardMsg::Stats { reply } => {
                let _ = reply.send(self.held.figures());
            }
            ShardMsg::Compaction { reply } => {
                let _ = reply.send(self.held.compaction());
            }
            ShardMsg::Refill { reply } => {
                self.used_at = now;
                let _ = reply.send(self.refill());
            }
            ShardMsg::Reserve { bytes, reply } => {
                self.used_at = now;
                let _ = reply.send(self.reserve(bytes));
            }
        }
    }

    /// The spare's state where the engine reads it: why it is missing (the gate) and what
    /// it holds (the planner's reservations).
    pub(super) fn note_room(&self) {
        let shard = self.held.shard.as_ref();
        *lock(&self.room) = shard.and_then(Shard::spare_missing);
        if let Some(shard) = shard {
            self.spare_have.store(shard.spare_have(), Ordering::Relaxed);
        }
    }

    /// Grows the spare to hold a frame of `bytes`, reopening a closed shard (a dead owner
    /// writes nothing and says why).
    pub(super) fn reserve(&mut self, bytes: u64) -> Result<bool, EngineError> {
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
    pub(super) fn refill(&mut self) -> Result<bool, EngineError> {
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
    pub(super) fn compact_idle(&mut self) -> bool {
        let (rate, now) = (self.ctx.compact_rate, self.ctx.clock.now());
        let elapsed = now.saturating_duration_since(self.compacted_at);
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
        self.compacted_at = now;
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
    pub(super) fn refuse_all(&mut self) {
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
    pub(super) fn apply_turns(&mut self) -> Option<EngineError> {
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
    pub(super) fn flush_round(&mut self, failure: &mut Option<EngineError>) {
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

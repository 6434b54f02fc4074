//! The durability tail, settled in rounds shared across groups (issue 30, "not slower").
//!
//! Once a group's answers are given, each of its claims still owes its tail: every shard it
//! touched flushed, the audit log synced, then its `done` record. None of that is on the
//! client's wait (the answer stands on the durable claim: `finish.rs`), but run per group it
//! cost a closed-loop client four times the device syncs of the answer itself. So a group
//! only hands its claims in ([`Settler::hold_for_round`]: their keys answer duplicates from
//! then on), and a round settles every claim handed in since the last one: one flush per
//! shard any of them touched, one audit sync, their `done` records in one write. A round runs:
//! - in the worker that hands in the `tail_round_claims`-th claim waiting (the count keeps
//!   what recovery may have to apply again bounded by configuration, not by load);
//! - from the serve loop once the oldest has waited `tail_round_ms` (`Engine::settle_due`);
//! - whenever something needs a claim closed: a reused spool name (`names.rs`), a
//!   checkpoint, the last WAL sync of a graceful stop, recovery (each claim it finishes).
//!
//! Until its round, a claim stays open exactly as it did between its answer and its tail
//! before: no `done` record (recovery finishes it again from the claim, every step of that
//! idempotent), its shards not vouched for past it, a checkpoint held below it. One round
//! runs at a time; a worker that fills the count while one runs waits for it (so what
//! waits is bounded by `tail_round_claims` plus the batches in flight).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use roost_storage::lock;
use roost_wal::Lsn;

use super::claim_lock::Claims;
use super::crash::Step;
use super::effects_flush;
use super::env::Env;
use super::logs::Logs;
use super::owner::ShardSlot;
use super::records::ClaimRecord;
use super::round_queue::{Tail, Waiting};
use super::stats::Stats;
use crate::error::EngineError;

/// The durability tail's rounds, run with the parts a round touches: the logs (the WAL, the
/// audit log, the claims waiting), the claims part (a claim closed under the planner lock),
/// the environment (the latch, crash points, the waiters' condvar) and the counters.
pub(super) struct Settler<'a> {
    pub(super) log: &'a Logs,
    pub(super) claims: &'a Claims,
    pub(super) env: &'a Env,
    pub(super) stats: &'a Stats,
}

impl Settler<'_> {
    /// A group's claims, answered, handed to the next round (see the module comment): their
    /// keys answer from now on (a duplicate waiting for one is woken), and the round runs
    /// here if `tail_round_claims` are waiting now.
    pub(super) fn hold_for_round(
        &self,
        claims: &[(Lsn, &ClaimRecord)],
        tail: Tail<'_>,
    ) -> Result<(), EngineError> {
        if claims.is_empty() {
            return Ok(());
        }
        let (touched, last_row, committed) = tail.into_parts();
        let handed = claims.iter().zip(touched).map(|((lsn, c), t)| Waiting {
            lsn: *lsn,
            source: c.source.clone(),
            shards: t.into_iter().map(|t| (t.name.to_owned(), t.slot)).collect(),
            committed,
        });
        // Under the planner lock, so a reused name that found none of its earlier claims
        // waiting (`names.rs`) is already waiting on `finished_cv` when this one comes.
        let mut p = self.claims.lock();
        p.mark_answered(claims);
        self.stats
            .committed
            .fetch_add(claims.len() as u64, Ordering::Relaxed);
        self.stats
            .tail_waiting
            .fetch_add(claims.len() as u64, Ordering::Relaxed);
        let n = self.log.rounds().hand_in(handed, last_row);
        drop(p);
        self.env.finished_cv.notify_all();
        if n >= self.env.config.tail_round_claims.max(1) {
            self.settle()?;
        }
        Ok(())
    }

    /// Runs a round for every claim waiting (none: nothing is done). Returns how many it
    /// closed. A failure latches the engine: the claims it held stay open for recovery.
    pub fn settle(&self) -> Result<usize, EngineError> {
        let _one = lock(&self.log.rounds().running);
        if self.log.rounds().waiting() == 0 {
            return Ok(0);
        }
        // A failed engine leaves them waiting: recovery finishes them.
        self.env.check()?;
        let (claims, last_row) = self.log.rounds().take();
        let r = self.settle_round(&claims, last_row);
        if r.is_err() {
            self.env.fail();
        }
        r.map(|()| claims.len())
    }

    /// Whether claims have waited `tail_round_ms` for a round (the serve loop runs one).
    pub fn settle_due(&self) -> bool {
        self.log
            .rounds()
            .waited(Duration::from_millis(self.env.config.tail_round_ms))
    }

    /// One round: each touched shard flushed once, the audit log synced to the last row,
    /// the `done` records in one write (not synced on their own: they ride on the next
    /// group commit), the claims closed.
    fn settle_round(&self, claims: &[Waiting], last_row: Option<Lsn>) -> Result<(), EngineError> {
        let mut by_shard: BTreeMap<&str, &Arc<ShardSlot>> = BTreeMap::new();
        for (name, slot) in claims.iter().flat_map(|c| &c.shards) {
            by_shard.entry(name.as_str()).or_insert(slot);
        }
        let failed = || self.env.is_failed();
        effects_flush::effects_durable(
            by_shard.into_values(),
            last_row,
            self.log.audit(),
            &failed,
        )?;
        for _ in claims {
            self.env.hit(Step::AfterAuditSync.at())?;
        }
        let lsns: Vec<Lsn> = claims.iter().map(|c| c.lsn).collect();
        let dones = self.log.append_dones(&lsns, self.env)?;
        for (c, done) in claims.iter().zip(dones) {
            self.claims.lock().close(c, done);
            self.env.finished_cv.notify_all();
            (self.stats.latency.finish).record(self.env.clock.since(c.committed));
        }
        let n = claims.len() as u64;
        self.stats.tail_rounds.fetch_add(1, Ordering::Relaxed);
        self.stats.tail_settled.fetch_add(n, Ordering::Relaxed);
        self.stats.tail_waiting.fetch_sub(n, Ordering::Relaxed);
        Ok(())
    }
}

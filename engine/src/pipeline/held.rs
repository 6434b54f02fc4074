//! What a standby holds of its claims between fetches, and the claims a node finishes before
//! intake opens (`apply.rs` works on them; recovery fills them). It knows nothing of the
//! engine: the flushes it starts and waits for are given the audit log and the latch.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roost_storage::lock;
use roost_wal::{Lsn, Wal};

use super::effects_flush::{self, EffectsFlusher};
use super::owner::ShardSlot;
use super::records::{ClaimLedger, ClaimRecord};
use crate::error::EngineError;

/// The claims a standby holds back or has applied unflushed, and the claims to finish
/// before intake opens.
#[derive(Default)]
pub(super) struct HeldClaims {
    /// Held while a fetched chunk is applied, and by promotion.
    pub(super) apply_lock: Mutex<()>,
    /// Claims whose effects are applied but not yet flushed.
    pub(super) unflushed: Mutex<Unflushed>,
    /// Flushes begun behind the fetches, oldest first (at most [`FLUSHES_IN_FLIGHT`]).
    pub(super) flushing: Mutex<VecDeque<Flushing>>,
    /// A standby's claims without a `done` record yet (their effects are applied).
    pub(super) ledger: Mutex<ClaimLedger>,
    /// Claims to finish before intake opens: recovery's under `ack = "standby"` (a standby
    /// must have them before their results appear), and a promoted standby's.
    pub(super) deferred: Mutex<Vec<(Lsn, ClaimRecord)>>,
}

/// Effects a standby applied and has not flushed yet: the claims, the shards they touched,
/// the last audit row written, and when the oldest of them was applied.
#[derive(Default)]
pub(super) struct Unflushed {
    pub(super) claims: BTreeSet<Lsn>,
    pub(super) shards: BTreeMap<String, Arc<ShardSlot>>,
    pub(super) last_row: Option<Lsn>,
    pub(super) since: Option<Instant>,
}

/// When the effects a standby applied start flushing behind its fetches (step 4 of
/// `apply.rs`): once `claims` of them wait, or the oldest has waited `age`, looked at as
/// each chunk is applied (no timer). The leader settles its own in rounds (`settle.rs`) and
/// sends their `done` records after each round; a standby that flushed behind every chunk
/// made four shard flushes and an audit sync per batch at one client, most of the device
/// flushes of a three-node cluster on one disk (issue 42). A quarter of a round
/// (`tail_round_claims`, `tail_round_ms`) keeps the flushes ahead of the `done` records
/// that need them.
#[derive(Clone, Copy)]
pub(super) struct FlushDue {
    pub claims: usize,
    pub age: Duration,
    pub now: Instant,
}

impl FlushDue {
    /// Whether `u` is due (see the type).
    fn reached(&self, u: &Unflushed) -> bool {
        let old = u
            .since
            .is_some_and(|t| self.now.saturating_duration_since(t) >= self.age);
        !u.claims.is_empty() && (u.claims.len() >= self.claims || old)
    }
}

/// How many flushes a standby keeps running behind its fetches; past it, effects wait
/// unflushed for the next chunk (or their `done`).
pub(super) const FLUSHES_IN_FLIGHT: usize = 4;

/// A flush begun at the end of a chunk: the claims whose effects it makes durable, and
/// where the flusher answers (`effects_flush.rs`).
pub(super) struct Flushing {
    pub(super) claims: BTreeSet<Lsn>,
    pub(super) outcome: Receiver<Result<(), EngineError>>,
}

/// What the standby's flushes need of the engine: the audit log to sync, and the latch.
pub(super) struct FlushWith<'a> {
    pub audit: &'a Wal,
    pub failed: &'a dyn Fn() -> bool,
}

impl HeldClaims {
    /// Step 2 of `apply.rs`: before the `done` of `claim_lsn` is appended, its effects are
    /// durable: the flushes begun behind earlier chunks up to the one holding it are waited
    /// for (they finish in order), or, when its claim is still unflushed (it came in this
    /// chunk, or its flush was not due yet), flushed now.
    pub(super) fn effects_durable(&self, claim_lsn: Lsn, w: &FlushWith) -> Result<(), EngineError> {
        let mut flushing = lock(&self.flushing);
        if let Some(k) = flushing.iter().position(|f| f.claims.contains(&claim_lsn)) {
            for f in flushing.drain(..=k) {
                f.outcome.recv().map_err(|_| EngineError::Failed)??;
            }
            return Ok(());
        }
        drop(flushing);
        if lock(&self.unflushed).claims.contains(&claim_lsn) {
            return self.flush_unflushed(w);
        }
        Ok(())
    }

    /// Step 4 of `apply.rs`: once `due`, the effects applied so far start flushing while the
    /// leader finishes them (`effects_flush.rs`); flushes already finished are collected (a
    /// failure latches). Not yet due, or with [`FLUSHES_IN_FLIGHT`] running, the effects
    /// wait for a later chunk (or their `done`).
    pub(super) fn flush_behind(
        &self,
        flusher: &EffectsFlusher,
        w: &FlushWith,
        due: FlushDue,
    ) -> Result<(), EngineError> {
        let mut flushing = lock(&self.flushing);
        while let Some(f) = flushing.front() {
            match f.outcome.try_recv() {
                Ok(r) => {
                    flushing.pop_front();
                    r?;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Err(EngineError::Failed),
            }
        }
        let mut u = lock(&self.unflushed);
        if !due.reached(&u) || flushing.len() >= FLUSHES_IN_FLIGHT {
            return Ok(());
        }
        let u = std::mem::take(&mut *u);
        let sent = effects_flush::send_flushes(u.shards.values())?;
        match flusher.ask(sent, u.last_row) {
            Ok(outcome) => flushing.push_back(Flushing {
                claims: u.claims,
                outcome,
            }),
            // No thread: waited for here, as before the flusher.
            Err(sent) => effects_flush::wait_durable(&sent, u.last_row, w.audit, w.failed)?,
        }
        Ok(())
    }

    /// Every effect applied and not yet flushed, flushed now (promotion: the claims become
    /// the new primary's to finish, and their audit rows, already written, are not written
    /// again there, so the finish's round would not sync them before their `done`).
    pub(super) fn flush_unflushed(&self, w: &FlushWith) -> Result<(), EngineError> {
        let u = std::mem::take(&mut *lock(&self.unflushed));
        if u.claims.is_empty() {
            return Ok(());
        }
        flush_effects(&u.shards, u.last_row, w)
    }

    /// Every flush begun behind the fetches waited for (promotion, before intake opens).
    pub(super) fn drain_flushing(&self) -> Result<(), EngineError> {
        let flushing = std::mem::take(&mut *lock(&self.flushing));
        let mut first = Ok(());
        for f in flushing {
            let r = f
                .outcome
                .recv()
                .map_err(|_| EngineError::Failed)
                .and_then(|r| r);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// The one tail ([`effects_flush::effects_durable`]) over the shards a standby touched.
pub(super) fn flush_effects(
    shards: &BTreeMap<String, Arc<ShardSlot>>,
    last_row: Option<Lsn>,
    w: &FlushWith,
) -> Result<(), EngineError> {
    effects_flush::effects_durable(shards.values(), last_row, w.audit, w.failed)
}

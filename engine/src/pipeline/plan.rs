//! The one way in ([`Engine::submit`]): every batch, whatever its intake (a spool file, a
//! burst of them, a bulk file's lines, a stream's lines, a forwarded batch), runs as a group,
//! a batch alone being a group of one. The intake decides only how the answers are delivered
//! ([`Deliver`]). One pass of a group:
//! - Plan: the idempotency check and the static checks and before-triggers, without a lock;
//!   then, under one planner lock in item order (so a key's first batch decides it, as in
//!   line order), the state checks and a rejection or a claim (ids minted, one WAL record).
//!   The first rejection ends a batch and nothing but its answer is written.
//! - Claim: one WAL sync for every claim and rejection of the group.
//! - Commit and Finish (`finish.rs`): every shard transaction sent before any is waited
//!   for, the audit rows, the answers; then the claims are handed to the durability tail's
//!   next round (`settle.rs`: one flush per touched shard, one audit sync and the `done`
//!   records for every claim answered since the last round).
//!
//! A batch whose key is claimed and still in flight (perhaps by an earlier batch of the same
//! group) waits for it after the pass, then runs again: a duplicate or a conflict. When the
//! engine cannot take a batch now (a pause), the batches claimed before it are finished and
//! the pause is returned: the caller gives none of the group's answers and may send the
//! group again (the keys answer again).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use roost_storage::Clock;
use roost_wal::Lsn;
use tracing::{debug, warn};

use super::answers::is_detached;
use super::crash::Step;
use super::records::ClaimRecord;
use super::stats::Stats;
use super::{Engine, KeyFound, KeyState, Planner};
use crate::batch::{fingerprint, missing_field, Batch, BatchOp, BatchResult};
use crate::config::Config;
use crate::error::EngineError;
use crate::spool;

/// How a group's answers are delivered: the one thing the intake decides.
pub enum Deliver<'a> {
    /// Spool files (`(batch, NAME)` for `new/NAME`): when [`Engine::submit`] returns `Ok`,
    /// each answer is published as `out/NAME` and its input removed; on a pause, the files
    /// not answered are still in `new/`.
    Files,
    /// Detached batches (a bulk file's line `bulk/NAME/LINE`, a streamed one
    /// `stream/CONN/N`, a forwarded one `fwd/REPLICA/N`: a source with a `/`, which no spool
    /// name has, so recovery never takes it for a file): the answers are only returned, as
    /// durable as a published result file would be.
    Returned,
    /// [`Deliver::Returned`], each answer also handed to the callback (its index, the answer)
    /// as soon as it is as durable as a published result file, before the group's durability
    /// tail, where a spool file's result is published (the stream). An item is handed over
    /// at most once; a group stopped by a pause hands over nothing early.
    Early(&'a mut dyn FnMut(usize, &BatchResult)),
}

/// Where one batch of a pass stands.
pub(super) enum Slot {
    /// To be planned: its fingerprint and its static rejection, if any.
    Plan {
        fp: u64,
        static_reject: Option<(usize, String)>,
    },
    /// Answered without a record of its own (a duplicate or a conflict seen before the lock).
    Answered(BatchResult),
    /// Its key has an answer, found under the lock; built once the lock is dropped.
    Known { fp: u64, k: KeyState },
    /// Rejected by this pass: the record's lsn and the answer, given once it is durable.
    Rejected(Lsn, BatchResult),
    /// Claimed by this pass.
    Claimed(Lsn, ClaimRecord),
    /// The same batch is claimed and in flight: runs again once it is finished.
    Later,
}

impl Engine {
    /// Runs `items` (batch, source) through the pipeline as one group (see the module
    /// comment) and returns their answers in item order, delivered as `deliver` says.
    /// Every source must fit the mode (a spool name for [`Deliver::Files`], a detached
    /// source otherwise), or nothing is done.
    pub fn submit(
        &self,
        items: &[(&Batch, &str)],
        deliver: Deliver<'_>,
    ) -> Result<Vec<BatchResult>, EngineError> {
        let files = matches!(deliver, Deliver::Files);
        for (_, s) in items {
            source_fits(s, files)?;
        }
        let mut nothing = |_: usize, _: &BatchResult| {};
        let hand: &mut dyn FnMut(usize, &BatchResult) = match deliver {
            Deliver::Early(f) => f,
            Deliver::Files | Deliver::Returned => &mut nothing,
        };
        let (key, source) = items
            .first()
            .map_or(("", ""), |(b, s)| (b.request_key.as_str(), *s));
        self.admit(items.len() as u64, (key, source), || self.run(items, hand))
    }

    /// Runs `work` for `n` new batches if the engine takes batches now (not failed, primary,
    /// intake not paused), counting them in flight meanwhile. A failure that is not just "not
    /// now" (a pause, not primary) latches the engine: nothing more is written until a
    /// restart's recovery repairs. `(request_key, source)` name the work in the log.
    pub(super) fn admit<T>(
        &self,
        n: u64,
        (request_key, source): (&str, &str),
        work: impl FnOnce() -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        self.env.check()?;
        self.log_role.check_primary()?;
        self.room().gate()?;
        self.stats.in_flight.fetch_add(n, Ordering::Relaxed);
        let r = work();
        self.stats.in_flight.fetch_sub(n, Ordering::Relaxed);
        if let Err(e) = &r {
            if e.latches_nothing() {
                return r;
            }
            if !matches!(e, EngineError::Failed) {
                warn!(error = %e, request_key, source, "pipeline failed");
            }
            self.env.fail();
        }
        r
    }

    /// One pass over `items`, then another over those whose key was in flight, once it is
    /// finished, until every item has its answer.
    fn run(
        &self,
        items: &[(&Batch, &str)],
        hand: &mut dyn FnMut(usize, &BatchResult),
    ) -> Result<Vec<BatchResult>, EngineError> {
        let mut out = self.pass(items, hand)?;
        loop {
            let later: Vec<usize> = (0..out.len()).filter(|i| out[*i].is_none()).collect();
            if later.is_empty() {
                return Ok(out.into_iter().flatten().collect());
            }
            let again: Vec<(&Batch, &str)> = later.iter().map(|i| items[*i]).collect();
            for (b, _) in &again {
                let k = (b.request_key.as_str(), fingerprint(b));
                let (keys, role) = (&self.keys, self.log_role.as_ref());
                self.claims.wait_in_flight(keys, &self.env, role, k)?;
            }
            let answers = self.pass(&again, &mut |j, r| hand(later[j], r))?;
            for (i, r) in later.into_iter().zip(answers) {
                out[i] = r;
            }
        }
    }

    /// Plan, Claim, Commit and Finish for `items`, once each, their claims then handed to
    /// the durability tail's next round; `None` for an item whose key is in flight.
    fn pass(
        &self,
        items: &[(&Batch, &str)],
        hand: &mut dyn FnMut(usize, &BatchResult),
    ) -> Result<Vec<Option<BatchResult>>, EngineError> {
        let t0 = self.env.clock.now();
        let mut slots = Vec::with_capacity(items.len());
        let mut seen = HashSet::with_capacity(items.len());
        for (b, _) in items {
            // A key met earlier in the group is looked up only under the lock, after the
            // earlier item is planned: item order decides what it means.
            let first = seen.insert(b.request_key.as_str());
            slots.push(self.before_lock(b, first)?);
        }
        let halt = self.plan_group(items, &mut slots)?;
        let planned = self.env.clock.now();
        let claims: Vec<(Lsn, &ClaimRecord)> = slots
            .iter()
            .filter_map(|s| match s {
                Slot::Claimed(lsn, c) => Some((*lsn, c)),
                _ => None,
            })
            .collect();
        let (prepared, synced) =
            (self.answers).prepare_during_sync(&self.log, &self.env, &claims)?;
        for _ in &claims {
            self.env.hit(Step::AfterClaimSync.at())?;
            self.stats.latency.plan.record(planned - t0);
            self.stats
                .latency
                .claim
                .record(synced.saturating_duration_since(planned));
        }
        let (committed, tail) = self.commit_and_answer(&claims, &[], Some(t0), prepared)?;
        // Answers before the tail: on a pause none is given (the caller sends the group
        // again and the keys answer again), so only a group that ran whole answers early.
        let answers = match halt {
            None => self.answers(items, &slots, committed, hand),
            Some(_) => Ok(Vec::new()),
        };
        self.tail().hold_for_round(&claims, tail)?;
        match halt {
            Some(e) => Err(e),
            None => answers,
        }
    }

    /// Before the planner lock: the cheap idempotency check (for the first item with its
    /// key), then the static checks and before-triggers.
    fn before_lock(&self, b: &Batch, first_with_key: bool) -> Result<Slot, EngineError> {
        let fp = fingerprint(b);
        if first_with_key {
            // The answer for a key already seen, if it has one: a conflict (another
            // fingerprint) or the original result (finished). An unfinished claim of the
            // same batch has none yet.
            let k = self.claims.lock().key(&self.keys, &b.request_key)?;
            if let Some(r) = self.claims.answer_for(
                (&self.keys, &self.log, self.log_role.as_ref(), &self.stats),
                (&b.request_key, fp),
                k,
            )? {
                return Ok(Slot::Answered(r));
            }
        }
        Ok(Slot::Plan {
            fp,
            static_reject: precheck(&self.env.config, &self.env.clock, b),
        })
    }

    /// Under one planner lock, in item order: every batch still to plan is rejected or
    /// claimed (records appended, not synced). Returns the pause that stopped the pass, if
    /// one did (the batches after it stay unplanned). Each claim passes its crash point
    /// `after_claim_append` once the lock is dropped: a test that holds a batch there lets
    /// others look at its key meanwhile.
    fn plan_group(
        &self,
        items: &[(&Batch, &str)],
        slots: &mut [Slot],
    ) -> Result<Option<EngineError>, EngineError> {
        let mut p = self.claims.lock();
        let mut halt = None;
        for ((b, source), slot) in items.iter().zip(slots.iter_mut()) {
            let Slot::Plan { fp, static_reject } = slot else {
                continue;
            };
            match self.plan_one(&mut p, b, source, *fp, static_reject.take()) {
                Ok(s) => *slot = s,
                Err(e) if e.latches_nothing() => {
                    halt = Some(e);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        drop(p);
        for s in slots.iter() {
            if let Slot::Claimed(..) = s {
                self.env.hit(Step::AfterClaimAppend.at())?;
            }
        }
        Ok(halt)
    }

    /// One batch under the planner lock: its key, its deletes, then a rejection or a claim.
    fn plan_one(
        &self,
        p: &mut Planner,
        b: &Batch,
        source: &str,
        fp: u64,
        static_reject: Option<(usize, String)>,
    ) -> Result<Slot, EngineError> {
        self.env.check()?;
        // A roll may have used the WAL's spare for an earlier item: pause cleanly here.
        self.room().gate_wal()?;
        match p.key(&self.keys, &b.request_key)?.map(|k| k.check(fp)) {
            Some(KeyFound::Answered(k)) => return Ok(Slot::Known { fp, k }),
            Some(KeyFound::InFlight) => return Ok(Slot::Later),
            None | Some(KeyFound::Free) => {}
        }
        // The checks that depend on state, up to the static rejection: the first op that
        // would create a shard past `shards_max` (`shard_limit.rs`), else the first delete
        // of an id that does not exist before it.
        let limit = static_reject.as_ref().map_or(b.ops.len(), |(i, _)| *i);
        let over = self.shards.first_over(b, limit, self.env.config.shards_max);
        let limit = over.as_ref().map_or(limit, |(i, _)| *i);
        let state_reject = p.missing_delete(&self.shards, b, limit)?.or(over);
        if let Some(why) = state_reject.or(static_reject) {
            let (lsn, rec) = p.append_rejection(self.log.wal(), (b, source, fp), why)?;
            let r = rejected(
                &self.stats,
                &rec.request_key,
                rec.op_index as usize,
                rec.reason,
            );
            return Ok(Slot::Rejected(lsn, r));
        }
        self.env.hit(Step::AfterPlan.at())?;
        self.room().reserve_room(b)?;
        let (lsn, claim) = p.claim(&self.log, &self.shards, (b, source, fp))?;
        Ok(Slot::Claimed(lsn, claim))
    }
}

/// Static checks and before-triggers, in op order, without any lock: the first op that
/// fails and why. These outcomes depend on the op alone, so they are the same on every
/// attempt.
fn precheck(config: &Config, clock: &Clock, batch: &Batch) -> Option<(usize, String)> {
    for (i, op) in batch.ops.iter().enumerate() {
        let Some(sc) = config.shard(op.shard()) else {
            let reason = format!(
                "shard {:?} is not declared in the configuration",
                op.shard()
            );
            return Some((i, reason));
        };
        if let BatchOp::Create { record, .. } = op {
            if record.len() > sc.record_bytes_max as usize {
                let reason = format!(
                    "record is {} bytes, over record_bytes_max {}",
                    record.len(),
                    sc.record_bytes_max
                );
                return Some((i, reason));
            }
            if let Some(f) = missing_field(record, &sc.required_fields) {
                return Some((i, format!("record lacks required field {f:?}")));
            }
        }
        if let Some(argv) = &sc.before_trigger {
            let input = trigger_input(&batch.request_key, i, op);
            let limit = Duration::from_millis(sc.trigger_timeout_ms);
            if let Err(reason) = super::trigger::run(argv, &input, limit, clock) {
                return Some((i, reason));
            }
        }
    }
    None
}

/// A rejection's answer (counted).
fn rejected(stats: &Stats, key: &str, op_index: usize, reason: String) -> BatchResult {
    stats.rejected.fetch_add(1, Ordering::Relaxed);
    debug!(request_key = key, op_index, reason = %reason, "batch rejected");
    BatchResult::Rejected {
        request_key: key.to_owned(),
        op_index: op_index as u32,
        reason,
    }
}

/// What a before-trigger reads on stdin for op `i`.
fn trigger_input(key: &str, i: usize, op: &BatchOp) -> Vec<u8> {
    let v = match op {
        BatchOp::Create { shard, record, .. } => {
            let record: serde_json::Value =
                serde_json::from_slice(record).unwrap_or(serde_json::Value::Null);
            serde_json::json!({"request_key": key, "op_index": i, "op": "create", "shard": shard, "record": record})
        }
        BatchOp::Delete { shard, id } => {
            serde_json::json!({"request_key": key, "op_index": i, "op": "delete", "shard": shard, "id": id})
        }
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

/// `source` fits the mode: a spool file's name for files, else detached
/// ([`Deliver::Returned`]); or the call is refused before any work.
fn source_fits(source: &str, files: bool) -> Result<(), EngineError> {
    let detail = match (files, is_detached(source)) {
        (true, false) if spool::valid_spool_name(source) => return Ok(()),
        (false, true) => return Ok(()),
        (true, _) => format!("{source:?} is not a spool file's name"),
        (false, false) => format!("detached source {source:?} has no '/'"),
    };
    Err(EngineError::Inconsistent { lsn: 0, detail })
}

/// The answer of a group of one.
pub fn one_answer(answers: Vec<BatchResult>) -> Result<BatchResult, EngineError> {
    answers.into_iter().next().ok_or(EngineError::Inconsistent {
        lsn: 0,
        detail: "a batch submitted alone got no answer".into(),
    })
}

//! Many batches in one pass (issue 16): a bulk file's lines, a stream's buffered lines
//! ([`Engine::submit_group`], detached), or spool files found waiting together
//! ([`Engine::submit_files`]). Each batch keeps its own plan, claim and answer, exactly as
//! [`Engine::submit_detached`] or [`Engine::submit`] would give it, but the group shares the
//! work around them:
//! - one planner lock for every plan and claim, in item order (so a key's first batch in the
//!   group decides it, as in line order);
//! - one WAL sync for every claim and rejection (a group commit of the whole group);
//! - every shard transaction sent before any is waited for, then one flush per touched
//!   shard and one audit sync for the group, then the `done` records;
//! - for files, every input removed (each after its name settles, as alone), then every
//!   committed result published in one round (`Publisher::publish_many`). Other answers (a
//!   rejection, a duplicate, a conflict) are published one by one, as alone.
//!
//! A batch whose key is claimed and still in flight (perhaps by an earlier batch of the
//! same group) runs alone afterwards through [`Engine::submit_detached`], which waits for it
//! and answers as a duplicate or a conflict. When the engine cannot take a batch now (a
//! pause), the batches claimed before it are finished and the pause is returned: the caller
//! gives none of the group's answers and may send the group again (the keys answer again).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use roost_wal::Lsn;

use super::crash::Step;
use super::finish::{touched_ids, transactions, Touched};
use super::owner::{ShardSlot, Turn};
use super::records::ClaimRecord;
use super::{lock, Engine, KeyFound, KeyState, Planner};
use crate::batch::{fingerprint, Batch, BatchResult};
use crate::error::EngineError;

/// What a group still owes once its answers are made: each claim's touched shards (to
/// flush, then to close the claim with) and the last audit row written (to sync).
struct Tail<'c> {
    touched: Vec<Vec<Touched<'c>>>,
    last_row: Option<Lsn>,
}

/// Where one batch of a group stands.
enum Slot {
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
    /// The same batch is claimed and in flight: run alone after the group.
    Later,
}

impl Engine {
    /// Runs `items` (batch, detached source) as one group (see the module comment) and
    /// returns their answers in item order; when this returns `Ok`, every answer is as
    /// durable as [`Engine::submit_detached`]'s.
    pub fn submit_group(&self, items: &[(&Batch, &str)]) -> Result<Vec<BatchResult>, EngineError> {
        self.admit_group(items, super::plan::detached_only, &mut |_, _| {})
    }

    /// [`Engine::submit_group`], handing each item's answer to `answered` (its index, the
    /// answer) as soon as it is as durable as a published result file: the claims synced,
    /// their transactions applied and their audit rows written, before the group's
    /// durability tail (the shards' flushes, the audit sync, the `done` records), exactly
    /// where a spool file's result is published. The stream writes its answers there. An
    /// item is handed over at most once; the returned answers hold them all. A group
    /// stopped by a pause hands over nothing early.
    pub fn submit_group_early(
        &self,
        items: &[(&Batch, &str)],
        answered: &mut dyn FnMut(usize, &BatchResult),
    ) -> Result<Vec<BatchResult>, EngineError> {
        self.admit_group(items, super::plan::detached_only, answered)
    }

    /// [`Engine::submit_group`] for spool files (`(batch, NAME)` for `new/NAME`): each
    /// answered as [`Engine::submit`] would answer it (input removed, `out/NAME` written),
    /// the committed ones' results published in one round. When this returns `Ok`, every
    /// result file is in `out/`; on a pause, the files not answered are still in `new/`.
    pub fn submit_files(&self, items: &[(&Batch, &str)]) -> Result<Vec<BatchResult>, EngineError> {
        self.admit_group(items, super::plan::attached_only, &mut |_, _| {})
    }

    /// Every source passes `check`, then the group runs under one admission.
    fn admit_group(
        &self,
        items: &[(&Batch, &str)],
        check: fn(&str) -> Result<(), EngineError>,
        answered: &mut dyn FnMut(usize, &BatchResult),
    ) -> Result<Vec<BatchResult>, EngineError> {
        for (_, s) in items {
            check(s)?;
        }
        let (key, source) = items
            .first()
            .map_or(("", ""), |(b, s)| (b.request_key.as_str(), *s));
        self.admit(items.len() as u64, (key, source), || {
            self.group_inner(items, answered)
        })
    }

    fn group_inner(
        &self,
        items: &[(&Batch, &str)],
        answered: &mut dyn FnMut(usize, &BatchResult),
    ) -> Result<Vec<BatchResult>, EngineError> {
        let t0 = Instant::now();
        let mut slots = Vec::with_capacity(items.len());
        let mut seen = HashSet::with_capacity(items.len());
        for (b, _) in items {
            // A key met earlier in the group is looked up only under the lock, after the
            // earlier item is planned: line order decides what it means.
            let first = seen.insert(b.request_key.as_str());
            slots.push(self.before_lock(b, first)?);
        }
        let halt = self.plan_group(items, &mut slots)?;
        let claims: Vec<(Lsn, &ClaimRecord)> = slots
            .iter()
            .filter_map(|s| match s {
                Slot::Claimed(lsn, c) => Some((*lsn, c)),
                _ => None,
            })
            .collect();
        if let Some(last) = claims.iter().map(|(l, _)| *l).max() {
            self.wal.sync_to(last)?;
            for _ in &claims {
                self.hit(Step::AfterClaimSync.at())?;
                self.stats.latency.claim.record(t0.elapsed());
            }
        }
        let (committed, tail) = self.commit_and_answer(&claims, t0)?;
        // Answers before the tail: on a pause none is given (the caller sends the group
        // again and the keys answer again), so only a group that ran whole answers early.
        let early = match halt {
            None => self.early_answers(items, &slots, committed, answered),
            Some(_) => Ok(Vec::new()),
        };
        self.run_tail(&claims, tail)?;
        if let Some(e) = halt {
            return Err(e);
        }
        let mut early = early?.into_iter();
        let mut out = Vec::with_capacity(items.len());
        for (b, source) in items {
            match early.next().flatten() {
                Some(r) => out.push(r),
                None => out.push(self.submit_inner(b, source)?),
            }
        }
        Ok(out)
    }

    /// Every item's answer that needs no other batch to finish first, handed to `answered`
    /// as it is made; `None` for an item to run alone after the group ([`Slot::Later`]).
    fn early_answers(
        &self,
        items: &[(&Batch, &str)],
        slots: &[Slot],
        committed: Vec<BatchResult>,
        answered: &mut dyn FnMut(usize, &BatchResult),
    ) -> Result<Vec<Option<BatchResult>>, EngineError> {
        let mut committed = committed.into_iter();
        let mut out = Vec::with_capacity(items.len());
        for (i, ((b, source), slot)) in items.iter().zip(slots).enumerate() {
            let r = self.group_answer(b, source, slot, &mut committed)?;
            if let Some(r) = &r {
                answered(i, r);
            }
            out.push(r);
        }
        Ok(out)
    }

    /// Before the planner lock: the cheap idempotency check (for the first item with its
    /// key), then the static checks and before-triggers.
    fn before_lock(&self, b: &Batch, first_with_key: bool) -> Result<Slot, EngineError> {
        let fp = fingerprint(b);
        if first_with_key {
            if let Some(r) = self.check_key(&b.request_key, fp)? {
                return Ok(Slot::Answered(r));
            }
        }
        Ok(Slot::Plan {
            fp,
            static_reject: self.precheck(b),
        })
    }

    /// Under one planner lock, in item order: every batch still to plan is rejected or
    /// claimed (records appended, not synced). Returns the pause that stopped the pass, if
    /// one did (the batches after it stay unplanned).
    fn plan_group(
        &self,
        items: &[(&Batch, &str)],
        slots: &mut [Slot],
    ) -> Result<Option<EngineError>, EngineError> {
        let mut p = lock(&self.planner);
        for ((b, source), slot) in items.iter().zip(slots.iter_mut()) {
            let Slot::Plan { fp, static_reject } = slot else {
                continue;
            };
            match self.plan_one(&mut p, b, source, *fp, static_reject.take()) {
                Ok(s) => *slot = s,
                Err(e) if e.latches_nothing() => return Ok(Some(e)),
                Err(e) => return Err(e),
            }
        }
        Ok(None)
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
        self.check()?;
        // A roll may have used the WAL's spare for an earlier item: pause cleanly here.
        self.gate_wal()?;
        match self.key_state(p, &b.request_key)?.map(|k| k.check(fp)) {
            Some(KeyFound::Answered(k)) => return Ok(Slot::Known { fp, k }),
            Some(KeyFound::InFlight) => return Ok(Slot::Later),
            None | Some(KeyFound::Free) => {}
        }
        let limit = static_reject.as_ref().map_or(b.ops.len(), |(i, _)| *i);
        if let Some(why) = self.plan_state(p, b, limit)?.or(static_reject) {
            let (lsn, rec) = self.append_rejection(p, b, source, fp, why)?;
            let r = self.rejected(&rec.request_key, rec.op_index as usize, rec.reason);
            return Ok(Slot::Rejected(lsn, r));
        }
        self.hit(Step::AfterPlan.at())?;
        let (lsn, claim) = self.claim(p, b, source, fp)?;
        self.hit(Step::AfterClaimAppend.at())?;
        Ok(Slot::Claimed(lsn, claim))
    }

    /// Commit and Finish up to the answers for the group's durable claims: every
    /// transaction sent before any is waited for, the audit rows, the answers (in claim
    /// order). What is left is the [`Tail`], for [`Engine::run_tail`].
    fn commit_and_answer<'c>(
        &self,
        claims: &[(Lsn, &'c ClaimRecord)],
        t0: Instant,
    ) -> Result<(Vec<BatchResult>, Tail<'c>), EngineError> {
        let mut tail = Tail {
            touched: Vec::new(),
            last_row: None,
        };
        if claims.is_empty() {
            return Ok((Vec::new(), tail));
        }
        let t_commit = Instant::now();
        tail.touched = self.commit_group(claims)?;
        self.stats.latency.commit.record(t_commit.elapsed());
        tail.last_row = self.write_group_audit_rows(claims)?;
        Ok((self.answer_group(claims, t0)?, tail))
    }

    /// The group's durability tail: one flush per touched shard, one audit sync, then each
    /// claim's `done` record, and the claims closed.
    fn run_tail(&self, claims: &[(Lsn, &ClaimRecord)], tail: Tail<'_>) -> Result<(), EngineError> {
        if claims.is_empty() {
            return Ok(());
        }
        let mut by_shard: BTreeMap<&str, &Touched<'_>> = BTreeMap::new();
        for t in tail.touched.iter().flatten() {
            by_shard.entry(t.name).or_insert(t);
        }
        self.flush_touched(by_shard.into_values())?;
        if let Some(last) = tail.last_row {
            self.audit.sync_to(last)?;
        }
        for _ in claims {
            self.hit(Step::AfterAuditSync.at())?;
        }
        let lsns: Vec<Lsn> = claims.iter().map(|(l, _)| *l).collect();
        let dones = self.append_dones(&lsns)?;
        for (((lsn, c), t), done) in claims.iter().zip(&tail.touched).zip(dones) {
            self.close_claim(*lsn, c, t, done);
        }
        Ok(())
    }

    /// Every claim's transactions sent, one message per touched shard for the whole group
    /// (its transactions in lsn order), then every shard's answer collected (all of them,
    /// even after a failure, so no owner is still writing when this returns), then the
    /// planning overlays cleared under one lock. Returns each claim's touched shards.
    fn commit_group<'c>(
        &self,
        claims: &[(Lsn, &'c ClaimRecord)],
    ) -> Result<Vec<Vec<Touched<'c>>>, EngineError> {
        let mut touched: Vec<Vec<Touched<'c>>> = Vec::with_capacity(claims.len());
        let mut by_shard: BTreeMap<&str, (Arc<ShardSlot>, Vec<Turn>)> = BTreeMap::new();
        for (lsn, c) in claims {
            let mut mine = Vec::new();
            for (k, (name, ops)) in transactions(c).into_iter().enumerate() {
                let slot = match by_shard.get(name) {
                    Some((slot, _)) => slot.clone(),
                    None => self.slot(name)?,
                };
                let ids = touched_ids(&ops);
                let turn = Turn { lsn: *lsn, k, ops };
                by_shard
                    .entry(name)
                    .or_insert_with(|| (slot.clone(), Vec::new()))
                    .1
                    .push(turn);
                mine.push(Touched { name, slot, ids });
            }
            touched.push(mine);
        }
        let mut sent = Vec::with_capacity(by_shard.len());
        let mut first_err = None;
        for (slot, turns) in by_shard.into_values() {
            match slot.send_apply(turns) {
                Ok(rx) => sent.push((slot, rx)),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        for (slot, rx) in sent {
            if let Err(e) = slot.wait(&rx, &|| self.is_failed()) {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        self.clear_overlays(touched.iter().flatten());
        Ok(touched)
    }

    /// One item's answer once the group's records are durable; `None` when it must run
    /// alone after the group.
    fn group_answer(
        &self,
        b: &Batch,
        source: &str,
        slot: &Slot,
        committed: &mut impl Iterator<Item = BatchResult>,
    ) -> Result<Option<BatchResult>, EngineError> {
        let key = b.request_key.as_str();
        let r = match slot {
            Slot::Answered(r) => self.reply(source, r.clone())?,
            Slot::Rejected(lsn, r) => {
                self.answer_durable(*lsn)?;
                self.reply(source, r.clone())?
            }
            Slot::Claimed(lsn, _) => committed.next().ok_or(EngineError::Inconsistent {
                lsn: *lsn,
                detail: format!("request key {key:?}: its claim has no answer"),
            })?,
            Slot::Known { fp, k } => {
                let r = self
                    .answer_for(key, *fp, Some(*k))?
                    .ok_or(EngineError::Inconsistent {
                        lsn: k.lsn,
                        detail: format!("request key {key:?} has no answer"),
                    })?;
                self.reply(source, r)?
            }
            Slot::Later | Slot::Plan { .. } => return Ok(None),
        };
        Ok(Some(r))
    }
}

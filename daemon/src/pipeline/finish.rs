//! Commit and Finish for a durable claim: one transaction per shard in lsn order, audit rows
//! (skipping those already written), the input removed, the result file; then the
//! durability tail: the shards' flushes, the audit log's sync, the `done` record. Every step
//! is idempotent, so recovery can run it again from any crash point.
//!
//! The result is published once every shard transaction is applied (readable) and the audit
//! rows are written, but before the shards and the audit log are synced: the claim, durable
//! since the claim step, is what the result stands on. A power loss before the `done` record
//! is durable makes recovery run this again from the claim (a held lsn is a no-op, audit
//! rows already there are skipped, the result is the same), so the shards' and the audit
//! log's syncs come off the client's wait. The `done` record is appended only after them:
//! done means nothing is left to redo.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use roost_shards::TxnOp;
use roost_wal::Lsn;

use super::crash::Step;
use super::owner::{ShardSlot, Turn};
use super::records::{self, AuditRecord, ClaimRecord, DoneRecord, PlannedOp, RecordType};
use super::{io_err, lock, Engine};
use crate::batch::{BatchResult, OpResult};
use crate::error::EngineError;

/// A touched shard and where its owner answers the transaction sent to it.
pub(super) type Sent<'a> = (Touched<'a>, Receiver<Result<(), EngineError>>);

/// One touched shard of a batch: its owner and the ids its transaction creates (true) or
/// deletes (false), for the planning overlay.
pub(super) struct Touched<'a> {
    pub name: &'a str,
    pub slot: Arc<ShardSlot>,
    pub ids: Vec<(u64, bool)>,
}

impl Engine {
    /// Commit and Finish for the durable claim at `lsn` (see the module comment). `audited`
    /// holds the op indexes whose audit rows exist already (recovery); `started` is when a
    /// live batch entered the pipeline (for its latency).
    pub(super) fn finish(
        &self,
        lsn: Lsn,
        claim: &ClaimRecord,
        audited: &HashSet<u32>,
        started: Option<Instant>,
    ) -> Result<BatchResult, EngineError> {
        let t_commit = Instant::now();
        let touched = self.commit(lsn, claim)?;
        self.stats.latency.commit.record(t_commit.elapsed());
        let t_finish = Instant::now();
        let last_row = self.write_audit_rows(lsn, claim, audited)?;
        let r = self.answer(lsn, claim, started)?;
        let done = self.durability_tail(lsn, &touched, last_row)?;
        self.close_claim(lsn, claim, &touched, done);
        self.stats.latency.finish.record(t_finish.elapsed());
        Ok(r)
    }

    /// The claim at `lsn` is finished and its `done` record appended at `done`: its key
    /// answers from now on, and a checkpoint may pass it. Every frame of the touched shards
    /// up to `lsn` is flushed (they apply in lsn order).
    pub(super) fn close_claim(
        &self,
        lsn: Lsn,
        claim: &ClaimRecord,
        touched: &[Touched<'_>],
        done: Lsn,
    ) {
        let mut p = lock(&self.planner);
        if let Some(k) = p.keys.get_mut(&claim.request_key) {
            k.done = true;
        }
        p.tails.done(&claim.source, lsn, done);
        for t in touched {
            match p.vouched.get_mut(t.name) {
                Some(v) => *v = (*v).max(lsn),
                None => {
                    p.vouched.insert(t.name.to_owned(), lsn);
                }
            }
        }
        p.open.remove(&lsn);
        drop(p);
        self.finished_cv.notify_all();
        self.stats.committed.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends every touched shard its transaction at once; each owner applies in lsn order.
    /// All answers are collected (even after a failure) so no owner is still writing when
    /// this returns. Clears the batch's planning overlays as each shard applies.
    pub(super) fn commit<'c>(
        &self,
        lsn: Lsn,
        claim: &'c ClaimRecord,
    ) -> Result<Vec<Touched<'c>>, EngineError> {
        let sent = self.send_commit(lsn, claim)?;
        self.collect_commit(sent)
    }

    /// Hands every touched shard of the claim at `lsn` its transaction; the owners answer on
    /// the receivers ([`Engine::collect_commit`]).
    pub(super) fn send_commit<'c>(
        &self,
        lsn: Lsn,
        claim: &'c ClaimRecord,
    ) -> Result<Vec<Sent<'c>>, EngineError> {
        let mut sent = Vec::new();
        for (k, (name, ops)) in transactions(claim).into_iter().enumerate() {
            let slot = self.slot(name)?;
            let ids = touched_ids(&ops);
            let rx = slot.send_apply(vec![Turn { lsn, k, ops }])?;
            sent.push((Touched { name, slot, ids }, rx));
        }
        Ok(sent)
    }

    /// Waits for every answer of [`Engine::send_commit`] (even after a failure, so no owner
    /// is still writing when this returns), clearing the overlays as each shard applies.
    pub(super) fn collect_commit<'c>(
        &self,
        sent: Vec<Sent<'c>>,
    ) -> Result<Vec<Touched<'c>>, EngineError> {
        let mut first_err = None;
        let mut touched = Vec::with_capacity(sent.len());
        for (t, rx) in sent {
            match t.slot.wait(&rx, &|| self.is_failed()) {
                Ok(()) => self.clear_overlay(&t),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
            touched.push(t);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(touched),
        }
    }

    /// The shard holds the batch's ops now: planning no longer needs the overlay.
    fn clear_overlay(&self, t: &Touched<'_>) {
        self.clear_overlays(std::iter::once(t));
    }

    /// [`Engine::clear_overlay`] for many, under one planner lock.
    pub(super) fn clear_overlays<'t, 'c: 't>(
        &self,
        touched: impl Iterator<Item = &'t Touched<'c>>,
    ) {
        let mut p = lock(&self.planner);
        for t in touched {
            let Some(o) = p.overlay.get_mut(t.name) else {
                continue;
            };
            for &(id, created) in &t.ids {
                o.applied(id, created);
            }
        }
    }

    /// One audit row per op not already written, in one write; returns the last row's lsn
    /// in the audit log.
    pub(super) fn write_audit_rows(
        &self,
        lsn: Lsn,
        claim: &ClaimRecord,
        audited: &HashSet<u32>,
    ) -> Result<Option<Lsn>, EngineError> {
        let rows = audit_rows(lsn, claim, audited)?;
        self.append_audit_rows(&rows)
    }

    /// Every audit row of a group's claims (none written before: they are live), in one
    /// write; returns the last row's lsn in the audit log.
    pub(super) fn write_group_audit_rows(
        &self,
        claims: &[(Lsn, &ClaimRecord)],
    ) -> Result<Option<Lsn>, EngineError> {
        let mut rows = Vec::with_capacity(claims.iter().map(|(_, c)| c.ops.len()).sum());
        for (lsn, c) in claims {
            rows.extend(audit_rows(*lsn, c, &HashSet::new())?);
        }
        self.append_audit_rows(&rows)
    }

    /// Appends encoded rows (op index, payload) in one write, then passes each row's crash
    /// point in order.
    fn append_audit_rows(&self, rows: &[(usize, Vec<u8>)]) -> Result<Option<Lsn>, EngineError> {
        let frames: Vec<(u8, &[u8])> = rows
            .iter()
            .map(|(_, p)| (RecordType::Audit as u8, p.as_slice()))
            .collect();
        let lsns = self.audit.append_many_nowait(&frames)?;
        for (i, _) in rows {
            self.hit(Step::AfterAudit.nth(*i))?;
        }
        Ok(lsns.last().copied())
    }

    /// The input goes, then the answer is published. The input goes first: the claim holds
    /// the batch from here on, and a client may reuse the name as soon as it sees the answer
    /// (a removal after it could take the new file). Recovery (`started` is `None`) removes
    /// and publishes only what is still this batch's (`names.rs`).
    pub(super) fn answer(
        &self,
        lsn: Lsn,
        claim: &ClaimRecord,
        started: Option<Instant>,
    ) -> Result<BatchResult, EngineError> {
        // Under `ack = "standby"` the claim must be on a standby before anyone sees the result.
        self.wait_replicated(lsn)?;
        let r = committed_result(lsn, claim);
        if super::plan::is_detached(&claim.source) {
            // Nothing to remove or publish: the caller hands the answer over (or, in
            // recovery, the client asks again under its key).
            self.hit(Step::AfterResult.at())?;
            return Ok(r);
        }
        if started.is_none() {
            self.recovery_answer(claim, &r)?;
            self.hit(Step::AfterResult.at())?;
            return Ok(r);
        }
        // An earlier batch under this name settles first (its `done` durable), before this
        // batch's input goes: once the input is gone, recovery must never finish the earlier
        // one again, or it would publish the earlier answer where this one belongs.
        self.settle_name(&claim.source, Some(lsn))?;
        self.remove_input(&claim.source)?;
        self.hit(Step::AfterInputRemoved.at())?;
        self.publish_settled(&claim.source, &r)?;
        if let Some(t0) = started {
            self.stats.latency.batch.record(t0.elapsed());
        }
        self.hit(Step::AfterResult.at())?;
        Ok(r)
    }

    /// [`Engine::answer`] for a group's claims, with every result file in one round: each
    /// attached claim's name settles and its input goes, in claim order, then all their
    /// results are published at once (`Publisher::publish_many`). A detached claim's
    /// answer is only handed back, as alone.
    pub(super) fn answer_group(
        &self,
        claims: &[(Lsn, &ClaimRecord)],
        started: Instant,
    ) -> Result<Vec<BatchResult>, EngineError> {
        // Every claim on a standby (under `ack = "standby"`) before any input goes: a wait
        // that gives up must leave every file of the group in `new/`, as alone.
        for (lsn, _) in claims {
            self.wait_replicated(*lsn)?;
        }
        let mut answers = Vec::with_capacity(claims.len());
        let mut files: Vec<(&str, Vec<u8>)> = Vec::new();
        for (lsn, c) in claims {
            let r = committed_result(*lsn, c);
            if super::plan::is_detached(&c.source) {
                self.hit(Step::AfterResult.at())?;
            } else {
                self.settle_name(&c.source, Some(*lsn))?;
                self.remove_input(&c.source)?;
                self.hit(Step::AfterInputRemoved.at())?;
                files.push((c.source.as_str(), r.to_json_line()));
            }
            answers.push(r);
        }
        let many: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        if let Some((first, _)) = many.first() {
            self.publisher
                .publish_many(&many)
                .map_err(io_err("write result", &self.spool.out.join(first)))?;
        }
        for _ in &many {
            self.stats.latency.batch.record(started.elapsed());
            self.hit(Step::AfterResult.at())?;
        }
        Ok(answers)
    }

    /// Off the client's wait: every touched shard flushes (grouped per owner), the audit log
    /// syncs, then the `done` record is appended (its lsn is returned). Not synced on its own: it rides on the next
    /// group commit. If a power loss drops it, recovery finishes the batch again, and every
    /// step of that is idempotent (held lsns, audit rows already there, the same result).
    fn durability_tail(
        &self,
        lsn: Lsn,
        touched: &[Touched<'_>],
        last_row: Option<Lsn>,
    ) -> Result<Lsn, EngineError> {
        self.flush_touched(touched.iter())?;
        if let Some(last) = last_row {
            self.audit.sync_to(last)?;
        }
        self.hit(Step::AfterAuditSync.at())?;
        self.append_done(lsn)
    }

    /// Each shard flushes everything applied so far (grouped per owner), and waits for all.
    pub(super) fn flush_touched<'t, 'c: 't>(
        &self,
        touched: impl Iterator<Item = &'t Touched<'c>>,
    ) -> Result<(), EngineError> {
        let mut flushes = Vec::new();
        for (k, t) in touched.enumerate() {
            flushes.push((t, t.slot.send_flush(k)?));
        }
        let mut first_err = None;
        for (t, rx) in &flushes {
            if let Err(e) = t.slot.wait(rx, &|| self.is_failed()) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The `done` record of the claim at `lsn` (not synced on its own); returns its lsn.
    pub(super) fn append_done(&self, lsn: Lsn) -> Result<Lsn, EngineError> {
        let done = self.append_dones(&[lsn])?;
        done.first().copied().ok_or(EngineError::Inconsistent {
            lsn,
            detail: "its done record got no lsn".into(),
        })
    }

    /// The `done` records of the claims at `claims`, in one write (not synced on their own);
    /// returns their lsns.
    pub(super) fn append_dones(&self, claims: &[Lsn]) -> Result<Vec<Lsn>, EngineError> {
        let mut payloads = Vec::with_capacity(claims.len());
        for lsn in claims {
            let done = DoneRecord { claim_lsn: *lsn };
            payloads.push(records::encode("done", &done).map_err(EngineError::Encode)?);
        }
        let frames: Vec<(u8, &[u8])> = payloads
            .iter()
            .map(|p| (RecordType::Done as u8, p.as_slice()))
            .collect();
        let lsns = self.wal.append_many_nowait(&frames)?;
        for _ in &lsns {
            self.hit(Step::AfterDone.at())?;
        }
        Ok(lsns)
    }

    /// Writes `out/NAME` durably, in a round with the other batches finishing now; first
    /// settles any earlier claim under the same name (`names.rs`).
    pub fn publish(&self, source: &str, r: &BatchResult) -> Result<(), EngineError> {
        let own = match r {
            BatchResult::Committed { lsn, .. } => Some(*lsn),
            _ => None,
        };
        self.settle_name(source, own)?;
        self.publish_settled(source, r)
    }

    /// A bulk file's answer (`serve/bulk.rs`), once every line is answered durably: its
    /// result lines published as `out/NAME` (after any earlier claim under the name settles),
    /// then `new/NAME` removed and `new/` synced at once. The lines' claims are detached:
    /// recovery never touches `new/NAME` or `out/NAME` for them, so until the removal is
    /// durable the file is simply processed again, and each line's key gives its original
    /// answer: the same bytes.
    pub fn answer_bulk(&self, name: &str, result_lines: &[u8]) -> Result<(), EngineError> {
        self.settle_name(name, None)?;
        self.publisher
            .publish_bytes(name, result_lines)
            .map_err(io_err("write result", &self.spool.out.join(name)))?;
        self.remove_input(name)?;
        self.storage
            .sync_dir(&self.spool.new)
            .map_err(io_err("sync", &self.spool.new))
    }

    /// A cluster standby's answer to spool file `name`, whose batch the leader ran
    /// (`cluster/forward.rs`): `out/NAME` published, then `new/NAME` removed and `new/`
    /// synced (the claim is the leader's and ours, under its own detached source: nothing
    /// here would finish it again, so the removal is made durable at once).
    pub fn answer_forwarded(&self, name: &str, r: &BatchResult) -> Result<(), EngineError> {
        // Not `publish`: the name is not settled against this node's own claims. A claim it
        // made under the name while it led (and was fenced before finishing) is never
        // finished here while it follows, so waiting for it would wait forever; if this node
        // leads again, recovery's answer for it touches no other request's input or answer
        // (`names.rs`).
        self.publish_settled(name, r)?;
        self.remove_input(name)?;
        self.storage
            .sync_dir(&self.spool.new)
            .map_err(io_err("sync", &self.spool.new))
    }

    /// [`Engine::publish`] once the name is settled.
    fn publish_settled(&self, source: &str, r: &BatchResult) -> Result<(), EngineError> {
        self.publisher
            .publish(source, r)
            .map_err(io_err("write result", &self.spool.out.join(source)))
    }
}

/// The claim's ops as one transaction per shard, in shard-name order (the order that names
/// the crash points `after_commit.K`).
pub(super) fn transactions(claim: &ClaimRecord) -> BTreeMap<&str, Vec<TxnOp>> {
    let mut by_shard: BTreeMap<&str, Vec<TxnOp>> = BTreeMap::new();
    for op in &claim.ops {
        let t = match op {
            PlannedOp::Create { id, record, .. } => TxnOp::Create {
                id: *id,
                record: record.clone(),
            },
            PlannedOp::Delete { id, .. } => TxnOp::Delete { id: *id },
        };
        by_shard.entry(op.shard()).or_default().push(t);
    }
    by_shard
}

/// The claim's audit rows (op index, encoded row), one per op not in `audited`.
fn audit_rows(
    lsn: Lsn,
    claim: &ClaimRecord,
    audited: &HashSet<u32>,
) -> Result<Vec<(usize, Vec<u8>)>, EngineError> {
    let mut rows = Vec::with_capacity(claim.ops.len());
    for (i, op) in claim.ops.iter().enumerate() {
        if audited.contains(&(i as u32)) {
            continue;
        }
        let row = AuditRecord {
            claim_lsn: lsn,
            request_key: claim.request_key.clone(),
            op_index: i as u32,
            op: op.kind(),
            shard: op.shard().to_owned(),
            id: op.id(),
        };
        let payload = records::encode("audit row", &row).map_err(EngineError::Encode)?;
        rows.push((i, payload));
    }
    Ok(rows)
}

/// The ids a shard transaction creates (true) or deletes (false).
pub(super) fn touched_ids(ops: &[TxnOp]) -> Vec<(u64, bool)> {
    ops.iter()
        .map(|op| match op {
            TxnOp::Create { id, .. } => (*id, true),
            TxnOp::Delete { id } => (*id, false),
        })
        .collect()
}

/// The committed result of a claim: the same whenever it is rebuilt.
pub fn committed_result(lsn: Lsn, c: &ClaimRecord) -> BatchResult {
    BatchResult::Committed {
        request_key: c.request_key.clone(),
        lsn,
        ops: c
            .ops
            .iter()
            .map(|op| OpResult {
                op: op.kind().as_str().to_owned(),
                shard: op.shard().to_owned(),
                id: op.id(),
            })
            .collect(),
    }
}

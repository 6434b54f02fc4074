//! Plan and Claim: the idempotency check, the static checks and before-triggers, the state
//! checks under the planner lock, and the claim (ids minted, one WAL record, its sync).
//! The first rejection ends a batch and nothing but its result is written.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use roost_wal::{Lsn, WalError};
use tracing::{debug, warn};

use super::crash::Step;
use super::records::{self, ClaimRecord, PlannedOp, RecordType, RejectedRecord};
use super::{io_err, lock, Engine, KeyAt, KeyFound, KeyState, Overlay, Planner};
use crate::batch::{fingerprint, missing_field, Batch, BatchOp, BatchResult};
use crate::error::EngineError;
use crate::spool;

/// What the planner lock says about a request key.
enum KeyCheck {
    /// Never seen: plan it.
    New,
    /// Seen with another fingerprint, or finished: it has an answer (built after the lock
    /// is dropped: a duplicate's answer reads the WAL).
    Known(KeyState),
}

impl Engine {
    /// A batch that is not a spool file of its own (a line of a bulk file, a batch on a
    /// stream): the same pipeline as [`Engine::submit`], but no input is removed and no
    /// result file is written. When this returns `Ok`, the answer is as durable as a
    /// published result file would be (the record it cites is synced, and under
    /// `ack = "standby"` on a standby), so the caller may hand it to the client. `source`
    /// names where the batch came from, for the WAL and the logs: it must contain a `/`
    /// (`bulk/NAME/LINE`, `stream/CONN/N`), which no spool name does, so recovery never
    /// takes it for a file in `new/` or `out/`.
    pub fn submit_detached(&self, batch: &Batch, source: &str) -> Result<BatchResult, EngineError> {
        detached_only(source)?;
        self.submit(batch, source)
    }

    /// Runs one batch through the pipeline and returns its result, which is also written to
    /// `out/<source>` before this returns (and `new/<source>` removed); for a detached source
    /// (see [`Engine::submit_detached`]) neither.
    pub fn submit(&self, batch: &Batch, source: &str) -> Result<BatchResult, EngineError> {
        self.admit(1, (&batch.request_key, source), || {
            self.submit_inner(batch, source)
        })
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
        self.check()?;
        self.check_primary()?;
        self.gate()?;
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
            self.fail();
        }
        r
    }

    pub(super) fn submit_inner(
        &self,
        batch: &Batch,
        source: &str,
    ) -> Result<BatchResult, EngineError> {
        let fp = fingerprint(batch);
        let key = batch.request_key.as_str();
        let t0 = Instant::now();
        // Cheap idempotency check before running any trigger.
        if let Some(r) = self.check_key(key, fp)? {
            return self.reply(source, r);
        }
        let static_reject = self.precheck(batch);
        let limit = static_reject.as_ref().map_or(batch.ops.len(), |(i, _)| *i);
        let mut p = lock(&self.planner);
        // The key may have been claimed while triggers ran.
        p = match self.wait_for_key(p, key, fp)? {
            (p, KeyCheck::New) => p,
            (p, KeyCheck::Known(k)) => {
                drop(p);
                if let Some(r) = self.answer_for(key, fp, Some(k))? {
                    return self.reply(source, r);
                }
                return Err(EngineError::Inconsistent {
                    lsn: k.lsn,
                    detail: format!("request key {key:?} has no answer"),
                });
            }
        };
        if let Some((i, reason)) = self.plan_state(&p, batch, limit)?.or(static_reject) {
            let r = self.record_rejection(p, batch, source, fp, (i, reason))?;
            return self.reply(source, r);
        }
        self.stats.latency.plan.record(t0.elapsed());
        let t1 = Instant::now();
        self.hit(Step::AfterPlan.at())?;
        let (lsn, claim) = self.claim(&mut p, batch, source, fp)?;
        drop(p);
        self.hit(Step::AfterClaimAppend.at())?;
        self.wal.sync_to(lsn)?;
        self.hit(Step::AfterClaimSync.at())?;
        self.stats.latency.claim.record(t1.elapsed());
        self.finish(lsn, &claim, &HashSet::new(), Some(t0))
    }

    /// Static checks and before-triggers, in op order, without any lock: the first op that
    /// fails and why. These outcomes depend on the op alone, so they are the same on every
    /// attempt.
    pub(super) fn precheck(&self, batch: &Batch) -> Option<(usize, String)> {
        for (i, op) in batch.ops.iter().enumerate() {
            let Some(sc) = self.config.shard(op.shard()) else {
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
                if let Err(reason) = super::trigger::run(argv, &input, limit) {
                    return Some((i, reason));
                }
            }
        }
        None
    }

    /// The answer for a key already seen, if it has one: a conflict (another fingerprint) or
    /// the original result (finished). An unfinished claim of the same batch has none yet.
    pub(super) fn check_key(&self, key: &str, fp: u64) -> Result<Option<BatchResult>, EngineError> {
        let k = self.key_state(&lock(&self.planner), key)?;
        self.answer_for(key, fp, k)
    }

    /// Must be called without the planner lock (it may sync the WAL).
    pub(super) fn answer_for(
        &self,
        key: &str,
        fp: u64,
        k: Option<KeyState>,
    ) -> Result<Option<BatchResult>, EngineError> {
        let Some(k) = k else { return Ok(None) };
        match k.check(fp) {
            KeyFound::Free | KeyFound::InFlight => Ok(None),
            // The answer cites the record at k.lsn: it must be durable first, or a power loss
            // could take it and the key would then plan as new (issue 13, item 6).
            KeyFound::Answered(k) if k.fingerprint != fp => {
                self.answer_durable(k.lsn)?;
                Ok(Some(self.conflict(key, k.lsn)))
            }
            KeyFound::Answered(k) => {
                self.answer_durable(k.lsn)?;
                self.stats.duplicate.fetch_add(1, Ordering::Relaxed);
                self.duplicate(key, k).map(Some)
            }
        }
    }

    /// Under the planner lock: waits while the same batch is claimed and in flight (it
    /// finishes, then its result is the answer).
    fn wait_for_key<'a>(
        &'a self,
        mut p: MutexGuard<'a, Planner>,
        key: &str,
        fp: u64,
    ) -> Result<(MutexGuard<'a, Planner>, KeyCheck), EngineError> {
        loop {
            self.check()?;
            match self.key_state(&p, key)?.map(|k| k.check(fp)) {
                None | Some(KeyFound::Free) => return Ok((p, KeyCheck::New)),
                Some(KeyFound::Answered(k)) => return Ok((p, KeyCheck::Known(k))),
                // The batch in flight gave up its answer (a stop, a step down): so does this.
                Some(KeyFound::InFlight) => self.still_answering(p.keys[key].lsn)?,
            }
            p = self
                .finished_cv
                .wait_timeout(p, Duration::from_millis(50))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The checks that depend on state, under the planner lock, up to `limit`: the first op
    /// that would create a shard past `shards_max` (`shard_limit.rs`), else the first delete
    /// of an id that does not exist before it.
    pub(super) fn plan_state(
        &self,
        p: &Planner,
        batch: &Batch,
        limit: usize,
    ) -> Result<Option<(usize, String)>, EngineError> {
        let over = lock(&self.known_shards).first_over(batch, limit, self.config.shards_max);
        let limit = over.as_ref().map_or(limit, |(i, _)| *i);
        Ok(self.plan_deletes(p, batch, limit)?.or(over))
    }

    /// Walks the deletes up to `limit` in order against committed state plus planned
    /// overlays: the first that names an id that does not exist, and why.
    fn plan_deletes(
        &self,
        p: &Planner,
        batch: &Batch,
        limit: usize,
    ) -> Result<Option<(usize, String)>, EngineError> {
        let mut deleted_here: HashSet<(&str, u64)> = HashSet::new();
        for (i, op) in batch.ops[..limit].iter().enumerate() {
            if let BatchOp::Delete { shard, id } = op {
                let exists =
                    self.exists(p, shard, *id)? && !deleted_here.contains(&(shard.as_str(), *id));
                if !exists {
                    return Ok(Some((
                        i,
                        format!("id {id} does not exist on shard {shard}"),
                    )));
                }
                deleted_here.insert((shard, *id));
            }
        }
        Ok(None)
    }

    /// Claim, under the planner lock: mint ids, append plan + ids + fingerprint as one WAL
    /// record (not yet synced), register the shards' turns and the overlays.
    pub(super) fn claim(
        &self,
        p: &mut Planner,
        batch: &Batch,
        source: &str,
        fp: u64,
    ) -> Result<(Lsn, ClaimRecord), EngineError> {
        let first_id = p.next_id;
        let ops: Vec<PlannedOp> = batch
            .ops
            .iter()
            .map(|op| match op {
                BatchOp::Create { shard, record, .. } => {
                    let id = p.next_id;
                    p.next_id += 1;
                    let record = record.clone();
                    let shard = shard.clone();
                    PlannedOp::Create { shard, id, record }
                }
                BatchOp::Delete { shard, id } => PlannedOp::Delete {
                    shard: shard.clone(),
                    id: *id,
                },
            })
            .collect();
        let claim = ClaimRecord {
            request_key: batch.request_key.clone(),
            source: source.to_owned(),
            fingerprint: fp,
            ops,
        };
        let payload = records::encode("claim", &claim).map_err(EngineError::Encode)?;
        let (lsn, offset) = match self.wal.append_nowait_at(RecordType::Claim as u8, &payload) {
            Ok(at) => at,
            // No room for a new WAL segment: nothing written; the ids go back unused.
            Err(WalError::NoSpace(why)) => {
                p.next_id = first_id;
                let part = "wal".to_owned();
                return Err(EngineError::Paused { part, why });
            }
            Err(e) => return Err(e.into()),
        };
        for name in claim.touched_shards() {
            let slot = self.slot(name)?;
            lock(&slot.turns).insert(lsn);
        }
        for op in &claim.ops {
            // Looked up before an entry is made: no name copied per op once the shard has one.
            if !p.overlay.contains_key(op.shard()) {
                p.overlay.insert(op.shard().to_owned(), Overlay::default());
            }
            let Some(o) = p.overlay.get_mut(op.shard()) else {
                continue;
            };
            match op {
                PlannedOp::Create { id, .. } => o.created.insert(*id),
                PlannedOp::Delete { id, .. } => o.deleted.insert(*id),
            };
        }
        let key = KeyState {
            lsn,
            fingerprint: fp,
            done: false,
            rejected: false,
            at: KeyAt::Wal { offset },
        };
        p.keys.insert(claim.request_key.clone(), key);
        p.tails.claimed(source, lsn);
        p.open.insert(lsn, self.audit.next_lsn());
        Ok((lsn, claim))
    }

    /// Records a rejection under the planner lock (ordered with any claim of its key), drops
    /// the lock, and syncs it before it is answered: the same batch sent again, or its input
    /// back after a power loss, gets this answer whatever changed since (issue 13, item 6).
    fn record_rejection(
        &self,
        mut p: MutexGuard<'_, Planner>,
        batch: &Batch,
        source: &str,
        fp: u64,
        why: (usize, String),
    ) -> Result<BatchResult, EngineError> {
        let (lsn, rec) = self.append_rejection(&mut p, batch, source, fp, why)?;
        drop(p);
        self.answer_durable(lsn)?;
        Ok(self.rejected(&rec.request_key, rec.op_index as usize, rec.reason))
    }

    /// Under the planner lock: appends a `rejected` record (not synced) and binds the key
    /// to it.
    pub(super) fn append_rejection(
        &self,
        p: &mut Planner,
        batch: &Batch,
        source: &str,
        fp: u64,
        (op_index, reason): (usize, String),
    ) -> Result<(Lsn, RejectedRecord), EngineError> {
        let rec = RejectedRecord {
            request_key: batch.request_key.clone(),
            source: source.to_owned(),
            fingerprint: fp,
            op_index: op_index as u32,
            reason,
        };
        let payload = records::encode("rejected", &rec).map_err(EngineError::Encode)?;
        let (lsn, offset) = match self
            .wal
            .append_nowait_at(RecordType::Rejected as u8, &payload)
        {
            Ok(at) => at,
            Err(WalError::NoSpace(why)) => {
                let part = "wal".to_owned();
                return Err(EngineError::Paused { part, why });
            }
            Err(e) => return Err(e.into()),
        };
        let key = KeyState {
            lsn,
            fingerprint: fp,
            done: true,
            rejected: true,
            at: KeyAt::Wal { offset },
        };
        p.keys.insert(rec.request_key.clone(), key);
        Ok((lsn, rec))
    }

    /// The record at `lsn` that an answer cites is durable (here, and on a standby under
    /// `ack = "standby"`) before the answer is published.
    pub(super) fn answer_durable(&self, lsn: Lsn) -> Result<(), EngineError> {
        self.wal.sync_to(lsn)?;
        self.wait_replicated(lsn)
    }

    /// Whether `id` exists on `shard` for planning: committed state plus planned overlays.
    fn exists(&self, p: &Planner, shard: &str, id: u64) -> Result<bool, EngineError> {
        if let Some(o) = p.overlay.get(shard) {
            if o.deleted.contains(&id) {
                return Ok(false);
            }
            if o.created.contains(&id) {
                return Ok(true);
            }
        }
        // A shard never written has no segments yet: nothing exists on it, and a rejected
        // delete must not create it.
        let open = lock(&self.shards).get(shard).cloned();
        let slot = match open {
            Some(s) => s,
            None if self.shard_has_segments(shard) => self.slot(shard)?,
            None => return Ok(false),
        };
        slot.contains(id)
    }

    fn shard_has_segments(&self, shard: &str) -> bool {
        match self.storage.list(&self.layout.shard(shard)) {
            Ok(names) => names
                .iter()
                .any(|n| n.ends_with(roost_shards::SEGMENT_SUFFIX)),
            Err(_) => false,
        }
    }

    pub(super) fn rejected(&self, key: &str, op_index: usize, reason: String) -> BatchResult {
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        debug!(request_key = key, op_index, reason = %reason, "batch rejected");
        BatchResult::Rejected {
            request_key: key.to_owned(),
            op_index: op_index as u32,
            reason,
        }
    }

    fn conflict(&self, key: &str, lsn: Lsn) -> BatchResult {
        self.stats.conflict.fetch_add(1, Ordering::Relaxed);
        BatchResult::Conflict {
            request_key: key.to_owned(),
            lsn,
            reason: format!("request key already used at lsn {lsn} with a different batch"),
        }
    }

    /// The original answer for a key seen before: its claim's committed result, or its
    /// recorded rejection, read from the one record that holds it (the WAL, or the key table
    /// once the WAL below a checkpoint is gone).
    fn duplicate(&self, key: &str, k: KeyState) -> Result<BatchResult, EngineError> {
        let lsn = k.lsn;
        let inconsistent = |detail: &str| EngineError::Inconsistent {
            lsn,
            detail: format!("request key {key:?}: {detail}"),
        };
        match k.at {
            KeyAt::Wal { offset } => {
                let rec = match self.wal.read_record(lsn, offset) {
                    // A checkpoint moved the key to the table and retired the segment since
                    // `k` was read: read where the key points now.
                    Err(WalError::Missing { .. }) => {
                        let now = self.key_state(&lock(&self.planner), key)?;
                        return match now {
                            Some(n) if matches!(n.at, KeyAt::Keys { .. }) => self.duplicate(key, n),
                            _ => Err(inconsistent("its record left the wal")),
                        };
                    }
                    r => r?,
                };
                match records::decode_wal(&rec)? {
                    records::WalEntry::Claim(c) => Ok(super::committed_result(lsn, &c)),
                    records::WalEntry::Rejected(r) => Ok(BatchResult::Rejected {
                        request_key: r.request_key,
                        op_index: r.op_index,
                        reason: r.reason,
                    }),
                    records::WalEntry::Done(_) => Err(inconsistent("points at a done record")),
                }
            }
            KeyAt::Keys { lsn: at, offset } => {
                let rec = self.keys.read_record(at, offset)?;
                let kr = records::decode_key(&rec)?;
                if kr.lsn != lsn || kr.request_key != key {
                    return Err(inconsistent("the key table holds another key there"));
                }
                Ok(super::keys::answer(&kr))
            }
        }
    }

    /// Publishes an answer that has no claim behind it (rejected, conflict, duplicate), then
    /// removes the input and syncs `new/` at once (issue 13, item 6): the answer is not in
    /// the WAL, so if a power loss brought the input back it would be planned again, maybe
    /// against newer state, and the answer the client read could change. What is left is
    /// the moment between the result's `out/` sync and this one.
    pub(super) fn reply(&self, source: &str, r: BatchResult) -> Result<BatchResult, EngineError> {
        if is_detached(source) {
            return Ok(r);
        }
        self.publish(source, &r)?;
        self.remove_input(source)?;
        self.storage
            .sync_dir(&self.spool.new)
            .map_err(io_err("sync", &self.spool.new))?;
        Ok(r)
    }

    /// Removes `new/NAME` (not synced here: for a committed batch the claim holds it, and a
    /// file that comes back gives the same answer).
    pub(super) fn remove_input(&self, source: &str) -> Result<(), EngineError> {
        spool::remove_input(self.storage.as_ref(), &self.spool, source)
            .map_err(io_err("remove input", &self.spool.new.join(source)))
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

/// `source` is detached ([`Engine::submit_detached`]), or the call is refused before any work.
pub(super) fn detached_only(source: &str) -> Result<(), EngineError> {
    match is_detached(source) {
        true => Ok(()),
        false => Err(EngineError::Inconsistent {
            lsn: 0,
            detail: format!("detached source {source:?} has no '/'"),
        }),
    }
}

/// `source` is a spool file's name ([`Engine::submit_files`]), or the call is refused.
pub(super) fn attached_only(source: &str) -> Result<(), EngineError> {
    match spool::valid_spool_name(source) && !is_detached(source) {
        true => Ok(()),
        false => Err(EngineError::Inconsistent {
            lsn: 0,
            detail: format!("{source:?} is not a spool file's name"),
        }),
    }
}

/// Whether a claim's source is detached (no spool file of its own: a bulk file's line, a
/// streamed batch). Spool names never contain `/`.
pub fn is_detached(source: &str) -> bool {
    source.contains('/')
}

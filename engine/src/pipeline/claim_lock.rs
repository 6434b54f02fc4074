//! The claims part: the planner lock and what is done under it. It owns the planner's state
//! ([`Planner`]: keys, the id counter, overlays, open claims) behind one mutex, appends the
//! claim and rejection records under it (so lsn order is plan order and ids are minted in
//! lsn order), replays the WAL into it at open, and answers what a duplicate, a commit's
//! end and a checkpoint ask of it. It never publishes an answer and never flushes a shard;
//! the engine decides the order of steps (`plan.rs`, `finish.rs`, `checkpoint.rs`).

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use roost_storage::lock;
use roost_wal::{Lsn, Wal, WalError};

use super::env::Env;
use super::invariants;
use super::keys::{self, KeyAt, KeyFound, KeyState, KeyWindow};
use super::log_role::LogRole;
use super::logs::Logs;
use super::planner::Planner;
use super::records::{
    self, read_wal_frames, Checkpoint, ClaimLedger, ClaimRecord, PlannedOp, RecordType,
    RejectedRecord, WalEntry,
};
use super::shard_set::{SentCommits, ShardSet, Touched};
use super::stats::Stats;
use crate::batch::{Batch, BatchOp, BatchResult};
use crate::error::EngineError;

/// The planner behind its lock.
pub(super) struct Claims {
    planner: Mutex<Planner>,
}

impl Claims {
    pub(super) fn new() -> Claims {
        Claims {
            planner: Mutex::new(Planner::new()),
        }
    }

    /// The planner lock.
    pub(super) fn lock(&self) -> MutexGuard<'_, Planner> {
        lock(&self.planner)
    }

    /// Waits while the same batch is claimed and in flight (it finishes, then its answer is
    /// this one's).
    pub(super) fn wait_in_flight(
        &self,
        keys: &KeyWindow,
        env: &Env,
        role: &dyn LogRole,
        (key, fp): (&str, u64),
    ) -> Result<(), EngineError> {
        let mut p = self.lock();
        loop {
            env.check()?;
            match p.key(keys, key)?.map(|k| k.check(fp)) {
                // The batch in flight gave up its answer (a stop, a step down): so does this.
                Some(KeyFound::InFlight) => role.still_answering(p.keys[key].lsn)?,
                None | Some(KeyFound::Free | KeyFound::Answered(_)) => return Ok(()),
            }
            p = env
                .finished_cv
                .wait_timeout(p, Duration::from_millis(50))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The original answer for a key seen before: its claim's committed result, or its
    /// recorded rejection, read from the one record that holds it (the WAL, or the key table
    /// once the WAL below a checkpoint is gone).
    pub(super) fn duplicate(
        &self,
        wal: &Wal,
        keys: &KeyWindow,
        key: &str,
        k: KeyState,
    ) -> Result<BatchResult, EngineError> {
        let lsn = k.lsn;
        let inconsistent = |detail: &str| EngineError::Inconsistent {
            lsn,
            detail: format!("request key {key:?}: {detail}"),
        };
        match k.at {
            KeyAt::Wal { offset } => {
                let rec = match wal.read_record(lsn, offset) {
                    // A checkpoint moved the key to the table and retired the segment since
                    // `k` was read: read where the key points now.
                    Err(WalError::Missing { .. }) => {
                        let now = self.lock().key(keys, key)?;
                        return match now {
                            Some(n) if matches!(n.at, KeyAt::Keys { .. }) => {
                                self.duplicate(wal, keys, key, n)
                            }
                            _ => Err(inconsistent("its record left the wal")),
                        };
                    }
                    r => r?,
                };
                match records::decode_wal(&rec)? {
                    WalEntry::Claim(c) => Ok(keys::committed_result(lsn, &c)),
                    WalEntry::Rejected(r) => Ok(BatchResult::Rejected {
                        request_key: r.request_key,
                        op_index: r.op_index,
                        reason: r.reason,
                    }),
                    WalEntry::Done(_) => Err(inconsistent("points at a done record")),
                }
            }
            KeyAt::Keys { lsn: at, offset } => {
                let kr = keys.read(at, offset)?;
                if kr.lsn != lsn || kr.request_key != key {
                    return Err(inconsistent("the key table holds another key there"));
                }
                Ok(keys::answer(&kr))
            }
        }
    }

    /// Every shard's answer collected (all of them, even after a failure, so no owner is
    /// still writing when this returns), then the planning overlays cleared under one lock.
    pub(super) fn wait_commits<'c>(
        &self,
        s: SentCommits<'c>,
        failed: &dyn Fn() -> bool,
    ) -> Result<Vec<Vec<Touched<'c>>>, EngineError> {
        let touched = s.wait(failed)?;
        let all = touched.iter().flatten();
        self.lock().applied(all.map(|t| (t.name, t.ids.as_slice())));
        Ok(touched)
    }

    /// Under the planner lock: X (the first open claim, else the WAL's end), the audit mark,
    /// the id counter, and what each shard has flushed. `cap` may lower X (a primary that
    /// waits for its standby).
    pub(super) fn checkpoint_point(
        &self,
        log: &Logs,
        shard_set: &ShardSet,
        cap: impl FnOnce(Lsn) -> Lsn,
    ) -> Checkpoint {
        let p = self.lock();
        let (wal_from, audit_from) = match p.open.first_key_value() {
            Some((lsn, mark)) => (*lsn, *mark),
            None => (log.wal().next_lsn(), log.audit().next_lsn()),
        };
        let wal_from = cap(wal_from);
        let mut shards: Vec<(String, Lsn)> =
            p.vouched.iter().map(|(k, v)| (k.clone(), *v)).collect();
        for name in &shard_set.names() {
            if !p.vouched.contains_key(name) {
                shards.push((name.clone(), 0));
            }
        }
        shards.sort();
        Checkpoint {
            wal_from,
            audit_from,
            next_id: p.next_id,
            shards,
            keys_through: 0,
            at_ms: 0,
        }
    }

    /// Recovery's step 1: replays the WAL from the checkpoint into the planner (every key,
    /// the highest id ever claimed) and a ledger of the unfinished claims; returns it and
    /// the record count. `progress(done, total)` is called per record.
    pub(super) fn replay(
        &self,
        wal: &Wal,
        ckpt: &Checkpoint,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(ClaimLedger, u64), EngineError> {
        let total = wal.recovery_report().records;
        let mut ledger = ClaimLedger {
            from: ckpt.wal_from,
            vouched: ckpt.shards.iter().cloned().collect(),
            ..ClaimLedger::default()
        };
        let mut records = 0u64;
        let mut p = self.lock();
        for entry in read_wal_frames(wal, ckpt.wal_from) {
            let (rec, entry) = entry?;
            records += 1;
            progress(records, total);
            let at = KeyAt::Wal { offset: rec.offset };
            p.absorb(&mut ledger, rec.lsn, at, entry, ckpt.audit_from)?;
        }
        p.vouched = ledger.vouched.clone();
        Ok((ledger, records))
    }

    /// The answer for a key seen before, if it has one: a conflict (another fingerprint) or
    /// the original result, once the record it cites is durable. Must be called without the
    /// planner lock (it may sync the WAL).
    pub(super) fn answer_for(
        &self,
        (keys, log, role, stats): (&KeyWindow, &Logs, &dyn LogRole, &Stats),
        (key, fp): (&str, u64),
        k: Option<KeyState>,
    ) -> Result<Option<BatchResult>, EngineError> {
        let Some(k) = k else { return Ok(None) };
        match k.check(fp) {
            KeyFound::Free | KeyFound::InFlight => Ok(None),
            // The answer cites the record at k.lsn: it must be durable first, or a power loss
            // could take it and the key would then plan as new (issue 13, item 6).
            KeyFound::Answered(k) if k.fingerprint != fp => {
                log.answer_durable(k.lsn, role, stats)?;
                Ok(Some(conflict(stats, key, k.lsn)))
            }
            KeyFound::Answered(k) => {
                log.answer_durable(k.lsn, role, stats)?;
                stats.duplicate.fetch_add(1, Ordering::Relaxed);
                self.duplicate(log.wal(), keys, key, k).map(Some)
            }
        }
    }
}

impl Planner {
    /// Claim, under the planner lock: mint ids, append plan + ids + fingerprint as one WAL
    /// record (not yet synced), register the shards' turns and the overlays.
    pub(super) fn claim(
        &mut self,
        log: &Logs,
        shards: &ShardSet,
        (batch, source, fp): (&Batch, &str, u64),
    ) -> Result<(Lsn, ClaimRecord), EngineError> {
        self.open_shards(shards, batch)?;
        let first_id = self.next_id;
        let claim = ClaimRecord {
            request_key: batch.request_key.clone(),
            source: source.to_owned(),
            fingerprint: fp,
            ops: self.mint(batch),
        };
        let payload = records::encode("claim", &claim).map_err(EngineError::Encode)?;
        let (lsn, offset) = match log
            .wal()
            .append_nowait_at(RecordType::Claim as u8, &payload)
        {
            Ok(at) => at,
            // No room for a new WAL segment: nothing written; the ids go back unused.
            Err(WalError::NoSpace(why)) => {
                self.next_id = first_id;
                let part = "wal".to_owned();
                return Err(EngineError::Paused { part, why });
            }
            Err(e) => return Err(e.into()),
        };
        invariants::claim_follows(self.last_claim, lsn, first_id);
        self.last_claim = (lsn, self.next_id);
        // Registered under the planner lock: its shards' turns, then the planner's state.
        for name in claim.touched_shards() {
            let slot = shards.slot(name)?;
            lock(&slot.turns).insert(lsn);
        }
        self.register(lsn, offset, &claim, log.audit().next_lsn());
        Ok((lsn, claim))
    }

    /// Under the planner lock: appends a `rejected` record (not synced) and binds the key
    /// to it.
    pub(super) fn append_rejection(
        &mut self,
        wal: &Wal,
        (batch, source, fp): (&Batch, &str, u64),
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
        let (lsn, offset) = match wal.append_nowait_at(RecordType::Rejected as u8, &payload) {
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
        self.keys.insert(rec.request_key.clone(), key);
        Ok((lsn, rec))
    }

    /// Every shard the batch names opened (on first use since start: `ShardSet::slot`), and
    /// the counter moved past the largest id each of them holds, before an id is minted.
    /// The checkpoint's counter and the replayed claims already cover every id ever minted;
    /// this keeps ids unique even if they did not (a restart opens no shard it does not
    /// need, so it no longer reads every shard's largest id). Opened before the claim is
    /// written, so a shard that cannot be opened or made leaves nothing claimed.
    fn open_shards(&mut self, shards: &ShardSet, batch: &Batch) -> Result<(), EngineError> {
        let mut last = None;
        for op in &batch.ops {
            // A batch's ops mostly name one shard in a row: one lookup for each run.
            if last != Some(op.shard()) {
                shards.slot(op.shard())?;
                last = Some(op.shard());
            }
        }
        self.next_id = self.next_id.max(shards.id_floor());
        Ok(())
    }

    /// The batch's ops as planned: each create gets the next id (`next_id` moves past them).
    fn mint(&mut self, batch: &Batch) -> Vec<PlannedOp> {
        batch
            .ops
            .iter()
            .map(|op| match op {
                BatchOp::Create { shard, record, .. } => {
                    let id = self.next_id;
                    self.next_id += 1;
                    PlannedOp::Create {
                        shard: shard.clone(),
                        id,
                        record: record.clone(),
                    }
                }
                BatchOp::Delete { shard, id } => PlannedOp::Delete {
                    shard: shard.clone(),
                    id: *id,
                },
            })
            .collect()
    }
}

/// A conflict's answer (counted): the key was used at `lsn` with another batch.
fn conflict(stats: &Stats, key: &str, lsn: Lsn) -> BatchResult {
    stats.conflict.fetch_add(1, Ordering::Relaxed);
    BatchResult::Conflict {
        request_key: key.to_owned(),
        lsn,
        reason: format!("request key already used at lsn {lsn} with a different batch"),
    }
}

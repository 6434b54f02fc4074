//! The log and claims: the engine's part that owns the WAL and the audit log, the thread
//! that syncs a claim step's records, the answered claims waiting for their durability
//! round, what the engine remembers of checkpoints, and the WAL lsns kept for standbys just
//! re-seeded. It appends (audit rows, `done` records), syncs, waits for a standby to hold a
//! record and retires; it never plans, and it decides no order of steps (the engine does:
//! `plan.rs`, `settle.rs`, `checkpoint.rs`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use roost_storage::{lock, Clock, NoRoom, Storage};
use roost_wal::{Lsn, Wal, WalError};

use super::backup_gate::Pins;
use super::checkpoint_state::CheckpointState;
use super::claim_sync::ClaimSyncer;
use super::crash::Step;
use super::env::Env;
use super::log_role::LogRole;
use super::records::{
    self, read_audit, AuditRecord, Checkpoint, ClaimRecord, DoneRecord, RecordType,
};
use super::round_queue::Rounds;
use super::stats::Stats;
use crate::error::EngineError;

pub(super) struct Logs {
    wal: Arc<Wal>,
    audit: Arc<Wal>,
    /// The last checkpoint and what the next needs (`checkpoint.rs`); held for moments.
    checkpoints: Mutex<CheckpointState>,
    /// Held while a checkpoint runs: one at a time.
    checkpoint_running: Mutex<()>,
    /// WAL lsns kept for standbys that were just re-seeded (`backup_gate.rs`).
    pins: Arc<Pins>,
    /// Answered claims waiting for their durability tail's round (`settle.rs`); they hold
    /// shard owners, so this part is dropped after the shard pool.
    rounds: Rounds,
    /// The thread that syncs a claim step's WAL records while its results are prepared;
    /// declared last, so joined after the log role and the shard pool are gone, as before.
    claim_syncer: ClaimSyncer,
    /// On a real disk (a file's age is known there).
    real: bool,
    /// The storage's clock (when a checkpoint was taken, how old a file is).
    clock: Clock,
}

impl Logs {
    /// The logs over `wal` and `audit`, on `storage` (its clock, and whether it is real).
    pub(super) fn new(
        (wal, audit): (Arc<Wal>, Arc<Wal>),
        pins: Arc<Pins>,
        storage: &Arc<dyn Storage>,
    ) -> Logs {
        let clock = Clock::of(storage.clone());
        let claim_syncer = ClaimSyncer::start(wal.clone(), clock.clone());
        Logs {
            wal,
            audit,
            checkpoints: Mutex::new(CheckpointState::default()),
            checkpoint_running: Mutex::new(()),
            pins,
            rounds: Rounds::new(clock.clone()),
            claim_syncer,
            real: storage.is_real(),
            clock,
        }
    }

    pub(super) fn wal(&self) -> &Arc<Wal> {
        &self.wal
    }

    pub(super) fn audit(&self) -> &Arc<Wal> {
        &self.audit
    }

    /// What the engine remembers of checkpoints, locked for a moment.
    pub(super) fn state(&self) -> MutexGuard<'_, CheckpointState> {
        lock(&self.checkpoints)
    }

    /// Held while a checkpoint runs (or a base backup waits for one to finish).
    pub(super) fn one_checkpoint(&self) -> MutexGuard<'_, ()> {
        lock(&self.checkpoint_running)
    }

    pub(super) fn pins(&self) -> &Arc<Pins> {
        &self.pins
    }

    pub(super) fn rounds(&self) -> &Rounds {
        &self.rounds
    }

    /// Asks the claim syncer for the WAL durable through `lsn` (`None`: sync here).
    pub(super) fn ask_sync(&self, lsn: Lsn) -> Option<Receiver<Result<Instant, WalError>>> {
        self.claim_syncer.ask(lsn)
    }

    /// The WAL's first lsn a standby may still need below (the last checkpoint's start).
    pub(super) fn checkpoint_from(&self) -> Lsn {
        self.state().last.as_ref().map_or(1, |c| c.wal_from)
    }

    /// The last checkpoint, if any.
    pub(super) fn last_checkpoint(&self) -> Option<Checkpoint> {
        self.state().last.clone()
    }

    /// Records a checkpoint (or a pass with nothing new) in the state status reads.
    pub(super) fn checkpoint_taken(&self, wal_bytes: u64, c: Option<&Checkpoint>) {
        let mut st = self.state();
        st.wal_bytes_at_last = wal_bytes;
        st.taken = Some(self.clock.now());
        if let Some(c) = c {
            st.keys_through = c.keys_through;
            st.last_at_ms = c.at_ms;
            st.last = Some(c.clone());
        }
    }

    /// At open, what the engine remembers of checkpoints, from the last one (`c`), the key
    /// table (`keys_at`: the last lsn it holds and its newest stamp), the checkpoint interval
    /// and the time now.
    pub(super) fn resume_from(
        &self,
        c: &Checkpoint,
        (table_through, keys_max_at_ms): (Lsn, u64),
        interval: Duration,
        now: u64,
    ) {
        let mut st = self.state();
        st.keys_through = table_through.max(c.keys_through);
        // Stamps never go back along the table, even if the clock did: a run written after
        // the last CHECKPOINT (a crash between them) may hold a newer one.
        st.last_at_ms = c.at_ms.max(keys_max_at_ms);
        // The interval counts from the checkpoint itself, not from this start; the WAL found
        // here counts towards the next checkpoint's bytes.
        let age = match c.at_ms {
            0 => Duration::ZERO, // no checkpoint yet: the interval runs from this start
            at => Duration::from_millis(now.saturating_sub(at)).min(interval),
        };
        let now = self.clock.now();
        st.taken = Some(now.checked_sub(age).unwrap_or(now));
        st.found_at_open = self.wal.recovery_report().bytes_scanned;
        st.last = (c.wal_from > 1).then(|| c.clone());
    }

    /// The first of the WAL and the audit log with no spare segment: which, and why.
    pub(super) fn shortage(&self) -> Option<(String, NoRoom)> {
        if let Some(why) = self.wal.spare_missing() {
            return Some(("wal".into(), why));
        }
        if let Some(why) = self.audit.spare_missing() {
            return Some(("audit".into(), why));
        }
        None
    }

    /// The WAL's and the audit log's spare segments made again.
    pub(super) fn refill_spares(&self) -> Result<(), EngineError> {
        self.wal.refill_spare()?;
        self.audit.refill_spare()?;
        Ok(())
    }

    /// The audit log's oldest segments, wholly below the checkpoint's audit mark, while it is
    /// over `bytes_max` or they are older than `secs_max` (`audit_retain_*`).
    pub(super) fn retire_audit(
        &self,
        c: &Checkpoint,
        bytes_max: Option<u64>,
        secs_max: Option<u64>,
    ) -> Result<usize, EngineError> {
        if bytes_max.is_none() && secs_max.is_none() {
            return Ok(0);
        }
        let segs = self.audit.segment_files();
        let mut total: u64 = segs.iter().map(|s| s.2).sum();
        let mut below = None;
        for (i, (_, path, seg_bytes)) in segs.iter().enumerate() {
            let next_first = segs.get(i + 1).map(|s| s.0);
            // Whole segment below the mark: its successor starts at or below it.
            if next_first.is_none_or(|n| n > c.audit_from) {
                break;
            }
            let too_big = bytes_max.is_some_and(|m| total > m);
            let too_old = secs_max.is_some_and(|s| self.file_age(path) > Duration::from_secs(s));
            if !(too_big || too_old) {
                break;
            }
            total -= seg_bytes;
            below = next_first;
        }
        match below {
            Some(lsn) => Ok(self.audit.retire_below(lsn)?),
            None => Ok(0),
        }
    }

    /// Step 3 of recovery: the audit rows already written for unfinished claims, by claim
    /// lsn, read from the audit log's `from` on.
    pub(super) fn audited_rows(
        &self,
        unfinished: &BTreeMap<Lsn, ClaimRecord>,
        from: Lsn,
    ) -> Result<HashMap<Lsn, HashSet<u32>>, EngineError> {
        let mut audited: HashMap<Lsn, HashSet<u32>> = HashMap::new();
        let Some(first) = unfinished.keys().next().copied() else {
            return Ok(audited);
        };
        for row in read_audit(&self.audit, from) {
            let (_, a) = row?;
            if a.claim_lsn >= first && unfinished.contains_key(&a.claim_lsn) {
                audited.entry(a.claim_lsn).or_default().insert(a.op_index);
            }
        }
        Ok(audited)
    }

    /// Every audit row of the claims (claim `i`'s rows in `audited[i]` skipped), in one
    /// write, then each row's crash point in order; returns the last row's lsn.
    pub(super) fn write_audit_rows(
        &self,
        claims: &[(Lsn, &ClaimRecord)],
        audited: &[&HashSet<u32>],
        env: &Env,
    ) -> Result<Option<Lsn>, EngineError> {
        let mut rows = Vec::with_capacity(claims.iter().map(|(_, c)| c.ops.len()).sum());
        for (i, (lsn, c)) in claims.iter().enumerate() {
            rows.extend(audit_rows(*lsn, c, audited.get(i).copied())?);
        }
        let frames: Vec<(u8, &[u8])> = rows
            .iter()
            .map(|(_, p)| (RecordType::Audit as u8, p.as_slice()))
            .collect();
        let lsns = self.audit.append_many_nowait(&frames)?;
        for (i, _) in &rows {
            env.hit(Step::AfterAudit.nth(*i))?;
        }
        Ok(lsns.last().copied())
    }

    /// The `done` records of the claims at `claims`, in one write (not synced on their own);
    /// returns their lsns.
    pub(super) fn append_dones(&self, claims: &[Lsn], env: &Env) -> Result<Vec<Lsn>, EngineError> {
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
            env.hit(Step::AfterDone.at())?;
        }
        Ok(lsns)
    }

    /// The record at `lsn` that an answer cites is durable (here, and on a standby under
    /// `ack = "standby"`) before the answer is published.
    pub(super) fn answer_durable(
        &self,
        lsn: Lsn,
        role: &dyn LogRole,
        stats: &Stats,
    ) -> Result<(), EngineError> {
        self.wal.sync_to(lsn)?;
        self.wait_replicated(lsn, role, stats)
    }

    /// Under `ack = "standby"`, waits until a standby holds the record at `lsn` durably (or,
    /// with `when_standby_lost = "alone"`, until none is in sync for `standby_timeout_ms`).
    /// `Unreplicated` when the node stops or steps down meanwhile: nothing is published, and
    /// the batch stays claimed for recovery (or for the new primary).
    pub(super) fn wait_replicated(
        &self,
        lsn: Lsn,
        role: &dyn LogRole,
        stats: &Stats,
    ) -> Result<(), EngineError> {
        let below = || self.checkpoint_from();
        let waited = role.wait_replicated(lsn, &below)?;
        if let Some(t) = waited {
            stats.latency.replicate.record(t);
        }
        Ok(())
    }

    /// How long ago `path` was last written, by the storage's clock (zero when unknown: the
    /// simulated disk keeps no file times, and an unreadable time keeps the file).
    fn file_age(&self, path: &Path) -> Duration {
        if !self.real {
            return Duration::ZERO;
        }
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| self.clock.system_now().duration_since(t).ok())
            .unwrap_or(Duration::ZERO)
    }
}

/// The claim's audit rows (op index, encoded row), one per op not in `audited`.
fn audit_rows(
    lsn: Lsn,
    claim: &ClaimRecord,
    audited: Option<&HashSet<u32>>,
) -> Result<Vec<(usize, Vec<u8>)>, EngineError> {
    let mut rows = Vec::with_capacity(claim.ops.len());
    for (i, op) in claim.ops.iter().enumerate() {
        if audited.is_some_and(|a| a.contains(&(i as u32))) {
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

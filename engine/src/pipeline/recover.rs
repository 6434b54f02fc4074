//! Recovery at open: replay the WAL, open every shard it names, find the audit rows already
//! written, and finish every claimed batch without a `done` record from its recorded plan
//! and claimed ids (`RoostApplyBatch.tla`: a claim is always finished with the same ids).
//! Nothing new is taken until this returns. Claims left for later (under `ack = "standby"`,
//! or a promoted standby's) are finished by `Engine::finish_deferred` before intake opens.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use roost_wal::Lsn;
use tracing::info;

use roost_storage::{lock, read_all, Clock, OpenMode};

use super::records::{decode_checkpoint, Checkpoint, ClaimLedger, ClaimRecord};
use super::{io_err, Engine};
use crate::error::EngineError;

/// What recovery did at open.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub duration: Duration,
    pub wal_records: u64,
    pub batches_finished: u64,
    pub wal_torn_bytes: u64,
    pub audit_torn_bytes: u64,
}

/// Calls the caller's progress callback about ten times a second and logs once a second
/// (by the storage's clock).
struct Progress<'a> {
    callback: &'a dyn Fn(&str, u64, u64),
    clock: Clock,
    last_call: Instant,
    last_log: Instant,
}

impl Progress<'_> {
    fn report(&mut self, phase: &str, done: u64, total: u64) {
        let now = self.clock.now();
        if now.saturating_duration_since(self.last_call) >= Duration::from_millis(100) {
            self.last_call = now;
            (self.callback)(phase, done, total);
        }
        if now.saturating_duration_since(self.last_log) >= Duration::from_secs(1) {
            self.last_log = now;
            info!(phase, done, total, "recovery progress");
        }
    }
}

impl Engine {
    pub(super) fn recover(
        mut self,
        started: Instant,
        callback: &dyn Fn(&str, u64, u64),
    ) -> Result<Engine, EngineError> {
        let (clock, now) = (self.env.clock.clone(), self.env.clock.now());
        let mut progress = Progress {
            callback,
            clock,
            last_call: now,
            last_log: now,
        };
        // Step 0: the last checkpoint (or an empty one: replay from lsn 1), the key table's
        // keys still in the window, the id counter and each shard's flushed mark.
        let (storage, layout) = (self.env.storage.as_ref(), &self.env.layout);
        let _ = storage.remove(&layout.checkpoint().with_extension("tmp"));
        let ckpt = read_checkpoint(storage, layout)?;
        let now = self.env.clock.unix_ms();
        let table_through = self.keys.catch_up_index()?;
        self.claims.lock().resume_from(&ckpt);
        let horizon = ckpt.wal_from.saturating_sub(1);
        self.shards.horizon().store(horizon, Ordering::Relaxed);
        let interval = Duration::from_millis(self.env.config.checkpoint_interval_ms);
        let keys_at = (table_through, self.keys.max_at_ms());
        self.log.resume_from(&ckpt, keys_at, interval, now);
        callback(
            "replaying records",
            0,
            self.log.wal().recovery_report().records,
        );
        let mut report = |done, total| progress.report("replaying records", done, total);
        let (ledger, records) = self.claims.replay(self.log.wal(), &ckpt, &mut report)?;
        self.shards.set_synced_through(ledger.vouched.clone());
        // Step 2 opens no shard: a shard opens on first use (an unfinished claim below, or
        // a batch), and its largest id is folded into the counter before any id is minted
        // for it (`Planner::claim`).
        let finished = self.settle_unfinished(ledger, &ckpt, &mut progress)?;
        if finished > 0 {
            // The finished batches' `done` records, durable before anything new is taken: a
            // reused name must never see them finished again (`names.rs`).
            self.sync()?;
        }
        self.recovery = RecoveryReport {
            duration: self.env.clock.since(started),
            wal_records: records,
            batches_finished: finished,
            wal_torn_bytes: self.log.wal().recovery_report().torn_bytes_truncated,
            audit_torn_bytes: self.log.audit().recovery_report().torn_bytes_truncated,
        };
        info!(
            records,
            batches_finished = finished,
            checkpoint = ckpt.wal_from,
            ms = self.recovery.duration.as_millis() as u64,
            next_lsn = self.log.wal().next_lsn(),
            "recovery: done"
        );
        Ok(self)
    }

    /// Step 4, by role: a standby applies its unfinished claims' effects (the primary writes
    /// their `done`s); a primary under `ack = "standby"` leaves them for
    /// [`Engine::finish_deferred`] (their results wait for a standby, which can only
    /// connect once this returns); otherwise they are finished now. A replicating primary
    /// resumes or takes its epoch first: every record it appends from here on carries it.
    fn settle_unfinished(
        &self,
        ledger: ClaimLedger,
        ckpt: &Checkpoint,
        progress: &mut Progress<'_>,
    ) -> Result<u64, EngineError> {
        let r = &self.env.config.replication;
        if self.role() == super::Role::Standby {
            let claims = ledger.unfinished.clone();
            *lock(&self.held.ledger) = ledger;
            let audited = self.log.audited_rows(&claims, ckpt.audit_from)?;
            self.standby()
                .apply_effects(claims.iter().map(|(l, c)| (*l, c)), &audited)?;
            return Ok(0);
        }
        if r.enabled() {
            self.log_role.lead_at_start()?;
        }
        if r.ack == crate::config::Ack::Standby {
            lock(&self.held.deferred).extend(ledger.unfinished);
            return Ok(0);
        }
        let audited = self.log.audited_rows(&ledger.unfinished, ckpt.audit_from)?;
        self.finish_unfinished(&ledger.unfinished, &audited, progress)
    }

    /// Finishes every unfinished batch, oldest first, from its recorded plan.
    fn finish_unfinished(
        &self,
        unfinished: &BTreeMap<Lsn, ClaimRecord>,
        audited: &HashMap<Lsn, HashSet<u32>>,
        progress: &mut Progress<'_>,
    ) -> Result<u64, EngineError> {
        let mut finished = 0;
        let none = HashSet::new();
        for (lsn, claim) in unfinished {
            progress.report(
                "finishing claimed batches",
                finished,
                unfinished.len() as u64,
            );
            if cfg!(feature = "mutant-no-claim") {
                // The mutant: the claim is not kept across the retry. The key is forgotten,
                // so the client's retry plans again and mints fresh ids.
                self.claims.lock().keys.remove(&claim.request_key);
                continue;
            }
            info!(lsn, request_key = %claim.request_key, "recovery: finishing claimed batch");
            self.finish(*lsn, claim, audited.get(lsn).unwrap_or(&none))?;
            finished += 1;
        }
        Ok(finished)
    }

    /// Finishes the claims left for this moment (recovery's under `ack = "standby"`, or a
    /// promoted standby's), oldest first, each waiting for a standby like a live answer.
    /// Intake stays closed until this returns.
    pub fn finish_deferred(&self) -> Result<u64, EngineError> {
        let claims: BTreeMap<Lsn, ClaimRecord> =
            lock(&self.held.deferred).iter().cloned().collect();
        if claims.is_empty() {
            return Ok(0);
        }
        let from = self.log.state().last.as_ref().map_or(1, |c| c.audit_from);
        let audited = self.log.audited_rows(&claims, from)?;
        let none = HashSet::new();
        for (lsn, claim) in &claims {
            info!(lsn, request_key = %claim.request_key, "finishing claimed batch");
            self.finish(*lsn, claim, audited.get(lsn).unwrap_or(&none))?;
        }
        // The `done` records durable before intake opens (a reused name must never see
        // these batches finished again: `names.rs`).
        self.sync()?;
        lock(&self.held.deferred).clear();
        Ok(claims.len() as u64)
    }
}

/// The last checkpoint in the data directory, or the empty one (replay from lsn 1) when
/// there is none yet.
pub fn read_checkpoint(
    storage: &dyn roost_storage::Storage,
    layout: &crate::layout::Layout,
) -> Result<Checkpoint, EngineError> {
    let path = layout.checkpoint();
    match storage.open(&path, OpenMode::Read) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint {
            wal_from: 1,
            audit_from: 1,
            next_id: 1,
            ..Checkpoint::default()
        }),
        Err(e) => Err(io_err("open", &path)(e)),
        Ok(f) => {
            let bytes = read_all(f.as_ref()).map_err(io_err("read", &path))?;
            decode_checkpoint(&bytes).map_err(|detail| EngineError::Inconsistent {
                lsn: 0,
                detail: format!("{}: {detail}", path.display()),
            })
        }
    }
}

//! Checkpoints (issue 14; PostgreSQL's checkpoint and WAL recycling): what recovery needs
//! that the WAL below lsn X held, so that the WAL below X can go and a restart replays only
//! what came after. X is the first claim without a `done` record (or the WAL's end): every
//! batch below it is finished, its shard frames flushed, its audit rows durable.
//!
//! The steps, each a crash point, and what a crash after each leaves:
//! 1. The WAL synced (every `done` below X durable); the key table gets one record per claim
//!    or rejection in `[keys_through + 1, X)`, then is synced (`after_keys_sync`). A crash
//!    here: the old checkpoint still rules; its replay sees those keys again in the WAL, and
//!    the next checkpoint starts after the table's last key (no key is copied twice).
//!    Then one key index run for those keys, synced and renamed (`after_key_index`). A
//!    crash between the table's sync and the run: open indexes the table's tail.
//! 2. `CHECKPOINT.tmp` written and fdatasynced, renamed over `CHECKPOINT`, the data
//!    directory fsynced (`after_checkpoint`): recovery starts from X from now on.
//! 3. Every key below X leaves the in-memory map (the index answers it from now on); then
//!    the WAL segments wholly below X are removed and the WAL directory synced
//!    (`after_wal_retired`). A crash before the removal leaves segments recovery skips.
//! 4. Index runs whose newest key left the window are removed, then the key table's
//!    segments below the oldest run left; audit segments wholly below the checkpoint's audit mark go if
//!    `audit_retain_bytes` / `audit_retain_secs` say so (by default the audit log is kept).

use std::sync::atomic::Ordering;
use std::time::Duration;

use roost_storage::OpenMode;
use roost_wal::Lsn;
use tracing::{debug, info};

use super::crash::Step;
use super::env::Env;
use super::keys::KeyWindow;
use super::log_role::{LogRole, Role};
use super::logs::Logs;
use super::records::{self, Checkpoint};
use super::Engine;
use crate::config::{Ack, Config, StandbyLost};
use crate::error::EngineError;

/// A full key cache makes a checkpoint due at most this often: when the checkpoint cannot
/// move (an open claim at its point, or `ack = "standby"` waiting for a standby), the cache
/// keeps its keys and each pass would otherwise repeat at once.
const KEY_CACHE_RETRY: Duration = Duration::from_secs(1);

impl Engine {
    /// Takes a checkpoint now if anything was finished since the last one. Returns it, or
    /// `None` when there was nothing new. One at a time; batches go on meanwhile.
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>, EngineError> {
        // One at a time; the state lock is only held for moments (status reads it).
        let _one = self.log.one_checkpoint();
        self.env.check()?;
        // The claims answered and waiting for their round close first, so the checkpoint
        // can pass them (`settle.rs`).
        self.settle()?;
        if self.shards.gate().backup_running() {
            // A base backup copies the files as they are (`backup.rs`): the next one runs.
            debug!("checkpoint skipped: a base backup is being sent to a standby");
            return Ok(None);
        }
        let (wal, fail) = (self.log.wal(), || self.env.fail());
        let (last, keys_through, last_at_ms, wal_bytes) = {
            let st = self.log.state();
            let wal_bytes = wal.append_bytes() + st.found_at_open;
            (st.last.clone(), st.keys_through, st.last_at_ms, wal_bytes)
        };
        let now = self.env.clock.unix_ms().max(last_at_ms);
        let cap = |x| standby_cap(&self.env.config, self.log_role.as_ref(), x);
        let mut c = self.claims.checkpoint_point(&self.log, &self.shards, cap);
        if let Some(last) = last.filter(|l| l.wal_from >= c.wal_from) {
            // Nothing new below the first open claim; the window still moves.
            retire_tables((&self.keys, &self.log, &self.env), now, &last)?;
            self.log.checkpoint_taken(wal_bytes, None);
            return Ok(None);
        }
        if c.wal_from <= 1 {
            return Ok(None);
        }
        let end = wal.next_lsn() - 1;
        if end > 0 {
            wal.sync_to(end).inspect_err(|_| fail())?;
        }
        let Some(moved) = (self.keys).copy(wal, (keys_through + 1, c.wal_from), now, &fail)? else {
            return Ok(None); // no room for the key records: the next pass tries again
        };
        self.env.hit(Step::AfterKeysSync.at())?;
        self.keys.index_run(&moved).inspect_err(|_| fail())?;
        self.env.hit(Step::AfterKeyIndex.at())?;
        c.keys_through = c.wal_from.saturating_sub(1);
        c.at_ms = now;
        write_checkpoint(&self.env, &c)?;
        let horizon = c.wal_from.saturating_sub(1);
        self.shards.horizon().store(horizon, Ordering::Relaxed);
        self.claims.lock().forget_below(c.wal_from);
        // A standby just re-seeded starts its log at a pinned lsn (`backup.rs`).
        let keep = c.wal_from.min(self.log.pins().lowest().unwrap_or(Lsn::MAX));
        let retired = wal.retire_below(keep).inspect_err(|_| fail())?;
        self.env.hit(Step::AfterWalRetired.at())?;
        let parts = (&self.keys, &self.log, &self.env);
        let (forgot, audit_retired) = retire_tables(parts, now, &c)?;
        info!(
            wal_from = c.wal_from,
            keys_copied = moved.len(),
            wal_segments_retired = retired,
            keys_forgotten = forgot,
            audit_segments_retired = audit_retired,
            "checkpoint"
        );
        self.log.checkpoint_taken(wal_bytes, Some(&c));
        Ok(Some(c))
    }

    /// Whether a checkpoint is due: `checkpoint_wal_bytes` appended since the last, or
    /// `checkpoint_interval_ms` passed with something appended, or the key cache full.
    pub fn checkpoint_due(&self) -> bool {
        let full = self.claims.lock().keys.len() as u64 >= self.env.config.key_cache_keys_max();
        let st = self.log.state();
        let since = st.taken.map_or(Duration::MAX, |t| self.env.clock.since(t));
        if full && since >= KEY_CACHE_RETRY {
            return true; // the key cache is full: move its keys to the index on disk
        }
        let grown =
            (self.log.wal().append_bytes() + st.found_at_open).saturating_sub(st.wal_bytes_at_last);
        grown >= self.env.config.checkpoint_wal_bytes
            || (grown > 0 && since >= Duration::from_millis(self.env.config.checkpoint_interval_ms))
    }

    /// Bytes on disk per part: `wal`, `audit`, `keys`, `shards` (segments and spares, as
    /// preallocated; a compacted shard segment is as long as its content) and `checkpoint`.
    pub fn disk_bytes(&self) -> Vec<(&'static str, u64)> {
        let file_len = |p: &std::path::Path| {
            self.env
                .storage
                .open(p, OpenMode::Read)
                .and_then(|f| f.len())
                .unwrap_or(0)
        };
        let shards = self.shards.disk_bytes();
        let checkpoint = file_len(&self.env.layout.checkpoint());
        vec![
            ("wal", self.log.wal().disk_bytes()),
            ("audit", self.log.audit().disk_bytes()),
            ("keys", self.keys.disk_bytes()),
            ("shards", shards),
            ("checkpoint", checkpoint),
        ]
    }
}

/// A primary that waits for its standby never checkpoints past what the standby holds: if
/// it is ever demoted, what it must cut is above its checkpoint. Returns X so capped.
fn standby_cap(config: &Config, role: &dyn LogRole, wal_from: Lsn) -> Lsn {
    let r = &config.replication;
    if r.ack == Ack::Standby
        && r.when_standby_lost == StandbyLost::Wait
        && role.role() == Role::Primary
    {
        wal_from.min(role.high_watermark().max(1))
    } else {
        wal_from
    }
}

/// Step 4: index runs wholly out of the window removed, the key table trimmed below the
/// oldest run left, the audit log trimmed. Returns (keys forgotten, audit segments removed).
fn retire_tables(
    (keys, log, env): (&KeyWindow, &Logs, &Env),
    now: u64,
    c: &Checkpoint,
) -> Result<(usize, usize), EngineError> {
    let forgot = keys.retire(now).inspect_err(|_| env.fail())?;
    let (bytes_max, secs_max) = (env.config.audit_retain_bytes, env.config.audit_retain_secs);
    let audit = (log.retire_audit(c, bytes_max, secs_max)).inspect_err(|_| env.fail())?;
    Ok((forgot, audit))
}

/// Step 2: `CHECKPOINT.tmp`, synced, renamed over `CHECKPOINT`, the directory synced.
fn write_checkpoint(env: &Env, c: &Checkpoint) -> Result<(), EngineError> {
    let bytes = records::encode_checkpoint(c).map_err(EngineError::Encode)?;
    env.replace_file(&env.layout.checkpoint(), &bytes)?;
    env.hit(Step::AfterCheckpoint.at())
}

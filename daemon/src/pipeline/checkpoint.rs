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

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use roost_storage::{lock, OpenMode};
use roost_wal::format::frame_len;
use roost_wal::{Lsn, WalError};
use tracing::{debug, info};

use super::crash::Step;
use super::keys::{self, Moved};
use super::records::{self, read_wal_frames, Checkpoint, KEY_RECORD_TYPE};
use super::Engine;
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
        let _one = lock(&self.checkpoint_running);
        self.check()?;
        // The claims answered and waiting for their round close first, so the checkpoint
        // can pass them (`settle.rs`).
        self.settle()?;
        if self.backup_gate.backup_running() {
            // A base backup copies the files as they are (`backup.rs`): the next one runs.
            debug!("checkpoint skipped: a base backup is being sent to a standby");
            return Ok(None);
        }
        let (last, keys_through, last_at_ms, wal_bytes) = {
            let st = lock(&self.checkpoints);
            let wal_bytes = self.wal.append_bytes() + st.found_at_open;
            (st.last.clone(), st.keys_through, st.last_at_ms, wal_bytes)
        };
        let now = keys::now_ms().max(last_at_ms);
        let mut c = self.checkpoint_point();
        if let Some(last) = last.filter(|l| l.wal_from >= c.wal_from) {
            // Nothing new below the first open claim; the window still moves.
            self.retire_tables(now, &last)?;
            self.checkpoint_taken(wal_bytes, None);
            return Ok(None);
        }
        if c.wal_from <= 1 {
            return Ok(None);
        }
        let end = self.wal.next_lsn() - 1;
        if end > 0 {
            self.wal.sync_to(end).inspect_err(|_| self.fail())?;
        }
        let Some(moved) = self.copy_keys(keys_through + 1, c.wal_from, now)? else {
            return Ok(None); // no room for the key records: the next pass tries again
        };
        self.index_keys(&moved).inspect_err(|_| self.fail())?;
        self.hit(Step::AfterKeyIndex.at())?;
        c.keys_through = c.wal_from.saturating_sub(1);
        c.at_ms = now;
        self.write_checkpoint(&c)?;
        self.compact_horizon.store(
            c.wal_from.saturating_sub(1),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.forget_checkpointed(c.wal_from);
        // A standby just re-seeded starts its log at a pinned lsn (`backup.rs`).
        let keep = c
            .wal_from
            .min(self.backup_pins.lowest().unwrap_or(Lsn::MAX));
        let retired = self.wal.retire_below(keep).inspect_err(|_| self.fail())?;
        self.hit(Step::AfterWalRetired.at())?;
        let (forgot, audit_retired) = self.retire_tables(now, &c)?;
        info!(
            wal_from = c.wal_from,
            keys_copied = moved.len(),
            wal_segments_retired = retired,
            keys_forgotten = forgot,
            audit_segments_retired = audit_retired,
            "checkpoint"
        );
        self.checkpoint_taken(wal_bytes, Some(&c));
        Ok(Some(c))
    }

    /// Records a checkpoint (or a pass with nothing new) in the state status reads.
    fn checkpoint_taken(&self, wal_bytes: u64, c: Option<&Checkpoint>) {
        let mut st = lock(&self.checkpoints);
        st.wal_bytes_at_last = wal_bytes;
        st.taken = Some(Instant::now());
        if let Some(c) = c {
            st.keys_through = c.keys_through;
            st.last_at_ms = c.at_ms;
            st.last = Some(c.clone());
        }
    }

    /// Whether a checkpoint is due: `checkpoint_wal_bytes` appended since the last, or
    /// `checkpoint_interval_ms` passed with something appended, or the key cache full.
    pub fn checkpoint_due(&self) -> bool {
        let full = self.cached_keys() as u64 >= self.config.key_cache_keys_max();
        let st = lock(&self.checkpoints);
        let since = st.taken.map_or(Duration::MAX, |t| t.elapsed());
        if full && since >= KEY_CACHE_RETRY {
            return true; // the key cache is full: move its keys to the index on disk
        }
        let grown =
            (self.wal.append_bytes() + st.found_at_open).saturating_sub(st.wal_bytes_at_last);
        grown >= self.config.checkpoint_wal_bytes
            || (grown > 0 && since >= Duration::from_millis(self.config.checkpoint_interval_ms))
    }

    /// Bytes on disk per part: `wal`, `audit`, `keys`, `shards` (segments and spares, as
    /// preallocated; a compacted shard segment is as long as its content) and `checkpoint`.
    pub fn disk_bytes(&self) -> Vec<(&'static str, u64)> {
        let file_len = |p: &std::path::Path| {
            self.storage
                .open(p, OpenMode::Read)
                .and_then(|f| f.len())
                .unwrap_or(0)
        };
        let names: Vec<String> = lock(&self.shards).keys().cloned().collect();
        let shards: u64 = names
            .iter()
            .map(|name| {
                let dir = self.layout.shard(name);
                let files = self.storage.list(&dir).unwrap_or_default();
                files
                    .iter()
                    .filter(|n| {
                        n.ends_with(roost_shards::SEGMENT_SUFFIX) || *n == roost_storage::SPARE_FILE
                    })
                    .map(|n| file_len(&dir.join(n)))
                    .sum::<u64>()
            })
            .sum();
        let checkpoint = file_len(&self.layout.checkpoint());
        vec![
            ("wal", self.wal.disk_bytes()),
            ("audit", self.audit.disk_bytes()),
            ("keys", self.keys.disk_bytes()),
            ("shards", shards),
            ("checkpoint", checkpoint),
        ]
    }

    /// Compaction figures per open shard.
    pub fn shard_compaction(&self) -> BTreeMap<String, roost_shards::CompactionStats> {
        let slots: Vec<_> = lock(&self.shards)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        slots
            .into_iter()
            .filter_map(|(k, s)| s.compaction().ok().map(|c| (k, c)))
            .collect()
    }

    /// The last checkpoint, if any.
    pub fn last_checkpoint(&self) -> Option<Checkpoint> {
        lock(&self.checkpoints).last.clone()
    }

    /// Under the planner lock: X (the first open claim, else the WAL's end), the audit mark,
    /// the id counter, and what each shard has flushed.
    fn checkpoint_point(&self) -> Checkpoint {
        let p = lock(&self.planner);
        let (wal_from, audit_from) = match p.open.first_key_value() {
            Some((lsn, mark)) => (*lsn, *mark),
            None => (self.wal.next_lsn(), self.audit.next_lsn()),
        };
        // A primary that waits for its standby never checkpoints past what the standby
        // holds: if it is ever demoted, what it must cut is above its checkpoint.
        let r = &self.config.replication;
        let wal_from = if r.ack == crate::config::Ack::Standby
            && r.when_standby_lost == crate::config::StandbyLost::Wait
            && self.role() == super::Role::Primary
        {
            wal_from.min(self.log_role.high_watermark().max(1))
        } else {
            wal_from
        };
        let mut shards: Vec<(String, Lsn)> =
            p.vouched.iter().map(|(k, v)| (k.clone(), *v)).collect();
        for name in lock(&self.shards).keys() {
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

    /// Step 1: one key record per claim or rejection in `[from, to)`, then the table synced.
    /// The table first reserves room for all of them ([`roost_wal::Wal::reserve`]), so a
    /// full disk is met before anything is written, never between two of them (a roll with
    /// no room there would stop the daemon): `None` then, with the table's spare missing, so
    /// intake pauses until the serve loop makes it and a later checkpoint goes on.
    fn copy_keys(&self, from: Lsn, to: Lsn, at_ms: u64) -> Result<Option<Vec<Moved>>, EngineError> {
        let mut bytes = 0;
        self.each_key_record(from, to, at_ms, |_, payload| {
            bytes += frame_len(payload.len()) as u64;
            Ok(())
        })?;
        match self.keys.reserve(bytes) {
            Ok(()) => {}
            Err(WalError::NoSpace(why)) => {
                debug!(%why, "checkpoint waits: no room for its key records");
                return Ok(None);
            }
            Err(e) => {
                self.fail();
                return Err(e.into());
            }
        }
        let mut moved = Vec::new();
        self.each_key_record(from, to, at_ms, |k, payload| {
            let (lsn, offset) = self
                .keys
                .append_nowait_at(KEY_RECORD_TYPE, &payload)
                .inspect_err(|_| self.fail())?;
            moved.push((k.request_key, k.lsn, lsn, offset, at_ms));
            Ok(())
        })?;
        if let Some((.., last, _, _)) = moved.last() {
            self.keys.sync_to(*last).inspect_err(|_| self.fail())?;
        }
        self.hit(Step::AfterKeysSync.at())?;
        Ok(Some(moved))
    }

    /// Each key record of the claims and rejections in `[from, to)` and its encoding, in
    /// lsn order (read from the WAL each time: nothing held for the whole range).
    fn each_key_record(
        &self,
        from: Lsn,
        to: Lsn,
        at_ms: u64,
        mut f: impl FnMut(records::KeyRecord, Vec<u8>) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        for entry in read_wal_frames(&self.wal, from) {
            let (rec, entry) = entry?;
            if rec.lsn >= to {
                break;
            }
            let Some(k) = keys::record_of(rec.lsn, &entry, at_ms) else {
                continue;
            };
            let payload = records::encode("key", &k).map_err(EngineError::Encode)?;
            f(k, payload)?;
        }
        Ok(())
    }

    /// Step 2: `CHECKPOINT.tmp`, synced, renamed over `CHECKPOINT`, the directory synced.
    fn write_checkpoint(&self, c: &Checkpoint) -> Result<(), EngineError> {
        let bytes = records::encode_checkpoint(c).map_err(EngineError::Encode)?;
        self.replace_file(&self.layout.checkpoint(), &bytes)?;
        self.hit(Step::AfterCheckpoint.at())
    }

    /// Step 3: keys whose batch is below the checkpoint leave the map (a key a newer batch
    /// took stays): the index answers them from now on. Every batch below `wal_from` is
    /// finished and its key is in the table and its index: the keys this checkpoint moved,
    /// and those an earlier checkpoint copied and indexed before a crash kept its
    /// `CHECKPOINT` from being written (the replay put them back in the map; their WAL goes
    /// next).
    fn forget_checkpointed(&self, wal_from: Lsn) {
        let mut p = lock(&self.planner);
        p.keys.retain(|_, k| k.lsn >= wal_from);
        if p.keys.capacity() > 4 * p.keys.len().max(1024) {
            p.keys.shrink_to_fit(); // give back what a burst between checkpoints took
        }
    }

    /// Step 4: index runs wholly out of the window removed, the key table trimmed below the
    /// oldest run left, the audit log trimmed. Returns (keys forgotten, audit segments
    /// removed).
    fn retire_tables(&self, now: u64, c: &Checkpoint) -> Result<(usize, usize), EngineError> {
        let (_, forgot) = self
            .index
            .expire(self.key_cutoff_ms(now))
            .inspect_err(|_| self.fail())?;
        let keep_from = self
            .index
            .first_table_lsn()
            .unwrap_or_else(|| self.keys.next_lsn());
        let removed = self
            .keys
            .retire_below(keep_from)
            .inspect_err(|_| self.fail())?;
        debug!(
            removed,
            keep_from, "key table: segments below the oldest index run removed"
        );
        let audit = self.retire_audit(c).inspect_err(|_| self.fail())?;
        Ok((forgot as usize, audit))
    }

    /// The audit log's oldest segments, wholly below the checkpoint's audit mark, while it is
    /// over `audit_retain_bytes` or they are older than `audit_retain_secs`.
    fn retire_audit(&self, c: &Checkpoint) -> Result<usize, EngineError> {
        let (bytes_max, secs_max) = (
            self.config.audit_retain_bytes,
            self.config.audit_retain_secs,
        );
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

    /// How long ago `path` was last written (zero when unknown: the simulated disk has no
    /// clock, and an unreadable time keeps the file).
    fn file_age(&self, path: &std::path::Path) -> Duration {
        if !self.storage.is_real() {
            return Duration::ZERO;
        }
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .unwrap_or(Duration::ZERO)
    }
}

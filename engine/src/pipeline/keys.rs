//! The request-key table (issue 14) and its index (issue 25): where a key's answer lives
//! once its batch is below a checkpoint and the WAL records that held it may be gone. A log
//! in `<data-dir>/keys` (the WAL's frame format), appended at each checkpoint with one
//! [`KeyRecord`] per claim or rejection the checkpoint passed, in lsn order, stamped with the
//! time it entered (never decreasing along the table). A key is remembered for
//! `request_key_window_secs` from then (Stripe's 24-hour idempotency window); after it, the
//! same key is a new batch.
//!
//! Memory holds only the keys the WAL still answers (the planner's map, at most
//! `key_cache_keys_max` before a checkpoint is due); a checkpointed key is found through the
//! index on disk (`roost_keyindex`, `<data-dir>/keyindex`): its filters rule a new key out
//! without a read, and a key seen before costs one index block and one table record. The
//! index holds what the table holds: each checkpoint adds a run for the keys it copied, and
//! open indexes any table records a crash left without one. Expiry removes whole runs and
//! the table segments below the oldest run left; a key is checked against the window when
//! its record is read.

use std::sync::Arc;

use roost_keyindex::{Entry, IndexStats, KeyIndex, RunMeta};
use roost_storage::{Clock, NoRoom};
use roost_wal::format::frame_len;
use roost_wal::{Lsn, Wal, WalError};

use super::env::Env;
use super::records::{
    self, read_wal_frames, ClaimRecord, KeyAnswer, KeyRecord, OpKind, WalEntry, KEY_RECORD_TYPE,
};
use super::stats::Stats;
use crate::batch::{BatchResult, OpResult};
use crate::error::EngineError;
use tracing::debug;

#[derive(Clone, Copy)]
pub(super) struct KeyState {
    pub lsn: Lsn,
    pub fingerprint: u64,
    pub done: bool,
    /// `lsn` is a recorded rejection (not a claim): the same batch gets it again, another
    /// batch under the key is planned as new.
    pub rejected: bool,
    /// Where the record that answers it is: one record read, never a segment scan.
    pub at: KeyAt,
}

/// Where a key's answer is read from.
#[derive(Clone, Copy, Debug)]
pub(super) enum KeyAt {
    /// The claim or rejection at the key's lsn, at this offset of its WAL segment.
    Wal { offset: u64 },
    /// The key table's record `lsn`, at `offset` (the WAL below a checkpoint may be gone).
    Keys { lsn: Lsn, offset: u64 },
}

impl KeyState {
    /// What a batch with fingerprint `fp` finds under this key.
    pub(super) fn check(self, fp: u64) -> KeyFound {
        match self {
            k if k.rejected && k.fingerprint != fp => KeyFound::Free,
            k if k.fingerprint != fp || k.done => KeyFound::Answered(k),
            _ => KeyFound::InFlight,
        }
    }
}

/// What a key holds for a batch.
pub(super) enum KeyFound {
    /// Nothing that binds it: plan the batch.
    Free,
    /// An answer: a conflict, or the original result (committed or rejected).
    Answered(KeyState),
    /// The same batch, claimed and not yet finished.
    InFlight,
}

/// The key window: the request-key table and its index on disk, the engine's part that
/// answers for keys below the last checkpoint. It never sees the planner's map of keys the
/// WAL still answers; the engine asks the map first.
pub(super) struct KeyWindow {
    /// The request-key table.
    table: Wal,
    /// The key table's index on disk (`roost_keyindex`).
    index: KeyIndex,
    /// `request_key_window_secs`.
    window_secs: u64,
    stats: Arc<Stats>,
    /// The storage's clock: the window is wall-clock time (`Clock::unix_ms`).
    clock: Clock,
}

/// Table records indexed per run when open catches the index up (a data directory from
/// before the index, or a crash between the table's sync and the run's).
const CATCH_UP_RUN_KEYS: usize = 1 << 20;

/// The answer a key record holds, exactly as the client first saw it.
pub(super) fn answer(k: &KeyRecord) -> BatchResult {
    match &k.answer {
        KeyAnswer::Committed(ops) => BatchResult::Committed {
            request_key: k.request_key.clone(),
            lsn: k.lsn,
            ops: ops
                .iter()
                .map(|(op, shard, id)| OpResult {
                    op: op.as_str().to_owned(),
                    shard: shard.clone(),
                    id: *id,
                })
                .collect(),
        },
        KeyAnswer::Rejected { op_index, reason } => BatchResult::Rejected {
            request_key: k.request_key.clone(),
            op_index: *op_index,
            reason: reason.clone(),
        },
    }
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

/// The key record of a claim or a rejection at `lsn` (`None` for a `done` record).
pub(super) fn record_of(lsn: Lsn, entry: &WalEntry, at_ms: u64) -> Option<KeyRecord> {
    let (request_key, fingerprint, answer) = match entry {
        WalEntry::Claim(c) => {
            let ops: Vec<(OpKind, String, u64)> = c
                .ops
                .iter()
                .map(|op| (op.kind(), op.shard().to_owned(), op.id()))
                .collect();
            (&c.request_key, c.fingerprint, KeyAnswer::Committed(ops))
        }
        WalEntry::Rejected(r) => {
            let answer = KeyAnswer::Rejected {
                op_index: r.op_index,
                reason: r.reason.clone(),
            };
            (&r.request_key, r.fingerprint, answer)
        }
        WalEntry::Done(_) => return None,
    };
    Some(KeyRecord {
        request_key: request_key.clone(),
        fingerprint,
        lsn,
        at_ms,
        answer,
    })
}

/// A key copied into the table at a checkpoint: (key, batch lsn, table lsn, offset, at).
pub(super) type Moved = (String, Lsn, Lsn, u64, u64);

impl KeyWindow {
    pub(super) fn new(table: Wal, index: KeyIndex, window_secs: u64, env: &Env) -> KeyWindow {
        KeyWindow {
            table,
            index,
            window_secs,
            stats: env.stats.clone(),
            clock: env.clock.clone(),
        }
    }

    /// The oldest moment a remembered key may have entered the table.
    pub(super) fn cutoff_ms(&self, now: u64) -> u64 {
        now.saturating_sub(self.window_secs.saturating_mul(1000))
    }

    /// At open: indexes the table records no run holds yet, so the index holds the whole
    /// table. Returns the largest batch lsn the table holds (0 when empty).
    pub(super) fn catch_up_index(&self) -> Result<Lsn, EngineError> {
        let table_next = self.table.next_lsn();
        if let Some(last) = self.index.last_table_lsn().filter(|l| *l >= table_next) {
            return Err(EngineError::Inconsistent {
                lsn: last,
                detail: format!(
                    "the key index holds table lsn {last}, the key table ends before {table_next}"
                ),
            });
        }
        let from = self.index.last_table_lsn().map_or(1, |l| l + 1);
        let mut batch: Vec<Moved> = Vec::new();
        for rec in self.table.replay(from) {
            let rec = rec?;
            let k = records::decode_key(&rec)?;
            batch.push((k.request_key, k.lsn, rec.lsn, rec.offset, k.at_ms));
            if batch.len() == CATCH_UP_RUN_KEYS {
                self.index_run(&std::mem::take(&mut batch))?;
            }
        }
        self.index_run(&batch)?;
        Ok(self.index.max_batch_lsn())
    }

    /// One index run for keys just copied into the table (in table order), durable when this
    /// returns.
    pub(super) fn index_run(&self, moved: &[Moved]) -> Result<(), EngineError> {
        let (Some(first), Some(last)) = (moved.first(), moved.last()) else {
            return Ok(());
        };
        let entries = moved
            .iter()
            .map(|(key, _, lsn, offset, _)| Entry {
                hash: self.index.hash(key.as_bytes()),
                table_lsn: *lsn,
                offset: *offset,
            })
            .collect();
        let meta = RunMeta {
            first_table_lsn: first.2,
            last_table_lsn: last.2,
            min_at_ms: moved.iter().map(|m| m.4).min().unwrap_or(0),
            max_at_ms: moved.iter().map(|m| m.4).max().unwrap_or(0),
            max_batch_lsn: moved.iter().map(|m| m.1).max().unwrap_or(0),
        };
        self.index.add_run(entries, meta).map_err(EngineError::from)
    }

    /// A checkpointed key still inside the window: its newest table record, found through
    /// the index and read to compare the key (the index holds only hashes).
    pub(super) fn indexed(&self, key: &str) -> Result<Option<KeyState>, EngineError> {
        let cutoff = self.cutoff_ms(self.clock.unix_ms());
        for (lsn, offset) in self.index.candidates(key.as_bytes())? {
            let rec = match self.table.read_record(lsn, offset) {
                // Expired and retired since the lookup: older than the window.
                Err(WalError::Missing { .. }) if lsn < self.table.first_lsn() => return Ok(None),
                r => r?,
            };
            let k = records::decode_key(&rec)?;
            if k.request_key != key {
                continue; // another key with the same hash
            }
            if k.at_ms < cutoff {
                return Ok(None); // the newest record of the key left the window
            }
            self.stats
                .key_index_reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(Some(KeyState {
                lsn: k.lsn,
                fingerprint: k.fingerprint,
                done: true,
                rejected: matches!(k.answer, KeyAnswer::Rejected { .. }),
                at: KeyAt::Keys { lsn, offset },
            }));
        }
        Ok(None)
    }

    /// The index's figures: runs, entries, filter and fence bytes.
    pub(super) fn index_stats(&self) -> IndexStats {
        self.index.stats()
    }

    /// The largest entry time the index holds (0 when empty).
    pub(super) fn max_at_ms(&self) -> u64 {
        self.index.max_at_ms()
    }

    /// The key table's record at (`lsn`, `offset`), decoded.
    pub(super) fn read(&self, lsn: Lsn, offset: u64) -> Result<KeyRecord, EngineError> {
        let rec = self.table.read_record(lsn, offset)?;
        records::decode_key(&rec)
    }

    /// The table's bytes on disk.
    pub(super) fn disk_bytes(&self) -> u64 {
        self.table.disk_bytes()
    }

    /// The table's files and extents, for a base backup.
    pub(super) fn extent(&self) -> Vec<(std::path::PathBuf, Option<u64>)> {
        self.table.extent()
    }

    /// Why the table has no spare segment, if it has none.
    pub(super) fn spare_missing(&self) -> Option<NoRoom> {
        self.table.spare_missing()
    }

    /// Makes the table's spare segment again.
    pub(super) fn refill_spare(&self) -> Result<(), EngineError> {
        self.table.refill_spare()?;
        Ok(())
    }

    /// Step 1: one key record per claim or rejection in `[from, to)`, then the table synced.
    /// The table first reserves room for all of them ([`roost_wal::Wal::reserve`]), so a
    /// full disk is met before anything is written, never between two of them (a roll with
    /// no room there would stop the daemon): `None` then, with the table's spare missing, so
    /// intake pauses until the serve loop makes it and a later checkpoint goes on.
    /// A failure to reserve (other than no room), append or sync calls `fail`.
    pub(super) fn copy(
        &self,
        wal: &Wal,
        (from, to): (Lsn, Lsn),
        at_ms: u64,
        fail: &dyn Fn(),
    ) -> Result<Option<Vec<Moved>>, EngineError> {
        let mut bytes = 0;
        each_key_record(wal, from, to, at_ms, |_, payload| {
            bytes += frame_len(payload.len()) as u64;
            Ok(())
        })?;
        match self.table.reserve(bytes) {
            Ok(()) => {}
            Err(WalError::NoSpace(why)) => {
                debug!(%why, "checkpoint waits: no room for its key records");
                return Ok(None);
            }
            Err(e) => {
                fail();
                return Err(e.into());
            }
        }
        let mut moved = Vec::new();
        each_key_record(wal, from, to, at_ms, |k, payload| {
            let (lsn, offset) = (self.table)
                .append_nowait_at(KEY_RECORD_TYPE, &payload)
                .inspect_err(|_| fail())?;
            moved.push((k.request_key, k.lsn, lsn, offset, at_ms));
            Ok(())
        })?;
        if let Some((.., last, _, _)) = moved.last() {
            self.table.sync_to(*last).inspect_err(|_| fail())?;
        }
        Ok(Some(moved))
    }

    /// Index runs wholly out of the window removed (as of `now`), then the table's segments
    /// below the oldest run left. Returns the keys forgotten.
    pub(super) fn retire(&self, now: u64) -> Result<usize, EngineError> {
        let (_, forgot) = self.index.expire(self.cutoff_ms(now))?;
        let keep_from = self
            .index
            .first_table_lsn()
            .unwrap_or_else(|| self.table.next_lsn());
        let removed = self.table.retire_below(keep_from)?;
        debug!(
            removed,
            keep_from, "key table: segments below the oldest index run removed"
        );
        Ok(forgot as usize)
    }
}

/// Each key record of the claims and rejections in `[from, to)` and its encoding, in
/// lsn order (read from the WAL each time: nothing held for the whole range).
fn each_key_record(
    wal: &Wal,
    from: Lsn,
    to: Lsn,
    at_ms: u64,
    mut f: impl FnMut(records::KeyRecord, Vec<u8>) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    for entry in read_wal_frames(wal, from) {
        let (rec, entry) = entry?;
        if rec.lsn >= to {
            break;
        }
        let Some(k) = record_of(rec.lsn, &entry, at_ms) else {
            continue;
        };
        let payload = records::encode("key", &k).map_err(EngineError::Encode)?;
        f(k, payload)?;
    }
    Ok(())
}

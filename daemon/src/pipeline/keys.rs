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

use std::time::{SystemTime, UNIX_EPOCH};

use roost_keyindex::{Entry, RunMeta};
use roost_wal::{Lsn, WalError};

use super::records::{self, KeyAnswer, KeyRecord, OpKind, WalEntry};
use super::{Engine, KeyAt, KeyState, Planner};
use crate::batch::{BatchResult, OpResult};
use crate::error::EngineError;

/// Table records indexed per run when open catches the index up (a data directory from
/// before the index, or a crash between the table's sync and the run's).
const CATCH_UP_RUN_KEYS: usize = 1 << 20;

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

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

impl Engine {
    /// The oldest moment a remembered key may have entered the table.
    pub(super) fn key_cutoff_ms(&self, now: u64) -> u64 {
        now.saturating_sub(self.config.request_key_window_secs.saturating_mul(1000))
    }

    /// At open: indexes the table records no run holds yet, so the index holds the whole
    /// table. Returns the largest batch lsn the table holds (0 when empty).
    pub(super) fn catch_up_key_index(&self) -> Result<Lsn, EngineError> {
        let table_next = self.keys.next_lsn();
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
        for rec in self.keys.replay(from) {
            let rec = rec?;
            let k = records::decode_key(&rec)?;
            batch.push((k.request_key, k.lsn, rec.lsn, rec.offset, k.at_ms));
            if batch.len() == CATCH_UP_RUN_KEYS {
                self.index_keys(&std::mem::take(&mut batch))?;
            }
        }
        self.index_keys(&batch)?;
        Ok(self.index.max_batch_lsn())
    }

    /// One index run for keys just copied into the table (in table order), durable when this
    /// returns.
    pub(super) fn index_keys(&self, moved: &[Moved]) -> Result<(), EngineError> {
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

    /// What the planner knows of `key`: the map (keys the WAL still answers), else the
    /// index on disk. Called under the planner lock: a checkpoint adds a key's run before
    /// it takes the key out of the map, so a key is always in one or the other.
    pub(super) fn key_state(
        &self,
        p: &Planner,
        key: &str,
    ) -> Result<Option<KeyState>, EngineError> {
        match p.keys.get(key) {
            Some(k) => Ok(Some(*k)),
            None => self.indexed_key(key),
        }
    }

    /// A checkpointed key still inside the window: its newest table record, found through
    /// the index and read to compare the key (the index holds only hashes).
    fn indexed_key(&self, key: &str) -> Result<Option<KeyState>, EngineError> {
        let cutoff = self.key_cutoff_ms(now_ms());
        for (lsn, offset) in self.index.candidates(key.as_bytes())? {
            let rec = match self.keys.read_record(lsn, offset) {
                // Expired and retired since the lookup: older than the window.
                Err(WalError::Missing { .. }) if lsn < self.keys.first_lsn() => return Ok(None),
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

    /// Keys remembered now: those the WAL answers plus those the index holds (a run's keys
    /// count until the run expires whole).
    pub fn live_keys(&self) -> usize {
        self.cached_keys() + self.index.stats().entries as usize
    }

    /// Keys in the in-memory map (not yet checkpointed, or in flight).
    pub fn cached_keys(&self) -> usize {
        roost_storage::lock(&self.planner).keys.len()
    }

    pub fn key_index_stats(&self) -> roost_keyindex::IndexStats {
        self.index.stats()
    }
}

//! The request-key table (issue 14): where a key's answer lives once its batch is below a
//! checkpoint and the WAL records that held it may be gone. A log in `<data-dir>/keys` (the
//! WAL's frame format), appended at each checkpoint with one [`KeyRecord`] per claim or
//! rejection the checkpoint passed, in lsn order, stamped with the time it entered (never
//! decreasing along the table). A key is remembered for `request_key_window_secs` from then
//! (Stripe's 24-hour idempotency window); after it, the same key is a new batch. Memory holds
//! each live key once (`KeyState`, the record's position, so a duplicate answer reads one
//! record); the reaper forgets expired keys a slice at a time, and whole table segments
//! below the oldest live record are removed.

use std::time::{SystemTime, UNIX_EPOCH};

use roost_wal::Lsn;

use super::records::{self, KeyAnswer, KeyRecord, OpKind, WalEntry};
use super::{lock, Engine, KeyAt, KeyState};
use crate::batch::{BatchResult, OpResult};
use crate::error::EngineError;

/// Keys the reaper forgets per call at most (its work is spread, never one long pause).
pub(super) const REAP_SLICE: usize = 4096;

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

/// A key the table holds, for the reaper: (entered at, key, claim lsn, table lsn).
pub(super) type Reaped = (u64, String, Lsn, Lsn);

impl Engine {
    /// The oldest moment a remembered key may have entered the table.
    pub(super) fn key_cutoff_ms(&self, now: u64) -> u64 {
        now.saturating_sub(self.config.request_key_window_secs.saturating_mul(1000))
    }

    /// At open: every key of the table still inside the window, into the planner. Returns
    /// the largest batch lsn the table holds (0 when empty).
    pub(super) fn load_keys(&self, now: u64) -> Result<Lsn, EngineError> {
        let cutoff = self.key_cutoff_ms(now);
        let mut through = 0;
        let mut p = lock(&self.planner);
        for rec in self.keys.replay(1) {
            let rec = rec?;
            let k = records::decode_key(&rec)?;
            through = through.max(k.lsn);
            if k.at_ms < cutoff {
                continue;
            }
            let state = KeyState {
                lsn: k.lsn,
                fingerprint: k.fingerprint,
                done: true,
                rejected: matches!(k.answer, KeyAnswer::Rejected { .. }),
                at: KeyAt::Keys {
                    lsn: rec.lsn,
                    offset: rec.offset,
                },
            };
            p.reaper
                .push_back((k.at_ms, k.request_key.clone(), k.lsn, rec.lsn));
            p.keys.insert(k.request_key, state);
        }
        Ok(through)
    }

    /// Forgets at most `max` keys that left the window (a key answered by a newer batch stays).
    /// Returns how many were forgotten and the table lsn of the oldest key still held.
    pub(super) fn reap_keys(&self, now: u64, max: usize) -> (usize, Option<Lsn>) {
        let cutoff = self.key_cutoff_ms(now);
        let mut p = lock(&self.planner);
        let mut forgot = 0;
        for _ in 0..max {
            match p.reaper.front() {
                Some((at, ..)) if *at < cutoff => {}
                _ => break,
            }
            let Some((_, key, lsn, _)) = p.reaper.pop_front() else {
                break;
            };
            if p.keys.get(&key).is_some_and(|k| k.lsn == lsn) {
                p.keys.remove(&key);
                forgot += 1;
            }
        }
        (forgot, p.reaper.front().map(|r| r.3))
    }

    /// Live request keys remembered now.
    pub fn live_keys(&self) -> usize {
        lock(&self.planner).keys.len()
    }
}

//! A full disk is not a crash (issue 13, item 7). Every log (the WAL, the audit log, each
//! shard) keeps its next segment preallocated ahead of need (`roost_storage::Spare`). When one
//! of them has no spare (the disk had no room for it), intake pauses before the next claim:
//! nothing is planned or written for new batches, their files stay in `new/`, reads and
//! status go on, and a log line says which file needs how many bytes. The serve loop calls
//! [`Room::try_resume`] on its timer; once every spare is made, intake resumes by itself.
//!
//! Before a batch is claimed, [`Room::reserve_room`] makes sure the spares can hold what
//! the batch will write after its claim (its frame on each shard, its audit rows), growing a
//! spare that is smaller (a young log's segments are small and grow with use): a full disk
//! then pauses the batch before its claim, never fails it half-way.
//!
//! What this covers: batches already claimed when the disk filled finish in the segments the
//! spares became (one whole segment of headroom per log). A write or sync error after bytes
//! were written still stops the daemon (fail-stop, no fsync retry), and so does a roll that
//! finds neither a spare nor room, which takes more than a segment of in-flight records.

use roost_storage::{lock, NoRoom};
use roost_wal::format::frame_len;
use roost_wal::WalError;

use super::keys::KeyWindow;
use super::logs::Logs;
use super::pause::{IntakePause, Pause};
use super::records::{self, AuditRecord, OpKind};
use super::shard_set::ShardSet;
use crate::batch::{Batch, BatchOp};
use crate::error::EngineError;
use crate::layout::Layout;

/// Room on disk for new batches: the logs' and shards' spare segments, and the pause they
/// cause, seen together (`Engine::room`).
pub struct Room<'a> {
    /// The WAL and the audit log, each with its spare.
    pub(super) log: &'a Logs,
    /// The key table, with its spare.
    pub(super) keys: &'a KeyWindow,
    /// Each shard's spare, and the room a batch's frame needs on it.
    pub(super) shards: &'a ShardSet,
    /// The pause a missing spare causes, remembered and logged once.
    pub(super) pause: &'a IntakePause,
    /// Where a shard's files are, to name the one that has no room.
    pub(super) layout: &'a Layout,
}

impl Room<'_> {
    /// The first log with no spare segment: which part, and why.
    fn shortage(&self) -> Option<(String, NoRoom)> {
        if let Some(short) = self.log.shortage() {
            return Some(short);
        }
        if let Some(why) = self.keys.spare_missing() {
            return Some(("keys".into(), why));
        }
        self.shards.shortage()
    }

    /// Before planning a new batch: `Paused` (nothing written, nothing latched) while a log
    /// has no spare segment. The first refusal of a pause logs it.
    pub(super) fn gate(&self) -> Result<(), EngineError> {
        match self.shortage() {
            None => Ok(()),
            Some((part, why)) => self.pause.refuse(part, why),
        }
    }

    /// [`Room::gate`] for the WAL alone, between the items of a group: planning an item
    /// may roll the WAL and use its spare (the other logs and the shards roll only after
    /// planning, and `gate` saw them for the whole group).
    pub(super) fn gate_wal(&self) -> Result<(), EngineError> {
        match self.log.wal().spare_missing() {
            None => Ok(()),
            Some(why) => self.pause.refuse("wal".into(), why),
        }
    }

    /// Under the planner lock, after planning and before the claim: each shard's spare holds
    /// the batch's frame for it and the audit log's spare (or its active segment's rest) its
    /// rows, grown now when smaller. `Paused` when the disk has no room (nothing written; the
    /// grown spare counts as missing until made, so intake waits for it).
    pub(super) fn reserve_room(&self, b: &Batch) -> Result<(), EngineError> {
        let mut shards: Vec<&str> = b.ops.iter().map(BatchOp::shard).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut audit_bytes = 0u64;
        for name in shards {
            let ops = b.ops.iter().filter(|op| op.shard() == name);
            let frame = roost_shards::frame::txn_len(ops.clone().map(|op| match op {
                BatchOp::Create { record, .. } => Some(record.len()),
                BatchOp::Delete { .. } => None,
            }));
            let slot = self.shards.slot(name)?;
            if !slot.reserve(frame as u64)? {
                let why = lock(&slot.room).clone().unwrap_or_else(|| NoRoom {
                    path: self.layout.shard(name),
                    needed_bytes: frame as u64,
                    error: "no room for the batch's frame".into(),
                });
                return self.pause.refuse(format!("shard {name}"), why);
            }
            audit_bytes += ops.count() as u64 * audit_row_bytes(&b.request_key, name)?;
        }
        match self.log.audit().reserve(audit_bytes) {
            Ok(()) => Ok(()),
            Err(WalError::NoSpace(why)) => self.pause.refuse("audit".into(), why),
            Err(e) => Err(e.into()),
        }
    }

    /// Why intake is paused, if it is.
    pub fn paused(&self) -> Option<Pause> {
        self.pause.current()
    }

    /// Tries to make every missing spare segment. Ok(true) when intake may go on (logged when
    /// it had been paused); Ok(false) while some log still has no room; Err when making one
    /// failed otherwise (an I/O error: the daemon stops).
    pub fn try_resume(&self) -> Result<bool, EngineError> {
        self.log.refill_spares()?;
        self.keys.refill_spare()?;
        self.shards.refill()?;
        match self.shortage() {
            Some((part, why)) => {
                self.pause.note(&part, &why);
                Ok(false)
            }
            None => {
                self.pause.resumed();
                Ok(true)
            }
        }
    }
}

/// The bytes one audit row of a batch under `request_key` takes in the audit log for an op
/// on `shard` (the frame, header included): the same for every op of a shard.
fn audit_row_bytes(request_key: &str, shard: &str) -> Result<u64, EngineError> {
    let row = AuditRecord {
        claim_lsn: 0,
        request_key: request_key.to_owned(),
        op_index: 0,
        op: OpKind::Create,
        shard: shard.to_owned(),
        id: 0,
    };
    let payload = records::encode("audit row", &row).map_err(EngineError::Encode)?;
    Ok(frame_len(payload.len()) as u64)
}

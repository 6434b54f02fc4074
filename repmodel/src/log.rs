//! `FiniteReplicatedLog.tla` (instantiated as `ReplicaLog` with `logs <- replicaLog`): the
//! operators on one replica's log. Actions that change a log return the new log, or `None`
//! when the TLA+ action's enabling condition is false.

use crate::types::{Config, Log, Record};

impl Log {
    /// `EmptyLog`.
    pub const EMPTY: Log = Log {
        end_offset: 0,
        records: [None; crate::types::MAX_LOG_SIZE],
    };

    /// `IsEmpty(replica)`.
    pub fn is_empty(&self) -> bool {
        self.end_offset == 0
    }

    /// `IsFull(replica)`.
    pub fn is_full(&self, cfg: &Config) -> bool {
        self.end_offset == cfg.log_size
    }

    /// `HasEntry(replica, record, offset)`.
    pub fn has_entry(&self, record: Record, offset: u8) -> bool {
        self.entry_at(offset) == Some(record)
    }

    /// The record `r` such that `HasEntry(replica, r, offset)`, if any: what
    /// `\E record \in LogRecords : HasEntry(replica, record, offset)` ranges over (the records
    /// below `endOffset` are in `LogRecords` whenever `TypeOk` holds).
    pub fn entry_at(&self, offset: u8) -> Option<Record> {
        if offset < self.end_offset {
            self.records.get(usize::from(offset)).copied().flatten()
        } else {
            None
        }
    }

    /// `GetLatestRecord(replica)`; `None` is `Nil`.
    pub fn latest_record(&self) -> Option<Record> {
        match self.end_offset {
            0 => None,
            end => self.entry_at(end - 1),
        }
    }

    /// `IsLatestRecord(replica, record)`.
    pub fn is_latest_record(&self, record: Record) -> bool {
        !self.is_empty() && self.latest_record() == Some(record)
    }

    /// `GetEndOffset(replica)`.
    pub fn end_offset(&self) -> u8 {
        self.end_offset
    }

    /// `HasOffset(replica, offset)`.
    pub fn has_offset(&self, offset: u8) -> bool {
        offset < self.end_offset
    }

    /// `GetAllEntries(replica)`: the `[offset, record]` pairs below `endOffset`.
    pub fn all_entries(&self) -> impl Iterator<Item = (u8, Record)> + '_ {
        (0..self.end_offset).filter_map(|offset| self.entry_at(offset).map(|r| (offset, r)))
    }

    /// `Append(replica, record, offset)`.
    pub fn append(&self, cfg: &Config, record: Record, offset: u8) -> Option<Log> {
        if self.is_full(cfg) || offset != self.end_offset {
            return None;
        }
        let mut log = *self;
        log.records[usize::from(offset)] = Some(record);
        log.end_offset += 1;
        Some(log)
    }

    /// `TruncateTo(replica, newEndOffset)`.
    pub fn truncate_to(&self, new_end_offset: u8) -> Option<Log> {
        if new_end_offset > self.end_offset {
            return None;
        }
        let mut log = *self;
        for (offset, slot) in log.records.iter_mut().enumerate() {
            if offset >= usize::from(new_end_offset) {
                *slot = None;
            }
        }
        log.end_offset = new_end_offset;
        Some(log)
    }

    /// `ReplicateTo(fromReplica, toReplica)`, called on `toReplica`'s log:
    /// `\E offset, record : HasEntry(from, record, offset) /\ Append(to, record, offset)`.
    /// `Append` fixes `offset` to `to`'s end offset, so there is at most one witness.
    pub fn replicate_from(&self, cfg: &Config, from: &Log) -> Option<Log> {
        let offset = self.end_offset;
        let record = from.entry_at(offset)?;
        self.append(cfg, record, offset)
    }
}

//! `roost-wal`: a checksummed, segmented write-ahead log with group commit and torn-tail
//! recovery. The batch pipeline writes each batch's plan and claim here before anything
//! commits, and replays it on restart. This crate does no async and knows nothing of shards,
//! spools or JSON; its I/O goes through `roost_storage`'s seam, and its on-disk format is
//! `docs/wal-format.md`.
#![forbid(unsafe_code)]

mod cursor;
pub mod epochs;
pub mod format;
mod log;
mod open;
mod options;
mod read;
pub mod recovery;
mod replay;
mod roll;
mod truncate;

use std::path::PathBuf;

pub use epochs::LeaderEpochs;
pub use log::{Record, RecoveryReport, SyncedHook, Wal, SEGMENT_NAME_DIGITS, SEGMENT_SUFFIX};
pub use options::{WalOptions, FIRST_SEGMENT_BYTES};
pub use replay::Replay;

/// A log sequence number: 1 for the first record, +1 per record, never reused.
pub type Lsn = u64;

/// Everything the log can fail with. Each variant names where.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("wal {op} failed on {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("wal corrupt in {} at offset {offset} (expected lsn {lsn}): {reason}", segment.display())]
    Corrupt {
        segment: PathBuf,
        offset: u64,
        lsn: Lsn,
        reason: String,
    },
    /// A write or sync failed earlier; the log takes no more appends until reopened.
    #[error("wal refuses appends after an earlier I/O failure: {0}")]
    Poisoned(String),
    #[error("wal opened read-only")]
    ReadOnly,
    #[error("wal payload of {len} bytes over payload_bytes_max {max}")]
    TooLarge { len: u64, max: u32 },
    #[error("wal configuration: {0}")]
    Config(String),
    /// The record asked for is not in the log (retired, or never written).
    #[error("wal: no record {lsn} (retired or never written)")]
    Missing { lsn: Lsn },
    /// A replicated append whose lsn is not the log's next one.
    #[error("wal: record lsn {got} out of order (the log's next lsn is {expected})")]
    OutOfOrder { expected: Lsn, got: Lsn },
    /// An append whose epoch is below the epoch of the log's last record: epochs never go
    /// back in a log (the leader-epoch truncation relies on it).
    #[error("wal: record {lsn} at epoch {epoch} is below the last record's epoch {last}")]
    EpochRegress { lsn: Lsn, epoch: u32, last: u32 },
    /// No room for a new segment: nothing was written, and the log takes appends again once
    /// there is room.
    #[error("wal: {0}")]
    NoSpace(roost_storage::NoRoom),
}

/// A failed step of [`roost_storage::replace_file`], with its op and path.
impl From<roost_storage::ReplaceError> for WalError {
    fn from(e: roost_storage::ReplaceError) -> Self {
        WalError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

impl WalError {
    /// True for damage found on disk (exit code "corruption"), as opposed to I/O failure.
    pub fn is_corruption(&self) -> bool {
        matches!(self, WalError::Corrupt { .. })
    }
}

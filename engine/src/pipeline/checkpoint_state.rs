//! What the engine remembers of checkpoints between them (`checkpoint.rs` takes them). Only
//! the figures; it knows nothing of the engine.

use std::time::Instant;

use roost_wal::Lsn;

use super::records::Checkpoint;

/// What the engine remembers of checkpoints.
#[derive(Debug, Default)]
pub(super) struct CheckpointState {
    /// The last checkpoint written or found at open.
    pub last: Option<Checkpoint>,
    /// The key table holds every key of a batch at or below this lsn.
    pub keys_through: Lsn,
    /// WAL bytes (found at open plus appended since) when the last checkpoint was taken.
    pub wal_bytes_at_last: u64,
    /// WAL bytes recovery found at open: history a restart must not forget to checkpoint
    /// (a daemon killed before each checkpoint was due would otherwise never take one).
    pub found_at_open: u64,
    /// When the last checkpoint was taken (or the engine opened).
    pub taken: Option<Instant>,
    /// The last `at_ms` stamped in the key table (stamps never decrease along it).
    pub last_at_ms: u64,
}

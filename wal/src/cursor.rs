//! [`Cursor`]: where a follower's last ranged read stopped. The log keeps one (a field of
//! [`crate::Wal`]), `read.rs` moves it and truncation and retirement clear it; it is a hint
//! and never read without checking what it points at.

use std::path::PathBuf;
use std::sync::Arc;

use roost_storage::StorageFile;

use crate::Lsn;

/// Where the last read stopped: record `lsn` starts at `offset` of the segment whose first
/// lsn is `first_lsn`. A hint only: cleared by truncation and retirement, and every record
/// read from it is checked (checksum and lsn) all the same.
pub(crate) struct Cursor {
    pub(crate) first_lsn: Lsn,
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn StorageFile>,
    pub(crate) offset: u64,
    pub(crate) lsn: Lsn,
}

//! [`Cursors`]: where the followers' last ranged reads stopped. The log keeps a few (a field
//! of [`crate::Wal`]), `read.rs` moves them and truncation and retirement clear them; each is
//! a hint and never read without checking what it points at.
//!
//! One per reader, not one for all: with two standbys fetching at different lsns, a single
//! cursor was always where the *other* standby stopped, so every fetch walked its segment's
//! headers from the start (issue 42: in a loaded three-node run, 11 % of the leader's
//! worker-thread samples were these reads, more as the segment grew). The set is bounded
//! ([`CURSORS_MAX`]); the cursor used longest ago goes first.

use std::path::PathBuf;
use std::sync::Arc;

use roost_storage::StorageFile;

use crate::Lsn;

/// Cursors kept: a leader's standbys (two in a three-node cluster) and a reader or two
/// beside them (a re-seed, a lagging standby catching up), each continuing where it stopped.
pub(crate) const CURSORS_MAX: usize = 4;

/// Where a read stopped: record `lsn` starts at `offset` of the segment whose first lsn is
/// `first_lsn`. A hint only: cleared by truncation and retirement, and every record read
/// from it is checked (checksum and lsn) all the same.
pub(crate) struct Cursor {
    pub(crate) first_lsn: Lsn,
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn StorageFile>,
    pub(crate) offset: u64,
    pub(crate) lsn: Lsn,
}

/// At most [`CURSORS_MAX`] cursors, the most recently used last.
#[derive(Default)]
pub(crate) struct Cursors(Vec<Cursor>);

impl Cursors {
    /// Takes out the cursor in segment `first_lsn` nearest at or before `lsn`, if any.
    pub(crate) fn take_best(&mut self, first_lsn: Lsn, lsn: Lsn) -> Option<Cursor> {
        let best = self
            .0
            .iter()
            .enumerate()
            .filter(|(_, c)| c.first_lsn == first_lsn && c.lsn <= lsn)
            .max_by_key(|(_, c)| c.lsn)
            .map(|(i, _)| i)?;
        Some(self.0.remove(best))
    }

    /// Keeps `c` as the most recently used, dropping the least recently used beyond
    /// [`CURSORS_MAX`]. Two cursors at one place are both kept: two followers in step (both
    /// caught up) stop at the same place, and each takes one out at its next read.
    pub(crate) fn put(&mut self, c: Cursor) {
        if self.0.len() >= CURSORS_MAX {
            self.0.remove(0);
        }
        self.0.push(c);
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

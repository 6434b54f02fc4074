//! Truncation of the log's end ([`Wal::truncate_from`]): a follower whose records diverged
//! from the leader's removes them (KIP-320) and appends the leader's at the same lsns. This
//! module owns the crash-safe order of that cut and the in-memory state after it, which must
//! be the state a fresh open of the cut log finds. It never touches records below the cut.
//!
//! The order, and why: later segments go first, highest first, each removal made durable by a
//! directory sync, so a power loss leaves the old log with a shorter end, never a segment
//! following a gap (which recovery calls corruption). Then the cut segment is cut at the
//! record's offset, preallocated again (zeros) and fdatasynced, before any new append: the
//! stale records after the cut are gone from the disk, so none of them can sit after a new
//! record or vouch (`Header::vouches_for`) for a position a new record now holds.

use std::sync::Arc;

use roost_storage::OpenMode;
use tracing::info;

use crate::cursor::Cursors;
use crate::format::frame_len;
use crate::log::{read_frame, Active, Inner, Segment, Wal};
use crate::{Lsn, WalError};

/// Where a truncation cuts: segment index, byte offset of the first record removed, and the
/// epoch of the last record kept (0 when none is).
struct Cut {
    index: usize,
    offset: u64,
    last_epoch: u32,
}

impl Wal {
    /// Removes every record with lsn >= `lsn` and returns how many; crash-safe (see the
    /// module's notes), durable before it returns. Afterwards `next_lsn() == lsn`. `lsn ==
    /// next_lsn()` removes nothing; `lsn` beyond the log or below `first_lsn()` (retired) is
    /// `Missing`. Any I/O failure on the way latches the log (`Poisoned`).
    pub fn truncate_from(&self, lsn: Lsn) -> Result<u64, WalError> {
        if self.opts.read_only {
            return Err(WalError::ReadOnly);
        }
        let mut cur = self.lock_cursor();
        let mut g = self.lock();
        // A group commit in flight would raise `synced_lsn` to a target above the cut.
        while g.syncing {
            g = self.synced.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(why) = &g.poisoned {
            return Err(WalError::Poisoned(why.clone()));
        }
        if lsn == g.next_lsn {
            return Ok(0);
        }
        let first = g.segments.first().map_or(g.next_lsn, |s| s.first_lsn);
        if lsn > g.next_lsn || lsn < first {
            return Err(WalError::Missing { lsn });
        }
        cur.clear();
        let cut = self.find_cut(&mut cur, &g, lsn)?;
        cur.clear();
        let removed = g.next_lsn - lsn;
        if let Err(e) = self.cut_at(&mut g, &cut, lsn) {
            g.poisoned.get_or_insert_with(|| e.to_string());
            return Err(e);
        }
        info!(dir = %self.dir.display(), lsn, removed, "wal: truncated");
        Ok(removed)
    }

    /// Finds the segment and offset of record `lsn` (checked: it is read whole) and the
    /// epoch of record `lsn - 1`.
    fn find_cut(&self, cur: &mut Cursors, g: &Inner, lsn: Lsn) -> Result<Cut, WalError> {
        let index = g.segments.partition_point(|s| s.first_lsn <= lsn) - 1;
        let seg = &g.segments[index];
        let max = self.opts.payload_bytes_max;
        let before = index.checked_sub(1).map(|i| &g.segments[i]);
        let (here, last_epoch) = match (lsn > seg.first_lsn, before) {
            (true, _) => {
                let mut prev = self.position(cur, seg, lsn - 1)?;
                let r = read_frame(prev.file.as_ref(), &prev.path, lsn - 1, prev.offset, max)?;
                prev.offset += frame_len(r.payload.len()) as u64;
                (prev, r.epoch)
            }
            (false, Some(before)) => {
                let prev = self.position(cur, before, lsn - 1)?;
                let r = read_frame(prev.file.as_ref(), &prev.path, lsn - 1, prev.offset, max)?;
                (self.position(cur, seg, lsn)?, r.epoch)
            }
            (false, None) => (self.position(cur, seg, lsn)?, 0),
        };
        // The first record removed must be where the walk says: never cut on a guess.
        read_frame(here.file.as_ref(), &here.path, lsn, here.offset, max)?;
        Ok(Cut {
            index,
            offset: here.offset,
            last_epoch,
        })
    }

    /// Removes the segments after the cut one (highest first, each made durable), cuts that
    /// one, and sets the state to what a fresh open would find.
    fn cut_at(&self, g: &mut Inner, cut: &Cut, lsn: Lsn) -> Result<(), WalError> {
        let io = |op: &'static str, path: &std::path::Path| {
            let path = path.to_path_buf();
            move |source| WalError::Io { op, path, source }
        };
        while g.segments.len() > cut.index + 1 {
            if let Some(seg) = g.segments.last() {
                if g.active
                    .as_ref()
                    .is_some_and(|a| a.first_lsn == seg.first_lsn)
                {
                    g.active = None;
                }
                self.storage
                    .remove(&seg.path)
                    .map_err(io("remove", &seg.path))?;
                self.sync_dir()?;
            }
            g.segments.pop();
        }
        let seg: Segment = g.segments[cut.index].clone();
        let file = match g.active.take() {
            Some(a) if a.first_lsn == seg.first_lsn => a.file,
            _ => Arc::from(
                self.storage
                    .open(&seg.path, OpenMode::ReadWrite)
                    .map_err(io("open", &seg.path))?,
            ),
        };
        // The segment keeps its length: cut, then preallocated again to it.
        let len = file.len().map_err(io("length", &seg.path))?;
        file.set_len(cut.offset)
            .map_err(io("truncate", &seg.path))?;
        file.allocate(len).map_err(io("allocate", &seg.path))?;
        file.sync_data().map_err(io("sync", &seg.path))?;
        g.active = Some(Active::new(file, seg.first_lsn, len, cut.offset));
        g.next_lsn = lsn;
        g.written_lsn = lsn - 1;
        g.synced_lsn = g.synced_lsn.min(lsn - 1);
        self.written_moved(g.written_lsn);
        self.synced_moved(g.synced_lsn);
        g.last_epoch = cut.last_epoch;
        Ok(())
    }
}

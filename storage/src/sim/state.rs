//! The simulated disk's state (`SimState`): every file's live and durable images with the
//! writes pending between them (`SimFile`, `PendingWrite`), the faults a test turns on
//! (`SimFaults`), and the rules a sync follows (`split_pending`): shared by the disk
//! (`sim.rs`) and its open files (`handle.rs`).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use super::tree::{count_op, Linked, SimDir};

#[derive(Clone, Debug, Default)]
pub(crate) struct SimFile {
    pub(crate) live: Vec<u8>,
    pub(crate) durable: Vec<u8>,
    /// Writes (offset, bytes) and resizes (offset = len, bytes empty, `resize` true) since the
    /// last sync of this file, in order.
    pub(crate) pending: Vec<PendingWrite>,
    pub(crate) live_linked: bool,
    pub(crate) durable_linked: bool,
    /// After a rename or re-creation over an entry whose new name is not yet durable: the
    /// content a power loss brings back under this path (the old inode's durable bytes).
    pub(crate) prior: Option<Vec<u8>>,
    pub(crate) allocated: u64,
    /// How far written bytes (not merely allocated space) reach in the live image and in the
    /// durable one: what [`crate::StorageFile::data_end`] answers, as a file system answers
    /// from its written extents (zeros written count; a record's trailing zero bytes are
    /// written bytes too).
    pub(crate) live_written: u64,
    pub(crate) durable_written: u64,
    /// Moved or removed with its directory: the directory whose sync settles this entry
    /// (`tree.rs`); its parent's when `None`.
    pub(crate) via: Option<PathBuf>,
}

impl Linked for SimFile {
    fn live(&self) -> bool {
        self.live_linked
    }

    fn unlink(&mut self, via: Option<PathBuf>) {
        self.live_linked = false;
        self.via = via;
    }

    fn move_over(self, dst: &mut SimFile, via: Option<PathBuf>) {
        let prior = if dst.durable_linked {
            Some(dst.durable.clone())
        } else {
            dst.prior.take()
        };
        *dst = SimFile {
            live_linked: true,
            durable_linked: false,
            prior,
            via,
            ..self
        };
    }
}

#[derive(Clone, Debug)]
pub(crate) struct PendingWrite {
    pub(crate) offset: u64,
    pub(crate) bytes: Vec<u8>,
    pub(crate) resize: bool,
}

/// Knobs a crash test turns on a [`SimStorage`].
#[derive(Clone, Debug, Default)]
pub struct SimFaults {
    /// After this many successful `sync_data`/`sync_dir` calls, further syncs report success
    /// but make nothing durable: the power went at that instant.
    pub freeze_after_syncs: Option<u64>,
    /// The n-th write (1-based) fails with EIO.
    pub fail_write_at: Option<u64>,
    /// The n-th sync (1-based) fails with EIO.
    pub fail_sync_at: Option<u64>,
    /// Total bytes `allocate` may reserve across all files; past it, ENOSPC.
    pub space_bytes_max: Option<u64>,
    /// Every file `sync_data` takes this long (outside the disk's lock), as on a real disk:
    /// where syncs cost nothing, concurrent writers rarely overlap and group commit cannot
    /// be seen.
    pub sync_latency: Option<std::time::Duration>,
    /// Every file sync (`sync_data`, a range flush) of a file under this path fails with EIO,
    /// whichever thread makes it: a test aims a failure at one log, not at a count of syncs
    /// that threads running at once may reorder.
    pub fail_syncs_under: Option<PathBuf>,
    /// The process stops after this many changing calls (creations, writes, resizes, syncs,
    /// renames, removals): every later one fails and changes nothing. With
    /// [`SimStorage::op_count`], a schedule crashes at every seam call.
    pub stop_after_ops: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct SimState {
    pub(crate) files: BTreeMap<PathBuf, SimFile>,
    /// Directories made or moved (`tree.rs`); files do not need them.
    pub(crate) dirs: BTreeMap<PathBuf, SimDir>,
    pub(crate) syncs: u64,
    /// Changing calls so far ([`SimFaults::stop_after_ops`]).
    pub(crate) ops: u64,
    /// The power went (a sync past `freeze_after_syncs`): nothing written from now on can
    /// reach the disk, so later writes change the live image only, never the pending ones a
    /// torn power loss may keep.
    pub(crate) frozen: bool,
    /// The files as they were when the power went (the first sync past the limit): what a
    /// client could have read before the cut.
    pub(crate) at_freeze: Option<BTreeMap<PathBuf, SimFile>>,
    pub(crate) writes: u64,
    /// Reads and length lookups of open files (`read_count`).
    pub(crate) reads: u64,
    pub(crate) faults: SimFaults,
}

impl SimState {
    /// One changing call ([`SimFaults::stop_after_ops`]).
    pub(crate) fn count_op(&mut self) -> io::Result<()> {
        count_op(&mut self.ops, self.faults.stop_after_ops)
    }

    /// One sync: fails if it is the one `fail_sync_at` names; `false` once the power went
    /// (`freeze_after_syncs`): it makes nothing durable.
    pub(crate) fn count_sync(&mut self) -> io::Result<bool> {
        let n = self.syncs + 1;
        if self.faults.fail_sync_at == Some(n) {
            self.syncs = n;
            return Err(sim_err(io::ErrorKind::Other, "sync failed (EIO)"));
        }
        self.syncs = n;
        if !self.frozen && self.faults.freeze_after_syncs.is_some_and(|f| n > f) {
            self.frozen = true;
            self.at_freeze = Some(self.files.clone());
        }
        Ok(!self.frozen)
    }
}

pub(crate) fn sim_err(kind: io::ErrorKind, what: &str) -> io::Error {
    io::Error::new(kind, format!("simulated: {what}"))
}

/// How far written bytes reach after `w` lands with `n` of its bytes: a write reaches its
/// end, a resize cuts what lay past it.
pub(crate) fn written_after(written: u64, w: &PendingWrite, n: usize) -> u64 {
    match (w.resize, n) {
        (true, _) => written.min(w.offset),
        (false, 0) => written,
        (false, n) => written.max(w.offset + n as u64),
    }
}

/// Resizes the live image to `len`; the resize is pending (a power loss may or may not keep
/// it) unless the power already went.
pub(crate) fn resize(f: &mut SimFile, len: u64, frozen: bool) {
    let w = PendingWrite {
        offset: len,
        bytes: Vec::new(),
        resize: true,
    };
    apply_write(&mut f.live, &w, 0);
    f.live_written = written_after(f.live_written, &w, 0);
    if !frozen {
        f.pending.push(w);
    }
}

pub(crate) fn apply_write(img: &mut Vec<u8>, w: &PendingWrite, n: usize) {
    if w.resize {
        img.resize(w.offset as usize, 0);
        return;
    }
    let off = w.offset as usize;
    if img.len() < off + n {
        img.resize(off + n, 0);
    }
    img[off..off + n].copy_from_slice(&w.bytes[..n]);
}

/// Splits pending writes at `[from, to)`: the pieces inside (and every resize), and the
/// pieces outside, each list in write order. A write is first cut at every later shrink:
/// a truncate drops the dirty pages past its length, so those bytes can never reach the
/// disk after it, and the resize (taken by any sync) must not be followed by them.
pub(crate) fn split_pending(
    pending: Vec<PendingWrite>,
    from: u64,
    to: u64,
) -> (Vec<PendingWrite>, Vec<PendingWrite>) {
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for w in cut_at_later_shrinks(pending) {
        let end = w.offset + w.bytes.len() as u64;
        if w.resize || (w.offset >= from && end <= to) {
            inside.push(w);
            continue;
        }
        let piece = |a: u64, b: u64| PendingWrite {
            offset: a,
            bytes: w.bytes[(a - w.offset) as usize..(b - w.offset) as usize].to_vec(),
            resize: false,
        };
        let (lo, hi) = (w.offset.max(from), end.min(to));
        if lo < hi {
            inside.push(piece(lo, hi));
        }
        if w.offset < from.min(end) {
            outside.push(piece(w.offset, from.min(end)));
        }
        if to.max(w.offset) < end {
            outside.push(piece(to.max(w.offset), end));
        }
    }
    (inside, outside)
}

/// Each pending write cut to the smallest length a later resize gives the file (a write
/// wholly past it goes); resizes are kept as they are.
pub(crate) fn cut_at_later_shrinks(pending: Vec<PendingWrite>) -> Vec<PendingWrite> {
    let mut limit = u64::MAX;
    let mut kept: Vec<PendingWrite> = Vec::with_capacity(pending.len());
    for mut w in pending.into_iter().rev() {
        if w.resize {
            limit = limit.min(w.offset);
        } else if w.offset >= limit {
            continue;
        } else {
            let room = usize::try_from(limit - w.offset).unwrap_or(usize::MAX);
            w.bytes.truncate(room);
        }
        kept.push(w);
    }
    kept.reverse();
    kept
}

pub(crate) fn file_mut<'a>(st: &'a mut SimState, path: &Path) -> io::Result<&'a mut SimFile> {
    st.files
        .get_mut(path)
        .ok_or_else(|| sim_err(io::ErrorKind::NotFound, "file vanished"))
}

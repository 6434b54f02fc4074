//! Shard compaction: rewriting sealed segments whose dead fraction passed a threshold into one
//! compacted segment that holds only what is still needed (the live records, and the deletes
//! whose create is still on disk in an earlier segment), then swapping it in crash-safely.
//! This module owns the per-segment space accounting ([`Space`]), the compaction state machine
//! ([`Shard::compact_step`]), reading compacted segments back at open, and the open-time
//! cleanup of an interrupted compaction ([`recover`]). It never writes into a mapped segment,
//! never truncates one, and removes a segment file only after it is unmapped.
//! Format and crash steps: docs/shard-format.md, "Compaction".

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use roost_storage::{OpenMode, Storage, StorageFile};
use tracing::{info, warn};

use crate::frame::{
    self, CompactHeader, FrameView, LiveFrame, COMPACT_HEADER_LEN, OP_CREATE, OP_HEADER_LEN,
};
use crate::index::{MemRun, Slot};
use crate::{
    index_frame, map_segment, parse_seg_name, Loc, OpenReport, Seg, SegData, Shard, ShardError,
};

mod steps;

/// Suffix of a compaction's output while it is written: `<seq>.seg.compacting`. Open removes
/// any such file; it is never read.
pub const COMPACT_TMP_SUFFIX: &str = ".seg.compacting";

/// A `FRAME_TYPE_LIVE` frame is written out once it holds this many bytes.
const LIVE_FRAME_BYTES_MAX: usize = 64 << 10;

/// What one call of [`Shard::compact_step`] may do.
#[derive(Clone, Copy, Debug)]
pub struct CompactOptions {
    /// Bytes of old frames read (and at most as many written) in this call. A call always
    /// handles at least one frame, so a budget of 1 still makes progress. Sync and rename steps
    /// take one call each and count nothing.
    pub budget_bytes: u64,
    /// Only segments whose frames all have an lsn at or below this are compacted: the caller's
    /// durable proof (a `done` record, a checkpoint) that those batches are finished, so that
    /// none of them is re-applied with other bytes later.
    pub horizon_lsn: u64,
    /// A sealed segment is rewritten once its dead bytes reach this fraction of its bytes.
    pub dead_fraction_min: f64,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            budget_bytes: 1 << 20,
            horizon_lsn: 0,
            dead_fraction_min: 0.5,
        }
    }
}

/// What a call of [`Shard::compact_step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactProgress {
    /// No segment is worth compacting (nothing was done).
    Idle,
    /// A compaction is under way: call again. `bytes` were read this call.
    Working { bytes: u64 },
    /// A compaction finished in this call: its old segments are gone from the directory.
    Finished { bytes: u64, reclaimed_bytes: u64 },
}

/// Space and compaction figures for status reporting. Counters count since open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionStats {
    pub compactions: u64,
    pub reclaimed_bytes: u64,
    /// Bytes in sealed segments that compaction would drop (exact at open, maintained on apply;
    /// a delete that a compaction made unneeded still counts as needed until the next open).
    pub dead_bytes: u64,
    /// Bytes of frames in all segments (compacted segments: their file length).
    pub used_bytes: u64,
    pub segments: u64,
    pub compacted_segments: u64,
    pub in_progress: bool,
}

/// One segment's space. `live` counts what a compaction keeps: each live create's op bytes, and
/// each delete whose create is in an earlier segment (16 bytes).
#[derive(Clone, Debug, Default)]
pub(crate) struct SegSpace {
    used: u64,
    live: u64,
    /// The last transaction frame's lsn, or a compacted segment's `lsn_hi`.
    max_lsn: u64,
    compacted: Option<CompactHeader>,
    /// A compaction kept records here whose deletes were not vouched for yet (so they count as
    /// dead): not worth compacting again until the horizon reaches this lsn (in memory only).
    blocked_until_lsn: u64,
}

impl SegSpace {
    /// Bytes a compaction would drop; a compacted segment's own header is not dead.
    fn dead(&self) -> u64 {
        let header = if self.compacted.is_some() {
            COMPACT_HEADER_LEN as u64
        } else {
            0
        };
        self.used.saturating_sub(self.live + header)
    }

    fn worth(&self, o: &CompactOptions) -> bool {
        let dead = self.dead();
        dead > 0
            && dead as f64 >= o.dead_fraction_min * self.used as f64
            && o.horizon_lsn >= self.blocked_until_lsn
    }
}

/// Space of every segment, by segment index; grows on demand, so `roll` need not know it.
#[derive(Debug, Default)]
pub(crate) struct Space {
    segs: Vec<SegSpace>,
}

impl Space {
    fn at(&mut self, si: usize) -> &mut SegSpace {
        if self.segs.len() <= si {
            self.segs.resize_with(si + 1, SegSpace::default);
        }
        &mut self.segs[si]
    }

    fn get(&self, si: usize) -> SegSpace {
        self.segs.get(si).cloned().unwrap_or_default()
    }

    pub(crate) fn on_frame(&mut self, si: usize, len: u64, lsn: u64) {
        let s = self.at(si);
        s.used += len;
        s.max_lsn = lsn;
    }

    /// A sealed segment loaded from its index file: its figures as the scan would count them.
    pub(crate) fn set_sealed(
        &mut self,
        si: usize,
        used: u64,
        live: u64,
        max_lsn: u64,
        compacted: Option<CompactHeader>,
    ) {
        *self.at(si) = SegSpace {
            used,
            live,
            max_lsn,
            compacted,
            blocked_until_lsn: 0,
        };
    }

    /// (bytes of frames, bytes a compaction keeps) of segment `si`.
    pub(crate) fn used_live(&self, si: usize) -> (u64, u64) {
        let s = self.get(si);
        (s.used, s.live)
    }

    pub(crate) fn add_live(&mut self, si: usize, bytes: u64) {
        self.at(si).live += bytes;
    }

    pub(crate) fn sub_live(&mut self, si: usize, bytes: u64) {
        let s = self.at(si);
        s.live = s.live.saturating_sub(bytes);
    }

    fn compacted(&self) -> impl Iterator<Item = &CompactHeader> {
        self.segs.iter().filter_map(|s| s.compacted.as_ref())
    }

    pub(crate) fn compacted_holds(&self, lsn: u64) -> bool {
        self.compacted().any(|h| h.lsn_lo <= lsn && lsn <= h.lsn_hi)
    }

    pub(crate) fn compacted_id_max(&self) -> u64 {
        self.compacted().map(|h| h.id_max).max().unwrap_or(0)
    }

    fn compacted_lsn_max(&self) -> u64 {
        self.compacted().map(|h| h.lsn_hi).max().unwrap_or(0)
    }
}

/// The steps of one compaction, in order. A crash anywhere leaves the old segments or the new
/// one authoritative, never both (docs/shard-format.md has the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Read the old frames, write what is needed to the temporary file (budgeted).
    Copy,
    /// Write the header, fdatasync the temporary file.
    Seal,
    /// Unmap the old segments, rename the temporary file over the last of them, fsync the
    /// directory, map the new one.
    Swap,
    /// Remove the other old segments (unmapped), fsync the directory.
    Retire,
}

/// A compaction under way of segments `first..=last` (indices; sealed, so stable while new
/// frames roll on: only this job splices `segs`).
struct Job {
    first: usize,
    last: usize,
    phase: Phase,
    tmp: PathBuf,
    target: PathBuf,
    file: Box<dyn StorageFile>,
    header: CompactHeader,
    /// Next frame to read: segment index and offset.
    cursor: (usize, usize),
    out: LiveFrame,
    /// Bytes after the header written to `file`.
    written: u64,
    /// Where each copied create's record landed in the new file.
    placed: HashMap<u64, u32>,
    kept_deletes: HashSet<u64>,
    /// Ids deleted by a frame in the run: a dead create with its delete here is dropped
    /// (its delete is vouched, and goes with the run).
    deleted_in_run: HashSet<u64>,
    /// The caller's horizon when the job started: a dead record's create is dropped only if
    /// the delete that hides it is in a sealed segment wholly at or below it.
    horizon_lsn: u64,
    /// Paths of the old segments other than `target`, removed in `Retire`.
    retire: Vec<PathBuf>,
    old_bytes: u64,
    new_bytes: u64,
    read_bytes: u64,
}

/// The shard's compaction state.
#[derive(Default)]
pub(crate) struct Compaction {
    pub(crate) space: Space,
    job: Option<Job>,
    /// Set by a failed copy or seal: compaction stays off until reopen (the shard itself is not
    /// poisoned: its segments were never touched).
    failed: Option<String>,
    compactions: u64,
    reclaimed_bytes: u64,
}

impl Compaction {
    /// Forgets the space accounting (a rebuild recounts it). A job never survives a rebuild.
    pub(crate) fn reset(&mut self) {
        self.space = Space::default();
        self.job = None;
    }
}

fn seq_of(path: &Path) -> Option<u64> {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_seg_name)
}

fn io_at(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ShardError {
    let path = path.to_path_buf();
    move |source| ShardError::Io { op, path, source }
}

fn corrupt(seg: &Seg, offset: usize, lsn: u64, reason: String) -> ShardError {
    ShardError::Corrupt {
        segment: seg.path.clone(),
        offset: offset as u64,
        lsn,
        reason,
    }
}

fn file_len(seg: &Seg) -> io::Result<u64> {
    match &seg.data {
        SegData::Mapped(m) => Ok(m.len() as u64),
        SegData::Plain(f) => f.len(),
    }
}

/// The compact header a segment starts with, if it is a compacted one.
pub(crate) fn header_of(
    storage: &dyn Storage,
    seg: &Seg,
) -> Result<Option<CompactHeader>, ShardError> {
    let len = file_len(seg).map_err(io_at("stat", &seg.path))?;
    let n = (len as usize).min(COMPACT_HEADER_LEN);
    let head = seg
        .read_cold(storage, 0, n)
        .map_err(io_at("read", &seg.path))?;
    CompactHeader::decode(&head).map_err(|why| corrupt(seg, 0, 0, why.to_owned()))
}

/// Opens a segment file the way `open_segments` does: mapped through the seam when writable.
fn open_seg(storage: &dyn Storage, path: &Path, read_only: bool) -> Result<Seg, ShardError> {
    let mode = if read_only {
        OpenMode::Read
    } else {
        OpenMode::ReadWrite
    };
    let file = storage.open(path, mode).map_err(io_at("open", path))?;
    let data = if !read_only {
        SegData::Mapped(map_segment(file.as_ref()).map_err(io_at("map", path))?)
    } else {
        SegData::Plain(file)
    };
    Ok(Seg {
        path: path.to_path_buf(),
        data,
    })
}

/// Open-time cleanup of an interrupted compaction, before any frame is read. Temporary files
/// are removed unread (a writable open). A compacted segment `<s>.seg` with `first_seq = f`
/// supersedes every segment with a sequence in `[f, s)`: those are dropped from `segs` and, when
/// writable, removed after the directory is synced (so the compacted name is durable first).
/// The compacted file was synced before it got its name, so it is complete whenever it exists.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    segs: Vec<Seg>,
    read_only: bool,
) -> Result<Vec<Seg>, ShardError> {
    if !read_only {
        remove_temporaries(storage, dir)?;
    }
    let mut superseded: Vec<(u64, u64)> = Vec::new();
    for seg in &segs {
        if let (Some(h), Some(seq)) = (header_of(storage, seg)?, seq_of(&seg.path)) {
            superseded.push((h.first_seq, seq));
        }
    }
    let is_old = |seg: &Seg| {
        seq_of(&seg.path).is_some_and(|q| superseded.iter().any(|(f, s)| *f <= q && q < *s))
    };
    let (old, keep): (Vec<Seg>, Vec<Seg>) = segs.into_iter().partition(is_old);
    if old.is_empty() || read_only {
        return Ok(keep);
    }
    let sync = |op| storage.sync_dir(dir).map_err(io_at(op, dir));
    sync("sync dir before removing compacted segments")?;
    let paths: Vec<PathBuf> = old.iter().map(|s| s.path.clone()).collect();
    drop(old); // unmapped before removal
    for p in &paths {
        warn!(segment = %p.display(), "shard: removing a segment a compaction replaced");
        storage
            .remove(p)
            .map_err(io_at("remove compacted segment", p))?;
    }
    sync("sync dir after removing compacted segments")?;
    Ok(keep)
}

fn remove_temporaries(storage: &dyn Storage, dir: &Path) -> Result<(), ShardError> {
    let names = storage.list(dir).map_err(io_at("list", dir))?;
    for name in names.iter().filter(|n| n.ends_with(COMPACT_TMP_SUFFIX)) {
        let p = dir.join(name);
        warn!(file = %p.display(), "shard: removing an unfinished compaction's output");
        storage
            .remove(&p)
            .map_err(io_at("remove compaction temporary", &p))?;
    }
    Ok(())
}

//! `roost-shards`: a shard is a single-writer store of records (id -> the client's JSON bytes)
//! in preallocated, memory-mapped segment files under `<data-dir>/shards/<name>/`. Each batch's
//! ops on a shard are one checksummed frame (`frame.rs`), so a shard transaction is atomic: a
//! torn frame is dropped on open. This crate knows nothing of the WAL's records, of JSON or of
//! async; the daemon decides when to [`Shard::flush`]. Format: `docs/shard-format.md`.
#![deny(unsafe_code)]

mod compact;
pub mod frame;
mod index;
#[allow(unsafe_code)]
mod mmap;
mod open;
use open::index_frame;
mod runs;
use runs::RunFrame;
mod seal;
mod segment;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use roost_storage::{
    preallocate, zeros_due, DirLock, NoRoom, OpenMode, RealStorage, Refilled, Spare, Storage,
};
use tracing::{debug, info, warn};

pub use compact::{CompactOptions, CompactProgress, CompactionStats, COMPACT_TMP_SUFFIX};
pub use frame::{Txn, TxnOp};
use frame::{OP_CREATE, OP_HEADER_LEN};
use index::{Index, Loc, DEAD};
use segment::{
    create_and_lock, map_segment, open_segments, parse_seg_name, scan_frames, seg_name, Seg,
    SegData,
};

pub const SEGMENT_SUFFIX: &str = ".seg";
/// The default [`ShardOptions::first_segment_bytes`]: a new shard's first segment and its
/// spare take 64 KiB each.
pub const FIRST_SEGMENT_BYTES: u64 = 64 << 10;
pub use roost_storage::LOCK_FILE;
/// Record reads through the maps (`get`, and recovery's check of a held frame) after which a
/// shard lets go of every segment's resident pages ([`Shard::release_pages`]). A read of a
/// small record maps at most the kernel's fault-around (16 pages, 64 KiB by default), so what
/// reads keep resident stays near 16 MiB a shard (issue 44).
pub const RELEASE_PAGES_AFTER_READS: u32 = 256;

/// Tunables of one shard.
#[derive(Clone, Debug)]
pub struct ShardOptions {
    /// Segments are preallocated to at most this size; a frame that does not fit rolls to a
    /// new one.
    pub segment_bytes: u64,
    /// A new shard's first segment (and its spare) is preallocated to this size, and each
    /// next segment to twice the last one's, up to `segment_bytes` (and at least the frame
    /// that rolls to it): a shard that holds little takes little disk. Each segment is used
    /// up to its own length, so segments of any size, older ones of a full `segment_bytes`
    /// among them, open and mix.
    pub first_segment_bytes: u64,
    /// Open with plain reads, repair nothing, write nothing, take no lock (for `roost get`
    /// while the daemon runs, and `roost verify`).
    pub read_only: bool,
    /// Every frame with an lsn up to this one is known flushed (the caller holds durable
    /// proof, such as a `done` record written only after the flush), and every later frame
    /// can be rebuilt by the caller. Frames past it were never flushed, so a power loss may
    /// have kept some of their pages and not others (the kernel writes a mapping's dirty pages
    /// back in no promised order): once every frame up to this lsn has been read, damage in the
    /// last segment is a torn tail even when valid frames follow it, and all of it is dropped.
    /// `None` (the default): any damage followed by a valid frame is corruption.
    pub synced_through_lsn: Option<u64>,
    /// Zeros written ahead of the last segment's end, this many bytes at a time (0: none),
    /// and flushed with the next frames: the first write into `posix_fallocate`d space
    /// converts its extents, a metadata change each flush must commit (a journal commit on
    /// ext4), so writing the space ahead once lets the next flushes write data only. Zeros
    /// are what the space reads as anyway. The WAL does the same (`zero_ahead_bytes` there).
    pub zero_ahead_bytes: u64,
    /// Open sealed segments from their index files (issue 44; `docs/shard-format.md`, "The
    /// index") instead of scanning their frames. `roost verify` turns it off to read every
    /// frame. A read-only open uses the files it finds and writes none.
    pub index_files: bool,
    /// The segment being written rolls once its index run in memory holds this many
    /// entries (creates, frames and deletes; 0: no limit), as Kafka rolls a log segment whose
    /// offset index is full: it bounds that run's memory (about 20 B an entry) and the scan an
    /// open makes of the last segment, whatever the records' size. A segment rolled before it
    /// is full gives back the space it did not use (as every rolled segment does:
    /// `Shard::trim_rolled`).
    pub index_entries_max: usize,
}

/// The default [`ShardOptions::index_entries_max`]: about 2.5 MiB of index in memory per
/// open shard, and an open's scan of at most that many entries.
pub const INDEX_ENTRIES_MAX: usize = 128 << 10;

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            segment_bytes: 16 << 20,
            first_segment_bytes: FIRST_SEGMENT_BYTES,
            read_only: false,
            synced_through_lsn: None,
            zero_ahead_bytes: 1 << 20,
            index_files: true,
            index_entries_max: INDEX_ENTRIES_MAX,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("shard {op} failed on {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("shard corrupt in {} at offset {offset} (after lsn {lsn}): {reason}", segment.display())]
    Corrupt {
        segment: PathBuf,
        offset: u64,
        lsn: u64,
        reason: String,
    },
    #[error("shard directory {} is locked by another process", path.display())]
    Locked { path: PathBuf },
    #[error("shard refuses writes after an earlier I/O failure: {0}")]
    Poisoned(String),
    #[error("shard transaction of {len} bytes does not fit a segment of {max} bytes")]
    TxnTooLarge { len: u64, max: u64 },
    #[error("shard transaction lsn {lsn} arrives after lsn {max_lsn} and is not held")]
    OutOfOrder { lsn: u64, max_lsn: u64 },
    #[error("shard holds a different transaction at lsn {lsn} ({} at offset {offset}) than the one applied again", segment.display())]
    HeldDiffers {
        segment: PathBuf,
        offset: u64,
        lsn: u64,
    },
    #[error("shard already holds id {id} (transaction lsn {lsn})")]
    DuplicateId { id: u64, lsn: u64 },
    #[error("shard opened read-only")]
    ReadOnly,
}

impl ShardError {
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            ShardError::Corrupt { .. } | ShardError::HeldDiffers { .. }
        )
    }
}

/// What `apply` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Written,
    /// The shard already holds this lsn: nothing changed (idempotent re-apply).
    AlreadyHeld,
}

/// What open (or truncate) found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    pub segments: u64,
    pub frames: u64,
    pub records: u64,
    pub deletes: u64,
    pub torn_bytes_dropped: u64,
    pub max_lsn: u64,
}

/// The ops of one held frame, for `roost verify`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameSummary {
    pub lsn: u64,
    pub creates: Vec<u64>,
    pub deletes: Vec<u64>,
}

/// A single-writer record store. Every write takes `&mut self`; one owner per shard.
pub struct Shard {
    name: String,
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    opts: ShardOptions,
    segs: Vec<Seg>,
    /// Bytes used in the last segment.
    write_offset: usize,
    index: Index,
    max_lsn: u64,
    /// Largest id any create in any held frame used (deleted or not): ids are never reused.
    max_id: u64,
    /// Start of the range of the last segment written since the last flush.
    dirty_from: Option<usize>,
    /// End of the zeros written ahead in the last segment (`zero_ahead`); the next flush
    /// covers them too. Below `write_offset` when nothing past the end is zeroed.
    zeroed_to: usize,
    poisoned: Option<String>,
    /// The next segment, preallocated ahead of need (writable shards only).
    spare: Option<Spare>,
    /// Held for the shard's lifetime when writable on a real disk.
    _lock: Option<DirLock>,
    report: OpenReport,
    /// Record reads since the segments' pages were last released.
    reads_since_release: AtomicU32,
    /// Per-segment live and dead bytes, compacted segments' ranges, and the compaction under
    /// way (`compact.rs`).
    compaction: compact::Compaction,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Shard {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    /// Highest transaction lsn held (0 when empty). The shard holds exactly the lsns of its
    /// frames and of its compacted ranges; they arrive in increasing order.
    pub fn max_lsn(&self) -> u64 {
        self.max_lsn
    }

    /// Whether `lsn` is held: a frame for it is, or it lies in a compacted segment's lsn range
    /// ("held, compacted": every transaction for this shard up to the range's end was applied
    /// and flushed before its frames were compacted away; docs/shard-format.md).
    pub fn holds(&self, lsn: u64) -> Result<bool, ShardError> {
        if self.compaction.space.compacted_holds(lsn) {
            return Ok(true);
        }
        let f = self
            .index
            .frame(lsn)
            .map_err(self.index_err("read index"))?;
        Ok(f.is_some())
    }

    /// Every lsn held as a frame, in order (lsns held compacted: [`Shard::compacted_ranges`]).
    pub fn held_lsns(&self) -> Result<Vec<u64>, ShardError> {
        let frames = self.index.frames().map_err(self.index_err("read index"))?;
        Ok(frames.into_iter().map(|(_, f)| f.lsn).collect())
    }

    /// Largest id ever created here, deleted or not.
    pub fn max_id(&self) -> u64 {
        self.max_id
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    pub fn contains(&self, id: u64) -> Result<bool, ShardError> {
        let loc = self.index.get(id).map_err(self.index_err("read index"))?;
        Ok(loc.is_some())
    }

    /// Entries the in-memory index has room for (for the memory benchmark).
    pub fn index_capacity(&self) -> usize {
        self.index.capacity()
    }

    /// Bytes the index holds in memory (the runs of segments not sealed yet, and each sealed
    /// segment's page directory and dead bits), for `status.memory`.
    pub fn index_bytes(&self) -> usize {
        self.index.bytes()
    }

    fn io_err(&self, op: &'static str, seg: usize) -> impl FnOnce(io::Error) -> ShardError + '_ {
        move |source| ShardError::Io {
            op,
            path: self
                .segs
                .get(seg)
                .map_or_else(|| self.dir.clone(), |s| s.path.clone()),
            source,
        }
    }

    pub fn get(&self, id: u64) -> Result<Option<Vec<u8>>, ShardError> {
        let Some(loc) = self.index.get(id).map_err(self.index_err("read index"))? else {
            return Ok(None);
        };
        // A positioned read, not the map: a random read of a cold page through a map faults
        // in the device's whole read-ahead window around it (8 MiB on the test machine: a
        // p99 of 5-8 ms at 100M records, against 0.2 ms this way; issue 44).
        let si = loc.seg as usize;
        let (offset, len) = (loc.offset as usize, loc.len as usize);
        let rec = self.segs[si]
            .read_cold(self.storage.as_ref(), offset, len)
            .map_err(self.io_err("read", si))?;
        Ok(Some(rec))
    }

    fn read_record(&self, loc: Loc) -> Result<Vec<u8>, ShardError> {
        let seg = &self.segs[loc.seg as usize];
        seg.read(loc.offset as usize, loc.len as usize)
            .map_err(self.io_err("read", loc.seg as usize))
    }

    /// One more read through the maps: the one that reaches [`RELEASE_PAGES_AFTER_READS`]
    /// lets go of every segment's pages.
    fn count_read(&self) {
        let n = self.reads_since_release.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= RELEASE_PAGES_AFTER_READS {
            self.release_pages();
        }
    }

    /// Lets go of every segment's resident pages (`madvise(MADV_DONTNEED)` of the maps): what
    /// open's scan, a `scan`, `verify` or many reads touched stops counting in the process's
    /// resident set; the next read maps the page again. Advisory: a refusal is logged.
    pub fn release_pages(&self) {
        self.reads_since_release.store(0, Ordering::Relaxed);
        for seg in &self.segs {
            if let Err(e) = seg.release_pages() {
                warn!(shard = %self.name, segment = %seg.path.display(), error = %e,
                    "shard: releasing resident pages failed");
            }
        }
    }

    /// Every live record in id order.
    pub fn scan(&self) -> Result<Vec<(u64, Vec<u8>)>, ShardError> {
        let mut locs = Vec::with_capacity(self.index.len());
        self.index
            .for_each_live(|id, loc| {
                locs.push((id, loc));
                Ok(())
            })
            .map_err(self.index_err("read index"))?;
        // Runs are in segment order; ids are increasing across them only when minted so.
        locs.sort_unstable_by_key(|(id, _)| *id);
        let mut out = Vec::with_capacity(locs.len());
        for (id, loc) in locs {
            out.push((id, self.read_record(loc)?));
        }
        // Once at the end, not every few reads: a release walks every segment.
        self.release_pages();
        Ok(out)
    }

    /// The ops of every held frame (for `roost verify`).
    pub fn frame_summaries(&self) -> Result<Vec<FrameSummary>, ShardError> {
        let frames = self.index.frames().map_err(self.index_err("read index"))?;
        let mut out = Vec::with_capacity(frames.len());
        for (si, f) in frames {
            let bytes = self.segs[si]
                .read(f.offset as usize, f.len as usize)
                .map_err(self.io_err("read", si))?;
            let (_, view) = frame::probe(&bytes);
            let view = view.map_err(|why| ShardError::Corrupt {
                segment: self.segs[si].path.clone(),
                offset: f.offset as u64,
                lsn: f.lsn,
                reason: format!("frame changed since open: {why}"),
            })?;
            let (c, d): (Vec<&frame::OpRef>, Vec<&frame::OpRef>) =
                view.ops.iter().partition(|o| o.kind == OP_CREATE);
            out.push(FrameSummary {
                lsn: f.lsn,
                creates: c.iter().map(|o| o.id).collect(),
                deletes: d.iter().map(|o| o.id).collect(),
            });
        }
        self.release_pages();
        Ok(out)
    }

    fn check_writable(&self) -> Result<(), ShardError> {
        if self.opts.read_only {
            return Err(ShardError::ReadOnly);
        }
        if let Some(why) = &self.poisoned {
            return Err(ShardError::Poisoned(why.clone()));
        }
        Ok(())
    }

    /// Applies a transaction as one frame. Not durable until [`Shard::flush`]. Re-applying a
    /// held lsn changes nothing.
    pub fn apply(&mut self, txn: &Txn) -> Result<Applied, ShardError> {
        self.check_writable()?;
        if txn.lsn <= self.max_lsn {
            return if self.holds(txn.lsn)? {
                self.check_held(txn).map(|()| Applied::AlreadyHeld)
            } else {
                Err(ShardError::OutOfOrder {
                    lsn: txn.lsn,
                    max_lsn: self.max_lsn,
                })
            };
        }
        self.check_new_ids(txn)?;
        let bytes = frame::encode(txn);
        let len = bytes.len() as u64;
        if len > self.opts.segment_bytes || len > u32::MAX as u64 {
            return Err(ShardError::TxnTooLarge {
                len,
                max: self.opts.segment_bytes,
            });
        }
        // A segment is used up to its own length: one made under another `segment_bytes`
        // (the configuration changed between runs) is mapped at the length it has.
        let fits = self.segs.last().is_some_and(|seg| {
            let room = self.opts.segment_bytes.min(seg.len() as u64);
            self.write_offset as u64 + len <= room
        });
        if !fits || self.run_full() {
            self.roll(len)?;
        }
        let si = self.segs.len() - 1;
        let at = self.write_offset;
        self.zero_ahead(si, at + bytes.len())?;
        if let Err(e) = self.segs[si].write(at, &bytes) {
            let e = self.io_err("write", si)(e);
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        let (_, view) = frame::probe(&bytes);
        let view = view.map_err(|why| ShardError::Corrupt {
            segment: self.segs[si].path.clone(),
            offset: at as u64,
            lsn: txn.lsn,
            reason: format!("frame just encoded does not verify: {why}"),
        })?;
        let space = &mut self.compaction.space;
        space.on_frame(si, len, txn.lsn);
        let indexed = index_frame(&mut self.index, &mut self.max_id, space, si, at, &view);
        if let Err(e) = indexed {
            // The frame is written and the index half-changed: refuse further writes.
            let e = self.index_err("read index")(e);
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        let (offset, len) = (at as u32, len as u32);
        self.index.push_frame(
            si,
            RunFrame {
                lsn: txn.lsn,
                offset,
                len,
            },
        );
        self.max_lsn = txn.lsn;
        self.write_offset = at + bytes.len();
        // Zeros written ahead may have set it past `at`.
        self.dirty_from = Some(self.dirty_from.map_or(at, |d| d.min(at)));
        Ok(Applied::Written)
    }

    /// Every id `txn` creates must never have been used here (live, dead, or compacted away).
    fn check_new_ids(&self, txn: &Txn) -> Result<(), ShardError> {
        for op in &txn.ops {
            if let TxnOp::Create { id, .. } = op {
                let live = self.index.get(*id).map_err(self.index_err("read index"))?;
                if live.is_some() || *id <= self.max_id && self.id_was_used(*id) {
                    return Err(ShardError::DuplicateId {
                        id: *id,
                        lsn: txn.lsn,
                    });
                }
            }
        }
        Ok(())
    }

    /// Before a frame ending at `end` is written: once `end` comes within half of
    /// `zero_ahead_bytes` of the zeroed mark, writes zeros from there (never before `end`) to
    /// `zero_ahead_bytes` past `end`, within the segment (see
    /// [`ShardOptions::zero_ahead_bytes`]); the next flush makes them durable with the
    /// frames. A failure poisons the shard, as any write failure.
    fn zero_ahead(&mut self, si: usize, end: usize) -> Result<(), ShardError> {
        // The segment as mapped (an older one may be shorter than `segment_bytes` now).
        let len = self.opts.segment_bytes.min(self.segs[si].len() as u64);
        let ahead = self.opts.zero_ahead_bytes;
        let Some((from, to)) = zeros_due(self.zeroed_to as u64, end as u64, ahead, len) else {
            return Ok(());
        };
        let (from, to) = (from as usize, to as usize);
        if let Err(e) = self.segs[si].zero(from, to) {
            let e = self.io_err("write zeros ahead", si)(e);
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        self.zeroed_to = to;
        self.dirty_from = Some(self.dirty_from.map_or(from, |d| d.min(from)));
        Ok(())
    }

    /// A re-apply of a held lsn (recovery finishing a batch again) must carry exactly the
    /// frame the shard holds. Anything else means the WAL and the shard disagree about that
    /// lsn (say, a power loss took a claim from the WAL while the shard kept its frame, and the
    /// lsn was handed out again): refuse loudly rather than answer a batch whose ops were
    /// never applied.
    fn check_held(&self, txn: &Txn) -> Result<(), ShardError> {
        let found = self
            .index
            .frame(txn.lsn)
            .map_err(self.index_err("read index"))?;
        let Some((si, m)) = found else {
            return Ok(());
        };
        let stored = self.segs[si]
            .read(m.offset as usize, m.len as usize)
            .map_err(self.io_err("read", si))?;
        self.count_read();
        if stored == frame::encode(txn) {
            return Ok(());
        }
        Err(ShardError::HeldDiffers {
            segment: self.segs[si].path.clone(),
            offset: m.offset as u64,
            lsn: txn.lsn,
        })
    }

    /// Makes the segments' names in the shard's directory durable.
    fn sync_dir(&self) -> Result<(), ShardError> {
        self.storage
            .sync_dir(&self.dir)
            .map_err(|source| ShardError::Io {
                op: "sync dir",
                path: self.dir.clone(),
                source,
            })
    }

    /// An id at or below `max_id` that is not live might have been deleted; ids whose create
    /// is still on disk (dead in the index) or that the frames show were created count as used,
    /// and so does every id up to a compacted segment's `id_max`: its creates are gone, and
    /// ids are minted increasing, so no fresh create is ever that low. Rare path: linear in
    /// frames.
    fn id_was_used(&self, id: u64) -> bool {
        let entry = self.index.entry(id);
        if !matches!(entry, Ok(None)) || id <= self.compaction.space.compacted_id_max() {
            return true;
        }
        self.frame_summaries()
            .map(|fs| fs.iter().any(|f| f.creates.contains(&id)))
            .unwrap_or(true)
    }

    /// Whether frames (or zeros ahead of them) were written since the last [`Shard::flush`]:
    /// until it runs, they are not durable. An owner closes an idle shard only when this is
    /// false, so a reopen may vouch for every frame it held.
    pub fn unflushed(&self) -> bool {
        self.dirty_from.is_some()
    }

    /// Makes everything applied so far durable: `msync(MS_SYNC)` through the seam of the
    /// range written since the last flush (frames and zeros ahead), and of nothing else. A
    /// failure poisons the shard (never retried).
    pub fn flush(&mut self) -> Result<(), ShardError> {
        self.check_writable()?;
        let Some(from) = self.dirty_from else {
            return Ok(());
        };
        let si = self.segs.len() - 1;
        let len = self.write_offset.max(self.zeroed_to) - from;
        if let Err(e) = self.segs[si].flush(from, len) {
            let e = self.io_err("flush", si)(e);
            warn!(shard = %self.name, error = %e, "shard: flush failed, shard poisoned");
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        self.dirty_from = None;
        Ok(())
    }

    /// Seals the last segment (flushed) and takes the spare as the next one (or creates,
    /// preallocates and syncs it, then the directory, when there is no spare), maps it, and
    /// makes the next spare. ENOSPC for the new segment is an error that leaves the shard as
    /// it was (readable, and writable once space returns); no room for the next spare only
    /// shows in [`Shard::spare_missing`].
    /// The new segment is [`Shard::next_segment_bytes`] long (at least `frame_len`); a spare
    /// made smaller is allocated further first, and the next spare is made at the size of
    /// the segment after this one. The segment is mapped at its file's length (a spare left
    /// by an older binary may be larger).
    fn roll(&mut self, frame_len: u64) -> Result<(), ShardError> {
        self.flush()?;
        let used = self.write_offset;
        let seq = self.next_seq();
        let path = self.dir.join(seg_name(seq));
        let io = |op: &'static str| {
            let path = path.clone();
            move |source| ShardError::Io { op, path, source }
        };
        let bytes = self.next_segment_bytes(frame_len);
        let storage = self.storage.as_ref();
        // The spare is taken whenever the frame fits it; only a frame larger than the spare
        // makes a segment of its own here (the spare stays for the next roll).
        let took = match self.spare.as_mut() {
            Some(spare) => spare
                .take(storage, &path, frame_len)
                .map_err(io("take spare"))?,
            None => false,
        };
        if !took {
            preallocate(storage, &path, bytes, false).map_err(io("allocate"))?;
            self.sync_dir()?;
        }
        let file = self
            .storage
            .open(&path, OpenMode::ReadWrite)
            .map_err(io("open"))?;
        let data = SegData::Mapped(map_segment(file.as_ref()).map_err(io("map"))?);
        debug!(shard = %self.name, segment = %path.display(), bytes, "shard: rolled to new segment");
        self.segs.push(Seg {
            path: path.clone(),
            data,
        });
        self.index.ensure(self.segs.len() - 1, seq);
        self.write_offset = 0;
        self.zeroed_to = 0;
        let next = self.next_segment_bytes(0);
        if let Some(spare) = self.spare.as_mut() {
            spare.grow(storage, next).map_err(io("grow spare"))?;
        }
        self.refill_spare()?;
        if let Some(rolled) = self.segs.len().checked_sub(2) {
            self.trim_rolled(rolled, used);
        }
        self.seal_runs()
    }

    /// The size of the segment after the last one: `first_segment_bytes` for a shard
    /// without segments, else twice the last segment's length, never more than
    /// `segment_bytes`, and at least `frame_len` (which `apply` keeps within
    /// `segment_bytes`). Rounded up to 4 KiB pages below `segment_bytes`.
    fn next_segment_bytes(&self, frame_len: u64) -> u64 {
        let max = self.opts.segment_bytes;
        let first = self.opts.first_segment_bytes.clamp(1, max);
        let doubled = self
            .segs
            .last()
            .map_or(first, |s| (s.len() as u64).saturating_mul(2));
        doubled
            .max(first)
            .max(frame_len)
            .next_multiple_of(4096)
            .min(max)
    }

    /// The bytes the spare segment holds now (0: none, or read-only): the largest frame a
    /// roll can put in it without making a segment.
    pub fn spare_have(&self) -> u64 {
        self.spare.as_ref().map_or(0, Spare::have)
    }

    /// Makes sure a frame of `frame_len` bytes needs no new space: it fits the last
    /// segment's rest, or the spare is grown now to hold it (and keeps that size). Ok(false)
    /// when the disk has no room (nothing written; the spare counts as missing, so the
    /// daemon's intake pauses, until a refill makes it). Called before the batch is claimed,
    /// where a full disk can still pause it; a frame over `segment_bytes` is left to `apply`
    /// to refuse.
    pub fn reserve(&mut self, frame_len: u64) -> Result<bool, ShardError> {
        self.check_writable()?;
        let room = match self.segs.last() {
            // A full run rolls at the next frame, whatever room the segment has left.
            Some(_) if self.run_full() => 0,
            Some(seg) => {
                let room = self.opts.segment_bytes.min(seg.len() as u64);
                room.saturating_sub(self.write_offset as u64)
            }
            None => 0,
        };
        if frame_len <= room || frame_len > self.opts.segment_bytes {
            return Ok(true);
        }
        let want = frame_len
            .next_multiple_of(4096)
            .min(self.opts.segment_bytes);
        let Some(spare) = self.spare.as_mut() else {
            return Ok(true);
        };
        spare
            .grow(self.storage.as_ref(), want)
            .map_err(|source| ShardError::Io {
                op: "grow spare segment",
                path: self.dir.join(roost_storage::SPARE_FILE),
                source,
            })?;
        self.refill_spare()?;
        Ok(self.spare_have() >= frame_len)
    }

    /// Why the shard has no spare segment (its next roll needs room the disk may not have):
    /// `None` when it has one, or is read-only.
    pub fn spare_missing(&self) -> Option<NoRoom> {
        self.spare.as_ref()?.missing().cloned()
    }

    /// Makes a missing spare segment. Ok(true) once there is one; a full disk is logged and
    /// is Ok(false); any other failure is an error.
    pub fn refill_spare(&mut self) -> Result<bool, ShardError> {
        let Some(spare) = self.spare.as_mut() else {
            return Ok(true);
        };
        let r = spare
            .refill(self.storage.as_ref())
            .map_err(|source| ShardError::Io {
                op: "make spare segment",
                path: self.dir.join(roost_storage::SPARE_FILE),
                source,
            })?;
        if let (Refilled::NoRoom { first: true }, Some(why)) = (r, spare.missing()) {
            warn!(shard = %self.name, %why, "shard: no room for the spare segment");
        }
        Ok(r == Refilled::Ready)
    }

    /// Drops every frame with lsn >= `lsn` (replication's truncate-by-epoch will use it) and
    /// rebuilds the index. Frames are zeroed in place and later segments removed after they
    /// are unmapped; nothing mapped is ever truncated. Returns how many frames were dropped.
    pub fn truncate_from(&mut self, lsn: u64) -> Result<usize, ShardError> {
        self.check_writable()?;
        self.before_truncate(lsn)?;
        // What was applied and not yet flushed, first: the rebuild below forgets the dirty
        // range, and the zeros' own msync covers only their range of a mapped segment, so the
        // kept frames before them would stay unsynced while `flush` answered Ok. (The
        // simulated disk's range flush keeps them unsynced too, so the sim tests see it.)
        self.flush()?;
        let found = self.index.first_frame_from(lsn);
        let Some((si, first, end, dropped)) = found.map_err(self.index_err("read index"))? else {
            return Ok(0);
        };
        // Their index files first (and the dead file, when a sealed segment is cut): a crash
        // from here on scans what changes.
        let sealed = (si..self.segs.len()).any(|i| self.index.is_sealed(i));
        self.unseal(si..self.segs.len(), sealed || si + 1 < self.segs.len())?;
        let (start, end) = (first.offset as usize, end as usize);
        let zeros = vec![0u8; end - start];
        let r = self.segs[si]
            .write(start, &zeros)
            .and_then(|()| self.segs[si].flush(start, end - start));
        if let Err(e) = r {
            let e = self.io_err("truncate", si)(e);
            self.poisoned = Some(e.to_string());
            return Err(e);
        }
        // Newest first, so a crash midway leaves a prefix of segments.
        while self.segs.len() > si + 1 {
            if let Some(seg) = self.segs.pop() {
                let path = seg.path.clone();
                drop(seg); // unmap before removing
                self.storage
                    .remove(&path)
                    .map_err(|source| ShardError::Io {
                        op: "remove",
                        path,
                        source,
                    })?;
            }
        }
        self.sync_dir()?;
        self.rebuild()?;
        info!(shard = %self.name, lsn, dropped, "shard: truncated");
        Ok(dropped as usize)
    }
}

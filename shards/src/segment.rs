//! A shard's segment files: `Seg` (mapped through the seam when writable, positioned I/O
//! when read-only), their names, the scan of one segment's frames with the decision table
//! (`scan_frames`), and opening or creating a shard's directory and segments.
//! `docs/shard-format.md`.

use std::borrow::Cow;
use std::io;
use std::path::{Path, PathBuf};

use roost_storage::recovery::{decide, valid_record_follows, Action, Observation, Seen};
use roost_storage::{read_all, read_data, DirLock, LockError, OpenMode, Storage, StorageFile};

use crate::frame::{self, FRAME_ALIGN};
use crate::mmap::MappedSegment;
use crate::{ShardError, SEGMENT_SUFFIX};

/// A writable shard maps each segment through the seam (the real disk and the simulator
/// alike); a read-only one reads it with positioned I/O and never maps it.
pub(crate) enum SegData {
    Mapped(MappedSegment),
    Plain(Box<dyn StorageFile>),
}

pub(crate) struct Seg {
    pub(crate) path: PathBuf,
    pub(crate) data: SegData,
}

/// A read-only shard's segment refuses writes (the shard checks first; this is the backstop).
pub(crate) fn plain_is_read_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "segment opened read-only: writes and flushes go through a mapped segment",
    )
}

impl Seg {
    pub(crate) fn bytes(&self) -> io::Result<Cow<'_, [u8]>> {
        match &self.data {
            SegData::Mapped(m) => m.bytes(),
            SegData::Plain(f) => Ok(Cow::Owned(read_all(f.as_ref())?)),
        }
    }
    pub(crate) fn read(&self, offset: usize, len: usize) -> io::Result<Vec<u8>> {
        match &self.data {
            SegData::Mapped(m) => m.read(offset, len),
            SegData::Plain(f) => {
                let mut buf = vec![0u8; len];
                f.read_at(&mut buf, offset as u64)?;
                Ok(buf)
            }
        }
    }
    pub(crate) fn write(&mut self, offset: usize, bytes: &[u8]) -> io::Result<()> {
        match &mut self.data {
            SegData::Mapped(m) => m.write_at(offset, bytes),
            SegData::Plain(_) => Err(plain_is_read_only()),
        }
    }
    pub(crate) fn zero(&mut self, from: usize, to: usize) -> io::Result<()> {
        match &mut self.data {
            SegData::Mapped(m) => m.zero(from, to.saturating_sub(from)),
            SegData::Plain(_) => Err(plain_is_read_only()),
        }
    }
    /// A small read that bypasses the map: a positioned read of the file. An open reads the
    /// header and the last frame of every sealed segment this way: through the map each such
    /// read of a cold page is a fault that reads ahead around it (128 KiB and more), which
    /// made an open of 381 segments read about 100 MB (issue 44).
    pub(crate) fn read_cold(
        &self,
        storage: &dyn roost_storage::Storage,
        offset: usize,
        len: usize,
    ) -> io::Result<Vec<u8>> {
        match &self.data {
            SegData::Mapped(_) => {
                let file = storage.open(&self.path, OpenMode::Read)?;
                let mut buf = vec![0u8; len];
                file.read_at(&mut buf, offset as u64)?;
                Ok(buf)
            }
            SegData::Plain(_) => self.read(offset, len),
        }
    }

    /// The segment's bytes up to its data end, what a scan of its frames needs: past
    /// [`StorageFile::data_end`] (as its file system tells without reading) a preallocated
    /// segment holds only zeros. A mapped segment's view is cut there (its pages past it
    /// never touched); a plain file is read only that far.
    pub(crate) fn data(&self, storage: &dyn Storage) -> io::Result<Cow<'_, [u8]>> {
        let m = match &self.data {
            SegData::Mapped(m) => m,
            SegData::Plain(f) => return Ok(Cow::Owned(read_data(f.as_ref())?)),
        };
        let end = storage.open(&self.path, OpenMode::Read)?.data_end()?;
        let end = usize::try_from(end).map_or(m.len(), |e| e.min(m.len()));
        Ok(match m.bytes()? {
            Cow::Borrowed(b) => Cow::Borrowed(&b[..end.min(b.len())]),
            Cow::Owned(mut v) => {
                v.truncate(end);
                Cow::Owned(v)
            }
        })
    }

    /// The segment's length: mapped, or on disk.
    pub(crate) fn len(&self) -> usize {
        match &self.data {
            SegData::Mapped(m) => m.len(),
            SegData::Plain(f) => f.len().map_or(0, |l| l as usize),
        }
    }
    /// Lets go of the resident pages of a mapped segment (`MappedSegment::release_pages`); a
    /// read-only segment has no map.
    pub(crate) fn release_pages(&self) -> io::Result<()> {
        match &self.data {
            SegData::Mapped(m) => m.release_pages(),
            SegData::Plain(_) => Ok(()),
        }
    }
    pub(crate) fn flush(&self, offset: usize, len: usize) -> io::Result<()> {
        match &self.data {
            SegData::Mapped(m) => m.flush_range(offset, len),
            SegData::Plain(_) => Err(plain_is_read_only()),
        }
    }
}

pub(crate) fn seg_name(seq: u64) -> String {
    format!("{seq:010}{SEGMENT_SUFFIX}")
}

pub(crate) fn parse_seg_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    (stem.len() == 10 && stem.bytes().all(|b| b.is_ascii_digit())).then(|| stem.parse().ok())?
}

pub(crate) fn valid_follows(bytes: &[u8], from: usize) -> bool {
    valid_record_follows(bytes, from, FRAME_ALIGN, |b| {
        frame::probe(b).0 == Seen::Valid
    })
}

/// Where a scan of one segment stopped: `pos` is just past the last accepted frame; `torn`,
/// when set, is the offset and reason of a torn tail to drop.
pub(crate) struct SegmentEnd {
    pub(crate) pos: usize,
    pub(crate) torn: Option<(usize, &'static str)>,
}

/// A scan's refusal to go on: the offset, the last good lsn, and why.
pub(crate) struct FrameCorrupt {
    pub(crate) offset: usize,
    pub(crate) lsn: u64,
    pub(crate) reason: String,
}

/// Scans one segment's frames (`bytes`, the whole segment) with the decision table, calling
/// `on_frame` with the offset of each accepted frame; `max_lsn` is the last accepted lsn, in
/// and out. Reads only; the caller drops a torn tail.
pub(crate) fn scan_frames(
    bytes: &[u8],
    last: bool,
    synced_through_lsn: Option<u64>,
    max_lsn: &mut u64,
    mut on_frame: impl FnMut(usize, &frame::FrameView),
) -> Result<SegmentEnd, FrameCorrupt> {
    let mut pos = 0usize;
    while pos < bytes.len() {
        let (seen, view) = frame::probe(&bytes[pos..]);
        let lsn_is_next = matches!(&view, Ok(v) if v.lsn > *max_lsn);
        let follows = seen != Seen::Valid && valid_follows(bytes, pos + FRAME_ALIGN);
        let unsynced = synced_through_lsn.is_some_and(|t| *max_lsn >= t);
        if last && follows && unsynced {
            // A gap among frames never flushed: drop it and everything after it.
            let torn = Some((
                pos,
                "gap among unflushed frames (pages written back out of order before a power loss)",
            ));
            return Ok(SegmentEnd { pos, torn });
        }
        let obs = Observation {
            seen,
            lsn_is_next,
            last_segment: last,
            valid_follows: follows,
            // The check above already cut a gap past the vouched lsn; what reaches the table is
            // covered by a flush, or the shard has no evidence either way (the old rule).
            below_synced: !unsynced,
        };
        let corrupt = |reason: String| FrameCorrupt {
            offset: pos,
            lsn: *max_lsn,
            reason,
        };
        match (decide(obs), view) {
            (Action::Accept, Ok(v)) => {
                on_frame(pos, &v);
                *max_lsn = v.lsn;
                pos += v.len;
            }
            (Action::EndOfSegment | Action::EndOfLog, _) => break,
            (Action::TruncateTail, v) => {
                let torn = Some((pos, v.err().unwrap_or("torn frame")));
                return Ok(SegmentEnd { pos, torn });
            }
            (Action::Corrupt(reason), v) => {
                let detail = match v {
                    Err(why) => format!("{reason} ({why})"),
                    Ok(_) => reason.to_owned(),
                };
                return Err(corrupt(detail));
            }
            (Action::Accept, Err(_)) => {
                return Err(corrupt("decision table accepted a non-frame".into()))
            }
        }
    }
    Ok(SegmentEnd { pos, torn: None })
}

/// Maps a writable segment file over its whole length through the seam.
pub(crate) fn map_segment(file: &dyn StorageFile) -> io::Result<MappedSegment> {
    MappedSegment::map(file, file.len()?)
}

/// Creates a writable shard's directory and, on a real disk, locks it for this process.
pub(crate) fn create_and_lock(
    storage: &dyn Storage,
    dir: &Path,
) -> Result<Option<DirLock>, ShardError> {
    storage
        .create_dir_all(dir)
        .map_err(|source| ShardError::Io {
            op: "create dir",
            path: dir.to_path_buf(),
            source,
        })?;
    // A new directory lasts only once its parent is synced; its segments' names only once it is.
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        storage.sync_dir(d).map_err(|source| ShardError::Io {
            op: "sync dir at open",
            path: d.to_path_buf(),
            source,
        })?;
    }
    if !storage.is_real() {
        return Ok(None);
    }
    match DirLock::acquire(dir) {
        Ok(lock) => Ok(Some(lock)),
        Err(LockError::Held { path }) => Err(ShardError::Locked { path }),
        Err(LockError::Io { op, path, source }) => Err(ShardError::Io { op, path, source }),
    }
}

/// Opens every segment file in `dir`, oldest first: mapped through the seam when the shard is
/// writable, positioned I/O otherwise. A read-only open of a missing
/// directory finds no segments.
pub(crate) fn open_segments(
    storage: &dyn Storage,
    dir: &Path,
    read_only: bool,
) -> Result<Vec<Seg>, ShardError> {
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| ShardError::Io { op, path, source }
    };
    let mut seqs: Vec<u64> = match storage.list(dir) {
        Ok(names) => names.iter().filter_map(|n| parse_seg_name(n)).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound && read_only => Vec::new(),
        Err(e) => return Err(io("list", dir)(e)),
    };
    seqs.sort_unstable();
    let mode = if read_only {
        OpenMode::Read
    } else {
        OpenMode::ReadWrite
    };
    let mut segs = Vec::with_capacity(seqs.len());
    let newest = seqs.last().copied();
    for seq in seqs {
        let path = dir.join(seg_name(seq));
        let file = storage.open(&path, mode).map_err(io("open", &path))?;
        if !read_only && Some(seq) == newest {
            // After a process crash the page cache may hold frames that were applied but never
            // flushed: make the whole file durable before recovery counts them as held. Only
            // the newest segment can: a roll flushes the old one first (a failed flush
            // poisons the shard before the next segment exists).
            file.sync_data().map_err(io("sync at open", &path))?;
            // Pages a failed writeback marked clean may still be cached: read the disk.
            file.drop_cache().map_err(io("drop cache at open", &path))?;
        }
        let data = if !read_only {
            SegData::Mapped(map_segment(file.as_ref()).map_err(io("map", &path))?)
        } else {
            SegData::Plain(file)
        };
        segs.push(Seg { path, data });
    }
    Ok(segs)
}

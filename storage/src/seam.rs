//! The storage seam itself: the traits every byte of roost's logs, shard segments and result
//! files goes through ([`Storage`], [`StorageFile`], [`StorageFs`], and [`MappedFile`] for a
//! mapped segment's writes and range flushes), the clock a program on that storage reads
//! ([`Storage::now`], [`Storage::system_now`]), the open modes, [`read_all`] and
//! [`write_zeros`]. This module only declares; the real disk is `real.rs`, the simulated one
//! `sim.rs`. The seam never retries anything and never hides an error: callers latch on the
//! first one.

use std::fmt;
use std::io;
use std::path::Path;
use std::time::{Instant, SystemTime};

use memmap2::MmapRaw;

/// How to open a file through the seam.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Existing file, reads only.
    Read,
    /// Existing file, reads and writes.
    ReadWrite,
    /// A new file; fails if it exists. The caller syncs the directory afterwards.
    CreateNew,
    /// As `CreateNew`, readable and writable by its owner only (a key; the simulator keeps
    /// no modes).
    CreateNewPrivate,
}

/// A directory-level view of a disk, and the clock of the machine it is on.
///
/// The clock lives in the seam because the simulator drives time the way it drives the
/// disk: a test on [`crate::SimStorage`] runs the same calls production runs, and time moves
/// there only when the test moves it (`SimStorage::advance`), so a decision such as "has this
/// waited `tail_round_ms`?" is tested without waiting and replays the same from a seed. So
/// whatever decides by the time (the engine's pipeline above all: `daemon/tests/
/// seam_writes.rs` keeps `Instant::now` out of it) reads it here, not from `std::time`.
pub trait Storage: Send + Sync + fmt::Debug {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names (not paths) of the regular files in `dir`, in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Atomically replaces `to` with `from` (same directory or file system). Durable after
    /// `sync_dir` of both parents. `from` may be a directory (then `to` must not exist): its
    /// files move with it, and the move is durable after `sync_dir` of both parents.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes `path`, a file or a directory with everything under it; a missing `path` is
    /// no error. Durable after `sync_dir` of `path`'s parent.
    fn remove_all(&self, path: &Path) -> io::Result<()>;
    /// Names (not paths) of the directories in `dir`, in no particular order; a missing
    /// `dir` lists nothing.
    fn list_dirs(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether `path` names a file or a directory.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Makes creations and removals of entries in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// A handle on `dir` and the file system holding it, for [`StorageFs::sync_fs`] and
    /// [`StorageFs::sync_dir`]. Open it before the writes it must cover: a write-back error
    /// is reported to handles opened before it.
    fn open_fs(&self, dir: &Path) -> io::Result<Box<dyn StorageFs>>;
    /// True when files are real OS files, so a caller may memory-map them.
    fn is_real(&self) -> bool {
        false
    }
    /// The monotonic time now: every "since when" and "is it due" of a program on this
    /// storage starts and ends with a reading of it (`clock.now() - t`, never `t.elapsed()`,
    /// which reads the OS clock behind the seam's back). The OS clock by default.
    fn now(&self) -> Instant {
        Instant::now()
    }
    /// The wall-clock time now (stamps written to disk, and ages computed from them), moved
    /// with [`Storage::now`] by the simulator. The OS clock by default.
    fn system_now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// One open file. All methods take `&self`: positioned I/O needs no cursor.
pub trait StorageFile: Send + Sync + fmt::Debug {
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Fills `buf` from `offset`; reading past the end is `UnexpectedEof`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`: makes written data (and the metadata needed to read it) durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Starts writing the file's dirty pages back without waiting (like `sync_file_range`
    /// with `SYNC_FILE_RANGE_WRITE`): a hint, never a promise of durability. Before a run of
    /// `sync_data` calls over many small new files it lets ext4 allocate all their blocks in
    /// the running journal transaction, so the first sync's commit carries every one of them
    /// and the rest find nothing left to commit (measured: 4x more files synced a second
    /// on a journaled image). The default does nothing.
    fn start_writeback(&self) -> io::Result<()> {
        Ok(())
    }
    /// Drops the file's cached pages that are not dirty, so that the next read comes from the
    /// disk. After a failed writeback the kernel marks pages clean that never reached the
    /// disk (a later fsync reports nothing): only dropping them shows what the disk holds.
    /// Call it after a successful `sync_data` (dirty pages are kept, not dropped).
    fn drop_cache(&self) -> io::Result<()> {
        Ok(())
    }
    /// An offset at and past which every byte of the file reads as zero, as the file system
    /// can tell without reading: the end of its last data extent (`SEEK_DATA`/`SEEK_HOLE`),
    /// where space reserved by [`StorageFile::allocate`] and never written is a hole unless
    /// the page cache holds pages of it. A recovery scan of a preallocated segment stops
    /// there instead of reading its zeros. Never more than the length; the length when the
    /// file system cannot tell (the default).
    fn data_end(&self) -> io::Result<u64> {
        self.len()
    }
    /// Reserves `[0, len)` so later writes there cannot fail for lack of space
    /// (`posix_fallocate`). Never shrinks.
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// Truncates or extends (sparse) to `len`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Maps `[0, len)` of the file, which must be open for writing and already allocated to at
    /// least `len` bytes (refused otherwise: a map past end-of-file is SIGBUS on touch, and
    /// `msync` of a map of a read-only file syncs nothing, without an error). The caller must
    /// never shrink the file while the map lives.
    fn map(&self, len: u64) -> io::Result<Box<dyn MappedFile>>;
}

/// A file mapped over `[0, len)` ([`StorageFile::map`]): the one way a mapped shard segment is
/// written and made durable, on the real disk and in the simulator alike. A write lands in the
/// page cache (readable at once through the map and the file); [`MappedFile::flush_range`] is
/// `msync(MS_SYNC)` of a range and makes durable the writes in that range and no others: a
/// power loss may still take whatever was written outside every flushed range.
pub trait MappedFile: Send + Sync + fmt::Debug {
    /// The mapped length.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// [`MappedFile::read_at`] of a range the caller checked lies inside the mapping.
    fn read_in(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// [`MappedFile::write_at`] of a range the caller checked lies inside the mapping.
    fn write_in(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// [`MappedFile::flush_range`] of `[offset, end)`, non-empty and inside the mapping.
    fn flush_in(&self, offset: u64, end: u64) -> io::Result<()>;
    /// Fills `buf` from `offset`; past the mapping's end is `UnexpectedEof`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let kind = io::ErrorKind::UnexpectedEof;
        map_range_end(offset, buf.len(), self.len(), kind, "read")?;
        self.read_in(buf, offset)
    }
    /// Writes `buf` at `offset`; past the mapping's end is `InvalidInput` and writes nothing.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let kind = io::ErrorKind::InvalidInput;
        map_range_end(offset, buf.len(), self.len(), kind, "write")?;
        self.write_in(buf, offset)
    }
    /// `msync(MS_SYNC)` of `[offset, offset + len)`: the range's dirty pages, the metadata
    /// needed to read them back and a device flush (on Linux `vfs_fsync_range` of the file,
    /// the range's part of `fdatasync`). Writes outside the range stay as durable as they
    /// were. Past the mapping's end is `InvalidInput`; an empty range does nothing.
    fn flush_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let kind = io::ErrorKind::InvalidInput;
        let n = usize::try_from(len).map_err(|_| io::Error::new(kind, "flush range too large"))?;
        let end = map_range_end(offset, n, self.len(), kind, "flush")?;
        if n == 0 {
            return Ok(());
        }
        self.flush_in(offset, end)
    }
    /// The operating system's mapping (read-only pages of the file), for readers that borrow
    /// bytes instead of copying them; `None` where there is none (the simulator).
    fn os_map(&self) -> Option<&MmapRaw> {
        None
    }
    /// Zeros over `[from, to)`, written a piece of at most 1 MiB at a time (the pieces
    /// [`crate::write_zeros`] writes to a plain file).
    fn write_zeros(&self, from: u64, to: u64) -> io::Result<()> {
        zeros_in_pieces(from, to, |piece, at| self.write_at(piece, at))
    }
}

/// The end of `[offset, offset + len)` when it lies inside a mapping of `map_len` bytes; an
/// error of `kind` naming `what` otherwise (an overflowing range included).
fn map_range_end(
    offset: u64,
    len: usize,
    map_len: u64,
    kind: io::ErrorKind,
    what: &str,
) -> io::Result<u64> {
    offset
        .checked_add(len as u64)
        .filter(|end| *end <= map_len)
        .ok_or_else(|| {
            io::Error::new(
                kind,
                format!("mapped {what} of {len} bytes at offset {offset} past the mapping's end ({map_len} bytes)"),
            )
        })
}

/// A file system, seen through one of its directories.
pub trait StorageFs: Send + Sync + fmt::Debug {
    /// `syncfs`: makes the data of every file on the file system durable (one journal commit
    /// and one device flush for all of them, instead of an fsync each). Callers rely on it only
    /// for the data of files in the directory the handle was opened on; their names still need
    /// [`Storage::sync_dir`]. Reports any write-back error on the file system since the
    /// previous call (or since the handle was opened), so it may fail for another program's
    /// file: the safe side.
    fn sync_fs(&self) -> io::Result<()>;
    /// fsync of the directory the handle was opened on, as [`Storage::sync_dir`] does it but
    /// without opening the directory again: no open and close events for whoever watches it
    /// (a client waiting on `out/` is not woken twice per round). The real disk's then
    /// checks, by a `stat` of the path, that the directory there is still the one held.
    fn sync_dir(&self) -> io::Result<()>;
}

/// Zeros for [`write_zeros`]: in the zero-initialised data segment, so it costs no memory
/// until read, and never an allocation.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// Writes zeros over `[from, to)` of `file`, 1 MiB per call.
pub fn write_zeros(file: &dyn StorageFile, from: u64, to: u64) -> io::Result<()> {
    zeros_in_pieces(from, to, |piece, at| file.write_at(piece, at))
}

/// `write(zeros, at)` over `[from, to)`, a piece of at most 1 MiB at a time, stopping at the
/// first error.
fn zeros_in_pieces(
    from: u64,
    to: u64,
    mut write: impl FnMut(&[u8], u64) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        write(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

/// The file's bytes up to [`StorageFile::data_end`]: everything a scan for records needs
/// (past it the file reads as zeros), without reading a preallocated segment's unwritten rest.
pub fn read_data(file: &dyn StorageFile) -> io::Result<Vec<u8>> {
    read_to(file, file.data_end()?)
}

/// Reads a whole file through the seam.
pub fn read_all(file: &dyn StorageFile) -> io::Result<Vec<u8>> {
    read_to(file, file.len()?)
}

/// The file's first `end` bytes.
fn read_to(file: &dyn StorageFile, end: u64) -> io::Result<Vec<u8>> {
    let end = usize::try_from(end)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file larger than memory"))?;
    let mut buf = vec![0u8; end];
    file.read_at(&mut buf, 0)?;
    Ok(buf)
}

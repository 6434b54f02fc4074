//! The storage seam itself: the traits every byte of roost's logs, shard segments and result
//! files goes through ([`Storage`], [`StorageFile`], [`StorageFs`]), the open modes, and
//! [`read_all`]. This module only declares; the real disk is `real.rs`, the simulated one
//! `sim.rs`. The seam never retries anything and never hides an error: callers latch on the
//! first one.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::Path;

/// How to open a file through the seam.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Existing file, reads only.
    Read,
    /// Existing file, reads and writes.
    ReadWrite,
    /// A new file; fails if it exists. The caller syncs the directory afterwards.
    CreateNew,
}

/// A directory-level view of a disk.
pub trait Storage: Send + Sync + fmt::Debug {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names (not paths) of the regular files in `dir`, in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Atomically replaces `to` with `from` (same directory or file system). Durable after
    /// `sync_dir` of both parents.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes creations and removals of entries in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// A handle on the file system holding `dir`, for [`StorageFs::sync_fs`]. Open it before
    /// the writes it must cover: a write-back error is reported to handles opened before it.
    fn open_fs(&self, dir: &Path) -> io::Result<Box<dyn StorageFs>>;
    /// True when files are real OS files, so a caller may memory-map them.
    fn is_real(&self) -> bool {
        false
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
    /// Reserves `[0, len)` so later writes there cannot fail for lack of space
    /// (`posix_fallocate`). Never shrinks.
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// Truncates or extends (sparse) to `len`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// The OS file, when there is one (memory mapping needs it).
    fn as_std_file(&self) -> Option<&File> {
        None
    }
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
}

/// Reads a whole file through the seam.
pub fn read_all(file: &dyn StorageFile) -> io::Result<Vec<u8>> {
    let len = usize::try_from(file.len()?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file larger than memory"))?;
    let mut buf = vec![0u8; len];
    file.read_at(&mut buf, 0)?;
    Ok(buf)
}

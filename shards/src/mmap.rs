//! The only module in roost with `unsafe`: mapping a shard segment file for reading.
//!
//! Writes never go through the map: they are `pwrite`s to the file (Linux's page cache is one
//! cache for both, so the map sees each write at once), and the map is `PROT_READ`, as LMDB
//! does by default. Writing through a shared writable map costs twice on every flush: the
//! kernel write-protects each page it writes back and flushes the TLB of every CPU running the
//! process (an inter-processor interrupt per page: 17% of the daemon's samples on a bulk run),
//! and the next store to that page faults to make it writable again. A `pwrite` leaves the
//! map's page-table entries read-only, so write-back has nothing to protect. And a stray store
//! through the map is a SIGSEGV, never a silent change to a record.
//!
//! Soundness argument (redb dropped its mmap backend because this is hard; here is ours):
//! `as_slice` hands out `&[u8]` over file pages, which is sound only while nothing changes or
//! shrinks the file behind a live borrow.
//! 1. Other processes: the shard holds an exclusive `flock` on `<shard>/LOCK` for as long as
//!    any segment is mapped, and every roost process that writes takes it first. Readers in
//!    other roost processes (`roost get` while the daemon runs) use plain `pread`, never a map.
//! 2. Shrinking: a segment is preallocated (posix_fallocate) to its full length *before* it is
//!    mapped and is never truncated while mapped; torn tails are zeroed by `pwrite`, not cut.
//!    So no page of the mapping can fall past end-of-file (SIGBUS), and ENOSPC surfaces at
//!    allocation time as an error, never as SIGBUS on a sparse page.
//! 3. This process: the map is owned by one `MappedSegment`, owned by one `Shard`, which has a
//!    single writer; every write (`write_at`, `zero`) takes `&mut self`, so no `&[u8]` handed
//!    out by `as_slice` outlives a write (the borrow checker enforces it).
//!
//! What it cannot protect against: a non-roost process truncating the file (root, or the
//! owner by hand). That is outside the contract and documented in docs/shard-format.md.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use memmap2::{MmapOptions, MmapRaw};

/// Zeros for [`MappedSegment::zero`], written a piece at a time.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// A preallocated segment file mapped for reading, written with `pwrite`.
#[derive(Debug)]
pub struct MappedSegment {
    map: MmapRaw,
    /// Opened read-write: the writes go to it, and `msync` of a shared map of a file opened
    /// for writing syncs it (a map of a read-only file would make `msync` a no-op).
    file: File,
}

impl MappedSegment {
    /// Maps `[0, len)` of `file`, which must already be allocated to at least `len` bytes.
    pub fn map(file: File, len: u64) -> io::Result<MappedSegment> {
        let actual = file.metadata()?.len();
        if actual < len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("segment is {actual} bytes, expected at least {len}: refusing to map"),
            ));
        }
        // A zero-length pwrite is refused (EBADF) on a file not open for writing: the writes
        // would fail, and worse, `msync` of its map would sync nothing without an error.
        file.write_at(&[], 0).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("segment is not open for writing ({e}): refusing to map"),
            )
        })?;
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large to map"))?;
        let map = MmapOptions::new().len(len).map_raw_read_only(&file)?;
        Ok(MappedSegment { map, file })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the map is `len` readable bytes of a file that is at least that long and is
        // never truncated while mapped (point 2 of the module doc); no other process writes it
        // because the caller holds the shard's exclusive lock (point 1); this process writes
        // it only through `&mut self` methods, so the bytes do not change while the returned
        // borrow of `self` lives (point 3).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.map.len()) }
    }

    /// The end of `[offset, offset + len)` if it lies inside the segment.
    fn end(&self, offset: usize, len: usize, what: &str) -> io::Result<usize> {
        offset
            .checked_add(len)
            .filter(|e| *e <= self.map.len())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} past segment end"),
                )
            })
    }

    /// Writes `bytes` at `offset` (`pwrite`). The caller checked the bounds; a write out of
    /// bounds is an error, never a panic.
    pub fn write_at(&mut self, offset: usize, bytes: &[u8]) -> io::Result<()> {
        self.end(offset, bytes.len(), "write")?;
        self.file.write_all_at(bytes, offset as u64)
    }

    /// Zeros over `[offset, offset + len)`; out of bounds is an error.
    pub fn zero(&mut self, offset: usize, len: usize) -> io::Result<()> {
        let end = self.end(offset, len, "zeros")?;
        let mut at = offset;
        while at < end {
            let n = (end - at).min(ZEROS.len());
            self.file.write_all_at(&ZEROS[..n], at as u64)?;
            at += n;
        }
        Ok(())
    }

    /// `msync(MS_SYNC)` of the range (memmap2 `flush_range`; `flush_async` would not be
    /// durable). It syncs the file's pages in the range however they were dirtied: `msync`
    /// of a shared map is `vfs_fsync_range` of its file, not a walk of the map's own stores. On Linux, MS_SYNC on a shared file mapping is `vfs_fsync_range(file, ..,
    /// datasync = 1)` (mm/msync.c): the file's dirty pages, the metadata needed to read them
    /// back (unwritten extents of the preallocation converted) and the device cache flush,
    /// exactly what `fdatasync` does. An `fdatasync` after it, as this did at first, only
    /// repeated the device flush: one sync per shard flush instead of two.
    pub fn flush_range(&self, offset: usize, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.map.flush_range(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(len: u64) -> (tempfile::TempDir, MappedSegment) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("000.seg");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("create segment");
        f.set_len(len).expect("set_len");
        let seg = MappedSegment::map(f, len).expect("map");
        (dir, seg)
    }

    #[test]
    fn the_map_and_the_file_see_each_pwrite_at_once_and_msync_accepts_the_range() {
        let (dir, mut seg) = segment(200_000);
        seg.write_at(4090, b"across a page edge").expect("write");
        assert_eq!(&seg.as_slice()[4090..4108], b"across a page edge");
        seg.write_at(10_000, &[7u8; 190_000]).expect("write");
        // More than one piece of ZEROS: 139,800 bytes over the sevens.
        seg.zero(60_100, 139_800).expect("zero");
        assert_eq!(seg.as_slice()[60_099], 7);
        assert!(seg.as_slice()[60_100..199_900].iter().all(|b| *b == 0));
        assert_eq!(seg.as_slice()[199_999], 7, "past the zeros: untouched");
        seg.flush_range(4090, 200_000 - 4090).expect("msync");
        // Read through the file (the page cache, not the platter: that the sync reaches the
        // disk is the power-cut tests' part, daemon/tests/powercut.rs).
        let file = std::fs::read(dir.path().join("000.seg")).expect("read back");
        assert_eq!(&file[4090..4108], b"across a page edge");
        assert_eq!((file[60_099], file[150_099], file[199_999]), (7, 0, 7));
    }

    #[test]
    fn a_segment_not_open_for_writing_is_refused() {
        let (dir, seg) = segment(8192);
        drop(seg);
        let ro = std::fs::File::open(dir.path().join("000.seg")).expect("open read-only");
        let e = MappedSegment::map(ro, 8192).expect_err("a read-only file must not be mapped");
        assert!(e.to_string().contains("not open for writing"), "{e}");
    }

    #[test]
    fn writes_past_the_end_are_errors_and_change_nothing() {
        let (dir, mut seg) = segment(8192);
        let e = seg.write_at(8190, b"abc").expect_err("past the end");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(seg.zero(usize::MAX, 2).is_err(), "overflowing range");
        assert!(seg.zero(8000, 193).is_err());
        assert!(seg.as_slice().iter().all(|b| *b == 0));
        assert_eq!(
            std::fs::metadata(dir.path().join("000.seg"))
                .expect("stat")
                .len(),
            8192
        );
    }
}

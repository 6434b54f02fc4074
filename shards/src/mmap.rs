//! A writable shard's segment, mapped through the storage seam ([`StorageFile::map`]), and the
//! only module in roost with `unsafe`: borrowing the bytes of the operating system's map.
//!
//! Every write and every flush goes through the seam's [`MappedFile`], on the real disk and in
//! the simulator alike, so the crash schedules run the calls production makes: `write_at` and
//! `write_zeros` land in the page cache (a `pwrite` on the real disk; the map is `PROT_READ`,
//! see `roost_storage`'s `real.rs` for why), and `flush_range` is `msync(MS_SYNC)` of the range,
//! which makes durable that range and nothing else. Reads borrow the real map's pages; the
//! simulator has no map, so there they are positioned reads of its live image.
//!
//! Soundness argument (redb dropped its mmap backend because this is hard; here is ours):
//! `os_slice` hands out `&[u8]` over file pages, which is sound only while nothing changes or
//! shrinks the file behind a live borrow.
//! 0. The pages: the slice covers exactly the `MmapRaw` the seam's map owns (memmap2 keeps
//!    `[ptr, ptr + len)` mapped until it is dropped), and it borrows `self`, which owns the map.
//! 1. Other processes: the shard holds an exclusive `flock` on `<shard>/LOCK` for as long as
//!    any segment is mapped, and every roost process that writes takes it first. Readers in
//!    other roost processes (`roost get` while the daemon runs) use plain `pread`, never a map.
//! 2. Shrinking: a segment is preallocated (posix_fallocate) to its full length *before* it is
//!    mapped (the seam refuses a file shorter than the map) and is never truncated below what
//!    is mapped: torn tails are zeroed by writes, not cut, and a rolled segment that gives
//!    back its unused space (`Shard::trim_rolled`) is first mapped again at its shorter length
//!    (the old map dropped), then cut to exactly that length. So no page of the map can fall past
//!    end-of-file (SIGBUS), and ENOSPC surfaces at allocation time as an error, never as SIGBUS
//!    on a sparse page.
//! 3. This process: the map is owned by one `MappedSegment` (the file handle it was made from
//!    is dropped), owned by one `Shard`, which has a single writer; every write (`write_at`,
//!    `zero`) takes `&mut self`, so no `&[u8]` handed out by `os_slice` outlives a write (the
//!    borrow checker enforces it).
//!
//! What it cannot protect against: a non-roost process truncating the file (root, or the
//! owner by hand). That is outside the contract and documented in docs/shard-format.md.

use std::borrow::Cow;
use std::io;

use roost_storage::{MappedFile, StorageFile};

/// A preallocated segment file mapped through the seam; written and flushed only through it.
#[derive(Debug)]
pub struct MappedSegment {
    map: Box<dyn MappedFile>,
}

impl MappedSegment {
    /// Maps `[0, len)` of `file`, which must be open for writing and already allocated to at
    /// least `len` bytes (the seam refuses it otherwise).
    pub fn map(file: &dyn StorageFile, len: u64) -> io::Result<MappedSegment> {
        Ok(MappedSegment {
            map: file.map(len)?,
        })
    }

    /// The operating system's pages, when the seam has a real map.
    fn os_slice(&self) -> Option<&[u8]> {
        let raw = self.map.os_map()?;
        if raw.len() == 0 {
            return Some(&[]);
        }
        // SAFETY: `raw` is a live read-only map of `raw.len()` bytes owned by `self.map` and
        // borrowed with `self` (point 0 of the module doc); the file is at least that long and
        // is never truncated while mapped (point 2); no other process writes it because the
        // caller holds the shard's exclusive lock (point 1); this process writes it only
        // through `&mut self` methods, so the bytes do not change while the returned borrow of
        // `self` lives (point 3).
        Some(unsafe { std::slice::from_raw_parts(raw.as_ptr(), raw.len()) })
    }

    /// The mapped length.
    pub fn len(&self) -> usize {
        // The seam mapped it, so it fits a usize.
        self.map.len() as usize
    }

    /// The whole segment: borrowed from the real map, read from the simulator's image.
    pub fn bytes(&self) -> io::Result<Cow<'_, [u8]>> {
        if let Some(s) = self.os_slice() {
            return Ok(Cow::Borrowed(s));
        }
        let mut buf = vec![0u8; self.len()];
        self.map.read_at(&mut buf, 0)?;
        Ok(Cow::Owned(buf))
    }

    /// `[offset, offset + len)`; past the end is `UnexpectedEof`.
    pub fn read(&self, offset: usize, len: usize) -> io::Result<Vec<u8>> {
        if let Some(s) = self.os_slice() {
            return offset
                .checked_add(len)
                .and_then(|end| s.get(offset..end))
                .map(<[u8]>::to_vec)
                .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past segment"));
        }
        let mut buf = vec![0u8; len];
        self.map.read_at(&mut buf, offset as u64)?;
        Ok(buf)
    }

    /// Writes `bytes` at `offset`. The caller checked the bounds; a write out of bounds is an
    /// error that writes nothing, never a panic.
    pub fn write_at(&mut self, offset: usize, bytes: &[u8]) -> io::Result<()> {
        self.map.write_at(bytes, offset as u64)
    }

    /// Zeros over `[offset, offset + len)`; out of bounds is an error.
    pub fn zero(&mut self, offset: usize, len: usize) -> io::Result<()> {
        let end = offset.checked_add(len).filter(|e| *e <= self.len());
        let end = end
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "zeros past segment end"))?;
        self.map.write_zeros(offset as u64, end as u64)
    }

    /// Lets go of this process's resident pages of the map (`madvise(MADV_DONTNEED)` on the
    /// real map; nothing in the simulator, which has none): the next read faults them in
    /// again from the page cache or the disk, with the same bytes. Makes what a scan or
    /// many reads touched stop counting in the resident set (issue 44: RSS must not grow
    /// with the records read). The page cache keeps them as the kernel sees fit.
    pub fn release_pages(&self) -> io::Result<()> {
        let Some(raw) = self.map.os_map() else {
            return Ok(());
        };
        if raw.len() == 0 {
            return Ok(());
        }
        // SAFETY: `MADV_DONTNEED` on a shared file mapping only drops page-table entries:
        // the pages stay in the page cache with any dirty state, and the next access maps the
        // same file bytes again, so no byte a live borrow from `os_slice` sees changes (the
        // mapping is the seam's `MAP_SHARED` read-only map of the file; `memmap2` marks the
        // advice unchecked because on a private mapping it drops the process's own copies of
        // written pages, which a shared read-only one does not have). `msync` of a range
        // later still flushes its dirty pages: it syncs the file's range, not the mapping's
        // entries. The range is exactly the mapping `raw` owns (point 0).
        unsafe { raw.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) }
    }

    /// `msync(MS_SYNC)` of the range through the seam: durable are the writes in the range,
    /// and on the real disk the metadata needed to read them (Linux: `vfs_fsync_range`, the
    /// range's part of `fdatasync`). Writes outside it are not made durable by this call.
    pub fn flush_range(&self, offset: usize, len: usize) -> io::Result<()> {
        self.map.flush_range(offset as u64, len as u64)
    }
}

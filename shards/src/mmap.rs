//! The only module in roost with `unsafe`: mapping a shard segment file read-write.
//!
//! Soundness argument (redb dropped its mmap backend because this is hard; here is ours):
//! a `MmapMut` hands out `&[u8]`/`&mut [u8]` over file pages, which is sound only while no one
//! else changes or shrinks the file behind the mapping.
//! 1. Other processes: the shard holds an exclusive `flock` on `<shard>/LOCK` for as long as
//!    any segment is mapped, and every roost process that writes takes it first. Readers in
//!    other roost processes (`roost get` while the daemon runs) use plain `pread`, never a map.
//! 2. Shrinking: a segment is preallocated (posix_fallocate) to its full length *before* it is
//!    mapped and is never truncated while mapped; torn tails are zeroed through the map, not
//!    cut. So no page of the mapping can fall past end-of-file (SIGBUS), and ENOSPC surfaces at
//!    allocation time as an error, never as SIGBUS on a sparse page.
//! 3. This process: the map is owned by one `MappedSegment`, owned by one `Shard`, which has a
//!    single writer (`&mut self` for every write), so no `&[u8]` handed out by `as_slice`
//!    outlives a write (the borrow checker enforces it).
//!
//! What it cannot protect against: a non-roost process truncating the file (root, or the
//! owner by hand). That is outside the contract and documented in docs/shard-format.md.

use std::fs::File;
use std::io;

use memmap2::{MmapMut, MmapOptions};

/// A preallocated segment file mapped read-write.
#[derive(Debug)]
pub struct MappedSegment {
    map: MmapMut,
    /// Held for the mapping's lifetime (the map stays valid without it; this keeps ownership plain).
    _file: File,
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
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large to map"))?;
        // SAFETY: the file is at least `len` bytes (checked above) and is never truncated
        // while mapped (point 2 of the module doc); no other process writes it because the
        // caller holds the shard's exclusive lock (point 1); all access goes through this
        // struct's methods, which borrow it (point 3).
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file)? };
        Ok(MappedSegment { map, _file: file })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.map
    }

    /// Copies `bytes` into the mapping at `offset`. The caller checked the bounds; a write out
    /// of bounds is an error, never a panic.
    pub fn write_at(&mut self, offset: usize, bytes: &[u8]) -> io::Result<()> {
        let end = offset
            .checked_add(bytes.len())
            .filter(|e| *e <= self.map.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "write past segment end"))?;
        self.map[offset..end].copy_from_slice(bytes);
        Ok(())
    }

    /// Zeros over `[offset, offset + len)` of the mapping; out of bounds is an error.
    pub fn zero(&mut self, offset: usize, len: usize) -> io::Result<()> {
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= self.map.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "zeros past segment end"))?;
        self.map[offset..end].fill(0);
        Ok(())
    }

    /// `msync(MS_SYNC)` of the range (memmap2 `flush_range`; `flush_async` would not be
    /// durable). On Linux, MS_SYNC on a shared file mapping is `vfs_fsync_range(file, ..,
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

//! [`RealStorage`]: the seam over the operating system's file system, a thin layer over
//! `std::fs` (positioned reads and writes, `fdatasync`, `posix_fallocate`, directory fsync,
//! `syncfs`, and read-only shared maps synced by range with `msync`). It adds no buffering, no
//! retries and no policy; [`FILE_MODE`] is the mode everything roost creates gets, but a
//! private file ([`OpenMode::CreateNewPrivate`], a key: [`PRIVATE_FILE_MODE`]).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};

use crate::seam::{MappedFile, OpenMode, Storage, StorageFile, StorageFs};

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealStorage;

impl RealStorage {
    pub fn shared() -> Arc<dyn Storage> {
        Arc::new(RealStorage)
    }
}

/// File mode for everything roost creates, before the process umask: `roost serve` sets a
/// umask of 0o027 by default (config `umask`), so files are owner read/write and group read
/// (spool results are read by the `roost-submit` group through the setgid `out/`), and others
/// get nothing.
pub const FILE_MODE: u32 = 0o644;

/// File mode of a file [`OpenMode::CreateNewPrivate`] makes (a TLS key): its owner's only,
/// from the moment it exists.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

impl Storage for RealStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                if let Some(name) = entry.file_name().to_str() {
                    names.push(name.to_owned());
                }
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut o = OpenOptions::new();
        match mode {
            OpenMode::Read => o.read(true),
            OpenMode::ReadWrite => o.read(true).write(true),
            OpenMode::CreateNew => o.read(true).write(true).create_new(true).mode(FILE_MODE),
            OpenMode::CreateNewPrivate => {
                let o = o.read(true).write(true).create_new(true);
                o.mode(PRIVATE_FILE_MODE)
            }
        };
        Ok(Box::new(RealFile(o.open(path)?)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_all(&self, path: &Path) -> io::Result<()> {
        match fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
            Ok(m) if m.is_dir() => fs::remove_dir_all(path),
            Ok(_) => fs::remove_file(path),
        }
    }

    fn list_dirs(&self, dir: &Path) -> io::Result<Vec<String>> {
        let rd = match fs::read_dir(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            r => r?,
        };
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                if let Some(name) = entry.file_name().to_str() {
                    names.push(name.to_owned());
                }
            }
        }
        Ok(names)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        match fs::symlink_metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn open_fs(&self, dir: &Path) -> io::Result<Box<dyn StorageFs>> {
        let held = File::open(dir)?;
        let m = held.metadata()?;
        Ok(Box::new(RealFs {
            id: (m.dev(), m.ino()),
            held,
            path: dir.to_path_buf(),
        }))
    }

    fn is_real(&self) -> bool {
        true
    }
}

/// Holds a directory open: `syncfs` reports write-back errors since the handle's last call
/// (Linux 5.8 and later), so one long-lived handle misses none.
#[derive(Debug)]
struct RealFs {
    held: File,
    /// Where it was opened, and its (device, inode) then.
    path: PathBuf,
    id: (u64, u64),
}

impl StorageFs for RealFs {
    fn sync_fs(&self) -> io::Result<()> {
        rustix::fs::syncfs(&self.held).map_err(io::Error::from)
    }

    /// The held directory fsynced, then checked to be still the one at its path: one
    /// replaced since it was opened (moved or removed, another made in its place) takes the
    /// names its callers make, and this fsync would not cover them. An error then, never a
    /// silent success.
    fn sync_dir(&self) -> io::Result<()> {
        self.held.sync_all()?;
        let now = fs::metadata(&self.path)?;
        if self.id != (now.dev(), now.ino()) {
            return Err(io::Error::other(format!(
                "{} was replaced since roost opened it (its fsync would not cover the names made in it): restart roost to open it again",
                self.path.display()
            )));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct RealFile(File);

/// Data extents [`StorageFile::data_end`] walks before it gives up and answers the length:
/// a segment written front to back has one.
const DATA_EXTENTS_MAX: usize = 64;

/// The end of the last data extent of `file` (0 when it has none), walking `SEEK_DATA` and
/// `SEEK_HOLE` from the start; `None` when the file system cannot tell (the seeks are not
/// supported) or the file has more than [`DATA_EXTENTS_MAX`] extents. Uses the file's
/// offset, which nothing else here does (reads and writes are positioned).
fn last_data_end(file: &File, len: u64) -> Option<u64> {
    use rustix::fs::{seek, SeekFrom};
    let mut end = 0;
    for _ in 0..DATA_EXTENTS_MAX {
        if end >= len {
            return Some(len);
        }
        let data = match seek(file, SeekFrom::Data(end)) {
            Ok(at) => at,
            Err(e) if e == rustix::io::Errno::NXIO => return Some(end),
            Err(_) => return None,
        };
        end = seek(file, SeekFrom::Hole(data)).ok()?;
    }
    None
}

impl StorageFile for RealFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn start_writeback(&self) -> io::Result<()> {
        // Linux's POSIX_FADV_DONTNEED starts writeback of the dirty pages (WB_SYNC_NONE,
        // mm/fadvise.c) and drops only pages that are clean: what `sync_file_range(WRITE)`
        // does, without the `unsafe` a raw call would need. Measured the same (journaled
        // ext4 image, 16 new files then an fdatasync each: 4,075 files/s with this, 3,690
        // with sync_file_range, 1,050 with neither).
        rustix::fs::fadvise(&self.0, 0, None, rustix::fs::Advice::DontNeed).map_err(io::Error::from)
    }
    fn drop_cache(&self) -> io::Result<()> {
        rustix::fs::fadvise(&self.0, 0, None, rustix::fs::Advice::DontNeed).map_err(io::Error::from)
    }
    fn data_end(&self) -> io::Result<u64> {
        let len = self.len()?;
        Ok(last_data_end(&self.0, len).unwrap_or(len).min(len))
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        match rustix::fs::fallocate(&self.0, rustix::fs::FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            // File systems without fallocate (some tmpfs versions, overlay setups): fall back
            // to writing zeros over the missing range so the space is still really reserved.
            Err(e) if e == rustix::io::Errno::OPNOTSUPP => {
                let cur = self.len()?;
                if cur < len {
                    let zeros = vec![0u8; 1 << 20];
                    let mut off = cur;
                    while off < len {
                        let n = (len - off).min(zeros.len() as u64) as usize;
                        self.0.write_all_at(&zeros[..n], off)?;
                        off += n as u64;
                    }
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn map(&self, len: u64) -> io::Result<Box<dyn MappedFile>> {
        let actual = self.len()?;
        if actual < len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("file is {actual} bytes, expected at least {len}: refusing to map"),
            ));
        }
        // A zero-length pwrite is refused (EBADF) on a file not open for writing: the writes
        // would fail, and worse, `msync` of its map would sync nothing without an error.
        self.0.write_at(&[], 0).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("file is not open for writing ({e}): refusing to map"),
            )
        })?;
        let map_len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        let file = self.0.try_clone()?;
        let map = MmapOptions::new().len(map_len).map_raw_read_only(&file)?;
        Ok(Box::new(RealMap { map, file, len }))
    }
}

/// A read-only shared map of a file opened for writing, written with `pwrite`.
///
/// Writes never go through the map: Linux's page cache is one cache for both, so the map sees
/// each `pwrite` at once, and the map is `PROT_READ`, as LMDB does by default. Writing through
/// a shared writable map costs twice on every flush: the kernel write-protects each page it
/// writes back and flushes the TLB of every CPU running the process (an inter-processor
/// interrupt per page: 17% of the daemon's samples on a bulk run), and the next store to that
/// page faults to make it writable again. A `pwrite` leaves the map's page-table entries
/// read-only, so write-back has nothing to protect. And a stray store through the map is a
/// SIGSEGV, never a silent change to a record.
#[derive(Debug)]
struct RealMap {
    map: MmapRaw,
    /// Opened read-write: the writes go to it, and `msync` of a shared map of a file opened
    /// for writing syncs it.
    file: File,
    len: u64,
}

impl MappedFile for RealMap {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_in(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_in(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    /// memmap2's `flush_range` is `msync(MS_SYNC)` from the page holding `offset` (`flush_async`
    /// would not be durable). On Linux, MS_SYNC on a shared file mapping is
    /// `vfs_fsync_range(file, .., datasync = 1)` (mm/msync.c): the file's dirty pages in the
    /// range however they were dirtied (by `pwrite` here), the metadata needed to read them
    /// back (unwritten extents of the preallocation converted) and the device cache flush,
    /// what `fdatasync` does for the range. An `fdatasync` after it, as the shards did at
    /// first, only repeated the device flush.
    fn flush_in(&self, offset: u64, end: u64) -> io::Result<()> {
        // In bounds of a map of `len` bytes, which fit a usize when mapped.
        self.map
            .flush_range(offset as usize, (end - offset) as usize)
    }
    fn os_map(&self) -> Option<&MmapRaw> {
        Some(&self.map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimStorage;

    /// Goal: a directory fsynced through a held handle is the one at its path, or the sync
    /// fails: a directory replaced under its path (moved away, another made there) would
    /// take the names and miss the fsync. Method: a handle on a fresh directory syncs; after
    /// the directory is moved and another made in its place, it fails and names the path.
    #[test]
    fn a_held_directory_replaced_under_its_path_fails_its_sync() {
        let t = tempfile::tempdir().expect("tempdir");
        let out = t.path().join("out");
        fs::create_dir(&out).expect("mkdir");
        let h = RealStorage.open_fs(&out).expect("open");
        h.sync_dir().expect("the directory at its path");
        fs::rename(&out, t.path().join("moved")).expect("move");
        fs::create_dir(&out).expect("mkdir again");
        let e = h.sync_dir().expect_err("replaced");
        assert!(e.to_string().contains("out was replaced"), "{e}");
        assert!(h.sync_fs().is_ok(), "syncfs still covers the file system");
    }

    /// What `data_end` promises on any disk: at most the length, at least past every byte
    /// written, and zeros from it on. Returns it for a 4 MiB preallocated file holding 10,000
    /// written bytes, a hole, and 3 bytes at 1 MiB.
    fn data_end_contract(s: &dyn Storage, dir: &Path) -> u64 {
        let f = s.open(&dir.join("d.wal"), OpenMode::CreateNew).unwrap();
        let len = 4u64 << 20;
        f.allocate(len).unwrap();
        assert!(f.data_end().unwrap() <= 4096, "nothing written yet");
        f.write_at(&[0xab; 10_000], 0).unwrap();
        f.write_at(b"far", 1 << 20).unwrap();
        f.sync_data().unwrap();
        let end = f.data_end().unwrap();
        assert!((1 << 20) + 3 <= end && end <= len, "data end {end}");
        let mut rest = vec![1u8; (len - end) as usize];
        f.read_at(&mut rest, end).unwrap();
        assert!(rest.iter().all(|b| *b == 0), "a non-zero byte past {end}");
        end
    }

    /// Goal (issue 44): a recovery scan may stop at `data_end`. On the real disk the file
    /// system answers it from its extents (ext4, as in CI: a preallocated file's unwritten
    /// rest is a hole), and on the simulator from the bytes.
    #[test]
    fn data_end_is_past_every_written_byte_and_zeros_follow() {
        let t = tempfile::tempdir().expect("tempdir");
        let end = data_end_contract(&RealStorage, t.path());
        assert!(
            end < 4 << 20,
            "this file system reports no hole past the data ({end}): a restart reads whole segments"
        );
        let sim = SimStorage::new();
        let end = data_end_contract(&sim, Path::new("/d"));
        assert_eq!(end, (1 << 20) + 4096, "the simulator knows every byte");
    }

    /// A file of `len` zeros at `dir/000.seg`, allocated and mapped.
    fn mapped(s: &dyn Storage, dir: &Path, len: u64) -> Box<dyn MappedFile> {
        let f = s.open(&dir.join("000.seg"), OpenMode::CreateNew).unwrap();
        f.allocate(len).unwrap();
        f.map(len).unwrap()
    }

    /// The checks a map must pass on any disk, given a reader of the file's bytes.
    fn map_contract(s: &dyn Storage, dir: &Path, read: impl Fn() -> Vec<u8>) {
        let m = mapped(s, dir, 200_000);
        m.write_at(b"across a page edge", 4090).unwrap();
        m.write_at(&[7u8; 190_000], 10_000).unwrap();
        // More than one 1 MiB piece is not needed: 139,800 bytes over the sevens.
        m.write_zeros(60_100, 199_900).unwrap();
        m.flush_range(4090, 200_000 - 4090).unwrap();
        let file = read();
        assert_eq!(&file[4090..4108], b"across a page edge");
        assert_eq!((file[60_099], file[150_099], file[199_999]), (7, 0, 7));
        let mut buf = [0u8; 5];
        m.read_at(&mut buf, 4090).unwrap();
        assert_eq!(&buf, b"acros");
        // Out of bounds: an error, nothing written, never a panic.
        let e = m.write_at(b"abc", 199_998).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(m.write_at(b"ab", u64::MAX).is_err(), "overflowing range");
        assert!(m.flush_range(199_999, 2).is_err());
        assert_eq!(
            m.read_at(&mut buf, 199_996).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(read(), file);
        // A file shorter than the map, or not open for writing, is refused.
        let path = dir.join("000.seg");
        let rw = s.open(&path, OpenMode::ReadWrite).unwrap();
        let e = rw.map(200_001).unwrap_err();
        assert!(e.to_string().contains("refusing to map"), "{e}");
        let ro = s.open(&path, OpenMode::Read).unwrap();
        let e = ro.map(8192).unwrap_err();
        assert!(e.to_string().contains("not open for writing"), "{e}");
    }

    /// Goal: the real map and the simulated one keep the same contract (writes seen at once,
    /// zeros, range flush, bounds, refusals), so shards' calls mean the same on both.
    #[test]
    fn real_and_simulated_maps_keep_the_same_contract() {
        let tmp = tempfile::tempdir().unwrap();
        let real = RealStorage;
        map_contract(&real, tmp.path(), || {
            fs::read(tmp.path().join("000.seg")).unwrap()
        });
        let sim = SimStorage::new();
        let dir = Path::new("/d");
        map_contract(&sim, dir, || sim.file_bytes(&dir.join("000.seg")).unwrap());
    }
}

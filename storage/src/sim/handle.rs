//! An open file of the simulated disk (`SimHandle`, the seam's `StorageFile`) and its map
//! (`SimMap`): reads and writes on the live image, syncs by range as `fdatasync` and `msync`
//! do, each counted and failed as the test's faults say.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::state::{
    apply_write, file_mut, resize, sim_err, split_pending, written_after, PendingWrite, SimState,
};
use crate::seam::{MappedFile, StorageFile};

#[derive(Clone, Debug)]
pub(crate) struct SimHandle {
    state: Arc<Mutex<SimState>>,
    path: PathBuf,
    /// Opened for writing: only such a handle may be mapped, as on the real disk.
    writable: bool,
}

impl SimHandle {
    pub(crate) fn new(state: Arc<Mutex<SimState>>, path: PathBuf, writable: bool) -> SimHandle {
        SimHandle {
            state,
            path,
            writable,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut SimState, &PathBuf) -> io::Result<R>) -> io::Result<R> {
        let mut st = crate::mutex::lock(&self.state);
        f(&mut st, &self.path)
    }
}

impl SimHandle {
    /// `fdatasync` (the whole file) or `msync` of a mapped range: counts as one sync, makes
    /// the pending writes' bytes inside `[from, to)` durable and keeps the rest pending. A
    /// pending resize is the metadata a read of the data needs, so any sync takes it.
    fn sync_range(&self, from: u64, to: u64) -> io::Result<()> {
        let latency = crate::mutex::lock(&self.state).faults.sync_latency;
        if let Some(d) = latency {
            std::thread::sleep(d);
        }
        self.with(|st, p| {
            st.count_op()?;
            let synced = st
                .count_sync()
                .and_then(|ok| match &st.faults.fail_syncs_under {
                    Some(d) if p.starts_with(d) => {
                        Err(sim_err(io::ErrorKind::Other, "sync failed (EIO)"))
                    }
                    _ => Ok(ok),
                });
            if let Ok(false) = synced {
                return Ok(()); // the power went: nothing more becomes durable
            }
            let f = file_mut(st, p)?;
            let (inside, outside) = split_pending(std::mem::take(&mut f.pending), from, to);
            f.pending = outside;
            // After a failed writeback the kernel marks the range's pages clean: what they
            // hold stays readable in the cache but never reaches the disk. Only what is dirty
            // is written: pages a failed sync marked clean are not.
            synced?;
            for w in &inside {
                apply_write(&mut f.durable, w, w.bytes.len());
                f.durable_written = written_after(f.durable_written, w, w.bytes.len());
            }
            Ok(())
        })
    }
}

impl StorageFile for SimHandle {
    fn len(&self) -> io::Result<u64> {
        self.with(|st, p| {
            st.reads += 1;
            Ok(file_mut(st, p)?.live.len() as u64)
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(|st, p| {
            st.reads += 1;
            let f = file_mut(st, p)?;
            let off = offset as usize;
            let end = off
                .checked_add(buf.len())
                .filter(|e| *e <= f.live.len())
                .ok_or_else(|| sim_err(io::ErrorKind::UnexpectedEof, "read past end"))?;
            buf.copy_from_slice(&f.live[off..end]);
            Ok(())
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.with(|st, p| {
            st.count_op()?;
            st.writes += 1;
            if st.faults.fail_write_at == Some(st.writes) {
                return Err(sim_err(io::ErrorKind::Other, "write failed (EIO)"));
            }
            let frozen = st.frozen;
            let f = file_mut(st, p)?;
            let w = PendingWrite {
                offset,
                bytes: buf.to_vec(),
                resize: false,
            };
            apply_write(&mut f.live, &w, buf.len());
            f.live_written = written_after(f.live_written, &w, buf.len());
            if !frozen {
                f.pending.push(w);
            }
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync_range(0, u64::MAX)
    }

    fn drop_cache(&self) -> io::Result<()> {
        self.with(|st, p| {
            let f = file_mut(st, p)?;
            let mut img = f.durable.clone();
            let mut written = f.durable_written;
            for w in &f.pending {
                apply_write(&mut img, w, w.bytes.len());
                written = written_after(written, w, w.bytes.len());
            }
            f.live = img;
            f.live_written = written;
            Ok(())
        })
    }

    /// As a file system answers from its extents: past the last written byte of the image a
    /// read sees (allocated space never written is a hole), rounded up to a 4 KiB block.
    fn data_end(&self) -> io::Result<u64> {
        self.with(|st, p| {
            let f = file_mut(st, p)?;
            let len = f.live.len() as u64;
            Ok(f.live_written.next_multiple_of(4096).min(len))
        })
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.with(|st, p| {
            st.count_op()?;
            let used: u64 = st.files.values().map(|f| f.allocated).sum();
            let cur = file_mut(st, p)?.allocated;
            if let Some(max) = st.faults.space_bytes_max {
                if len > cur && used + (len - cur) > max {
                    return Err(io::Error::from_raw_os_error(28)); // ENOSPC
                }
            }
            let frozen = st.frozen;
            let f = file_mut(st, p)?;
            f.allocated = f.allocated.max(len);
            if (f.live.len() as u64) < len {
                resize(f, len, frozen);
            }
            Ok(())
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(|st, p| {
            st.count_op()?;
            let frozen = st.frozen;
            let f = file_mut(st, p)?;
            resize(f, len, frozen);
            f.allocated = f.allocated.min(len);
            Ok(())
        })
    }

    fn map(&self, len: u64) -> io::Result<Box<dyn MappedFile>> {
        let actual = self.len()?;
        if actual < len {
            let why = format!("file is {actual} bytes, expected at least {len}: refusing to map");
            return Err(sim_err(io::ErrorKind::InvalidData, &why));
        }
        if !self.writable {
            let why = "file is not open for writing: refusing to map";
            return Err(sim_err(io::ErrorKind::PermissionDenied, why));
        }
        Ok(Box::new(SimMap {
            file: self.clone(),
            len,
        }))
    }
}

/// A simulated map: reads and writes go to the file's live image (counted and failed like any
/// write), and `flush_range` makes durable only what was written inside its range.
#[derive(Debug)]
pub(crate) struct SimMap {
    file: SimHandle,
    len: u64,
}

impl MappedFile for SimMap {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_in(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_at(buf, offset)
    }
    fn write_in(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_at(buf, offset)
    }
    fn flush_in(&self, offset: u64, end: u64) -> io::Result<()> {
        self.file.sync_range(offset, end)
    }
}

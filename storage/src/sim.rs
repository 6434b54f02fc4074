//! [`SimStorage`]: an in-memory disk for crash tests. It counts syncs, keeps a *live* image
//! (what a process sees) and a *durable* image (what survives a power loss) of every file and
//! directory entry, can freeze durability at the n-th sync, fail the n-th write or sync, run
//! out of space, and produce the disk a restart would find after a process crash or a power
//! loss (unsynced writes dropped, or a prefix of them kept with the last one torn). A mapped
//! file's `flush_range` makes durable only the writes in its range, as `msync` does: what was
//! written outside every flushed range is lost to a power loss like any unsynced write. It
//! never touches the real file system.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::seam::{MappedFile, OpenMode, Storage, StorageFile, StorageFs};

mod tree;
use tree::{settled_by, Linked, SimDir};

/// What a simulated crash keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// `kill -9`: everything written stays readable (the page cache survives the process),
    /// and what was not synced is still not durable: a later power loss can take it.
    Process,
    /// Power loss: only what was synced stays.
    PowerDrop,
    /// Power loss where the disk wrote a prefix of the unsynced writes of each file, the last
    /// of them torn at a byte boundary chosen by `seed`.
    PowerTear { seed: u64 },
}

#[derive(Clone, Debug, Default)]
struct SimFile {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Writes (offset, bytes) and resizes (offset = len, bytes empty, `resize` true) since the
    /// last sync of this file, in order.
    pending: Vec<PendingWrite>,
    live_linked: bool,
    durable_linked: bool,
    /// After a rename or re-creation over an entry whose new name is not yet durable: the
    /// content a power loss brings back under this path (the old inode's durable bytes).
    prior: Option<Vec<u8>>,
    allocated: u64,
    /// Moved or removed with its directory: the directory whose sync settles this entry
    /// (`tree.rs`); its parent's when `None`.
    via: Option<PathBuf>,
}

impl Linked for SimFile {
    fn live(&self) -> bool {
        self.live_linked
    }

    fn unlink(&mut self, via: Option<PathBuf>) {
        self.live_linked = false;
        self.via = via;
    }

    fn move_over(self, dst: &mut SimFile, via: Option<PathBuf>) {
        let prior = if dst.durable_linked {
            Some(dst.durable.clone())
        } else {
            dst.prior.take()
        };
        *dst = SimFile {
            live_linked: true,
            durable_linked: false,
            prior,
            via,
            ..self
        };
    }
}

#[derive(Clone, Debug)]
struct PendingWrite {
    offset: u64,
    bytes: Vec<u8>,
    resize: bool,
}

/// Knobs a crash test turns on a [`SimStorage`].
#[derive(Clone, Debug, Default)]
pub struct SimFaults {
    /// After this many successful `sync_data`/`sync_dir` calls, further syncs report success
    /// but make nothing durable: the power went at that instant.
    pub freeze_after_syncs: Option<u64>,
    /// The n-th write (1-based) fails with EIO.
    pub fail_write_at: Option<u64>,
    /// The n-th sync (1-based) fails with EIO.
    pub fail_sync_at: Option<u64>,
    /// Total bytes `allocate` may reserve across all files; past it, ENOSPC.
    pub space_bytes_max: Option<u64>,
    /// Every file `sync_data` takes this long (outside the disk's lock), as on a real disk:
    /// where syncs cost nothing, concurrent writers rarely overlap and group commit cannot
    /// be seen.
    pub sync_latency: Option<std::time::Duration>,
    /// Every file sync (`sync_data`, a range flush) of a file under this path fails with EIO,
    /// whichever thread makes it: a test aims a failure at one log, not at a count of syncs
    /// that threads running at once may reorder.
    pub fail_syncs_under: Option<PathBuf>,
    /// The process stops after this many changing calls (creations, writes, resizes, syncs,
    /// renames, removals): every later one fails and changes nothing. With
    /// [`SimStorage::op_count`], a schedule crashes at every seam call.
    pub stop_after_ops: Option<u64>,
}

#[derive(Debug, Default)]
struct SimState {
    files: BTreeMap<PathBuf, SimFile>,
    /// Directories made or moved (`tree.rs`); files do not need them.
    dirs: BTreeMap<PathBuf, SimDir>,
    syncs: u64,
    /// Changing calls so far ([`SimFaults::stop_after_ops`]).
    ops: u64,
    /// The power went (a sync past `freeze_after_syncs`): nothing written from now on can
    /// reach the disk, so later writes change the live image only, never the pending ones a
    /// torn power loss may keep.
    frozen: bool,
    /// The files as they were when the power went (the first sync past the limit): what a
    /// client could have read before the cut.
    at_freeze: Option<BTreeMap<PathBuf, SimFile>>,
    writes: u64,
    faults: SimFaults,
}

impl SimState {
    /// One changing call ([`SimFaults::stop_after_ops`]).
    fn count_op(&mut self) -> io::Result<()> {
        tree::count_op(&mut self.ops, self.faults.stop_after_ops)
    }
}

/// An in-memory disk with separate live and durable images. Cheap to clone (shared state).
#[derive(Clone, Debug, Default)]
pub struct SimStorage {
    state: Arc<Mutex<SimState>>,
}

fn sim_err(kind: io::ErrorKind, what: &str) -> io::Error {
    io::Error::new(kind, format!("simulated: {what}"))
}

impl SimStorage {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic in another test thread must not hide this disk's contents.
        crate::mutex::lock(&self.state)
    }

    pub fn set_faults(&self, faults: SimFaults) {
        self.lock().faults = faults;
    }

    /// Successful syncs (file and directory) so far.
    pub fn sync_count(&self) -> u64 {
        self.lock().syncs
    }

    /// Writes so far.
    pub fn write_count(&self) -> u64 {
        self.lock().writes
    }

    /// Changing calls so far (see [`SimFaults::stop_after_ops`]).
    pub fn op_count(&self) -> u64 {
        self.lock().ops
    }

    /// The disk a restarted process finds after `mode`. Counters and faults start afresh.
    pub fn crash(&self, mode: CrashMode) -> SimStorage {
        let st = self.lock();
        if mode == CrashMode::Process {
            // The page cache outlives the process: what was written stays readable, and what
            // was not synced is still not durable (a later power loss can take it).
            return SimStorage {
                state: Arc::new(Mutex::new(SimState {
                    files: st.files.clone(),
                    dirs: st.dirs.clone(),
                    ..SimState::default()
                })),
            };
        }
        let mut files = BTreeMap::new();
        let mut rng = match mode {
            CrashMode::PowerTear { seed } => SplitMix(seed),
            _ => SplitMix(0),
        };
        for (path, f) in &st.files {
            let (linked, content) = power_image(f, mode, &mut rng);
            if linked {
                files.insert(
                    path.clone(),
                    SimFile {
                        live: content.clone(),
                        durable: content,
                        pending: Vec::new(),
                        live_linked: true,
                        durable_linked: true,
                        prior: None,
                        allocated: f.allocated,
                        via: None,
                    },
                );
            }
        }
        let dirs = st
            .dirs
            .iter()
            .filter(|(_, d)| d.durable)
            .map(|(p, _)| {
                (
                    p.clone(),
                    SimDir {
                        live: true,
                        durable: true,
                        via: None,
                    },
                )
            })
            .collect();
        SimStorage {
            state: Arc::new(Mutex::new(SimState {
                files,
                dirs,
                ..SimState::default()
            })),
        }
    }

    /// The live content of a file at the instant the power went (`freeze_after_syncs`), or
    /// now if it has not: what a reader could have seen before the cut.
    pub fn file_bytes_at_freeze(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.lock();
        let files = st.at_freeze.as_ref().unwrap_or(&st.files);
        files
            .get(path)
            .filter(|f| f.live_linked)
            .map(|f| f.live.clone())
    }

    /// The live content of a file, for tests that damage or inspect bytes.
    pub fn file_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        self.lock()
            .files
            .get(path)
            .filter(|f| f.live_linked)
            .map(|f| f.live.clone())
    }

    /// Replaces a file's content in both images (a test planting damage on a quiet disk).
    pub fn put_file_bytes(&self, path: &Path, bytes: Vec<u8>) {
        let mut st = self.lock();
        let f = st.files.entry(path.to_path_buf()).or_default();
        f.live = bytes.clone();
        f.durable = bytes;
        f.pending.clear();
        f.live_linked = true;
        f.durable_linked = true;
    }

    /// Every live file path.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.lock()
            .files
            .iter()
            .filter(|(_, f)| f.live_linked)
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn count_sync(st: &mut SimState) -> io::Result<bool> {
        let n = st.syncs + 1;
        if st.faults.fail_sync_at == Some(n) {
            st.syncs = n;
            return Err(sim_err(io::ErrorKind::Other, "sync failed (EIO)"));
        }
        st.syncs = n;
        if !st.frozen && st.faults.freeze_after_syncs.is_some_and(|f| n > f) {
            st.frozen = true;
            st.at_freeze = Some(st.files.clone());
        }
        Ok(!st.frozen)
    }
}

/// Resizes the live image to `len`; the resize is pending (a power loss may or may not keep
/// it) unless the power already went.
fn resize(f: &mut SimFile, len: u64, frozen: bool) {
    let w = PendingWrite {
        offset: len,
        bytes: Vec::new(),
        resize: true,
    };
    apply_write(&mut f.live, &w, 0);
    if !frozen {
        f.pending.push(w);
    }
}

fn apply_write(img: &mut Vec<u8>, w: &PendingWrite, n: usize) {
    if w.resize {
        img.resize(w.offset as usize, 0);
        return;
    }
    let off = w.offset as usize;
    if img.len() < off + n {
        img.resize(off + n, 0);
    }
    img[off..off + n].copy_from_slice(&w.bytes[..n]);
}

/// A tiny deterministic generator (SplitMix64) so torn crashes replay from a seed.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform-ish in `[0, n)`; 0 when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.count_op()?;
        tree::create_dirs(&mut st.dirs, dir);
        Ok(())
    }

    fn remove_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.count_op()?;
        match st.files.get_mut(path) {
            Some(f) if f.live_linked => f.live_linked = false,
            _ => {
                let st = &mut *st;
                tree::remove_tree(&mut st.files, &mut st.dirs, path)
            }
        }
        Ok(())
    }

    fn list_dirs(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.lock();
        Ok(tree::list_dirs(&st.files, &st.dirs, dir))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let st = self.lock();
        Ok(tree::exists(&st.files, &st.dirs, path))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.lock();
        Ok(st
            .files
            .iter()
            .filter(|(p, f)| f.live_linked && p.parent() == Some(dir))
            .filter_map(|(p, _)| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
            .collect())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut st = self.lock();
        if matches!(mode, OpenMode::CreateNew | OpenMode::CreateNewPrivate) {
            st.count_op()?;
        }
        let exists = st.files.get(path).is_some_and(|f| f.live_linked);
        match mode {
            OpenMode::CreateNew | OpenMode::CreateNewPrivate if exists => {
                return Err(sim_err(io::ErrorKind::AlreadyExists, "file exists"))
            }
            OpenMode::CreateNew | OpenMode::CreateNewPrivate => {
                let f = st.files.entry(path.to_path_buf()).or_default();
                if f.durable_linked {
                    f.prior = Some(f.durable.clone());
                    f.durable_linked = false;
                    f.durable = Vec::new();
                }
                // A new inode: whatever a durable-but-unlinked old entry held is gone for the
                // live image; the durable image keeps the old file until the directory syncs.
                f.live = Vec::new();
                f.pending.clear();
                f.pending.push(PendingWrite {
                    offset: 0,
                    bytes: Vec::new(),
                    resize: true,
                });
                f.live_linked = true;
                f.allocated = 0;
                f.via = None;
            }
            _ if !exists => return Err(sim_err(io::ErrorKind::NotFound, "no such file")),
            _ => {}
        }
        Ok(Box::new(SimHandle {
            disk: self.clone(),
            path: path.to_path_buf(),
            writable: mode != OpenMode::Read,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.count_op()?;
        match st.files.get_mut(path) {
            Some(f) if f.live_linked => {
                f.live_linked = false;
                Ok(())
            }
            _ => Err(sim_err(io::ErrorKind::NotFound, "no such file")),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.count_op()?;
        let src = match st.files.get_mut(from) {
            Some(f) if f.live_linked => {
                f.live_linked = false;
                f.clone()
            }
            _ => {
                let st = &mut *st;
                return tree::rename_dir(&mut st.files, &mut st.dirs, from, to);
            }
        };
        // The target entry now names the source's inode. Until the directory is synced the
        // durable image still has the old target (if any); its durable content is kept.
        let dst = st.files.entry(to.to_path_buf()).or_default();
        let prior = if dst.durable_linked {
            Some(dst.durable.clone())
        } else {
            dst.prior.take()
        };
        *dst = src;
        dst.live_linked = true;
        dst.durable_linked = false;
        dst.prior = prior;
        dst.via = None;
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.count_op()?;
        if !SimStorage::count_sync(&mut st)? {
            return Ok(());
        }
        st.files.retain(|p, f| {
            if settled_by(p, f.via.as_deref(), dir) {
                f.durable_linked = f.live_linked;
                f.prior = None;
                f.via = None;
            }
            f.live_linked || f.durable_linked || f.prior.is_some()
        });
        st.dirs.retain(|p, d| {
            if settled_by(p, d.via.as_deref(), dir) {
                d.durable = d.live;
                d.via = None;
            }
            d.live || d.durable
        });
        Ok(())
    }

    fn open_fs(&self, dir: &Path) -> io::Result<Box<dyn StorageFs>> {
        Ok(Box::new(SimFs {
            disk: self.clone(),
            dir: dir.to_path_buf(),
        }))
    }
}

/// The simulated `syncfs` makes durable only what callers may rely on: the data of the files
/// in the handle's directory (not their names, not files elsewhere). Its directory fsync is
/// the disk's own.
#[derive(Debug)]
struct SimFs {
    disk: SimStorage,
    dir: PathBuf,
}

impl StorageFs for SimFs {
    fn sync_fs(&self) -> io::Result<()> {
        let mut st = self.disk.lock();
        st.count_op()?;
        if !SimStorage::count_sync(&mut st)? {
            return Ok(());
        }
        for (p, f) in st.files.iter_mut() {
            if f.live_linked && p.parent() == Some(self.dir.as_path()) {
                f.durable = f.live.clone();
                f.pending.clear();
            }
        }
        Ok(())
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.disk.sync_dir(&self.dir)
    }
}

#[derive(Clone, Debug)]
struct SimHandle {
    disk: SimStorage,
    path: PathBuf,
    /// Opened for writing: only such a handle may be mapped, as on the real disk.
    writable: bool,
}

impl SimHandle {
    fn with<R>(&self, f: impl FnOnce(&mut SimState, &PathBuf) -> io::Result<R>) -> io::Result<R> {
        let mut st = self.disk.lock();
        f(&mut st, &self.path)
    }
}

impl SimHandle {
    /// `fdatasync` (the whole file) or `msync` of a mapped range: counts as one sync, makes
    /// the pending writes' bytes inside `[from, to)` durable and keeps the rest pending. A
    /// pending resize is the metadata a read of the data needs, so any sync takes it.
    fn sync_range(&self, from: u64, to: u64) -> io::Result<()> {
        let latency = self.disk.lock().faults.sync_latency;
        if let Some(d) = latency {
            std::thread::sleep(d);
        }
        self.with(|st, p| {
            st.count_op()?;
            let synced =
                SimStorage::count_sync(st).and_then(|ok| match &st.faults.fail_syncs_under {
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
            }
            Ok(())
        })
    }
}

/// Splits pending writes at `[from, to)`: the pieces inside (and every resize), and the
/// pieces outside, each list in write order. A write is first cut at every later shrink:
/// a truncate drops the dirty pages past its length, so those bytes can never reach the
/// disk after it, and the resize (taken by any sync) must not be followed by them.
fn split_pending(
    pending: Vec<PendingWrite>,
    from: u64,
    to: u64,
) -> (Vec<PendingWrite>, Vec<PendingWrite>) {
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for w in cut_at_later_shrinks(pending) {
        let end = w.offset + w.bytes.len() as u64;
        if w.resize || (w.offset >= from && end <= to) {
            inside.push(w);
            continue;
        }
        let piece = |a: u64, b: u64| PendingWrite {
            offset: a,
            bytes: w.bytes[(a - w.offset) as usize..(b - w.offset) as usize].to_vec(),
            resize: false,
        };
        let (lo, hi) = (w.offset.max(from), end.min(to));
        if lo < hi {
            inside.push(piece(lo, hi));
        }
        if w.offset < from.min(end) {
            outside.push(piece(w.offset, from.min(end)));
        }
        if to.max(w.offset) < end {
            outside.push(piece(to.max(w.offset), end));
        }
    }
    (inside, outside)
}

/// Each pending write cut to the smallest length a later resize gives the file (a write
/// wholly past it goes); resizes are kept as they are.
fn cut_at_later_shrinks(pending: Vec<PendingWrite>) -> Vec<PendingWrite> {
    let mut limit = u64::MAX;
    let mut kept: Vec<PendingWrite> = Vec::with_capacity(pending.len());
    for mut w in pending.into_iter().rev() {
        if w.resize {
            limit = limit.min(w.offset);
        } else if w.offset >= limit {
            continue;
        } else {
            let room = usize::try_from(limit - w.offset).unwrap_or(usize::MAX);
            w.bytes.truncate(room);
        }
        kept.push(w);
    }
    kept.reverse();
    kept
}

fn file_mut<'a>(st: &'a mut SimState, path: &Path) -> io::Result<&'a mut SimFile> {
    st.files
        .get_mut(path)
        .ok_or_else(|| sim_err(io::ErrorKind::NotFound, "file vanished"))
}

impl StorageFile for SimHandle {
    fn len(&self) -> io::Result<u64> {
        self.with(|st, p| Ok(file_mut(st, p)?.live.len() as u64))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(|st, p| {
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
            for w in &f.pending {
                apply_write(&mut img, w, w.bytes.len());
            }
            f.live = img;
            Ok(())
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
struct SimMap {
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

/// What a power loss of `mode` leaves of file `f`: whether it is linked, and its content.
fn power_image(f: &SimFile, mode: CrashMode, rng: &mut SplitMix) -> (bool, Vec<u8>) {
    match mode {
        CrashMode::Process => (f.live_linked, f.live.clone()),
        CrashMode::PowerDrop | CrashMode::PowerTear { .. } if !f.durable_linked => match &f.prior {
            Some(p) => (true, p.clone()),
            None => (false, Vec::new()),
        },
        CrashMode::PowerDrop => (f.durable_linked, f.durable.clone()),
        CrashMode::PowerTear { .. } => {
            let mut img = f.durable.clone();
            let keep = rng.below(f.pending.len() as u64 + 1) as usize;
            for (i, w) in f.pending.iter().take(keep).enumerate() {
                let torn = i + 1 == keep && !w.resize && !w.bytes.is_empty();
                let n = if torn {
                    rng.below(w.bytes.len() as u64 + 1) as usize
                } else {
                    w.bytes.len()
                };
                apply_write(&mut img, w, n);
            }
            (f.durable_linked, img)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the simulated disk keeps unsynced writes across a process crash and drops them on
    /// a power loss, and a new file is gone after power loss until its directory is synced.
    #[test]
    fn sim_disk_separates_live_and_durable() {
        let d = SimStorage::new();
        let dir = Path::new("/d");
        let p = dir.join("a");
        let f = d.open(&p, OpenMode::CreateNew).unwrap();
        f.write_at(b"hello", 0).unwrap();
        f.sync_data().unwrap();
        assert!(
            d.crash(CrashMode::PowerDrop).file_bytes(&p).is_none(),
            "dir not synced"
        );
        d.sync_dir(dir).unwrap();
        f.write_at(b" world", 5).unwrap();
        assert_eq!(
            d.crash(CrashMode::Process).file_bytes(&p).unwrap(),
            b"hello world"
        );
        assert_eq!(
            d.crash(CrashMode::PowerDrop).file_bytes(&p).unwrap(),
            b"hello"
        );
        let torn = d
            .crash(CrashMode::PowerTear { seed: 7 })
            .file_bytes(&p)
            .unwrap();
        assert!(b"hello world".starts_with(&torn[..]) && torn.len() >= 5);
        assert_eq!(d.sync_count(), 2);
    }

    /// Goal: a rename is durable only once the directory is synced; before that a power loss
    /// brings back the old name and the old target.
    #[test]
    fn rename_needs_dir_sync() {
        let d = SimStorage::new();
        let dir = Path::new("/d");
        let (a, b) = (dir.join("a"), dir.join("b"));
        for (p, body) in [(&a, b"new"), (&b, b"old")] {
            let f = d.open(p, OpenMode::CreateNew).unwrap();
            f.write_at(body, 0).unwrap();
            f.sync_data().unwrap();
        }
        d.sync_dir(dir).unwrap();
        d.rename(&a, &b).unwrap();
        let lost = d.crash(CrashMode::PowerDrop);
        assert_eq!(lost.file_bytes(&b).unwrap(), b"old");
        assert_eq!(lost.file_bytes(&a).unwrap(), b"new");
        d.sync_dir(dir).unwrap();
        let kept = d.crash(CrashMode::PowerDrop);
        assert_eq!(kept.file_bytes(&b).unwrap(), b"new");
        assert!(kept.file_bytes(&a).is_none());
    }

    /// Goal: freezing at the n-th sync keeps exactly what was durable at that sync.
    #[test]
    fn freeze_stops_durability() {
        let d = SimStorage::new();
        d.set_faults(SimFaults {
            freeze_after_syncs: Some(2),
            ..SimFaults::default()
        });
        let dir = Path::new("/d");
        let p = dir.join("a");
        let f = d.open(&p, OpenMode::CreateNew).unwrap();
        d.sync_dir(dir).unwrap();
        f.write_at(b"one", 0).unwrap();
        f.sync_data().unwrap();
        f.write_at(b"two", 3).unwrap();
        f.sync_data().unwrap();
        assert_eq!(
            d.crash(CrashMode::PowerDrop).file_bytes(&p).unwrap(),
            b"one"
        );
    }

    /// A mapped file of `len` zeros, durable (name and size) on `d`, at /d/m.
    fn durable_map(d: &SimStorage, len: u64) -> (PathBuf, Box<dyn MappedFile>) {
        let p = Path::new("/d").join("m");
        let f = d.open(&p, OpenMode::CreateNew).unwrap();
        f.allocate(len).unwrap();
        f.sync_data().unwrap();
        d.sync_dir(Path::new("/d")).unwrap();
        let m = f.map(len).unwrap();
        (p, m)
    }

    /// Goal: `flush_range` makes durable exactly the bytes of its range, as `msync` does: a
    /// power loss keeps them and loses what was written outside it (one write straddling the
    /// range included), while a process crash keeps every write.
    #[test]
    fn range_flush_keeps_exactly_the_flushed_range_across_a_power_loss() {
        let d = SimStorage::new();
        let (p, m) = durable_map(&d, 300);
        m.write_at(&[b'a'; 300], 0).unwrap();
        m.flush_range(100, 50).unwrap();
        m.write_at(b"bbbbbbbbbb", 120).unwrap();
        assert_eq!(d.sync_count(), 3, "a range flush is one sync");
        let mut want = vec![0u8; 300];
        want[100..150].fill(b'a');
        assert_eq!(d.crash(CrashMode::PowerDrop).file_bytes(&p).unwrap(), want);
        let mut live = vec![b'a'; 300];
        live[120..130].fill(b'b');
        assert_eq!(d.crash(CrashMode::Process).file_bytes(&p).unwrap(), live);
        // A torn power loss keeps the flushed range whatever prefix of the rest it keeps (the
        // later write over part of it may or may not have reached the disk).
        for seed in 0..32 {
            let torn = d
                .crash(CrashMode::PowerTear { seed })
                .file_bytes(&p)
                .unwrap();
            assert_eq!(torn.len(), 300, "seed {seed}");
            let kept = |r: std::ops::Range<usize>| torn[r].iter().all(|b| *b == b'a');
            assert!(kept(100..120) && kept(130..150), "seed {seed}: {torn:?}");
            assert!(
                torn[120..130].iter().all(|b| b"ab".contains(b)),
                "seed {seed}"
            );
        }
        // The rest becomes durable with a flush that covers it.
        m.flush_range(0, 300).unwrap();
        assert_eq!(d.crash(CrashMode::PowerDrop).file_bytes(&p).unwrap(), live);
    }

    /// Goal: a write made before a shrinking `set_len` never reaches the disk past the new
    /// length after it, whichever range a later flush covers (Linux drops those dirty pages
    /// at the truncate): a range flush that takes the resize cannot leave the old write
    /// pending to land after it and grow the file again.
    #[test]
    fn a_write_before_a_shrink_never_lands_past_it() {
        let d = SimStorage::new();
        let p = Path::new("/d").join("s");
        let f = d.open(&p, OpenMode::CreateNew).unwrap();
        f.allocate(100).unwrap();
        f.sync_data().unwrap();
        d.sync_dir(Path::new("/d")).unwrap();
        f.write_at(&[7u8; 40], 60).unwrap();
        f.set_len(50).unwrap();
        let m = f.map(50).unwrap();
        m.flush_range(0, 10).unwrap();
        f.sync_data().unwrap();
        let img = d.crash(CrashMode::PowerDrop).file_bytes(&p).unwrap();
        assert_eq!(img, vec![0u8; 50], "a write cut by the truncate came back");
    }

    /// Goal: a failed range flush loses its range for good (the kernel marks those pages
    /// clean) and leaves the writes outside it pending, so a later whole-file sync makes only
    /// them durable; after the freeze a range flush makes nothing durable.
    #[test]
    fn failed_or_frozen_range_flush_makes_nothing_of_its_range_durable() {
        let d = SimStorage::new();
        let (p, m) = durable_map(&d, 64);
        d.set_faults(SimFaults {
            fail_sync_at: Some(3),
            freeze_after_syncs: Some(4),
            ..SimFaults::default()
        });
        m.write_at(&[1u8; 64], 0).unwrap();
        assert!(m.flush_range(0, 32).is_err(), "the third sync fails");
        d.open(&p, OpenMode::ReadWrite)
            .unwrap()
            .sync_data()
            .unwrap();
        let mut want = vec![0u8; 64];
        want[32..].fill(1);
        assert_eq!(d.crash(CrashMode::PowerDrop).file_bytes(&p).unwrap(), want);
        m.write_at(&[2u8; 8], 0).unwrap();
        m.flush_range(0, 8).unwrap(); // the fifth sync: past the freeze
        assert_eq!(d.crash(CrashMode::PowerDrop).file_bytes(&p).unwrap(), want);
        assert_eq!(d.file_bytes(&p).unwrap()[..8], [2u8; 8], "still readable");
    }
}

//! [`SimStorage`]: an in-memory disk for crash tests. It counts syncs, keeps a *live* image
//! (what a process sees) and a *durable* image (what survives a power loss) of every file and
//! directory entry, can freeze durability at the n-th sync, fail the n-th write or sync, run
//! out of space, and produce the disk a restart would find after a process crash or a power
//! loss (unsynced writes dropped, or a prefix of them kept with the last one torn). A mapped
//! file's `flush_range` makes durable only the writes in its range, as `msync` does: what was
//! written outside every flushed range is lost to a power loss like any unsynced write. Its
//! clock ([`Storage::now`]) is manual: time stands still until a test calls
//! [`SimStorage::advance`]. It never touches the real file system.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crate::seam::{OpenMode, Storage, StorageFile, StorageFs};

mod clock;
mod handle;
mod state;
mod tree;
use clock::SimClock;
use handle::SimHandle;
pub use state::SimFaults;
use state::{apply_write, sim_err, written_after, PendingWrite, SimFile, SimState};
use tree::{settled_by, SimDir};

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

/// An in-memory disk with separate live and durable images, and a manual clock. Cheap to
/// clone: a clone is the same disk, with the same clock (advancing one advances both). A
/// crash copy ([`SimStorage::crash`]) is another disk with a clock of its own, started at the
/// time this one shows at the crash: a restart never sees time go back (stamps on the disk
/// stay in the past), and the copies taken from one disk move their time apart.
#[derive(Clone, Debug, Default)]
pub struct SimStorage {
    state: Arc<Mutex<SimState>>,
    clock: Arc<SimClock>,
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

    /// Reads (`read_at`) and length lookups (`len`) of open files so far: the calls a
    /// real disk answers with `pread` and `statx`.
    pub fn read_count(&self) -> u64 {
        self.lock().reads
    }

    /// Changing calls so far (see [`SimFaults::stop_after_ops`]).
    pub fn op_count(&self) -> u64 {
        self.lock().ops
    }

    /// Moves this disk's clock (and its clones') `by` ahead: the only way its time passes.
    /// Whatever decides by the time on this disk (a round due after `tail_round_ms`, a
    /// shard's idle close, a request key's window) sees it at its next reading; nothing that
    /// waits is woken.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// The disk a restarted process finds after `mode`. Counters and faults start afresh;
    /// the clock goes on from the time it shows now, on its own (see [`SimStorage`]).
    pub fn crash(&self, mode: CrashMode) -> SimStorage {
        let st = self.lock();
        let clock = Arc::new(self.clock.copy());
        if mode == CrashMode::Process {
            // The page cache outlives the process: what was written stays readable, and what
            // was not synced is still not durable (a later power loss can take it).
            return SimStorage {
                state: Arc::new(Mutex::new(SimState {
                    files: st.files.clone(),
                    dirs: st.dirs.clone(),
                    ..SimState::default()
                })),
                clock,
            };
        }
        let mut files = BTreeMap::new();
        let mut rng = match mode {
            CrashMode::PowerTear { seed } => SplitMix(seed),
            _ => SplitMix(0),
        };
        for (path, f) in &st.files {
            let (linked, content, written) = power_image(f, mode, &mut rng);
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
                        live_written: written,
                        durable_written: written,
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
            clock,
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
        f.live_written = bytes.len() as u64;
        f.durable_written = bytes.len() as u64;
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
                    f.durable_written = 0;
                }
                // A new inode: whatever a durable-but-unlinked old entry held is gone for the
                // live image; the durable image keeps the old file until the directory syncs.
                f.live = Vec::new();
                f.live_written = 0;
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
        Ok(Box::new(SimHandle::new(
            self.state.clone(),
            path.to_path_buf(),
            mode != OpenMode::Read,
        )))
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
        if !st.count_sync()? {
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

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn system_now(&self) -> SystemTime {
        self.clock.system_now()
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
        if !st.count_sync()? {
            return Ok(());
        }
        for (p, f) in st.files.iter_mut() {
            if f.live_linked && p.parent() == Some(self.dir.as_path()) {
                f.durable = f.live.clone();
                f.durable_written = f.live_written;
                f.pending.clear();
            }
        }
        Ok(())
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.disk.sync_dir(&self.dir)
    }
}

/// What a power loss of `mode` leaves of file `f`: whether it is linked, its content, and how
/// far written bytes reach in it (an older inode brought back counts as written throughout).
fn power_image(f: &SimFile, mode: CrashMode, rng: &mut SplitMix) -> (bool, Vec<u8>, u64) {
    match mode {
        CrashMode::Process => (f.live_linked, f.live.clone(), f.live_written),
        CrashMode::PowerDrop | CrashMode::PowerTear { .. } if !f.durable_linked => match &f.prior {
            Some(p) => (true, p.clone(), p.len() as u64),
            None => (false, Vec::new(), 0),
        },
        CrashMode::PowerDrop => (f.durable_linked, f.durable.clone(), f.durable_written),
        CrashMode::PowerTear { .. } => {
            let mut img = f.durable.clone();
            let mut written = f.durable_written;
            let keep = rng.below(f.pending.len() as u64 + 1) as usize;
            for (i, w) in f.pending.iter().take(keep).enumerate() {
                let torn = i + 1 == keep && !w.resize && !w.bytes.is_empty();
                let n = if torn {
                    rng.below(w.bytes.len() as u64 + 1) as usize
                } else {
                    w.bytes.len()
                };
                apply_write(&mut img, w, n);
                written = written_after(written, w, n);
            }
            (f.durable_linked, img, written)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::MappedFile;

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

    /// Goal: the simulated clock stands still until advanced (a real sleep moves it not at
    /// all), moves its monotonic and wall-clock time together, is shared by a clone, and
    /// goes on in a crash copy from the time shown at the crash, on its own from then on.
    #[test]
    fn the_clock_moves_only_when_advanced() {
        use crate::Clock;
        use std::time::Duration;
        let d = SimStorage::new();
        let (t0, w0) = (d.now(), d.system_now());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            (d.now(), d.system_now()),
            (t0, w0),
            "a real sleep moves nothing"
        );
        let clone = d.clone();
        clone.advance(Duration::from_millis(250));
        assert_eq!(
            d.now() - t0,
            Duration::from_millis(250),
            "a clone shares the clock"
        );
        assert_eq!(
            d.system_now().duration_since(w0).unwrap(),
            Duration::from_millis(250)
        );
        let copy = d.crash(CrashMode::Process);
        assert_eq!(copy.now(), d.now(), "a crash copy starts at the time shown");
        copy.advance(Duration::from_secs(1));
        assert_eq!(
            d.now() - t0,
            Duration::from_millis(250),
            "then goes on alone"
        );
        assert_eq!(d.crash(CrashMode::PowerDrop).now(), d.now());
        let clock = Clock::of(Arc::new(d.clone()));
        assert_eq!(clock.since(t0), Duration::from_millis(250));
        assert_eq!(
            clock.since(d.now() + Duration::from_secs(1)),
            Duration::ZERO
        );
        assert_eq!(
            clock.unix_ms(),
            1_704_067_200_250,
            "the wall clock starts at a fixed time"
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

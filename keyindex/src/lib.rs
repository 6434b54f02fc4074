//! `roost-keyindex`: the request-key index on disk (issue 25). It answers one question
//! without holding the keys in memory: where in the key table might the record of this key
//! be? The answer is a list of `(table lsn, offset)` candidates, newest first; the caller
//! reads each record and compares the key (the index stores hashes, never keys).
//!
//! The index is a list of sorted runs (`run.rs`), each covering a contiguous range of the
//! key table's lsns, oldest first. A checkpoint adds one run for the keys it copied into the
//! table; adjacent runs are merged while the older is less than twice the newer and their
//! sum stays under `run_entries_max`, so a lookup probes O(log) small runs plus one per
//! `run_entries_max` keys. Expiry never looks at a key: the table's stamps never decrease,
//! so a run whose newest stamp left the window is removed whole (at most one run's keys
//! outlive the window on disk, each refused at read by its stamp).
//!
//! In memory: each run's filter (bits per key chosen at build time so that all filters fit
//! `filter_bytes_max`: past it, new runs get fewer bits and lookups read more blocks) and
//! 12 bytes per block of 128 entries. Durability: a run is written to a temporary, synced,
//! renamed, and the directory synced before [`KeyIndex::add_run`] returns; a crash between
//! a merge's rename and its inputs' removal leaves overlapping runs, and open keeps the
//! widest. The index never knows a record format and never syncs the key table.
#![forbid(unsafe_code)]

mod filter;
mod hash;
mod run;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use roost_storage::{install, replace_file, OpenMode, Storage};

pub use filter::{probes_for, BITS_PER_KEY_MAX, FILTER_BLOCK_BYTES};
pub use hash::{key_hash, mix};
pub use run::{Entry, Header, Run, BLOCK_ENTRIES, ENTRY_LEN, HEADER_LEN, VERSION};

/// The seed file: 16 bytes of key, then their CRC-32.
pub const SEED_FILE: &str = "SEED";
const RUN_EXT: &str = "run";

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("key index {op} failed on {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("key index corrupt in {} at offset {offset}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("key index: {0}")]
    Invalid(String),
}

/// A failed step of [`roost_storage::replace_file`] or [`install`], with its op and path.
impl From<roost_storage::ReplaceError> for IndexError {
    fn from(e: roost_storage::ReplaceError) -> Self {
        IndexError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

impl IndexError {
    fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> IndexError {
        let path = path.to_path_buf();
        move |source| IndexError::Io { op, path, source }
    }

    /// Damage on disk (exit "corruption"), as opposed to an I/O failure.
    pub fn is_corruption(&self) -> bool {
        matches!(self, IndexError::Corrupt { .. })
    }
}

/// What a run covers: the key table's lsns, the stamps of its keys, the largest batch lsn.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunMeta {
    pub first_table_lsn: u64,
    pub last_table_lsn: u64,
    pub min_at_ms: u64,
    pub max_at_ms: u64,
    pub max_batch_lsn: u64,
}

impl RunMeta {
    fn joined(&self, newer: &RunMeta) -> RunMeta {
        RunMeta {
            first_table_lsn: self.first_table_lsn,
            last_table_lsn: newer.last_table_lsn,
            min_at_ms: self.min_at_ms.min(newer.min_at_ms),
            max_at_ms: self.max_at_ms.max(newer.max_at_ms),
            max_batch_lsn: self.max_batch_lsn.max(newer.max_batch_lsn),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct IndexOptions {
    /// All runs' filters together stay under this many bytes.
    pub filter_bytes_max: u64,
    /// Runs are not merged past this many entries (expiry's granularity).
    pub run_entries_max: u64,
}

/// Counts for `status` and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub runs: u64,
    pub entries: u64,
    pub filter_bytes: u64,
    pub fence_bytes: u64,
    pub disk_bytes: u64,
    pub merges: u64,
}

#[derive(Debug)]
pub struct KeyIndex {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    seed: (u64, u64),
    opts: IndexOptions,
    /// Oldest first; readers hold the read lock for a whole lookup, so a run replaced under
    /// the write lock has no reader left when its file is removed.
    runs: RwLock<Vec<Arc<Run>>>,
    /// One writer at a time (add, merge, expire). Never taken while `runs` is held: a
    /// writer takes it first and the runs' write lock inside it.
    writing: Mutex<()>,
    /// Merges since open (for status: read without any lock).
    merges: AtomicU64,
}

impl KeyIndex {
    /// Opens (or creates) the index in `dir`: the seed, then every run, temporaries and
    /// runs covered by a wider one (a merge the crash interrupted) removed.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        opts: IndexOptions,
    ) -> Result<KeyIndex, IndexError> {
        storage
            .create_dir_all(dir)
            .map_err(IndexError::io("create", dir))?;
        let names = storage.list(dir).map_err(IndexError::io("list", dir))?;
        for n in names.iter().filter(|n| n.ends_with(".tmp")) {
            let p = dir.join(n);
            storage.remove(&p).map_err(IndexError::io("remove", &p))?;
        }
        let seed = open_seed(storage.as_ref(), dir, &names)?;
        let check = seed_check(seed);
        let mut ranges: Vec<(u64, u64, String)> =
            names.iter().filter_map(|n| parse_name(n)).collect();
        ranges.sort_by_key(|r| (r.0, std::cmp::Reverse(r.1)));
        let mut runs: Vec<Arc<Run>> = Vec::new();
        for (first, last, name) in ranges {
            let path = dir.join(&name);
            if let Some(prev) = runs.last().filter(|r| r.meta().last_table_lsn >= first) {
                if prev.meta().last_table_lsn < last {
                    return Err(IndexError::Corrupt {
                        path,
                        offset: 0,
                        reason: format!("overlaps {} without being inside it", prev.path.display()),
                    });
                }
                // Inside a wider run: the input of a merge a crash interrupted.
                storage
                    .remove(&path)
                    .map_err(IndexError::io("remove", &path))?;
                continue;
            }
            runs.push(Arc::new(Run::open(storage.as_ref(), &path, check)?));
        }
        storage
            .sync_dir(dir)
            .map_err(IndexError::io("fsync", dir))?;
        Ok(KeyIndex {
            storage,
            dir: dir.to_path_buf(),
            seed,
            opts,
            runs: RwLock::new(runs),
            writing: Mutex::new(()),
            merges: AtomicU64::new(0),
        })
    }

    /// Opens an index for reading only (`roost verify`, a running daemon's files): creates,
    /// removes and repairs nothing; runs a wider run covers are skipped, not removed.
    /// `None` when there is no index (no seed file).
    pub fn open_read_only(
        storage: Arc<dyn Storage>,
        dir: &Path,
    ) -> Result<Option<KeyIndex>, IndexError> {
        let Ok(names) = storage.list(dir) else {
            return Ok(None);
        };
        if !names.iter().any(|n| n == SEED_FILE) {
            return Ok(None);
        }
        let seed = open_seed(storage.as_ref(), dir, &names)?;
        let mut ranges: Vec<(u64, u64, String)> =
            names.iter().filter_map(|n| parse_name(n)).collect();
        ranges.sort_by_key(|r| (r.0, std::cmp::Reverse(r.1)));
        let mut runs: Vec<Arc<Run>> = Vec::new();
        for (first, _, name) in ranges {
            if runs
                .last()
                .is_some_and(|r| r.meta().last_table_lsn >= first)
            {
                continue;
            }
            let path = dir.join(&name);
            runs.push(Arc::new(Run::open(
                storage.as_ref(),
                &path,
                seed_check(seed),
            )?));
        }
        Ok(Some(KeyIndex {
            storage,
            dir: dir.to_path_buf(),
            seed,
            opts: IndexOptions {
                filter_bytes_max: 0,
                run_entries_max: 0,
            },
            runs: RwLock::new(runs),
            writing: Mutex::new(()),
            merges: AtomicU64::new(0),
        }))
    }

    /// The hash this index files `key` under.
    pub fn hash(&self, key: &[u8]) -> u64 {
        key_hash(self.seed, key)
    }

    /// Where `key`'s record may be: (table lsn, offset), newest first. Only runs whose
    /// filter admits the hash are read (one or two blocks each).
    pub fn candidates(&self, key: &[u8]) -> Result<Vec<(u64, u64)>, IndexError> {
        let hash = self.hash(key);
        let runs = self.runs.read().unwrap_or_else(|p| p.into_inner());
        let mut found = Vec::new();
        for run in runs.iter().rev() {
            if !run.may_contain(hash) {
                continue;
            }
            let mut here = Vec::new();
            run.find(hash, &mut here)?;
            found.extend(here.iter().rev().map(|e| (e.table_lsn, e.offset)));
        }
        Ok(found)
    }

    /// The table lsn after the newest run's last (where a catch-up starts), or `None` empty.
    pub fn last_table_lsn(&self) -> Option<u64> {
        self.read().last().map(|r| r.meta().last_table_lsn)
    }

    /// The first table lsn any run still names: the key table may drop what is below.
    pub fn first_table_lsn(&self) -> Option<u64> {
        self.read().first().map(|r| r.meta().first_table_lsn)
    }

    /// The newest stamp any run holds (0 when empty): stamps after it must not be older.
    pub fn max_at_ms(&self) -> u64 {
        self.read()
            .iter()
            .map(|r| r.meta().max_at_ms)
            .max()
            .unwrap_or(0)
    }

    /// The largest batch lsn any run holds (0 when empty).
    pub fn max_batch_lsn(&self) -> u64 {
        self.read()
            .iter()
            .map(|r| r.meta().max_batch_lsn)
            .max()
            .unwrap_or(0)
    }

    pub fn stats(&self) -> IndexStats {
        let runs = self.read();
        let mut s = IndexStats {
            runs: runs.len() as u64,
            merges: self.merges.load(Ordering::Relaxed),
            ..IndexStats::default()
        };
        for r in runs.iter() {
            s.entries += r.count();
            s.filter_bytes += r.filter_bytes();
            s.fence_bytes += r.fence_bytes();
            s.disk_bytes += r.file_bytes();
        }
        s
    }

    /// The runs, oldest first (for `verify` and tests).
    pub fn runs(&self) -> Vec<Arc<Run>> {
        self.read().clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Run>>> {
        self.runs.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a run of these entries (any order; sorted here), durable before it returns,
    /// then merges adjacent runs by the size rule. `meta` must follow the newest run's.
    pub fn add_run(&self, mut entries: Vec<Entry>, meta: RunMeta) -> Result<(), IndexError> {
        if entries.is_empty() {
            return Ok(());
        }
        let _w = roost_storage::lock(&self.writing);
        if self
            .last_table_lsn()
            .is_some_and(|l| l >= meta.first_table_lsn)
        {
            return Err(IndexError::Invalid(format!(
                "a run from table lsn {} overlaps the newest run",
                meta.first_table_lsn
            )));
        }
        entries.sort_unstable();
        let n = entries.len() as u64;
        let bits = self.bits_per_key(n, &[]);
        let run = self.write_run(entries.into_iter().map(Ok), n, meta, bits)?;
        self.runs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(run);
        while self.merge_newest()? {
            self.merges.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Bits per key for a new run of `n` entries so that every filter (but those of
    /// `replaced`, which the new run replaces) fits `filter_bytes_max`; 0 for none.
    fn bits_per_key(&self, n: u64, replaced: &[&Arc<Run>]) -> u64 {
        let others: u64 = self
            .read()
            .iter()
            .filter(|r| !replaced.iter().any(|x| Arc::ptr_eq(x, r)))
            .map(|r| r.filter_bytes())
            .sum();
        let room = self.opts.filter_bytes_max.saturating_sub(others);
        (room * 8 / n.max(1)).min(BITS_PER_KEY_MAX)
    }

    /// Writes a run of `n` sorted entries as a temporary, syncs it, renames it into place
    /// and syncs the directory; returns it open.
    fn write_run(
        &self,
        entries: impl Iterator<Item = Result<Entry, IndexError>>,
        n: u64,
        meta: RunMeta,
        bits: u64,
    ) -> Result<Arc<Run>, IndexError> {
        let name = run_name(&meta);
        let (tmp, path) = (self.dir.join(format!(".{name}.tmp")), self.dir.join(&name));
        let header = Header {
            count: n,
            filter_k: probes_for(bits),
            filter_blocks: (n * bits).div_ceil(FILTER_BLOCK_BYTES as u64 * 8),
            seed_check: seed_check(self.seed),
            meta,
        };
        let mut w = run::RunWriter::create(self.storage.as_ref(), &tmp, header)?;
        for e in entries {
            w.push(e?)?;
        }
        w.finish()?;
        let s = self.storage.as_ref();
        install(s, &tmp, &path)?;
        Ok(Arc::new(Run::open(s, &path, seed_check(self.seed))?))
    }

    /// Merges the two newest runs if the older is less than twice the newer and the sum
    /// stays within `run_entries_max`. Returns whether it merged.
    fn merge_newest(&self) -> Result<bool, IndexError> {
        let (a, b) = {
            let runs = self.read();
            let n = runs.len();
            if n < 2 {
                return Ok(false);
            }
            (runs[n - 2].clone(), runs[n - 1].clone())
        };
        let sum = a.count() + b.count();
        if a.count() >= 2 * b.count() || sum > self.opts.run_entries_max {
            return Ok(false);
        }
        let bits = self.bits_per_key(sum, &[&a, &b]);
        let merged = merge_sorted(run::entries(&a), run::entries(&b));
        let run = self.write_run(merged, sum, a.meta().joined(b.meta()), bits)?;
        {
            let mut runs = self.runs.write().unwrap_or_else(|p| p.into_inner());
            let n = runs.len();
            runs.truncate(n - 2);
            runs.push(run);
        }
        self.remove_runs(&[a, b])?;
        Ok(true)
    }

    /// Removes every run whose newest stamp is below `cutoff_ms` (a prefix: stamps never
    /// decrease along the table). Returns (runs, entries) removed.
    pub fn expire(&self, cutoff_ms: u64) -> Result<(usize, u64), IndexError> {
        let _w = roost_storage::lock(&self.writing);
        let gone: Vec<Arc<Run>> = {
            let mut runs = self.runs.write().unwrap_or_else(|p| p.into_inner());
            // A prefix, found by walking (not a binary search): were a stamp ever to go back
            // (a clock stepped back across a crash), a later run still in the window stops
            // the walk instead of being skipped over.
            let k = runs
                .iter()
                .take_while(|r| r.meta().max_at_ms < cutoff_ms)
                .count();
            runs.drain(..k).collect()
        };
        self.remove_runs(&gone)?;
        Ok((gone.len(), gone.iter().map(|r| r.count()).sum()))
    }

    fn remove_runs(&self, gone: &[Arc<Run>]) -> Result<(), IndexError> {
        if gone.is_empty() {
            return Ok(());
        }
        for r in gone {
            self.storage
                .remove(&r.path)
                .map_err(IndexError::io("remove", &r.path))?;
        }
        self.storage
            .sync_dir(&self.dir)
            .map_err(IndexError::io("fsync", &self.dir))
    }
}

/// Two sorted entry streams as one (the older run's entries first among equals).
fn merge_sorted<'a>(
    a: impl Iterator<Item = Result<Entry, IndexError>> + 'a,
    b: impl Iterator<Item = Result<Entry, IndexError>> + 'a,
) -> impl Iterator<Item = Result<Entry, IndexError>> + 'a {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || {
        let take_a = match (a.peek(), b.peek()) {
            (None, None) => return None,
            (Some(_), None) | (Some(Err(_)), _) => true,
            (None, Some(_)) | (_, Some(Err(_))) => false,
            (Some(Ok(x)), Some(Ok(y))) => x <= y,
        };
        if take_a {
            a.next()
        } else {
            b.next()
        }
    })
}

fn run_name(m: &RunMeta) -> String {
    format!(
        "{:020}-{:020}.{RUN_EXT}",
        m.first_table_lsn, m.last_table_lsn
    )
}

/// (first, last, name) of a run file's name, `None` for anything else.
fn parse_name(name: &str) -> Option<(u64, u64, String)> {
    let stem = name.strip_suffix(&format!(".{RUN_EXT}"))?;
    let (a, b) = stem.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?, name.to_owned()))
}

/// A value that names the seed without giving it away: runs record it, so a run sorted
/// under another seed (a file copied between data directories) is refused, not misread.
fn seed_check(seed: (u64, u64)) -> u64 {
    key_hash(seed, b"roost key index seed check")
}

/// The index's seed: read from `SEED`, or made (random, from the OS's hasher keys) and
/// written durably when the index is new. A missing seed beside existing runs is damage.
fn open_seed(
    storage: &dyn Storage,
    dir: &Path,
    names: &[String],
) -> Result<(u64, u64), IndexError> {
    let path = dir.join(SEED_FILE);
    if names.iter().any(|n| n == SEED_FILE) {
        let f = storage
            .open(&path, OpenMode::Read)
            .map_err(IndexError::io("open", &path))?;
        let mut b = [0u8; 20];
        let corrupt = |reason: &str| IndexError::Corrupt {
            path: path.clone(),
            offset: 0,
            reason: reason.into(),
        };
        f.read_at(&mut b, 0)
            .map_err(|_| corrupt("short seed file"))?;
        if crc32fast::hash(&b[..16]).to_le_bytes() != b[16..20] {
            return Err(corrupt("seed checksum mismatch"));
        }
        let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        return Ok((w(0), w(8)));
    }
    if names.iter().any(|n| parse_name(n).is_some()) {
        return Err(IndexError::Corrupt {
            path,
            offset: 0,
            reason: "runs exist but the seed file is missing".into(),
        });
    }
    let seed = random_seed();
    let mut b = Vec::with_capacity(20);
    b.extend_from_slice(&seed.0.to_le_bytes());
    b.extend_from_slice(&seed.1.to_le_bytes());
    b.extend_from_slice(&crc32fast::hash(&b).to_le_bytes());
    let tmp = dir.join(format!(".{SEED_FILE}.tmp"));
    replace_file(storage, &tmp, &path, &b, OpenMode::CreateNew)?;
    Ok(seed)
}

/// 128 random bits from the standard library's per-process random hasher keys.
fn random_seed() -> (u64, u64) {
    use std::hash::{BuildHasher, Hasher};
    let one = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.finish()
    };
    (one(1), one(2))
}

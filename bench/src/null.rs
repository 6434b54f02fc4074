//! The null spool consumers: the ceilings of the spool on a file system. Both do the same file
//! work as roost for every batch (notice `new/NAME`, read it, parse the JSON batch with
//! roost's own parser, write the result as a hidden temporary in `out/` and rename it to
//! `out/NAME`, remove the input) and no store, no log. They differ in what they sync
//! ([`Contract`]):
//!
//! - [`Contract::Nothing`], the null consumer: no sync of any kind, so nothing it answers
//!   survives a power cut. Whatever roost or the SQLite peer do beyond this is the price of
//!   keeping the batch.
//! - [`Contract::Durable`], the durable-null consumer (issue 30): the least roost's result
//!   contract needs (ARCHITECTURE.md, "What is synced": a result file is fdatasynced as a
//!   temporary, renamed, and `out/` fsynced once per round before the client may count on
//!   it, before the input is removed). Each worker fdatasyncs its own temporary (concurrently
//!   with the others), renames it, then joins a round of `out/` ([`DirRounds`]: one fsync
//!   covers every rename made before it started); only then is the input removed, and
//!   `new/` is never synced (as for roost's committed batches). What roost does beyond this
//!   is the price of its store: the WAL claim, shard commits and audit rows.
//! - [`Contract::DurableLog`], the durable-null consumer with a log: the same, and each
//!   batch's bytes appended to a zero-filled log file and covered by a group-committed
//!   fdatasync (one standing thread, as roost's claim sync) before its result is renamed,
//!   that sync running while the worker writes and syncs the result. The least any store
//!   that keeps what it answers adds: what roost does beyond this is the rest of its work
//!   (shards, audit, the key window, its intake's checks), not the log's flush.
//!
//! Arrivals are noticed like roost notices them: inotify names from `new/` (through `notify`),
//! a full listing at start and every [`RESCAN_EVERY`] in case an event was lost. Names go
//! through one bounded channel to `threads` workers.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use notify::Watcher;
use roost::batch::{BatchOp, BatchResult, OpResult};

/// How often `new/` is listed whole (the watcher is a hint, as in roost).
const RESCAN_EVERY: Duration = Duration::from_millis(200);
/// Names queued for the workers at most.
const QUEUE_MAX: usize = 4096;
/// Ops per batch accepted by the parser (roost's default `batch_ops_max`).
const OPS_MAX: u32 = 1_000;

/// Names handed to a worker and not finished yet: a rescan must not hand them out again.
type InFlight = Arc<Mutex<HashSet<String>>>;

/// What a null consumer makes durable (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contract {
    /// Nothing synced.
    Nothing,
    /// Each result fdatasynced before its rename, `out/` fsynced per round before the input
    /// is removed.
    Durable,
    /// [`Contract::Durable`], and each batch's bytes appended to a log and made durable
    /// before its result is renamed: the least any store adds to the result contract ([`Log`]).
    DurableLog,
}

/// A running null consumer on `<dir>/spool`; stopped (threads joined) at drop.
pub struct NullConsumer {
    pub spool: PathBuf,
    stop: Arc<AtomicBool>,
    watcher: Option<notify::RecommendedWatcher>,
    threads: Vec<JoinHandle<()>>,
    /// Files that failed (read, parse, write, rename): reported at drop, never expected.
    errors: Arc<AtomicU64>,
    /// `out/`'s rounds, with [`Contract::Durable`].
    rounds: Option<Arc<DirRounds>>,
    /// The log, with [`Contract::DurableLog`].
    log: Option<Arc<Log>>,
}

/// Sends `name` to the workers unless it is hidden or already in flight. False once the
/// workers are gone.
fn dispatch(tx: &SyncSender<String>, inflight: &InFlight, name: &str) -> bool {
    if name.starts_with('.') {
        return true;
    }
    let fresh = inflight
        .lock()
        .map(|mut s| s.insert(name.to_owned()))
        .unwrap_or(false);
    !fresh || tx.send(name.to_owned()).is_ok()
}

impl NullConsumer {
    pub fn start(dir: &Path, threads: usize, contract: Contract) -> anyhow::Result<NullConsumer> {
        let spool = dir.join("spool");
        for d in ["tmp", "new", "out"] {
            let p = spool.join(d);
            std::fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        }
        let rounds = match contract {
            Contract::Nothing => None,
            Contract::Durable | Contract::DurableLog => {
                Some(Arc::new(DirRounds::open(&spool.join("out"))?))
            }
        };
        let log = match contract {
            Contract::DurableLog => Some(Arc::new(Log::open(&dir.join("log"))?)),
            _ => None,
        };
        let (tx, rx) = mpsc::sync_channel::<String>(QUEUE_MAX);
        let rx = Arc::new(Mutex::new(rx));
        let inflight: InFlight = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(AtomicU64::new(0));
        let ids = Arc::new(AtomicU64::new(1));
        let mut handles = Vec::new();
        for _ in 0..threads.max(1) {
            let (rx, spool, inflight) = (rx.clone(), spool.clone(), inflight.clone());
            let (errors, ids) = (errors.clone(), ids.clone());
            let syncs = Syncs {
                rounds: rounds.clone(),
                log: log.clone(),
            };
            handles.push(std::thread::spawn(move || {
                worker(&rx, &spool, &inflight, &errors, &ids, &syncs)
            }));
        }
        let watcher = watch_new(&spool, tx.clone(), inflight.clone())?;
        let (st, sp) = (stop.clone(), spool.clone());
        handles.push(std::thread::spawn(move || {
            rescanner(&st, &sp, &tx, &inflight)
        }));
        Ok(NullConsumer {
            spool,
            stop,
            watcher: Some(watcher),
            threads: handles,
            errors,
            rounds,
            log,
        })
    }

    /// Log syncs so far, and the records they covered (zeros without a log).
    pub fn log_stats(&self) -> (u64, u64) {
        self.log.as_ref().map_or((0, 0), |l| l.stats())
    }

    /// (`out/` rounds, results published through them) since start; zeros without syncs.
    pub fn round_stats(&self) -> (u64, u64) {
        self.rounds.as_ref().map_or((0, 0), |r| {
            (
                r.rounds.load(Ordering::Relaxed),
                r.joined.load(Ordering::Relaxed),
            )
        })
    }
}

impl Drop for NullConsumer {
    fn drop(&mut self) {
        // The watcher's callback and the rescanner hold the only senders: once both are gone
        // the workers see the channel close and return.
        self.watcher = None;
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..).rev() {
            let _ = t.join();
        }
        let errors = self.errors.load(Ordering::Relaxed);
        if errors > 0 {
            eprintln!("null consumer: {errors} files failed");
        }
    }
}

/// inotify on `new/`: every name created or moved in goes to the workers.
fn watch_new(
    spool: &Path,
    tx: SyncSender<String>,
    inflight: InFlight,
) -> anyhow::Result<notify::RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        if !matches!(
            ev.kind,
            notify::EventKind::Create(_)
                | notify::EventKind::Modify(notify::event::ModifyKind::Name(_))
        ) {
            return;
        }
        for p in ev.paths {
            if let Some(name) = p.file_name().and_then(|n| n.to_str()) {
                dispatch(&tx, &inflight, name);
            }
        }
    })
    .context("inotify watcher")?;
    let new = spool.join("new");
    watcher
        .watch(&new, notify::RecursiveMode::NonRecursive)
        .with_context(|| format!("watch {}", new.display()))?;
    Ok(watcher)
}

/// Lists `new/` at start and every [`RESCAN_EVERY`] until `stop`.
fn rescanner(stop: &AtomicBool, spool: &Path, tx: &SyncSender<String>, inflight: &InFlight) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(rd) = std::fs::read_dir(spool.join("new")) {
            for e in rd.flatten() {
                let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                if !dispatch(tx, inflight, &name) {
                    return;
                }
            }
        }
        std::thread::sleep(RESCAN_EVERY);
    }
}

/// What a worker syncs besides its result: `out/`'s rounds and the log, when its contract
/// has them.
struct Syncs {
    rounds: Option<Arc<DirRounds>>,
    log: Option<Arc<Log>>,
}

fn worker(
    rx: &Mutex<Receiver<String>>,
    spool: &Path,
    inflight: &InFlight,
    errors: &AtomicU64,
    ids: &AtomicU64,
    syncs: &Syncs,
) {
    loop {
        let name = match rx.lock().map(|r| r.recv()) {
            Ok(Ok(n)) => n,
            _ => return,
        };
        if let Err(e) = process(spool, &name, ids, syncs) {
            eprintln!("null consumer: {name}: {e:#}");
            errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut s) = inflight.lock() {
            s.remove(&name);
        }
    }
}

/// One file: read, parse, (with a log: its bytes appended and their sync asked for), result
/// written (and, with `rounds`, fdatasynced), (the log sync awaited), renamed into `out/`
/// (and, with `rounds`, `out/` fsynced by a round), input removed. A name already gone (a
/// late duplicate event) is not an error.
fn process(spool: &Path, name: &str, ids: &AtomicU64, syncs: &Syncs) -> anyhow::Result<()> {
    let rounds = syncs.rounds.as_deref();
    let input = spool.join("new").join(name);
    let bytes = match std::fs::read(&input) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.with_context(|| format!("read {}", input.display()))?,
    };
    let result = answer(&bytes, ids);
    let logged = match &syncs.log {
        Some(log) => Some(log.append(&bytes)?),
        None => None,
    };
    let out = spool.join("out");
    let tmp = out.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(&result.to_json_line())
        .with_context(|| format!("write {}", tmp.display()))?;
    if rounds.is_some() {
        f.sync_data()
            .with_context(|| format!("fdatasync {}", tmp.display()))?;
    }
    drop(f);
    if let Some(synced) = logged {
        let r = synced.recv().context("the log's sync thread is gone")?;
        r.context("fdatasync the log")?;
    }
    std::fs::rename(&tmp, out.join(name)).with_context(|| format!("rename {}", tmp.display()))?;
    if let Some(r) = rounds {
        r.join()
            .with_context(|| format!("fsync {} after {name}", out.display()))?;
    }
    match std::fs::remove_file(&input) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("remove {}", input.display()))
        }
        _ => Ok(()),
    }
}

/// The result roost would give `bytes`: committed with fresh ids, or invalid.
fn answer(bytes: &[u8], ids: &AtomicU64) -> BatchResult {
    match roost::batch::parse(bytes, OPS_MAX) {
        Err(inv) => BatchResult::invalid(&inv),
        Ok(b) => {
            let first = ids.fetch_add(b.ops.len() as u64 + 1, Ordering::Relaxed);
            let ops = b
                .ops
                .iter()
                .zip(first + 1..)
                .map(|(op, id)| OpResult {
                    op: match op {
                        BatchOp::Create { .. } => "create".to_owned(),
                        BatchOp::Delete { .. } => "delete".to_owned(),
                    },
                    shard: op.shard().to_owned(),
                    id,
                })
                .collect();
            BatchResult::Committed {
                request_key: b.request_key,
                lsn: first,
                ops,
            }
        }
    }
}

/// The least log a store keeps: a file zero-filled ahead (so a sync writes data only, as
/// roost's WAL with its zeros ahead), each batch's bytes appended at the next offset (the
/// file is reused from its start once full: nothing is ever read back), and one standing
/// thread that syncs it for every record appended before its fdatasync began (group
/// commit, as roost's claim-sync thread): a worker asks, writes and syncs its result
/// meanwhile, then waits for the answer.
pub(crate) struct Log {
    file: Arc<std::fs::File>,
    path: PathBuf,
    end: AtomicU64,
    /// `None` once dropping (a `SyncSender` is shared without a lock; `Drop` has `&mut`).
    jobs: Option<SyncSender<SyncSender<std::io::Result<()>>>>,
    thread: Option<JoinHandle<()>>,
    syncs: Arc<AtomicU64>,
    records: AtomicU64,
}

/// The log file's size (zero-filled at open).
const LOG_BYTES: u64 = 64 << 20;

impl Log {
    fn open(path: &Path) -> anyhow::Result<Log> {
        let file =
            std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
        let zeros = vec![0u8; 1 << 20];
        for i in 0..LOG_BYTES / zeros.len() as u64 {
            std::os::unix::fs::FileExt::write_all_at(&file, &zeros, i * zeros.len() as u64)
                .with_context(|| format!("zero {}", path.display()))?;
        }
        file.sync_all()
            .with_context(|| format!("fsync {}", path.display()))?;
        let file = Arc::new(file);
        let (tx, rx) = mpsc::sync_channel::<SyncSender<std::io::Result<()>>>(QUEUE_MAX);
        let syncs = Arc::new(AtomicU64::new(0));
        let (f, n) = (file.clone(), syncs.clone());
        let thread = std::thread::spawn(move || log_syncer(&f, &rx, &n));
        Ok(Log {
            file,
            path: path.to_path_buf(),
            end: AtomicU64::new(0),
            jobs: Some(tx),
            thread: Some(thread),
            syncs,
            records: AtomicU64::new(0),
        })
    }

    /// Appends `bytes` and asks for a sync that covers them; the answer comes on the
    /// returned receiver.
    fn append(&self, bytes: &[u8]) -> anyhow::Result<Receiver<std::io::Result<()>>> {
        let len = bytes.len() as u64;
        anyhow::ensure!(
            len < LOG_BYTES,
            "a record of {len} bytes: larger than the log"
        );
        let at = self.end.fetch_add(len, Ordering::Relaxed) % (LOG_BYTES - len);
        std::os::unix::fs::FileExt::write_all_at(&*self.file, bytes, at)
            .with_context(|| format!("append to {}", self.path.display()))?;
        self.records.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = mpsc::sync_channel(1);
        let sent = self.jobs.as_ref().map(|j| j.send(reply));
        anyhow::ensure!(
            matches!(sent, Some(Ok(()))),
            "the log's sync thread is gone"
        );
        Ok(rx)
    }

    /// (fdatasyncs, records appended).
    fn stats(&self) -> (u64, u64) {
        (
            self.syncs.load(Ordering::Relaxed),
            self.records.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The log's sync thread: every ask queued when an fdatasync begins is answered by it.
fn log_syncer(
    file: &std::fs::File,
    rx: &Receiver<SyncSender<std::io::Result<()>>>,
    syncs: &AtomicU64,
) {
    // A failed fdatasync latches, as roost's WAL: what it did not write back may be lost
    // whatever a later sync says.
    let mut failed: Option<(std::io::ErrorKind, String)> = None;
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        if failed.is_none() {
            if let Err(e) = file.sync_data() {
                failed = Some((e.kind(), e.to_string()));
            }
            syncs.fetch_add(1, Ordering::Relaxed);
        }
        for w in waiting {
            let _ = w.send(match &failed {
                None => Ok(()),
                Some((kind, why)) => Err(std::io::Error::new(*kind, why.clone())),
            });
        }
    }
}

/// Group commit of one directory's fsync: a caller that joins after its rename returns once
/// an fsync that started after it joined has succeeded. The first caller to find none running
/// runs one for everyone waiting; a failed fsync latches (never retried), as roost's rounds.
pub(crate) struct DirRounds {
    dir: std::fs::File,
    path: PathBuf,
    st: Mutex<DirState>,
    done: Condvar,
    /// fsyncs of the directory that succeeded.
    pub(crate) rounds: AtomicU64,
    /// Callers covered by them.
    pub(crate) joined: AtomicU64,
}

#[derive(Default)]
struct DirState {
    /// Tickets handed out; every ticket up to `synced_through` is covered by an fsync.
    next: u64,
    synced_through: u64,
    running: bool,
    failed: Option<String>,
}

impl DirRounds {
    pub(crate) fn open(dir: &Path) -> anyhow::Result<DirRounds> {
        let f = std::fs::File::open(dir).with_context(|| format!("open {}", dir.display()))?;
        Ok(DirRounds {
            dir: f,
            path: dir.to_path_buf(),
            st: Mutex::default(),
            done: Condvar::new(),
            rounds: AtomicU64::new(0),
            joined: AtomicU64::new(0),
        })
    }

    /// Returns once the directory has been fsynced after this call began.
    pub(crate) fn join(&self) -> anyhow::Result<()> {
        let lock = || self.st.lock().unwrap_or_else(|p| p.into_inner());
        let mut g = lock();
        g.next += 1;
        let mine = g.next;
        loop {
            if let Some(why) = &g.failed {
                anyhow::bail!("an earlier fsync of {} failed: {why}", self.path.display());
            }
            if g.synced_through >= mine {
                return Ok(());
            }
            if g.running {
                g = self.done.wait(g).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let upto = g.next;
            g.running = true;
            drop(g);
            let r = self.dir.sync_all();
            g = lock();
            g.running = false;
            match r {
                Ok(()) => {
                    let covered = upto - g.synced_through;
                    g.synced_through = upto;
                    self.rounds.fetch_add(1, Ordering::Relaxed);
                    self.joined.fetch_add(covered, Ordering::Relaxed);
                }
                Err(e) => g.failed = Some(e.to_string()),
            }
            self.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::{burst_timed, check_burst, Workload};

    /// A consumer under `contract` on `threads` threads, after a burst of 40 batches of 3
    /// creates whose every result was checked (committed, one id per op).
    fn after_a_burst(contract: Contract, threads: usize) -> (tempfile::TempDir, NullConsumer) {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = NullConsumer::start(dir.path(), threads, contract).expect("start");
        let w = Workload {
            ops: 3,
            record_bytes: 50,
        };
        let b = burst_timed(&n.spool, 40, &w).expect("burst");
        check_burst(&n.spool, &b, w.ops).expect("every result");
        (dir, n)
    }

    /// How many inputs are left in `new/` once none is, or after 10 s: a result is
    /// visible at its rename, and the consumers remove its input after it.
    fn inputs_left(n: &NullConsumer) -> usize {
        let left = || {
            std::fs::read_dir(n.spool.join("new"))
                .expect("new/")
                .count()
        };
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while left() > 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        left()
    }

    /// The ceiling is only a ceiling if it does the work: every file of a burst gets a
    /// committed result with one id per op, and `new/` ends empty.
    #[test]
    fn null_consumer_answers_every_file_of_a_burst() {
        let (_dir, n) = after_a_burst(Contract::Nothing, 2);
        assert_eq!(inputs_left(&n), 0, "inputs removed");
        drop(n);
    }

    /// The durable-null does the same work, and every result went through an `out/` round
    /// (its fsync) before its input was removed.
    #[test]
    fn durable_null_consumer_puts_every_result_through_a_round() {
        let (_dir, n) = after_a_burst(Contract::Durable, 8);
        // A result is visible at its rename, before its round: the inputs go after it.
        assert_eq!(inputs_left(&n), 0, "inputs removed");
        let (rounds, joined) = n.round_stats();
        assert_eq!(
            joined, 40,
            "every result joined a round before its input went"
        );
        assert!((1..=40).contains(&rounds), "{rounds} rounds");
        let hidden = std::fs::read_dir(n.spool.join("out"))
            .expect("out/")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .count();
        assert_eq!(hidden, 0, "no temporary left");
        drop(n);
    }

    /// The log adds its work to the durable-null's: every batch's bytes are appended and
    /// covered by a log sync (shared by the batches waiting together) before its result.
    #[test]
    fn durable_null_log_consumer_logs_every_batch() {
        let (dir, n) = after_a_burst(Contract::DurableLog, 8);
        let (syncs, records) = n.log_stats();
        assert_eq!(records, 40, "one record per batch");
        assert!((1..=40).contains(&syncs), "{syncs} log syncs");
        let log = std::fs::read(dir.path().join("log")).expect("log");
        let logged = log.windows(13).filter(|w| w == b"\"request_key\"").count();
        assert_eq!(logged, 40, "every batch's bytes in the log");
        drop(n);
    }
}

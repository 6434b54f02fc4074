//! The null spool consumer: the ceiling of the spool on a file system. It does the same file
//! work as roost for every batch (notices `new/NAME`, reads it, parses the JSON batch with
//! roost's own parser, writes the result as a hidden temporary in `out/` and renames it to
//! `out/NAME`, removes the input) and nothing else: no store, no log, no sync of any kind, so
//! nothing it answers survives a power cut. Whatever roost or the SQLite peer do beyond this
//! is the price of keeping the batch.
//!
//! Arrivals are noticed like roost notices them: inotify names from `new/` (through `notify`),
//! a full listing at start and every [`RESCAN_EVERY`] in case an event was lost. Names go
//! through one bounded channel to `threads` workers.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
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

/// A running null consumer on `<dir>/spool`; stopped (threads joined) at drop.
pub struct NullConsumer {
    pub spool: PathBuf,
    stop: Arc<AtomicBool>,
    watcher: Option<notify::RecommendedWatcher>,
    threads: Vec<JoinHandle<()>>,
    /// Files that failed (read, parse, write, rename): reported at drop, never expected.
    errors: Arc<AtomicU64>,
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
    pub fn start(dir: &Path, threads: usize) -> anyhow::Result<NullConsumer> {
        let spool = dir.join("spool");
        for d in ["tmp", "new", "out"] {
            let p = spool.join(d);
            std::fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        }
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
            handles.push(std::thread::spawn(move || {
                worker(&rx, &spool, &inflight, &errors, &ids)
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

fn worker(
    rx: &Mutex<Receiver<String>>,
    spool: &Path,
    inflight: &InFlight,
    errors: &AtomicU64,
    ids: &AtomicU64,
) {
    loop {
        let name = match rx.lock().map(|r| r.recv()) {
            Ok(Ok(n)) => n,
            _ => return,
        };
        if let Err(e) = process(spool, &name, ids) {
            eprintln!("null consumer: {name}: {e:#}");
            errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut s) = inflight.lock() {
            s.remove(&name);
        }
    }
}

/// One file: read, parse, result written and renamed into `out/`, input removed. A name
/// already gone (a late duplicate event) is not an error.
fn process(spool: &Path, name: &str, ids: &AtomicU64) -> anyhow::Result<()> {
    let input = spool.join("new").join(name);
    let bytes = match std::fs::read(&input) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.with_context(|| format!("read {}", input.display()))?,
    };
    let result = match roost::batch::parse(&bytes, OPS_MAX) {
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
    };
    let out = spool.join("out");
    let tmp = out.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(&result.to_json_line())
        .with_context(|| format!("write {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, out.join(name)).with_context(|| format!("rename {}", tmp.display()))?;
    match std::fs::remove_file(&input) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("remove {}", input.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::{burst_timed, check_burst, Workload};

    /// The ceiling is only a ceiling if it does the work: every file of a burst gets a
    /// committed result with one id per op, and `new/` ends empty.
    #[test]
    fn null_consumer_answers_every_file_of_a_burst() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = NullConsumer::start(dir.path(), 2).expect("start");
        let w = Workload {
            ops: 3,
            record_bytes: 50,
        };
        let b = burst_timed(&n.spool, 40, &w).expect("burst");
        check_burst(&n.spool, &b, w.ops).expect("every result");
        let left = std::fs::read_dir(n.spool.join("new"))
            .expect("new/")
            .count();
        assert_eq!(left, 0, "inputs removed");
        drop(n);
    }
}

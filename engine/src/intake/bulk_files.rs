//! A bulk file (`new/NAME.jsonl`, `bulk_lines.rs`) to its result: read whole with the same
//! safe reader as a batch file (under `bulk_file_bytes_max`), the line limit checked before
//! any line is planned, then the lines in groups of `bulk_group_lines` through
//! [`Engine::submit`], answers returned (one planner pass, one WAL fdatasync, one flush per
//! shard and one audit sync per group), `bulk_in_flight` lines at once (a thread per group), then
//! `out/NAME` with one result line per batch line, in line order, and only then the input
//! removed ([`Engine::answer_file`]).
//!
//! At most `bulk_files_in_flight_max` bulk files are worked on at once (each is read whole),
//! holding at most `intake_bytes_max` bytes of input together (`pipeline/intake_bytes.rs`):
//! one more waits in `new/` and is handed back to the loop as soon as a place frees.
//!
//! Lines are independent batches, like files dropped together: their planning order is not
//! their line order, except that lines sharing a request key are planned in line order. A file refused whole (unreadable, too large, too many lines, no batch)
//! is quarantined like an invalid batch file. When the engine cannot take a line now (intake
//! paused, not primary, a standby missing) or the daemon stops, the lines in flight finish,
//! no result is published and the file stays in `new/`: it is processed again later, and the
//! lines answered already answer again by their keys, with the same ids. A crash anywhere
//! ends the same way: the file is still in `new/` until its result is out.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::invalid_files::quarantine;
use super::Shared;
use crate::batch::{Batch, BatchResult, Invalid};
use crate::config::Config;
use crate::error::EngineError;
use crate::intake::bulk_lines::{self as lines, Limits, Line};
use crate::pipeline::intake_bytes::IntakeHeld;
use crate::pipeline::{Deliver, Engine};
use crate::spool::{read_dropped_as, Intake};

/// One bulk file from `new/` to its result (see the module comment).
pub(crate) fn process(sh: &Shared, name: &str) -> Result<(), EngineError> {
    let engine = &sh.engine;
    let cfg = engine.config();
    let Some(_slot) = Slot::take(sh, cfg.bulk_files_in_flight_max) else {
        debug!(
            file = name,
            "bulk file waits for a place (bulk_files_in_flight_max)"
        );
        wait_in_new(sh, name);
        return Ok(());
    };
    let path = engine.spool().new.join(name);
    let Some(_bytes) = take_bytes(sh, &path, name) else {
        return Ok(());
    };
    let whole = |error: String| Invalid {
        request_key: None,
        error,
    };
    let bytes = match read_whole(cfg, &path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(()),
        Err(why) => return quarantine(sh, name, &whole(why)),
    };
    let batches = match lines::lines(&bytes, &Limits::of(cfg)) {
        Ok(l) => l,
        Err(why) => return quarantine(sh, name, &whole(why)),
    };
    answer_and_publish(sh, name, &batches)
}

/// The bulk file at `path`, read whole under `bulk_file_bytes_max`: `None` when it is gone,
/// `Err` with why when it is refused whole (the caller quarantines it).
fn read_whole(cfg: &Config, path: &Path) -> Result<Option<Vec<u8>>, String> {
    match read_dropped_as(path, cfg.bulk_file_bytes_max, "bulk_file_bytes_max") {
        Ok(Intake::Gone) => Ok(None),
        Ok(Intake::Refused(reason)) => Err(reason),
        Ok(Intake::Bytes(b)) => Ok(Some(b)),
        Err(e) => Err(format!("cannot read: {e}")),
    }
}

/// Answers the lines of bulk file `name` (through the leader when this node forwards) and
/// publishes its result, or leaves the file in `new/` for later (see the module comment).
fn answer_and_publish(sh: &Shared, name: &str, batches: &[Line<'_>]) -> Result<(), EngineError> {
    let engine = &sh.engine;
    let t0 = Instant::now();
    let ending = sh.ending.subscribe();
    let stop = || *ending.borrow();
    let forwarding = sh.forwarding().cloned();
    let rt = tokio::runtime::Handle::current();
    let local = |items: &[(&Batch, &str)]| engine.submit(items, Deliver::Returned);
    let forwarded = |items: &[(&Batch, &str)]| match &forwarding {
        Some(cl) => forward_lines(sh, cl, &rt, items),
        None => local(items),
    };
    let submit: &Submit = match forwarding {
        Some(_) => &forwarded,
        None => &local,
    };
    let Some(answers) = answer_lines_with(engine, (name, batches), &stop, submit)? else {
        engine.stats.bulk.deferred.fetch_add(1, Ordering::Relaxed);
        info!(
            file = name,
            "bulk file left in new/ for later (lines answered so far answer again by their keys)"
        );
        return Ok(());
    };
    // A standby's lines were claimed by the leader: no claim of this node's to settle.
    engine.answer_file(name, &answers, forwarding.is_none())?;
    let bulk = &engine.stats.bulk;
    bulk.files.fetch_add(1, Ordering::Relaxed);
    bulk.lines
        .fetch_add(batches.len() as u64, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    info!(
        file = name,
        batches = batches.len(),
        secs,
        "bulk file answered"
    );
    Ok(())
}

/// Bulk file `name` waits in `new/` until a bulk file frees its place or its bytes: it is
/// handed back to the loop then ([`Slot`]'s drop).
fn wait_in_new(sh: &Shared, name: &str) {
    if let Ok(mut w) = sh.bulk_waiting.lock() {
        w.push(name.to_owned());
    }
}

/// The bulk file's size held against `intake_bytes_max` before it is read (given back
/// once it is answered, before its place), or `None` when it does not fit now: the file
/// waits in `new/` and is handed back to the loop when a bulk file frees its place. A file
/// that cannot be looked at is read anyway (the read says why); one over
/// `bulk_file_bytes_max` holds that much (the read refuses it).
fn take_bytes(sh: &Shared, path: &Path, name: &str) -> Option<Option<IntakeHeld>> {
    let cfg = sh.engine.config();
    let Ok(meta) = std::fs::metadata(path) else {
        return Some(None);
    };
    let n = meta.len().min(cfg.bulk_file_bytes_max);
    match sh.engine.intake.bulk.try_take(n) {
        Some(h) => Some(Some(h)),
        None => {
            debug!(
                file = name,
                bytes = n,
                "bulk file waits for room (intake_bytes_max)"
            );
            wait_in_new(sh, name);
            None
        }
    }
}

/// One of `bulk_files_in_flight_max` places for a bulk file, given back when dropped; the
/// files that waited for a place are then handed back to the loop at once (not left for the
/// next rescan, up to a second away, while the engine idles).
struct Slot<'a>(&'a Shared);

impl<'a> Slot<'a> {
    fn take(sh: &'a Shared, max: usize) -> Option<Slot<'a>> {
        sh.bulk_files
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| {
                sh.engine
                    .stats
                    .bulk
                    .in_flight
                    .fetch_add(1, Ordering::Relaxed);
                Slot(sh)
            })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let sh = self.0;
        sh.bulk_files.fetch_sub(1, Ordering::SeqCst);
        sh.engine
            .stats
            .bulk
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
        let waiting = sh.bulk_waiting.lock().map(|mut w| std::mem::take(&mut *w));
        if let Some(names) = waiting.ok().filter(|w| !w.is_empty()) {
            if let Ok(mut q) = sh.requeue.lock() {
                q.extend(names);
            }
            sh.wake.notify_one();
        }
    }
}

/// Answers every line of bulk file `name` (`bulk_in_flight` at once) and returns the result
/// lines in line order, or `None` when the file must wait: the engine cannot take a line now
/// or `stop()` said so (the lines in flight finish first). The caller publishes them
/// ([`Engine::answer_file`]); public for the crash tests, which drive it over the simulated
/// disk.
pub fn answer_lines(
    engine: &Engine,
    name: &str,
    lines: &[Line<'_>],
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Option<Vec<u8>>, EngineError> {
    let submit = |items: &[(&Batch, &str)]| engine.submit(items, Deliver::Returned);
    answer_lines_with(engine, (name, lines), stop, &submit)
}

/// How a group of lines is answered: this engine's pipeline, or (a cluster standby) the
/// leader's through forwarding.
type Submit<'a> = dyn Fn(&[(&Batch, &str)]) -> Result<Vec<BatchResult>, EngineError> + Sync + 'a;

/// [`answer_lines`] with the lines' groups answered by `submit`.
fn answer_lines_with(
    engine: &Engine,
    (name, lines): (&str, &[Line<'_>]),
    stop: &(dyn Fn() -> bool + Sync),
    submit: &Submit<'_>,
) -> Result<Option<Vec<u8>>, EngineError> {
    let limits = Limits::of(engine.config());
    let answers = Lines::new(engine, (name, lines), limits, (stop, submit)).answer_all()?;
    Ok(answers.map(|a| a.concat()))
}

/// A cluster standby's group of lines, forwarded to the leader all at once
/// (`cluster/forward.rs`); one line not answered now halts the file (it waits in `new/`,
/// and the lines answered already answer again by their keys).
fn forward_lines(
    sh: &Shared,
    cl: &std::sync::Arc<crate::cluster::Cluster>,
    rt: &tokio::runtime::Handle,
    items: &[(&Batch, &str)],
) -> Result<Vec<BatchResult>, EngineError> {
    let batches: Vec<&Batch> = items.iter().map(|(b, _)| *b).collect();
    let outcomes = crate::cluster::forward::forward_all(cl, sh.here(), rt, &batches);
    let mut out = Vec::with_capacity(outcomes.len());
    for (o, (_, source)) in outcomes.into_iter().zip(items) {
        match o {
            Ok(r) => out.push(r),
            Err(e) => {
                debug!(source, error = %e, "forwarded bulk line not answered now");
                return Err(EngineError::NotPrimary { role: "standby" });
            }
        }
    }
    Ok(out)
}

/// The lines of one bulk file being answered by a few threads at once.
struct Lines<'a> {
    engine: &'a Engine,
    stop: &'a (dyn Fn() -> bool + Sync),
    submit: &'a Submit<'a>,
    name: &'a str,
    lines: &'a [Line<'a>],
    limits: Limits,
    /// The next line to take.
    next: AtomicUsize,
    /// Set when no further line may be taken: the engine cannot take one now, the daemon
    /// stops, or a failure (`fatal`). The file then gets no result.
    halted: AtomicBool,
    fatal: Mutex<Option<EngineError>>,
    /// Each line's result line, by position in `lines`.
    answers: Vec<Mutex<Option<Vec<u8>>>>,
    /// The earlier line with the same request key that must be answered first (lines that
    /// share a key are planned in line order: `spool::bulk::same_key_before`).
    before: Vec<Option<usize>>,
    /// Notified when a line is answered or the file halts (with `progress`).
    progress: Mutex<()>,
    answered: Condvar,
}

impl<'a> Lines<'a> {
    fn new(
        engine: &'a Engine,
        (name, lines): (&'a str, &'a [Line<'a>]),
        limits: Limits,
        (stop, submit): (&'a (dyn Fn() -> bool + Sync), &'a Submit<'a>),
    ) -> Lines<'a> {
        Lines {
            engine,
            stop,
            submit,
            name,
            lines,
            limits,
            next: AtomicUsize::new(0),
            halted: AtomicBool::new(false),
            fatal: Mutex::new(None),
            answers: lines.iter().map(|_| Mutex::new(None)).collect(),
            before: lines::same_key_before(lines, &limits),
            progress: Mutex::new(()),
            answered: Condvar::new(),
        }
    }

    /// Every line's result line in line order, or `None` when the file must wait (halted
    /// without a failure). This thread and helpers, one per group of `bulk_group_lines` up
    /// to `bulk_in_flight` lines, take groups until none is left; a helper that cannot be
    /// started only means fewer at once.
    fn answer_all(self) -> Result<Option<Vec<Vec<u8>>>, EngineError> {
        let cfg = self.engine.config();
        let group = self.group();
        let want = cfg.bulk_in_flight.div_ceil(group).max(1);
        let want = want.min(self.lines.len().div_ceil(group));
        std::thread::scope(|s| {
            for i in 1..want {
                let started = std::thread::Builder::new()
                    .name(format!("roost-bulk-{i}"))
                    .spawn_scoped(s, || self.take_groups());
                if let Err(e) = started {
                    warn!(file = self.name, error = %e, threads = i, "cannot start another bulk line thread");
                    break;
                }
            }
            self.take_groups();
        });
        if let Some(e) = self.fatal.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        if self.halted.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(self.answers.len());
        for (slot, line) in self.answers.into_iter().zip(self.lines) {
            let answer = slot.into_inner().unwrap_or_else(|p| p.into_inner());
            out.push(answer.ok_or_else(|| EngineError::Inconsistent {
                lsn: 0,
                detail: format!(
                    "bulk file {}: line {} has no answer",
                    self.name, line.number
                ),
            })?);
        }
        Ok(Some(out))
    }

    /// Lines per group: `bulk_group_lines`, at most `bulk_in_flight`.
    fn group(&self) -> usize {
        let cfg = self.engine.config();
        cfg.bulk_group_lines.min(cfg.bulk_in_flight).max(1)
    }

    /// Takes the next group of lines and answers it, until none is left or the file is
    /// halted.
    fn take_groups(&self) {
        let group = self.group();
        loop {
            if (self.stop)() {
                self.halted.store(true, Ordering::SeqCst);
            }
            if self.halted.load(Ordering::SeqCst) {
                return;
            }
            let first = self.next.fetch_add(group, Ordering::SeqCst);
            if first >= self.lines.len() {
                return;
            }
            let range = first..(first + group).min(self.lines.len());
            // A line whose key an earlier group's line holds waits for that answer; within
            // the group, item order plans them in line order.
            let earlier = range.clone().filter_map(|i| self.before[i]);
            if !earlier
                .filter(|j| *j < first)
                .all(|j| self.wait_answered(j))
            {
                return;
            }
            match self.answer_group(range.clone()) {
                Ok(answers) => {
                    for (i, r) in range.zip(answers) {
                        let bytes = lines::result_line(self.lines[i].number, &r);
                        *roost_storage::lock(&self.answers[i]) = Some(bytes);
                    }
                }
                Err(e) => self.halt(first, e),
            }
            let _g = roost_storage::lock(&self.progress);
            self.answered.notify_all();
        }
    }

    /// No further line is taken: the engine cannot take one now (the file waits), or a
    /// failure (the file gets no result and the daemon stops).
    fn halt(&self, first: usize, e: EngineError) {
        if e.latches_nothing() {
            let line = self.lines[first].number;
            debug!(file = self.name, line, error = %e, "bulk lines not taken now");
        } else {
            roost_storage::lock(&self.fatal).get_or_insert(e);
        }
        self.halted.store(true, Ordering::SeqCst);
    }

    /// Waits until line `j` (taken earlier, so in flight or answered) has its answer: true,
    /// or the file halts: false. No cycle: a line only ever waits for an earlier one.
    fn wait_answered(&self, j: usize) -> bool {
        let mut g = roost_storage::lock(&self.progress);
        loop {
            if roost_storage::lock(&self.answers[j]).is_some() {
                return true;
            }
            if self.halted.load(Ordering::SeqCst) || (self.stop)() {
                self.halted.store(true, Ordering::SeqCst);
                return false;
            }
            g = self
                .answered
                .wait_timeout(g, Duration::from_millis(50))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The answers of the lines in `range`, in line order: `invalid` for a line that is not
    /// a batch, the pipeline's for the others (one group: `Engine::submit`).
    fn answer_group(&self, range: std::ops::Range<usize>) -> Result<Vec<BatchResult>, EngineError> {
        let engine = self.engine;
        let mut parsed = Vec::with_capacity(range.len());
        for line in &self.lines[range] {
            let source = lines::source(self.name, line.number);
            match lines::parse_line(line, &self.limits) {
                Err(inv) => {
                    debug!(file = self.name, line = line.number, error = %inv.error, "invalid bulk line");
                    engine.stats.invalid.fetch_add(1, Ordering::Relaxed);
                    parsed.push(Err(BatchResult::invalid(&inv)));
                }
                Ok(b) => parsed.push(Ok((b, source))),
            }
        }
        let items: Vec<(&Batch, &str)> = parsed
            .iter()
            .filter_map(|p| p.as_ref().ok().map(|(b, s)| (b, s.as_str())))
            .collect();
        let mut answers = match items.is_empty() {
            true => Vec::new().into_iter(),
            false => (self.submit)(&items)?.into_iter(),
        };
        let mut out = Vec::with_capacity(parsed.len());
        for p in parsed {
            match p {
                Err(invalid) => out.push(invalid),
                Ok((b, _)) => {
                    out.push(answers.next().ok_or_else(|| EngineError::Inconsistent {
                        lsn: 0,
                        detail: format!(
                            "bulk file {}: key {:?} has no answer",
                            self.name, b.request_key
                        ),
                    })?)
                }
            }
        }
        Ok(out)
    }
}

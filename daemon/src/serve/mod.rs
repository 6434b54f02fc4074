//! `roost serve`: the async shell around the engine. It watches `new/` (notify events name
//! the files that arrived and are only hints; a full rescan at start-up, every
//! `rescan_interval_ms`, and whenever an event may have been lost is the truth), runs
//! each file on a bounded pool of blocking workers (the engine blocks on fsync), and stops
//! in three steps on SIGTERM/SIGINT: stop taking files, let in-flight batches finish, return.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, Notify, Semaphore};
use tracing::{debug, error, info, warn};

use crate::batch::{self, BatchResult};
use crate::error::EngineError;
use crate::pipeline::Engine;
use crate::spool::{self, read_dropped, FailedDir, Intake};

/// Shared between the loop and its workers.
struct Shared {
    engine: Arc<Engine>,
    /// Names being processed (a rescan must not start a second worker on one).
    in_progress: Mutex<HashSet<String>>,
    /// Names that arrived again while in progress (a client reusing a name right after its
    /// answer): looked at again as soon as their worker is done, not at the next rescan.
    again: Mutex<HashSet<String>>,
    /// Names to look at again, handed back to the loop by finishing workers.
    requeue: Mutex<Vec<String>>,
    /// Names that could not even be quarantined (logged once, then left alone).
    stuck: Mutex<HashSet<String>>,
    fatal: Mutex<Option<EngineError>>,
    failed: Mutex<FailedDir>,
    stop: AtomicBool,
    wake: Notify,
}

/// Event hints queued between the watcher and the loop; past this, a rescan instead.
const EVENTS_MAX: usize = 4096;

/// The names a file-system event says arrived in `new/`: `Some(name)` per file created or
/// moved in, `None` when the event may have lost arrivals (the kernel's queue overflowed, an
/// error, a name that is not UTF-8) and only a rescan can tell. Removals and changes are not
/// arrivals (the daemon's own removals from `new/` would otherwise wake it once per batch).
fn arrivals(res: notify::Result<notify::Event>) -> Vec<Option<String>> {
    use notify::event::{EventKind, ModifyKind, RenameMode};
    let Ok(ev) = res else {
        return vec![None];
    };
    if ev.need_rescan() {
        return vec![None];
    }
    let paths = match ev.kind {
        EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => &ev.paths[..],
        // Source and target: only the target arrived.
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            &ev.paths[ev.paths.len().saturating_sub(1)..]
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::Any))
        | EventKind::Any
        | EventKind::Other => return vec![None],
        _ => return Vec::new(),
    };
    paths
        .iter()
        .map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
        .collect()
}

/// Runs until SIGTERM/SIGINT (Ok) or a pipeline failure (Err, after in-flight work settles).
pub fn serve(engine: Arc<Engine>) -> Result<(), EngineError> {
    serve_until(engine, Arc::new(Notify::new()))
}

/// [`serve`], also stopping (the same graceful way) when `stop` is notified: for embedding
/// the daemon in another program, such as the benchmark.
pub fn serve_until(engine: Arc<Engine>, stop: Arc<Notify>) -> Result<(), EngineError> {
    let workers = engine.config().batches_in_flight_max;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(workers + 4)
        .enable_all()
        .build()
        .map_err(|source| EngineError::Io {
            op: "start runtime",
            path: engine.data_dir().to_path_buf(),
            source,
        })?;
    rt.block_on(serve_async(engine, stop))
}

async fn serve_async(engine: Arc<Engine>, stop: Arc<Notify>) -> Result<(), EngineError> {
    let cfg = engine.config().clone();
    let workers = cfg.batches_in_flight_max;
    let new_dir = engine.spool().new.clone();
    let engine_failed_dir = engine.spool().failed.clone();
    let shared = Arc::new(Shared {
        engine,
        in_progress: Mutex::new(HashSet::new()),
        again: Mutex::new(HashSet::new()),
        requeue: Mutex::new(Vec::new()),
        stuck: Mutex::new(HashSet::new()),
        fatal: Mutex::new(None),
        failed: Mutex::new(FailedDir::load(&engine_failed_dir)),
        stop: AtomicBool::new(false),
        wake: Notify::new(),
    });
    // File-system events name the files that arrived; they are hints. A full channel, or an
    // event that names nothing we can use (the kernel queue overflowed), asks for a rescan,
    // as does the timer: a rescan of `new/` is the truth.
    let (tx, mut events) = mpsc::channel::<String>(EVENTS_MAX);
    let rescan_needed = Arc::new(AtomicBool::new(true));
    // The watcher's thread may outlive this function by a moment after the watcher is
    // dropped: its callback holds nothing of the engine's (which must be gone, with its
    // lock, when serve returns).
    let lost_events = Arc::new(Notify::new());
    let _watcher = {
        use notify::Watcher;
        let (tx, rescan, wake) = (tx.clone(), rescan_needed.clone(), lost_events.clone());
        match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            for hint in arrivals(res) {
                let sent = match hint {
                    Some(name) => tx.try_send(name).is_ok(),
                    None => false,
                };
                if !sent {
                    rescan.store(true, Ordering::SeqCst);
                    wake.notify_one();
                }
            }
        }) {
            Ok(mut w) => match w.watch(&new_dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => Some(w),
                Err(e) => {
                    warn!(dir = %new_dir.display(), error = %e, "cannot watch spool; relying on rescans");
                    None
                }
            },
            Err(e) => {
                warn!(error = %e, "no file watcher; relying on rescans");
                None
            }
        }
    };
    let map_sig = |source| EngineError::Io {
        op: "install signal handler",
        path: new_dir.clone(),
        source,
    };
    let mut term = signal(SignalKind::terminate()).map_err(map_sig)?;
    let mut int = signal(SignalKind::interrupt()).map_err(map_sig)?;
    let mut tick = tokio::time::interval(cfg.rescan_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let sem = Arc::new(Semaphore::new(workers));
    // Control socket, optional metrics endpoint, and the systemd status/watchdog ticker.
    let sock = crate::ops::control::socket_path(&cfg);
    let control = tokio::spawn({
        let (sock, engine) = (sock.clone(), shared.engine.clone());
        async move {
            if let Err(e) = crate::ops::control::serve_socket(sock.clone(), engine).await {
                warn!(socket = %sock.display(), error = %e, "control socket unavailable; `roost status` will not work");
            }
        }
    });
    let metrics = cfg.metrics_listen.map(|addr| {
        let engine = shared.engine.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::ops::control::serve_metrics_tcp(addr, engine).await {
                warn!(%addr, error = %e, "metrics endpoint unavailable");
            }
        })
    });
    // READY=1 before the ticker exists: its first WATCHDOG=1 must not overtake it.
    crate::ops::notify::ready();
    let ticker = tokio::spawn(notify_loop(shared.engine.clone()));
    info!(spool = %new_dir.display(), workers, socket = %sock.display(), "serving");
    loop {
        let mut names: Vec<String> = Vec::new();
        tokio::select! {
            _ = stop.notified() => { info!("asked to stop"); break; }
            _ = term.recv() => { info!("SIGTERM: stopping"); break; }
            _ = int.recv() => { info!("SIGINT: stopping"); break; }
            _ = shared.wake.notified() => {}
            _ = lost_events.notified() => {}
            Some(name) = events.recv() => names.push(name),
            _ = tick.tick() => rescan_needed.store(true, Ordering::SeqCst),
        }
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        while let Ok(name) = events.try_recv() {
            names.push(name);
        }
        if let Ok(mut q) = shared.requeue.lock() {
            names.append(&mut q);
        }
        if rescan_needed.swap(false, Ordering::SeqCst) {
            match std::fs::read_dir(&new_dir) {
                Ok(rd) => names.extend(
                    rd.flatten()
                        .filter_map(|e| e.file_name().to_str().map(str::to_owned)),
                ),
                Err(e) => {
                    warn!(dir = %new_dir.display(), error = %e, "cannot list spool");
                    continue;
                }
            }
        }
        for name in names {
            if !spool::valid_spool_name(&name)
                || shared.stuck.lock().is_ok_and(|s| s.contains(&name))
            {
                continue;
            }
            if !shared
                .in_progress
                .lock()
                .is_ok_and(|mut s| s.insert(name.clone()))
            {
                shared.again.lock().map(|mut s| s.insert(name)).ok();
                continue;
            }
            // Bounded work in flight: wait for a worker, but keep answering signals.
            let permit = tokio::select! {
                p = sem.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                _ = term.recv() => { shared.stop.store(true, Ordering::SeqCst); break; }
                _ = int.recv() => { shared.stop.store(true, Ordering::SeqCst); break; }
            };
            let sh = shared.clone();
            tokio::task::spawn_blocking(move || {
                let r = process(&sh, &name);
                if let Err(e) = r {
                    error!(file = %name, error = %e, "pipeline failure: stopping");
                    if let Ok(mut f) = sh.fatal.lock() {
                        f.get_or_insert(e);
                    }
                    sh.stop.store(true, Ordering::SeqCst);
                    sh.wake.notify_one();
                }
                sh.in_progress.lock().map(|mut s| s.remove(&name)).ok();
                if sh.again.lock().is_ok_and(|mut s| s.remove(&name)) {
                    sh.requeue.lock().map(|mut q| q.push(name)).ok();
                    sh.wake.notify_one();
                }
                drop(permit);
            });
        }
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
    }
    shared.stop.store(true, Ordering::SeqCst);
    // Wait for every in-flight batch to reach its result (or fail).
    let in_flight = workers - sem.available_permits();
    crate::ops::notify::stopping(&format!(
        "stopping: waiting for {in_flight} in-flight batches"
    ));
    info!(in_flight, "waiting for in-flight batches");
    let _all = sem.acquire_many(workers as u32).await;
    // Done records are written lazily: make them durable before saying we stopped cleanly.
    if let Err(e) = shared.engine.sync() {
        warn!(error = %e, "final wal sync failed");
        if let Ok(mut f) = shared.fatal.lock() {
            f.get_or_insert(e);
        }
    }
    ticker.abort();
    control.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    let _ = std::fs::remove_file(&sock);
    let fatal = shared.fatal.lock().ok().and_then(|mut f| f.take());
    match fatal {
        Some(e) => Err(e),
        None => {
            info!("stopped cleanly");
            Ok(())
        }
    }
}

/// Every second: STATUS= with the pipeline's state; WATCHDOG=1 at half the watchdog interval
/// but only while the pipeline is healthy (no batch stuck longer than the interval), so a
/// wedged shard or disk makes systemd restart us.
async fn notify_loop(engine: Arc<Engine>) {
    let watchdog = crate::ops::notify::watchdog_interval();
    let period = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 2).min(Duration::from_secs(1))
    });
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        let s = &engine.stats;
        crate::ops::notify::status(&format!(
            "serving, {} batches in flight, {} committed, last lsn {}",
            s.in_flight.load(Ordering::Relaxed),
            s.committed.load(Ordering::Relaxed),
            engine.last_lsn()
        ));
        if let Some(w) = watchdog {
            if engine.healthy(w) {
                crate::ops::notify::watchdog();
            } else {
                warn!("pipeline not healthy: withholding the watchdog ping");
            }
        }
    }
}

/// One file from `new/` to its result.
fn process(sh: &Shared, name: &str) -> Result<(), EngineError> {
    let engine = &sh.engine;
    let cfg = engine.config();
    let path = engine.spool().new.join(name);
    let parsed = match read_dropped(&path, cfg.spool_file_bytes_max) {
        Ok(Intake::Gone) => return Ok(()),
        Ok(Intake::Refused(reason)) => Err(batch::Invalid {
            request_key: None,
            error: reason,
        }),
        Ok(Intake::Bytes(b)) => batch::parse(&b, cfg.batch_ops_max),
        Err(e) => Err(batch::Invalid {
            request_key: None,
            error: format!("cannot read: {e}"),
        }),
    };
    match parsed {
        Ok(b) => {
            let r = engine.submit(&b, name)?;
            debug!(file = name, status = ?r.status(), lsn = r.lsn(), "batch done");
            Ok(())
        }
        Err(inv) => {
            quarantine(sh, name, &inv);
            Ok(())
        }
    }
}

/// Moves `new/NAME` to `failed/NAME` and writes the `invalid` result. Failing to do so is not
/// fatal (the input is still there, nothing is lost): the name is logged and left alone.
fn quarantine(sh: &Shared, name: &str, inv: &batch::Invalid) {
    let engine = &sh.engine;
    let sp = engine.spool();
    warn!(file = name, error = %inv.error, "invalid batch file: quarantined");
    let moved = std::fs::rename(sp.new.join(name), sp.failed.join(name));
    if moved.is_ok() {
        if let Ok(mut f) = sh.failed.lock() {
            let cfg = engine.config();
            f.add(name, cfg.failed_files_max, cfg.failed_bytes_max);
        }
    }
    let wrote = engine.publish(name, &BatchResult::invalid(inv));
    if let Err(e) = moved
        .as_ref()
        .map_err(|e| e.to_string())
        .and(wrote.as_ref().map_err(|e| e.to_string()))
    {
        error!(file = name, error = %e, "cannot quarantine; leaving it in new/");
        sh.stuck.lock().map(|mut s| s.insert(name.to_owned())).ok();
    }
    engine.note_invalid();
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{
        CreateKind, DataChange, EventKind, Flag, ModifyKind, RemoveKind, RenameMode,
    };
    use notify::Event;
    use std::path::PathBuf;

    fn ev(kind: EventKind, paths: &[&str]) -> notify::Result<Event> {
        let mut e = Event::new(kind);
        for p in paths {
            e = e.add_path(PathBuf::from(p));
        }
        Ok(e)
    }

    /// An engine on a real temporary directory, with `crash` and a rescan interval.
    fn open_real(
        dir: &std::path::Path,
        crash: Arc<dyn crate::pipeline::crash::CrashHook>,
        rescan_interval_ms: u64,
    ) -> Result<Engine, EngineError> {
        use crate::config::Config;
        Engine::open(crate::pipeline::EngineOptions {
            storage: roost_wal::storage::RealStorage::shared(),
            config: Arc::new(Config {
                data_dir: dir.to_path_buf(),
                control_socket: Some(dir.join("roost.sock")),
                rescan_interval_ms,
                ..Config::default()
            }),
            crash,
        })
    }

    /// `serve_until` on its own thread; `stop` asks it to stop and joins it.
    struct Serving {
        stop: Arc<Notify>,
        thread: std::thread::JoinHandle<Result<(), EngineError>>,
    }

    impl Serving {
        fn start(engine: Arc<Engine>) -> Serving {
            let stop = Arc::new(Notify::new());
            let s = stop.clone();
            let thread = std::thread::spawn(move || serve_until(engine, s));
            Serving { stop, thread }
        }

        fn stop(self) {
            self.stop.notify_one();
            self.thread.join().expect("serve thread").expect("serve");
        }
    }

    /// Drops a one-create batch with `key` as `new/NAME`, the client's way.
    fn drop_in(spool: &std::path::Path, name: &str, key: &str) {
        let tmp = spool.join("tmp").join(name);
        std::fs::write(
            &tmp,
            format!(
                r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"s","record":{{}}}}]}}"#
            ),
        )
        .expect("write");
        std::fs::rename(&tmp, spool.join("new").join(name)).expect("rename");
    }

    /// Polls `f` for up to 20 s; fails with `what` after that.
    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(std::time::Instant::now() < until, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Goal: once `serve_until` returns, nothing holds the engine (and its data directory
    /// lock) any more: an embedding program can open the directory again at once.
    #[test]
    fn serve_releases_the_engine_when_it_returns() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = t.path().join("data");
        let open = || open_real(&dir, Arc::new(crate::pipeline::crash::NoCrash), 1_000);
        for round in 0..10 {
            let engine = Arc::new(open().unwrap_or_else(|e| panic!("round {round}: {e}")));
            // A file arrives while serving, so the watcher has fired.
            let name = format!("f{round}.json");
            drop_in(&dir.join("spool"), &name, &format!("k{round}"));
            let serving = Serving::start(engine.clone());
            let out = dir.join("spool/out").join(&name);
            wait_until(&format!("no result in round {round}"), || out.exists());
            drop(engine);
            serving.stop();
        }
        open().expect("the directory is free after the last round");
    }

    /// Goal: a name that arrives again while its first batch is still in its durability tail
    /// (the client saw the answer and reused the name at once) is taken as soon as the first
    /// worker is done, not at the next rescan (set an hour apart here).
    /// Method: a crash hook that holds the first batch at `after_result` until the second
    /// file is in `new/`.
    #[test]
    fn a_name_reused_during_the_tail_is_taken_when_the_worker_is_done() {
        use crate::pipeline::crash::{CrashPoint, Step};
        use std::sync::mpsc;

        /// Blocks the first `after_result` until released.
        struct Hold {
            reached: Mutex<Option<mpsc::Sender<()>>>,
            release: Mutex<mpsc::Receiver<()>>,
        }
        impl crate::pipeline::crash::CrashHook for Hold {
            fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
                if point == Step::AfterResult.at() {
                    if let Some(tx) = self.reached.lock().ok().and_then(|mut r| r.take()) {
                        let _ = tx.send(());
                        let _ = self
                            .release
                            .lock()
                            .map(|r| r.recv_timeout(Duration::from_secs(20)));
                    }
                }
                Ok(())
            }
        }
        let (reached_tx, reached) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let t = tempfile::tempdir().expect("tempdir");
        let dir = t.path().join("data");
        let hold = Arc::new(Hold {
            reached: Mutex::new(Some(reached_tx)),
            release: Mutex::new(release_rx),
        });
        let engine = Arc::new(open_real(&dir, hold, 3_600_000).expect("open"));
        let serving = Serving::start(engine.clone());
        let spool = dir.join("spool");
        drop_in(&spool, "same.json", "first");
        reached
            .recv_timeout(Duration::from_secs(20))
            .expect("the first batch reached its result");
        let out = spool.join("out/same.json");
        assert!(std::fs::read_to_string(&out)
            .expect("first result")
            .contains("first"));
        drop_in(&spool, "same.json", "second");
        // Let the watcher deliver the second file's event while the first is held.
        std::thread::sleep(Duration::from_millis(300));
        release.send(()).expect("release");
        wait_until(
            "the reused name was not taken after its first worker finished",
            || {
                std::fs::read_to_string(&out)
                    .unwrap_or_default()
                    .contains("second")
            },
        );
        drop(engine);
        serving.stop();
    }

    #[test]
    fn events_name_arrivals_and_ask_for_a_rescan_when_unsure() {
        let some = |n: &str| vec![Some(n.to_owned())];
        assert_eq!(
            arrivals(ev(EventKind::Create(CreateKind::File), &["/s/new/a.json"])),
            some("a.json")
        );
        assert_eq!(
            arrivals(ev(
                EventKind::Modify(ModifyKind::Name(RenameMode::To)),
                &["/s/new/b.json"]
            )),
            some("b.json")
        );
        // A rename within new/: only the target arrived.
        assert_eq!(
            arrivals(ev(
                EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
                &["/s/new/.b.tmp", "/s/new/b.json"]
            )),
            some("b.json")
        );
        // The daemon's own removals, and writes to a file, are not arrivals.
        assert!(arrivals(ev(EventKind::Remove(RemoveKind::File), &["/s/new/a.json"])).is_empty());
        assert!(arrivals(ev(
            EventKind::Modify(ModifyKind::Name(RenameMode::From)),
            &["/s/new/a.json"]
        ))
        .is_empty());
        assert!(arrivals(ev(
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            &["/s/new/a.json"]
        ))
        .is_empty());
        // Lost events: an overflowed queue, an error, a kind that says nothing.
        let overflow = Ok(Event::new(EventKind::Other).set_flag(Flag::Rescan));
        assert_eq!(arrivals(overflow), vec![None]);
        assert_eq!(
            arrivals(Err(notify::Error::generic("queue overflow"))),
            vec![None]
        );
        assert_eq!(arrivals(ev(EventKind::Any, &[])), vec![None]);
    }
}

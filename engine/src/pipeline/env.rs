//! What every step of the engine stands on: the storage seam and its clock, the data
//! directory's names, the configuration, the crash hook, the counters, the failure latch and
//! the condition variable its waiters sleep on, the moment of open, and the data directory's
//! lock. It owns no log, no shard and no answer; it latches, reports progress and replaces
//! small files.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar};
use std::time::Instant;

use roost_storage::{Clock, DirLock, Storage};

use super::crash::{CrashHook, CrashPoint};
use super::disk::replace_file;
use super::stats::Stats;
use crate::config::Config;
use crate::error::EngineError;
use crate::layout::Layout;

/// Built by `Engine::open`; the latch is read and set only through its methods.
pub(super) struct Env {
    pub storage: Arc<dyn Storage>,
    /// The storage's clock: every time the engine reads (never `Instant::now`: the simulator
    /// drives it as it drives the disk).
    pub clock: Clock,
    pub layout: Layout,
    pub config: Arc<Config>,
    pub crash: Arc<dyn CrashHook>,
    /// The engine's latch: set by the first failed write or sync, never cleared.
    pub failed: Arc<AtomicBool>,
    /// Signalled when a batch finishes, or the role changes, or the engine fails (a
    /// duplicate of an in-flight key waits on it).
    pub finished_cv: Arc<Condvar>,
    /// A reading of `clock` at open.
    pub opened: Instant,
    pub stats: Arc<Stats>,
    /// Released last: every part is closed before another process may open the directory.
    pub _lock: Option<DirLock>,
}

impl Env {
    /// The environment of an engine opening now on `storage` (its clock read for `opened`),
    /// with the latch and condvar the log role shares; the lock joins once every part has
    /// started.
    pub(super) fn new(
        storage: Arc<dyn Storage>,
        (layout, config, crash): (Layout, Arc<Config>, Arc<dyn CrashHook>),
        (failed, finished_cv): (Arc<AtomicBool>, Arc<Condvar>),
        stats: Arc<Stats>,
    ) -> Env {
        let clock = Clock::of(storage.clone());
        Env {
            storage,
            opened: clock.now(),
            clock,
            layout,
            config,
            crash,
            failed,
            finished_cv,
            stats,
            _lock: None,
        }
    }

    pub(super) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Latches the engine and wakes every waiter.
    pub(super) fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        self.finished_cv.notify_all();
    }

    /// `Failed` once the engine latched.
    pub(super) fn check(&self) -> Result<(), EngineError> {
        if self.is_failed() {
            Err(EngineError::Failed)
        } else {
            Ok(())
        }
    }

    /// A step boundary: progress for the watchdog, and the crash hook.
    pub(super) fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
        self.stats
            .last_progress_ms
            .store(self.uptime_ms(), Ordering::Relaxed);
        self.crash.hit(point).inspect_err(|_| self.fail())
    }

    /// Milliseconds since open.
    pub(super) fn uptime_ms(&self) -> u64 {
        self.clock.since(self.opened).as_millis() as u64
    }

    /// [`replace_file`] on this engine's storage; a failure latches the engine.
    pub(super) fn replace_file(&self, path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
        replace_file(self.storage.as_ref(), path, bytes).inspect_err(|_| self.fail())
    }
}

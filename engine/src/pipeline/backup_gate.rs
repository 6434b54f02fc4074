//! What base backups share with the rest of the engine (`backup.rs` copies the files): the
//! gate that holds shard compaction and checkpoints still while a copy runs, and the WAL
//! lsns pinned for standbys that were just re-seeded. Shard owners (`owner.rs`) and
//! checkpoints (`checkpoint.rs`) look at it; it knows nothing of the engine.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use roost_storage::{lock, Clock};
use roost_wal::Lsn;

use crate::error::EngineError;

/// How long a copied checkpoint's lsn stays pinned for a standby that does not fetch.
pub const PIN_TTL: Duration = Duration::from_secs(600);

/// Shared with the shard owners: base backups running, and compaction steps running.
#[derive(Debug, Default)]
pub struct BackupGate {
    /// Base backups running (one at most: `backup.rs`).
    pub(super) running: AtomicUsize,
    /// Compaction steps running.
    pub(super) compacting: AtomicUsize,
}

impl BackupGate {
    /// Waits until no compaction step runs (a backup counted itself first, so no new step
    /// starts); gives up after `max` by `clock`, or once its sleeps add up to `max` (real
    /// time at least: a simulated clock that stands still never hangs it).
    pub fn wait_compaction(&self, clock: &Clock, max: Duration) -> Result<(), EngineError> {
        let (t0, step) = (clock.now(), Duration::from_millis(1));
        let mut slept = Duration::ZERO;
        while self.compacting.load(Ordering::SeqCst) > 0 {
            if clock.since(t0) > max || slept > max {
                return Err(EngineError::Replication(format!(
                    "a shard compaction step did not finish within {max:?}"
                )));
            }
            std::thread::sleep(step);
            slept += step;
        }
        Ok(())
    }

    /// A compaction step may start (and is counted until `compaction_done`) unless a backup
    /// runs. Both sides count first and look second (sequentially consistent), so either
    /// the step sees the backup or the backup sees the step.
    pub fn try_compact(&self) -> bool {
        self.compacting.fetch_add(1, Ordering::SeqCst);
        if self.running.load(Ordering::SeqCst) > 0 {
            self.compacting.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    pub fn compaction_done(&self) {
        self.compacting.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether a backup is running (checkpoints wait).
    pub fn backup_running(&self) -> bool {
        self.running.load(Ordering::SeqCst) > 0
    }
}

/// Per standby, the lsn its log starts at after a backup, and when it was pinned (by the
/// storage's clock).
#[derive(Debug)]
pub struct Pins {
    pins: Mutex<HashMap<String, (Lsn, Instant)>>,
    clock: Clock,
}

impl Pins {
    /// No pins yet; their age runs by `clock`.
    pub fn new(clock: Clock) -> Pins {
        Pins {
            pins: Mutex::default(),
            clock,
        }
    }

    /// The lowest pinned lsn still wanted (expired pins go).
    pub fn lowest(&self) -> Option<Lsn> {
        let mut p = lock(&self.pins);
        p.retain(|_, (_, at)| self.clock.since(*at) < PIN_TTL);
        p.values().map(|(l, _)| *l).min()
    }

    pub fn pin(&self, replica: &str, lsn: Lsn) {
        let now = self.clock.now();
        lock(&self.pins).insert(replica.to_owned(), (lsn, now));
    }

    /// The pin of `replica` lasts [`PIN_TTL`] from now.
    pub fn touch(&self, replica: &str) {
        if let Some(p) = lock(&self.pins).get_mut(replica) {
            p.1 = self.clock.now();
        }
    }

    /// `replica` fetched at `fetch_lsn`: a pin it passed goes.
    pub fn fetched(&self, replica: &str, fetch_lsn: Lsn) {
        let mut p = lock(&self.pins);
        if p.get(replica).is_some_and(|(l, _)| fetch_lsn > *l) {
            p.remove(replica);
        }
    }
}

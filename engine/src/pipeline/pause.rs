//! Whether intake is paused for want of disk room (`room.rs` decides when), and since when
//! (by the storage's clock): the engine's part that remembers the pause, logs its start and
//! end once each, and counts it. It never looks at a log or a shard.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use roost_storage::{lock, Clock, NoRoom};
use tracing::{info, warn};

use super::stats::Stats;
use crate::error::EngineError;

/// Why intake is paused, and since when.
#[derive(Clone, Debug)]
pub struct Pause {
    /// `wal`, `audit` or `shard NAME`.
    pub part: String,
    pub why: NoRoom,
    /// A reading of the storage's clock (`Env::clock`; status reads `Clock::of` the storage).
    pub since: Instant,
}

/// The pause, if any.
pub(super) struct IntakePause {
    current: Mutex<Option<Pause>>,
    stats: Arc<Stats>,
    clock: Clock,
}

impl IntakePause {
    pub(super) fn new(stats: Arc<Stats>, clock: Clock) -> IntakePause {
        IntakePause {
            current: Mutex::new(None),
            stats,
            clock,
        }
    }

    /// `Paused` for `part`, noted first.
    pub(super) fn refuse(&self, part: String, why: NoRoom) -> Result<(), EngineError> {
        self.note(&part, &why);
        Err(EngineError::Paused { part, why })
    }

    /// Intake pauses for `part` (logged and counted when it was not paused already).
    pub(super) fn note(&self, part: &str, why: &NoRoom) {
        let mut p = lock(&self.current);
        if p.is_none() {
            warn!(part, file = %why.path.display(), needed_bytes = why.needed_bytes,
                error = %why.error,
                "intake paused: the disk has no room for the next segment; free space on it, \
                 intake resumes by itself");
            self.stats.intake_pauses.fetch_add(1, Ordering::Relaxed);
            *p = Some(Pause {
                part: part.to_owned(),
                why: why.clone(),
                since: self.clock.now(),
            });
        }
    }

    /// Why intake is paused, if it is.
    pub(super) fn current(&self) -> Option<Pause> {
        lock(&self.current).clone()
    }

    /// Intake goes on (logged when it had been paused).
    pub(super) fn resumed(&self) {
        if let Some(p) = lock(&self.current).take() {
            let paused_ms = self.clock.since(p.since).as_millis() as u64;
            info!(part = %p.part, paused_ms,
                "intake resumed: the spare segments are made again");
        }
    }
}

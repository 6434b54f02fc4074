//! [`Clock`]: a storage's clock ([`Storage::now`], [`Storage::system_now`]) as a small handle
//! to clone into the parts of a program that decide by the time but hold no storage (a queue
//! that knows how long its oldest entry waited, a shard owner's idle close). It only reads
//! the clock of the storage it was made from; it never keeps time of its own.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::seam::Storage;

/// The clock of one storage: the OS clock on the real disk, the test's on the simulated one.
/// Cheap to clone (it shares the storage).
#[derive(Clone)]
pub struct Clock(Arc<dyn Storage>);

impl Clock {
    /// The clock of `storage`.
    pub fn of(storage: Arc<dyn Storage>) -> Clock {
        Clock(storage)
    }

    /// The monotonic time now ([`Storage::now`]).
    pub fn now(&self) -> Instant {
        self.0.now()
    }

    /// How long ago `earlier` (a reading of this clock) was: `now() - earlier`, zero if it is
    /// not earlier. What `earlier.elapsed()` says of the OS clock, said of this one.
    pub fn since(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }

    /// The wall-clock time now ([`Storage::system_now`]).
    pub fn system_now(&self) -> SystemTime {
        self.0.system_now()
    }

    /// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
    pub fn unix_ms(&self) -> u64 {
        self.system_now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the storage itself: a simulated disk's debug output is every file it holds.
        f.debug_struct("Clock").finish_non_exhaustive()
    }
}

//! The simulated disk's clock (`SimClock`): a manual clock that moves only when a test
//! advances it. Its monotonic time is an `Instant` taken when the clock was made plus the
//! time advanced since; its wall-clock time is a fixed moment plus the same, so a run
//! replayed from a seed writes the same stamps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the simulated wall clock starts: 2024-01-01 00:00:00 UTC.
const WALL_START_SECS: u64 = 1_704_067_200;

#[derive(Debug)]
pub(super) struct SimClock {
    /// The monotonic time at offset zero (the real clock when this clock was made).
    base: Instant,
    /// Nanoseconds advanced so far (saturates after 584 years).
    offset_ns: AtomicU64,
}

impl Default for SimClock {
    fn default() -> Self {
        SimClock {
            base: Instant::now(),
            offset_ns: AtomicU64::new(0),
        }
    }
}

impl SimClock {
    fn offset(&self) -> Duration {
        Duration::from_nanos(self.offset_ns.load(Ordering::SeqCst))
    }

    pub(super) fn now(&self) -> Instant {
        self.base + self.offset()
    }

    pub(super) fn system_now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(WALL_START_SECS) + self.offset()
    }

    pub(super) fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .offset_ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// A clock of its own showing the time this one shows now.
    pub(super) fn copy(&self) -> SimClock {
        SimClock {
            base: self.base,
            offset_ns: AtomicU64::new(self.offset_ns.load(Ordering::SeqCst)),
        }
    }
}

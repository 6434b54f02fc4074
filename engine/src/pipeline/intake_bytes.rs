//! Bytes of unanswered input held in memory by every intake together (issue 44): at most
//! `intake_bytes_max`. A bulk file takes its size before it is read (or waits in `new/`); a
//! stream line takes its length before its batch starts (its reader reads no further line
//! until it has); each gives them back once its answer is out. Shown in `status.memory` as
//! `intake_bytes` (held now), `intake_bytes_peak` and `intake_bytes_max`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bound and what is held against it.
#[derive(Debug)]
pub struct IntakeBytes {
    max: u64,
    room: Arc<Semaphore>,
    /// Bytes held now (what the permits taken stand for, counted apart from them).
    held: Arc<AtomicU64>,
    peak: AtomicU64,
    /// Times an intake found no room and waited.
    waits: AtomicU64,
}

/// Bytes held until dropped.
#[derive(Debug)]
pub struct IntakeHeld {
    _permit: OwnedSemaphorePermit,
    n: u64,
    held: Arc<AtomicU64>,
}

impl Drop for IntakeHeld {
    fn drop(&mut self) {
        self.held.fetch_sub(self.n, Ordering::Relaxed);
    }
}

impl IntakeBytes {
    pub fn new(max: u64) -> IntakeBytes {
        let max = max.clamp(1, Semaphore::MAX_PERMITS as u64);
        IntakeBytes {
            max,
            room: Arc::new(Semaphore::new(max as usize)),
            held: Arc::default(),
            peak: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        }
    }

    /// `n` bytes as the semaphore counts them: at most the whole bound (the configuration
    /// keeps every single input within it), at most what one acquire takes.
    fn permits(&self, n: u64) -> u32 {
        u32::try_from(n.min(self.max)).unwrap_or(u32::MAX)
    }

    /// `n` bytes now, or `None` when they do not fit (counted as a wait).
    pub fn try_take(&self, n: u64) -> Option<IntakeHeld> {
        let p = self.try_take_quietly(n);
        if p.is_none() {
            self.waits.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    /// `n` bytes once they fit (waiters are served in order).
    pub async fn take(&self, n: u64) -> Option<IntakeHeld> {
        if let Some(h) = self.try_take_quietly(n) {
            return Some(h);
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        let k = self.permits(n);
        let p = self.room.clone().acquire_many_owned(k).await;
        p.ok().map(|p| self.held_now(p, k))
    }

    fn try_take_quietly(&self, n: u64) -> Option<IntakeHeld> {
        let k = self.permits(n);
        let p = self.room.clone().try_acquire_many_owned(k);
        p.ok().map(|p| self.held_now(p, k))
    }

    fn held_now(&self, p: OwnedSemaphorePermit, k: u32) -> IntakeHeld {
        let n = u64::from(k);
        let now = self.held.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
        IntakeHeld {
            _permit: p,
            n,
            held: self.held.clone(),
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The most held at once since the start.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_at_most_the_bound_and_gives_back_on_drop() {
        let b = IntakeBytes::new(100);
        let a = b.try_take(60).expect("60 of 100");
        assert!(b.try_take(41).is_none(), "101 of 100 taken");
        let c = b.try_take(40).expect("the last 40");
        assert_eq!((b.held(), b.peak(), b.waits()), (100, 100, 1));
        drop(a);
        assert_eq!(b.held(), 40);
        assert!(b.try_take(60).is_some());
        drop(c);
        assert_eq!((b.held(), b.peak()), (0, 100));
    }

    #[tokio::test]
    async fn take_waits_for_room() {
        let b = Arc::new(IntakeBytes::new(10));
        let first = b.try_take(10).expect("all of it");
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.take(5).await.map(|_| b2.peak()) });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "took 5 with none free");
        drop(first);
        let peak = waiter.await.expect("join");
        assert_eq!(peak, Some(10));
    }
}

/// One bound per intake: a stream client that never reads its answers holds no bulk file
/// back, and the other way round.
#[derive(Debug)]
pub struct Intakes {
    pub bulk: IntakeBytes,
    pub stream: IntakeBytes,
}

impl Intakes {
    pub fn new(max: u64) -> Intakes {
        Intakes {
            bulk: IntakeBytes::new(max),
            stream: IntakeBytes::new(max),
        }
    }
}

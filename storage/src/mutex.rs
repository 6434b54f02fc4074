//! [`lock`]: a mutex's guard whether or not a panic poisoned it. A panic anywhere stops the
//! process (the daemon's panic hook), so what a poisoned mutex guards is never used after
//! one for anything that outlives it; going on is what lets the stop itself be orderly.
//! Used wherever roost takes a `Mutex`, so that no `unwrap` on a lock is left.

use std::sync::{Mutex, MutexGuard};

/// `m.lock()`, taking the guard from a poisoned mutex too.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a mutex poisoned by a panicking holder still hands out its guard, with the
    /// value the holder left. Method: poison one on purpose, then lock it.
    #[test]
    fn a_poisoned_mutex_still_locks() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let held = std::sync::Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let mut g = held.lock().unwrap();
            *g = 2;
            panic!("poison it while holding the guard");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 2);
    }
}

//! The small pieces of tokio plumbing `serve` and `follow` share: running a blocking log
//! call on the blocking pool (or inline, for a log that says it never blocks: a
//! simulator's, whose runs must not depend on real threads), watching the shutdown signal, and re-raising a task's panic
//! (a crash is a crash: a panicking task must not vanish into its `JoinHandle`).

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinError;

use crate::log::{FollowerLog, LeaderLog};

/// The blocking pool dropped a task: the runtime is shutting down.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cancelled;

/// Runs `f(&log)` for the leader's side: on the blocking pool, or inline when the log says
/// so (`LeaderLog::calls_inline`).
pub(crate) async fn lead_call<L, T, Fn>(log: &Arc<L>, f: Fn) -> Result<T, Cancelled>
where
    L: LeaderLog,
    T: Send + 'static,
    Fn: FnOnce(&L) -> T + Send + 'static,
{
    blocking(LeaderLog::calls_inline(&**log), log, f).await
}

/// [`lead_call`] for the follower's side (`FollowerLog::calls_inline`).
pub(crate) async fn follow_call<F, T, Fn>(log: &Arc<F>, f: Fn) -> Result<T, Cancelled>
where
    F: FollowerLog,
    T: Send + 'static,
    Fn: FnOnce(&F) -> T + Send + 'static,
{
    blocking(FollowerLog::calls_inline(&**log), log, f).await
}

/// Runs `f(&shared)` on the blocking pool, or at once when `inline`. A panic in `f` is
/// re-raised in the caller.
async fn blocking<S, T, Fn>(inline: bool, shared: &Arc<S>, f: Fn) -> Result<T, Cancelled>
where
    S: Send + Sync + 'static + ?Sized,
    T: Send + 'static,
    Fn: FnOnce(&S) -> T + Send + 'static,
{
    if inline {
        return Ok(f(shared));
    }
    let shared = Arc::clone(shared);
    match tokio::task::spawn_blocking(move || f(&shared)).await {
        Ok(v) => Ok(v),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(Cancelled),
        },
    }
}

/// Re-raises a finished task's panic; a cancelled task (runtime shutdown) is ignored.
pub(crate) fn check_join(done: Result<(), JoinError>) {
    if let Err(e) = done {
        if let Ok(panic) = e.try_into_panic() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// True once shutdown was asked for, or its sender is gone (nobody can ask any more, so
/// the owner is gone too).
pub(crate) fn shutdown_requested(rx: &watch::Receiver<bool>) -> bool {
    *rx.borrow() || rx.has_changed().is_err()
}

/// Resolves once shutdown is asked for (or its sender is dropped).
pub(crate) async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// A log watch's next value (a shippable or durable end), marked seen; never, without one.
/// `Err` once its sender is gone.
pub(crate) async fn watch_moved(
    rx: &mut Option<watch::Receiver<crate::log::Lsn>>,
) -> Result<crate::log::Lsn, watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await.map(|()| *rx.borrow_and_update()),
        None => std::future::pending().await,
    }
}

//! SIGTERM and SIGINT for the whole process (issue 42, "every stop stops"): one watcher
//! thread, installed once, that outlives every life of a cluster node and every state
//! between them. A signal is never lost between two lives, nor while a life ends.
//!
//! - While a life serves ([`Phase::Serving`]), a signal only sets the request; the serve
//!   loop sees it ([`StopRequest::wait`]) and stops gracefully (in-flight batches finish).
//! - Between lives and before the first ([`Phase::Between`]: starting, recovering, joining
//!   a cluster, reconciling, cutting, re-seeding, re-opening as a follower), nothing is in
//!   flight and nothing was answered that is not durable: the process exits 0 at once. Every
//!   step there is crash-safe (a `kill -9` at any moment is what the crash tests drive), so
//!   exiting is what a stop has to do, and the next start finishes what was begun.
//!
//! It never decides whether a life ends: the serve loop and `cli::serve` do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;
use tracing::info;

use crate::error::EXIT_OK;

/// What the process does now, as far as a stop is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A serve loop runs and stops gracefully on a request.
    Serving,
    /// No serve loop runs and nothing is in flight: a request exits the process at once.
    Between(&'static str),
}

/// A stop asked for by a signal, for the whole process.
pub struct StopRequest {
    requested: AtomicBool,
    notify: Notify,
    /// Read and written under its lock together with `requested`, so that a request and
    /// an entry into [`Phase::Between`] always see each other (one of them exits).
    phase: Mutex<Phase>,
}

static STOP: OnceLock<StopRequest> = OnceLock::new();
static INSTALLED: Mutex<bool> = Mutex::new(false);

impl StopRequest {
    fn new() -> StopRequest {
        StopRequest {
            requested: AtomicBool::new(false),
            notify: Notify::new(),
            phase: Mutex::new(Phase::Serving),
        }
    }

    /// Whether SIGTERM or SIGINT came.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Resolves once a stop is requested (at once if it was already).
    pub async fn wait(&self) {
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.requested() {
                return;
            }
            n.await;
        }
    }

    /// Enters `phase`. Entering [`Phase::Between`] after a request came exits at once: the
    /// watcher saw `Serving` and left the stop to a loop that no longer runs.
    pub fn enter(&self, phase: Phase) {
        let mut p = roost_storage::lock(&self.phase);
        *p = phase;
        if let Phase::Between(what) = phase {
            if self.requested() {
                exit_between(what, "a stop asked for");
            }
        }
    }

    fn request(&self, name: &str) {
        let p = roost_storage::lock(&self.phase);
        self.requested.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
        if let Phase::Between(what) = *p {
            exit_between(what, name);
        }
        drop(p);
        info!("{name}: stopping");
    }
}

/// Exits 0 while no serve loop runs (see the module comment).
fn exit_between(what: &str, why: &str) -> ! {
    info!(
        state = what,
        "{why} while {what}: exiting now (nothing is in flight; the next start finishes what was begun)"
    );
    crate::control::notify::stopping(&format!("stopping: {why} while {what}"));
    std::process::exit(EXIT_OK)
}

/// The process's stop request, its watcher started on the first call (later calls return
/// the same one).
pub fn install() -> std::io::Result<&'static StopRequest> {
    let stop = STOP.get_or_init(StopRequest::new);
    let mut done = INSTALLED
        .lock()
        .map_err(|_| std::io::Error::other("signal watcher lock poisoned"))?;
    if !*done {
        watch(stop)?;
        *done = true;
    }
    Ok(stop)
}

/// The signals are registered before this returns (no window without a handler); the
/// thread then waits for them for the life of the process.
fn watch(stop: &'static StopRequest) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut term, mut int) = {
        let _in = rt.enter();
        (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        )
    };
    std::thread::Builder::new()
        .name("roost-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                loop {
                    let name = tokio::select! {
                        Some(()) = term.recv() => "SIGTERM",
                        Some(()) = int.recv() => "SIGINT",
                        else => return,
                    };
                    stop.request(name);
                }
            })
        })?;
    Ok(())
}

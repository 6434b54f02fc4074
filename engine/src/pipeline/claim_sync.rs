//! A standing thread that syncs the WAL for a claim step while the worker prepares the
//! group's results (`plan.rs`, `sync_claims`): a handoff per group instead of a thread
//! started and joined per group, which on a busy machine put the thread's start on the
//! client's wait. A leaf: it knows the WAL, not the engine.

use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use roost_storage::Clock;
use roost_wal::{Lsn, Wal, WalError};

/// One sync asked for: the lsn to make durable, and where its outcome goes (when the WAL
/// was durable through it, or why not).
type Job = (Lsn, SyncSender<Result<Instant, WalError>>);

/// The thread and its queue; stopped (queue closed, thread joined) at drop.
pub(super) struct ClaimSyncer {
    /// `None` when no thread could be had.
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl ClaimSyncer {
    /// Starts the thread on `wal`, telling when a sync ended by `clock`. When no thread can
    /// be had, [`ClaimSyncer::ask`] answers `None` and each claim step syncs after preparing
    /// (`sync_claims`).
    pub fn start(wal: Arc<Wal>, clock: Clock) -> ClaimSyncer {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("roost-claim-sync".into())
            .spawn(move || {
                for (lsn, reply) in rx {
                    let _ = reply.send(wal.sync_to(lsn).map(|()| clock.now()));
                }
            })
            .ok();
        let jobs = thread.as_ref().map(|_| tx);
        ClaimSyncer { jobs, thread }
    }

    /// Asks for the WAL durable through `lsn`; the answer comes on the returned receiver.
    /// `None` when the thread is gone: the caller syncs itself.
    pub fn ask(&self, lsn: Lsn) -> Option<Receiver<Result<Instant, WalError>>> {
        let (reply, rx) = mpsc::sync_channel(1);
        self.jobs.as_ref()?.send((lsn, reply)).ok()?;
        Some(rx)
    }
}

impl Drop for ClaimSyncer {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

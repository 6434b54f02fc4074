//! A standing thread that waits for a standby's shard flushes and syncs its audit log behind
//! its fetches (`apply.rs`): the effects of the claims in one fetched chunk are made durable
//! while the leader finishes them, so the chunk that brings their `done` records seldom waits.
//! A leaf: it knows the shard slots and the audit log, not the engine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use roost_wal::{Lsn, Wal};

use super::owner::ShardSlot;
use crate::error::EngineError;

/// A shard's flush already sent to its owner, and where the owner answers.
pub(super) type SentFlush = (Arc<ShardSlot>, Receiver<Result<(), EngineError>>);

/// One flush to finish: the shards' answers to wait for, then the audit log synced through
/// the last row (if any); the outcome goes to the reply.
struct Job {
    shards: Vec<SentFlush>,
    last_row: Option<Lsn>,
    reply: SyncSender<Result<(), EngineError>>,
}

/// The thread and its queue; stopped (queue closed, thread joined) at drop.
pub(super) struct EffectsFlusher {
    /// `None` when no thread could be had: the caller flushes itself.
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl EffectsFlusher {
    /// Starts the thread. A failed flush latches `failed` (the engine's flag) as well as
    /// reaching the job's reply.
    pub fn start(audit: Arc<Wal>, failed: Arc<AtomicBool>) -> EffectsFlusher {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("roost-effects-flush".into())
            .spawn(move || {
                for job in rx {
                    let r = finish(&job.shards, job.last_row, &audit, &|| {
                        failed.load(Ordering::SeqCst)
                    });
                    if r.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    let _ = job.reply.send(r);
                }
            })
            .ok();
        let jobs = thread.as_ref().map(|_| tx);
        EffectsFlusher { jobs, thread }
    }

    /// Hands over flushes already sent to the shard owners; the outcome comes on the
    /// returned receiver. `Err(shards)` when the thread is gone: the caller waits itself.
    #[allow(clippy::result_large_err)]
    pub fn ask(
        &self,
        shards: Vec<SentFlush>,
        last_row: Option<Lsn>,
    ) -> Result<Receiver<Result<(), EngineError>>, Vec<SentFlush>> {
        let Some(jobs) = self.jobs.as_ref() else {
            return Err(shards);
        };
        let (reply, rx) = mpsc::sync_channel(1);
        let job = Job {
            shards,
            last_row,
            reply,
        };
        match jobs.send(job) {
            Ok(()) => Ok(rx),
            Err(mpsc::SendError(job)) => Err(job.shards),
        }
    }
}

/// Every shard's answer, then the audit log synced through `last_row`: a flush's tail, on
/// this thread or on the fetch path (`apply.rs`).
pub(super) fn finish(
    shards: &[SentFlush],
    last_row: Option<Lsn>,
    audit: &Wal,
    failed: &dyn Fn() -> bool,
) -> Result<(), EngineError> {
    wait_all(shards, failed)?;
    if let Some(last) = last_row {
        audit.sync_to(last)?;
    }
    Ok(())
}

/// Waits for every shard's answer; the first failure is returned after all have answered.
fn wait_all(shards: &[SentFlush], failed: &dyn Fn() -> bool) -> Result<(), EngineError> {
    let mut first = Ok(());
    for (slot, rx) in shards {
        let r = slot.wait(rx, failed);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

impl Drop for EffectsFlusher {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

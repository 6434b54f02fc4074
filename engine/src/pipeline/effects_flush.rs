//! The one durability tail of applied effects ([`effects_durable`]: every touched shard's
//! flush sent to its owner before any is waited for, every owner waited for and the first
//! failure returned, then the audit log synced through the last row), run by the tail's
//! rounds for live claims and recovery (`settle.rs`) and by a standby for its fetched chunks
//! (`held.rs`, `apply.rs`); and a standing thread that runs its second half behind a
//! standby's fetches, so the chunk that brings their `done` records seldom waits. A leaf: it
//! knows the shard slots and the audit log, not the engine.

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
                    let r = wait_durable(&job.shards, job.last_row, &audit, &|| {
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

/// The one tail: each shard in `slots` flushed (all sent, then all waited for), then the
/// audit log synced through `last_row`. One error behaviour for every caller: a failed
/// send returns at once (nothing sent is left unanswered: each owner answers its flush on
/// its own), a failed flush is returned after every owner has answered.
pub(super) fn effects_durable<'a>(
    slots: impl IntoIterator<Item = &'a Arc<ShardSlot>>,
    last_row: Option<Lsn>,
    audit: &Wal,
    failed: &dyn Fn() -> bool,
) -> Result<(), EngineError> {
    wait_durable(&send_flushes(slots)?, last_row, audit, failed)
}

/// The tail's first half: each shard's flush sent to its owner, in the order given.
pub(super) fn send_flushes<'a>(
    slots: impl IntoIterator<Item = &'a Arc<ShardSlot>>,
) -> Result<Vec<SentFlush>, EngineError> {
    (slots.into_iter().enumerate())
        .map(|(k, slot)| Ok((slot.clone(), slot.send_flush(k)?)))
        .collect()
}

/// The tail's second half: every shard's answer, then the audit log synced through
/// `last_row`; on the flusher thread or the caller's.
pub(super) fn wait_durable(
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

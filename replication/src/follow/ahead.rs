//! Fetching ahead (issue 42): a follower sends its next fetch while the records of the
//! last one sync, so that a leader with few batches in flight never waits for a whole
//! standby cycle (receive, append, sync) before it can ship the next. Only what is durable
//! is acknowledged: a `FetchAhead` carries the durable end beside its `fetch_lsn`, and a
//! `Durable` frame tells the leader when an append's records are durable (as the log's
//! durable watch says, else when it lands), while a fetch waits or before the next answer
//! is acted on. The model is
//! `roost-repmodel election --fetch-before-sync` (docs/replication-model.md): the leader's
//! high watermark and its in-sync catch-up both read the durable end, never `fetch_lsn`.
//!
//! One append runs at a time, in lsn order: records that come while one runs wait until it
//! lands (`settle`). A session never ends, and no other answer is acted on, with one
//! running.

use tokio::sync::watch;
use tracing::warn;

use super::{Appended, End, FollowError, Pending, Sent, Session};
use crate::log::{Entry, Epoch, FollowerLog, Lsn};
use crate::task::{follow_call, watch_moved};
use crate::transport::Stream;
use crate::wire::{kind, Message};

impl<F: FollowerLog> Session<'_, F> {
    /// Starts appending `entries` (the answer to `sent`, with the leader's `hw`) beside the
    /// next fetch, which asks from where they end.
    pub(super) fn append_ahead(&mut self, sent: Sent, hw: Lsn, entries: Vec<Entry>) {
        let due = after(sent, &entries);
        if entries.is_empty() && hw <= self.hw_passed {
            return;
        }
        self.hw_passed = hw;
        let count = entries.len() as u64;
        let bytes = entries.iter().map(|e| e.payload.len() as u64).sum();
        let log = std::sync::Arc::clone(self.log);
        let run = async move {
            follow_call(&log, move |l| l.append(&entries, hw).map(|()| Sent::of(l))).await
        };
        self.pending = Some(Pending {
            run: Box::pin(run),
            due,
            from: sent.fetch_lsn,
            count,
            bytes,
        });
        self.next = Some(due);
    }

    /// The pending append's outcome once it lands ([`finished`]); never, with none.
    pub(super) async fn landing(&mut self) -> (Option<Pending<F::Error>>, Appended<F::Error>) {
        finished(&mut self.pending).await
    }

    /// Waits for the pending append, if any, to land.
    pub(super) async fn settle(&mut self) -> Result<(), End<F::Error>> {
        if self.pending.is_none() {
            return Ok(());
        }
        let landed = finished(&mut self.pending).await;
        self.landed(landed)
    }

    /// The pending append is done: its records are durable (the log's end is the durable
    /// end), or the follower stops.
    pub(super) fn landed(
        &mut self,
        (pending, appended): (Option<Pending<F::Error>>, Appended<F::Error>),
    ) -> Result<(), End<F::Error>> {
        let Some(p) = pending else {
            return Ok(());
        };
        let now = appended?.map_err(|source| {
            End::Fatal(FollowError::Log {
                op: "append",
                lsn: p.from,
                source,
            })
        })?;
        if now.fetch_lsn != p.due.fetch_lsn || now.last_epoch != p.due.last_epoch {
            // The log moved under the append: start over from what it says.
            self.next = None;
            return Err(self.protocol(format!(
                "the log ends at lsn {} in epoch {} after an append due to end at {} in {}",
                now.fetch_lsn, now.last_epoch, p.due.fetch_lsn, p.due.last_epoch
            )));
        }
        self.durable = now.fetch_lsn;
        self.status.appended(p.count, p.bytes);
        Ok(())
    }

    /// Waits for the pending append to land, acknowledging (`Durable`) what the log's
    /// durable watch says it made durable meanwhile: an answer that came before the append
    /// landed waits for it, but the leader need not wait for the whole append to hear of
    /// its sync. The frame goes between fetches (the leader takes a `Durable` then too).
    pub(super) async fn settle_acking(
        &mut self,
        stream: &mut Stream,
        durable_rx: &mut Option<watch::Receiver<Lsn>>,
    ) -> Result<(), End<F::Error>> {
        let mut told = self.durable;
        while self.pending.is_some() {
            tokio::select! {
                landed = self.landing() => self.landed(landed)?,
                moved = watch_moved(durable_rx) => self.saw_durable(moved, durable_rx),
            }
            // Once landed, the next fetch carries the durable end: no frame needed.
            if self.pending.is_some() && self.durable > told {
                told = self.durable;
                let durable = Message::Durable { durable_lsn: told };
                self.write(stream, &durable, "writing a Durable").await?;
            }
        }
        Ok(())
    }

    /// The log's durable watch moved (`moved`, `Err` once its sender is gone: no longer
    /// watched): what it says is durable counts, up to the end of the running append (the
    /// records this session wrote; nothing else is appended meanwhile).
    pub(super) fn saw_durable(
        &mut self,
        moved: Result<Lsn, watch::error::RecvError>,
        durable_rx: &mut Option<watch::Receiver<Lsn>>,
    ) {
        let Ok(durable) = moved else {
            *durable_rx = None;
            return;
        };
        if let Some(p) = &self.pending {
            self.durable = self.durable.max(durable.min(p.due.fetch_lsn));
        }
    }

    /// A leader that answers a `FetchAhead` with "unknown message type" predates it: fetch
    /// the classic way from then on (the connection is ended and made again).
    pub(super) fn refused_ahead(&mut self, message: &str) {
        let unknown = format!("unknown message type {}", kind::FETCH_AHEAD);
        if self.ahead && message.ends_with(&unknown) {
            warn!(
                leader = self.leader,
                "the leader does not know FetchAhead: fetching after each sync"
            );
            self.ahead = false;
        }
    }
}

/// The pending append's outcome once it lands, taking it; never, with none. Cancel-safe:
/// dropped before it lands, the append stays pending.
async fn finished<E>(pending: &mut Option<Pending<E>>) -> (Option<Pending<E>>, Appended<E>) {
    let Some(p) = pending.as_mut() else {
        return std::future::pending().await;
    };
    let appended = (&mut p.run).await;
    (pending.take(), appended)
}

/// What the log says once `entries`, the answer to `sent`, are appended.
fn after(sent: Sent, entries: &[Entry]) -> Sent {
    let (fetch_lsn, last_epoch): (Lsn, Epoch) = match entries.last() {
        Some(e) => (e.lsn + 1, e.epoch),
        None => (sent.fetch_lsn, sent.last_epoch),
    };
    Sent {
        current_epoch: sent.current_epoch,
        fetch_lsn,
        last_epoch,
    }
}

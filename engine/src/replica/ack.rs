//! Acknowledgements (docs/replication.md, `Kip320.tla`): what each standby holds durably,
//! the high watermark below which every record is durable here and on a standby in sync,
//! the wait an `ack = "standby"` answer makes for it, and stepping down when a higher epoch
//! exists. The protocol itself (TCP, fetch, the truncation rule) is `roost_replication`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use roost_storage::lock;
use roost_wal::Lsn;
use tracing::{info, warn};

use super::role::{Replication, StandbyState, POSITIONS_KEPT};
use crate::config::{Ack, StandbyLost};
use crate::error::EngineError;
use crate::pipeline::Role;

impl Replication {
    /// The primary heard of a higher epoch: it takes no more batches from now on, and every
    /// answer waiting for a standby gives up.
    pub fn step_down(&self, epoch: u32) {
        let mut role = lock(&self.role);
        if *role == Role::Primary && epoch > self.epoch() {
            warn!(
                epoch,
                own = self.epoch(),
                "a higher leader epoch exists: stepping down, taking no more batches"
            );
            // Known before anything else: a restart must not resume the old epoch. A failed
            // write latches the engine; the step down happens all the same.
            let _ = self.learn_epoch(epoch);
            *role = Role::SteppedDown { epoch };
            drop(role);
            self.wake();
        }
    }

    /// A standby acknowledged `fetch_lsn`: everything below it is durable there (a classic
    /// fetch's lsn, or the durable end a standby fetching ahead reports: never what it
    /// holds unsynced, so the hw and the in-sync catch-up both read a durable end). Returns
    /// the high watermark, the lsn below which every record is durable here and on a
    /// standby.
    pub fn standby_acked(&self, name: &str, fetch_lsn: Lsn) -> Lsn {
        let mut s = lock(&self.standbys);
        let e = s
            .entry(name.to_owned())
            .or_insert_with(|| StandbyState::first_heard(true, false));
        if e.acked == 0 || !e.connected {
            info!(standby = name, fetch_lsn, "standby connected");
        }
        e.acked = fetch_lsn;
        e.last_fetch = Instant::now();
        e.connected = true;
        e.behind = false;
        let hw = self.high_watermark_with(&s);
        let told = self.acked_told.swap(hw, Ordering::SeqCst);
        drop(s);
        // A load first: no write to a shared line on every fetch, only after a loss.
        if self.alone_logged.load(Ordering::Relaxed)
            && self.alone_logged.swap(false, Ordering::Relaxed)
        {
            info!(
                standby = name,
                fetch_lsn, "a standby is in sync again: results wait for it"
            );
        }
        self.pins().fetched(name, fetch_lsn);
        self.note_position();
        if hw > told {
            self.ack_wakes.fetch_add(1, Ordering::Relaxed);
            self.acked_cv.notify_all();
        }
        hw
    }

    /// Remembers where the WAL is, in lsns and in bytes, at this acknowledgement.
    fn note_position(&self) {
        let (lsn, bytes) = (self.wal.next_lsn(), self.wal.append_bytes());
        let mut p = lock(&self.positions);
        if p.back().is_none_or(|(l, _)| *l < lsn) {
            p.push_back((lsn, bytes));
        }
        while p.len() > POSITIONS_KEPT {
            p.pop_front();
        }
    }

    /// How many WAL bytes were appended after the record a standby acknowledged up to
    /// (`acked`): exact when the WAL was at `acked` at some acknowledgement (the usual case),
    /// else counted from the nearest earlier one (an overestimate by at most one fetch).
    pub fn standby_lag_bytes(&self, acked: Lsn) -> u64 {
        let p = lock(&self.positions);
        let at = p
            .iter()
            .rev()
            .find(|(l, _)| *l <= acked)
            .or(p.front())
            .map_or(0, |(_, b)| *b);
        self.wal.append_bytes().saturating_sub(at)
    }

    /// Below it every record is durable here and on at least one standby in sync (without
    /// replication, or before any standby: what is durable here).
    pub fn high_watermark(&self) -> Lsn {
        self.high_watermark_with(&lock(&self.standbys))
    }

    /// [`Replication::high_watermark`] from `standbys`, locked by the caller (so that an answer
    /// can check it and wait for the next acknowledgement without missing one between).
    fn high_watermark_with(&self, standbys: &HashMap<String, StandbyState>) -> Lsn {
        if let Some(hw) = self.isr_high_watermark(standbys) {
            return hw;
        }
        let timeout = self.config.replication.standby_timeout();
        let best = standbys
            .values()
            .filter(|s| s.connected && s.last_fetch.elapsed() < timeout)
            .map(|s| s.acked)
            .max();
        match best {
            Some(a) => a.min(self.durable_end()),
            None if self.config.replication.ack == Ack::Standby => 1,
            None => self.durable_end(),
        }
    }

    /// No standby has been in sync for `standby_timeout_ms`: since the last fetch of any
    /// standby, or since this node began to lead.
    fn standby_lost(&self) -> bool {
        let timeout = self.config.replication.standby_timeout();
        let since = *lock(&self.since);
        let last = lock(&self.standbys)
            .values()
            .map(|s| s.last_fetch)
            .fold(since, |a, b| a.max(b));
        !self.standby_in_sync() && last.elapsed() > timeout
    }

    /// `Err` once answers waiting for a standby must give up (the node stops or stepped
    /// down): a duplicate waiting on a batch in flight gives up with it.
    pub(super) fn still_answering(&self, lsn: Lsn) -> Result<(), EngineError> {
        if self.giving_up.load(Ordering::SeqCst) || self.role() != Role::Primary {
            return Err(EngineError::Unreplicated { lsn });
        }
        Ok(())
    }

    /// Whether some standby is in sync (fetched within `standby_timeout_ms`).
    fn standby_in_sync(&self) -> bool {
        if let Some(in_sync) = self.isr_in_sync() {
            return in_sync;
        }
        let timeout = self.config.replication.standby_timeout();
        lock(&self.standbys)
            .values()
            .any(|s| s.connected && s.last_fetch.elapsed() < timeout)
    }

    /// Under `ack = "standby"`, waits until a standby holds the record at `lsn` durably (or,
    /// with `when_standby_lost = "alone"`, until none is in sync for `standby_timeout_ms`).
    /// `Unreplicated` when the node stops or steps down meanwhile: nothing is published, and
    /// the batch stays claimed for recovery (or for the new primary).
    /// `below`: where the last checkpoint starts (read only when needed). Returns how long
    /// it waited for a standby's acknowledgement (`None`: none was waited for: local ack,
    /// below the checkpoint, or published alone).
    pub(super) fn wait_replicated(
        &self,
        lsn: Lsn,
        below: &dyn Fn() -> Lsn,
    ) -> Result<Option<Duration>, EngineError> {
        let cfg = &self.config.replication;
        if self.fence_if_lapsed() {
            return Err(EngineError::Unreplicated { lsn });
        }
        if cfg.ack == Ack::Local {
            return Ok(None);
        }
        if cfg.when_standby_lost == StandbyLost::Wait && lsn < below() {
            // Under "wait" no checkpoint passes the high watermark: it was replicated.
            return Ok(None);
        }
        let t0 = Instant::now();
        let mut warned = false;
        loop {
            if self.high_watermark() > lsn {
                return Ok(Some(t0.elapsed()));
            }
            if self.giving_up.load(Ordering::SeqCst) || self.role() != Role::Primary {
                return Err(EngineError::Unreplicated { lsn });
            }
            let lost = self.standby_lost();
            if lost && cfg.when_standby_lost == StandbyLost::Alone {
                self.alone.fetch_add(1, Ordering::Relaxed);
                if !self.alone_logged.swap(true, Ordering::Relaxed) {
                    warn!(lsn, "no standby in sync: publishing on local durability alone (when_standby_lost = \"alone\"); these batches are lost if this node is lost before a standby has them");
                }
                return Ok(None);
            }
            if lost && !warned && t0.elapsed() > cfg.standby_timeout() {
                warned = true;
                warn!(
                    lsn,
                    "no standby in sync: results wait for one (when_standby_lost = \"wait\")"
                );
            }
            self.wait_for_acknowledgement(lsn);
        }
    }

    /// Waits (at most 50 ms) for the next acknowledgement, unless the high watermark is past
    /// `lsn` already: checked under the lock an acknowledgement takes, so none is missed
    /// between the check and the wait (a missed one cost the full 50 ms).
    fn wait_for_acknowledgement(&self, lsn: Lsn) {
        let standbys = lock(&self.standbys);
        let hw = self.high_watermark_with(&standbys);
        if hw > lsn {
            return;
        }
        // The next acknowledgement that raises the high watermark above what this answer
        // sees wakes it, whatever lowered it meanwhile (a standby's timeout, an in-sync set
        // changed beside an acknowledgement).
        self.acked_told.fetch_min(hw, Ordering::SeqCst);
        let _woken = self
            .acked_cv
            .wait_timeout(standbys, Duration::from_millis(50))
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }

    /// Whether answers are waiting for a standby that is not in sync (for status).
    pub fn waiting_for_standby(&self) -> bool {
        self.config.replication.ack == Ack::Standby
            && self.role() == Role::Primary
            && !self.standby_in_sync()
            && self.config.replication.when_standby_lost == StandbyLost::Wait
    }
}

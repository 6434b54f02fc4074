//! The engine's side of replication (docs/replication.md, `Kip320.tla`): what it does with
//! the state `log_role.rs` keeps: the high watermark (what a standby holds durably), the wait
//! an `ack = "standby"` answer makes for it, epochs taken and learnt, stepping down. The
//! standby's apply of fetched records is `apply.rs`, promotion and fencing `cluster.rs`. The
//! protocol itself (TCP, fetch, the truncation rule) is `roost_replication`; the daemon's
//! `replica` part joins the two.
//!
//! Epochs (`EpochFile`): a promotion, or a first start as primary, mints `highest known + 1`
//! (made unique per node by its low byte, the node id) and writes it to `EPOCH` and to
//! `LEADER_EPOCHS` (at the WAL's next lsn) before its first append; a primary that restarts
//! resumes the epoch it led while that is the highest it knows. A standby learns the primary's epoch
//! from its answers and writes it to `EPOCH` before acting on it: a promotion after a
//! restart must never reuse an epoch the old primary wrote under.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use roost_wal::Lsn;
use tracing::{info, warn};

use super::log_role::{
    last_epoch_of, next_epoch, write_epoch_file, EpochFile, Replication, Role, StandbyState,
    POSITIONS_KEPT,
};
use super::{lock, Engine};
use crate::config::{Ack, StandbyLost};
use crate::error::EngineError;

impl Engine {
    /// The replication state: the standbys, the in-sync set, the view of the primary, the
    /// claims held back (`log_role.rs`).
    pub fn replication(&self) -> &Replication {
        &self.repl
    }

    pub fn role(&self) -> Role {
        *lock(&self.repl.role)
    }

    /// The highest leader epoch this node knows (its own while primary).
    pub fn epoch(&self) -> u32 {
        self.repl.epoch.load(Ordering::SeqCst)
    }

    /// The leader epoch, while this node is the primary.
    pub fn leader_epoch(&self) -> Option<u32> {
        (self.role() == Role::Primary).then(|| self.epoch())
    }

    /// Learns a higher epoch: `EPOCH` is rewritten before this returns (a lower or equal
    /// one is ignored).
    pub fn learn_epoch(&self, epoch: u32) -> Result<(), EngineError> {
        let _serial = lock(&self.repl.epochs);
        if epoch <= self.epoch() {
            return Ok(());
        }
        let led = self.repl.led.load(Ordering::SeqCst);
        self.write_epochs(EpochFile { known: epoch, led })?;
        self.repl.epoch.fetch_max(epoch, Ordering::SeqCst);
        Ok(())
    }

    fn write_epochs(&self, e: EpochFile) -> Result<(), EngineError> {
        write_epoch_file(self.storage.as_ref(), &self.layout.epoch(), e)
            .inspect_err(|_| self.fail())
    }

    /// A primary's start: it resumes the epoch it led if that is still the highest known,
    /// else takes a new one ([`EpochFile`] says why).
    pub(super) fn lead_at_start(&self) -> Result<u32, EngineError> {
        let led = self.repl.led.load(Ordering::SeqCst);
        let known = self.epoch().max(self.wal.last_record_epoch());
        if led == 0 || led != known {
            return self.take_new_epoch();
        }
        let next = self.wal.next_lsn();
        let mut epochs = lock(&self.repl.epochs);
        if epochs.latest().map(|(e, _)| e) != Some(led) {
            epochs.truncate_from_end(next)?;
            epochs.assign(led, next)?;
        }
        self.wal.set_epoch(led)?;
        info!(epoch = led, next_lsn = next, "leader epoch resumed");
        Ok(led)
    }

    /// Becomes the leader of a new epoch (above the highest known, this node's id in the low
    /// byte) from the WAL's next lsn: the
    /// epoch is durable in `EPOCH` and `LEADER_EPOCHS` before anything is appended under it.
    pub(super) fn take_new_epoch(&self) -> Result<u32, EngineError> {
        let known = self.highest_epoch_known();
        // The next epoch with this node's id in its low byte: above every epoch known, and
        // never the same as one another node mints.
        let Some(epoch) = next_epoch(known, self.config.replication.node_id()) else {
            return Err(EngineError::Replication(format!(
                "cannot take an epoch above {known}: the next would reach the ceiling {}",
                roost_replication::EPOCH_CEILING
            )));
        };
        self.take_epoch(epoch)
    }

    /// The highest epoch in `LEADER_EPOCHS`, the WAL and `EPOCH`.
    pub fn highest_epoch_known(&self) -> u32 {
        lock(&self.repl.epochs)
            .latest()
            .map_or(0, |(e, _)| e)
            .max(self.wal.last_record_epoch())
            .max(self.epoch())
    }

    /// Leads `epoch` (above every epoch known: the caller checked) from the WAL's next lsn,
    /// durable in `EPOCH` and `LEADER_EPOCHS` before anything is appended under it.
    pub(super) fn take_epoch(&self, epoch: u32) -> Result<u32, EngineError> {
        let next = self.wal.next_lsn();
        let mut epochs = lock(&self.repl.epochs);
        self.write_epochs(EpochFile {
            known: epoch,
            led: epoch,
        })?;
        self.repl.led.store(epoch, Ordering::SeqCst);
        self.repl.epoch.fetch_max(epoch, Ordering::SeqCst);
        // An epoch that got no record (a start without a batch) gives way to this one.
        epochs.truncate_from_end(next)?;
        epochs.assign(epoch, next)?;
        self.wal.set_epoch(epoch)?;
        info!(epoch, from_lsn = next, "leader epoch taken");
        Ok(epoch)
    }

    /// The primary heard of a higher epoch: it takes no more batches from now on, and every
    /// answer waiting for a standby gives up.
    pub fn step_down(&self, epoch: u32) {
        let mut role = lock(&self.repl.role);
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
            self.repl.acked_cv.notify_all();
            self.finished_cv.notify_all();
        }
    }

    /// `Ok` while this node may take batches (the primary).
    pub(super) fn check_primary(&self) -> Result<(), EngineError> {
        self.fence_if_lapsed();
        match self.role() {
            Role::Primary => Ok(()),
            role => Err(EngineError::NotPrimary { role: role.name() }),
        }
    }

    /// The lsn after the last durable record: what a standby may be sent.
    pub fn durable_end(&self) -> Lsn {
        self.wal.synced_lsn() + 1
    }

    /// A standby fetched at `fetch_lsn` (everything below it durable there): returns the
    /// high watermark, the lsn below which every record is durable here and on a standby.
    pub fn standby_acked(&self, name: &str, fetch_lsn: Lsn) -> Lsn {
        let mut s = lock(&self.repl.standbys);
        let e = s.entry(name.to_owned()).or_insert(StandbyState {
            acked: 0,
            last_fetch: Instant::now(),
            connected: true,
        });
        if e.acked == 0 || !e.connected {
            info!(standby = name, fetch_lsn, "standby connected");
        }
        e.acked = fetch_lsn;
        e.last_fetch = Instant::now();
        e.connected = true;
        drop(s);
        // A load first: no write to a shared line on every fetch, only after a loss.
        if self.repl.alone_logged.load(Ordering::Relaxed)
            && self.repl.alone_logged.swap(false, Ordering::Relaxed)
        {
            info!(
                standby = name,
                fetch_lsn, "a standby is in sync again: results wait for it"
            );
        }
        self.backup_pins.fetched(name, fetch_lsn);
        self.note_position();
        self.repl.acked_cv.notify_all();
        self.high_watermark()
    }

    /// Remembers where the WAL is, in lsns and in bytes, at this acknowledgement.
    fn note_position(&self) {
        let (lsn, bytes) = (self.wal.next_lsn(), self.wal.append_bytes());
        let mut p = lock(&self.repl.positions);
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
        let p = lock(&self.repl.positions);
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
        self.high_watermark_with(&lock(&self.repl.standbys))
    }

    /// [`Engine::high_watermark`] from `standbys`, locked by the caller (so that an answer
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
        let since = *lock(&self.repl.since);
        let last = lock(&self.repl.standbys)
            .values()
            .map(|s| s.last_fetch)
            .fold(since, |a, b| a.max(b));
        !self.standby_in_sync() && last.elapsed() > timeout
    }

    /// `Err` once answers waiting for a standby must give up (the node stops or stepped
    /// down): a duplicate waiting on a batch in flight gives up with it.
    pub(super) fn still_answering(&self, lsn: Lsn) -> Result<(), EngineError> {
        if self.repl.giving_up.load(Ordering::SeqCst) || self.role() != Role::Primary {
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
        lock(&self.repl.standbys)
            .values()
            .any(|s| s.connected && s.last_fetch.elapsed() < timeout)
    }

    /// Under `ack = "standby"`, waits until a standby holds the record at `lsn` durably (or,
    /// with `when_standby_lost = "alone"`, until none is in sync for `standby_timeout_ms`).
    /// `Unreplicated` when the node stops or steps down meanwhile: nothing is published, and
    /// the batch stays claimed for recovery (or for the new primary).
    pub(super) fn wait_replicated(&self, lsn: Lsn) -> Result<(), EngineError> {
        let cfg = &self.config.replication;
        if self.fence_if_lapsed() {
            return Err(EngineError::Unreplicated { lsn });
        }
        if cfg.ack == Ack::Local {
            return Ok(());
        }
        if cfg.when_standby_lost == StandbyLost::Wait && lsn < self.checkpointed_below() {
            // Under "wait" no checkpoint passes the high watermark: it was replicated.
            return Ok(());
        }
        let t0 = Instant::now();
        let mut warned = false;
        loop {
            if self.high_watermark() > lsn {
                self.stats.latency.replicate.record(t0.elapsed());
                return Ok(());
            }
            if self.repl.giving_up.load(Ordering::SeqCst) || self.role() != Role::Primary {
                return Err(EngineError::Unreplicated { lsn });
            }
            let lost = self.standby_lost();
            if lost && cfg.when_standby_lost == StandbyLost::Alone {
                self.repl.alone.fetch_add(1, Ordering::Relaxed);
                if !self.repl.alone_logged.swap(true, Ordering::Relaxed) {
                    warn!(lsn, "no standby in sync: publishing on local durability alone (when_standby_lost = \"alone\"); these batches are lost if this node is lost before a standby has them");
                }
                return Ok(());
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
        let standbys = lock(&self.repl.standbys);
        if self.high_watermark_with(&standbys) > lsn {
            return;
        }
        let _woken = self
            .repl
            .acked_cv
            .wait_timeout(standbys, Duration::from_millis(50))
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }

    /// Where the last checkpoint starts (1 before the first).
    fn checkpointed_below(&self) -> Lsn {
        lock(&self.checkpoints)
            .last
            .as_ref()
            .map_or(1, |c| c.wal_from)
    }

    /// Whether answers are waiting for a standby that is not in sync (for status).
    pub fn waiting_for_standby(&self) -> bool {
        self.config.replication.ack == Ack::Standby
            && self.role() == Role::Primary
            && !self.standby_in_sync()
            && self.config.replication.when_standby_lost == StandbyLost::Wait
    }

    /// `(epoch, end)` for the fetch protocol: the largest epoch <= `epoch` in this WAL and
    /// the lsn after its last record.
    pub fn end_offset_for(&self, epoch: u32) -> Option<(u32, Lsn)> {
        lock(&self.repl.epochs).end_offset_for(epoch, self.wal.next_lsn())
    }

    /// The epoch of the WAL's last record (0 when empty).
    pub fn last_epoch(&self) -> u32 {
        last_epoch_of(&self.wal, &lock(&self.repl.epochs))
    }
}

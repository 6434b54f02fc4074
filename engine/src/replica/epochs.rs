//! The epochs a node takes and learns (docs/replication.md, `Kip320.tla`; the rules are in
//! `epoch_file.rs`): a primary's start, a promotion, a standby learning its primary's.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use roost_storage::lock;
use roost_wal::Lsn;
use tracing::info;

use super::epoch_file::{last_epoch_of, next_epoch, write_epoch_file, EpochFile};
use super::role::Replication;
use crate::error::EngineError;

impl Replication {
    /// Learns a higher epoch: `EPOCH` is rewritten before this returns (a lower or equal
    /// one is ignored).
    pub fn learn_epoch(&self, epoch: u32) -> Result<(), EngineError> {
        let _serial = lock(&self.epochs);
        if epoch <= self.epoch() {
            return Ok(());
        }
        let led = self.led.load(Ordering::SeqCst);
        self.write_epochs(EpochFile { known: epoch, led })?;
        self.epoch.fetch_max(epoch, Ordering::SeqCst);
        Ok(())
    }

    fn write_epochs(&self, e: EpochFile) -> Result<(), EngineError> {
        write_epoch_file(self.storage.as_ref(), &self.parts.epoch_file, e)
            .inspect_err(|_| self.fail())
    }

    /// A primary's start: it resumes the epoch it led if that is still the highest known,
    /// else takes a new one ([`EpochFile`] says why).
    pub(super) fn lead_at_start(&self) -> Result<u32, EngineError> {
        let led = self.led.load(Ordering::SeqCst);
        let known = self.epoch().max(self.wal.last_record_epoch());
        if led == 0 || led != known {
            return self.take_new_epoch();
        }
        let next = self.wal.next_lsn();
        let mut epochs = lock(&self.epochs);
        if epochs.latest().map(|(e, _)| e) != Some(led) {
            epochs.truncate_from_end(next)?;
            epochs.assign(led, next)?;
        }
        self.ship_written.store(false, Ordering::SeqCst);
        self.wal.set_epoch(led)?;
        info!(epoch = led, next_lsn = next, "leader epoch resumed");
        Ok(led)
    }

    /// Becomes the leader of a new epoch (above the highest known, this node's id in the low
    /// byte) from the WAL's next lsn: the epoch is durable in `EPOCH` and `LEADER_EPOCHS`
    /// before anything is appended under it.
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

    /// A cluster standby won the election: it leads `epoch` (which etcd's counter gave,
    /// above every epoch this node knows) with `isr` as its in-sync standbys.
    pub(super) fn take_won_epoch(
        &self,
        epoch: u32,
        isr: BTreeSet<String>,
    ) -> Result<u32, EngineError> {
        let known = self.highest_epoch_known();
        if epoch <= known {
            return Err(EngineError::Replication(format!(
                "the epoch won in etcd, {epoch}, is not above {known}, which this node knows"
            )));
        }
        let taken = self.take_epoch(epoch)?;
        *lock(&self.isr) = Some(isr);
        self.acked_told.store(0, Ordering::SeqCst);
        // An epoch won in etcd is never resumed (a cluster node starts as a follower), so its
        // records may reach a standby before this node's own sync (`shippable_end`).
        self.ship_written.store(true, Ordering::SeqCst);
        Ok(taken)
    }

    /// The highest epoch in `LEADER_EPOCHS`, the WAL and `EPOCH`.
    pub fn highest_epoch_known(&self) -> u32 {
        lock(&self.epochs)
            .latest()
            .map_or(0, |(e, _)| e)
            .max(self.wal.last_record_epoch())
            .max(self.epoch())
    }

    /// Leads `epoch` (above every epoch known: the caller checked) from the WAL's next lsn,
    /// durable in `EPOCH` and `LEADER_EPOCHS` before anything is appended under it. A
    /// failure latches the engine: `EPOCH` may name an epoch `LEADER_EPOCHS` lacks.
    fn take_epoch(&self, epoch: u32) -> Result<u32, EngineError> {
        self.take_epoch_unlatched(epoch)
            .inspect_err(|_| self.fail())
    }

    fn take_epoch_unlatched(&self, epoch: u32) -> Result<u32, EngineError> {
        self.ship_written.store(false, Ordering::SeqCst);
        let next = self.wal.next_lsn();
        let mut epochs = lock(&self.epochs);
        self.write_epochs(EpochFile {
            known: epoch,
            led: epoch,
        })?;
        self.led.store(epoch, Ordering::SeqCst);
        self.epoch.fetch_max(epoch, Ordering::SeqCst);
        // An epoch that got no record (a start without a batch) gives way to this one.
        epochs.truncate_from_end(next)?;
        epochs.assign(epoch, next)?;
        self.wal.set_epoch(epoch)?;
        info!(epoch, from_lsn = next, "leader epoch taken");
        Ok(epoch)
    }

    /// `(epoch, end)` for the fetch protocol: the largest epoch <= `epoch` in this WAL and
    /// the lsn after its last record.
    pub fn end_offset_for(&self, epoch: u32) -> Option<(u32, Lsn)> {
        lock(&self.epochs).end_offset_for(epoch, self.wal.next_lsn())
    }

    /// The epoch of the WAL's last record (0 when empty).
    pub fn last_epoch(&self) -> u32 {
        last_epoch_of(&self.wal, &lock(&self.epochs))
    }

    /// The first lsn of the epoch this node leads (or last led): every batch an earlier
    /// leader acknowledged is below it.
    pub fn epoch_start(&self) -> Lsn {
        lock(&self.epochs).latest().map_or(1, |(_, start)| start)
    }
}

//! The engine's side of a cluster (issue 27, docs/cluster.md): promotion into an epoch won
//! in etcd, fencing when the leadership lease may have run out, and the in-sync set: a
//! cluster leader's answers wait until every standby in it holds their records, so any
//! member of it (the only nodes etcd lets campaign) holds every acknowledged batch.
//! The etcd side is the `cluster` folder (above this one).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use roost_wal::Lsn;
use tracing::warn;

use super::log_role::{Role, StandbyState};
use super::{lock, Engine};
use crate::config::Ack;
use crate::error::EngineError;

impl Engine {
    /// A cluster standby won the election: it leads `epoch` (which etcd's counter gave, above
    /// every epoch this node knows) with `isr` as its in-sync standbys. Like `roost
    /// promote`, the claims it holds without a `done` are finished before intake opens.
    pub fn promote_at(&self, epoch: u32, isr: BTreeSet<String>) -> Result<u32, EngineError> {
        let known = self.highest_epoch_known();
        if epoch <= known {
            return Err(EngineError::Replication(format!(
                "the epoch won in etcd, {epoch}, is not above {known}, which this node knows"
            )));
        }
        *lock(&self.repl.isr) = Some(isr);
        self.promote_with(|| self.take_epoch(epoch))
    }

    /// The leadership lease may have run out (or etcd names another leader): take no more
    /// batches and give no more answers, at once. Answers waiting for a standby give up;
    /// their batches stay claimed for whoever leads next.
    pub fn fence(&self, why: &str) {
        let mut role = lock(&self.repl.role);
        if *role == Role::Primary {
            let epoch = self.epoch();
            warn!(
                epoch,
                why, "fenced: this node no longer leads and takes no more batches"
            );
            *role = Role::SteppedDown { epoch };
            drop(role);
            self.repl.stop_waiting_for_standby();
            self.finished_cv.notify_all();
        }
    }

    /// Fences this leader if its lease deadline passed (checked before every batch is taken
    /// and every answer given: a process that slept through its deadline stops at the first
    /// thing it does, not when its agent runs again). True when fenced now or before.
    pub(super) fn fence_if_lapsed(&self) -> bool {
        let until = self.repl.lease_until_ms.load(Ordering::SeqCst);
        if until == 0 {
            return false;
        }
        let now = u64::try_from(self.repl.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        if now >= until {
            self.fence("the leadership lease deadline passed before it was renewed");
            return true;
        }
        false
    }

    /// The high watermark of a cluster leader: the lowest acknowledgement among its in-sync
    /// standbys (one that has not fetched yet counts as holding nothing); with none in sync,
    /// nothing is replicated under `ack = "standby"`.
    /// `standbys` is locked by the caller (lock order: standbys, then the ISR).
    pub(super) fn isr_high_watermark(
        &self,
        standbys: &HashMap<String, StandbyState>,
    ) -> Option<Lsn> {
        let isr = lock(&self.repl.isr);
        let set = isr.as_ref()?;
        let end = self.durable_end();
        if set.is_empty() {
            let local = self.config.replication.ack == Ack::Local;
            return Some(if local { end } else { 1 });
        }
        let low = set
            .iter()
            .map(|n| standbys.get(n).map_or(1, |s| s.acked))
            .min()
            .unwrap_or(1);
        Some(low.clamp(1, end))
    }

    /// Whether a cluster leader has any standby in sync (`None` outside a cluster).
    pub(super) fn isr_in_sync(&self) -> Option<bool> {
        lock(&self.repl.isr).as_ref().map(|s| !s.is_empty())
    }
}

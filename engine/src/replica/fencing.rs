//! A cluster leader's lease and in-sync set (issue 27, docs/cluster.md): fencing when the
//! leadership lease may have run out, and the in-sync set: a cluster leader's answers wait
//! until every standby in it holds their records, so any member of it (the only nodes etcd
//! lets campaign) holds every acknowledged batch. The etcd side is the `cluster` folder
//! (above this one).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::time::Instant;

use roost_storage::lock;
use roost_wal::Lsn;
use tracing::{info, warn};

use super::role::{Replication, StandbyState};
use crate::config::Ack;
use crate::pipeline::Role;

impl Replication {
    /// The leadership lease may have run out (or etcd names another leader): take no more
    /// batches and give no more answers, at once. Answers waiting for a standby give up;
    /// their batches stay claimed for whoever leads next.
    pub fn fence(&self, why: &str) {
        self.leave_lead(|epoch| {
            warn!(
                epoch,
                why, "fenced: this node no longer leads and takes no more batches"
            )
        });
    }

    /// This life began to drain (a graceful stop or a rejoin): it takes nothing new; the
    /// health checks answer 503 from now on (`control/http/health.rs`).
    pub fn begin_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// A planned end of leadership (a switchover, a graceful stop: `serve/handover.rs`), as
    /// [`Replication::fence`], before the lease is given up.
    pub fn hand_over_lead(&self, why: &str) {
        self.leave_lead(|epoch| {
            info!(
                epoch,
                why, "stepping down: this node no longer leads and takes no more batches"
            )
        });
    }

    fn leave_lead(&self, log: impl FnOnce(u32)) {
        let mut role = lock(&self.role);
        if *role == Role::Primary {
            let epoch = self.epoch();
            log(epoch);
            *role = Role::SteppedDown { epoch };
            drop(role);
            self.stop_waiting_for_standby();
            self.wake();
        }
    }

    /// Fences this leader if its lease deadline passed (checked before every batch is taken
    /// and every answer given: a process that slept through its deadline stops at the first
    /// thing it does, not when its agent runs again). True when fenced now or before.
    pub(super) fn fence_if_lapsed(&self) -> bool {
        let until = self.lease_until_ms.load(Ordering::SeqCst);
        if until == 0 {
            return false;
        }
        let now = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
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
        let isr = lock(&self.isr);
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
        lock(&self.isr).as_ref().map(|s| !s.is_empty())
    }

    /// The cluster agent renewed the lease: this leader may take batches and answer until
    /// `deadline` (the renewal's send time + TTL - margin).
    pub fn lease_renewed_until(&self, deadline: Instant) {
        let ms = deadline.saturating_duration_since(self.opened).as_millis();
        let ms = u64::try_from(ms).unwrap_or(u64::MAX).max(1);
        self.lease_until_ms.store(ms, Ordering::SeqCst);
    }

    /// The in-sync standbys of this cluster leader (`None` outside a cluster or not leading).
    pub fn isr(&self) -> Option<BTreeSet<String>> {
        lock(&self.isr).clone()
    }

    /// Adds `name` to the in-sync set (before etcd hears of it: the set etcd holds must never
    /// name a node that answers did not wait for).
    pub fn isr_add(&self, name: &str) {
        if let Some(set) = lock(&self.isr).as_mut() {
            if set.insert(name.to_owned()) {
                info!(standby = name, "in sync: answers wait for it from now on");
            }
        }
        // The high watermark may be lower now: the next acknowledgement must wake.
        self.acked_told.store(0, Ordering::SeqCst);
    }

    /// Removes `name` (after etcd no longer names it: until then answers still wait for it).
    pub fn isr_remove(&self, name: &str) {
        if let Some(set) = lock(&self.isr).as_mut() {
            if set.remove(name) {
                warn!(standby = name, "out of sync: answers no longer wait for it");
            }
        }
        self.wake_acked();
    }
}

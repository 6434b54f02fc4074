//! `SimLog`: a node's log, `roost_replication::testing::MemLog` itself (crash = drop what was
//! not synced), with two additions the simulator needs: it asks the protocol to call it
//! inline (`calls_inline`: no blocking-pool threads, so a run is deterministic), and it
//! keeps per standby what the daemon's `StandbyState` keeps (the last acknowledged lsn, when,
//! connected, told it is behind), which the agent's in-sync rule reads. Every protocol call
//! is MemLog's.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use roost_replication::testing::{MemError, MemLog};
use roost_replication::{Entry, Epoch, EpochEnd, FollowerLog, LeaderLog, Lsn};

/// What the leader knows of one standby (the daemon's `StandbyState`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Standby {
    pub acked: Lsn,
    /// Simulated time of the last acknowledged fetch.
    pub last_fetch: Duration,
    pub connected: bool,
    pub behind: bool,
}

/// A node's log (see the module doc).
pub struct SimLog {
    pub mem: MemLog,
    standbys: Mutex<BTreeMap<String, Standby>>,
}

impl SimLog {
    pub fn new(name: &str) -> SimLog {
        SimLog {
            mem: MemLog::with_shippable_watch(name),
            standbys: Mutex::new(BTreeMap::new()),
        }
    }

    fn standbys_mut(&self) -> MutexGuard<'_, BTreeMap<String, Standby>> {
        self.standbys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn standbys(&self) -> BTreeMap<String, Standby> {
        self.standbys_mut().clone()
    }

    /// A new epoch (or a restart): nothing known of any standby.
    pub fn forget_standbys(&self) {
        self.standbys_mut().clear();
    }

    /// The lsn at which `epoch` starts in this log (0 if it holds no such epoch).
    pub fn epoch_start(&self, epoch: Epoch) -> Lsn {
        self.mem
            .epochs()
            .iter()
            .find(|(e, _)| *e == epoch)
            .map_or(0, |(_, lsn)| *lsn)
    }
}

impl LeaderLog for SimLog {
    type Error = MemError;

    fn leader_epoch(&self) -> Option<Epoch> {
        LeaderLog::leader_epoch(&self.mem)
    }
    fn log_start(&self) -> Lsn {
        self.mem.log_start()
    }
    fn shippable_end(&self) -> Lsn {
        self.mem.shippable_end()
    }
    fn wait_durable(&self, after: Lsn, timeout: Duration) -> Lsn {
        self.mem.wait_durable(after, timeout)
    }
    fn shippable_watch(&self) -> Option<tokio::sync::watch::Receiver<Lsn>> {
        self.mem.shippable_watch()
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        LeaderLog::end_offset_for(&self.mem, epoch)
    }
    fn read(&self, from: Lsn, max_bytes: usize) -> Result<Vec<Entry>, MemError> {
        self.mem.read(from, max_bytes)
    }
    fn acknowledged(&self, replica: &str, fetch_lsn: Lsn) -> Lsn {
        let s = Standby {
            acked: fetch_lsn,
            last_fetch: crate::etcd::now(),
            connected: true,
            behind: false,
        };
        self.standbys_mut().insert(replica.to_owned(), s);
        self.mem.acknowledged(replica, fetch_lsn)
    }
    fn disconnected(&self, replica: &str) {
        if let Some(s) = self.standbys_mut().get_mut(replica) {
            s.connected = false;
        }
        self.mem.disconnected(replica);
    }
    fn fell_behind(&self, replica: &str, why: &str) {
        self.standbys_mut()
            .entry(replica.to_owned())
            .or_default()
            .behind = true;
        LeaderLog::fell_behind(&self.mem, replica, why);
    }
    fn saw_higher_epoch(&self, epoch: Epoch) {
        self.mem.saw_higher_epoch(epoch);
    }
    fn calls_inline(&self) -> bool {
        true
    }
}

impl FollowerLog for SimLog {
    type Error = MemError;

    fn current_epoch(&self) -> Epoch {
        self.mem.current_epoch()
    }
    fn set_current_epoch(&self, epoch: Epoch) -> Result<(), MemError> {
        self.mem.set_current_epoch(epoch)
    }
    fn log_end(&self) -> Lsn {
        self.mem.log_end()
    }
    fn last_epoch(&self) -> Epoch {
        self.mem.last_epoch()
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        FollowerLog::end_offset_for(&self.mem, epoch)
    }
    fn append(&self, entries: &[Entry], leader_hw: Lsn) -> Result<(), MemError> {
        self.mem.append(entries, leader_hw)
    }
    fn truncate_to(&self, lsn: Lsn) -> Result<(), MemError> {
        self.mem.truncate_to(lsn)
    }
    fn calls_inline(&self) -> bool {
        true
    }
}

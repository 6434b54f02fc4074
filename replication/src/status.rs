//! `FollowerStatus`: what a running follower shows to `roost status`, shared between the
//! `follow` task (the only writer) and any reader. Plain atomics and one small mutex for
//! the strings; nothing here is ever held across an `.await`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::log::{Epoch, Lsn};

/// Live counters of one follower (see `snapshot` for a consistent-enough copy).
#[derive(Debug, Default)]
pub struct FollowerStatus {
    connected: AtomicBool,
    hw: AtomicU64,
    leader_epoch: AtomicU32,
    last_fetch_unix_ms: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    truncations: AtomicU64,
    text: Mutex<Text>,
}

#[derive(Debug, Default, Clone)]
struct Text {
    leader: String,
    last_error: Option<String>,
}

/// A copy of `FollowerStatus` at one moment (each field read once; not atomic as a whole).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusSnapshot {
    pub connected: bool,
    /// The leader address this follower connects to.
    pub leader: String,
    /// The last high watermark a leader answered with.
    pub hw: Lsn,
    /// The leader epoch of the last answer.
    pub leader_epoch: Epoch,
    /// When the last answer arrived (ms since the Unix epoch; 0: never).
    pub last_fetch_unix_ms: u64,
    /// Records and payload bytes appended from the leader since start.
    pub records: u64,
    pub bytes: u64,
    /// Truncations done on a diverging answer.
    pub truncations: u64,
    /// The last error that ended a connection (or the follower).
    pub last_error: Option<String>,
}

impl FollowerStatus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn snapshot(&self) -> StatusSnapshot {
        let text = self.text();
        StatusSnapshot {
            connected: self.connected(),
            leader: text.leader,
            hw: self.hw(),
            leader_epoch: self.leader_epoch.load(Ordering::Relaxed),
            last_fetch_unix_ms: self.last_fetch_unix_ms.load(Ordering::Relaxed),
            records: self.records(),
            bytes: self.bytes.load(Ordering::Relaxed),
            truncations: self.truncations(),
            last_error: text.last_error,
        }
    }

    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }
    pub fn hw(&self) -> Lsn {
        self.hw.load(Ordering::Relaxed)
    }
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }
    pub fn truncations(&self) -> u64 {
        self.truncations.load(Ordering::Relaxed)
    }

    fn text(&self) -> Text {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }
    pub(crate) fn set_leader(&self, leader: &str) {
        let mut t = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        if t.leader != leader {
            t.leader = leader.to_string();
        }
    }
    pub(crate) fn set_error(&self, error: String) {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_error = Some(error);
    }
    pub(crate) fn answered(&self, leader_epoch: Epoch) {
        self.leader_epoch.store(leader_epoch, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_fetch_unix_ms.store(now, Ordering::Relaxed);
    }
    pub(crate) fn appended(&self, records: u64, bytes: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    pub(crate) fn saw_hw(&self, hw: Lsn) {
        self.hw.store(hw, Ordering::Relaxed);
    }
    pub(crate) fn truncated(&self) {
        self.truncations.fetch_add(1, Ordering::Relaxed);
    }
}

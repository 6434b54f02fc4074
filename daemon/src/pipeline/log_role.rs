//! This node's place in replication, as the engine keeps it (docs/replication.md,
//! `Kip320.tla`): its role, the leader epochs (`EPOCH`, `LEADER_EPOCHS`), the standbys and
//! what each acknowledged, the in-sync set and the lease of a cluster leader: the state, the
//! files it is read from and written to, and what control, status, the replica tasks and the
//! cluster agent read and change of it directly (`Engine::replication`: the standbys, the
//! in-sync set, the view of the primary, the claims held back). What the engine does with it
//! is `replicate.rs` (acknowledgements, epochs, stepping down), `cluster.rs` (promotion,
//! fencing) and `apply.rs` (a standby's apply). It knows nothing of the engine.

use std::collections::BTreeSet;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use roost_storage::{read_all, OpenMode, Storage};
use roost_wal::{LeaderEpochs, Lsn, Wal};
use tracing::{info, warn};

use super::disk::{io_err, lock, replace_file};
use super::owner::ShardSlot;
use super::records::{ClaimLedger, ClaimRecord};
use crate::config::Config;
use crate::error::EngineError;
use crate::layout::Layout;

/// What this node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Takes batches; serves standbys if `[replication] listen` is set.
    Primary,
    /// Follows a primary; its spool is closed.
    Standby,
    /// Was the primary and saw a higher epoch: takes nothing more.
    SteppedDown { epoch: u32 },
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Standby => "standby",
            Role::SteppedDown { .. } => "stepped_down",
        }
    }
}

/// One standby as the primary sees it.
#[derive(Clone, Debug)]
pub struct StandbyState {
    /// Every record below this is durable on the standby (its last fetch's lsn).
    pub acked: Lsn,
    pub last_fetch: Instant,
    pub connected: bool,
}

/// The primary this standby follows, as the follower last saw it (for status).
#[derive(Clone, Debug, Default)]
pub struct FollowLink {
    pub leader: String,
    pub connected: bool,
    pub leader_epoch: u32,
    /// The primary's high watermark in its last answer (the lsn below which it is durable
    /// on both nodes).
    pub leader_hw: Lsn,
    pub records: u64,
    pub bytes: u64,
}

/// Effects a standby applied and has not flushed yet: the claims, the shards they touched,
/// the last audit row written.
#[derive(Default)]
pub(super) struct Unflushed {
    pub claims: std::collections::BTreeSet<Lsn>,
    pub shards: std::collections::BTreeMap<String, Arc<ShardSlot>>,
    pub last_row: Option<Lsn>,
}

/// Acknowledged positions kept for the lag in bytes (one per fetch that moved).
pub(super) const POSITIONS_KEPT: usize = 4096;

/// The replication state the engine keeps, and what control, status and the cluster agent
/// read and change of it directly (`Engine::replication`): the standbys, the in-sync set, the
/// standby's view of its primary, the claims held back.
pub struct Replication {
    pub(super) role: Mutex<Role>,
    /// The highest leader epoch known (this node's own while primary).
    pub(super) epoch: AtomicU32,
    /// The epoch this node last led (0: never); `EPOCH` holds it with `epoch`.
    pub(super) led: AtomicU32,
    pub(super) epochs: Mutex<LeaderEpochs>,
    pub(super) standbys: Mutex<HashMap<String, StandbyState>>,
    /// Signalled when a standby acknowledges more, or the role changes.
    pub(super) acked_cv: Condvar,
    /// Set at a stop: answers waiting for a standby give up (their batches stay claimed).
    pub(super) giving_up: AtomicBool,
    /// Since when this primary serves (a standby gets `standby_timeout_ms` from here to
    /// connect before it counts as lost).
    pub(super) since: Mutex<Instant>,
    /// Held while a fetched chunk is applied, and by promotion.
    pub(super) apply_lock: Mutex<()>,
    /// `(wal next lsn, wal bytes appended)` at recent acknowledgements, oldest first: what
    /// a standby's lag in bytes is read from (lsns count records, not bytes).
    pub(super) positions: Mutex<std::collections::VecDeque<(Lsn, u64)>>,
    /// A standby's claims whose effects are applied but not yet flushed (`apply.rs`).
    pub(super) unflushed: Mutex<Unflushed>,
    /// A standby's claims without a `done` record yet (their effects are applied).
    pub(super) ledger: Mutex<ClaimLedger>,
    /// Claims to finish before intake opens: recovery's under `ack = "standby"` (a standby
    /// must have them before their results appear), and a promoted standby's.
    pub(super) deferred: Mutex<Vec<(Lsn, ClaimRecord)>>,
    /// Results published while no standby was in sync (`when_standby_lost = "alone"`).
    pub alone: std::sync::atomic::AtomicU64,
    /// Publishing alone was logged since a standby was last in sync (logged once a loss).
    pub(super) alone_logged: std::sync::atomic::AtomicBool,
    /// A standby's view of its primary.
    pub(super) follow: Mutex<Option<FollowLink>>,
    /// A cluster leader's in-sync standbys (`cluster.rs`): every answer waits until each of
    /// them holds its record. `None` outside a cluster (any one standby suffices then).
    pub(super) isr: Mutex<Option<std::collections::BTreeSet<String>>>,
    /// A cluster leader's lease deadline, in ms after `opened` (0: none): past it, no batch
    /// is taken and no answer given (`cluster.rs`), even before the agent notices.
    pub(super) lease_until_ms: AtomicU64,
    pub(super) opened: Instant,
}

impl Replication {
    pub(super) fn become_primary(&self) {
        *lock(&self.since) = Instant::now();
        *lock(&self.role) = Role::Primary;
        self.acked_cv.notify_all();
    }

    pub(super) fn new(role: Role, file: EpochFile, epochs: LeaderEpochs) -> Replication {
        Replication {
            role: Mutex::new(role),
            epoch: AtomicU32::new(file.known),
            led: AtomicU32::new(file.led),
            epochs: Mutex::new(epochs),
            standbys: Mutex::new(HashMap::new()),
            acked_cv: Condvar::new(),
            giving_up: AtomicBool::new(false),
            since: Mutex::new(Instant::now()),
            apply_lock: Mutex::new(()),
            unflushed: Mutex::new(Unflushed::default()),
            positions: Mutex::new(std::collections::VecDeque::new()),
            ledger: Mutex::new(ClaimLedger::default()),
            deferred: Mutex::new(Vec::new()),
            alone: Default::default(),
            alone_logged: Default::default(),
            follow: Mutex::new(None),
            isr: Mutex::new(None),
            lease_until_ms: AtomicU64::new(0),
            opened: Instant::now(),
        }
    }
}

/// What the engine's callers read and change of the replication state without the engine.
impl Replication {
    /// A standby's connection closed.
    pub fn standby_disconnected(&self, name: &str) {
        if let Some(e) = lock(&self.standbys).get_mut(name) {
            e.connected = false;
            info!(standby = name, acked = e.acked, "standby disconnected");
        }
        self.acked_cv.notify_all();
    }

    /// The standbys as this primary last saw them.
    pub fn standbys(&self) -> Vec<(String, StandbyState)> {
        let mut v: Vec<_> = lock(&self.standbys)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// At a stop: answers waiting for a standby give up now.
    pub fn stop_waiting_for_standby(&self) {
        self.giving_up.store(true, Ordering::SeqCst);
        self.acked_cv.notify_all();
    }

    /// What this standby knows of its primary (`None` on a primary).
    pub fn follow_status(&self) -> Option<FollowLink> {
        lock(&self.follow).clone()
    }

    /// Updates what this standby knows of its primary.
    pub fn update_follow_status(&self, f: impl FnOnce(&mut FollowLink)) {
        f(lock(&self.follow).get_or_insert_with(FollowLink::default));
    }

    /// Results published with no standby in sync (`when_standby_lost = "alone"`).
    pub fn published_alone(&self) -> u64 {
        self.alone.load(Ordering::Relaxed)
    }

    /// Claims waiting to be finished before intake opens.
    pub fn deferred_claims(&self) -> usize {
        lock(&self.deferred).len()
    }

    /// The cluster agent renewed the lease: this leader may take batches and answer until
    /// `deadline` (the renewal's send time + TTL - margin).
    pub fn lease_renewed_until(&self, deadline: std::time::Instant) {
        let ms = deadline.saturating_duration_since(self.opened).as_millis();
        let ms = u64::try_from(ms).unwrap_or(u64::MAX).max(1);
        self.lease_until_ms.store(ms, Ordering::SeqCst);
    }

    /// The first lsn of the epoch this node leads (or last led): every batch an earlier
    /// leader acknowledged is below it.
    pub fn epoch_start(&self) -> Lsn {
        lock(&self.epochs).latest().map_or(1, |(_, start)| start)
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
    }

    /// Removes `name` (after etcd no longer names it: until then answers still wait for it).
    pub fn isr_remove(&self, name: &str) {
        if let Some(set) = lock(&self.isr).as_mut() {
            if set.remove(name) {
                warn!(standby = name, "out of sync: answers no longer wait for it");
            }
        }
        self.acked_cv.notify_all();
    }
}

/// What `EPOCH` holds: the highest leader epoch this node has known, and the epoch it last
/// led itself (0: never). A primary that restarts resumes the epoch it led when that is
/// still the highest known (no one else can have written under it: only a promotion mints
/// an epoch, and it takes the highest known + 1); any other start as primary, and every
/// promotion, takes a new one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochFile {
    pub known: u32,
    pub led: u32,
}

/// Reads `EPOCH` (zeros when absent): `known` and `led`, 4 bytes each, little-endian, then
/// their CRC-32.
pub fn read_epoch_file(storage: &dyn Storage, path: &Path) -> Result<EpochFile, EngineError> {
    let f = match storage.open(path, OpenMode::Read) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(EpochFile::default()),
        r => r.map_err(io_err("open", path))?,
    };
    let bytes = read_all(f.as_ref()).map_err(io_err("read", path))?;
    let (v, crc) = match (bytes.get(0..8), bytes.get(8..12)) {
        (Some(v), Some(c)) if bytes.len() == 12 => (v, c),
        _ => return Err(bad_epoch_file(path, "not 12 bytes")),
    };
    if crc32fast::hash(v).to_le_bytes() != crc {
        return Err(bad_epoch_file(path, "checksum mismatch"));
    }
    let word = |i: usize| u32::from_le_bytes([v[i], v[i + 1], v[i + 2], v[i + 3]]);
    Ok(EpochFile {
        known: word(0),
        led: word(4),
    })
}

/// Replaces `EPOCH` (tmp, fdatasync, rename, directory fsync).
pub fn write_epoch_file(
    storage: &dyn Storage,
    path: &Path,
    e: EpochFile,
) -> Result<(), EngineError> {
    let mut bytes = e.known.to_le_bytes().to_vec();
    bytes.extend_from_slice(&e.led.to_le_bytes());
    let crc = crc32fast::hash(&bytes).to_le_bytes();
    bytes.extend_from_slice(&crc);
    replace_file(storage, path, &bytes)
}

fn bad_epoch_file(path: &Path, why: &str) -> EngineError {
    EngineError::Inconsistent {
        lsn: 0,
        detail: format!("{}: {why}", path.display()),
    }
}

/// The role (a standby when `[replication] follow` is set), the leader-epoch file (rebuilt
/// from the WAL if missing), and the epoch appends carry until a primary takes its own.
pub(super) fn open_replication(
    storage: &Arc<dyn Storage>,
    layout: &Layout,
    config: &Config,
    wal: &Wal,
) -> Result<Replication, EngineError> {
    let epochs = roost_wal::LeaderEpochs::open(storage.clone(), layout.leader_epochs(), wal)?;
    let mut file = read_epoch_file(storage.as_ref(), &layout.epoch())?;
    let last = epochs.latest().map_or(0, |(e, _)| e);
    file.known = file.known.max(last).max(wal.last_record_epoch());
    wal.set_epoch(file.known.max(1))?;
    // A cluster node starts as a follower whatever it led before: only etcd makes it lead
    // (issue 27: a restarted old primary must not resume its old epoch).
    let role = if config.replication.is_standby() || config.clustered() {
        Role::Standby
    } else {
        Role::Primary
    };
    Ok(Replication::new(role, file, epochs))
}

/// The epoch of the WAL's last record; for a WAL that holds none yet (a re-seeded standby's
/// starts empty at the checkpoint's lsn) the epoch of the record before it, which
/// `LEADER_EPOCHS` keeps.
pub fn last_epoch_of(wal: &Wal, epochs: &LeaderEpochs) -> u32 {
    match wal.last_record_epoch() {
        0 => epochs.latest().map_or(0, |(e, _)| e),
        e => e,
    }
}

/// The next epoch above `known` with `node_id` in its low byte, or `None` when it would
/// reach `EPOCH_CEILING` (computed in 64 bits: an epoch near the top of `u32` must not wrap
/// to a small one).
pub(super) fn next_epoch(known: u32, node_id: u32) -> Option<u32> {
    let next = ((u64::from(known >> 8) + 1) << 8) | u64::from(node_id & 0xff);
    u32::try_from(next)
        .ok()
        .filter(|e| *e < roost_replication::EPOCH_CEILING)
}

#[cfg(test)]
mod epoch_tests {
    use super::next_epoch;

    #[test]
    fn the_next_epoch_is_one_generation_up_and_never_wraps_past_the_ceiling() {
        assert_eq!(next_epoch(0, 5), Some(0x105));
        assert_eq!(next_epoch(0x105, 7), Some(0x207));
        assert_eq!(
            next_epoch(4_294_967_280, 5),
            None,
            "wrapped to a small epoch"
        );
        assert_eq!(
            next_epoch(roost_replication::EPOCH_CEILING - 0x100, 1),
            None
        );
        assert_eq!(
            next_epoch(roost_replication::EPOCH_CEILING - 0x200, 1),
            Some(roost_replication::EPOCH_CEILING - 0xff)
        );
    }
}

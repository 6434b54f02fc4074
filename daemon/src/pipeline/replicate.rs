//! The engine's side of replication (docs/replication.md, `Kip320.tla`): this node's role
//! and leader epoch, the high watermark (what a standby holds durably), the wait an
//! `ack = "standby"` answer makes for it, stepping down, promotion. The standby's apply of
//! fetched records is `apply.rs`. The protocol itself (TCP, fetch, the truncation rule) is
//! `roost_replication`; the daemon's `replica` part joins the two.
//!
//! Epochs (`EpochFile`): a promotion, or a first start as primary, mints `highest known + 1`
//! (made unique per node by its low byte, the node id) and writes it to `EPOCH` and to
//! `LEADER_EPOCHS` (at the WAL's next lsn) before its first append; a primary that restarts
//! resumes the epoch it led while that is the highest it knows. A standby learns the primary's epoch
//! from its answers and writes it to `EPOCH` before acting on it: a promotion after a
//! restart must never reuse an epoch the old primary wrote under.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use roost_storage::{read_all, OpenMode};
use roost_wal::{LeaderEpochs, Lsn};
use tracing::{info, warn};

use super::records::{ClaimLedger, ClaimRecord};
use super::{io_err, lock, Engine};
use crate::config::{Ack, StandbyLost};
use crate::error::EngineError;

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
    pub shards: std::collections::BTreeMap<String, std::sync::Arc<super::owner::ShardSlot>>,
    pub last_row: Option<Lsn>,
}

/// Acknowledged positions kept for the lag in bytes (one per fetch that moved).
const POSITIONS_KEPT: usize = 4096;

/// The replication state the engine keeps.
pub(super) struct Replication {
    pub(super) role: Mutex<Role>,
    /// The highest leader epoch known (this node's own while primary).
    epoch: AtomicU32,
    /// The epoch this node last led (0: never); `EPOCH` holds it with `epoch`.
    led: AtomicU32,
    pub(super) epochs: Mutex<LeaderEpochs>,
    standbys: Mutex<HashMap<String, StandbyState>>,
    /// Signalled when a standby acknowledges more, or the role changes.
    acked_cv: Condvar,
    /// Set at a stop: answers waiting for a standby give up (their batches stay claimed).
    giving_up: AtomicBool,
    /// Since when this primary serves (a standby gets `standby_timeout_ms` from here to
    /// connect before it counts as lost).
    since: Mutex<Instant>,
    /// Held while a fetched chunk is applied, and by promotion.
    pub(super) apply_lock: Mutex<()>,
    /// `(wal next lsn, wal bytes appended)` at recent acknowledgements, oldest first: what
    /// a standby's lag in bytes is read from (lsns count records, not bytes).
    positions: Mutex<std::collections::VecDeque<(Lsn, u64)>>,
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
    alone_logged: std::sync::atomic::AtomicBool,
    /// A standby's view of its primary.
    follow: Mutex<Option<FollowLink>>,
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
pub fn read_epoch_file(
    storage: &dyn roost_storage::Storage,
    path: &std::path::Path,
) -> Result<EpochFile, EngineError> {
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
    storage: &dyn roost_storage::Storage,
    path: &std::path::Path,
    e: EpochFile,
) -> Result<(), EngineError> {
    let mut bytes = e.known.to_le_bytes().to_vec();
    bytes.extend_from_slice(&e.led.to_le_bytes());
    let crc = crc32fast::hash(&bytes).to_le_bytes();
    bytes.extend_from_slice(&crc);
    super::replace_file(storage, path, &bytes)
}

fn bad_epoch_file(path: &std::path::Path, why: &str) -> EngineError {
    EngineError::Inconsistent {
        lsn: 0,
        detail: format!("{}: {why}", path.display()),
    }
}

impl Engine {
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

    pub fn standby_disconnected(&self, name: &str) {
        if let Some(e) = lock(&self.repl.standbys).get_mut(name) {
            e.connected = false;
            info!(standby = name, acked = e.acked, "standby disconnected");
        }
        self.repl.acked_cv.notify_all();
    }

    /// Wakes answers waiting for a standby to look at the high watermark again.
    pub(super) fn repl_acked_notify(&self) {
        self.repl.acked_cv.notify_all();
    }

    /// The standbys as this primary last saw them.
    pub fn standbys(&self) -> Vec<(String, StandbyState)> {
        let mut v: Vec<_> = lock(&self.repl.standbys)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
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

    /// At a stop: answers waiting for a standby give up now.
    pub fn stop_waiting_for_standby(&self) {
        self.repl.giving_up.store(true, Ordering::SeqCst);
        self.repl.acked_cv.notify_all();
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

    /// What this standby knows of its primary (`None` on a primary).
    pub fn follow_status(&self) -> Option<FollowLink> {
        lock(&self.repl.follow).clone()
    }

    /// Updates what this standby knows of its primary.
    pub fn update_follow_status(&self, f: impl FnOnce(&mut FollowLink)) {
        f(lock(&self.repl.follow).get_or_insert_with(FollowLink::default));
    }

    /// Results published with no standby in sync (`when_standby_lost = "alone"`).
    pub fn published_alone(&self) -> u64 {
        self.repl.alone.load(Ordering::Relaxed)
    }

    /// Claims waiting to be finished before intake opens.
    pub fn deferred_claims(&self) -> usize {
        lock(&self.repl.deferred).len()
    }
}

/// The epoch of the WAL's last record; for a WAL that holds none yet (a re-seeded standby's
/// starts empty at the checkpoint's lsn) the epoch of the record before it, which
/// `LEADER_EPOCHS` keeps.
pub fn last_epoch_of(wal: &roost_wal::Wal, epochs: &roost_wal::LeaderEpochs) -> u32 {
    match wal.last_record_epoch() {
        0 => epochs.latest().map_or(0, |(e, _)| e),
        e => e,
    }
}

/// The next epoch above `known` with `node_id` in its low byte, or `None` when it would
/// reach `EPOCH_CEILING` (computed in 64 bits: an epoch near the top of `u32` must not wrap
/// to a small one).
fn next_epoch(known: u32, node_id: u32) -> Option<u32> {
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

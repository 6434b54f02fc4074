//! This node's place in replication (docs/replication.md, `Kip320.tla`): its role, the
//! leader epochs (`EPOCH`, `LEADER_EPOCHS`), the standbys and what each acknowledged, the
//! in-sync set and the lease of a cluster leader. The engine sees it only as its
//! [`LogRole`]; control, status, the replica tasks and the cluster agent hold it directly.
//! What it does: `ack.rs` (acknowledgements, the high watermark, the wait of an answer),
//! `epochs.rs` (epochs taken and learnt; the `EPOCH` file and the epoch arithmetic are
//! `epoch_file.rs`), `fencing.rs` (the lease, the in-sync set).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use roost_storage::{lock, Storage};
use roost_wal::{LeaderEpochs, Lsn, Wal};
use tracing::info;

use super::epoch_file::{read_epoch_file, EpochFile};
use crate::config::Config;
use crate::error::EngineError;
use crate::pipeline::backup_gate::Pins;
use crate::pipeline::log_role::{Lead, LogRole, OpenLogRole, Role, RoleParts};

/// One standby as the primary sees it.
#[derive(Clone, Debug)]
pub struct StandbyState {
    /// Every record below this is durable on the standby (its last fetch's lsn).
    pub acked: Lsn,
    pub last_fetch: Instant,
    pub connected: bool,
    /// Told its log diverges or is behind what this node retains (or it asked for a base
    /// backup), and not acknowledged since: it must cut or be re-seeded first, so a cluster
    /// leader takes it out of the in-sync set at once (issue 42).
    pub behind: bool,
}

impl StandbyState {
    /// A standby first heard of now, nothing acknowledged yet.
    pub(super) fn first_heard(connected: bool, behind: bool) -> StandbyState {
        StandbyState {
            acked: 0,
            last_fetch: Instant::now(),
            connected,
            behind,
        }
    }
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

/// Acknowledged positions kept for the lag in bytes (one per fetch that moved).
pub(super) const POSITIONS_KEPT: usize = 4096;

/// The replication state, and what the engine's callers read and change of it.
pub struct Replication {
    pub(super) storage: Arc<dyn Storage>,
    pub(super) config: Arc<Config>,
    pub(super) parts: RoleParts,
    pub(super) wal: Arc<Wal>,
    pub(super) role: Mutex<Role>,
    /// The highest leader epoch known (this node's own while primary).
    pub(super) epoch: AtomicU32,
    /// The epoch this node last led (0: never); `EPOCH` holds it with `epoch`.
    pub(super) led: AtomicU32,
    pub(super) epochs: Mutex<LeaderEpochs>,
    pub(super) standbys: Mutex<HashMap<String, StandbyState>>,
    /// Signalled when an acknowledgement raises the high watermark, or the role, the
    /// standbys or the in-sync set change ([`Replication::wake_acked`]).
    pub(super) acked_cv: Condvar,
    /// The high watermark the last acknowledgement computed (under the `standbys` lock): one
    /// that does not raise it wakes no answer (with two standbys in sync, the first of the
    /// two acknowledgements of a record cannot). 0 after any other change, so that the next
    /// acknowledgement wakes all.
    pub(super) acked_told: AtomicU64,
    /// Wake-ups of the waiting answers by acknowledgements (for the tests).
    pub(super) ack_wakes: AtomicU64,
    /// Set at a stop: answers waiting for a standby give up (their batches stay claimed).
    pub(super) giving_up: AtomicBool,
    /// This life drains (a stop or a rejoin began): the health checks answer 503.
    pub(super) draining: AtomicBool,
    /// Since when this primary serves (a standby gets `standby_timeout_ms` from here to
    /// connect before it counts as lost).
    pub(super) since: Mutex<Instant>,
    /// `(wal next lsn, wal bytes appended)` at recent acknowledgements, oldest first: what
    /// a standby's lag in bytes is read from (lsns count records, not bytes).
    pub(super) positions: Mutex<VecDeque<(Lsn, u64)>>,
    /// Results published while no standby was in sync (`when_standby_lost = "alone"`).
    pub(super) alone: AtomicU64,
    /// Publishing alone was logged since a standby was last in sync (logged once a loss).
    pub(super) alone_logged: AtomicBool,
    /// A standby's view of its primary.
    pub(super) follow: Mutex<Option<FollowLink>>,
    /// A cluster leader's in-sync standbys (`fencing.rs`): every answer waits until each of
    /// them holds its record. `None` outside a cluster (any one standby suffices then).
    pub(super) isr: Mutex<Option<BTreeSet<String>>>,
    /// A cluster leader's lease deadline, in ms after `opened` (0: none): past it, no batch
    /// is taken and no answer given (`fencing.rs`), even before the agent notices.
    pub(super) lease_until_ms: AtomicU64,
    pub(super) opened: Instant,
    /// The shippable end (`shippable_end`), sent by the WAL's own writes and syncs
    /// (`Wal::on_written`, `Wal::on_synced`): what a caught-up standby's long-poll waits
    /// on. `None` if the WAL had a hook already.
    pub(super) shippable: Option<tokio::sync::watch::Receiver<Lsn>>,
    /// The durable end (the lsn after the last synced record), sent by the WAL's syncs: a
    /// standby acknowledges fetched records by it as soon as its WAL holds them, before
    /// their effects are applied (`FollowerLog::durable_watch`). `None` as `shippable`.
    pub(super) durable: Option<tokio::sync::watch::Receiver<Lsn>>,
    /// Set while this node leads an epoch it won in etcd: records may be shipped before
    /// this node's own sync (`shippable_end`).
    pub(super) ship_written: Arc<AtomicBool>,
}

/// Opens [`Replication`] as the engine's log role, and keeps what it opened for the parts
/// above the engine that need it ([`Opener::made`]): the serve loop, the control socket,
/// the cluster agent. (Before issue 46 they downcast the engine's role back to it.)
#[derive(Default)]
pub struct Opener {
    made: Mutex<Option<Arc<Replication>>>,
}

impl OpenLogRole for Opener {
    fn open(&self, parts: RoleParts) -> Result<Arc<dyn LogRole>, EngineError> {
        let repl = Arc::new(Replication::open(parts)?);
        *lock(&self.made) = Some(repl.clone());
        Ok(repl)
    }
}

impl Opener {
    /// The [`Replication`] opened last (the engine's, once `Engine::open` returned).
    pub fn made(&self) -> Result<Arc<Replication>, EngineError> {
        lock(&self.made)
            .clone()
            .ok_or_else(|| EngineError::Replication("no engine was opened with this opener".into()))
    }
}

/// Watches of `wal`'s shippable end and of its durable end, kept current by the WAL's own
/// writes and syncs. The shippable end is the written end while `ship_written` is set, else
/// the durable end (the lsn after the last synced record). `None` if the WAL already has a
/// hook.
fn wal_watches(wal: &Wal, ship_written: &Arc<AtomicBool>) -> Option<(LsnWatch, LsnWatch)> {
    let (tx, rx) = tokio::sync::watch::channel(wal.synced_lsn() + 1);
    let (durable_tx, durable_rx) = tokio::sync::watch::channel(wal.synced_lsn() + 1);
    let tx = Arc::new(tx);
    let (synced_tx, early) = (tx.clone(), ship_written.clone());
    let synced: roost_wal::SyncedHook = Arc::new(move |synced: Lsn| {
        durable_tx.send_replace(synced + 1);
        if !early.load(Ordering::SeqCst) {
            synced_tx.send_replace(synced + 1);
        }
    });
    let early = ship_written.clone();
    let written: roost_wal::SyncedHook = Arc::new(move |written: Lsn| {
        if early.load(Ordering::SeqCst) {
            tx.send_replace(written + 1);
        }
    });
    (wal.on_synced(synced) && wal.on_written(written)).then_some((rx, durable_rx))
}

type LsnWatch = tokio::sync::watch::Receiver<Lsn>;

impl Replication {
    /// The role (a standby when `[replication] follow` is set, or in a cluster), the
    /// leader-epoch file (rebuilt from the WAL if missing), and the epoch appends carry
    /// until a primary takes its own.
    fn open(parts: RoleParts) -> Result<Replication, EngineError> {
        let (storage, wal) = (parts.storage.clone(), parts.wal.clone());
        let epochs = LeaderEpochs::open(storage.clone(), parts.leader_epochs.clone(), &wal)?;
        let mut file = read_epoch_file(storage.as_ref(), &parts.epoch_file)?;
        let last = epochs.latest().map_or(0, |(e, _)| e);
        file.known = file.known.max(last).max(wal.last_record_epoch());
        wal.set_epoch(file.known.max(1))?;
        // A cluster node starts as a follower whatever it led before: only etcd makes it
        // lead (issue 27: a restarted old primary must not resume its old epoch).
        let config = parts.config.clone();
        let role = if config.replication.is_standby() || config.clustered() {
            Role::Standby
        } else {
            Role::Primary
        };
        Ok(Replication::new(parts, role, file, epochs))
    }

    fn new(parts: RoleParts, role: Role, file: EpochFile, epochs: LeaderEpochs) -> Replication {
        let parts_wal = parts.wal.clone();
        let ship_written = Arc::new(AtomicBool::new(false));
        let (shippable, durable) = wal_watches(&parts_wal, &ship_written).unzip();
        Replication {
            storage: parts.storage.clone(),
            config: parts.config.clone(),
            wal: parts.wal.clone(),
            parts,
            role: Mutex::new(role),
            epoch: AtomicU32::new(file.known),
            led: AtomicU32::new(file.led),
            epochs: Mutex::new(epochs),
            standbys: Mutex::new(HashMap::new()),
            acked_cv: Condvar::new(),
            acked_told: AtomicU64::new(1),
            ack_wakes: AtomicU64::new(0),
            giving_up: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            since: Mutex::new(Instant::now()),
            positions: Mutex::new(VecDeque::new()),
            alone: AtomicU64::new(0),
            alone_logged: AtomicBool::new(false),
            follow: Mutex::new(None),
            isr: Mutex::new(None),
            lease_until_ms: AtomicU64::new(0),
            opened: Instant::now(),
            shippable,
            durable,
            ship_written,
        }
    }

    pub(super) fn pins(&self) -> &Pins {
        &self.parts.pins
    }

    /// Latches the engine (a write of the role's failed: it takes nothing more).
    pub(super) fn fail(&self) {
        self.parts.failed.store(true, Ordering::SeqCst);
        self.parts.changed.notify_all();
    }

    /// Wakes everything that waits on the role: answers for a standby, duplicates waiting on
    /// a batch in flight.
    pub(super) fn wake(&self) {
        self.wake_acked();
        self.parts.changed.notify_all();
    }

    /// Wakes every answer waiting for a standby, and makes the next acknowledgement wake
    /// them all again: a change other than an acknowledgement may have lowered the high
    /// watermark below what the last one told.
    pub(super) fn wake_acked(&self) {
        self.acked_told.store(0, Ordering::SeqCst);
        self.acked_cv.notify_all();
    }

    /// How many acknowledgements woke the answers waiting for a standby (each one that
    /// raised the high watermark).
    pub fn ack_wakes(&self) -> u64 {
        self.ack_wakes.load(Ordering::Relaxed)
    }

    pub fn role(&self) -> Role {
        *lock(&self.role)
    }

    /// The highest leader epoch this node knows (its own while primary).
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The epoch as status and the serve log show it, as `wal dump` shows the records': a
    /// node that never knew a leader epoch appends under epoch 1 (`open`), so its 0 reads 1.
    pub fn epoch_shown(&self) -> u32 {
        self.epoch().max(1)
    }

    /// The leader epoch, while this node is the primary.
    pub fn leader_epoch(&self) -> Option<u32> {
        (self.role() == Role::Primary).then(|| self.epoch())
    }

    /// The lsn after the last durable record.
    pub fn durable_end(&self) -> Lsn {
        self.wal.synced_lsn() + 1
    }

    /// The lsn after the last record a standby may be sent: the written end while this node
    /// leads an epoch it won in etcd, else the durable end. Early shipping lets a standby's
    /// sync overlap this node's own; it is safe only in an epoch that no restart of this
    /// node can resume (a cluster node always starts as a follower and leads only a newer
    /// epoch it wins), since a standby may keep a record this node then loses in a power
    /// cut: the next leader's epoch cuts it. The high watermark stays below the durable end
    /// (`ack.rs`, `fencing.rs`): nothing is answered on the standby's copy alone.
    /// `docs/replication-model.md`, "shipped before the sync", is the model.
    pub fn shippable_end(&self) -> Lsn {
        if self.ship_written.load(Ordering::SeqCst) && self.role() == Role::Primary {
            self.wal.next_lsn()
        } else {
            self.durable_end()
        }
    }

    /// [`Replication::shippable_end`] as a watch, sent at every write and sync (`None` if
    /// the WAL had hooks already): what a caught-up standby's long-poll waits on.
    pub fn shippable_watch(&self) -> Option<tokio::sync::watch::Receiver<Lsn>> {
        self.shippable.clone()
    }

    /// The WAL's durable end as a watch, sent at every sync (`None` as `shippable_watch`).
    pub fn durable_watch(&self) -> Option<tokio::sync::watch::Receiver<Lsn>> {
        self.durable.clone()
    }
}

/// What the engine's callers read and change of the replication state.
impl Replication {
    /// A standby's connection closed.
    pub fn standby_disconnected(&self, name: &str) {
        if let Some(e) = lock(&self.standbys).get_mut(name) {
            e.connected = false;
            info!(standby = name, acked = e.acked, "standby disconnected");
        }
        self.wake_acked();
    }

    /// Standby `name` must cut or be re-seeded before it holds anything new (`behind`).
    pub fn standby_behind(&self, name: &str, why: &str) {
        let mut s = lock(&self.standbys);
        let e = s
            .entry(name.to_owned())
            .or_insert_with(|| StandbyState::first_heard(false, true));
        if !e.behind {
            info!(
                standby = name,
                acked = e.acked,
                why,
                "standby is behind: it must cut or be re-seeded first"
            );
        }
        e.behind = true;
        drop(s);
        self.wake();
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
        self.wake_acked();
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
}

/// The engine's view (`pipeline/log_role.rs`): the waits are `ack.rs`'s, the epochs
/// `epochs.rs`'s, the lease check `fencing.rs`'s; the rest is here.
impl LogRole for Replication {
    fn role(&self) -> Role {
        Replication::role(self)
    }

    fn check_primary(&self) -> Result<(), EngineError> {
        self.fence_if_lapsed();
        match self.role() {
            Role::Primary => Ok(()),
            role => Err(EngineError::NotPrimary { role: role.name() }),
        }
    }

    fn still_answering(&self, lsn: Lsn) -> Result<(), EngineError> {
        Replication::still_answering(self, lsn)
    }

    fn wait_replicated(
        &self,
        lsn: Lsn,
        below: &dyn Fn() -> Lsn,
    ) -> Result<Option<Duration>, EngineError> {
        Replication::wait_replicated(self, lsn, below)
    }

    fn high_watermark(&self) -> Lsn {
        Replication::high_watermark(self)
    }

    fn lead_at_start(&self) -> Result<u32, EngineError> {
        Replication::lead_at_start(self)
    }

    fn take_lead(&self, lead: Lead) -> Result<u32, EngineError> {
        match lead {
            Lead::Next => self.take_new_epoch(),
            Lead::Won { epoch, isr } => self.take_won_epoch(epoch, isr),
        }
    }

    fn become_primary(&self) {
        *lock(&self.since) = Instant::now();
        *lock(&self.role) = Role::Primary;
        self.wake();
    }

    fn note_epoch(&self, epoch: u32, lsn: Lsn) -> Result<(), EngineError> {
        let mut epochs = lock(&self.epochs);
        if epochs.latest().is_none_or(|(latest, _)| epoch > latest) {
            epochs.assign(epoch, lsn)?;
        }
        Ok(())
    }

    fn epochs_below(&self, lsn: Lsn) -> Vec<(u32, Lsn)> {
        lock(&self.epochs)
            .entries()
            .iter()
            .copied()
            .filter(|(_, start)| *start < lsn)
            .collect()
    }
}

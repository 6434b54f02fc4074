//! The batch pipeline of `RoostApplyBatch.tla` on real files: Plan -> Claim -> Commit ->
//! Finish, and the recovery that finishes every claimed batch after a crash.
//!
//! This module is synchronous and owns no threads but the shard pool's: every intake calls
//! its one way in, [`Engine::submit`] (a batch alone is a group of one; the intake says only
//! how the answers are delivered, [`Deliver`]), from a bounded pool of blocking workers, and
//! crash tests call it directly over a simulated disk. Many batches may be in the pipeline
//! at once:
//! - Planning and the claim append happen under one lock (`planner`), so lsn order is plan
//!   order and ids are minted in lsn order, unique across all shards and never reused
//!   (`plan.rs`).
//! - Claim syncs are group-committed by the WAL: waiting workers share fdatasyncs.
//! - Each shard has one owner (`owner.rs`), run on a bounded pool of threads, that applies
//!   transactions strictly in lsn order (the turns registered at claim time) and flushes once per round for all of them,
//!   so overlapping batches never reorder and share shard flushes (`finish.rs`).
//! - A failure of any write or sync latches the engine (`failed`): the daemon exits non-zero
//!   and recovery on restart repairs (`recover.rs`).
//!
//! Files: `plan` (the way in, Plan and Claim), `finish` (Commit, Finish and the tail),
//! `recover` (open-time replay), `records` (the WAL and audit payloads), `owner` (shard owners
//! on a thread pool), `crash` (named crash points), `trigger` (before-triggers), `stats`
//! (counters, histograms), `names` (spool names reused during a tail), `room` (intake pauses
//! on a full disk).

mod apply;
pub mod backup;
pub mod backup_gate;
mod checkpoint;
mod checkpoint_state;
mod claim_sync;
pub mod crash;
pub mod disk;
mod effects_flush;
mod finish;
mod held;
pub mod intake_bytes;
mod invariants;
mod keys;
pub mod log_role;
mod memory;
mod names;
mod owner;
mod plan;
pub mod records;
mod recover;
mod room;
mod round_queue;
mod settle;
mod shard_limit;
pub mod stats;
mod tails;
pub mod trigger;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use roost_keyindex::{IndexOptions, KeyIndex};
use roost_shards::ShardOptions;
use roost_storage::{lock, DirLock, LockError, Storage};
use roost_wal::{Lsn, Wal, WalOptions};

use crate::config::Config;
use crate::error::EngineError;
use crate::layout::Layout;
use crate::spool::{Publisher, SpoolPaths};
use crash::{CrashHook, CrashPoint};
use disk::{io_err, replace_file};
use owner::{OwnerContext, ShardOpener, ShardSlot};
use stats::Stats;

pub use apply::Fetched;
pub use finish::committed_result;
pub use keys::now_ms;
pub use log_role::{Lead, LogRole, OpenLogRole, Role, RoleParts};
pub use memory::MemoryReport;
pub use owner::ShardFigures;
pub use plan::{is_detached, one_answer, Deliver};
pub use records::Checkpoint;
pub use recover::{read_checkpoint, RecoveryReport};
pub use room::Pause;

/// What the engine runs on: the storage seam, the configuration (which names the data and
/// spool directories) and the crash hook.
#[derive(Clone)]
pub struct EngineOptions {
    pub storage: Arc<dyn Storage>,
    pub config: Arc<Config>,
    pub crash: Arc<dyn CrashHook>,
    /// Makes the engine's [`LogRole`] once its WAL is open (`roost::replica::Opener`).
    pub log_role: Arc<dyn OpenLogRole>,
}

#[derive(Clone, Copy)]
struct KeyState {
    lsn: Lsn,
    fingerprint: u64,
    done: bool,
    /// `lsn` is a recorded rejection (not a claim): the same batch gets it again, another
    /// batch under the key is planned as new.
    rejected: bool,
    /// Where the record that answers it is: one record read, never a segment scan.
    at: KeyAt,
}

/// Where a key's answer is read from.
#[derive(Clone, Copy, Debug)]
enum KeyAt {
    /// The claim or rejection at the key's lsn, at this offset of its WAL segment.
    Wal { offset: u64 },
    /// The key table's record `lsn`, at `offset` (the WAL below a checkpoint may be gone).
    Keys { lsn: Lsn, offset: u64 },
}

impl KeyState {
    /// What a batch with fingerprint `fp` finds under this key.
    fn check(self, fp: u64) -> KeyFound {
        match self {
            k if k.rejected && k.fingerprint != fp => KeyFound::Free,
            k if k.fingerprint != fp || k.done => KeyFound::Answered(k),
            _ => KeyFound::InFlight,
        }
    }
}

/// What a key holds for a batch.
enum KeyFound {
    /// Nothing that binds it: plan the batch.
    Free,
    /// An answer: a conflict, or the original result (committed or rejected).
    Answered(KeyState),
    /// The same batch, claimed and not yet finished.
    InFlight,
}

/// Ids planned but not yet committed, per shard: planning sees committed state plus these.
#[derive(Default)]
struct Overlay {
    created: HashSet<u64>,
    deleted: HashSet<u64>,
}

impl Overlay {
    /// The shard applied a create (`created`) or a delete of `id`: the shard says from now
    /// on. A delete also takes the id out of `created`, where an earlier create's batch may
    /// still have left it (waiting on another of its shards): otherwise a later delete of
    /// the same id would plan as if it still existed. Ids are never reused.
    fn applied(&mut self, id: u64, created: bool) {
        if !created {
            self.deleted.remove(&id);
        }
        self.created.remove(&id);
    }
}

/// What the planner lock guards: the request keys, the id counter, the overlays.
struct Planner {
    keys: HashMap<String, KeyState>,
    next_id: u64,
    overlay: HashMap<String, Overlay>,
    /// Claims whose `done` is not known durable, by spool name (`names.rs`).
    tails: tails::Tails,
    /// Claims without a `done` record yet, each with the audit log's next lsn when it was
    /// made (its rows come after): the next checkpoint stops below the first.
    open: BTreeMap<Lsn, Lsn>,
    /// Per shard, the largest claim lsn with a `done` record: every frame up to it flushed.
    vouched: HashMap<String, Lsn>,
    /// The last claim this planner made: its lsn and the id after its ids (checked by
    /// `invariants::claim_follows`).
    last_claim: (Lsn, u64),
}

impl Planner {
    fn new() -> Planner {
        Planner {
            keys: HashMap::new(),
            next_id: 1,
            overlay: HashMap::new(),
            tails: tails::Tails::default(),
            open: BTreeMap::new(),
            vouched: HashMap::new(),
            last_claim: (0, 0),
        }
    }
}

pub struct Engine {
    storage: Arc<dyn Storage>,
    layout: Layout,
    spool: SpoolPaths,
    publisher: Publisher,
    config: Arc<Config>,
    crash: Arc<dyn CrashHook>,
    wal: Arc<Wal>,
    audit: Arc<Wal>,
    /// The request-key table (`keys.rs`).
    keys: Wal,
    /// The key table's index on disk (`keys.rs`, `roost_keyindex`).
    index: KeyIndex,
    /// The last checkpoint and what the next needs (`checkpoint.rs`); held for moments.
    checkpoints: Mutex<checkpoint_state::CheckpointState>,
    /// Held while a checkpoint runs: one at a time.
    checkpoint_running: Mutex<()>,
    /// Shard owners compact only frames at or below this lsn: below the last checkpoint,
    /// every batch is finished and never applied again.
    compact_horizon: Arc<std::sync::atomic::AtomicU64>,
    /// Base backups running and compaction steps running (`backup_gate.rs`).
    backup_gate: Arc<backup_gate::BackupGate>,
    /// WAL lsns kept for standbys that were just re-seeded (`backup_gate.rs`).
    backup_pins: Arc<backup_gate::Pins>,
    /// The thread that finishes a standby's flushes behind its fetches (`apply.rs`).
    /// Declared (so dropped) before `shards` and `pool`: a flush it waits for is answered
    /// by a pool thread, and a pool stopped first would leave it waiting for ever (a hang
    /// at drop seen in `reseed_crash`).
    effects_flusher: effects_flush::EffectsFlusher,
    shards: Mutex<HashMap<String, Arc<ShardSlot>>>,
    /// The shards that exist, for `shards_max` (`shard_limit.rs`); taken after `shards`
    /// when both are held, never before.
    known_shards: Mutex<shard_limit::KnownShards>,
    /// The threads shard owners run on (`shard_threads`); declared after `shards`, so the
    /// owners are closed before the threads stop.
    pool: owner::PoolHandle,
    /// Per shard, the largest claim lsn with a `done` record, as recovery found it (the
    /// checkpoint's figure, then the `done` records replayed after it): every frame up to it
    /// was flushed before that record was written, and anything later is rebuilt from its
    /// claim. Lets a shard opened later drop a gap among never-flushed frames after a power
    /// loss rather than call it corruption. (The planner's `vouched` is the live figure; a
    /// shard is opened under the planner lock, so it reads this copy.)
    synced_through: HashMap<String, Lsn>,
    planner: Mutex<Planner>,
    /// Signalled when a batch finishes, or the role changes (a duplicate of an in-flight
    /// key waits on it).
    finished_cv: Arc<Condvar>,
    failed: Arc<AtomicBool>,
    /// Why intake is paused (a log has no spare segment: `room.rs`), since when.
    pause: Mutex<Option<Pause>>,
    /// What the engine sees of replication (`log_role.rs`): role, epochs, the wait for a
    /// standby, behind a small interface.
    log_role: Arc<dyn LogRole>,
    /// A standby's claims held back or applied unflushed (`apply.rs`).
    held: held::HeldClaims,
    /// Answered claims waiting for their durability tail's round (`settle.rs`).
    rounds: round_queue::Rounds,
    /// The thread that syncs a claim step's WAL records while its results are prepared.
    claim_syncer: claim_sync::ClaimSyncer,
    pub stats: Arc<Stats>,
    /// Unanswered input held by the bulk files and by the stream (`intake_bytes.rs`).
    pub intake: intake_bytes::Intakes,
    opened: Instant,
    recovery: RecoveryReport,
    _lock: Option<DirLock>,
}

impl Engine {
    /// Opens the data directory and runs recovery: replays the WAL and finishes every batch
    /// that was claimed but not finished, with its claimed ids and recorded plan, before
    /// returning. Nothing new is taken before this returns.
    pub fn open(opts: EngineOptions) -> Result<Engine, EngineError> {
        Engine::open_with_progress(opts, &|_, _, _| {})
    }

    /// [`Engine::open`], calling `progress(phase, done, total)` about ten times a second
    /// during a long recovery (the CLI draws a bar on a terminal and sends STATUS=); a log
    /// line goes out at least every second.
    pub fn open_with_progress(
        opts: EngineOptions,
        progress: &dyn Fn(&str, u64, u64),
    ) -> Result<Engine, EngineError> {
        let started = Instant::now();
        let EngineOptions {
            storage,
            config,
            crash,
            log_role,
        } = opts;
        let layout = Layout::new(&config.data_dir);
        storage
            .create_dir_all(layout.data_dir())
            .map_err(io_err("create", layout.data_dir()))?;
        let lock_file = lock_data_dir(storage.as_ref(), &layout)?;
        let spool = SpoolPaths::new(&config.spool_dir());
        spool
            .create(storage.as_ref())
            .map_err(io_err("create", &spool.root))?;
        let (wal, audit, keys, index) = open_logs(&storage, &layout, &config)?;
        let publisher = Publisher::new(storage.clone(), &spool.out, config.result_sync)
            .map_err(io_err("open", &spool.out))?;
        sync_new_dirs(storage.as_ref(), &layout, &spool)?;
        let parts = role_parts(&storage, &config, &layout, &wal);
        let (failed, finished_cv) = (parts.failed.clone(), parts.changed.clone());
        let backup_pins = parts.pins.clone();
        let log_role = log_role.open(parts)?;
        let claim_syncer = claim_sync::ClaimSyncer::start(wal.clone());
        let effects_flusher = effects_flush::EffectsFlusher::start(audit.clone(), failed.clone());
        let pool = owner::ShardPool::start(config.shard_threads)
            .map_err(io_err("start shard threads", layout.data_dir()))?;
        let intake = intake_bytes::Intakes::new(config.intake_bytes());
        let engine = Engine {
            storage,
            layout,
            spool,
            publisher,
            config,
            crash,
            wal,
            audit,
            keys,
            index,
            checkpoints: Mutex::new(checkpoint_state::CheckpointState::default()),
            checkpoint_running: Mutex::new(()),
            compact_horizon: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            backup_gate: Arc::default(),
            backup_pins,
            shards: Mutex::new(HashMap::new()),
            known_shards: Mutex::default(),
            pool: owner::PoolHandle(pool),
            synced_through: HashMap::new(),
            planner: Mutex::new(Planner::new()),
            finished_cv,
            failed,
            pause: Mutex::new(None),
            log_role,
            held: held::HeldClaims::default(),
            rounds: round_queue::Rounds::default(),
            claim_syncer,
            effects_flusher,
            stats: Arc::new(Stats::default()),
            intake,
            opened: Instant::now(),
            recovery: RecoveryReport::default(),
            _lock: lock_file,
        };
        let engine = engine.recover(started, progress)?;
        engine.fill_known_shards();
        Ok(engine)
    }

    /// Starts the count of shards for `shards_max` once recovery has opened what it needed:
    /// the directories on disk, the shards recovery knows of, and the shards open now.
    fn fill_known_shards(&self) {
        let mut names: Vec<String> = lock(&self.shards).keys().cloned().collect();
        names.extend(self.synced_through.keys().cloned());
        names.extend(shard_limit::listed_shard_dirs(
            self.storage.as_ref(),
            &self.layout.shards(),
        ));
        lock(&self.known_shards).fill(names);
    }

    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    pub fn spool(&self) -> &SpoolPaths {
        &self.spool
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn data_dir(&self) -> &Path {
        self.layout.data_dir()
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    pub fn wal(&self) -> &Wal {
        &self.wal
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Record counts per shard opened since start (a shard closed while idle answers with
    /// the count it closed with).
    pub fn shard_counts(&self) -> BTreeMap<String, usize> {
        self.shard_figures()
            .into_iter()
            .map(|(k, f)| (k, f.records))
            .collect()
    }

    /// Each shard opened since start: its records, largest id, and whether it is open now.
    pub fn shard_figures(&self) -> BTreeMap<String, ShardFigures> {
        let slots: Vec<(String, Arc<ShardSlot>)> = lock(&self.shards)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        slots
            .into_iter()
            .filter_map(|(k, s)| s.stats().ok().map(|f| (k, f)))
            .collect()
    }

    /// Shards whose `Shard` is open now (maps, file descriptors and lock held); those that
    /// exist beyond it are closed (`shard_idle_close_ms`, or not used since start).
    pub fn shards_open(&self) -> u64 {
        self.stats.shards_open.load(Ordering::Relaxed)
    }

    /// The owner of shard `name`, opening the shard (and starting its owner) on first use.
    /// The owner keeps the `ShardOpener` to reopen the shard after an idle close, the same
    /// way, vouched through the lsn it closed at.
    fn slot(&self, name: &str) -> Result<Arc<ShardSlot>, EngineError> {
        let mut shards = lock(&self.shards);
        if let Some(s) = shards.get(name) {
            return Ok(s.clone());
        }
        let opener = ShardOpener {
            storage: self.storage.clone(),
            dir: self.layout.shard(name),
            opts: ShardOptions {
                segment_bytes: self.config.shard_segment_bytes,
                read_only: false,
                synced_through_lsn: Some(self.synced_through.get(name).copied().unwrap_or(0)),
                zero_ahead_bytes: self.config.zero_ahead_bytes,
                ..ShardOptions::default()
            },
        };
        let shard = opener.open(name)?;
        let idle_close_ms = self.config.shard_idle_close_ms;
        let ctx = OwnerContext {
            pool: self.pool.0.clone(),
            crash: self.crash.clone(),
            stats: self.stats.clone(),
            opened: self.opened,
            horizon: self.compact_horizon.clone(),
            gate: self.backup_gate.clone(),
            compact_rate: self.config.shard_compact_bytes_per_sec,
            compact_dead: self.config.shard_compact_dead_fraction,
            idle_close: (idle_close_ms > 0).then(|| Duration::from_millis(idle_close_ms)),
        };
        let slot = Arc::new(ShardSlot::spawn(name, shard, opener, ctx));
        shards.insert(name.to_owned(), slot.clone());
        lock(&self.known_shards).note(name);
        Ok(slot)
    }

    /// [`replace_file`] on this engine's storage; a failure latches the engine.
    fn replace_file(&self, path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
        replace_file(self.storage.as_ref(), path, bytes).inspect_err(|_| self.fail())
    }

    /// A step boundary: progress for the watchdog, and the crash hook.
    fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
        self.stats
            .last_progress_ms
            .store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.crash.hit(point).inspect_err(|_| self.fail())
    }

    /// Milliseconds since open.
    pub fn uptime_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    /// The last lsn written to the WAL.
    pub fn last_lsn(&self) -> Lsn {
        self.wal.next_lsn() - 1
    }

    /// False when batches are in flight but none has moved for `stall`: a wedged shard or
    /// disk. The watchdog stops pinging then.
    pub fn healthy(&self, stall: Duration) -> bool {
        if self.is_failed() {
            return false;
        }
        let in_flight = self.stats.in_flight.load(Ordering::Relaxed);
        // Batches answered and waiting for their durability round are work too: a round
        // wedged on a flush stops the watchdog like a wedged batch (`settle.rs`).
        let waiting = self.stats.tail_waiting.load(Ordering::Relaxed);
        let since = self
            .uptime_ms()
            .saturating_sub(self.stats.last_progress_ms.load(Ordering::Relaxed));
        (in_flight == 0 && waiting == 0) || since < stall.as_millis() as u64
    }

    /// Runs the durability round, then makes every WAL record written so far durable (the
    /// lazily written done records): the last step of a graceful stop.
    pub fn sync(&self) -> Result<(), EngineError> {
        // The batches waiting for their durability round close first (`settle.rs`); a
        // failed engine leaves them to recovery.
        if !self.is_failed() {
            self.settle()?;
        }
        let last = self.last_lsn();
        if last > 0 {
            self.wal.sync_to(last)?;
        }
        Ok(())
    }

    pub fn wal_stats(&self) -> (u64, u64) {
        (self.wal.append_count(), self.wal.sync_count())
    }

    /// (appends, syncs) of the audit log since open.
    pub fn audit_stats(&self) -> (u64, u64) {
        (self.audit.append_count(), self.audit.sync_count())
    }

    /// (rounds, results) published since start.
    pub fn publish_stats(&self) -> (u64, u64) {
        self.publisher.stats()
    }

    /// Records an invalid input: counted, result written, input already moved by the caller.
    pub fn note_invalid(&self) {
        self.stats.invalid.fetch_add(1, Ordering::Relaxed);
    }

    fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        self.finished_cv.notify_all();
    }

    fn check(&self) -> Result<(), EngineError> {
        if self.is_failed() {
            Err(EngineError::Failed)
        } else {
            Ok(())
        }
    }

    /// What this engine sees of replication (`log_role.rs`).
    pub fn log_role(&self) -> &Arc<dyn LogRole> {
        &self.log_role
    }

    pub fn role(&self) -> Role {
        self.log_role.role()
    }

    /// Under `ack = "standby"`, waits until a standby holds the record at `lsn` durably (or,
    /// with `when_standby_lost = "alone"`, until none is in sync for `standby_timeout_ms`).
    /// `Unreplicated` when the node stops or steps down meanwhile: nothing is published, and
    /// the batch stays claimed for recovery (or for the new primary).
    fn wait_replicated(&self, lsn: Lsn) -> Result<(), EngineError> {
        let below = || {
            lock(&self.checkpoints)
                .last
                .as_ref()
                .map_or(1, |c| c.wal_from)
        };
        let waited = self.log_role.wait_replicated(lsn, &below)?;
        if let Some(t) = waited {
            self.stats.latency.replicate.record(t);
        }
        Ok(())
    }
}

/// The engine's logs: the WAL, the audit log, the request-key table and its index.
fn open_logs(
    storage: &Arc<dyn Storage>,
    layout: &Layout,
    config: &Config,
) -> Result<(Arc<Wal>, Arc<Wal>, Wal, KeyIndex), EngineError> {
    let wal_opts = wal_options(config);
    let wal = Wal::open_with(storage.clone(), layout.wal(), wal_opts.clone())?;
    // The audit log grows with history (kept unless `audit_retain_*`): open scans only its
    // newest segment, so restart time does not follow its size.
    let audit_opts = WalOptions {
        scan_sealed: false,
        ..wal_opts
    };
    let audit = Wal::open_with(storage.clone(), layout.audit(), audit_opts)?;
    let keys = Wal::open_with(storage.clone(), layout.keys(), key_table_options(config))?;
    let index = KeyIndex::open(
        storage.clone(),
        &layout.key_index(),
        key_index_options(config),
    )?;
    Ok((Arc::new(wal), Arc::new(audit), keys, index))
}

/// What the log role is opened from: the engine's WAL, and a fresh latch, condvar and pins
/// the engine keeps too.
fn role_parts(
    storage: &Arc<dyn Storage>,
    config: &Arc<Config>,
    layout: &Layout,
    wal: &Arc<Wal>,
) -> RoleParts {
    RoleParts {
        storage: storage.clone(),
        config: config.clone(),
        epoch_file: layout.epoch(),
        leader_epochs: layout.leader_epochs(),
        wal: wal.clone(),
        failed: Arc::default(),
        changed: Arc::default(),
        pins: Arc::default(),
    }
}

/// The WAL and audit log options the configuration implies: a segment always holds at least
/// two of the largest claims.
pub fn wal_options(config: &Config) -> WalOptions {
    let payload_bytes_max = config.claim_bytes_max().clamp(4 << 10, 128 << 20) as u32;
    WalOptions {
        segment_bytes: config.wal_segment_bytes.max(2 * payload_bytes_max as u64),
        payload_bytes_max,
        zero_ahead_bytes: config.zero_ahead_bytes,
        ..WalOptions::default()
    }
}

/// The key table's options: a record holds a key and, per op, its kind, shard and id; its
/// segments are the WAL's size.
/// Runs are not merged past this many keys: expiry removes whole runs, so at most this many
/// keys' index entries and table records outlive the window (384 MiB of index at 24 bytes a
/// key); a lookup probes one filter per this many live keys plus a few small runs.
const KEY_RUN_ENTRIES_MAX: u64 = 16 << 20;

fn key_index_options(config: &Config) -> IndexOptions {
    IndexOptions {
        filter_bytes_max: config.key_filter_bytes_max(),
        run_entries_max: KEY_RUN_ENTRIES_MAX,
    }
}

fn key_table_options(config: &Config) -> WalOptions {
    let payload_bytes_max = (2048 + 128 * u64::from(config.batch_ops_max)).clamp(4 << 10, 64 << 20);
    WalOptions {
        segment_bytes: config.wal_segment_bytes.max(2 * payload_bytes_max),
        payload_bytes_max: payload_bytes_max as u32,
        zero_ahead_bytes: config.zero_ahead_bytes,
        // Holds a whole window of keys: open scans only its newest segment.
        scan_sealed: false,
        ..WalOptions::default()
    }
}

/// The directories open may have just created (the data directory, `wal/`, `audit/`,
/// `shards/`, the spool and its folders) last only once their parents are synced.
fn sync_new_dirs(
    storage: &dyn Storage,
    layout: &Layout,
    spool: &SpoolPaths,
) -> Result<(), EngineError> {
    storage
        .create_dir_all(&layout.shards())
        .map_err(io_err("create", &layout.shards()))?;
    let dirs = [
        layout.data_dir().parent(),
        Some(layout.data_dir()),
        spool.root.parent(),
        Some(spool.root.as_path()),
    ];
    let mut dirs: Vec<&Path> = dirs
        .into_iter()
        .flatten()
        .filter(|d| !d.as_os_str().is_empty())
        .collect();
    // The default spool lives in the data directory: sync each directory once.
    dirs.sort();
    dirs.dedup();
    for d in dirs {
        storage.sync_dir(d).map_err(io_err("sync dir", d))?;
    }
    Ok(())
}

/// Takes the data directory's `LOCK` (on a real disk; the simulator has one process).
pub fn lock_data_dir(
    storage: &dyn Storage,
    layout: &Layout,
) -> Result<Option<DirLock>, EngineError> {
    if !storage.is_real() {
        return Ok(None);
    }
    match DirLock::acquire(layout.data_dir()) {
        Ok(l) => Ok(Some(l)),
        Err(LockError::Held { path }) => Err(EngineError::Locked { path }),
        Err(LockError::Io { op, path, source }) => Err(EngineError::Io { op, path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::Overlay;

    #[test]
    fn an_applied_delete_takes_the_id_out_of_a_create_still_in_the_overlay() {
        // Batch 1 created 100 (applied on this shard, its overlay kept while it waits on
        // another shard); batch 2 deleted 100 and was applied here: 100 exists no more.
        let mut o = Overlay::default();
        o.created.insert(100);
        o.deleted.insert(100);
        o.applied(100, false);
        assert!(!o.created.contains(&100) && !o.deleted.contains(&100));
        // Batch 1's own clearing afterwards changes nothing.
        o.applied(100, true);
        assert!(o.created.is_empty() && o.deleted.is_empty());
        // A delete planned but not applied yet still hides a create already applied.
        o.created.insert(7);
        o.deleted.insert(7);
        o.applied(7, true);
        assert!(o.deleted.contains(&7) && !o.created.contains(&7));
    }
}

//! The batch pipeline of `RoostApplyBatch.tla` on real files: Plan -> Claim -> Commit ->
//! Finish, and the recovery that finishes every claimed batch after a crash.
//!
//! This module is synchronous and owns no threads but the shard pool's: every intake calls
//! its one way in, [`Engine::submit`] (a batch alone is a group of one; the intake says only
//! how the answers are delivered, [`Deliver`]), from a bounded pool of blocking workers, and
//! crash tests call it directly over a simulated disk. Many batches may be in the pipeline
//! at once:
//! - Planning and the claim append happen under one lock (the planner's, in `claims`), so
//!   lsn order is plan order and ids are minted in lsn order, unique across all shards and
//!   never reused (`claim_lock.rs`).
//! - Claim syncs are group-committed by the WAL: waiting workers share fdatasyncs.
//! - Each shard has one owner (`owner.rs`), run on a bounded pool of threads, that applies
//!   transactions strictly in lsn order (the turns registered at claim time) and flushes once per round for all of them,
//!   so overlapping batches never reorder and share shard flushes (`finish.rs`).
//! - A failure of any write or sync latches the engine (`failed`): the daemon exits non-zero
//!   and recovery on restart repairs (`recover.rs`).
//!
//! The engine's parts, each owning its state: `logs` (the WAL, the audit log, the claim
//! syncer, checkpoint state, the rounds waiting for their tail), `keys` (the key window),
//! `shard_set` (the shard pool), `answers` (the spool and the publisher: every answer),
//! `pause` (intake paused on a full disk), `held` (a standby's claims), `env` (storage and
//! its clock, configuration, the latch, the directory lock), `claim_lock` (the planner lock
//! and what it guards: keys, the id counter, overlays, open claims; the claim and rejection
//! records appended under it, the WAL replayed into it). Views that borrow the parts one job
//! needs: `room` (spares and the pause), `apply` (`Standby`), `settle` (the tail's rounds,
//! and `names`: spool names reused during a tail). The steps that coordinate them: `plan` (the
//! way in, Plan and Claim), `finish` (Commit, Finish), `recover` (open-time replay),
//! `checkpoint`; and `records` (the WAL and audit payloads), `owner` (shard owners on a
//! thread pool), `crash` (named crash points), `trigger` (before-triggers), `stats`
//! (counters, histograms), `figures` (what status and metrics read of the parts, in one
//! snapshot).

mod answers;
mod apply;
pub mod backup;
pub mod backup_gate;
mod checkpoint;
mod checkpoint_state;
mod claim_lock;
mod claim_sync;
pub mod crash;
pub mod disk;
mod effects_flush;
mod env;
mod figures;
mod finish;
mod held;
pub mod intake_bytes;
mod invariants;
mod keys;
pub mod log_role;
mod logs;
mod memory;
mod names;
mod owner;
mod pause;
mod plan;
mod planner;
pub mod records;
mod recover;
mod room;
mod round_queue;
mod settle;
mod shard_limit;
mod shard_set;
pub use shard_set::shard_options;
pub mod stats;
mod tails;
pub mod trigger;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use roost_keyindex::{IndexOptions, KeyIndex};
use roost_storage::{Clock, DirLock, LockError, Storage};
use roost_wal::{Lsn, Wal, WalOptions};

use crate::config::Config;
use crate::error::EngineError;
use crate::layout::Layout;
use crate::spool::{Publisher, SpoolPaths};
use crash::CrashHook;
use disk::io_err;
use keys::{KeyFound, KeyState};
use planner::Planner;
use stats::Stats;

pub use answers::is_detached;
pub use apply::{Fetched, Standby};
pub use figures::Figures;
pub use keys::committed_result;
pub use log_role::{Lead, LogRole, OpenLogRole, Role, RoleParts};
pub use memory::MemoryReport;
pub use owner::ShardFigures;
pub use pause::Pause;
pub use plan::{one_answer, Deliver};
pub use records::Checkpoint;
pub use recover::{read_checkpoint, RecoveryReport};
pub use room::Room;
pub use shard_set::ShardSet;

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

/// The engine coordinates its parts; each owns its state behind a narrow interface.
/// Declaration order is drop order: the publisher's helpers stop first, then the shard pool
/// (its effects flusher, its owners, its threads, in that order), then the log role, then
/// the logs (the claim syncer last among them), and the data directory's lock goes last, in
/// `env`.
pub struct Engine {
    /// Publishing answers: the spool and the publisher (`answers.rs`).
    answers: answers::Answers,
    /// The key window: the request-key table and its index on disk (`keys.rs`).
    keys: keys::KeyWindow,
    /// The shard pool (`shard_set.rs`): the owners, the threads they run on, the standby's
    /// effects flusher; it stops them in that order when dropped.
    shards: shard_set::ShardSet,
    /// What the engine sees of replication (`log_role.rs`): role, epochs, the wait for a
    /// standby, behind a small interface.
    log_role: Arc<dyn LogRole>,
    /// The log and claims (`logs.rs`): the WAL, the audit log, the claim syncer, the
    /// checkpoint state, the rounds waiting for their tail.
    log: logs::Logs,
    /// The claims part (`claim_lock.rs`): the planner and its lock.
    claims: claim_lock::Claims,
    /// A standby's claims held back or applied unflushed (`apply.rs`).
    held: held::HeldClaims,
    /// Why intake is paused (a log has no spare segment: `room.rs`), since when.
    pause: pause::IntakePause,
    pub stats: Arc<Stats>,
    /// Unanswered input held by the bulk files and by the stream (`intake_bytes.rs`).
    pub intake: intake_bytes::Intakes,
    recovery: RecoveryReport,
    /// The storage, the names, the configuration, the latch, the directory lock (`env.rs`).
    env: env::Env,
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
        let EngineOptions {
            storage,
            config,
            crash,
            log_role,
        } = opts;
        let started = storage.now();
        let layout = Layout::new(&config.data_dir);
        storage
            .create_dir_all(layout.data_dir())
            .map_err(io_err("create", layout.data_dir()))?;
        let lock_file = lock_data_dir(storage.as_ref(), &layout)?;
        let spool = SpoolPaths::new(&config.spool_dir());
        spool
            .create(storage.as_ref())
            .map_err(io_err("create", &spool.root))?;
        let (wal, audit, key_table, index) = open_logs(&storage, &layout, &config)?;
        let publisher = Publisher::new(storage.clone(), &spool.out, config.result_sync)
            .map_err(io_err("open", &spool.out))?;
        sync_new_dirs(storage.as_ref(), &layout, &spool)?;
        let parts = role_parts(&storage, &config, &layout, &wal);
        let (failed, finished_cv) = (parts.failed.clone(), parts.changed.clone());
        let backup_pins = parts.pins.clone();
        let log_role = log_role.open(parts)?;
        let log = logs::Logs::new((wal, audit.clone()), backup_pins, &storage);
        let stats = Arc::new(Stats::default());
        let (parts, latch) = ((layout, config, crash), (failed, finished_cv));
        let mut env = env::Env::new(storage, parts, latch, stats.clone());
        let shards = shard_set::ShardSet::start(&env, &audit)
            .map_err(io_err("start shard threads", env.layout.data_dir()))?;
        // The lock joins `env` once every part has started: an open that fails before drops
        // it after them, last.
        env._lock = lock_file;
        let config = &env.config;
        let intake = intake_bytes::Intakes::new(config.intake_bytes());
        let answers = answers::Answers::new(env.storage.clone(), config.clone(), spool, publisher);
        let window_secs = config.request_key_window_secs;
        let key_window = keys::KeyWindow::new(key_table, index, window_secs, &env);
        let engine = Engine {
            answers,
            keys: key_window,
            shards,
            log_role,
            log,
            claims: claim_lock::Claims::new(),
            held: held::HeldClaims::default(),
            pause: pause::IntakePause::new(stats.clone(), env.clock.clone()),
            stats,
            intake,
            recovery: RecoveryReport::default(),
            env,
        };
        let engine = engine.recover(started, progress)?;
        engine.shards.fill_known();
        Ok(engine)
    }

    pub fn spool(&self) -> &SpoolPaths {
        self.answers.spool()
    }

    pub fn config(&self) -> &Config {
        &self.env.config
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.env.storage
    }

    pub fn wal(&self) -> &Wal {
        self.log.wal()
    }

    pub fn is_failed(&self) -> bool {
        self.env.is_failed()
    }

    /// The shard pool, for its figures (`ShardSet::figures`, `ShardSet::compaction`).
    pub fn shards(&self) -> &ShardSet {
        &self.shards
    }

    /// The last lsn written to the WAL.
    pub fn last_lsn(&self) -> Lsn {
        self.log.wal().next_lsn() - 1
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
            .env
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
            self.log.wal().sync_to(last)?;
        }
        Ok(())
    }

    /// Room on disk for new batches: whether intake is paused, and the way to resume it.
    pub fn room(&self) -> Room<'_> {
        Room {
            log: &self.log,
            keys: &self.keys,
            shards: &self.shards,
            pause: &self.pause,
            layout: &self.env.layout,
        }
    }

    /// The standby's side: applying fetched records, promotion, the claims held back.
    pub fn standby(&self) -> Standby<'_> {
        Standby {
            held: &self.held,
            log_role: self.log_role.as_ref(),
            shards: &self.shards,
            log: &self.log,
            claims: &self.claims,
            env: &self.env,
        }
    }

    /// The durability tail's rounds (`settle.rs`).
    fn tail(&self) -> settle::Settler<'_> {
        settle::Settler {
            log: &self.log,
            claims: &self.claims,
            env: &self.env,
            stats: &self.stats,
        }
    }

    /// Runs a round for every claim waiting (none: nothing is done). Returns how many it
    /// closed. A failure latches the engine: the claims it held stay open for recovery.
    pub fn settle(&self) -> Result<usize, EngineError> {
        self.tail().settle()
    }

    /// Whether claims have waited `tail_round_ms` for a round (the serve loop runs one).
    pub fn settle_due(&self) -> bool {
        self.tail().settle_due()
    }

    pub fn role(&self) -> Role {
        self.log_role.role()
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
        pins: Arc::new(backup_gate::Pins::new(Clock::of(storage.clone()))),
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

//! The batch pipeline of `RoostApplyBatch.tla` on real files: Plan -> Claim -> Commit ->
//! Finish, and the recovery that finishes every claimed batch after a crash.
//!
//! This module is synchronous and owns no threads: the serve loop calls [`Engine::submit`]
//! from a bounded pool of blocking workers, and crash tests call it directly over a simulated
//! disk. Many batches may be in the pipeline at once:
//! - Planning and the claim append happen under one lock (`planner`), so lsn order is plan
//!   order and ids are minted in lsn order, unique across all shards and never reused.
//! - Claim syncs are group-committed by the WAL: waiting workers share fdatasyncs.
//! - Each shard has one owner thread (`owner.rs`) that applies transactions strictly in lsn
//!   order (the turns registered at claim time) and flushes once per round for all of them,
//!   so overlapping batches never reorder and share shard flushes.
//! - A failure of any write or sync latches the engine (`failed`): the daemon exits non-zero
//!   and recovery on restart repairs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use roost_shards::{Shard, ShardError, ShardOptions, TxnOp};
use roost_wal::codec::{
    self, AuditRecord, ClaimRecord, CodecError, DoneRecord, PlannedOp, RecordType,
};
use roost_wal::storage::Storage;
use roost_wal::{Lsn, Wal, WalError, WalOptions};
use tracing::{debug, info, warn};

use crate::batch::{fingerprint, Batch, BatchOp, BatchResult, OpResult, Status};
use crate::config::Config;
use crate::crash::CrashHook;
use crate::owner::{OwnerContext, ShardSlot};
use crate::spool::{self, Publisher, SpoolPaths};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("shard {shard}: {source}")]
    Shard { shard: String, source: ShardError },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("wal record lsn {lsn}: {source}")]
    Codec { lsn: Lsn, source: CodecError },
    #[error("data directory {} is locked: another roost is running on it", path.display())]
    Locked { path: PathBuf },
    #[error("injected crash at {0}")]
    Crashed(String),
    #[error("pipeline stopped after an earlier failure")]
    Failed,
    #[error("wal record lsn {lsn}: {detail}")]
    Inconsistent { lsn: Lsn, detail: String },
    /// A shard owner stopped after an earlier failure, reported to another waiter.
    #[error("{0}")]
    Poisoned(String),
}

impl EngineError {
    /// The same failure for a second waiter (I/O errors are not `Clone`).
    pub fn clone_for_reply(&self) -> EngineError {
        match self {
            EngineError::Crashed(p) => EngineError::Crashed(p.clone()),
            other => EngineError::Poisoned(other.to_string()),
        }
    }
}

impl EngineError {
    pub fn is_corruption(&self) -> bool {
        match self {
            EngineError::Wal(e) => e.is_corruption(),
            EngineError::Shard { source, .. } => source.is_corruption(),
            EngineError::Codec { .. } | EngineError::Inconsistent { .. } => true,
            _ => false,
        }
    }
}

/// Where everything lives, and the seam it goes through.
#[derive(Clone)]
pub struct EngineOptions {
    pub storage: Arc<dyn Storage>,
    pub data_dir: PathBuf,
    pub spool_dir: PathBuf,
    pub config: Arc<Config>,
    pub crash: Arc<dyn CrashHook>,
}

/// Counters since start (for `roost status` and the bench).
#[derive(Debug, Default)]
pub struct Stats {
    pub committed: AtomicU64,
    pub rejected: AtomicU64,
    pub invalid: AtomicU64,
    pub conflict: AtomicU64,
    pub duplicate: AtomicU64,
    pub in_flight: AtomicU64,
    pub latency: crate::metrics::PhaseLatency,
    /// Shard transactions applied, and the flushes (msync + fdatasync) that made them
    /// durable: owners flush once per round, so under load flushes < transactions.
    pub shard_txns: AtomicU64,
    pub shard_flushes: AtomicU64,
    /// Milliseconds since the engine opened at which a batch last moved through a step; the
    /// watchdog stops pinging when batches are in flight and this stops advancing.
    pub last_progress_ms: AtomicU64,
}

/// What recovery did at open.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub duration: Duration,
    pub wal_records: u64,
    pub batches_finished: u64,
    pub wal_torn_bytes: u64,
    pub audit_torn_bytes: u64,
}

#[derive(Clone, Copy)]
struct KeyState {
    lsn: Lsn,
    fingerprint: u64,
    done: bool,
}

/// Ids planned but not yet committed, per shard: planning sees committed state plus these.
#[derive(Default)]
struct Overlay {
    created: HashSet<u64>,
    deleted: HashSet<u64>,
}

struct Planner {
    keys: HashMap<String, KeyState>,
    next_id: u64,
    overlay: HashMap<String, Overlay>,
}

pub struct Engine {
    storage: Arc<dyn Storage>,
    data_dir: PathBuf,
    spool: SpoolPaths,
    publisher: Publisher,
    config: Arc<Config>,
    crash: Arc<dyn CrashHook>,
    wal: Wal,
    audit: Wal,
    shards: Mutex<HashMap<String, Arc<ShardSlot>>>,
    /// Per shard, the largest claim lsn with a `done` record in the WAL: every frame up to it
    /// was flushed before that record was written, and anything later is rebuilt from its
    /// claim. Lets a shard drop a gap among never-flushed frames after a power loss rather
    /// than call it corruption. Exact only because the WAL is replayed from its first record.
    synced_through: HashMap<String, Lsn>,
    planner: Mutex<Planner>,
    /// Signalled when a batch finishes (a duplicate of an in-flight key waits on it).
    finished_cv: Condvar,
    failed: AtomicBool,
    pub stats: Arc<Stats>,
    opened: Instant,
    recovery: RecoveryReport,
    _lock: Option<File>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub const WAL_DIR: &str = "wal";
pub const AUDIT_DIR: &str = "audit";
pub const SHARDS_DIR: &str = "shards";
pub const LOCK_FILE: &str = "LOCK";

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
            data_dir,
            spool_dir,
            config,
            crash,
        } = opts;
        let io = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| EngineError::Io { op, path, source }
        };
        storage
            .create_dir_all(&data_dir)
            .map_err(io("create", &data_dir))?;
        let lock_file = if storage.is_real() {
            let path = data_dir.join(LOCK_FILE);
            let f = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io("open", &path))?;
            match f.try_lock() {
                Ok(()) => Some(f),
                Err(std::fs::TryLockError::WouldBlock) => return Err(EngineError::Locked { path }),
                Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", &path)(e)),
            }
        } else {
            None
        };
        let spool = SpoolPaths::new(&spool_dir);
        spool
            .create(storage.as_ref())
            .map_err(io("create", &spool_dir))?;
        let payload_bytes_max = config.claim_bytes_max().clamp(4 << 10, 128 << 20) as u32;
        let wal_opts = WalOptions {
            segment_bytes: config.wal_segment_bytes.max(2 * payload_bytes_max as u64),
            payload_bytes_max,
            ..WalOptions::default()
        };
        let wal = Wal::open_with(storage.clone(), data_dir.join(WAL_DIR), wal_opts.clone())?;
        let audit = Wal::open_with(storage.clone(), data_dir.join(AUDIT_DIR), wal_opts)?;
        let publisher = Publisher::new(storage.clone(), &spool.out, config.result_sync)
            .map_err(io("open", &spool.out))?;
        let engine = Engine {
            storage,
            data_dir,
            spool,
            publisher,
            config,
            crash,
            wal,
            audit,
            shards: Mutex::new(HashMap::new()),
            synced_through: HashMap::new(),
            planner: Mutex::new(Planner {
                keys: HashMap::new(),
                next_id: 1,
                overlay: HashMap::new(),
            }),
            finished_cv: Condvar::new(),
            failed: AtomicBool::new(false),
            stats: Arc::new(Stats::default()),
            opened: Instant::now(),
            recovery: RecoveryReport::default(),
            _lock: lock_file,
        };
        engine.recover(started, progress)
    }

    fn recover(
        mut self,
        started: Instant,
        progress: &dyn Fn(&str, u64, u64),
    ) -> Result<Engine, EngineError> {
        let total = self.wal.recovery_report().records;
        let mut last_call = Instant::now();
        let mut last_log = Instant::now();
        let mut report = |phase: &str, done: u64, total: u64| {
            if last_call.elapsed() >= Duration::from_millis(100) {
                last_call = Instant::now();
                progress(phase, done, total);
            }
            if last_log.elapsed() >= Duration::from_secs(1) {
                last_log = Instant::now();
                info!(phase, done, total, "recovery progress");
            }
        };
        progress("replaying records", 0, total);
        // 1. Replay the WAL: every key, the highest id ever claimed, the unfinished claims.
        let mut unfinished: BTreeMap<Lsn, ClaimRecord> = BTreeMap::new();
        let mut synced: HashMap<String, Lsn> = HashMap::new();
        let mut shard_names = BTreeSet::new();
        let mut records = 0u64;
        {
            let mut p = lock(&self.planner);
            for rec in self.wal.replay(1) {
                let rec = rec?;
                records += 1;
                report("replaying records", records, total);
                match RecordType::from_u8(rec.record_type) {
                    Some(RecordType::Claim) => {
                        let c: ClaimRecord =
                            codec::decode("claim", &rec.payload).map_err(|source| {
                                EngineError::Codec {
                                    lsn: rec.lsn,
                                    source,
                                }
                            })?;
                        for op in &c.ops {
                            shard_names.insert(op.shard().to_owned());
                            if let PlannedOp::Create { id, .. } = op {
                                p.next_id = p.next_id.max(id + 1);
                            }
                        }
                        p.keys.insert(
                            c.request_key.clone(),
                            KeyState {
                                lsn: rec.lsn,
                                fingerprint: c.fingerprint,
                                done: false,
                            },
                        );
                        unfinished.insert(rec.lsn, c);
                    }
                    Some(RecordType::Done) => {
                        let d: DoneRecord =
                            codec::decode("done", &rec.payload).map_err(|source| {
                                EngineError::Codec {
                                    lsn: rec.lsn,
                                    source,
                                }
                            })?;
                        let Some(c) = unfinished.remove(&d.claim_lsn) else {
                            return Err(EngineError::Inconsistent {
                                lsn: rec.lsn,
                                detail: format!("done for unknown claim lsn {}", d.claim_lsn),
                            });
                        };
                        for op in &c.ops {
                            let t = synced.entry(op.shard().to_owned()).or_insert(0);
                            *t = (*t).max(d.claim_lsn);
                        }
                        if let Some(k) = p.keys.get_mut(&c.request_key) {
                            k.done = true;
                        }
                    }
                    _ => {
                        return Err(EngineError::Inconsistent {
                            lsn: rec.lsn,
                            detail: format!("unknown record type {}", rec.record_type),
                        })
                    }
                }
            }
        }
        self.synced_through = synced;
        // 2. Open every shard the WAL names; ids are never reused even if the WAL were
        //    retired below a create, because each shard remembers its largest id.
        for name in &shard_names {
            let slot = self.slot(name)?;
            let (_, max_id) = slot.stats()?;
            let mut p = lock(&self.planner);
            p.next_id = p.next_id.max(max_id + 1);
        }
        // 3. Audit rows already written for unfinished claims.
        let mut audited: HashMap<Lsn, HashSet<u32>> = HashMap::new();
        if !unfinished.is_empty() {
            let first = *unfinished.keys().next().unwrap_or(&1);
            for rec in self.audit.replay(1) {
                let rec = rec?;
                let a: AuditRecord =
                    codec::decode("audit", &rec.payload).map_err(|source| EngineError::Codec {
                        lsn: rec.lsn,
                        source,
                    })?;
                if a.claim_lsn >= first && unfinished.contains_key(&a.claim_lsn) {
                    audited.entry(a.claim_lsn).or_default().insert(a.op_index);
                }
            }
        }
        // 4. Finish every unfinished batch, oldest first, from its recorded plan.
        let mut finished = 0;
        let to_finish = unfinished.len();
        for (lsn, claim) in &unfinished {
            report("finishing claimed batches", finished, to_finish as u64);
            if cfg!(feature = "mutant-no-claim") {
                // The mutant: the claim is not kept across the retry. The key is forgotten,
                // so the client's retry plans again and mints fresh ids.
                lock(&self.planner).keys.remove(&claim.request_key);
                continue;
            }
            info!(lsn, request_key = %claim.request_key, "recovery: finishing claimed batch");
            let none = HashSet::new();
            self.finish(*lsn, claim, audited.get(lsn).unwrap_or(&none), None)?;
            finished += 1;
        }
        self.recovery = RecoveryReport {
            duration: started.elapsed(),
            wal_records: records,
            batches_finished: finished,
            wal_torn_bytes: self.wal.recovery_report().torn_bytes_truncated,
            audit_torn_bytes: self.audit.recovery_report().torn_bytes_truncated,
        };
        info!(
            records,
            batches_finished = finished,
            ms = self.recovery.duration.as_millis() as u64,
            next_lsn = self.wal.next_lsn(),
            "recovery: done"
        );
        Ok(self)
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
        &self.data_dir
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

    /// Record counts per open shard.
    pub fn shard_counts(&self) -> BTreeMap<String, usize> {
        let slots: Vec<(String, Arc<ShardSlot>)> = lock(&self.shards)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        slots
            .into_iter()
            .filter_map(|(k, s)| s.stats().ok().map(|(n, _)| (k, n)))
            .collect()
    }

    fn slot(&self, name: &str) -> Result<Arc<ShardSlot>, EngineError> {
        let mut shards = lock(&self.shards);
        if let Some(s) = shards.get(name) {
            return Ok(s.clone());
        }
        let opts = ShardOptions {
            segment_bytes: self.config.shard_segment_bytes,
            read_only: false,
            synced_through_lsn: Some(self.synced_through.get(name).copied().unwrap_or(0)),
        };
        let shard = Shard::open_with(
            self.storage.clone(),
            self.data_dir.join(SHARDS_DIR).join(name),
            opts,
        )
        .map_err(|source| EngineError::Shard {
            shard: name.to_owned(),
            source,
        })?;
        let ctx = OwnerContext {
            crash: self.crash.clone(),
            stats: self.stats.clone(),
            opened: self.opened,
        };
        let slot =
            Arc::new(
                ShardSlot::spawn(name, shard, ctx).map_err(|source| EngineError::Io {
                    op: "start shard owner",
                    path: self.data_dir.join(SHARDS_DIR).join(name),
                    source,
                })?,
            );
        shards.insert(name.to_owned(), slot.clone());
        Ok(slot)
    }

    fn hit(&self, point: &str) -> Result<(), EngineError> {
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
        let since = self
            .uptime_ms()
            .saturating_sub(self.stats.last_progress_ms.load(Ordering::Relaxed));
        in_flight == 0 || since < stall.as_millis() as u64
    }

    /// Makes every WAL record written so far durable (the lazily written done records): the
    /// last step of a graceful stop.
    pub fn sync(&self) -> Result<(), EngineError> {
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

    /// Static checks and before-triggers, in op order, without any lock: the first op that
    /// fails and why. These outcomes depend on the op alone, so they are the same on every
    /// attempt.
    fn precheck(&self, batch: &Batch) -> Option<(usize, String)> {
        for (i, op) in batch.ops.iter().enumerate() {
            let Some(sc) = self.config.shard(op.shard()) else {
                return Some((
                    i,
                    format!(
                        "shard {:?} is not declared in the configuration",
                        op.shard()
                    ),
                ));
            };
            if let BatchOp::Create { record, fields, .. } = op {
                if record.len() > sc.record_bytes_max as usize {
                    return Some((
                        i,
                        format!(
                            "record is {} bytes, over record_bytes_max {}",
                            record.len(),
                            sc.record_bytes_max
                        ),
                    ));
                }
                if let Some(f) = sc.required_fields.iter().find(|f| !fields.contains(f)) {
                    return Some((i, format!("record lacks required field {f:?}")));
                }
            }
            if let Some(argv) = &sc.before_trigger {
                let input = trigger_input(&batch.request_key, i, op);
                if let Err(reason) =
                    crate::trigger::run(argv, &input, Duration::from_millis(sc.trigger_timeout_ms))
                {
                    return Some((i, reason));
                }
            }
        }
        None
    }

    /// Runs one batch through the pipeline and returns its result, which is also written to
    /// `out/<source>` before this returns (and `new/<source>` removed).
    pub fn submit(&self, batch: &Batch, source: &str) -> Result<BatchResult, EngineError> {
        self.check()?;
        self.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let r = self.submit_inner(batch, source);
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = &r {
            if !matches!(e, EngineError::Failed) {
                warn!(error = %e, request_key = %batch.request_key, source, "pipeline failed");
            }
            self.fail();
        }
        r
    }

    fn submit_inner(&self, batch: &Batch, source: &str) -> Result<BatchResult, EngineError> {
        let fp = fingerprint(batch);
        let key = batch.request_key.as_str();
        let t0 = Instant::now();
        // Cheap idempotency check before running any trigger.
        if let Some(r) = self.check_key(key, fp, source)? {
            return Ok(r);
        }
        let static_reject = self.precheck(batch);
        let limit = static_reject.as_ref().map_or(batch.ops.len(), |(i, _)| *i);

        let mut p = lock(&self.planner);
        // The key may have been claimed while triggers ran.
        loop {
            self.check()?;
            match p.keys.get(key).copied() {
                None => break,
                Some(k) if k.fingerprint != fp => {
                    drop(p);
                    return self.reply(source, self.conflict(key, k.lsn));
                }
                Some(k) if k.done => {
                    drop(p);
                    return self.reply(source, self.duplicate(k.lsn)?);
                }
                Some(_) => {
                    p = self
                        .finished_cv
                        .wait_timeout(p, Duration::from_millis(50))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0)
                }
            }
        }
        // Plan: walk the ops in order against committed state plus planned overlays.
        let mut deleted_here: HashSet<(&str, u64)> = HashSet::new();
        let mut reject = static_reject;
        for (i, op) in batch.ops[..limit].iter().enumerate() {
            if let BatchOp::Delete { shard, id } = op {
                let exists =
                    self.exists(&p, shard, *id)? && !deleted_here.contains(&(shard.as_str(), *id));
                if !exists {
                    reject = Some((i, format!("id {id} does not exist on shard {shard}")));
                    break;
                }
                deleted_here.insert((shard, *id));
            }
        }
        if let Some((i, reason)) = reject {
            drop(p);
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            debug!(request_key = key, op_index = i, reason = %reason, "batch rejected");
            let r = BatchResult {
                request_key: Some(key.to_owned()),
                status: Status::Rejected,
                lsn: None,
                ops: None,
                op_index: Some(i as u32),
                reason: Some(reason),
                error: None,
            };
            return self.reply(source, r);
        }
        self.stats.latency.plan.record(t0.elapsed());
        let t1 = Instant::now();
        self.hit("after_plan")?;
        // Claim: mint ids, append plan + ids + fingerprint as one record.
        let ops: Vec<PlannedOp> = batch
            .ops
            .iter()
            .map(|op| match op {
                BatchOp::Create { shard, record, .. } => {
                    let id = p.next_id;
                    p.next_id += 1;
                    PlannedOp::Create {
                        shard: shard.clone(),
                        id,
                        record: record.clone(),
                    }
                }
                BatchOp::Delete { shard, id } => PlannedOp::Delete {
                    shard: shard.clone(),
                    id: *id,
                },
            })
            .collect();
        let claim = ClaimRecord {
            request_key: key.to_owned(),
            source: source.to_owned(),
            fingerprint: fp,
            ops,
        };
        let lsn = self
            .wal
            .append_nowait(RecordType::Claim as u8, &codec::encode(&claim))?;
        for name in touched(&claim) {
            let slot = self.slot(name)?;
            lock(&slot.turns).insert(lsn);
        }
        for op in &claim.ops {
            let o = p.overlay.entry(op.shard().to_owned()).or_default();
            match op {
                PlannedOp::Create { id, .. } => o.created.insert(*id),
                PlannedOp::Delete { id, .. } => o.deleted.insert(*id),
            };
        }
        p.keys.insert(
            key.to_owned(),
            KeyState {
                lsn,
                fingerprint: fp,
                done: false,
            },
        );
        drop(p);
        self.hit("after_claim_append")?;
        self.wal.sync_to(lsn)?;
        self.hit("after_claim_sync")?;
        self.stats.latency.claim.record(t1.elapsed());
        self.finish(lsn, &claim, &HashSet::new(), Some(t0))
    }

    fn check_key(
        &self,
        key: &str,
        fp: u64,
        source: &str,
    ) -> Result<Option<BatchResult>, EngineError> {
        let k = lock(&self.planner).keys.get(key).copied();
        match k {
            Some(k) if k.fingerprint != fp => {
                self.reply(source, self.conflict(key, k.lsn)).map(Some)
            }
            Some(k) if k.done => {
                let r = self.duplicate(k.lsn)?;
                self.reply(source, r).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn exists(&self, p: &Planner, shard: &str, id: u64) -> Result<bool, EngineError> {
        if let Some(o) = p.overlay.get(shard) {
            if o.deleted.contains(&id) {
                return Ok(false);
            }
            if o.created.contains(&id) {
                return Ok(true);
            }
        }
        // A shard never written has no segments yet: nothing exists on it, and a rejected
        // delete must not create it.
        let open = lock(&self.shards).get(shard).cloned();
        let slot = match open {
            Some(s) => s,
            None => {
                let dir = self.data_dir.join(SHARDS_DIR).join(shard);
                match self.storage.list(&dir) {
                    Ok(names)
                        if names
                            .iter()
                            .any(|n| n.ends_with(roost_shards::SEGMENT_SUFFIX)) =>
                    {
                        self.slot(shard)?
                    }
                    _ => return Ok(false),
                }
            }
        };
        let held = slot.contains(id)?;
        Ok(held)
    }

    fn conflict(&self, key: &str, lsn: Lsn) -> BatchResult {
        self.stats.conflict.fetch_add(1, Ordering::Relaxed);
        BatchResult {
            request_key: Some(key.to_owned()),
            status: Status::Conflict,
            lsn: Some(lsn),
            ops: None,
            op_index: None,
            reason: Some(format!(
                "request key already used at lsn {lsn} with a different batch"
            )),
            error: None,
        }
    }

    /// The original result of a finished batch, rebuilt from its claim.
    fn duplicate(&self, lsn: Lsn) -> Result<BatchResult, EngineError> {
        self.stats.duplicate.fetch_add(1, Ordering::Relaxed);
        let rec = self
            .wal
            .replay(lsn)
            .next()
            .transpose()?
            .filter(|r| r.lsn == lsn)
            .ok_or_else(|| EngineError::Inconsistent {
                lsn,
                detail: "claim not found for a known key".into(),
            })?;
        let c: ClaimRecord = codec::decode("claim", &rec.payload)
            .map_err(|source| EngineError::Codec { lsn, source })?;
        Ok(committed_result(lsn, &c))
    }

    fn reply(&self, source: &str, r: BatchResult) -> Result<BatchResult, EngineError> {
        self.publish(source, &r)?;
        self.remove_input(source)?;
        Ok(r)
    }

    /// Writes `out/NAME` durably, in a round with the other batches finishing now.
    pub fn publish(&self, source: &str, r: &BatchResult) -> Result<(), EngineError> {
        self.publisher
            .publish(source, r)
            .map_err(|e| EngineError::Io {
                op: "write result",
                path: self.spool.out.join(source),
                source: e,
            })
    }

    /// (rounds, results) published since start.
    pub fn publish_stats(&self) -> (u64, u64) {
        self.publisher.stats()
    }

    fn remove_input(&self, source: &str) -> Result<(), EngineError> {
        spool::remove_input(self.storage.as_ref(), &self.spool, source).map_err(|e| {
            EngineError::Io {
                op: "remove input",
                path: self.spool.new.join(source),
                source: e,
            }
        })
    }

    /// Commit and Finish for a durable claim: one transaction per shard in lsn order, audit
    /// rows (skipping those already written), the input removed, the result file; then the
    /// durability tail:
    /// the shards' flushes, the audit log's sync, the done record. Every step is idempotent,
    /// so recovery can run it again from any crash point.
    ///
    /// The result is published once every shard transaction is applied (readable) and the
    /// audit rows are written, but before the shards and the audit log are synced: the claim,
    /// durable since the claim step, is what the result stands on. A power loss before the
    /// done record is durable makes recovery run this again from the claim (a held lsn is a
    /// no-op, audit rows already there are skipped, the result is the same), so the shards'
    /// and the audit log's syncs come off the client's wait. The done record is appended
    /// only after them: done means nothing is left to redo.
    fn finish(
        &self,
        lsn: Lsn,
        claim: &ClaimRecord,
        audited: &HashSet<u32>,
        started: Option<Instant>,
    ) -> Result<BatchResult, EngineError> {
        let t_commit = Instant::now();
        let mut by_shard: BTreeMap<&str, Vec<TxnOp>> = BTreeMap::new();
        for op in &claim.ops {
            let t = match op {
                PlannedOp::Create { id, record, .. } => TxnOp::Create {
                    id: *id,
                    record: record.clone(),
                },
                PlannedOp::Delete { id, .. } => TxnOp::Delete { id: *id },
            };
            by_shard.entry(op.shard()).or_default().push(t);
        }
        // Every touched shard's owner at once; each applies in lsn order. All answers are
        // collected (even after a failure) so no owner is still writing when this returns.
        let mut waits = Vec::new();
        for (k, (name, ops)) in by_shard.into_iter().enumerate() {
            let slot = self.slot(name)?;
            let rx = slot.send_apply(lsn, k, ops.clone())?;
            waits.push((name, ops, slot, rx));
        }
        let mut first_err = None;
        let mut slots = Vec::with_capacity(waits.len());
        for (name, ops, slot, rx) in waits {
            match slot.wait(&rx, &|| self.is_failed()) {
                Ok(()) => {
                    let mut p = lock(&self.planner);
                    if let Some(o) = p.overlay.get_mut(name) {
                        for op in &ops {
                            match op {
                                TxnOp::Create { id, .. } => o.created.remove(id),
                                TxnOp::Delete { id } => o.deleted.remove(id),
                            };
                        }
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
            slots.push(slot);
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        self.stats.latency.commit.record(t_commit.elapsed());
        let t_finish = Instant::now();
        let mut last = None;
        for (i, op) in claim.ops.iter().enumerate() {
            if audited.contains(&(i as u32)) {
                continue;
            }
            let row = AuditRecord {
                claim_lsn: lsn,
                request_key: claim.request_key.clone(),
                op_index: i as u32,
                op: op.kind(),
                shard: op.shard().to_owned(),
                id: op.id(),
            };
            last = Some(
                self.audit
                    .append_nowait(RecordType::Audit as u8, &codec::encode(&row))?,
            );
            self.hit(&self.crash.nth("after_audit", i))?;
        }
        // The input goes before the answer: the claim holds the batch from here on, and a
        // client may reuse the name as soon as it sees the answer (a removal after it could
        // take the new file).
        self.remove_input(&claim.source)?;
        self.hit("after_input_removed")?;
        let r = committed_result(lsn, claim);
        self.publish(&claim.source, &r)?;
        if let Some(t0) = started {
            self.stats.latency.batch.record(t0.elapsed());
        }
        self.hit("after_result")?;
        // The durability tail, off the client's wait.
        let mut flushes = Vec::with_capacity(slots.len());
        for (k, slot) in slots.iter().enumerate() {
            flushes.push(slot.send_flush(k)?);
        }
        let mut first_err = None;
        for (slot, rx) in slots.iter().zip(&flushes) {
            if let Err(e) = slot.wait(rx, &|| self.is_failed()) {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if let Some(last) = last {
            self.audit.sync_to(last)?;
        }
        self.hit("after_audit_sync")?;
        // Not synced on its own: it rides on the next group commit. If a power loss drops
        // it, recovery finishes the batch again, and every step of that is idempotent (held
        // lsns, audit rows already there, the same result file).
        self.wal.append_nowait(
            RecordType::Done as u8,
            &codec::encode(&DoneRecord { claim_lsn: lsn }),
        )?;
        self.hit("after_done")?;
        if let Some(k) = lock(&self.planner).keys.get_mut(&claim.request_key) {
            k.done = true;
        }
        self.finished_cv.notify_all();
        self.stats.committed.fetch_add(1, Ordering::Relaxed);
        self.stats.latency.finish.record(t_finish.elapsed());
        Ok(r)
    }

    /// Records an invalid input: counted, result written, input already moved by the caller.
    pub fn note_invalid(&self) {
        self.stats.invalid.fetch_add(1, Ordering::Relaxed);
    }
}

fn touched(c: &ClaimRecord) -> BTreeSet<&str> {
    c.ops.iter().map(PlannedOp::shard).collect()
}

pub fn committed_result(lsn: Lsn, c: &ClaimRecord) -> BatchResult {
    BatchResult {
        request_key: Some(c.request_key.clone()),
        status: Status::Committed,
        lsn: Some(lsn),
        ops: Some(
            c.ops
                .iter()
                .map(|op| OpResult {
                    op: op.kind().as_str().to_owned(),
                    shard: op.shard().to_owned(),
                    id: op.id(),
                })
                .collect(),
        ),
        op_index: None,
        reason: None,
        error: None,
    }
}

fn trigger_input(key: &str, i: usize, op: &BatchOp) -> Vec<u8> {
    let v = match op {
        BatchOp::Create { shard, record, .. } => {
            let record: serde_json::Value =
                serde_json::from_slice(record).unwrap_or(serde_json::Value::Null);
            serde_json::json!({"request_key": key, "op_index": i, "op": "create", "shard": shard, "record": record})
        }
        BatchOp::Delete { shard, id } => {
            serde_json::json!({"request_key": key, "op_index": i, "op": "delete", "shard": shard, "id": id})
        }
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

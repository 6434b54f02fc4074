//! The shard pool as one part of the engine: the shards opened since start (each behind its
//! owner, `owner.rs`), the set of shards that exist (`shard_limit.rs`), the threads the
//! owners run on, recovery's vouched lsns, the compaction horizon and gate, and the thread
//! that finishes a standby's flushes. It opens shards, sends each claim's transactions to
//! their owners and answers about them; it never plans, claims or answers a batch.
//!
//! Declaration order is drop order and matters here: the effects flusher first (a flush it
//! waits for is answered by a pool thread), then the owners, then the pool's threads.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use roost_shards::{CompactionStats, ShardOptions, TxnOp};
use roost_storage::{lock, NoRoom, OpenMode};
use roost_wal::{Lsn, Wal};

use super::backup_gate::BackupGate;
use super::effects_flush::EffectsFlusher;
use super::env::Env;
use super::owner::{
    OwnerContext, PoolHandle, ShardFigures, ShardOpener, ShardPool, ShardSlot, Turn,
};
use super::records::{ClaimRecord, PlannedOp};
use super::shard_limit::{self, KnownShards};
use crate::batch::Batch;
use crate::error::EngineError;

/// One touched shard of a batch: its owner and the ids its transaction creates (true) or
/// deletes (false), for the planning overlay.
pub(super) struct Touched<'a> {
    pub name: &'a str,
    pub slot: Arc<ShardSlot>,
    pub ids: Vec<(u64, bool)>,
}

/// Claims' transactions sent to their shards' owners and not yet waited for
/// ([`ShardSet::send_commits`]): each claim's touched shards, the answers to wait for, and a
/// failure to send.
pub(super) struct SentCommits<'c> {
    touched: Vec<Vec<Touched<'c>>>,
    sent: Vec<Sent>,
    first_err: Option<EngineError>,
}

/// A message sent to a shard owner, and where its answer comes.
type Sent = (Arc<ShardSlot>, mpsc::Receiver<Result<(), EngineError>>);

impl<'c> SentCommits<'c> {
    /// Every shard's answer collected (all of them, even after a failure, so no owner is
    /// still writing when this returns); every claim's touched shards, or the first failure.
    pub(super) fn wait(
        self,
        failed: &dyn Fn() -> bool,
    ) -> Result<Vec<Vec<Touched<'c>>>, EngineError> {
        let mut first_err = self.first_err;
        for (slot, rx) in self.sent {
            if let Err(e) = slot.wait(&rx, failed) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(self.touched),
        }
    }

    /// Every claim's touched shards.
    pub(super) fn touched(&self) -> impl Iterator<Item = &[Touched<'c>]> {
        self.touched.iter().map(Vec::as_slice)
    }
}

/// The shard pool: the engine's part that owns the shards' owners and the threads they run
/// on. Outside the engine only its figures are read.
pub struct ShardSet {
    /// The thread that finishes a standby's flushes behind its fetches (`apply.rs`).
    /// Declared (so dropped) before `slots` and `_pool`: a flush it waits for is answered
    /// by a pool thread, and a pool stopped first would leave it waiting for ever (a hang
    /// at drop seen in `reseed_crash`).
    flusher: EffectsFlusher,
    slots: Mutex<HashMap<String, Arc<ShardSlot>>>,
    /// The shards that exist, for `shards_max` (`shard_limit.rs`); taken after `slots`
    /// when both are held, never before.
    known: Mutex<KnownShards>,
    /// The threads shard owners run on (`shard_threads`); declared after `slots`, so the
    /// owners are closed before the threads stop.
    _pool: PoolHandle,
    /// Per shard, the largest claim lsn with a `done` record, as recovery found it (the
    /// checkpoint's figure, then the `done` records replayed after it): every frame up to it
    /// was flushed before that record was written, and anything later is rebuilt from its
    /// claim. Lets a shard opened later drop a gap among never-flushed frames after a power
    /// loss rather than call it corruption. (The planner's `vouched` is the live figure; a
    /// shard is opened under the planner lock, so it reads this copy.)
    synced_through: HashMap<String, Lsn>,
    /// How every shard is opened: the storage, `shards/`, and the options but the vouched
    /// lsn (`synced_through`, set per shard).
    opener: ShardOpener,
    /// One past the largest id any shard opened since start holds, folded in at each open:
    /// the planner never mints below it for a shard it has opened (`Planner::claim`), so a
    /// restart need not open a shard to learn its largest id (issue 44: lazy open).
    id_floor: AtomicU64,
    /// What every owner runs with: the pool's threads, the crash hook, the progress clock,
    /// compaction's settings, its horizon (frames at or below the last checkpoint, whose
    /// batches are finished and never applied again) and its gate (`backup_gate.rs`).
    owners: OwnerContext,
}

impl ShardSet {
    /// Starts the standby's effects flusher, then the pool's `shard_threads` threads.
    pub(super) fn start(env: &Env, audit: &Arc<Wal>) -> std::io::Result<ShardSet> {
        let flusher = EffectsFlusher::start(audit.clone(), env.failed.clone());
        let pool = ShardPool::start(env.config.shard_threads, env.clock.clone())?;
        let c = &env.config;
        let idle_close_ms = c.shard_idle_close_ms;
        let owners = OwnerContext {
            pool: pool.clone(),
            crash: env.crash.clone(),
            stats: env.stats.clone(),
            clock: env.clock.clone(),
            opened: env.opened,
            horizon: Arc::new(AtomicU64::new(0)),
            gate: Arc::default(),
            compact_rate: c.shard_compact_bytes_per_sec,
            compact_dead: c.shard_compact_dead_fraction,
            idle_close: (idle_close_ms > 0).then(|| Duration::from_millis(idle_close_ms)),
        };
        let opener = ShardOpener {
            storage: env.storage.clone(),
            dir: env.layout.shards(),
            opts: shard_options(c),
        };
        Ok(ShardSet {
            flusher,
            slots: Mutex::new(HashMap::new()),
            known: Mutex::default(),
            _pool: PoolHandle(pool),
            synced_through: HashMap::new(),
            opener,
            id_floor: AtomicU64::new(1),
            owners,
        })
    }

    /// The owner of shard `name`, opening the shard (and starting its owner) on first use.
    /// The owner keeps the `ShardOpener` to reopen the shard after an idle close, the same
    /// way, vouched through the lsn it closed at.
    pub(super) fn slot(&self, name: &str) -> Result<Arc<ShardSlot>, EngineError> {
        let mut shards = lock(&self.slots);
        if let Some(s) = shards.get(name) {
            return Ok(s.clone());
        }
        let base = &self.opener;
        let opener = ShardOpener {
            storage: base.storage.clone(),
            dir: base.dir.join(name),
            opts: ShardOptions {
                synced_through_lsn: Some(self.synced_through.get(name).copied().unwrap_or(0)),
                ..base.opts.clone()
            },
        };
        let shard = opener.open(name)?;
        let floor = shard.max_id().saturating_add(1);
        self.id_floor.fetch_max(floor, Ordering::Relaxed);
        let slot = Arc::new(ShardSlot::spawn(name, shard, opener, self.owners.clone()));
        shards.insert(name.to_owned(), slot.clone());
        lock(&self.known).note(name);
        Ok(slot)
    }

    /// Every claim's transactions sent, one message per touched shard for the whole group
    /// (its transactions in lsn order; each owner applies in lsn order), not waited for: a
    /// standby syncs its WAL while its owners apply (`apply.rs`).
    pub(super) fn send_commits<'c>(
        &self,
        claims: &[(Lsn, &'c ClaimRecord)],
    ) -> Result<SentCommits<'c>, EngineError> {
        let mut touched: Vec<Vec<Touched<'c>>> = Vec::with_capacity(claims.len());
        let mut by_shard: BTreeMap<&str, (Arc<ShardSlot>, Vec<Turn>)> = BTreeMap::new();
        for (lsn, c) in claims {
            let mut mine = Vec::new();
            for (k, (name, ops)) in transactions(c).into_iter().enumerate() {
                let slot = match by_shard.get(name) {
                    Some((slot, _)) => slot.clone(),
                    None => self.slot(name)?,
                };
                let ids = touched_ids(&ops);
                let turn = Turn { lsn: *lsn, k, ops };
                by_shard
                    .entry(name)
                    .or_insert_with(|| (slot.clone(), Vec::new()))
                    .1
                    .push(turn);
                mine.push(Touched { name, slot, ids });
            }
            touched.push(mine);
        }
        let mut sent = SentCommits {
            touched,
            sent: Vec::with_capacity(by_shard.len()),
            first_err: None,
        };
        for (slot, turns) in by_shard.into_values() {
            match slot.send_apply(turns) {
                Ok(rx) => sent.sent.push((slot, rx)),
                Err(e) => {
                    sent.first_err = Some(e);
                    break;
                }
            }
        }
        Ok(sent)
    }

    /// The owner of shard `name` if it was opened since start.
    pub(super) fn opened(&self, name: &str) -> Option<Arc<ShardSlot>> {
        lock(&self.slots).get(name).cloned()
    }

    /// The names of the shards opened since start.
    pub(super) fn names(&self) -> Vec<String> {
        lock(&self.slots).keys().cloned().collect()
    }

    /// Every shard opened since start, with its owner.
    pub(super) fn slots(&self) -> Vec<(String, Arc<ShardSlot>)> {
        lock(&self.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Each shard opened since start: its records, largest id, and whether it is open now
    /// (a shard closed while idle answers with the record count it closed with).
    pub fn figures(&self) -> BTreeMap<String, ShardFigures> {
        self.slots()
            .into_iter()
            .filter_map(|(k, s)| s.stats().ok().map(|f| (k, f)))
            .collect()
    }

    /// Compaction figures per open shard.
    pub fn compaction(&self) -> BTreeMap<String, CompactionStats> {
        self.slots()
            .into_iter()
            .filter_map(|(k, s)| s.compaction().ok().map(|c| (k, c)))
            .collect()
    }

    /// Whether `id` exists on `shard` in committed state. A shard never written has no
    /// segments yet: nothing exists on it, and a rejected delete must not create it.
    pub(super) fn holds(&self, shard: &str, id: u64) -> Result<bool, EngineError> {
        let slot = match self.opened(shard) {
            Some(s) => s,
            None if self.has_segments(shard) => self.slot(shard)?,
            None => return Ok(false),
        };
        slot.contains(id)
    }

    /// One past the largest id of every shard opened since start (1 before any).
    pub(super) fn id_floor(&self) -> u64 {
        self.id_floor.load(Ordering::Relaxed)
    }

    /// The first shard (by name) with no spare segment, and why.
    pub(super) fn shortage(&self) -> Option<(String, NoRoom)> {
        let slots = lock(&self.slots);
        let mut names: Vec<&String> = slots.keys().collect();
        names.sort();
        names.into_iter().find_map(|name| {
            let why = lock(&slots[name].room).clone()?;
            Some((format!("shard {name}"), why))
        })
    }

    /// Makes the spare segment again of every shard that had none.
    pub(super) fn refill(&self) -> Result<(), EngineError> {
        let slots: Vec<_> = lock(&self.slots).values().cloned().collect();
        for slot in slots {
            if lock(&slot.room).is_some() {
                slot.refill()?;
            }
        }
        Ok(())
    }

    /// Bytes on disk of every shard that exists, opened since start or not (segments and
    /// spares, as preallocated or trimmed; a compacted shard segment is as long as its
    /// content). Before recovery has counted the shards, those opened since start.
    pub(super) fn disk_bytes(&self) -> u64 {
        let storage = self.opener.storage.as_ref();
        let file_len = |p: &std::path::Path| {
            storage
                .open(p, OpenMode::Read)
                .and_then(|f| f.len())
                .unwrap_or(0)
        };
        let mut names = lock(&self.known).names();
        if names.is_empty() {
            names = self.names();
        }
        names
            .iter()
            .map(|name| {
                let dir = self.opener.dir.join(name);
                let files = storage.list(&dir).unwrap_or_default();
                files
                    .iter()
                    .filter(|n| {
                        n.ends_with(roost_shards::SEGMENT_SUFFIX) || *n == roost_storage::SPARE_FILE
                    })
                    .map(|n| file_len(&dir.join(n)))
                    .sum::<u64>()
            })
            .sum()
    }

    /// Whether shard `shard` has segments on disk (a shard never written has none).
    pub(super) fn has_segments(&self, shard: &str) -> bool {
        match self.opener.storage.list(&self.opener.dir.join(shard)) {
            Ok(names) => names
                .iter()
                .any(|n| n.ends_with(roost_shards::SEGMENT_SUFFIX)),
            Err(_) => false,
        }
    }

    /// Recovery's vouched lsns per shard (see `synced_through`).
    pub(super) fn set_synced_through(&mut self, vouched: HashMap<String, Lsn>) {
        self.synced_through = vouched;
    }

    /// Starts the count of shards for `shards_max` once recovery has opened what it needed:
    /// the directories on disk, the shards recovery knows of, and the shards open now.
    pub(super) fn fill_known(&self) {
        let mut names = self.names();
        names.extend(self.synced_through.keys().cloned());
        names.extend(shard_limit::listed_shard_dirs(
            self.opener.storage.as_ref(),
            &self.opener.dir,
        ));
        lock(&self.known).fill(names);
    }

    /// How many shards exist (0 before recovery filled the set).
    pub(super) fn known_count(&self) -> usize {
        lock(&self.known).count()
    }

    /// [`KnownShards::first_over`] under its lock.
    pub(super) fn first_over(
        &self,
        batch: &Batch,
        limit: usize,
        shards_max: usize,
    ) -> Option<(usize, String)> {
        lock(&self.known).first_over(batch, limit, shards_max)
    }

    /// The lsn at or below which owners may compact.
    pub(super) fn horizon(&self) -> &AtomicU64 {
        &self.owners.horizon
    }

    /// Base backups and compaction steps running.
    pub(super) fn gate(&self) -> &Arc<BackupGate> {
        &self.owners.gate
    }

    /// The thread that finishes a standby's flushes.
    pub(super) fn flusher(&self) -> &EffectsFlusher {
        &self.flusher
    }
}

/// The claim's ops as one transaction per shard, in shard-name order (the order that names
/// the crash points `after_commit.K`).
fn transactions(claim: &ClaimRecord) -> BTreeMap<&str, Vec<TxnOp>> {
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
    by_shard
}

/// The ids a shard transaction creates (true) or deletes (false).
fn touched_ids(ops: &[TxnOp]) -> Vec<(u64, bool)> {
    ops.iter()
        .map(|op| match op {
            TxnOp::Create { id, .. } => (*id, true),
            TxnOp::Delete { id } => (*id, false),
        })
        .collect()
}

/// The options every writable shard is opened with (the engine's, a cut's), as the
/// configuration implies; nothing vouched for yet.
pub fn shard_options(config: &crate::config::Config) -> roost_shards::ShardOptions {
    roost_shards::ShardOptions {
        segment_bytes: config.shard_segment_bytes,
        read_only: false,
        zero_ahead_bytes: config.zero_ahead_bytes,
        index_entries_max: config.shard_index_entries_max,
        ..roost_shards::ShardOptions::default()
    }
}

#[cfg(test)]
mod options_tests {
    /// Goal (issue 44): `shard_index_entries_max` reaches every shard the daemon opens.
    #[test]
    fn the_index_entries_key_reaches_the_shards() {
        let config: crate::config::Config =
            toml::from_str("shard_index_entries_max = 500").expect("toml");
        assert_eq!(super::shard_options(&config).index_entries_max, 500);
    }
}

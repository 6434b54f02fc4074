//! What status and metrics read of the engine's parts, in one snapshot ([`Figures`]), so
//! that the engine does not grow an accessor per counter. Reads only, and cheap: no disk
//! access and nothing per shard (what costs more, `Engine::memory`, `Engine::disk_bytes`,
//! the figures per shard, is asked for on its own).

use std::sync::atomic::Ordering;

use roost_keyindex::IndexStats;

use super::records::Checkpoint;
use super::recover::RecoveryReport;
use super::Engine;

/// The engine's figures at one moment. Each is read on its own: together they are not one
/// atomic cut of the engine.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// Milliseconds since open.
    pub uptime_ms: u64,
    /// WAL records appended and WAL syncs (group commits) since open.
    pub wal_appends: u64,
    pub wal_syncs: u64,
    /// Audit rows appended and audit log syncs since open.
    pub audit_appends: u64,
    pub audit_syncs: u64,
    /// Result rounds and results published since start.
    pub result_rounds: u64,
    pub results_published: u64,
    /// Shards that exist, against `shards_max` (issue 25, item 3).
    pub shards_known: usize,
    /// Shards whose `Shard` is open now (maps, file descriptors and lock held); those that
    /// exist beyond it are closed (`shard_idle_close_ms`, or not used since start).
    pub shards_open: u64,
    /// Keys in the in-memory map (not yet checkpointed, or in flight).
    pub cached_keys: usize,
    /// The request-key index on disk.
    pub key_index: IndexStats,
    /// The last checkpoint, if any.
    pub last_checkpoint: Option<Checkpoint>,
    /// What recovery did at open.
    pub recovery: RecoveryReport,
}

impl Figures {
    /// Keys remembered now: those the WAL answers plus those the index holds (a run's keys
    /// count until the run expires whole).
    pub fn live_keys(&self) -> usize {
        self.cached_keys + self.key_index.entries as usize
    }
}

impl Engine {
    /// The engine's figures now (see [`Figures`]).
    pub fn figures(&self) -> Figures {
        let (wal, audit) = (self.log.wal(), self.log.audit());
        let (result_rounds, results_published) = self.answers.stats();
        Figures {
            uptime_ms: self.env.uptime_ms(),
            wal_appends: wal.append_count(),
            wal_syncs: wal.sync_count(),
            audit_appends: audit.append_count(),
            audit_syncs: audit.sync_count(),
            result_rounds,
            results_published,
            shards_known: self.shards.known_count(),
            shards_open: self.stats.shards_open.load(Ordering::Relaxed),
            cached_keys: self.claims.lock().keys.len(),
            key_index: self.keys.index_stats(),
            last_checkpoint: self.log.last_checkpoint(),
            recovery: self.recovery.clone(),
        }
    }
}

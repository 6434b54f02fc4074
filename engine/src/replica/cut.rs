//! A standby's start-up, with the engine closed (docs/replication.md, "Truncation"):
//! 1. Shard frames and audit rows past the WAL's end are cut: a standby writes a chunk's
//!    effects before its WAL records (`pipeline/apply.rs`), so a crash between the two
//!    leaves effects of records this node does not hold; they come back with the records.
//! 2. The protocol's reconcile phase fetches with this log's last epoch; while the primary
//!    answers "diverging", everything from the divergence point on is cut: the WAL (and
//!    `LEADER_EPOCHS`), every shard (`Shard::truncate_from`), the audit rows of those claims.
//!    The key table and the id counter need nothing: the key table only holds batches below
//!    the checkpoint, a cut below the checkpoint is refused (the node must be re-seeded), and
//!    the id counter (the checkpoint's, raised by the claims left and the shards' largest
//!    ids) may only overshoot: ids of cut claims are not reused, which is harmless.
//!
//! The audit log is cut at the first row of a claim at or past the point. Rows of earlier
//! claims written after that row belong to claims whose `done` came later still, so past the
//! point too: those claims are unfinished after the cut, and open re-writes their rows.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use roost_replication::{Entry, Epoch, EpochEnd, FollowerLog, Lsn};
use roost_shards::{Shard, ShardOptions};
use roost_storage::{DirLock, RealStorage, Storage};
use roost_wal::{LeaderEpochs, Wal};
use tracing::{info, warn};

use super::epoch_file::{read_epoch_file, write_epoch_file, EpochFile};
use crate::config::Config;
use crate::error::EngineError;
use crate::layout::Layout;
use crate::pipeline::records::{read_audit, read_wal, ClaimLedger, WalEntry};
use crate::pipeline::{lock_data_dir, read_checkpoint, wal_options, Checkpoint};

/// The data directory of a standby that is not open yet.
pub struct Cutter {
    storage: Arc<dyn Storage>,
    layout: Layout,
    config: Config,
    wal: Wal,
    epochs: Mutex<LeaderEpochs>,
    epoch: AtomicU32,
    /// The epoch this node last led, kept in `EPOCH` as it was.
    led: u32,
    checkpoint: Checkpoint,
    /// Records cut so far (for the log).
    pub cut: std::sync::atomic::AtomicU64,
    _lock: Option<DirLock>,
}

impl Cutter {
    /// Locks and opens the data directory's WAL (nothing else is open).
    pub fn open(config: &Config) -> Result<Cutter, EngineError> {
        Cutter::open_with(RealStorage::shared(), config)
    }

    /// [`Cutter::open`] through any storage (the crash tests' simulated disk).
    pub fn open_with(storage: Arc<dyn Storage>, config: &Config) -> Result<Cutter, EngineError> {
        let layout = Layout::new(&config.data_dir);
        storage
            .create_dir_all(layout.data_dir())
            .map_err(|source| EngineError::Io {
                op: "create",
                path: layout.data_dir().to_path_buf(),
                source,
            })?;
        let lock = lock_data_dir(storage.as_ref(), &layout)?;
        let wal = Wal::open_with(storage.clone(), layout.wal(), wal_options(config))?;
        let epochs = LeaderEpochs::open(storage.clone(), layout.leader_epochs(), &wal)?;
        let file = read_epoch_file(storage.as_ref(), &layout.epoch())?;
        let epoch = file.known.max(wal.last_record_epoch());
        let checkpoint = read_checkpoint(storage.as_ref(), &layout)?;
        Ok(Cutter {
            storage,
            layout,
            config: config.clone(),
            wal,
            epochs: Mutex::new(epochs),
            epoch: AtomicU32::new(epoch),
            led: file.led,
            checkpoint,
            cut: Default::default(),
            _lock: lock,
        })
    }

    /// Whether this node led the highest epoch it knows: then it was no standby since, and
    /// holds no effects past its WAL's end (a standby's start cuts them, and a promotion
    /// happens after that start).
    pub fn led_last_epoch(&self) -> bool {
        self.led > 0 && self.led == self.current_epoch()
    }

    /// Step 1: effects past the WAL's end go.
    pub fn cut_past_end(&self) -> Result<(), EngineError> {
        self.cut_effects(self.wal.next_lsn())
    }

    /// Every shard frame and audit row of a claim at or past `lsn`.
    fn cut_effects(&self, lsn: Lsn) -> Result<(), EngineError> {
        for (dir, vouched) in self.shard_dirs()? {
            // What `done` records vouch for is opened as the engine opens it: damage there
            // is corruption (exit 65), never a torn tail to cut.
            let opts = ShardOptions {
                synced_through_lsn: Some(vouched),
                ..crate::pipeline::shard_options(&self.config)
            };
            let name = dir.display().to_string();
            let shard_err = |source| EngineError::Shard {
                shard: name.clone(),
                source,
            };
            let mut shard =
                Shard::open_with(self.storage.clone(), &dir, opts).map_err(shard_err)?;
            let n = shard.truncate_from(lsn).map_err(shard_err)?;
            if n > 0 {
                info!(shard = %dir.display(), from_lsn = lsn, frames = n, "standby: shard frames cut");
            }
        }
        self.cut_audit(lsn)
    }

    /// Every shard directory with the lsn `done` records vouch it flushed through: those
    /// the checkpoint and the WAL name, and every directory under `shards/`
    /// (a shard whose first frames are past the WAL's end is named by no record here).
    fn shard_dirs(&self) -> Result<Vec<(PathBuf, Lsn)>, EngineError> {
        let mut ledger = ClaimLedger {
            from: self.checkpoint.wal_from,
            vouched: self.checkpoint.shards.iter().cloned().collect(),
            ..ClaimLedger::default()
        };
        let mut names: BTreeSet<String> = ledger.vouched.keys().cloned().collect();
        let from = self.checkpoint.wal_from.max(self.wal.first_lsn());
        for entry in read_wal(&self.wal, from) {
            match entry? {
                (lsn, WalEntry::Claim(c)) => {
                    names.extend(c.ops.iter().map(|op| op.shard().to_owned()));
                    ledger.claim(lsn, c);
                }
                (lsn, WalEntry::Done(d)) => {
                    ledger.done_after(lsn, &d)?;
                }
                (_, WalEntry::Rejected(_)) => {}
            }
        }
        names.extend(self.listed_shards()?);
        Ok(names
            .into_iter()
            .map(|n| {
                let v = ledger.vouched.get(&n).copied().unwrap_or(0);
                (self.layout.shard(&n), v)
            })
            .collect())
    }

    /// The directories under `shards/`.
    fn listed_shards(&self) -> Result<Vec<String>, EngineError> {
        let root = self.layout.shards();
        self.storage
            .list_dirs(&root)
            .map_err(|source| EngineError::Io {
                op: "list",
                path: root,
                source,
            })
    }

    /// The audit log from its first row of a claim at or past `lsn` on.
    fn cut_audit(&self, lsn: Lsn) -> Result<(), EngineError> {
        let audit = Wal::open_with(
            self.storage.clone(),
            self.layout.audit(),
            wal_options(&self.config),
        )?;
        let mut first = None;
        for row in read_audit(&audit, self.checkpoint.audit_from.max(audit.first_lsn())) {
            let (at, row) = row?;
            if row.claim_lsn >= lsn {
                first = Some(at);
                break;
            }
        }
        if let Some(at) = first {
            let n = audit.truncate_from(at)?;
            info!(
                from_claim_lsn = lsn,
                audit_lsn = at,
                rows = n,
                "standby: audit rows cut"
            );
        }
        Ok(())
    }
}

impl FollowerLog for Cutter {
    type Error = EngineError;

    fn current_epoch(&self) -> Epoch {
        self.epoch.load(Ordering::SeqCst)
    }

    fn set_current_epoch(&self, epoch: Epoch) -> Result<(), EngineError> {
        if epoch > self.current_epoch() {
            let file = EpochFile {
                known: epoch,
                led: self.led,
            };
            write_epoch_file(self.storage.as_ref(), &self.layout.epoch(), file)?;
            self.epoch.fetch_max(epoch, Ordering::SeqCst);
        }
        Ok(())
    }

    fn log_end(&self) -> Lsn {
        self.wal.next_lsn()
    }

    fn last_epoch(&self) -> Epoch {
        let epochs = roost_storage::lock(&self.epochs);
        super::epoch_file::last_epoch_of(&self.wal, &epochs)
    }

    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        let epochs = roost_storage::lock(&self.epochs);
        epochs.end_offset_for(epoch, self.wal.next_lsn())
    }

    /// The logs agree: the records are fetched again once the engine is open.
    fn append(&self, _entries: &[Entry], _leader_hw: Lsn) -> Result<(), EngineError> {
        Ok(())
    }

    fn truncate_to(&self, lsn: Lsn) -> Result<(), EngineError> {
        if lsn >= self.wal.next_lsn() {
            return Ok(());
        }
        if lsn < self.checkpoint.wal_from {
            let detail = format!(
                "the primary's log diverges at lsn {lsn}, below this node's checkpoint (lsn {})",
                self.checkpoint.wal_from
            );
            return Err(super::reseed(detail));
        }
        warn!(
            from_lsn = lsn,
            wal_end = self.wal.next_lsn(),
            "standby: cutting records the primary does not have"
        );
        let n = self.wal.truncate_from(lsn)?;
        roost_storage::lock(&self.epochs).truncate_from_end(lsn)?;
        self.cut.fetch_add(n, Ordering::Relaxed);
        self.cut_effects(lsn)
    }
}

//! The engine's side of a base backup for a standby too far behind to fetch (issue 15,
//! docs/replication.md, "Re-seeding a standby"): the last checkpoint held still, and what
//! of the engine's logs it covers, while the primary keeps taking batches. The files are
//! listed and sent by `replica/base_backup.rs`. A copy is consistent because, while one
//! runs ([`BackupHold`]):
//!
//! - no checkpoint runs: `CHECKPOINT`, the key table and the retained WAL stay as they are
//!   (the key table is appended only by a checkpoint; nothing is retired);
//! - no shard compacts: no segment is replaced or removed (a compaction step that was
//!   running is waited for; one half done is left as a crash would leave it, and open
//!   finishes or undoes it);
//! - the WAL-format logs (audit, keys) are copied up to their extent when the copy began
//!   (`Wal::extent`: complete records only), and shard segments whole: a shard frame is
//!   written in place and may be caught half written, but every frame up to what the
//!   checkpoint vouches for was flushed before it, and anything after is cut at the
//!   standby's start (`replica/cut.rs`: effects past its WAL's end) and fetched again.
//!
//! After the copy, the standby's log starts at the checkpoint's `wal_from`: that lsn stays
//! pinned here (no checkpoint retires it) until the standby fetches past it, or
//! [`PIN_TTL`](super::backup_gate::PIN_TTL) passes.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use roost_wal::Lsn;

use super::backup_gate::{BackupGate, Pins};
use super::keys::KeyWindow;
use super::log_role::Role;
use super::logs::Logs;
use super::{Checkpoint, Engine};
use crate::error::EngineError;
use crate::layout::Layout;

/// How long a backup waits for a running compaction step.
const COMPACTION_WAIT: Duration = Duration::from_secs(10);

/// What a base backup copies, as the engine holds it still: the checkpoint, the leader
/// epochs of the records below it, the key table's and the audit log's segments up to their
/// extents when the copy began (`None`: whole), and where the data directory and the shards
/// are.
#[derive(Debug)]
pub struct BackupSource {
    pub checkpoint: Checkpoint,
    pub epochs: Vec<(u32, Lsn)>,
    pub logs: Vec<(PathBuf, Option<u64>)>,
    pub data_dir: PathBuf,
    pub shards_dir: PathBuf,
}

/// A base backup in progress: holds checkpoints and compaction still until dropped. Its
/// pin's time starts again then (a copy may take longer than the pin lasts).
pub struct BackupHold {
    gate: Arc<BackupGate>,
    pins: Arc<Pins>,
    replica: String,
    pub checkpoint: Checkpoint,
}

impl BackupSource {
    /// What the copy of checkpoint `c` covers: the epochs below it, the key table and the
    /// audit log up to their extents.
    fn of(
        c: Checkpoint,
        epochs: Vec<(u32, Lsn)>,
        keys: &KeyWindow,
        log: &Logs,
        layout: &Layout,
    ) -> BackupSource {
        let mut logs = keys.extent();
        logs.extend(log.audit().extent());
        BackupSource {
            checkpoint: c,
            epochs,
            logs,
            data_dir: layout.data_dir().to_path_buf(),
            shards_dir: layout.shards(),
        }
    }
}

impl Drop for BackupHold {
    fn drop(&mut self) {
        self.pins.touch(&self.replica);
        self.gate.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Engine {
    /// Starts a base backup for standby `replica`: a fresh checkpoint, then the hold, then
    /// `list` makes the list of files from what is held (see the module comment); the
    /// checkpoint's lsn is pinned once that list is made.
    pub fn begin_backup<T>(
        &self,
        replica: &str,
        list: impl FnOnce(&BackupSource) -> Result<T, EngineError>,
    ) -> Result<(BackupHold, T), EngineError> {
        if self.role() != Role::Primary {
            return Err(EngineError::NotPrimary {
                role: self.role().name(),
            });
        }
        self.checkpoint()?;
        // One at a time: a copy holds checkpoints, and a second standby retries.
        if self.shards.gate().running.fetch_add(1, Ordering::SeqCst) > 0 {
            self.shards.gate().running.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::Replication(format!(
                "a base backup is already being sent; {replica} retries"
            )));
        }
        let mut hold = BackupHold {
            gate: self.shards.gate().clone(),
            pins: self.log.pins().clone(),
            replica: replica.to_owned(),
            checkpoint: Checkpoint::default(),
        };
        // A checkpoint already running finishes first; later ones see the hold.
        drop(self.log.one_checkpoint());
        (self.shards.gate()).wait_compaction(&self.env.clock, COMPACTION_WAIT)?;
        let Some(c) = self.log.state().last.clone() else {
            return Err(EngineError::Replication(format!(
                "no checkpoint to copy yet for {replica}: this primary holds its whole WAL"
            )));
        };
        let epochs = self.log_role.epochs_below(c.wal_from);
        let source = BackupSource::of(c.clone(), epochs, &self.keys, &self.log, &self.env.layout);
        let listed = list(&source)?;
        self.log.pins().pin(replica, c.wal_from);
        hold.checkpoint = c;
        Ok((hold, listed))
    }
}

//! Base backups for a standby too far behind to fetch (issue 15, docs/replication.md,
//! "Re-seeding a standby"): the files of the last checkpoint, copied while the primary keeps
//! taking batches. A copy is consistent because, while one runs ([`BackupHold`]):
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
use std::time::{Duration, Instant};

use roost_wal::Lsn;
use tracing::info;

use super::backup_gate::{BackupGate, Pins};
use super::log_role::Role;
use super::{io_err, lock, Checkpoint, Engine};
use crate::error::EngineError;
use crate::layout::{CHECKPOINT_FILE, LEADER_EPOCHS_FILE};

/// How long a backup waits for a running compaction step.
const COMPACTION_WAIT: Duration = Duration::from_secs(10);

/// One file of a backup: its path relative to the data directory, where to read it (or its
/// bytes), its size on disk and how many leading bytes to send.
#[derive(Debug)]
pub struct BackupFile {
    pub rel: String,
    pub source: BackupBytes,
    pub size: u64,
    pub len: u64,
}

#[derive(Debug)]
pub enum BackupBytes {
    Path(PathBuf),
    Bytes(Vec<u8>),
}

/// A base backup in progress: holds checkpoints and compaction still until dropped. Its
/// pin's time starts again then (a copy may take longer than the pin lasts).
pub struct BackupHold {
    gate: Arc<BackupGate>,
    pins: Arc<Pins>,
    replica: String,
    pub checkpoint: Checkpoint,
    pub files: Vec<BackupFile>,
}

impl Drop for BackupHold {
    fn drop(&mut self) {
        self.pins.touch(&self.replica);
        self.gate.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Engine {
    /// Starts a base backup for standby `replica`: a fresh checkpoint, then the hold, then
    /// the list of files (see the module comment).
    pub fn begin_backup(&self, replica: &str) -> Result<BackupHold, EngineError> {
        if self.role() != Role::Primary {
            return Err(EngineError::NotPrimary {
                role: self.role().name(),
            });
        }
        self.checkpoint()?;
        // One at a time: a copy holds checkpoints, and a second standby retries.
        if self.backup_gate.running.fetch_add(1, Ordering::SeqCst) > 0 {
            self.backup_gate.running.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::Replication(format!(
                "a base backup is already being sent; {replica} retries"
            )));
        }
        let mut hold = BackupHold {
            gate: self.backup_gate.clone(),
            pins: self.backup_pins.clone(),
            replica: replica.to_owned(),
            checkpoint: Checkpoint::default(),
            files: Vec::new(),
        };
        // A checkpoint already running finishes first; later ones see the hold.
        drop(lock(&self.checkpoint_running));
        self.wait_compaction()?;
        let Some(c) = lock(&self.checkpoints).last.clone() else {
            return Err(EngineError::Replication(format!(
                "no checkpoint to copy yet for {replica}: this primary holds its whole WAL"
            )));
        };
        let files = self.backup_files(&c)?;
        self.backup_pins.pin(replica, c.wal_from);
        let bytes: u64 = files.iter().map(|f| f.len).sum();
        info!(
            replica,
            wal_from = c.wal_from,
            files = files.len(),
            bytes,
            "base backup: started"
        );
        hold.checkpoint = c;
        hold.files = files;
        Ok(hold)
    }

    fn wait_compaction(&self) -> Result<(), EngineError> {
        let t0 = Instant::now();
        while self.backup_gate.compacting.load(Ordering::SeqCst) > 0 {
            if t0.elapsed() > COMPACTION_WAIT {
                return Err(EngineError::Replication(format!(
                    "a shard compaction step did not finish within {COMPACTION_WAIT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// `CHECKPOINT`, `LEADER_EPOCHS` (the epochs of the records below the checkpoint), the
    /// key table and the audit log up to their extents, every shard segment.
    fn backup_files(&self, c: &Checkpoint) -> Result<Vec<BackupFile>, EngineError> {
        let bytes = |rel: &str, b: Vec<u8>| BackupFile {
            rel: rel.to_owned(),
            size: b.len() as u64,
            len: b.len() as u64,
            source: BackupBytes::Bytes(b),
        };
        // What each shard has flushed, as far as the copy goes: frames at or past
        // `wal_from` are cut at the standby's start and applied again from the WAL, so the
        // copy must not vouch for them (a later power loss there would read as damage).
        let mut clamped = c.clone();
        for (_, v) in clamped.shards.iter_mut() {
            *v = (*v).min(c.wal_from.saturating_sub(1));
        }
        let checkpoint =
            super::records::encode_checkpoint(&clamped).map_err(EngineError::Encode)?;
        let epochs: Vec<(u32, Lsn)> = lock(&self.repl.epochs)
            .entries()
            .iter()
            .copied()
            .filter(|(_, start)| *start < c.wal_from)
            .collect();
        let mut files = vec![
            bytes(CHECKPOINT_FILE, checkpoint),
            bytes(LEADER_EPOCHS_FILE, roost_wal::epochs::encode(&epochs)),
        ];
        for log in [&self.keys, &self.audit] {
            for (path, len) in log.extent() {
                files.push(self.disk_file(path, len)?);
            }
        }
        for path in self.shard_segments()? {
            files.push(self.disk_file(path, None)?);
        }
        Ok(files)
    }

    /// A file on disk, its first `len` bytes (all of them when `None`).
    fn disk_file(&self, path: PathBuf, len: Option<u64>) -> Result<BackupFile, EngineError> {
        let size = std::fs::metadata(&path)
            .map_err(io_err("stat", &path))?
            .len();
        let rel = path
            .strip_prefix(self.layout.data_dir())
            .ok()
            .and_then(|p| p.to_str())
            .ok_or_else(|| {
                EngineError::Replication(format!(
                    "{} is outside the data directory",
                    path.display()
                ))
            })?
            .to_owned();
        Ok(BackupFile {
            rel,
            size,
            len: len.unwrap_or(size).min(size),
            source: BackupBytes::Path(path),
        })
    }

    /// Every shard's segment files (`shards/NAME/*.seg`).
    fn shard_segments(&self) -> Result<Vec<PathBuf>, EngineError> {
        let root = self.layout.shards();
        let mut out = Vec::new();
        let dirs = match std::fs::read_dir(&root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            r => r.map_err(io_err("list", &root))?,
        };
        for d in dirs {
            let d = d.map_err(io_err("list", &root))?.path();
            if !d.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&d).map_err(io_err("list", &d))? {
                let f = f.map_err(io_err("list", &d))?.path();
                let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name.ends_with(roost_shards::SEGMENT_SUFFIX) {
                    out.push(f);
                }
            }
        }
        out.sort();
        Ok(out)
    }
}

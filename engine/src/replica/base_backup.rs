//! The primary's side of a base backup: the files of what the engine holds still
//! ([`BackupSource`]: `pipeline/backup.rs` says why the copy is consistent) listed, then read
//! out file by file for the protocol (`roost_replication`'s `SnapshotSource`), through the
//! engine's storage seam (the crash schedules re-seed a standby from it on the simulated disk).

use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roost_replication::{Lsn, SnapshotFile, SnapshotSource};
use roost_storage::{OpenMode, Storage, StorageFile};
use tracing::info;

use crate::error::EngineError;
use crate::layout::{CHECKPOINT_FILE, LEADER_EPOCHS_FILE};
use crate::pipeline::backup::{BackupHold, BackupSource};
use crate::pipeline::Engine;

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

/// A base backup being sent.
pub struct EngineBackup {
    storage: Arc<dyn Storage>,
    hold: BackupHold,
    files: VecDeque<BackupFile>,
    current: Option<Current>,
}

/// The file being sent and the bytes of it still to send.
struct Current {
    rel: String,
    from: Reader,
    left: u64,
}

enum Reader {
    /// A file and the offset of its next bytes.
    File(Box<dyn StorageFile>, u64),
    Bytes(VecDeque<u8>),
}

impl EngineBackup {
    /// Starts a base backup of `engine` for standby `replica`: the engine holds its last
    /// checkpoint still, and the files are listed from it.
    pub fn begin(engine: &Engine, replica: &str) -> Result<EngineBackup, EngineError> {
        let storage = engine.storage().clone();
        let (hold, files) = engine.begin_backup(replica, |src| list(storage.as_ref(), src))?;
        let bytes: u64 = files.iter().map(|f| f.len).sum();
        info!(
            replica,
            wal_from = hold.checkpoint.wal_from,
            files = files.len(),
            bytes,
            "base backup: started"
        );
        Ok(EngineBackup {
            storage,
            hold,
            files: files.into(),
            current: None,
        })
    }
}

/// `CHECKPOINT`, `LEADER_EPOCHS` (the epochs of the records below the checkpoint), the key
/// table and the audit log up to their extents, every shard segment.
fn list(disk: &dyn Storage, src: &BackupSource) -> Result<Vec<BackupFile>, EngineError> {
    let bytes = |rel: &str, b: Vec<u8>| BackupFile {
        rel: rel.to_owned(),
        size: b.len() as u64,
        len: b.len() as u64,
        source: BackupBytes::Bytes(b),
    };
    // What each shard has flushed, as far as the copy goes: frames at or past `wal_from`
    // are cut at the standby's start and applied again from the WAL, so the copy must not
    // vouch for them (a later power loss there would read as damage).
    let c = &src.checkpoint;
    let mut clamped = c.clone();
    for (_, v) in clamped.shards.iter_mut() {
        *v = (*v).min(c.wal_from.saturating_sub(1));
    }
    let checkpoint =
        crate::pipeline::records::encode_checkpoint(&clamped).map_err(EngineError::Encode)?;
    let mut files = vec![
        bytes(CHECKPOINT_FILE, checkpoint),
        bytes(LEADER_EPOCHS_FILE, roost_wal::epochs::encode(&src.epochs)),
    ];
    for (path, len) in &src.logs {
        files.push(disk_file(disk, &src.data_dir, path.clone(), *len)?);
    }
    for path in shard_segments(disk, &src.shards_dir)? {
        files.push(disk_file(disk, &src.data_dir, path, None)?);
    }
    Ok(files)
}

/// A file on disk, its first `len` bytes (all of them when `None`).
fn disk_file(
    disk: &dyn Storage,
    data_dir: &Path,
    path: PathBuf,
    len: Option<u64>,
) -> Result<BackupFile, EngineError> {
    let size = disk
        .open(&path, OpenMode::Read)
        .and_then(|f| f.len())
        .map_err(io_err("stat", &path))?;
    let rel = path
        .strip_prefix(data_dir)
        .ok()
        .and_then(|p| p.to_str())
        .ok_or_else(|| {
            EngineError::Replication(format!("{} is outside the data directory", path.display()))
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
fn shard_segments(disk: &dyn Storage, root: &Path) -> Result<Vec<PathBuf>, EngineError> {
    let mut out = Vec::new();
    for name in disk.list_dirs(root).map_err(io_err("list", root))? {
        let d = root.join(name);
        for f in disk.list(&d).map_err(io_err("list", &d))? {
            if f.ends_with(roost_shards::SEGMENT_SUFFIX) {
                out.push(d.join(f));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `EngineError::Io` for `op` on `path`, as a `map_err` closure.
fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.to_path_buf();
    move |source| EngineError::Io { op, path, source }
}

impl SnapshotSource for EngineBackup {
    fn wal_from(&self) -> Lsn {
        self.hold.checkpoint.wal_from
    }

    fn next_file(&mut self) -> Result<Option<SnapshotFile>, String> {
        let Some(f) = self.files.pop_front() else {
            self.current = None;
            return Ok(None);
        };
        let from = match f.source {
            BackupBytes::Bytes(b) => Reader::Bytes(b.into()),
            BackupBytes::Path(p) => {
                let file = self.storage.open(&p, OpenMode::Read);
                Reader::File(file.map_err(|e| format!("open {}: {e}", p.display()))?, 0)
            }
        };
        self.current = Some(Current {
            rel: f.rel.clone(),
            from,
            left: f.len,
        });
        Ok(Some(SnapshotFile {
            path: f.rel,
            size: f.size,
            len: f.len,
        }))
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        let Some(c) = self.current.as_mut() else {
            return Err("read before next_file".into());
        };
        let want = buf.len().min(c.left as usize);
        if want == 0 {
            return Ok(0);
        }
        let n = match &mut c.from {
            Reader::Bytes(b) => b.read(&mut buf[..want]),
            Reader::File(f, at) => f.read_at(&mut buf[..want], *at).map(|()| {
                *at += want as u64;
                want
            }),
        }
        .map_err(|e| format!("read {}: {e}", c.rel))?;
        if n == 0 {
            return Err(format!("{}: ended {} bytes early", c.rel, c.left));
        }
        c.left -= n as u64;
        Ok(n)
    }
}

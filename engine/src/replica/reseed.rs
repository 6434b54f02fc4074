//! A standby's re-seed from its primary's base backup (`[replication] reseed = "auto"`,
//! docs/replication.md, "Re-seeding a standby"), at start-up with the engine closed and the
//! data directory locked:
//!
//! 1. The backup is written under `<data-dir>/reseed.tmp/` (any earlier, unfinished one is
//!    removed first), every file synced, then every directory; the WAL is created empty
//!    there, starting at the checkpoint's lsn (`Wal::create_at`).
//! 2. `reseed.tmp/COMPLETE` is written and synced with its directory: from here on the
//!    backup is the node's state.
//! 3. For each part (`wal`, `audit`, `shards`, `keys`, `CHECKPOINT`, `LEADER_EPOCHS`) still in
//!    `reseed.tmp/`: the old one is removed and the new one renamed into place. Then both
//!    directories are synced, `COMPLETE` removed, `reseed.tmp/` removed. The key index
//!    (`keyindex/`) is removed first: the next open rebuilds it from the new key table.
//!
//! A crash before step 2 leaves the old state and a `reseed.tmp/` without `COMPLETE`, which
//! the next start removes ([`resume`]); a crash after it leaves `COMPLETE`, and the next
//! start finishes step 3 before anything opens. `EPOCH`, `LOCK`, the spool and the control
//! socket are this node's own and are never touched.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use roost_replication::{
    fetch_snapshot, SnapshotDone, SnapshotFile, SnapshotOptions, SnapshotSink,
};
use roost_storage::{OpenMode, RealStorage, Storage, StorageFile};
use roost_wal::{Lsn, Wal};
use tracing::{info, warn};

use crate::config::Config;
use crate::error::EngineError;
use crate::layout::{
    Layout, AUDIT_DIR, CHECKPOINT_FILE, KEYS_DIR, LEADER_EPOCHS_FILE, SHARDS_DIR, WAL_DIR,
};
use crate::pipeline::{lock_data_dir, wal_options};

/// Where a backup is written before it is installed.
pub const RESEED_DIR: &str = "reseed.tmp";
/// Written once the backup in `RESEED_DIR` is whole and durable.
const COMPLETE_FILE: &str = "COMPLETE";
/// What a backup replaces, in the order it is installed.
const PARTS: [&str; 6] = [
    WAL_DIR,
    AUDIT_DIR,
    SHARDS_DIR,
    KEYS_DIR,
    CHECKPOINT_FILE,
    LEADER_EPOCHS_FILE,
];

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.to_path_buf();
    move |source| EngineError::Io { op, path, source }
}

/// Fetches a base backup from `leader` and installs it; returns the lsn the WAL now starts
/// at. `epoch` is the highest this node knows (a leader of an older one is refused).
pub fn reseed(cfg: &Config, leader: &str, epoch: u32) -> Result<Lsn, EngineError> {
    let tmp = cfg.data_dir.join(RESEED_DIR);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("start a runtime for", &tmp))?;
    let opts = SnapshotOptions {
        transport: crate::replica::transport::transport(&cfg.replication)?,
        ..SnapshotOptions::new(cfg.replication.node_name())
    };
    let done = reseed_with(RealStorage::shared(), cfg, |sink| {
        warn!(
            primary = leader,
            "standby: behind what the primary retains; fetching a base backup"
        );
        rt.block_on(fetch_snapshot(leader, epoch, &opts, sink))
            .map_err(|e| EngineError::Replication(e.to_string()))
    })?;
    info!(
        primary = leader,
        wal_from = done.wal_from,
        files = done.files,
        bytes = done.bytes,
        leader_epoch = done.leader_epoch,
        "standby: re-seeded from the primary's base backup"
    );
    Ok(done.wal_from)
}

/// [`reseed`] through any storage, the backup's files written by `fetch` (the crash
/// schedules copy an engine's backup on the simulated disk): steps 1 to 3 of the module
/// comment, every file write through the seam.
pub fn reseed_with(
    storage: Arc<dyn Storage>,
    cfg: &Config,
    fetch: impl FnOnce(&mut dyn SnapshotSink) -> Result<SnapshotDone, EngineError>,
) -> Result<SnapshotDone, EngineError> {
    let layout = Layout::new(&cfg.data_dir);
    let disk = storage.as_ref();
    let _lock = lock_data_dir(disk, &layout)?;
    let tmp = layout.data_dir().join(RESEED_DIR);
    disk.remove_all(&tmp).map_err(io("remove", &tmp))?;
    disk.create_dir_all(&tmp).map_err(io("create", &tmp))?;
    let mut sink = DirSink::new(storage.clone(), tmp.clone());
    let done = fetch(&mut sink)?;
    // Every part exists in the backup, empty or not: at the install, a part missing from
    // `reseed.tmp/` then means "moved into place already", never "not in this backup".
    for part in [AUDIT_DIR, SHARDS_DIR, KEYS_DIR] {
        let d = tmp.join(part);
        disk.create_dir_all(&d).map_err(io("create", &d))?;
        sink.dirs.insert(d);
    }
    trim_audit(&storage, cfg, &tmp, done.wal_from)?;
    sink.sync_dirs()?;
    Wal::create_at(disk, &tmp.join(WAL_DIR), &wal_options(cfg), done.wal_from)?;
    let complete = tmp.join(COMPLETE_FILE);
    write_synced(disk, &complete, done.wal_from.to_string().as_bytes())?;
    sync_dir(disk, &tmp)?;
    install(disk, &layout)?;
    Ok(done)
}

/// The copied audit log without the rows of claims at or past `wal_from` (they are written
/// again when those claims are fetched and applied). The primary appends rows in the order
/// batches finish, so rows of earlier, finished claims may follow the first row of a later
/// one: they are kept, moved up to where the cut begins (nothing else rewrites them: their
/// claims are below the checkpoint). Done in `reseed.tmp/`, before the backup is whole.
fn trim_audit(
    storage: &Arc<dyn Storage>,
    cfg: &Config,
    tmp: &Path,
    wal_from: Lsn,
) -> Result<(), EngineError> {
    use crate::pipeline::records::{encode, read_audit, RecordType};
    let audit = Wal::open_with(storage.clone(), tmp.join(AUDIT_DIR), wal_options(cfg))?;
    let from = crate::pipeline::read_checkpoint(storage.as_ref(), &Layout::new(tmp))?
        .audit_from
        .max(audit.first_lsn());
    let mut cut = None;
    let mut keep = Vec::new();
    for row in read_audit(&audit, from) {
        let (at, row) = row?;
        match cut {
            None if row.claim_lsn >= wal_from => cut = Some(at),
            Some(_) if row.claim_lsn < wal_from => keep.push(row),
            _ => {}
        }
    }
    let Some(at) = cut else { return Ok(()) };
    audit.truncate_from(at)?;
    for row in &keep {
        let payload = encode("audit", row).map_err(EngineError::Encode)?;
        audit.append_nowait(RecordType::Audit as u8, &payload)?;
    }
    if let Some(last) = audit.next_lsn().checked_sub(1).filter(|l| *l >= at) {
        audit.sync_to(last)?;
    }
    info!(
        from_audit_lsn = at,
        rows_kept = keep.len(),
        "standby: the copied audit log trimmed at the checkpoint"
    );
    Ok(())
}

/// At start-up, before anything opens the data directory: finishes an install a crash
/// interrupted, or removes a backup that never became whole.
pub fn resume(cfg: &Config) -> Result<(), EngineError> {
    resume_with(&RealStorage, cfg)
}

/// [`resume`] through any storage.
pub fn resume_with(disk: &dyn Storage, cfg: &Config) -> Result<(), EngineError> {
    let layout = Layout::new(&cfg.data_dir);
    let tmp = layout.data_dir().join(RESEED_DIR);
    if !disk.exists(&tmp).map_err(io("look for", &tmp))? {
        return Ok(());
    }
    let _lock = lock_data_dir(disk, &layout)?;
    let complete = tmp.join(COMPLETE_FILE);
    if disk.exists(&complete).map_err(io("look for", &complete))? {
        warn!(dir = %tmp.display(), "standby: finishing a re-seed a stop interrupted");
        install(disk, &layout)
    } else {
        warn!(dir = %tmp.display(), "standby: removing a base backup that never arrived whole");
        disk.remove_all(&tmp).map_err(io("remove", &tmp))
    }
}

/// Step 3 (see the module comment).
fn install(disk: &dyn Storage, layout: &Layout) -> Result<(), EngineError> {
    let data = layout.data_dir();
    let tmp = data.join(RESEED_DIR);
    // The key index files the old key table's positions: it goes, and open rebuilds it
    // from the table installed here.
    let key_index = layout.key_index();
    disk.remove_all(&key_index)
        .map_err(io("remove", &key_index))?;
    for part in PARTS {
        let new = tmp.join(part);
        if !disk.exists(&new).map_err(io("look for", &new))? {
            continue; // installed before a crash (or not in this backup: a fresh log)
        }
        let old = data.join(part);
        disk.remove_all(&old).map_err(io("remove", &old))?;
        disk.rename(&new, &old).map_err(|source| EngineError::Io {
            op: "rename into place",
            path: new.join(format!("-> {}", old.display())),
            source,
        })?;
    }
    sync_dir(disk, data)?;
    sync_dir(disk, &tmp)?;
    let complete = tmp.join(COMPLETE_FILE);
    disk.remove(&complete).map_err(io("remove", &complete))?;
    sync_dir(disk, &tmp)?;
    disk.remove_all(&tmp).map_err(io("remove", &tmp))?;
    sync_dir(disk, data)
}

fn sync_dir(disk: &dyn Storage, dir: &Path) -> Result<(), EngineError> {
    disk.sync_dir(dir).map_err(io("sync", dir))
}

fn write_synced(disk: &dyn Storage, path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let f = disk
        .open(path, OpenMode::CreateNew)
        .map_err(io("create", path))?;
    f.write_at(bytes, 0).map_err(io("write", path))?;
    f.sync_data().map_err(io("sync", path))
}

/// Whether `rel` (a path the primary sent) names a file a backup may hold: relative, plain
/// components, under a known part, at that part's depth.
pub fn allowed_path(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    let plain = Path::new(rel)
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
        && parts
            .iter()
            .all(|p| !p.is_empty() && !p.starts_with('.') && !p.contains('\0'));
    let depth_ok = match parts.first().copied() {
        Some(CHECKPOINT_FILE | LEADER_EPOCHS_FILE) => parts.len() == 1,
        Some(KEYS_DIR | AUDIT_DIR) => parts.len() == 2,
        Some(SHARDS_DIR) => parts.len() == 3,
        _ => false,
    };
    plain && depth_ok
}

/// The largest file a backup may hold at `rel`: the small files a few MiB, a segment 4 GiB
/// (a primary's segment sizes are its own configuration; this only stops a peer from making
/// this node allocate without end).
fn file_bytes_max(rel: &str) -> u64 {
    if rel.contains('/') {
        4 << 30
    } else {
        16 << 20
    }
}

/// Writes the files of a backup under one directory, through the seam.
struct DirSink {
    storage: Arc<dyn Storage>,
    root: PathBuf,
    /// The file being written, its path and where the next bytes go.
    file: Option<(Box<dyn StorageFile>, PathBuf, u64)>,
    dirs: BTreeSet<PathBuf>,
}

impl DirSink {
    fn new(storage: Arc<dyn Storage>, root: PathBuf) -> DirSink {
        DirSink {
            storage,
            root,
            file: None,
            dirs: BTreeSet::new(),
        }
    }

    /// Every directory a file went into, deepest first, then the root.
    fn sync_dirs(&self) -> Result<(), EngineError> {
        for d in self.dirs.iter().rev() {
            sync_dir(self.storage.as_ref(), d)?;
        }
        sync_dir(self.storage.as_ref(), &self.root)
    }
}

impl SnapshotSink for DirSink {
    fn begin_file(&mut self, f: &SnapshotFile) -> Result<(), String> {
        if !allowed_path(&f.path) {
            return Err(format!(
                "refusing a file outside a data directory's parts: {:?}",
                f.path
            ));
        }
        let max = file_bytes_max(&f.path);
        if f.size > max {
            return Err(format!(
                "refusing {:?}: {} bytes, over {max}",
                f.path, f.size
            ));
        }
        let path = self.root.join(&f.path);
        if let Some(parent) = path.parent() {
            self.storage
                .create_dir_all(parent)
                .map_err(|e| format!("create {}: {e}", parent.display()))?;
            let mut d = parent.to_path_buf();
            while d.starts_with(&self.root) && d != self.root {
                self.dirs.insert(d.clone());
                d.pop();
            }
        }
        let file = self
            .storage
            .open(&path, OpenMode::CreateNew)
            .map_err(|e| format!("create {}: {e}", path.display()))?;
        file.set_len(f.size)
            .map_err(|e| format!("size {} to {} bytes: {e}", path.display(), f.size))?;
        self.file = Some((file, path, 0));
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> Result<(), String> {
        let (file, path, at) = self.file.as_mut().ok_or("write before begin_file")?;
        file.write_at(data, *at)
            .map_err(|e| format!("write {} at offset {at}: {e}", path.display()))?;
        *at += data.len() as u64;
        Ok(())
    }

    fn end_file(&mut self) -> Result<(), String> {
        let (file, path, _) = self.file.take().ok_or("end_file before begin_file")?;
        file.sync_data()
            .map_err(|e| format!("sync {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::allowed_path;

    /// Goal: a primary (or anyone on its port) cannot make a standby write outside the parts
    /// of its data directory.
    #[test]
    fn only_data_directory_parts_are_allowed() {
        for ok in [
            "CHECKPOINT",
            "LEADER_EPOCHS",
            "keys/00000000000000000001.wal",
            "audit/x.wal",
            "shards/s0/000001.seg",
        ] {
            assert!(allowed_path(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "shards/../../x",
            "shards/s0/../../../x",
            "EPOCH",
            "LOCK",
            "wal/1.wal",
            "spool/new/a",
            "shards/s0",
            "keys/a/b",
            "keys/.x",
            "shards/s0/./x",
            "keys//x",
            "keys/x\0",
        ] {
            assert!(!allowed_path(bad), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod install_tests {
    use super::*;

    fn put(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    fn read(path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    fn config(dir: &Path) -> Config {
        Config {
            data_dir: dir.to_path_buf(),
            ..Config::default()
        }
    }

    /// A data directory holding an old state, and a whole backup in `reseed.tmp/` of which
    /// the WAL was already moved into place when the "crash" came.
    fn interrupted(dir: &Path) {
        put(&dir.join("EPOCH"), "mine");
        put(&dir.join("CHECKPOINT"), "old");
        put(&dir.join("shards/s/1.seg"), "old segment");
        put(&dir.join("audit/1.wal"), "old audit");
        let tmp = dir.join(RESEED_DIR);
        put(
            &dir.join("wal/40.wal"),
            "new wal, installed before the crash",
        );
        put(&tmp.join("CHECKPOINT"), "new");
        put(&tmp.join("shards/s/7.seg"), "new segment");
        put(&tmp.join("audit/9.wal"), "new audit");
        put(&tmp.join("keys/3.wal"), "new keys");
        put(&tmp.join(COMPLETE_FILE), "40");
    }

    /// Goal: a start after a crash in the middle of an install finishes it: every part the
    /// backup holds replaces the old one (none of the old left behind), the parts moved
    /// before the crash stay, this node's own `EPOCH` is kept, and `reseed.tmp/` is gone.
    #[test]
    fn a_whole_backup_is_installed_after_a_crash_mid_install() {
        let t = tempfile::tempdir().expect("tempdir");
        interrupted(t.path());
        resume(&config(t.path())).expect("resume");
        let d = t.path();
        assert_eq!(read(&d.join("CHECKPOINT")).as_deref(), Some("new"));
        assert_eq!(
            read(&d.join("shards/s/7.seg")).as_deref(),
            Some("new segment")
        );
        assert_eq!(
            read(&d.join("shards/s/1.seg")),
            None,
            "the old shard files went"
        );
        assert_eq!(read(&d.join("audit/1.wal")), None);
        assert_eq!(read(&d.join("audit/9.wal")).as_deref(), Some("new audit"));
        assert_eq!(read(&d.join("keys/3.wal")).as_deref(), Some("new keys"));
        assert!(read(&d.join("wal/40.wal")).is_some());
        assert_eq!(read(&d.join("EPOCH")).as_deref(), Some("mine"));
        assert!(!d.join(RESEED_DIR).exists());
        resume(&config(d)).expect("a second resume is a no-op");
        assert_eq!(read(&d.join("CHECKPOINT")).as_deref(), Some("new"));
    }

    /// Goal: a backup that never became whole (no `COMPLETE`) is thrown away and the old
    /// state is untouched.
    #[test]
    fn a_partial_backup_is_removed_and_the_old_state_kept() {
        let t = tempfile::tempdir().expect("tempdir");
        interrupted(t.path());
        let d = t.path();
        std::fs::remove_file(d.join(RESEED_DIR).join(COMPLETE_FILE)).expect("rm");
        resume(&config(d)).expect("resume");
        assert_eq!(read(&d.join("CHECKPOINT")).as_deref(), Some("old"));
        assert_eq!(
            read(&d.join("shards/s/1.seg")).as_deref(),
            Some("old segment")
        );
        assert!(!d.join(RESEED_DIR).exists());
    }
}

#[cfg(test)]
mod trim_tests {
    use super::*;
    use crate::pipeline::records::{
        encode, encode_checkpoint, read_audit, AuditRecord, OpKind, RecordType,
    };
    use crate::pipeline::Checkpoint;

    fn row(claim_lsn: u64, op_index: u32) -> AuditRecord {
        AuditRecord {
            claim_lsn,
            request_key: format!("k{claim_lsn}"),
            op_index,
            op: OpKind::Create,
            shard: "s".into(),
            id: claim_lsn * 10 + u64::from(op_index),
        }
    }

    /// Goal: the copied audit log loses the rows of claims at or past the checkpoint, and
    /// keeps every row of an earlier claim, even one the primary wrote after a later claim's
    /// row (rows go in the order batches finish). Method: rows of claims 47, 50, 48, 48, 51,
    /// 46 with the checkpoint at 49.
    #[test]
    fn rows_of_earlier_claims_written_after_a_later_one_are_kept() {
        let t = tempfile::tempdir().expect("tempdir");
        let cfg = Config {
            data_dir: t.path().to_path_buf(),
            ..Config::default()
        };
        let audit = Wal::open(t.path().join(AUDIT_DIR), wal_options(&cfg)).expect("audit");
        for r in [
            row(47, 0),
            row(50, 0),
            row(48, 0),
            row(48, 1),
            row(51, 0),
            row(46, 0),
        ] {
            let payload = encode("audit", &r).expect("encode");
            audit
                .append(RecordType::Audit as u8, &payload)
                .expect("append");
        }
        drop(audit);
        let c = Checkpoint {
            wal_from: 49,
            audit_from: 1,
            ..Checkpoint::default()
        };
        std::fs::write(
            t.path().join(CHECKPOINT_FILE),
            encode_checkpoint(&c).expect("c"),
        )
        .expect("checkpoint");
        trim_audit(&RealStorage::shared(), &cfg, t.path(), 49).expect("trim");
        let audit = Wal::open(t.path().join(AUDIT_DIR), wal_options(&cfg)).expect("audit");
        let mut got: Vec<(u64, u32)> = read_audit(&audit, 1)
            .map(|r| r.map(|(_, r)| (r.claim_lsn, r.op_index)).expect("row"))
            .collect();
        got.sort();
        assert_eq!(got, vec![(46, 0), (47, 0), (48, 0), (48, 1)]);
    }
}

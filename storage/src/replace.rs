//! [`replace_file`]: the one atomic replacement of a small file, through the seam (so the
//! crash simulator sees every step): a temporary created, written and fdatasynced, renamed over
//! the file, the directory fsynced ([`install`], the last two steps, also for a file written
//! by other means). A crash at any step leaves the old file or the new one, and once it
//! returns the new one survives a power loss. It never retries a step and never removes the
//! temporary after a failure (the caller latches; the next replacement removes it first).

use std::io;
use std::path::{Path, PathBuf};

use crate::seam::{OpenMode, Storage};

/// The step of a replacement that failed, on which path (each crate wraps it in its own
/// error with the same `op` and `path`).
#[derive(Debug, thiserror::Error)]
#[error("{op} failed on {}: {source}", path.display())]
pub struct ReplaceError {
    /// `"remove"`, `"create"`, `"write"`, `"sync"`, `"rename"` or `"sync dir"`.
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn step(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ReplaceError {
    let path = path.to_path_buf();
    move |source| ReplaceError { op, path, source }
}

/// Replaces `path` with `bytes` atomically: `tmp` (beside `path`, or at least on its file
/// system) created as `create` says (any stale one removed first), written and fdatasynced,
/// then [`install`]ed over `path`. `create` is [`OpenMode::CreateNew`] or
/// [`OpenMode::CreateNewPrivate`] (a key, never readable by others, not even for a moment).
pub fn replace_file(
    storage: &dyn Storage,
    tmp: &Path,
    path: &Path,
    bytes: &[u8],
    create: OpenMode,
) -> Result<(), ReplaceError> {
    if !matches!(create, OpenMode::CreateNew | OpenMode::CreateNewPrivate) {
        let e = io::Error::new(
            io::ErrorKind::InvalidInput,
            "replace_file creates its temporary",
        );
        return Err(step("create", tmp)(e));
    }
    match storage.remove(tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(step("remove", tmp)(e)),
        _ => {}
    }
    let file = storage.open(tmp, create).map_err(step("create", tmp))?;
    file.write_at(bytes, 0).map_err(step("write", tmp))?;
    file.sync_data().map_err(step("sync", tmp))?;
    drop(file);
    install(storage, tmp, path)
}

/// Renames `tmp` (written and synced already) over `path`, then fsyncs `path`'s directory:
/// from then on the new name survives a power loss.
pub fn install(storage: &dyn Storage, tmp: &Path, path: &Path) -> Result<(), ReplaceError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    storage.rename(tmp, path).map_err(step("rename", path))?;
    storage.sync_dir(dir).map_err(step("sync dir", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{read_all, CrashMode, SimFaults, SimStorage};

    fn read(disk: &SimStorage, p: &Path) -> Option<Vec<u8>> {
        let f = disk.open(p, OpenMode::Read).ok()?;
        read_all(f.as_ref()).ok()
    }

    /// Goal: a power loss after any number of syncs during a replacement leaves the old
    /// file or the new one, never a mix, an empty file or none; after the last sync, the new.
    /// Method: on the simulated disk, for each n, freeze after n syncs, replace, drop power.
    #[test]
    fn a_power_loss_at_any_step_leaves_the_old_file_or_the_new() {
        let (dir, path, tmp) = (Path::new("/d"), Path::new("/d/f"), Path::new("/d/f.tmp"));
        for n in 0..4 {
            let disk = SimStorage::new();
            disk.create_dir_all(dir).unwrap();
            replace_file(&disk, tmp, path, b"old", OpenMode::CreateNew).unwrap();
            let base = disk.sync_count();
            disk.set_faults(SimFaults {
                freeze_after_syncs: Some(base + n),
                ..SimFaults::default()
            });
            replace_file(&disk, tmp, path, b"new new", OpenMode::CreateNew).unwrap();
            let after = disk.crash(CrashMode::PowerDrop);
            let got = read(&after, path);
            let want_new = n >= 2;
            let want: &[u8] = if want_new { b"new new" } else { b"old" };
            assert_eq!(got.as_deref(), Some(want), "frozen after {n} syncs");
        }
    }

    /// Goal: a stale temporary from an earlier crash is no obstacle, and a failed step is
    /// named with its path. Method: leave a temporary, replace; then fail the data sync.
    #[test]
    fn a_stale_temporary_is_removed_and_a_failure_names_its_step() {
        let (path, tmp) = (Path::new("/d/f"), Path::new("/d/f.tmp"));
        let disk = SimStorage::new();
        disk.create_dir_all(Path::new("/d")).unwrap();
        drop(disk.open(tmp, OpenMode::CreateNew).unwrap());
        replace_file(&disk, tmp, path, b"x", OpenMode::CreateNewPrivate).unwrap();
        assert_eq!(read(&disk, path).as_deref(), Some(&b"x"[..]));
        disk.set_faults(SimFaults {
            fail_sync_at: Some(disk.sync_count() + 1),
            ..SimFaults::default()
        });
        let e = replace_file(&disk, tmp, path, b"y", OpenMode::CreateNew).unwrap_err();
        assert_eq!((e.op, e.path.as_path()), ("sync", tmp));
        assert_eq!(
            read(&disk, path).as_deref(),
            Some(&b"x"[..]),
            "old file kept"
        );
        let e = replace_file(&disk, tmp, path, b"z", OpenMode::Read).unwrap_err();
        assert_eq!(e.op, "create");
    }
}

//! The directories of [`SimStorage`](super::SimStorage): which exist (live and durable, as
//! files do), a directory moved or removed with everything under it, and the process stop a
//! crash schedule takes at the n-th changing call. A file's name is still its path: a
//! directory is not needed for a file in it to exist (what `create_dir_all` made is only
//! listed). A file moved or removed with its directory becomes durable (moved, or gone) when
//! the directory that held the moved or removed entry is synced (its `via`), not its own.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// A file entry as the tree sees it (the simulator's `SimFile`): this module knows nothing
/// else of a file, so it never refers back to `sim.rs`.
pub(super) trait Linked: Clone + Default {
    /// Whether the live image has this name.
    fn live(&self) -> bool;
    /// Unlinks the live entry; the removal is durable with a sync of `via`.
    fn unlink(&mut self, via: Option<PathBuf>);
    /// `self` (a file moved with its directory) now under the name `dst` held; durable
    /// with a sync of `via` (until then a power loss brings back what `dst` held).
    fn move_over(self, dst: &mut Self, via: Option<PathBuf>);
}

/// A directory `create_dir_all` made or a rename moved.
#[derive(Clone, Debug, Default)]
pub(super) struct SimDir {
    pub live: bool,
    pub durable: bool,
    /// The directory whose sync settles this entry (its parent when `None`).
    pub via: Option<PathBuf>,
}

fn err(kind: io::ErrorKind, what: &str) -> io::Error {
    io::Error::new(kind, format!("simulated: {what}"))
}

/// Counts one changing call; past `stop_after` the process has stopped (a crash at that
/// call): the call fails and changes nothing, as does every later one.
pub(super) fn count_op(ops: &mut u64, stop_after: Option<u64>) -> io::Result<()> {
    *ops += 1;
    match stop_after {
        Some(n) if *ops > n => Err(err(io::ErrorKind::Other, "the process stopped")),
        _ => Ok(()),
    }
}

/// Whether the entry at `p` (settled by `via`, or by its parent) is settled by a sync of `dir`.
pub(super) fn settled_by(p: &Path, via: Option<&Path>, dir: &Path) -> bool {
    via.map_or(p.parent() == Some(dir), |v| v == dir)
}

/// `create_dir_all`: `dir` and its ancestors exist (live) from now on.
pub(super) fn create_dirs(dirs: &mut BTreeMap<PathBuf, SimDir>, dir: &Path) {
    for d in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
        let e = dirs.entry(d.to_path_buf()).or_default();
        if !e.live {
            e.live = true;
            e.via = None;
        }
    }
}

fn under<'a>(p: &'a Path, dir: &Path) -> Option<&'a Path> {
    p.strip_prefix(dir)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
}

/// Whether `path` is a live file, a live directory or holds a live file.
pub(super) fn exists<F: Linked>(
    files: &BTreeMap<PathBuf, F>,
    dirs: &BTreeMap<PathBuf, SimDir>,
    path: &Path,
) -> bool {
    dirs.get(path).is_some_and(|d| d.live)
        || files
            .iter()
            .any(|(p, f)| f.live() && (p == path || under(p, path).is_some()))
}

/// The live directories in `dir`: those made there, and those holding a live file.
pub(super) fn list_dirs<F: Linked>(
    files: &BTreeMap<PathBuf, F>,
    dirs: &BTreeMap<PathBuf, SimDir>,
    dir: &Path,
) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    let made = dirs.iter().filter(|(_, d)| d.live).map(|(p, _)| p);
    for p in made.filter(|p| p.parent() == Some(dir)) {
        names.extend(p.file_name().and_then(|n| n.to_str()).map(str::to_owned));
    }
    for (p, _) in files.iter().filter(|(_, f)| f.live()) {
        let Some(rel) = under(p, dir) else { continue };
        let mut parts = rel.components();
        if let (Some(first), Some(_)) = (parts.next(), parts.next()) {
            names.extend(first.as_os_str().to_str().map(str::to_owned));
        }
    }
    names.into_iter().collect()
}

/// `remove_all` of a path that is no live file: every live file and directory under it (and
/// it) goes, durably once `path`'s parent is synced.
pub(super) fn remove_tree<F: Linked>(
    files: &mut BTreeMap<PathBuf, F>,
    dirs: &mut BTreeMap<PathBuf, SimDir>,
    path: &Path,
) {
    let via = path.parent().map(Path::to_path_buf);
    for (p, f) in files.iter_mut() {
        if f.live() && under(p, path).is_some() {
            f.unlink(via.clone());
        }
    }
    for (p, d) in dirs.iter_mut() {
        if d.live && (p == path || under(p, path).is_some()) {
            d.live = false;
            d.via = via.clone();
        }
    }
}

/// A rename of the directory `from` (no live file) to `to`, which must hold no live file.
pub(super) fn rename_dir<F: Linked>(
    files: &mut BTreeMap<PathBuf, F>,
    dirs: &mut BTreeMap<PathBuf, SimDir>,
    from: &Path,
    to: &Path,
) -> io::Result<()> {
    if !exists(files, dirs, from) {
        return Err(err(io::ErrorKind::NotFound, "rename source missing"));
    }
    let taken = |(p, f): (&PathBuf, &F)| f.live() && (p == to || under(p, to).is_some());
    if files.iter().any(taken) {
        return Err(err(io::ErrorKind::AlreadyExists, "rename target not empty"));
    }
    let via_from = from.parent().map(Path::to_path_buf);
    let via_to = to.parent().map(Path::to_path_buf);
    let mut moved = Vec::new();
    for (p, f) in files.iter_mut() {
        if let Some(rel) = under(p, from).filter(|_| f.live()) {
            let src = f.clone();
            f.unlink(via_from.clone());
            moved.push((to.join(rel), src));
        }
    }
    for (dst, src) in moved {
        src.move_over(files.entry(dst).or_default(), via_to.clone());
    }
    let inside = |p: &Path| p == from || under(p, from).is_some();
    let moved_dirs: Vec<PathBuf> = dirs
        .iter()
        .filter(|(p, d)| d.live && inside(p))
        .map(|(p, _)| p.clone())
        .collect();
    for p in moved_dirs {
        if let Some(d) = dirs.get_mut(&p) {
            d.live = false;
            d.via = via_from.clone();
        }
        let rel = p.strip_prefix(from).unwrap_or(Path::new(""));
        let dst = dirs.entry(to.join(rel)).or_default();
        dst.live = true;
        dst.via = via_to.clone();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::seam::{OpenMode, Storage};
    use crate::sim::{CrashMode, SimFaults, SimStorage};
    use std::path::Path;

    fn put(d: &SimStorage, p: &Path, body: &[u8]) {
        d.create_dir_all(p.parent().expect("parent"))
            .expect("mkdir");
        let f = d.open(p, OpenMode::CreateNew).expect("create");
        f.write_at(body, 0).expect("write");
        f.sync_data().expect("sync");
        d.sync_dir(p.parent().expect("parent")).expect("sync dir");
    }

    /// Goal: a directory renamed over a removed one takes its files along, and a power loss
    /// before the parent's sync brings back the old tree (the new files still under the old
    /// name), after it the new one; a removed tree comes back until its parent is synced.
    #[test]
    fn a_directory_rename_and_removal_are_durable_with_the_parents_sync() {
        let d = SimStorage::new();
        let (data, tmp) = (Path::new("/d"), Path::new("/d/tmp"));
        put(&d, &data.join("wal/1"), b"old");
        put(&d, &tmp.join("wal/1"), b"new");
        d.sync_dir(data).expect("sync");
        d.sync_dir(tmp).expect("sync");
        d.remove_all(&data.join("wal")).expect("remove");
        d.rename(&tmp.join("wal"), &data.join("wal"))
            .expect("rename");
        assert_eq!(
            d.file_bytes(&data.join("wal/1")).as_deref(),
            Some(&b"new"[..])
        );
        assert!(!d.exists(&tmp.join("wal")).expect("exists"));
        let lost = d.crash(CrashMode::PowerDrop);
        assert_eq!(
            lost.file_bytes(&data.join("wal/1")).as_deref(),
            Some(&b"old"[..])
        );
        assert_eq!(
            lost.file_bytes(&tmp.join("wal/1")).as_deref(),
            Some(&b"new"[..])
        );
        d.sync_dir(data).expect("sync");
        d.sync_dir(tmp).expect("sync");
        let kept = d.crash(CrashMode::PowerDrop);
        assert_eq!(
            kept.file_bytes(&data.join("wal/1")).as_deref(),
            Some(&b"new"[..])
        );
        assert_eq!(kept.list_dirs(tmp).expect("list"), Vec::<String>::new());
        assert_eq!(kept.list_dirs(data).expect("list"), vec!["tmp", "wal"]);
        d.remove_all(tmp).expect("remove");
        assert!(d.crash(CrashMode::PowerDrop).exists(tmp).expect("exists"));
        d.sync_dir(data).expect("sync");
        assert!(!d.crash(CrashMode::PowerDrop).exists(tmp).expect("exists"));
    }

    /// Goal: past `stop_after_ops` every changing call fails and changes nothing.
    #[test]
    fn a_stopped_process_changes_nothing() {
        let d = SimStorage::new();
        put(&d, Path::new("/d/a"), b"a");
        let n = d.op_count();
        assert_eq!(n, 5, "mkdir, create, write, sync, sync dir");
        d.set_faults(SimFaults {
            stop_after_ops: Some(n),
            ..SimFaults::default()
        });
        assert!(d.remove(Path::new("/d/a")).is_err());
        assert!(d.open(Path::new("/d/b"), OpenMode::CreateNew).is_err());
        assert_eq!(d.paths(), vec![Path::new("/d/a").to_path_buf()]);
    }
}

//! [`DirLock`]: the exclusive advisory lock (`flock`) on a directory's `LOCK` file that keeps a
//! second writer out of a data directory or a shard. It owns the lock file's handle for as long
//! as the lock is held; it never waits for a lock, never removes the file and never goes
//! through the storage seam (a simulated disk has no other process to keep out).

use std::fs::{File, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

/// The name of the lock file inside a locked directory.
pub const LOCK_FILE: &str = "LOCK";

/// Why a directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another open file description (another process, or another open in this one) holds it.
    #[error("{} is locked by another process", path.display())]
    Held { path: PathBuf },
    #[error("lock {op} failed on {}: {source}", path.display())]
    Io {
        /// `"open lock"` or `"lock"`.
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// An exclusive lock on `<dir>/LOCK`, released when dropped (closing the file releases the
/// `flock`, also when the process dies, so a crash never leaves a stale lock).
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    /// Holds the lock: the `flock` lives as long as this open file description.
    _file: File,
}

impl DirLock {
    /// Creates `<dir>/LOCK` if needed (never truncating it) and takes an exclusive lock on it
    /// without waiting. `dir` must exist.
    pub fn acquire(dir: &Path) -> Result<DirLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let file = match File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(source) => {
                return Err(LockError::Io {
                    op: "open lock",
                    path,
                    source,
                })
            }
        };
        match file.try_lock() {
            Ok(()) => Ok(DirLock { path, _file: file }),
            Err(TryLockError::WouldBlock) => Err(LockError::Held { path }),
            Err(TryLockError::Error(source)) => Err(LockError::Io {
                op: "lock",
                path,
                source,
            }),
        }
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a second lock on the same directory is refused while the first is held, and
    /// granted once it is dropped.
    #[test]
    fn second_lock_is_held_until_the_first_drops() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        assert_eq!(first.path(), dir.path().join(LOCK_FILE));
        match DirLock::acquire(dir.path()) {
            Err(LockError::Held { path }) => assert_eq!(path, dir.path().join(LOCK_FILE)),
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        assert!(DirLock::acquire(dir.path()).is_ok());
    }

    /// Goal: a missing directory is an I/O error naming the lock file, not a panic.
    #[test]
    fn missing_dir_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("absent");
        assert!(matches!(
            DirLock::acquire(&gone),
            Err(LockError::Io { op: "open lock", path, .. }) if path == gone.join(LOCK_FILE)
        ));
    }
}

//! Small helpers every file of the engine uses: a lock that survives a poisoned mutex, the
//! `Io` error of one operation on one path, and the atomic replacement of a small file. It
//! knows nothing of the engine.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use roost_storage::Storage;

use crate::error::EngineError;

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `EngineError::Io` for `op` on `path`, as a `map_err` closure.
pub fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.to_path_buf();
    move |source| EngineError::Io { op, path, source }
}

/// Replaces `path` with `bytes` atomically: a temporary written and fdatasynced, renamed
/// over it, the directory fsynced. A crash leaves the old file or the new one.
pub fn replace_file(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let tmp = path.with_extension("tmp");
    let dir = path.parent().unwrap_or(Path::new("."));
    let _ = storage.remove(&tmp);
    let f = storage
        .open(&tmp, roost_storage::OpenMode::CreateNew)
        .map_err(io_err("create", &tmp))?;
    f.write_at(bytes, 0).map_err(io_err("write", &tmp))?;
    f.sync_data().map_err(io_err("sync", &tmp))?;
    drop(f);
    storage.rename(&tmp, path).map_err(io_err("rename", path))?;
    storage.sync_dir(dir).map_err(io_err("sync dir", dir))
}

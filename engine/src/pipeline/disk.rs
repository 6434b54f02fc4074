//! Small helpers every file of the engine uses: the `Io` error of one operation on one path,
//! and the engine's small files replaced atomically (through `roost_storage::replace_file`).
//! It knows nothing of the engine.

use std::path::Path;

use roost_storage::{OpenMode, ReplaceError, Storage};

use crate::error::EngineError;

/// `EngineError::Io` for `op` on `path`, as a `map_err` closure.
pub fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.to_path_buf();
    move |source| EngineError::Io { op, path, source }
}

/// Replaces `path` with `bytes` atomically ([`roost_storage::replace_file`], the temporary
/// `NAME.tmp` beside it). A crash leaves the old file or the new one.
pub fn replace_file(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let tmp = path.with_extension("tmp");
    roost_storage::replace_file(storage, &tmp, path, bytes, OpenMode::CreateNew)
        .map_err(|ReplaceError { op, path, source }| EngineError::Io { op, path, source })
}

//! An invalid spool file: its `invalid` answer published and the file moved to `failed/`
//! (bounded by `FailedDir`), for single files and bulk files alike.

use std::sync::atomic::Ordering;

use tracing::{error, warn};

use super::Shared;
use crate::batch::{self, BatchResult};
use crate::error::EngineError;

/// Moves `new/NAME` to `failed/NAME` and writes the `invalid` result. A failed move is not
/// fatal (the input is still there, nothing is lost): the name is logged and left alone. A
/// failed publish is: the result round latched (or the WAL did, settling an earlier batch
/// under the name), and like any write failure it stops the daemon with its class.
pub(crate) fn quarantine(sh: &Shared, name: &str, inv: &batch::Invalid) -> Result<(), EngineError> {
    let engine = &sh.engine;
    let sp = engine.spool();
    warn!(file = name, error = %inv.error, "invalid batch file: quarantined");
    let moved = engine
        .storage()
        .rename(&sp.new.join(name), &sp.failed.join(name));
    if moved.is_ok() {
        if let Ok(mut f) = sh.failed.lock() {
            let cfg = engine.config();
            f.add(name, cfg.failed_files_max, cfg.failed_bytes_max);
        }
    }
    engine.stats.invalid.fetch_add(1, Ordering::Relaxed);
    let wrote = engine.publish(name, &BatchResult::invalid(inv));
    match &moved {
        // The move lasts at once: a file that came back to new/ would be judged again
        // (under a configuration that may have changed since).
        Ok(()) if wrote.is_ok() => sync_dirs(engine.storage().as_ref(), &[&sp.new, &sp.failed]),
        Ok(()) => {}
        Err(e) => {
            error!(file = name, error = %e, "cannot quarantine; leaving it in new/");
            sh.stuck.lock().map(|mut s| s.insert(name.to_owned())).ok();
        }
    }
    wrote
}

/// Best effort: quarantine is outside what recovery relies on, so a failed sync is logged.
fn sync_dirs(storage: &dyn roost_storage::Storage, dirs: &[&std::path::Path]) {
    for d in dirs {
        if let Err(e) = storage.sync_dir(d) {
            warn!(dir = %d.display(), error = %e, "cannot sync a spool folder");
        }
    }
}

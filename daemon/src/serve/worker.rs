//! A worker: one file from `new/` to its result, on the blocking pool (the engine blocks on
//! fsync); a bulk file (`NAME.jsonl`) goes to `bulk.rs`. An invalid file is quarantined; a
//! pipeline failure stops the loop.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, error, warn};

use super::Shared;
use crate::batch::{self, BatchResult};
use crate::error::EngineError;
use crate::spool::{read_dropped, Intake};

/// Runs `name` on the blocking pool, holding `permit` until it is done; then hands a name
/// that arrived again meanwhile back to the loop.
pub(super) fn spawn(sh: Arc<Shared>, name: String, permit: OwnedSemaphorePermit) {
    tokio::task::spawn_blocking(move || {
        if let Err(e) = process(&sh, &name) {
            error!(file = %name, error = %e, "pipeline failure: stopping");
            if let Ok(mut f) = sh.fatal.lock() {
                f.get_or_insert(e);
            }
            sh.stop.store(true, Ordering::SeqCst);
            sh.wake.notify_one();
        }
        sh.in_progress.lock().map(|mut s| s.remove(&name)).ok();
        if sh.again.lock().is_ok_and(|mut s| s.remove(&name)) {
            sh.requeue.lock().map(|mut q| q.push(name)).ok();
            sh.wake.notify_one();
        }
        drop(permit);
    });
}

/// One file from `new/` to its result (a bulk file's: `bulk.rs`).
fn process(sh: &Shared, name: &str) -> Result<(), EngineError> {
    if crate::spool::bulk::is_bulk_name(name) {
        return super::bulk::process(sh, name);
    }
    let engine = &sh.engine;
    let cfg = engine.config();
    let path = engine.spool().new.join(name);
    let parsed = match read_dropped(&path, cfg.spool_file_bytes_max) {
        Ok(Intake::Gone) => return Ok(()),
        Ok(Intake::Refused(reason)) => Err(batch::Invalid {
            request_key: None,
            error: reason,
        }),
        Ok(Intake::Bytes(b)) => batch::parse(&b, cfg.batch_ops_max),
        Err(e) => Err(batch::Invalid {
            request_key: None,
            error: format!("cannot read: {e}"),
        }),
    };
    match parsed {
        Ok(b) => match engine.submit(&b, name) {
            Ok(r) => {
                debug!(file = name, status = ?r.status(), lsn = r.lsn(), "batch done");
                Ok(())
            }
            // Left in new/ untouched: the loop rescans once intake resumes.
            Err(e) if e.latches_nothing() => {
                debug!(file = name, error = %e, "batch left in new/ (or claimed, unanswered)");
                Ok(())
            }
            Err(e) => Err(e),
        },
        Err(inv) => quarantine(sh, name, &inv),
    }
}

/// Moves `new/NAME` to `failed/NAME` and writes the `invalid` result. A failed move is not
/// fatal (the input is still there, nothing is lost): the name is logged and left alone. A
/// failed publish is: the result round latched (or the WAL did, settling an earlier batch
/// under the name), and like any write failure it stops the daemon with its class.
pub(super) fn quarantine(sh: &Shared, name: &str, inv: &batch::Invalid) -> Result<(), EngineError> {
    let engine = &sh.engine;
    let sp = engine.spool();
    warn!(file = name, error = %inv.error, "invalid batch file: quarantined");
    let moved = std::fs::rename(sp.new.join(name), sp.failed.join(name));
    if moved.is_ok() {
        if let Ok(mut f) = sh.failed.lock() {
            let cfg = engine.config();
            f.add(name, cfg.failed_files_max, cfg.failed_bytes_max);
        }
    }
    engine.note_invalid();
    let wrote = engine.publish(name, &BatchResult::invalid(inv));
    match &moved {
        // The move lasts at once: a file that came back to new/ would be judged again
        // (under a configuration that may have changed since).
        Ok(()) if wrote.is_ok() => sync_dirs(&[&sp.new, &sp.failed]),
        Ok(()) => {}
        Err(e) => {
            error!(file = name, error = %e, "cannot quarantine; leaving it in new/");
            sh.stuck.lock().map(|mut s| s.insert(name.to_owned())).ok();
        }
    }
    wrote
}

/// Best effort: quarantine is outside what recovery relies on, so a failed sync is logged.
fn sync_dirs(dirs: &[&std::path::Path]) {
    for d in dirs {
        if let Err(e) = std::fs::File::open(d).and_then(|f| f.sync_all()) {
            warn!(dir = %d.display(), error = %e, "cannot sync a spool folder");
        }
    }
}

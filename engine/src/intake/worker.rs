//! A worker: one file from `new/` to its result, or a group of them, on the blocking pool
//! (the engine blocks on fsync); a bulk file (`NAME.jsonl`) goes to `bulk_files.rs`. An invalid
//! file is quarantined (`invalid_files.rs`); a pipeline failure stops the loop.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, error};

use super::invalid_files::quarantine;
use super::Shared;
use crate::batch::{self, BatchResult};
use crate::error::EngineError;
use crate::pipeline::Deliver;
use crate::spool::{read_dropped, Intake};

/// Runs `name` on the blocking pool, holding `permit` until it is done; then hands a name
/// that arrived again meanwhile back to the loop.
pub(crate) fn spawn(sh: Arc<Shared>, name: String, permit: OwnedSemaphorePermit) {
    tokio::task::spawn_blocking(move || {
        if let Err(e) = process(&sh, &name) {
            fail(&sh, &name, e);
        }
        release(&sh, name);
        drop(permit);
    });
}

/// Runs spool files (no bulk file among them) on the blocking pool as one group
/// (`Engine::submit`: one planner pass, one WAL sync, their results in one round),
/// holding `permit` (one per file) until all are answered. One file runs as [`spawn`].
pub(crate) fn spawn_group(sh: Arc<Shared>, mut names: Vec<String>, permit: OwnedSemaphorePermit) {
    if names.len() == 1 {
        if let Some(name) = names.pop() {
            spawn(sh, name, permit);
        }
        return;
    }
    tokio::task::spawn_blocking(move || {
        if let Err(e) = process_group(&sh, &names) {
            fail(&sh, &names.join(", "), e);
        }
        for name in names {
            release(&sh, name);
        }
        drop(permit);
    });
}

/// A pipeline failure: kept for the exit code, and the loop stops.
fn fail(sh: &Shared, files: &str, e: EngineError) {
    error!(files, error = %e, "pipeline failure: stopping");
    sh.stop_on(e);
}

/// `name` is no longer in progress; if it arrived again meanwhile, back to the loop.
fn release(sh: &Shared, name: String) {
    sh.in_progress.lock().map(|mut s| s.remove(&name)).ok();
    if sh.again.lock().is_ok_and(|mut s| s.remove(&name)) {
        sh.requeue.lock().map(|mut q| q.push(name)).ok();
        sh.wake.notify_one();
    }
}

/// What reading and parsing `new/NAME` gave.
enum Read {
    /// Gone before it was read (taken back by its client, or answered meanwhile).
    Gone,
    Batch(batch::Batch),
    Invalid(batch::Invalid),
}

fn read(sh: &Shared, name: &str) -> Read {
    let cfg = sh.engine.config();
    let path = sh.engine.spool().new.join(name);
    let parsed = match read_dropped(&path, cfg.spool_file_bytes_max) {
        Ok(Intake::Gone) => return Read::Gone,
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
        Ok(b) => Read::Batch(b),
        Err(inv) => Read::Invalid(inv),
    }
}

/// One file from `new/` to its result (a bulk file's: `bulk_files.rs`).
fn process(sh: &Shared, name: &str) -> Result<(), EngineError> {
    if crate::intake::bulk_lines::is_bulk_name(name) {
        // A cluster standby's lines are forwarded to the leader (`bulk_files.rs`).
        return super::bulk_files::process(sh, name);
    }
    match read(sh, name) {
        Read::Gone => Ok(()),
        Read::Invalid(inv) => quarantine(sh, name, &inv),
        Read::Batch(b) => match sh.forwarding() {
            Some(cl) => forward_group(sh, cl, &[name.to_owned()]),
            None => settled(name, sh.engine.submit(&[(&b, name)], Deliver::Files)),
        },
    }
}

/// A cluster standby's files: forwarded to the leader all at once, answered here together
/// (one publishing round) once this node holds their claims (`cluster/forward.rs`); not now
/// (no leader, a failover): left in `new/` for the next rescan, to be sent again under its
/// key. Invalid ones are quarantined first; a bulk file goes its own way (`process`).
fn forward_group(
    sh: &Shared,
    cl: &Arc<crate::cluster::Cluster>,
    names: &[String],
) -> Result<(), EngineError> {
    let mut batches = Vec::with_capacity(names.len());
    for name in names {
        if crate::intake::bulk_lines::is_bulk_name(name) {
            process(sh, name)?;
            continue;
        }
        match read(sh, name) {
            Read::Gone => {}
            Read::Invalid(inv) => quarantine(sh, name, &inv)?,
            Read::Batch(b) => batches.push((b, name.as_str())),
        }
    }
    let refs: Vec<&batch::Batch> = batches.iter().map(|(b, _)| b).collect();
    let rt = tokio::runtime::Handle::current();
    let outcomes = crate::cluster::forward::forward_all(cl, sh.here(), &rt, &refs);
    let mut answered: Vec<(&str, Vec<u8>)> = Vec::with_capacity(batches.len());
    for ((_, name), outcome) in batches.iter().zip(outcomes) {
        match outcome {
            Ok(r) => {
                debug!(file = name, status = ?r.status(), lsn = r.lsn(), "forwarded batch answered");
                answered.push((name, r.to_json_line()));
            }
            Err(e) => {
                debug!(file = name, error = %e, "forwarded batch not answered now; left in new/")
            }
        }
    }
    let files: Vec<(&str, &[u8])> = answered.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    sh.engine.answer_files(&files, false)?;
    if files.len() > 1 {
        let stats = &sh.engine.stats;
        stats.file_groups.fetch_add(1, Ordering::Relaxed);
        (stats.files_in_groups).fetch_add(files.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Spool files to their results as one group; invalid ones quarantined first, one by one.
fn process_group(sh: &Shared, names: &[String]) -> Result<(), EngineError> {
    if let Some(cl) = sh.forwarding() {
        return forward_group(sh, cl, names);
    }
    let mut batches = Vec::with_capacity(names.len());
    for name in names {
        match read(sh, name) {
            Read::Gone => {}
            Read::Invalid(inv) => quarantine(sh, name, &inv)?,
            Read::Batch(b) => batches.push((b, name.as_str())),
        }
    }
    let items: Vec<(&batch::Batch, &str)> = batches.iter().map(|(b, n)| (b, *n)).collect();
    if items.is_empty() {
        return Ok(());
    }
    let r = sh.engine.submit(&items, Deliver::Files);
    if r.is_ok() && items.len() > 1 {
        let stats = &sh.engine.stats;
        stats.file_groups.fetch_add(1, Ordering::Relaxed);
        stats
            .files_in_groups
            .fetch_add(items.len() as u64, Ordering::Relaxed);
    }
    settled(&names.join(", "), r)
}

/// The engine's answer for `files`: done, left for later (a pause: the files stay in
/// `new/`, and the loop rescans once intake resumes), or a failure that stops the loop.
fn settled(files: &str, r: Result<Vec<BatchResult>, EngineError>) -> Result<(), EngineError> {
    match r {
        Ok(rs) => {
            for r in rs {
                debug!(files, status = ?r.status(), lsn = r.lsn(), "batch done");
            }
            Ok(())
        }
        Err(e) if e.latches_nothing() => {
            debug!(files, error = %e, "batches left in new/ (or claimed, unanswered)");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

//! File-system events on `new/` as hints: they name the files that arrived. A full channel,
//! or an event that names nothing usable (the kernel's queue overflowed, an error, a name that
//! is not UTF-8), asks for a rescan, as does the timer: a rescan of `new/` is the truth.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, Notify};
use tracing::warn;

/// Event hints queued between the watcher and the loop; past this, a rescan instead.
const EVENTS_MAX: usize = 4096;

/// The names a file-system event says arrived in `new/`: `Some(name)` per file created or
/// moved in, `None` when the event may have lost arrivals (the kernel's queue overflowed, an
/// error, a name that is not UTF-8) and only a rescan can tell. Removals and changes are not
/// arrivals (the daemon's own removals from `new/` would otherwise wake it once per batch).
pub(crate) fn arrivals(res: notify::Result<notify::Event>) -> Vec<Option<String>> {
    use notify::event::{EventKind, ModifyKind, RenameMode};
    let Ok(ev) = res else {
        return vec![None];
    };
    if ev.need_rescan() {
        return vec![None];
    }
    let paths = match ev.kind {
        EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => &ev.paths[..],
        // Source and target: only the target arrived.
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            &ev.paths[ev.paths.len().saturating_sub(1)..]
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::Any))
        | EventKind::Any
        | EventKind::Other => return vec![None],
        _ => return Vec::new(),
    };
    paths
        .iter()
        .map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
        .collect()
}

/// The watcher on `new/` and what it hands the loop.
pub(crate) struct Hints {
    dir: PathBuf,
    /// Names that arrived, in order.
    pub events: mpsc::Receiver<String>,
    /// Set when only a rescan can tell what arrived (and by the timer).
    pub rescan_needed: Arc<AtomicBool>,
    /// Woken when the watcher set `rescan_needed`.
    pub lost_events: Arc<Notify>,
    /// Dropping it stops the watcher. Its callback holds nothing of the engine's (which must
    /// be gone, with its lock, when serve returns, though the watcher's thread may outlive
    /// the loop by a moment).
    _watcher: Option<notify::RecommendedWatcher>,
}

impl Hints {
    /// Watches `dir`; without a watcher, the loop relies on rescans. A rescan is due first.
    pub fn watch(dir: &Path) -> Hints {
        let (tx, events) = mpsc::channel::<String>(EVENTS_MAX);
        let rescan_needed = Arc::new(AtomicBool::new(true));
        let lost_events = Arc::new(Notify::new());
        let (rescan, wake) = (rescan_needed.clone(), lost_events.clone());
        let callback = move |res: notify::Result<notify::Event>| {
            for hint in arrivals(res) {
                let sent = hint.is_some_and(|name| tx.try_send(name).is_ok());
                if !sent {
                    rescan.store(true, Ordering::SeqCst);
                    wake.notify_one();
                }
            }
        };
        Hints {
            dir: dir.to_path_buf(),
            events,
            rescan_needed,
            lost_events,
            _watcher: start_watcher(dir, callback),
        }
    }

    /// Every name the hints and, when due, a rescan of `new/` offer now (unfiltered).
    pub fn drain(&mut self, names: &mut Vec<String>) -> std::io::Result<()> {
        while let Ok(name) = self.events.try_recv() {
            names.push(name);
        }
        if self.rescan_needed.swap(false, Ordering::SeqCst) {
            for e in std::fs::read_dir(&self.dir)?.flatten() {
                if let Some(n) = e.file_name().to_str() {
                    names.push(n.to_owned());
                }
            }
        }
        Ok(())
    }
}

fn start_watcher(
    dir: &Path,
    callback: impl notify::EventHandler,
) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let mut w = match notify::recommended_watcher(callback) {
        Ok(w) => w,
        Err(e) => {
            warn!(error = %e, "no file watcher; relying on rescans");
            return None;
        }
    };
    match w.watch(dir, notify::RecursiveMode::NonRecursive) {
        Ok(()) => Some(w),
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot watch spool; relying on rescans");
            None
        }
    }
}

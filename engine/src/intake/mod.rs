//! Every way a batch arrives, and the state the serve loop shares with them (`Shared`):
//!
//! - `events`: file-system hints (inotify) and the rescans that are the truth.
//! - `worker`: one spool file (or a group found together) to its result, through
//!   `Engine::submit` with `Deliver::Files`; a cluster standby's files forwarded.
//! - `invalid_files`: an invalid file's `invalid` answer and its move to `failed/`.
//! - `bulk_lines`: a bulk file's lines, limits, parse, claim sources and result lines (no
//!   engine); `bulk_files`: a bulk file's lines through the engine in groups, its result.
//! - `stream_protocol`: the stream socket's place, line framing, answer shapes (shared with
//!   `roost submit --stream`); `stream_socket`: the listener, per connection a reader and a
//!   writer, answers handed over early (`Deliver::Early`).

pub mod bulk_files;
pub mod bulk_lines;
pub mod events;
mod invalid_files;
mod stream_gather;
pub mod stream_protocol;
pub mod stream_socket;
pub mod worker;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::error::EngineError;
use crate::pipeline::Engine;
use crate::spool::FailedDir;

/// Shared between the loop and its workers.
pub(crate) struct Shared {
    pub(crate) engine: Arc<Engine>,
    /// The engine's replication state (`crate::replica`).
    pub(crate) repl: Arc<crate::replica::Replication>,
    /// Names being processed (a rescan must not start a second worker on one).
    pub(crate) in_progress: Mutex<HashSet<String>>,
    /// Names that arrived again while in progress (a client reusing a name right after its
    /// answer): looked at again as soon as their worker is done, not at the next rescan.
    pub(crate) again: Mutex<HashSet<String>>,
    /// Names to look at again, handed back to the loop by finishing workers.
    pub(crate) requeue: Mutex<Vec<String>>,
    /// Names that could not even be quarantined (logged once, then left alone).
    pub(crate) stuck: Mutex<HashSet<String>>,
    pub(crate) fatal: Mutex<Option<EngineError>>,
    pub(crate) failed: Mutex<FailedDir>,
    pub(crate) stop: AtomicBool,
    pub(crate) wake: Notify,
    /// A checkpoint runs on the blocking pool now.
    pub(crate) checkpointing: AtomicBool,
    /// The claims left for intake's opening are being finished now.
    pub(crate) finishing: AtomicBool,
    /// An idle primary's WAL tail is being synced now (`maybe_sync_tail`).
    pub(crate) syncing_tail: AtomicBool,
    /// A durability round runs on the blocking pool now (`maybe_settle`).
    pub(crate) settling: AtomicBool,
    /// Bulk files being worked on now (`bulk.rs`, at most `bulk_files_in_flight_max`).
    pub(crate) bulk_files: AtomicUsize,
    /// Bulk files that found no place, requeued when one frees (`bulk.rs`).
    pub(crate) bulk_waiting: Mutex<Vec<String>>,
    /// `[cluster]`: etcd, the leader, forwarding (`crate::cluster`).
    pub(crate) cluster: Option<Arc<crate::cluster::Cluster>>,
    /// This life of a cluster node ends to start again as a follower (fenced, or its
    /// follower must cut its log first): see [`Ended`].
    pub(crate) rejoin: AtomicBool,
    /// True once this life ends (a stop, a failure, a rejoin): a wait of its own that
    /// depends on others (a forward to the leader) gives up at once (`end_life`).
    pub(crate) ending: tokio::sync::watch::Sender<bool>,
}

/// Clears its flag when dropped (a task's "running" mark, also on an early return).
pub(crate) struct ClearOnDrop<'a>(pub(crate) &'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Shared {
    pub(crate) fn new(node: crate::replica::Node) -> Result<Arc<Shared>, EngineError> {
        let crate::replica::Node { engine, repl } = node;
        let failed = FailedDir::load(
            engine.storage().clone(),
            &engine.spool().failed,
            &engine.spool().out,
        );
        let cluster = crate::cluster::Cluster::new(engine.config())?;
        Ok(Arc::new(Shared {
            engine,
            repl,
            in_progress: Mutex::new(HashSet::new()),
            again: Mutex::new(HashSet::new()),
            requeue: Mutex::new(Vec::new()),
            stuck: Mutex::new(HashSet::new()),
            fatal: Mutex::new(None),
            failed: Mutex::new(failed),
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            checkpointing: AtomicBool::new(false),
            finishing: AtomicBool::new(false),
            syncing_tail: AtomicBool::new(false),
            settling: AtomicBool::new(false),
            bulk_files: AtomicUsize::new(0),
            bulk_waiting: Mutex::new(Vec::new()),
            cluster,
            rejoin: AtomicBool::new(false),
            ending: tokio::sync::watch::Sender::new(false),
        }))
    }

    /// The cluster, while this node is a cluster standby (its intake forwards).
    pub(crate) fn forwarding(&self) -> Option<&Arc<crate::cluster::Cluster>> {
        let standby = self.engine.role() == crate::pipeline::Role::Standby;
        self.cluster.as_ref().filter(|_| standby)
    }

    /// What a forward to the leader needs of this node (`cluster/forward.rs`).
    pub(crate) fn here(&self) -> crate::cluster::forward::Here<'_> {
        crate::cluster::forward::Here {
            engine: &self.engine,
            ending: self.ending.subscribe(),
            durable: self.repl.durable_watch(),
        }
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// A pipeline failure: kept for the exit code (the first one wins); the loop stops.
    pub(crate) fn stop_on(&self, e: EngineError) {
        if let Ok(mut f) = self.fatal.lock() {
            f.get_or_insert(e);
        }
        self.end_life();
    }

    /// This life stops taking work: the loop stops, and forwards waiting for the leader
    /// give up at once (their spool files stay in `new/`, stream lines are answered
    /// `unavailable`): a stop or a rejoin never waits on the cluster (issue 42).
    pub(crate) fn end_life(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.ending.send_replace(true);
        self.wake.notify_one();
    }

    /// A cluster node's life ends to start again as a follower (`Ended::Rejoin`).
    pub(crate) fn rejoin(&self) {
        self.rejoin.store(true, Ordering::SeqCst);
        self.ending.send_replace(true);
        self.wake.notify_one();
    }
}

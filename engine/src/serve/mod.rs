//! `roost serve`: the async shell around the engine. It watches `new/` (notify events name
//! the files that arrived and are only hints; a full rescan at start-up, every
//! `rescan_interval_ms`, and whenever an event may have been lost is the truth), runs
//! each file on a bounded pool of blocking workers (the engine blocks on fsync), and stops
//! in three steps on SIGTERM/SIGINT: stop taking files, let in-flight batches finish, return.

//!
//! Files: `events` (file-system hints and rescans), `worker` (one file to its result, the
//! quarantine), `bulk` (a bulk file's lines to its result), `sidecars` (control socket,
//! metrics, the systemd ticker), `stream` (the streaming intake's socket).

mod handover;
pub use handover::SWITCHOVER_WAIT;
mod sidecars;
pub mod signals;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Interval;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::error::EngineError;
use crate::intake::events::Hints;
use crate::intake::{stream_socket as stream, worker, ClearOnDrop, Shared};
use crate::pipeline::Engine;
use crate::replica::tasks::{FollowerEnd, Host, ReplTasks};
use crate::replica::Node;
use crate::spool;
use sidecars::Sidecars;
use signals::StopRequest;

/// How a serve ended without a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Asked to stop (SIGTERM, SIGINT, the embedding program).
    Stopped,
    /// A cluster node's life ended: it was fenced, or its follower must cut its log
    /// before following again. The caller opens the data directory again as a follower.
    Rejoin,
}

/// Runs until SIGTERM/SIGINT (Ok) or a pipeline failure (Err, after in-flight work settles).
pub fn serve(node: Node) -> Result<(), EngineError> {
    serve_until(node, Arc::new(Notify::new())).map(|_| ())
}

/// [`serve`], also stopping (the same graceful way) when `stop` is notified: for embedding
/// the daemon in another program, such as the benchmark.
pub fn serve_until(node: Node, stop: Arc<Notify>) -> Result<Ended, EngineError> {
    let engine = &node.engine;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(blocking_threads(engine.config()))
        .enable_all()
        .build()
        .map_err(|source| EngineError::Io {
            op: "start runtime",
            path: engine.config().data_dir.clone(),
            source,
        })?;
    rt.block_on(serve_async(node, stop))
}

/// Blocking threads beyond the bounded intake: a standby's fetches and acknowledgements
/// (`replication`), checkpoints, resume, promotion. They must never queue behind intake: under
/// `ack = "standby"` every intake thread may be waiting for the very acknowledgement that
/// would come on one of these.
const BLOCKING_SLACK: usize = 16;

/// The runtime's blocking pool: a thread for every spool worker and bulk file
/// (`batches_in_flight_max`, `bulk_files_in_flight_max`), for every streamed group
/// (`stream_batches_running_max`: a group of one line takes a thread), and the slack.
/// Threads are made on demand.
fn blocking_threads(cfg: &crate::config::Config) -> usize {
    cfg.batches_in_flight_max
        .saturating_add(cfg.bulk_files_in_flight_max)
        .saturating_add(cfg.stream_batches_running())
        .saturating_add(BLOCKING_SLACK)
}

/// A standby's `new/` is closed: files there wait, and are applied if this node is
/// promoted. Files a node kept from before it was demoted may have been sent again to the
/// new primary meanwhile; past `request_key_window_secs` such a file would become a second
/// batch (issue 27), so the operator is told how many wait and which is the oldest.
fn warn_waiting_files(new_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(new_dir) else {
        return;
    };
    let names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| spool::valid_spool_name(n))
        .collect();
    if let Some(first) = names.iter().min() {
        warn!(
            files = names.len(),
            first = %first,
            spool = %new_dir.display(),
            "standby: files wait in new/ and will be applied if this node is promoted; remove any already sent to the primary (past request_key_window_secs a file sent twice is two batches)"
        );
    }
}

async fn serve_async(node: Node, stop: Arc<Notify>) -> Result<Ended, EngineError> {
    let cfg = node.engine.config().clone();
    let workers = cfg.batches_in_flight_max;
    let new_dir = node.engine.spool().new.clone();
    let shared = Shared::new(node.clone())?;
    let mut passes = Passes::start(&cfg, &new_dir)?;
    let sidecars = Sidecars::start(&cfg, &node, shared.cluster.clone());
    let mut repl = match ReplTasks::start(repl_host(&shared)).await {
        Ok(r) => r,
        Err(e) => {
            sidecars.stop();
            return Err(e);
        }
    };
    let stream = stream::Stream::start(&shared);
    let role = shared.engine.role();
    info!(spool = %new_dir.display(), workers, socket = %sidecars.socket.display(), role = role.name(), epoch = shared.repl.epoch_shown(), "serving");
    if role == crate::pipeline::Role::Standby && shared.cluster.is_none() {
        warn_waiting_files(&new_dir);
    }
    let agent = shared
        .cluster
        .as_ref()
        .map(|c| c.start(shared.engine.clone(), shared.repl.clone()));
    let mut track = Track {
        was_standby: role == crate::pipeline::Role::Standby,
        following: None,
    };
    passes.run(&shared, &stop, &mut repl, &mut track).await;
    let mut agent = AgentStop {
        cluster: shared.cluster.clone(),
        task: agent,
    };
    // Only a leader keeps its lease through the stop's first steps (`hand_over`); any
    // other node gives it up now, so a stopping node never campaigns.
    if shared.engine.role() != crate::pipeline::Role::Primary {
        agent = agent.stop().await;
    }
    shutdown(
        &shared,
        &passes.sem,
        workers,
        (sidecars, repl, stream),
        agent,
    )
    .await?;
    Ok(match shared.rejoin.load(Ordering::SeqCst) {
        true => Ended::Rejoin,
        false => Ended::Stopped,
    })
}

/// What the serve loop's passes run with: the hints from `new/`, the signals, the timers and
/// the workers' permits.
struct Passes {
    new_dir: PathBuf,
    hints: Hints,
    /// SIGTERM and SIGINT, for the whole process (`signals.rs`).
    signals: &'static StopRequest,
    /// The rescan timer (`rescan_interval_ms`).
    tick: Interval,
    /// Answered batches wait about `tail_round_ms` (at most twice it) for their round,
    /// however quiet the spool is (`maybe_settle`).
    settle_tick: Interval,
    /// One permit per batch in flight (`batches_in_flight_max`).
    sem: Arc<Semaphore>,
    /// When a paused intake last tried to resume.
    resume_tried: Instant,
}

impl Passes {
    fn start(cfg: &Config, new_dir: &Path) -> Result<Passes, EngineError> {
        let hints = Hints::watch(new_dir);
        let stop = signals::install().map_err(|source| EngineError::Io {
            op: "install signal handler",
            path: new_dir.to_path_buf(),
            source,
        })?;
        stop.enter(signals::Phase::Serving);
        let timer = |every: Duration| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        };
        Ok(Passes {
            new_dir: new_dir.to_path_buf(),
            hints,
            signals: stop,
            tick: timer(cfg.rescan_interval()),
            settle_tick: timer(cfg.tail_round()),
            sem: Arc::new(Semaphore::new(cfg.batches_in_flight_max)),
            resume_tried: Instant::now(),
        })
    }

    /// Passes until a stop: each takes the names that arrived (and, when due, a rescan's)
    /// to the workers, after the upkeep between passes (`between_passes`).
    async fn run(
        &mut self,
        shared: &Arc<Shared>,
        stop: &Notify,
        repl: &mut ReplTasks,
        track: &mut Track,
    ) {
        while let Some(mut names) = self.next(shared, stop).await {
            if shared.stopping() || !between_passes(shared, repl, track, &self.hints).await {
                break;
            }
            if let Ok(mut q) = shared.requeue.lock() {
                names.append(&mut q);
            }
            if !intake_open(shared, &mut self.resume_tried).await {
                // Paused: the files stay in new/; a rescan finds them once intake resumes.
                self.hints.rescan_needed.store(true, Ordering::SeqCst);
                continue;
            }
            if let Err(e) = self.hints.drain(&mut names) {
                warn!(dir = %self.new_dir.display(), error = %e, "cannot list spool");
                continue;
            }
            dispatch(shared, names, &self.sem, self.signals).await;
            if shared.stopping() {
                break;
            }
        }
    }

    /// Waits for the next reason to look at the spool: the names an event brought (maybe
    /// none); `None` when asked to stop.
    async fn next(&mut self, shared: &Shared, stop: &Notify) -> Option<Vec<String>> {
        let mut names: Vec<String> = Vec::new();
        tokio::select! {
            _ = stop.notified() => { info!("asked to stop"); return None; }
            _ = self.signals.wait() => return None,
            _ = shared.wake.notified() => {}
            _ = cluster_changed(shared) => {}
            _ = self.hints.lost_events.notified() => {}
            Some(name) = self.hints.events.recv() => names.push(name),
            _ = self.tick.tick() => self.hints.rescan_needed.store(true, Ordering::SeqCst),
            _ = self.settle_tick.tick() => {}
        }
        Some(names)
    }
}

/// What the loop remembers of the node's role between passes.
struct Track {
    /// A standby at the last pass (a promotion is acted on once).
    was_standby: bool,
    /// The leader a cluster standby's follower follows now.
    following: Option<String>,
}

/// What the replication tasks (`replica/tasks.rs`) need of this loop: the engine, whether
/// this is a cluster node, and how a follower's end reaches the loop (a rejoin, or a stop
/// with the error's class).
fn repl_host(shared: &Arc<Shared>) -> Host {
    let me = shared.clone();
    Host {
        engine: shared.engine.clone(),
        repl: shared.repl.clone(),
        clustered: shared.cluster.is_some(),
        ended: Arc::new(move |end| match end {
            FollowerEnd::Rejoin => me.rejoin(),
            FollowerEnd::Fatal(e) => me.stop_on(e),
        }),
    }
}

/// Between waking and taking files: a checkpoint when due, a promotion's follow-up, the
/// cluster's leader, the follower's figures for status, claims left for intake's opening,
/// an idle WAL tail. `false`: this life ends (a cluster node rejoins as a follower).
async fn between_passes(
    shared: &Arc<Shared>,
    repl: &mut ReplTasks,
    track: &mut Track,
    hints: &Hints,
) -> bool {
    maybe_checkpoint(shared);
    if track.was_standby && shared.engine.role() == crate::pipeline::Role::Primary {
        track.was_standby = false;
        repl.promoted();
        hints.rescan_needed.store(true, Ordering::SeqCst);
    }
    if !follow_the_cluster(shared, repl, &mut track.following).await {
        return false;
    }
    // Only a node that follows (or followed) a leader has a link to show: a primary that
    // never was a standby shows none (its status said "following : disconnected").
    if shared.engine.role() == crate::pipeline::Role::Standby
        || shared.repl.follow_status().is_some()
    {
        let seen = repl.status.snapshot();
        shared.repl.update_follow_status(|f| {
            f.connected = seen.connected;
            f.leader_epoch = seen.leader_epoch;
        });
    }
    maybe_finish_claims(shared);
    maybe_settle(shared);
    maybe_sync_tail(shared);
    true
}

/// Resolves when the cluster agent has news for the loop (never without a cluster).
async fn cluster_changed(shared: &Shared) {
    match &shared.cluster {
        Some(c) => c.changed().notified().await,
        None => std::future::pending().await,
    }
}

/// A cluster node's part of each pass: a standby follows whom etcd names (re-pointing its
/// follower when that changes); a fenced leader ends this life to rejoin as a follower
/// (`false`: the loop stops, and `serve_until` returns [`Ended::Rejoin`]).
async fn follow_the_cluster(
    shared: &Arc<Shared>,
    repl: &mut ReplTasks,
    following: &mut Option<String>,
) -> bool {
    let Some(cl) = &shared.cluster else {
        return true;
    };
    match shared.engine.role() {
        crate::pipeline::Role::SteppedDown { .. } => {
            info!("cluster: this node no longer leads; rejoining as a follower");
            shared.rejoin();
            false
        }
        crate::pipeline::Role::Standby => {
            let leader = cl.leader_addr();
            if leader.is_some() && leader != *following {
                if let Some(addr) = &leader {
                    repl.follow_at(addr.clone()).await;
                }
                *following = leader;
            }
            !shared.rejoin.load(Ordering::SeqCst)
        }
        crate::pipeline::Role::Primary => match handover::switchover_asked(shared) {
            Some(to) => {
                info!(to = %to, "cluster: switchover: this leader takes no more batches, finishes those in flight and hands over");
                shared.rejoin();
                false
            }
            None => true,
        },
    }
}

/// Whether intake is open. While it is paused for want of disk space (`pipeline/room.rs`),
/// tries at most once a second to make the missing spare segments; a failure to make one
/// that is not a full disk stops the daemon like any I/O failure.
async fn intake_open(shared: &Arc<Shared>, last_try: &mut Instant) -> bool {
    let e = &shared.engine;
    if let Some(cl) = shared.forwarding() {
        return cl.leader_addr().is_some(); // a cluster standby forwards to the leader
    }
    if e.role() != crate::pipeline::Role::Primary || e.standby().deferred_claims() > 0 {
        return false; // a standby's spool is closed; claims left over are finished first
    }
    if shared.engine.room().paused().is_none() {
        return true;
    }
    if last_try.elapsed() < RESUME_EVERY {
        return false;
    }
    *last_try = Instant::now();
    let engine = shared.engine.clone();
    let r = tokio::task::spawn_blocking(move || engine.room().try_resume()).await;
    match r {
        Ok(Ok(open)) => open,
        Ok(Err(e)) => {
            error!(error = %e, "cannot make a spare segment: stopping");
            shared.stop_on(e);
            false
        }
        Err(e) => {
            error!(error = %e, "resume task failed");
            false
        }
    }
}

/// Starts a checkpoint on the blocking pool when one is due and none runs (`checkpoint.rs`);
/// a failed checkpoint stops the daemon like any I/O failure.
fn maybe_checkpoint(shared: &Arc<Shared>) {
    if shared.checkpointing.load(Ordering::SeqCst)
        || !shared.engine.checkpoint_due()
        || shared.checkpointing.swap(true, Ordering::SeqCst)
    {
        return;
    }
    in_background(
        shared,
        |sh| &sh.checkpointing,
        "checkpoint",
        |e| e.checkpoint().map(|_| ()),
    );
}

/// Starts finishing the claims left for intake's opening (recovery's under
/// `ack = "standby"`, a promoted standby's) on the blocking pool; intake opens once they
/// are finished. Giving up because the node stops is not a failure: they stay claimed.
fn maybe_finish_claims(shared: &Arc<Shared>) {
    if shared.engine.role() != crate::pipeline::Role::Primary
        || shared.engine.standby().deferred_claims() == 0
        || shared.finishing.swap(true, Ordering::SeqCst)
    {
        return;
    }
    let sh = shared.clone();
    tokio::task::spawn_blocking(move || {
        match sh.engine.finish_deferred() {
            Ok(n) => info!(batches = n, "claimed batches finished; intake opens"),
            Err(e) if e.latches_nothing() => {
                info!(error = %e, "claimed batches left for the next start")
            }
            Err(e) => {
                error!(error = %e, "finishing claimed batches failed: stopping");
                sh.stop_on(e);
            }
        }
        sh.finishing.store(false, Ordering::SeqCst);
        sh.wake.notify_one();
    });
}

/// Runs a durability round on the blocking pool once answered batches have waited
/// `tail_round_ms` for one (`pipeline/settle.rs`): a quiet daemon still closes them.
fn maybe_settle(shared: &Arc<Shared>) {
    if !shared.engine.settle_due() || shared.settling.swap(true, Ordering::SeqCst) {
        return;
    }
    in_background(
        shared,
        |sh| &sh.settling,
        "durability round",
        |e| e.settle().map(|_| ()),
    );
}

/// A primary serving standbys makes its WAL's unsynced tail (the lazily written `done`
/// records) durable once it is quiet, so its standby gets them too: only durable records
/// are sent. Under load the next claim's group commit does it; this adds no sync there.
fn maybe_sync_tail(shared: &Arc<Shared>) {
    let e = &shared.engine;
    if e.config().replication.listen.is_none()
        || e.role() != crate::pipeline::Role::Primary
        || shared.repl.durable_end() >= e.wal().next_lsn()
        || e.stats.in_flight.load(Ordering::Relaxed) > 0
        || shared.checkpointing.load(Ordering::SeqCst)
        || shared.syncing_tail.swap(true, Ordering::SeqCst)
    {
        return;
    }
    in_background(shared, |sh| &sh.syncing_tail, "wal sync", Engine::sync);
}

/// Runs `work` on the blocking pool; `busy` (set by the caller) is cleared when it ends. A
/// failure (`what` names it) stops the daemon like any I/O failure.
fn in_background(
    shared: &Arc<Shared>,
    busy: fn(&Shared) -> &AtomicBool,
    what: &'static str,
    work: fn(&Engine) -> Result<(), EngineError>,
) {
    let sh = shared.clone();
    tokio::task::spawn_blocking(move || {
        let _done = ClearOnDrop(busy(&sh));
        if let Err(e) = work(&sh.engine) {
            error!(error = %e, "{what} failed: stopping");
            sh.stop_on(e);
        }
    });
}

/// At a graceful stop, how long stream clients get to read their last answers.
const STREAM_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// At a stop, how long answers waiting for a standby's acknowledgement are waited for, at
/// most (`standby_timeout_ms` when shorter). Their batches stay claimed and are finished
/// at the next start; with [`STREAM_CLOSE_GRACE`] and the last checkpoint, a stop ends
/// within 5 s in every state (issue 42).
pub const STANDBY_GRACE_AT_STOP: Duration = Duration::from_secs(2);

/// How often a paused intake tries to make the missing spare segments again.
const RESUME_EVERY: Duration = Duration::from_secs(1);

/// Starts workers for the names that are batches and not already in progress (a name in
/// progress is looked at again when its worker is done): a bulk file alone, the other files
/// in groups of at most `spool_group_files` (`worker::spawn_group`; one file when only one
/// came, as under light load). Bounded: one permit per file, so at most
/// `batches_in_flight_max` files are in flight; waits for permits, but keeps answering
/// signals.
async fn dispatch(
    shared: &Arc<Shared>,
    names: Vec<String>,
    sem: &Arc<Semaphore>,
    sig: &StopRequest,
) {
    let mut files = Vec::new();
    for name in names {
        if !spool::valid_spool_name(&name) || shared.stuck.lock().is_ok_and(|s| s.contains(&name)) {
            continue;
        }
        if !shared
            .in_progress
            .lock()
            .is_ok_and(|mut s| s.insert(name.clone()))
        {
            shared.again.lock().map(|mut s| s.insert(name)).ok();
            continue;
        }
        if !crate::intake::bulk_lines::is_bulk_name(&name) {
            files.push(name);
            continue;
        }
        let Some(permit) = permits(shared, sem, sig, 1).await else {
            return;
        };
        worker::spawn(shared.clone(), name, permit);
    }
    let cfg = shared.engine.config();
    let most = cfg.spool_group_files.min(cfg.batches_in_flight_max).max(1);
    let groups = files.len().div_ceil(most);
    let size = files.len().div_ceil(groups.max(1)).max(1);
    let mut files = files.into_iter().peekable();
    while files.peek().is_some() {
        let group: Vec<String> = files.by_ref().take(size).collect();
        let Some(permit) = permits(shared, sem, sig, group.len() as u32).await else {
            return;
        };
        worker::spawn_group(shared.clone(), group, permit);
    }
}

/// `n` worker permits, or `None` when a signal (or a closed semaphore) says stop.
async fn permits(
    shared: &Arc<Shared>,
    sem: &Arc<Semaphore>,
    sig: &StopRequest,
    n: u32,
) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        p = sem.clone().acquire_many_owned(n) => p.ok(),
        _ = sig.wait() => { shared.end_life(); None }
    }
}

/// The cluster agent of this life, stopped (its lease revoked) during the graceful stop.
struct AgentStop {
    cluster: Option<Arc<crate::cluster::Cluster>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl AgentStop {
    /// Stops the agent; bounded: a stop never waits long on etcd (the lease expires by
    /// itself).
    async fn stop(self) -> AgentStop {
        if let (Some(c), Some(task)) = (&self.cluster, self.task) {
            c.stop();
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
        AgentStop {
            cluster: self.cluster,
            task: None,
        }
    }
}

/// The graceful stop: take no more files nor streamed lines, wait for every in-flight batch
/// to reach its result (or fail), make the lazily written done records durable, let a
/// cluster leader's in-sync standbys fetch them (`hand_over`), then give up the lease and
/// stop replication and the sidecars.
async fn shutdown(
    shared: &Arc<Shared>,
    sem: &Arc<Semaphore>,
    workers: usize,
    (sidecars, repl, stream): (Sidecars, ReplTasks, stream::Stream),
    agent: AgentStop,
) -> Result<(), EngineError> {
    shared.repl.begin_draining();
    shared.end_life();
    stream.stop_reading();
    let in_flight = workers - sem.available_permits() + stream.running();
    crate::control::notify::stopping(&format!(
        "stopping: waiting for {in_flight} in-flight batches"
    ));
    info!(in_flight, "waiting for in-flight batches");
    // Standbys are still served: answers waiting for one get `standby_timeout_ms` (at most
    // STANDBY_GRACE_AT_STOP) to be acknowledged, then give up (their batches stay claimed
    // for the next start).
    let grace = (shared.engine.config().replication.standby_timeout()).min(STANDBY_GRACE_AT_STOP);
    let settled = async { (sem.acquire_many(workers as u32).await, stream.idle().await) };
    let all = match tokio::time::timeout(grace, settled).await {
        Ok(all) => all,
        Err(_) => {
            shared.repl.stop_waiting_for_standby();
            (sem.acquire_many(workers as u32).await, stream.idle().await)
        }
    };
    shared.repl.stop_waiting_for_standby();
    let _all = all;
    last_checkpoint(shared).await;
    handover::hand_over(shared).await;
    agent.stop().await;
    repl.stop().await;
    stream.close(STREAM_CLOSE_GRACE).await;
    sidecars.stop();
    let fatal = shared.fatal.lock().ok().and_then(|mut f| f.take());
    match fatal {
        Some(e) => Err(e),
        None => {
            info!("stopped cleanly");
            Ok(())
        }
    }
}

/// The last checkpoint: the next start replays nothing (it also syncs the WAL). A failure
/// is kept for the exit code.
async fn last_checkpoint(shared: &Arc<Shared>) {
    let engine = shared.engine.clone();
    let last = tokio::task::spawn_blocking(move || {
        let checkpoint = if engine.is_failed() {
            Ok(())
        } else {
            engine.checkpoint().map(|_| ())
        };
        checkpoint.and_then(|()| engine.sync())
    })
    .await;
    let last = last.unwrap_or_else(|e| {
        Err(EngineError::Io {
            op: "final checkpoint",
            path: shared.engine.config().data_dir.clone(),
            source: std::io::Error::other(e.to_string()),
        })
    });
    if let Err(e) = last {
        warn!(error = %e, "final checkpoint or wal sync failed");
        if let Ok(mut f) = shared.fatal.lock() {
            f.get_or_insert(e);
        }
    }
}

#[cfg(test)]
mod serve_tests;

//! `roost serve`: refuse a data directory others could write, recover (with a progress bar
//! in a terminal and STATUS= for systemd), then hand the engine to the async serve loop.
//! Failures keep their class: a corrupt WAL or shard exits 65, a locked directory 75.

use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use roost_storage::RealStorage;

use crate::config::{Config, ConfigError};
use crate::control::notify;
use crate::error::EXIT_OK;
use crate::layout::{AUDIT_DIR, SHARDS_DIR, WAL_DIR};
use crate::pipeline::EngineOptions;
use crate::replica::Node;
use crate::serve::signals::{self, Phase};

pub(super) fn serve(cfg: Config) -> anyhow::Result<i32> {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(cfg.umask));
    // SIGTERM and SIGINT from here on: before the first life serves, a stop exits at once.
    let stop = signals::install().context("installing the SIGTERM and SIGINT handler")?;
    stop.enter(Phase::Between("starting"));
    check_permissions(&cfg.data_dir)?;
    // The metrics listener's TLS files and users, checked before recovery: a bad file is a
    // configuration error (exit 78) now, not a warning once the node serves.
    crate::control::http::web::Web::load(&cfg)?;
    let crash = crate::pipeline::crash::EnvCrash::from_env()
        .map_err(|e| ConfigError::Invalid(format!("ROOST_CRASH_AT: {e}")))?;
    // A re-seed a stop interrupted is finished (or its partial download removed) before
    // anything opens the data directory, whatever the role now.
    crate::replica::reseed::resume(&cfg)?;
    let crash = Arc::new(crash);
    if cfg.clustered() {
        return serve_cluster(cfg, crash);
    }
    if cfg.replication.is_standby() {
        notify::status("standby: reconciling with the primary");
        stop.enter(Phase::Between("reconciling with the primary"));
        standby_start(&cfg)?;
    } else if cfg.replication.enabled() {
        // A former standby started as primary: effects it applied past its WAL's end (a
        // crash mid-chunk) must go before it claims anything at those lsns. A primary that
        // led the last epoch it knows was no standby since: nothing to look for.
        let cutter = crate::replica::cut::Cutter::open(&cfg)?;
        if !cutter.led_last_epoch() {
            cutter.cut_past_end()?;
        }
    }
    let node = open(cfg, crash)?;
    crate::serve::serve(node).context("serving")?;
    Ok(EXIT_OK)
}

/// Recovery with a progress bar and STATUS= for systemd.
fn open(cfg: Config, crash: Arc<crate::pipeline::crash::EnvCrash>) -> anyhow::Result<Node> {
    let data_dir = cfg.data_dir.clone();
    notify::status("recovering: opening the data directory");
    if let Ok(stop) = signals::install() {
        stop.enter(Phase::Between("recovering"));
    }
    let progress = RecoveryProgress::new();
    let node = Node::open(
        EngineOptions {
            storage: RealStorage::shared(),
            config: Arc::new(cfg),
            crash,
            log_role: Arc::new(crate::replica::Opener::default()),
        },
        &|phase: &str, done: u64, total: u64| progress.report(phase, done, total),
    )
    .inspect_err(|e| notify::status(&format!("failed: {e}")))
    .with_context(|| format!("opening data directory {}", data_dir.display()))?;
    progress.finish();
    Ok(node)
}

/// A cluster node (issue 27, docs/cluster.md): each life starts as a follower of whoever
/// etcd names (reconciled with it, cut or re-seeded as a standby started by hand is), and
/// ends when the node stops (exit) or must start again as a follower (fenced, or its log
/// must be cut first): then the data directory is opened again, in the same process.
fn serve_cluster(cfg: Config, crash: Arc<crate::pipeline::crash::EnvCrash>) -> anyhow::Result<i32> {
    use crate::serve::Ended;
    let signal = signals::install().context("installing the SIGTERM and SIGINT handler")?;
    loop {
        notify::status("cluster: joining as a follower");
        signal.enter(Phase::Between("joining the cluster as a follower"));
        tracing::info!("cluster: joining as a follower");
        join_cluster(&cfg)?;
        let node = open(cfg.clone(), crash.clone())?;
        let stop = Arc::new(tokio::sync::Notify::new());
        match crate::serve::serve_until(node, stop).context("serving")? {
            Ended::Stopped => return Ok(EXIT_OK),
            Ended::Rejoin => {
                // A SIGTERM that came while the life ended exits here.
                signal.enter(Phase::Between("re-opening as a follower"));
                tracing::info!("cluster: opening the data directory again as a follower");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// How many times a cluster node joins before it gives up (exit 74, and systemd starts it
/// again), while each try fails for a reason a change of leader explains; and the pause
/// between tries. About two elections: the leader etcd named a moment ago may have stepped
/// down, been fenced or gone away between the name and the answer (the cluster drill saw a
/// base backup refused with `NotLeader` that way).
const JOIN_TRIES: usize = 5;
const JOIN_PAUSE: Duration = Duration::from_secs(1);

/// Before the engine opens: [`join_cluster_once`], tried again (looking the leader up
/// again) while it fails for a reason a change of leader explains.
fn join_cluster(cfg: &Config) -> anyhow::Result<()> {
    retry_join(JOIN_TRIES, JOIN_PAUSE, || join_cluster_once(cfg))
}

/// Runs `join` at most `tries` times, `pause` apart, while it fails with
/// [`leader_may_have_changed`]; any other outcome, and the last try's, is returned.
fn retry_join(
    tries: usize,
    pause: Duration,
    mut join: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    for left in (1..tries.max(1)).rev() {
        match join() {
            Err(e) if leader_may_have_changed(&e) => {
                tracing::warn!(error = %format!("{e:#}"), tries_left = left, "cluster: following the leader failed; looking for the leader again");
                std::thread::sleep(pause);
            }
            r => return r,
        }
    }
    join()
}

/// A failure to follow the leader etcd named that a change of leader explains: what it
/// answered or did not (refused, an older epoch, gone), or a re-seed that found this node
/// still behind. A failure of this node's own disk or configuration is not one.
fn leader_may_have_changed(e: &anyhow::Error) -> bool {
    use crate::error::EngineError;
    matches!(
        e.downcast_ref::<EngineError>(),
        Some(EngineError::Replication(_) | EngineError::StaleLeader(_))
    )
}

/// One join: the leader etcd names (if any, and not this node) is the primary this node
/// reconciles with, as `serve --follow` would; with none, what a crash left past the WAL's
/// end is cut, as at any former standby's start.
fn join_cluster_once(cfg: &Config) -> anyhow::Result<()> {
    match crate::cluster::find_leader(cfg)? {
        Some(addr) => {
            let mut follower = cfg.clone();
            follower.replication.follow = Some(addr);
            standby_start(&follower)
        }
        None => {
            let cutter = crate::replica::cut::Cutter::open(cfg)?;
            cutter.cut_past_end()?;
            Ok(())
        }
    }
}

/// How long a starting standby waits for its primary to answer before it serves what it
/// holds: a standby must come up (and be promotable) while its primary is down.
const RECONCILE_WAIT: Duration = Duration::from_secs(5);

/// A standby's start-up with the engine closed (`replica::cut`): the effects past the WAL's
/// end are cut, then the reconcile phase asks the primary and cuts what diverges, repeating
/// until the logs agree. A primary that does not answer within [`RECONCILE_WAIT`] is not
/// waited for: a later diverging answer stops the standby, and its next start cuts. A
/// standby behind what the primary retains is re-seeded from its base backup (`reseed =
/// "auto"`, `replica::reseed`) and reconciles once more.
fn standby_start(cfg: &Config) -> anyhow::Result<()> {
    use crate::config::Reseed;
    let addr = cfg.replication.follow.clone().unwrap_or_default();
    match reconcile_once(cfg, &addr)? {
        None => Ok(()),
        Some((e, _)) if cfg.replication.reseed == Reseed::Manual => Err(e.into()),
        Some((_, epoch)) => {
            notify::status("standby: fetching a base backup from the primary");
            crate::replica::reseed::reseed(cfg, &addr, epoch)?;
            match reconcile_once(cfg, &addr)? {
                None => Ok(()),
                // Behind again at once (the primary retired the copied checkpoint's WAL, a
                // restart of it lost the pin): exit 74, and the restart re-seeds again.
                Some((e, _)) => Err(crate::error::EngineError::Replication(format!(
                    "still behind the primary right after a re-seed: {e}"
                ))
                .into()),
            }
        }
    }
}

/// One reconcile. `Some((the re-seed error, the epoch this node knows))` when this standby
/// is behind what the primary retains (or diverges below its own checkpoint).
fn reconcile_once(
    cfg: &Config,
    addr: &str,
) -> anyhow::Result<Option<(crate::error::EngineError, u32)>> {
    use crate::error::EngineError;
    use roost_replication::{FollowEnd, FollowError, FollowerLog};
    let cutter = Arc::new(crate::replica::cut::Cutter::open(cfg)?);
    cutter.cut_past_end()?;
    let r = reconcile_with(cfg, addr, &cutter)?;
    let cut = cutter.cut.load(std::sync::atomic::Ordering::Relaxed);
    let epoch = cutter.current_epoch();
    match r {
        Ok(FollowEnd::Reconciled { log_end, .. }) => {
            tracing::info!(primary = %addr, records_cut = cut, log_end, "standby: this log agrees with the primary's")
        }
        Ok(FollowEnd::Shutdown) => {
            tracing::warn!(primary = %addr, "standby: the primary did not answer; serving what this node holds")
        }
        Err(FollowError::Log {
            source: e @ EngineError::NeedsReseed(_),
            ..
        }) => return Ok(Some((e, epoch))),
        Err(FollowError::Log { source, .. }) => {
            return Err(source).context("reconciling with the primary")
        }
        Err(e @ FollowError::NeedsReseed { .. }) => {
            return Ok(Some((crate::replica::reseed(e.to_string()), epoch)))
        }
        Err(e @ FollowError::StaleLeader { .. }) => {
            return Err(EngineError::StaleLeader(e.to_string()).into())
        }
        Err(e) => {
            let e = EngineError::Replication(format!("reconciling with {addr}: {e}"));
            return Err(e.into());
        }
    }
    Ok(None)
}

type ReconcileResult =
    Result<roost_replication::FollowEnd, roost_replication::FollowError<crate::error::EngineError>>;

/// The protocol's reconcile against `addr`, given up on after [`RECONCILE_WAIT`] without an
/// answer (down, or frozen with its socket still accepting), counted from the start or from
/// the last answer: a primary that answered (a cut began) and then stopped answering (it
/// was fenced, and now refuses every fetch with `NotLeader`) is not waited for either. The
/// cluster drill saw a rejoining node cut its log against the leader etcd named, that
/// leader lose its lease a moment later, and the node ask it again and again for minutes,
/// never looking for the new one (issue 42).
fn reconcile_with(
    cfg: &Config,
    addr: &str,
    cutter: &Arc<crate::replica::cut::Cutter>,
) -> anyhow::Result<ReconcileResult> {
    reconcile_waiting(cfg, addr, cutter, RECONCILE_WAIT)
}

/// [`reconcile_with`] with its wait as a parameter (the tests shorten it).
fn reconcile_waiting(
    cfg: &Config,
    addr: &str,
    cutter: &Arc<crate::replica::cut::Cutter>,
    wait: Duration,
) -> anyhow::Result<ReconcileResult> {
    use roost_replication::{FollowerOptions, FollowerStatus};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the reconcile runtime")?;
    let opts = FollowerOptions {
        transport: crate::replica::transport::transport(&cfg.replication)?,
        ..FollowerOptions::new(cfg.replication.node_name())
    };
    let status = Arc::new(FollowerStatus::new());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    Ok(rt.block_on(async {
        let reconcile = roost_replication::reconcile(
            addr.to_owned(),
            cutter.clone(),
            opts,
            stop_rx,
            status.clone(),
        );
        tokio::pin!(reconcile);
        tokio::select! {
            r = &mut reconcile => r,
            _ = silent_for(&status, wait) => {
                // A cut under way ends first: the stop is seen between the follower's steps.
                let _ = stop.send(true);
                reconcile.await
            }
        }
    }))
}

/// Returns once the primary has answered no fetch for `wait`: since the start, or since
/// its last answer (a change of `FollowerStatus::last_fetch_unix_ms`, looked at ten times a
/// `wait` and timed on the monotonic clock, so a step of the wall clock changes nothing).
async fn silent_for(status: &roost_replication::FollowerStatus, wait: Duration) {
    let look = (wait / 10).max(Duration::from_millis(1));
    let mut seen = status.snapshot().last_fetch_unix_ms;
    let mut since = Instant::now();
    while since.elapsed() < wait {
        tokio::time::sleep(look.min(wait.saturating_sub(since.elapsed()))).await;
        let last = status.snapshot().last_fetch_unix_ms;
        if last != seen {
            (seen, since) = (last, Instant::now());
        }
    }
}

/// Recovery progress: a bar when a person is watching (stderr is a terminal), and STATUS=
/// for systemd at most once a second.
struct RecoveryProgress {
    bar: Option<indicatif::ProgressBar>,
    last_status: Cell<Instant>,
}

impl RecoveryProgress {
    fn new() -> RecoveryProgress {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "recovery: {msg} [{bar:40}] {pos}/{len} ({elapsed})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        RecoveryProgress {
            bar,
            // In the past, so the first report goes out at once.
            last_status: Cell::new(Instant::now() - Duration::from_secs(2)),
        }
    }

    fn report(&self, phase: &str, done: u64, total: u64) {
        if let Some(b) = &self.bar {
            b.set_message(phase.to_owned());
            b.set_length(total);
            b.set_position(done);
        }
        if self.last_status.get().elapsed() >= Duration::from_secs(1) {
            self.last_status.set(Instant::now());
            notify::status(&format!("recovering: {phase} {done}/{total}"));
        }
    }

    fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// Refuses a data directory that someone else could write: another owner, or group- or
/// world-writable. The spool may be group-writable (clients write `tmp/` and `new/`); the
/// WAL, audit log and shards may not.
pub fn check_permissions(data_dir: &Path) -> Result<(), ConfigError> {
    let me = rustix::process::geteuid().as_raw();
    for d in [
        data_dir.to_path_buf(),
        data_dir.join(WAL_DIR),
        data_dir.join(AUDIT_DIR),
        data_dir.join(SHARDS_DIR),
    ] {
        let Ok(m) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        if let Some(why) = unsafe_dir(&d, &m, me) {
            return Err(ConfigError::Invalid(format!(
                "refusing data directory: {} {why}",
                d.display()
            )));
        }
    }
    Ok(())
}

/// Why `d` must not hold roost's files, if it must not.
fn unsafe_dir(d: &Path, m: &std::fs::Metadata, me: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if m.file_type().is_symlink() {
        Some("is a symbolic link".to_owned())
    } else if m.uid() != me {
        Some(format!(
            "is owned by uid {}, but roost runs as uid {me}",
            m.uid()
        ))
    } else if m.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by other users (mode {:o}); run: chmod go-w {}",
            m.mode() & 0o7777,
            d.display()
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::EngineError;

    /// Runs `retry_join` (5 tries, no pause) over `outcomes` in turn; returns its result
    /// and how many tries it made.
    fn join_over(outcomes: Vec<anyhow::Result<()>>) -> (anyhow::Result<()>, usize) {
        let mut outcomes = outcomes.into_iter();
        let mut tries = 0;
        let r = retry_join(5, Duration::ZERO, || {
            tries += 1;
            outcomes.next().unwrap_or(Ok(()))
        });
        (r, tries)
    }

    fn refused() -> anyhow::Result<()> {
        let e = EngineError::Replication(
            "base backup from 127.0.0.1:1: the leader refused: NotLeader { epoch: 0 }".into(),
        );
        Err(anyhow::Error::from(e).context("joining"))
    }

    /// Goal: a base backup refused by a node that no longer leads (the cluster drill's
    /// failure: the node exited 74 and its files stayed unanswered) makes the node look
    /// for the leader again, not exit.
    #[test]
    fn a_join_refused_by_a_former_leader_is_tried_again() {
        let (r, tries) = join_over(vec![refused(), refused()]);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(tries, 3);
    }

    /// A failure no change of leader explains is returned at once; one that persists is
    /// returned after the last try.
    #[test]
    fn only_a_leader_change_is_tried_again_and_never_without_end() {
        let disk = EngineError::Io {
            op: "create",
            path: "/data/reseed.tmp".into(),
            source: std::io::Error::other("no space"),
        };
        let (r, tries) = join_over(vec![Err(disk.into())]);
        assert!(r.is_err());
        assert_eq!(tries, 1);
        let (r, tries) = join_over((0..9).map(|_| refused()).collect());
        let e = r.expect_err("five refusals in a row");
        assert!(format!("{e:#}").contains("NotLeader"), "{e:#}");
        assert_eq!(tries, 5);
    }

    /// Goal (issue 42, found by the cluster drill beside a CPU hog): a primary that answered
    /// a joining node's reconcile (a cut began) and then refuses every fetch as `NotLeader`
    /// (it lost its lease) is given up after the wait, as one that never answered is; the
    /// node then serves, and follows whoever etcd names. Before, it asked the former leader
    /// again and again for minutes and never looked for the new one.
    #[test]
    fn a_primary_that_answered_and_then_refuses_is_not_waited_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config {
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        let (addr, refusals) = former_leader();
        let cutter = Arc::new(crate::replica::cut::Cutter::open(&cfg).expect("open the cutter"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use roost_replication::FollowerLog;
            let wait = Duration::from_millis(1500);
            let r = reconcile_waiting(&cfg, &addr, &cutter, wait).map(|r| format!("{r:?}"));
            let _ = tx.send((r, cutter.current_epoch()));
        });
        let (r, epoch) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the reconcile gave the former leader up within 30 s");
        let r = r.expect("the reconcile ran");
        assert!(r.contains("Shutdown"), "{r}");
        assert_eq!(epoch, 1, "the first answer (a newer epoch) was taken");
        let refused = refusals.load(std::sync::atomic::Ordering::SeqCst);
        assert!(refused >= 2, "asked again after refusals: {refused}");
    }

    /// A former leader on loopback: its first answer moves the follower to epoch 1
    /// (`FencedEpoch`, an answer), and every later fetch is refused as `NotLeader`. Returns
    /// its address and how many fetches it refused. At most 100 connections.
    fn former_leader() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use roost_replication::wire::{read_frame, write_frame, DEFAULT_FRAME_BYTES_MAX};
        use roost_replication::Message;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        listener.set_nonblocking(true).expect("nonblocking");
        let refused = Arc::new(AtomicUsize::new(0));
        let count = refused.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let mut answered = false;
                for _ in 0..100 {
                    let Ok((mut s, _)) = listener.accept().await else {
                        return;
                    };
                    while let Ok(Some(_)) = read_frame(&mut s, DEFAULT_FRAME_BYTES_MAX).await {
                        let answer = if answered {
                            count.fetch_add(1, Ordering::SeqCst);
                            Message::NotLeader { epoch: 2 }
                        } else {
                            answered = true;
                            Message::FencedEpoch { leader_epoch: 1 }
                        };
                        if write_frame(&mut s, &answer, DEFAULT_FRAME_BYTES_MAX)
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            });
        });
        (addr, refused)
    }
}

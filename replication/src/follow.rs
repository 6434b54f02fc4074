//! The follower's side of the protocol: `follow` (stream from the leader for as long as the
//! node follows) and `reconcile` (the start-up phase: fetch and truncate until the leader
//! answers with records once). Both loop Fetch -> answer over one connection, reconnect
//! with a bounded backoff when it fails, and stop on shutdown or on an error no reconnect
//! can fix (a stale leader, a follower that must be re-seeded, a failed log call). The
//! truncation point comes from `decide::follower_truncation`; this module only acts on it,
//! and it never truncates to the high watermark.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::timeout;
use tracing::{info, warn};

use crate::decide::{follower_truncation, plausible_epoch, Truncation};
use crate::log::{Entry, Epoch, FollowerLog, Lsn};
use crate::status::FollowerStatus;
use crate::task::{follow_call, shutdown_requested, wait_shutdown, watch_moved, Cancelled};
use crate::transport::{Stream, Transport};
use crate::wire::{self, FrameReader, Message, WireError, DEFAULT_FRAME_BYTES_MAX};

mod ahead;

/// The follower's identity and limits.
#[derive(Clone, Debug)]
pub struct FollowerOptions {
    /// This follower's replica name (the leader counts acknowledgements under it).
    pub replica: String,
    /// The largest frame read or written (at least the leader's).
    pub frame_bytes_max: u32,
    pub connect_timeout: Duration,
    pub write_timeout: Duration,
    /// How long an answer may take beyond the long-poll the fetch asks for (`wait_ms`).
    pub read_timeout: Duration,
    /// The long-poll asked of the leader when caught up.
    pub wait_ms: u32,
    /// Record bytes asked per fetch.
    pub fetch_bytes_max: u32,
    /// The wait before the first reconnect; doubled per failed attempt up to `backoff_max`,
    /// back to `backoff_min` after a connection that got an answer.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// False: a diverging answer stops `follow` with `FollowError::Diverged` instead of
    /// truncating (the daemon truncates only at start-up, through `reconcile`).
    pub truncate_allowed: bool,
    /// How the leader is reached (mutual TLS or plain TCP).
    pub transport: Transport,
    /// Fetch the next records while the last ones sync (`FetchAhead` and `Durable`,
    /// issue 42); off after a leader refused a `FetchAhead` (it predates them), and never
    /// while reconciling.
    pub fetch_ahead: bool,
}

impl FollowerOptions {
    /// Defaults for replica `replica`: 64 MiB frames, 5 s connect, 10 s write, 10 s read
    /// beyond a 5 s long-poll, 4 MiB per fetch, reconnects between 100 ms and 5 s,
    /// truncation allowed.
    pub fn new(replica: impl Into<String>) -> Self {
        FollowerOptions {
            replica: replica.into(),
            frame_bytes_max: DEFAULT_FRAME_BYTES_MAX,
            connect_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(10),
            wait_ms: 5_000,
            fetch_bytes_max: 4 << 20,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            truncate_allowed: true,
            transport: Transport::plain(Vec::new()),
            fetch_ahead: true,
        }
    }
}

/// How `follow` or `reconcile` ended without an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FollowEnd {
    /// Shutdown was asked for (or its sender dropped).
    Shutdown,
    /// `reconcile` only: the leader answered with records, which are appended; the logs
    /// agree below `log_end`.
    Reconciled { log_end: Lsn, hw: Lsn },
}

/// Why a follower stopped for good: no reconnect can fix any of these.
#[derive(Debug, thiserror::Error)]
pub enum FollowError<E: std::error::Error + 'static> {
    /// The leader's epoch is older than the one this follower knows (`UnknownEpoch`).
    #[error("leader {leader} is stale: its epoch {leader_epoch} is older than this follower's {current_epoch}")]
    StaleLeader {
        leader: String,
        leader_epoch: Epoch,
        current_epoch: Epoch,
    },
    /// The leader no longer holds `fetch_lsn` (`OutOfRange`): re-seed this follower.
    #[error("leader {leader} retains lsn {log_start} on, this follower needs lsn {fetch_lsn}: it must be re-seeded")]
    NeedsReseed {
        leader: String,
        log_start: Lsn,
        fetch_lsn: Lsn,
    },
    /// The logs diverge and truncation is not allowed now (`truncate_allowed` false).
    #[error("log diverges from leader {leader} (its epoch {epoch} ends at lsn {end_lsn}, this log ends at {log_end}) and truncation is not allowed now")]
    Diverged {
        leader: String,
        epoch: Epoch,
        end_lsn: Lsn,
        log_end: Lsn,
    },
    /// A diverging answer whose truncation point would not shorten the log: answering the
    /// same way again could only loop (the logs disagree in a way epochs cannot settle).
    #[error("log diverges from leader {leader} (its epoch {epoch} ends at lsn {end_lsn}) but truncation would not shorten this log (end {log_end})")]
    TruncationStuck {
        leader: String,
        epoch: Epoch,
        end_lsn: Lsn,
        log_end: Lsn,
    },
    /// The follower's log failed (`op` names the `FollowerLog` call).
    #[error("follower log failed to {op} at lsn {lsn}: {source}")]
    Log {
        op: &'static str,
        lsn: Lsn,
        #[source]
        source: E,
    },
}

/// Why one connection ended; the follower reconnects after a backoff.
#[derive(Debug, thiserror::Error)]
enum RetryError {
    #[error("connecting to leader {leader}: {source}")]
    Connect {
        leader: String,
        source: std::io::Error,
    },
    #[error("leader {leader}: timed out {what}")]
    Timeout { leader: String, what: &'static str },
    #[error("leader {leader}: {what}: {source}")]
    Wire {
        leader: String,
        what: &'static str,
        source: WireError,
    },
    #[error("leader {leader} closed the connection {what}")]
    Closed { leader: String, what: &'static str },
    #[error("leader {leader} broke the protocol: {message}")]
    Protocol { leader: String, message: String },
    #[error("{leader} is not the leader (its latest epoch is {epoch})")]
    NotLeader { leader: String, epoch: Epoch },
    #[error("leader {leader} answered with an error: {message}")]
    LeaderError { leader: String, message: String },
}

/// How one connection ended.
enum End<E: std::error::Error + 'static> {
    Done(FollowEnd),
    Fatal(FollowError<E>),
    Retry(RetryError),
}

impl<E: std::error::Error + 'static> From<Cancelled> for End<E> {
    fn from(_: Cancelled) -> Self {
        End::Done(FollowEnd::Shutdown)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Follow,
    Reconcile,
}

/// Follows the leader at `addr` (host:port, resolved at each connect) until shutdown or a
/// fatal error: each `Records` answer is appended (durable when `append` returns; the next
/// fetch's lsn acknowledges it), each `Diverging` one truncated (if `truncate_allowed`),
/// each `FencedEpoch` adopted. Connection failures reconnect forever with a bounded backoff.
pub async fn follow<F: FollowerLog>(
    addr: String,
    log: Arc<F>,
    opts: FollowerOptions,
    shutdown: watch::Receiver<bool>,
    status: Arc<FollowerStatus>,
) -> Result<FollowEnd, FollowError<F::Error>> {
    run(addr, log, opts, shutdown, status, Mode::Follow).await
}

/// The start-up phase: fetches and truncates (whatever `truncate_allowed` says) until the
/// leader answers with `Records` once, appends those, and returns `FollowEnd::Reconciled`.
/// From then on the logs agree below the log end, and `follow` can run with truncation off.
pub async fn reconcile<F: FollowerLog>(
    addr: String,
    log: Arc<F>,
    opts: FollowerOptions,
    shutdown: watch::Receiver<bool>,
    status: Arc<FollowerStatus>,
) -> Result<FollowEnd, FollowError<F::Error>> {
    run(addr, log, opts, shutdown, status, Mode::Reconcile).await
}

async fn run<F: FollowerLog>(
    addr: String,
    log: Arc<F>,
    opts: FollowerOptions,
    mut shutdown: watch::Receiver<bool>,
    status: Arc<FollowerStatus>,
    mode: Mode,
) -> Result<FollowEnd, FollowError<F::Error>> {
    status.set_leader(&addr);
    let mut backoff = opts.backoff_min;
    let mut ahead = opts.fetch_ahead && mode == Mode::Follow;
    loop {
        if shutdown_requested(&shutdown) {
            return Ok(FollowEnd::Shutdown);
        }
        let mut session = Session {
            leader: &addr,
            log: &log,
            opts: &opts,
            status: &status,
            mode,
            answered: false,
            hw_passed: 0,
            next: None,
            ahead,
            pending: None,
            durable: 0,
        };
        let end = session.run(&mut shutdown).await;
        ahead = session.ahead;
        status.set_connected(false);
        let retry = match end {
            End::Done(done) => return Ok(done),
            End::Fatal(e) => {
                // WARN, not ERROR: the host decides what it means (a cluster node whose log
                // must be cut or re-seeded starts again as a follower, issue 42), and logs
                // an ERROR itself when it stops for it.
                warn!(leader = %addr, error = %e, "replication stopped");
                status.set_error(e.to_string());
                return Err(e);
            }
            End::Retry(e) => e,
        };
        if session.answered {
            backoff = opts.backoff_min;
        }
        warn!(error = %retry, backoff_ms = backoff.as_millis() as u64, "replication connection ended; reconnecting");
        status.set_error(retry.to_string());
        tokio::select! {
            _ = wait_shutdown(&mut shutdown) => return Ok(FollowEnd::Shutdown),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(opts.backoff_max);
    }
}

/// What one fetch said about this follower's log.
#[derive(Clone, Copy, Debug)]
struct Sent {
    current_epoch: Epoch,
    fetch_lsn: Lsn,
    last_epoch: Epoch,
}

impl Sent {
    /// What the next fetch says of `l` now.
    fn of<F: FollowerLog>(l: &F) -> Sent {
        Sent {
            current_epoch: l.current_epoch(),
            fetch_lsn: l.log_end(),
            last_epoch: l.last_epoch(),
        }
    }
}

/// One connection to the leader.
struct Session<'a, F: FollowerLog> {
    leader: &'a str,
    log: &'a Arc<F>,
    opts: &'a FollowerOptions,
    status: &'a FollowerStatus,
    mode: Mode,
    /// An answer moved this follower along on this connection (records, a truncation, a
    /// new epoch): the backoff starts over. `NotLeader` and `Error` answers do not count,
    /// so a node that keeps refusing is retried ever more slowly.
    answered: bool,
    /// The hw last given to `append` (an empty answer with a higher one is passed on).
    hw_passed: Lsn,
    /// The next fetch, read in the same trip to the blocking pool as the append before it:
    /// the fetch that acknowledges records goes out as soon as they are durable (issue 42).
    /// Fetching ahead, what the log will say once the pending append is done.
    next: Option<Sent>,
    /// Fetching ahead (`FollowerOptions::fetch_ahead`): the next fetch goes out while the
    /// last records sync; `durable` is what it acknowledges.
    ahead: bool,
    /// The append running while the next fetch is in flight (only fetching ahead; when
    /// set, so is `next`).
    pending: Option<Pending<F::Error>>,
    /// The log's durable end as this session knows it (fetching ahead).
    durable: Lsn,
}

/// An append running beside the next fetch.
struct Pending<E> {
    run: std::pin::Pin<Box<dyn std::future::Future<Output = Appended<E>> + Send>>,
    /// Where the log ends once it is done.
    due: Sent,
    /// The fetch whose answer it appends, and that answer's record count and bytes.
    from: Lsn,
    count: u64,
    bytes: u64,
}

/// What an append gave: the log as the next fetch reads it.
type Appended<E> = Result<Result<Sent, E>, Cancelled>;

impl<F: FollowerLog> Session<'_, F> {
    async fn run(&mut self, shutdown: &mut watch::Receiver<bool>) -> End<F::Error> {
        let end = match self.fetch_loop(shutdown).await {
            Ok(never) => match never {},
            Err(end) => end,
        };
        // No session (and no return) leaves an append running: the next reads the log.
        match self.settle().await {
            Err(fatal @ End::Fatal(_)) => fatal,
            _ => end,
        }
    }

    async fn fetch_loop(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<std::convert::Infallible, End<F::Error>> {
        let mut stream = self.connect(shutdown).await?;
        let mut reader = FrameReader::default();
        // Fetching ahead, records are acknowledged when the log says they are durable, not
        // when their append returns (issue 42: the ack no longer waits for the apply).
        let mut durable_rx = self.log.durable_watch().filter(|_| self.ahead);
        self.status.set_connected(true);
        info!(
            leader = self.leader,
            replica = self.opts.replica,
            ahead = self.ahead,
            "connected to the leader"
        );
        loop {
            if shutdown_requested(shutdown) {
                return Err(End::Done(FollowEnd::Shutdown));
            }
            let sent = match self.next.take() {
                Some(sent) => sent,
                None => {
                    let of = |l: &F| (Sent::of(l), l.durable_end());
                    let (sent, durable) = follow_call(self.log, of).await?;
                    self.durable = durable.min(sent.fetch_lsn);
                    sent
                }
            };
            let answer = self
                .exchange((&mut stream, &mut reader), sent, &mut durable_rx, shutdown)
                .await?;
            // Records act once the pending append lands; what it makes durable meanwhile
            // is acknowledged as it goes (any other answer may come with the connection
            // closing: `handle` settles quietly for it).
            if matches!(answer, Message::Records { .. }) {
                self.settle_acking(&mut stream, &mut durable_rx).await?;
            }
            self.handle(answer, sent).await?;
            self.answered = true;
        }
    }

    async fn connect(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Stream, End<F::Error>> {
        let attempt = self
            .opts
            .transport
            .connect(self.leader, self.opts.connect_timeout);
        let leader = self.leader.to_string();
        tokio::select! {
            _ = wait_shutdown(shutdown) => Err(End::Done(FollowEnd::Shutdown)),
            r = attempt => r.map_err(|source| End::Retry(RetryError::Connect { leader, source })),
        }
    }

    /// Sends one fetch and reads its answer, within the timeouts and watching shutdown;
    /// fetching ahead, the pending append lands meanwhile and what it made durable is
    /// acknowledged at once (`Durable`): as the log's durable watch moves, if it keeps
    /// one, else when the append lands.
    async fn exchange(
        &mut self,
        (stream, reader): (&mut Stream, &mut FrameReader),
        sent: Sent,
        durable_rx: &mut Option<watch::Receiver<Lsn>>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Message, End<F::Error>> {
        let fetch = self.fetch(sent);
        self.write(stream, &fetch, "writing a Fetch").await?;
        let mut told = self.durable;
        let limit = self.opts.read_timeout + Duration::from_millis(u64::from(self.wait_ms()));
        let deadline = tokio::time::Instant::now() + limit;
        let max = self.opts.frame_bytes_max;
        let read = loop {
            tokio::select! {
                _ = wait_shutdown(shutdown) => return Err(End::Done(FollowEnd::Shutdown)),
                r = tokio::time::timeout_at(deadline, reader.next(stream, max)) => break r,
                landed = self.landing() => self.landed(landed)?,
                moved = watch_moved(durable_rx) => self.saw_durable(moved, durable_rx),
            }
            if self.durable > told {
                told = self.durable;
                let durable = Message::Durable { durable_lsn: told };
                self.write(stream, &durable, "writing a Durable").await?;
            }
        };
        let leader = || self.leader.to_string();
        match read {
            Err(_) => Err(End::Retry(RetryError::Timeout {
                leader: leader(),
                what: "waiting for an answer",
            })),
            Ok(Ok(None)) => Err(End::Retry(RetryError::Closed {
                leader: leader(),
                what: "before answering a Fetch",
            })),
            Ok(Err(source)) => Err(End::Retry(RetryError::Wire {
                leader: leader(),
                what: "reading an answer",
                source,
            })),
            Ok(Ok(Some(answer))) => Ok(answer),
        }
    }

    /// The fetch for `sent`: a `FetchAhead` (acknowledging `durable`) or a `Fetch`.
    fn fetch(&self, sent: Sent) -> Message {
        let (replica, max_bytes, wait_ms) = (
            self.opts.replica.clone(),
            self.opts.fetch_bytes_max,
            self.wait_ms(),
        );
        if self.ahead {
            return Message::FetchAhead {
                replica,
                current_epoch: sent.current_epoch,
                fetch_lsn: sent.fetch_lsn,
                durable_lsn: self.durable,
                last_epoch: sent.last_epoch,
                max_bytes,
                wait_ms,
            };
        }
        Message::Fetch {
            replica,
            current_epoch: sent.current_epoch,
            fetch_lsn: sent.fetch_lsn,
            last_epoch: sent.last_epoch,
            max_bytes,
            wait_ms,
        }
    }

    /// Writes one frame within the write timeout.
    async fn write(
        &mut self,
        stream: &mut Stream,
        msg: &Message,
        what: &'static str,
    ) -> Result<(), End<F::Error>> {
        let leader = || self.leader.to_string();
        let write = timeout(
            self.opts.write_timeout,
            wire::write_frame(stream, msg, self.opts.frame_bytes_max),
        );
        match write.await {
            Err(_) => Err(End::Retry(RetryError::Timeout {
                leader: leader(),
                what,
            })),
            Ok(Err(source)) => Err(End::Retry(RetryError::Wire {
                leader: leader(),
                what,
                source,
            })),
            Ok(Ok(())) => Ok(()),
        }
    }

    async fn handle(&mut self, answer: Message, sent: Sent) -> Result<(), End<F::Error>> {
        let leader = self.leader.to_string();
        // Every answer acts on the log as it is once the pending append has landed (records
        // continue it; a truncation or a new epoch must not race it).
        self.settle().await?;
        match answer {
            Message::Records {
                leader_epoch,
                hw,
                entries,
                ..
            } => self.on_records(sent, leader_epoch, hw, entries).await,
            Message::Diverging {
                leader_epoch,
                epoch,
                end_lsn,
            } => self.on_diverging(sent, leader_epoch, epoch, end_lsn).await,
            Message::FencedEpoch { leader_epoch } => self.on_fenced(sent, leader_epoch).await,
            Message::UnknownEpoch { leader_epoch } => Err(End::Fatal(FollowError::StaleLeader {
                leader,
                leader_epoch,
                current_epoch: sent.current_epoch,
            })),
            Message::OutOfRange { log_start } => Err(End::Fatal(FollowError::NeedsReseed {
                leader,
                log_start,
                fetch_lsn: sent.fetch_lsn,
            })),
            Message::NotLeader { epoch } => {
                Err(End::Retry(RetryError::NotLeader { leader, epoch }))
            }
            Message::Error { message } => {
                self.refused_ahead(&message);
                Err(End::Retry(RetryError::LeaderError { leader, message }))
            }
            other @ (Message::Fetch { .. }
            | Message::FetchAhead { .. }
            | Message::Durable { .. }
            | Message::Snapshot { .. }
            | Message::SnapshotFile { .. }
            | Message::SnapshotData { .. }
            | Message::SnapshotEnd { .. }
            | Message::Forward { .. }
            | Message::ForwardAnswer { .. }
            | Message::ForwardRefused { .. }) => Err(self.protocol(format!(
                "answered a Fetch at lsn {} with a {}",
                sent.fetch_lsn,
                other.name()
            ))),
        }
    }

    /// The long-poll to ask for: none while reconciling (start-up wants the first answer
    /// now, even an empty one), `wait_ms` when following.
    fn wait_ms(&self) -> u32 {
        match self.mode {
            Mode::Follow => self.opts.wait_ms,
            Mode::Reconcile => 0,
        }
    }

    fn protocol(&self, message: String) -> End<F::Error> {
        End::Retry(RetryError::Protocol {
            leader: self.leader.to_string(),
            message,
        })
    }

    /// The answer must be for the epoch the fetch was in (one fetch in flight per
    /// connection, so anything else is a confused leader).
    fn check_epoch(
        &self,
        sent: Sent,
        leader_epoch: Epoch,
        what: &str,
    ) -> Result<(), End<F::Error>> {
        if leader_epoch == sent.current_epoch {
            return Ok(());
        }
        Err(self.protocol(format!(
            "{what} for epoch {leader_epoch} to a Fetch in epoch {} at lsn {}",
            sent.current_epoch, sent.fetch_lsn
        )))
    }

    async fn on_records(
        &mut self,
        sent: Sent,
        leader_epoch: Epoch,
        hw: Lsn,
        entries: Vec<Entry>,
    ) -> Result<(), End<F::Error>> {
        self.check_epoch(sent, leader_epoch, "Records")?;
        check_records(sent, leader_epoch, &entries).map_err(|m| self.protocol(m))?;
        self.status.answered(leader_epoch);
        let count = entries.len() as u64;
        let bytes = entries.iter().map(|e| e.payload.len() as u64).sum();
        if self.ahead {
            self.append_ahead(sent, hw, entries);
        } else if count > 0 || hw > self.hw_passed {
            // Not `append_ahead` then `settle`: the next fetch reads the log as it is, not as
            // predicted (the start-up reconcile's log, `replica/cut.rs`, appends nothing).
            let next = follow_call(self.log, move |l| {
                l.append(&entries, hw).map(|()| Sent::of(l))
            })
            .await?
            .map_err(|source| {
                End::Fatal(FollowError::Log {
                    op: "append",
                    lsn: sent.fetch_lsn,
                    source,
                })
            })?;
            self.hw_passed = hw;
            self.next = Some(next);
            self.status.appended(count, bytes);
        }
        self.status.saw_hw(hw);
        if self.mode == Mode::Reconcile {
            let log_end = sent.fetch_lsn + count;
            return Err(End::Done(FollowEnd::Reconciled { log_end, hw }));
        }
        Ok(())
    }

    async fn on_diverging(
        &mut self,
        sent: Sent,
        leader_epoch: Epoch,
        epoch: Epoch,
        end_lsn: Lsn,
    ) -> Result<(), End<F::Error>> {
        self.check_epoch(sent, leader_epoch, "Diverging")?;
        self.status.answered(leader_epoch);
        let leader = self.leader.to_string();
        let log_end = sent.fetch_lsn;
        if self.mode == Mode::Follow && !self.opts.truncate_allowed {
            return Err(End::Fatal(FollowError::Diverged {
                leader,
                epoch,
                end_lsn,
                log_end,
            }));
        }
        let t = follow_call(self.log, move |l| truncate(l, epoch, end_lsn)).await?;
        let t = match t {
            Ok(t) => t,
            Err(Trunc::Stuck { log_end }) => {
                return Err(End::Fatal(FollowError::TruncationStuck {
                    leader,
                    epoch,
                    end_lsn,
                    log_end,
                }))
            }
            Err(Trunc::Log { lsn, source }) => {
                return Err(End::Fatal(FollowError::Log {
                    op: "truncate_to",
                    lsn,
                    source,
                }))
            }
        };
        self.status.truncated();
        info!(
            leader,
            epoch,
            end_lsn,
            from = log_end,
            to = t.truncate_to,
            complete = t.complete,
            "truncated a diverging log"
        );
        Ok(())
    }

    async fn on_fenced(&mut self, sent: Sent, leader_epoch: Epoch) -> Result<(), End<F::Error>> {
        if leader_epoch <= sent.current_epoch {
            return Err(self.protocol(format!(
                "FencedEpoch {leader_epoch} is not newer than the fetch's epoch {}",
                sent.current_epoch
            )));
        }
        if !plausible_epoch(sent.current_epoch, leader_epoch) {
            return Err(self.protocol(format!(
                "FencedEpoch {leader_epoch} is implausible beside this follower's epoch {}",
                sent.current_epoch
            )));
        }
        self.status.answered(leader_epoch);
        follow_call(self.log, move |l| l.set_current_epoch(leader_epoch))
            .await?
            .map_err(|source| {
                End::Fatal(FollowError::Log {
                    op: "set_current_epoch",
                    lsn: sent.fetch_lsn,
                    source,
                })
            })?;
        info!(
            leader = self.leader,
            from = sent.current_epoch,
            to = leader_epoch,
            "adopted the leader's epoch"
        );
        Ok(())
    }
}

/// Why a truncation did not happen.
enum Trunc<E> {
    Stuck { log_end: Lsn },
    Log { lsn: Lsn, source: E },
}

/// `follower_truncation`, then `truncate_to`, against the log as it is now.
fn truncate<F: FollowerLog>(
    log: &F,
    epoch: Epoch,
    end_lsn: Lsn,
) -> Result<Truncation, Trunc<F::Error>> {
    let t = follower_truncation(epoch, end_lsn, log);
    let log_end = log.log_end();
    if t.truncate_to >= log_end {
        return Err(Trunc::Stuck { log_end });
    }
    log.truncate_to(t.truncate_to)
        .map_err(|source| Trunc::Log {
            lsn: t.truncate_to,
            source,
        })?;
    Ok(t)
}

/// Records must continue the log from the fetch's lsn, one lsn each, with epochs that never
/// go down, start no lower than the follower's last one and never pass the leader's.
fn check_records(sent: Sent, leader_epoch: Epoch, entries: &[Entry]) -> Result<(), String> {
    let mut prev = sent.last_epoch;
    for (i, e) in entries.iter().enumerate() {
        let due = sent.fetch_lsn + i as Lsn;
        if e.lsn != due {
            return Err(format!("Records sent lsn {} where {due} was due", e.lsn));
        }
        if e.epoch == 0 || e.epoch < prev || e.epoch > leader_epoch {
            return Err(format!(
                "Records sent lsn {} in epoch {} after epoch {prev} from a leader in epoch {leader_epoch}",
                e.lsn, e.epoch
            ));
        }
        prev = e.epoch;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

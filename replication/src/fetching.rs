//! The leader's side of one follower connection's fetches (split from `serve.rs`, which
//! accepts connections and reads requests): `Conn`, its cancel-safe reader and what the
//! follower acknowledged on it (`Durable` frames included, issue 42); the answer to one
//! fetch (`decide::leader_answer`, then the records), with the long-poll when the follower
//! is caught up; and writing an answer. It never decides (that is `decide`) and touches the
//! log only through `LeaderLog`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{timeout, Instant};
use tracing::{debug, info, warn};

use crate::decide::{leader_answer, Answer, FetchView};
use crate::log::{Entry, Epoch, LeaderLog, Lsn};
use crate::options::LeaderOptions;
use crate::task::{lead_call, wait_shutdown, watch_moved, Cancelled};
use crate::transport::Stream;
use crate::wire::{self, write_encoded, FrameReader, Message, WireError, ENTRY_HEADER_BYTES};

/// The long-poll waits on the blocking pool in slices this long, so that shutdown is seen
/// within one slice and no blocking task outlives it by more.
const WAIT_SLICE: Duration = Duration::from_millis(200);

/// Why one follower connection ended badly (logged; the server keeps serving the others).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("follower {peer}: {what}: {source}")]
    Wire {
        peer: SocketAddr,
        what: &'static str,
        source: WireError,
    },
    #[error("follower {peer}: timed out {what}")]
    Timeout {
        peer: SocketAddr,
        what: &'static str,
    },
    #[error("follower {peer}: expected a Fetch, got {got}")]
    Unexpected { peer: SocketAddr, got: &'static str },
    #[error("follower {peer}: a {got} came while a fetch waited for its answer (one at a time)")]
    OutOfTurn { peer: SocketAddr, got: &'static str },
    #[error("follower {peer}: refused a {got}: {why}")]
    Refused {
        peer: SocketAddr,
        got: &'static str,
        why: String,
    },
    #[error("follower {peer}: replica name changed from {was:?} to {now:?} on one connection")]
    RenamedReplica {
        peer: SocketAddr,
        was: String,
        now: String,
    },
    #[error("follower {peer}: refused replica {replica:?}: {why}")]
    NotPermitted {
        peer: SocketAddr,
        replica: String,
        why: String,
    },
    #[error("follower {peer}: the runtime is shutting down")]
    Cancelled { peer: SocketAddr },
}

/// One follower connection: its stream, read through one cancel-safe reader (a `Durable`
/// frame is read during a long-poll), and what the follower has acknowledged on it.
pub(crate) struct Conn<'a, L: LeaderLog> {
    pub(crate) stream: &'a mut Stream,
    pub(crate) reader: FrameReader,
    pub(crate) addr: SocketAddr,
    pub(crate) log: &'a Arc<L>,
    pub(crate) opts: &'a LeaderOptions,
    acks: Acks,
}

/// What a follower's fetches on one connection established: the replica and epoch of the
/// last fetch answered with records, the lsn that fetch started at (the logs agree below
/// it: a `Durable` frame may acknowledge up to there, no further) and what it has
/// acknowledged so far.
#[derive(Default)]
struct Acks {
    replica: Option<String>,
    epoch: Epoch,
    agreed: Lsn,
    durable: Lsn,
}

impl<'a, L: LeaderLog> Conn<'a, L> {
    pub(crate) fn new(
        stream: &'a mut Stream,
        addr: SocketAddr,
        log: &'a Arc<L>,
        opts: &'a LeaderOptions,
    ) -> Self {
        Conn {
            stream,
            reader: FrameReader::default(),
            addr,
            log,
            opts,
            acks: Acks::default(),
        }
    }

    /// `fetch` was decided with `acked` as its acknowledgement: a `Records` answer means the
    /// logs agree below its `fetch_lsn` and `acked` counted (`read_records`).
    fn answered(&mut self, fetch: &Fetch, answer: &Message, acked: Lsn) {
        if let Message::Records { .. } = answer {
            self.acks = Acks {
                replica: Some(fetch.replica.clone()),
                epoch: fetch.view.current_epoch,
                agreed: fetch.view.fetch_lsn,
                durable: acked,
            };
        }
    }

    /// A `Durable` frame: acknowledged at once if it moves the follower's durable end and
    /// stays within what the logs agree on, while this node still leads that fetch's
    /// epoch. Anything else is ignored: acknowledging less is always safe.
    pub(crate) async fn on_durable(&mut self, durable: Lsn) -> Result<(), ConnError> {
        let Some(replica) = self.acks.replica.clone() else {
            return Ok(());
        };
        if durable <= self.acks.durable || durable > self.acks.agreed {
            debug!(peer = %self.addr, durable, acked = self.acks.durable, agreed = self.acks.agreed, "a Durable frame moved nothing");
            return Ok(());
        }
        self.acks.durable = durable;
        let epoch = self.acks.epoch;
        lead_call(self.log, move |l| {
            if l.leader_epoch() == Some(epoch) {
                l.acknowledged(&replica, durable);
            }
        })
        .await
        .map_err(|_| ConnError::Cancelled { peer: self.addr })
    }

    /// The acknowledgement renewed by a long-poll with no news (as `waited` did): still
    /// caught up, still fetching, still durable up to what it last said.
    async fn renew(&mut self, fetch: &Fetch) -> Result<bool, ConnError> {
        let (replica, epoch) = (fetch.replica.clone(), fetch.view.current_epoch);
        let (after, durable) = (fetch.view.fetch_lsn, self.acks.durable.max(fetch.acked));
        lead_call(self.log, move |l| {
            let moved = l.shippable_end() > after;
            if !moved && l.leader_epoch() == Some(epoch) {
                l.acknowledged(&replica, durable);
            }
            moved
        })
        .await
        .map_err(|_| ConnError::Cancelled { peer: self.addr })
    }

    /// A frame read during a long-poll: only a `Durable` may come while a fetch waits for
    /// its answer (one fetch in flight per connection).
    async fn during_poll(
        &mut self,
        frame: Result<Option<Message>, WireError>,
    ) -> Result<bool, ConnError> {
        let peer = self.addr;
        match frame {
            Ok(Some(Message::Durable { durable_lsn })) => {
                self.on_durable(durable_lsn).await?;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Ok(Some(other)) => Err(ConnError::OutOfTurn {
                peer,
                got: other.name(),
            }),
            Err(source) => Err(ConnError::Wire {
                peer,
                what: "reading during a long-poll",
                source,
            }),
        }
    }
}

/// One decoded fetch, with its limits already clamped to the leader's.
pub(crate) struct Fetch {
    pub(crate) replica: String,
    pub(crate) view: FetchView,
    /// What the fetch acknowledges: every record below it is durable on the follower
    /// (`fetch_lsn` for a `Fetch`, `durable_lsn` for a `FetchAhead`).
    pub(crate) acked: Lsn,
    pub(crate) max_bytes: usize,
    pub(crate) wait: Duration,
}

/// The answer to one fetch; `None` when shutdown came during the long-poll (or the
/// follower closed the connection).
pub(crate) async fn answer_fetch<L: LeaderLog>(
    conn: &mut Conn<'_, L>,
    fetch: &Fetch,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Message>, ConnError> {
    let cancelled = |_| ConnError::Cancelled { peer: conn.addr };
    let first = decide_and_read(conn.log, fetch, fetch.acked)
        .await
        .map_err(cancelled)?;
    conn.answered(fetch, &first, fetch.acked);
    let caught_up = matches!(&first, Message::Records { entries, .. } if entries.is_empty());
    if !caught_up || fetch.wait.is_zero() {
        return Ok(Some(first));
    }
    let deadline = Instant::now() + fetch.wait;
    if !long_poll(conn, fetch, deadline, shutdown).await? {
        return Ok(None);
    }
    // Decide again: leadership, the hw and the log may all have moved during the wait; and
    // the follower's acknowledgement, if `Durable` frames came (never back below them).
    let acked = conn.acks.durable.max(fetch.acked);
    let again = decide_and_read(conn.log, fetch, acked).await;
    let again = again.map_err(|_| ConnError::Cancelled { peer: conn.addr })?;
    conn.answered(fetch, &again, acked);
    Ok(Some(again))
}

/// The long-poll: until the shippable end passes the fetch's lsn or `deadline`, on the
/// log's watch (woken by the write or sync itself) or, for a log without one, in
/// `wait_durable` slices on the blocking pool (one at a time). `Durable` frames are taken
/// as they come; each `WAIT_SLICE` without news renews the follower's acknowledgement.
/// `false`: shutdown came first, or the follower closed the connection.
async fn long_poll<L: LeaderLog>(
    conn: &mut Conn<'_, L>,
    fetch: &Fetch,
    deadline: Instant,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<bool, ConnError> {
    let after = fetch.view.fetch_lsn;
    let mut durable = conn.log.shippable_watch();
    let mut slice_wait: Option<SliceWait> = None;
    loop {
        if durable
            .as_mut()
            .is_some_and(|d| *d.borrow_and_update() > after)
        {
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(true);
        }
        let slice = left.min(WAIT_SLICE);
        if durable.is_none() && slice_wait.is_none() {
            let log = Arc::clone(conn.log);
            let wait = async move { lead_call(&log, move |l| l.wait_durable(after, slice)).await };
            slice_wait = Some(Box::pin(wait));
        }
        let max = conn.opts.frame_bytes_max;
        tokio::select! {
            _ = wait_shutdown(shutdown) => return Ok(false),
            frame = conn.reader.next(conn.stream, max) => {
                if !conn.during_poll(frame).await? {
                    return Ok(false);
                }
            }
            changed = watch_moved(&mut durable) => {
                if changed.is_err() {
                    return Ok(true); // the log is gone: answer now, from what it says
                }
            }
            waited = finished(&mut slice_wait) => {
                slice_wait = None;
                let end = waited.map_err(|_| ConnError::Cancelled { peer: conn.addr })?;
                if end > after || conn.renew(fetch).await? {
                    return Ok(true);
                }
            }
            () = tokio::time::sleep(slice), if durable.is_some() => {
                // No news for a slice: still caught up at `after`, so the acknowledgement is
                // renewed; and the end is read once more, in case the watch missed it.
                if conn.renew(fetch).await? {
                    return Ok(true);
                }
            }
        }
    }
}

/// One `wait_durable` slice on the blocking pool, kept across the long-poll's turns so
/// that a `Durable` frame does not start a second.
type SliceWait =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Lsn, Cancelled>> + Send>>;

/// The slice's end; never, without one.
async fn finished(w: &mut Option<SliceWait>) -> Result<Lsn, Cancelled> {
    match w {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

/// `leader_answer`, and for `Read` the acknowledgement and the records, in one trip to the
/// blocking pool. `saw_higher_epoch` is called here for `UnknownEpoch`.
async fn decide_and_read<L: LeaderLog>(
    log: &Arc<L>,
    fetch: &Fetch,
    acked: Lsn,
) -> Result<Message, Cancelled> {
    let replica = fetch.replica.clone();
    let view = fetch.view;
    let max_bytes = fetch.max_bytes;
    lead_call(log, move |l| match leader_answer(l, &view) {
        Answer::NotLeader { epoch } => Message::NotLeader { epoch },
        Answer::UnknownEpoch { leader_epoch } => {
            info!(
                replica,
                epoch = view.current_epoch,
                leader_epoch,
                "a follower knows a newer epoch: stepping down"
            );
            l.saw_higher_epoch(view.current_epoch);
            Message::UnknownEpoch { leader_epoch }
        }
        Answer::ImplausibleEpoch { leader_epoch } => {
            warn!(
                replica,
                epoch = view.current_epoch,
                leader_epoch,
                "a follower claims an epoch no promotion could have minted yet: refused"
            );
            Message::Error {
                message: format!(
                    "epoch {} is implausible beside this leader's {leader_epoch}: refused",
                    view.current_epoch
                ),
            }
        }
        Answer::FencedEpoch { leader_epoch } => Message::FencedEpoch { leader_epoch },
        Answer::Diverging {
            leader_epoch,
            epoch,
            end_lsn,
        } => {
            l.fell_behind(&replica, "its log diverges from this leader's");
            Message::Diverging {
                leader_epoch,
                epoch,
                end_lsn,
            }
        }
        Answer::OutOfRange { log_start } => {
            l.fell_behind(&replica, "it is behind what this leader retains");
            Message::OutOfRange { log_start }
        }
        Answer::Read { leader_epoch } => read_records(
            l,
            &replica,
            (view.fetch_lsn, acked),
            leader_epoch,
            max_bytes,
        ),
    })
    .await
}

/// The `Records` answer: acknowledge (this fetch passed every check, so what it says is
/// durable counts toward the hw, Kip320's fenced hw rule), then read from `fetch_lsn`.
fn read_records<L: LeaderLog>(
    l: &L,
    replica: &str,
    (fetch_lsn, acked): (Lsn, Lsn),
    leader_epoch: Epoch,
    max_bytes: usize,
) -> Message {
    let hw = l.acknowledged(replica, acked);
    let log_start = l.log_start();
    let mut entries = if fetch_lsn < l.shippable_end() {
        match l.read(fetch_lsn, max_bytes) {
            Ok(entries) => entries,
            Err(e) => {
                warn!(replica, fetch_lsn, error = %e, "reading records for a follower failed");
                return Message::Error {
                    message: format!("leader failed to read from lsn {fetch_lsn}: {e}"),
                };
            }
        }
    } else {
        Vec::new()
    };
    if let Some(bad) = entries
        .iter()
        .enumerate()
        .find(|(i, e)| e.lsn != fetch_lsn + *i as Lsn)
    {
        let message = format!(
            "leader read lsn {} where {} was due",
            bad.1.lsn,
            fetch_lsn + bad.0 as Lsn
        );
        warn!(replica, "{message}");
        return Message::Error { message };
    }
    fit(&mut entries, max_bytes);
    Message::Records {
        leader_epoch,
        hw,
        log_start,
        entries,
    }
}

/// Keeps the longest prefix of `entries` within `max_bytes` of encoding (at least one: a
/// record larger than a frame fails at encode and is answered with an `Error`).
fn fit(entries: &mut Vec<Entry>, max_bytes: usize) {
    let mut bytes = 0;
    let keep = entries
        .iter()
        .position(|e| {
            bytes += ENTRY_HEADER_BYTES + e.payload.len();
            bytes > max_bytes
        })
        .map_or(entries.len(), |i| i.max(1));
    entries.truncate(keep);
}

/// Writes one answer within the write timeout. An answer too large for a frame is replaced
/// by an `Error` naming it.
pub(crate) async fn send(
    stream: &mut Stream,
    peer: SocketAddr,
    msg: &Message,
    opts: &LeaderOptions,
) -> Result<(), ConnError> {
    let bytes = match wire::encode(msg, opts.frame_bytes_max) {
        Ok(bytes) => bytes,
        Err(e) => {
            warn!(%peer, answer = msg.name(), error = %e, "answer does not fit in a frame");
            let message = format!("{} answer does not fit in a frame: {e}", msg.name());
            wire::encode(&Message::Error { message }, opts.frame_bytes_max).map_err(|source| {
                ConnError::Wire {
                    peer,
                    what: "encoding an Error answer",
                    source,
                }
            })?
        }
    };
    match timeout(opts.write_timeout, write_encoded(stream, &bytes)).await {
        Err(_) => Err(ConnError::Timeout {
            peer,
            what: "writing an answer",
        }),
        Ok(Err(source)) => Err(ConnError::Wire {
            peer,
            what: "writing an answer",
            source,
        }),
        Ok(Ok(())) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(lsn: Lsn, n: usize) -> Entry {
        Entry {
            lsn,
            epoch: 1,
            kind: 0,
            payload: vec![0; n],
        }
    }

    #[test]
    fn fit_keeps_a_prefix_within_the_budget_and_at_least_one() {
        let mut e = vec![entry(1, 10), entry(2, 10), entry(3, 10)];
        fit(&mut e, 2 * (ENTRY_HEADER_BYTES + 10));
        assert_eq!(e.len(), 2);
        let mut e = vec![entry(1, 100), entry(2, 1)];
        fit(&mut e, 10);
        assert_eq!(e.len(), 1);
        let mut e = vec![];
        fit(&mut e, 10);
        assert!(e.is_empty());
    }
}

//! The leader's side of the protocol: `serve_followers` accepts follower connections and
//! answers each `Fetch` (or `FetchAhead`) with `decide::leader_answer`, long-polling when
//! the follower is caught up, and takes `Durable` frames whenever they come, a long-poll
//! included (`Conn`). It owns the sockets and the waiting; it never decides (that is `decide`) and
//! never touches the log except through `LeaderLog`, whose every call runs on the blocking
//! pool. A bad peer (garbage, a timeout, a closed socket) ends only its own connection.
//! `serve_followers_on` is the same server on another network than the kernel's (a
//! simulator's: `roost-sim` passes turmoil's listener).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};
use tracing::{debug, info, warn};

use crate::admit::{Admission, Place};
use crate::decide::{leader_answer, Answer, FetchView};
use crate::log::{Entry, Epoch, LeaderLog, Lsn};
use crate::options::LeaderOptions;
use crate::task::{check_join, lead_call, shutdown_requested, wait_shutdown, Cancelled};
use crate::transport::{Accepted, Listen, Peer, Stream};
use crate::wire::{
    self, kind, kind_name, write_encoded, FrameReader, Message, WireError, ENTRY_HEADER_BYTES,
    FRAME_HEADER_BYTES, RECORDS_HEADER_BYTES,
};

/// The long-poll waits on the blocking pool in slices this long, so that shutdown is seen
/// within one slice and no blocking task outlives it by more.
const WAIT_SLICE: Duration = Duration::from_millis(200);

/// Why one follower connection ended badly (logged; the server keeps serving the others).
#[derive(Debug, thiserror::Error)]
enum ConnError {
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

/// Serves followers on `listener` until `shutdown` turns true (or its sender is dropped),
/// then waits for every connection to finish its current answer. Several followers may be
/// connected; each connection is one task. A panic in a connection task is re-raised here.
pub async fn serve_followers<L: LeaderLog>(
    listener: TcpListener,
    log: Arc<L>,
    opts: LeaderOptions,
    shutdown: watch::Receiver<bool>,
) {
    serve(Listener::Tcp(listener), log, opts, shutdown).await;
}

/// [`serve_followers`] on connections from `listener` (another network than the kernel's;
/// the transport must be plain).
pub async fn serve_followers_on<L: LeaderLog>(
    listener: Box<dyn Listen>,
    log: Arc<L>,
    opts: LeaderOptions,
    shutdown: watch::Receiver<bool>,
) {
    serve(Listener::Other(listener), log, opts, shutdown).await;
}

/// Where connections come from.
enum Listener {
    Tcp(TcpListener),
    Other(Box<dyn Listen>),
}

impl Listener {
    /// Cancel-safe, as both kinds' `accept` are.
    async fn accept(&mut self) -> std::io::Result<(Accepted, SocketAddr)> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, a)| (Accepted::Tcp(s), a)),
            Listener::Other(l) => l.accept().await.map(|(s, a)| (Accepted::Other(s), a)),
        }
    }
}

async fn serve<L: LeaderLog>(
    mut listener: Listener,
    log: Arc<L>,
    opts: LeaderOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    let admission = Admission::new();
    while !shutdown_requested(&shutdown) {
        tokio::select! {
            _ = wait_shutdown(&mut shutdown) => break,
            Some(done) = conns.join_next(), if !conns.is_empty() => check_join(done),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Some(place) = admission.admit(conns.len(), peer, &opts) else { continue };
                    let conn = serve_connection((stream, place), peer, Arc::clone(&log), opts.clone(), shutdown.clone());
                    conns.spawn(conn);
                }
                Err(e) => {
                    // Out of descriptors and the like: not this server's end, so wait and go on.
                    warn!(error = %e, "accepting a follower connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    while let Some(done) = conns.join_next().await {
        check_join(done);
    }
}

async fn serve_connection<L: LeaderLog>(
    (conn, mut place): (Accepted, Place),
    addr: SocketAddr,
    log: Arc<L>,
    opts: LeaderOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    let accepted = tokio::select! {
        _ = wait_shutdown(&mut shutdown) => return,
        a = opts.transport.accept_any(conn, addr) => a,
    };
    place.handshake_done();
    let (mut stream, peer) = match accepted {
        Ok(a) => a,
        Err(e) => {
            let admission = place.admission();
            admission.log(|n| warn!(peer = %addr, error = %e, also_failed = n, "a replication peer failed the TLS handshake: closed"));
            return;
        }
    };
    debug!(peer = %addr, authenticated = peer.authenticated(), "follower connected");
    let mut replica = None;
    let result =
        connection_loop(&mut stream, &peer, &log, &opts, &mut shutdown, &mut replica).await;
    match result {
        Ok(None) => debug!(peer = %addr, ?replica, "follower connection closed"),
        Ok(Some((name, first))) => {
            let limits = (opts.frame_bytes_max, opts.write_timeout);
            crate::forward::serve_forwards(stream, (addr, name), log, limits, shutdown, first)
                .await;
            return;
        }
        Err(e) => warn!(error = %e, "follower connection ended"),
    }
    if let Some(name) = replica {
        let _ = lead_call(&log, move |l| l.disconnected(&name)).await;
    }
}

/// A connection whose first request was a `Forward`: `(replica, (id, batch))`, handed to
/// `forward::serve_forwards` with the stream.
type FirstForward = (String, (u64, Vec<u8>));

async fn connection_loop<L: LeaderLog>(
    stream: &mut Stream,
    peer: &Peer,
    log: &Arc<L>,
    opts: &LeaderOptions,
    shutdown: &mut watch::Receiver<bool>,
    replica: &mut Option<String>,
) -> Result<Option<FirstForward>, ConnError> {
    // The name this connection speaks as (any request); `replica` is set by fetches only:
    // the standby whose connection state `disconnected` clears at the end.
    let mut bound: Option<String> = None;
    let mut conn = Conn::new(stream, peer.addr, log, opts);
    loop {
        let request = match next_request(&mut conn, shutdown).await? {
            None => return Ok(None),
            Some(r) => r,
        };
        let Some(name) = request.replica() else {
            if let Request::Durable(durable) = request {
                conn.on_durable(durable)?;
            }
            continue;
        };
        permitted(conn.stream, peer, opts, name).await?;
        same_replica(&mut bound, peer, name)?;
        let fetch = match request {
            Request::Fetch(f) => f,
            Request::Durable(_) => continue,
            Request::Snapshot {
                replica,
                current_epoch,
            } => {
                let limits = (opts.frame_bytes_max, opts.write_timeout);
                let addr = peer.addr;
                crate::snapshot::serve_snapshot(
                    conn.stream,
                    addr,
                    log,
                    limits,
                    replica,
                    current_epoch,
                )
                .await;
                return Ok(None);
            }
            // Only as a connection's first request: a fetching connection stays one.
            Request::Forward {
                replica: r,
                id,
                batch,
            } if replica.is_none() => {
                return Ok(Some((r, (id, batch))));
            }
            Request::Forward { .. } => {
                let got = "Forward";
                return Err(ConnError::Unexpected {
                    peer: peer.addr,
                    got,
                });
            }
        };
        replica.get_or_insert_with(|| fetch.replica.clone());
        let Some(answer) = answer_fetch(&mut conn, &fetch, shutdown).await? else {
            return Ok(None);
        };
        send(conn.stream, peer.addr, &answer, opts).await?;
    }
}

/// One follower connection: its stream, read through one cancel-safe reader (a `Durable`
/// frame is read during a long-poll), and what the follower has acknowledged on it.
struct Conn<'a, L: LeaderLog> {
    stream: &'a mut Stream,
    reader: FrameReader,
    addr: SocketAddr,
    log: &'a Arc<L>,
    opts: &'a LeaderOptions,
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
    fn new(
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
    fn on_durable(&mut self, durable: Lsn) -> Result<(), ConnError> {
        let Some(replica) = self.acks.replica.clone() else {
            return Ok(());
        };
        if durable <= self.acks.durable || durable > self.acks.agreed {
            debug!(peer = %self.addr, durable, acked = self.acks.durable, agreed = self.acks.agreed, "a Durable frame moved nothing");
            return Ok(());
        }
        self.acks.durable = durable;
        // On this thread: both calls take locks only (`LeaderLog::acknowledged`), and a trip
        // to the blocking pool would add a thread's wake-up to every answer that waits.
        if self.log.leader_epoch() == Some(self.acks.epoch) {
            self.log.acknowledged(&replica, durable);
        }
        Ok(())
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
                self.on_durable(durable_lsn)?;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Ok(Some(other)) => Err(ConnError::Unexpected {
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

/// One connection speaks as one replica: the first request's name, fetch or base backup,
/// is the connection's; another name later ends it.
fn same_replica(replica: &mut Option<String>, peer: &Peer, now: &str) -> Result<(), ConnError> {
    match replica {
        Some(was) if was != now => Err(ConnError::RenamedReplica {
            peer: peer.addr,
            was: was.clone(),
            now: now.to_owned(),
        }),
        Some(_) => Ok(()),
        None => {
            *replica = Some(now.to_owned());
            Ok(())
        }
    }
}

/// A request naming a replica this connection may not speak as (`Peer::may_speak_as`) is
/// answered with an `Error` and ends the connection: nothing is read, acknowledged or
/// decided for it.
async fn permitted(
    stream: &mut Stream,
    peer: &Peer,
    opts: &LeaderOptions,
    replica: &str,
) -> Result<(), ConnError> {
    let Err(why) = peer.may_speak_as(replica) else {
        return Ok(());
    };
    let message = format!("this connection may not speak as replica {replica:?}: {why}");
    let _ = send(stream, peer.addr, &Message::Error { message }, opts).await;
    Err(ConnError::NotPermitted {
        peer: peer.addr,
        replica: replica.to_owned(),
        why,
    })
}

/// What a follower may send.
enum Request {
    Fetch(Fetch),
    /// A `Durable` frame between fetches (`Conn::on_durable`).
    Durable(Lsn),
    /// A base backup (`snapshot.rs`); the connection ends after it.
    Snapshot {
        replica: String,
        current_epoch: Epoch,
    },
    /// A forwarded batch (`forward.rs`); the connection carries only forwards after it.
    Forward {
        replica: String,
        id: u64,
        batch: Vec<u8>,
    },
}

impl Request {
    /// The replica the request speaks as (`None`: it names none, it belongs to the
    /// connection's fetches).
    fn replica(&self) -> Option<&str> {
        match self {
            Request::Fetch(f) => Some(&f.replica),
            Request::Durable(_) => None,
            Request::Snapshot { replica, .. } | Request::Forward { replica, .. } => Some(replica),
        }
    }
}

/// Reads the next request within the idle timeout. `None`: the peer closed the connection
/// or shutdown came. A bad frame or another message is answered with an `Error` (best
/// effort) and ends the connection.
async fn next_request<L: LeaderLog>(
    conn: &mut Conn<'_, L>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Request>, ConnError> {
    let (peer, opts) = (conn.addr, conn.opts);
    let read = tokio::select! {
        _ = wait_shutdown(shutdown) => return Ok(None),
        r = timeout(opts.idle_timeout, conn.reader.next(conn.stream, opts.frame_bytes_max)) => r,
    };
    let msg = match read {
        Err(_) => {
            let what = "waiting for a Fetch";
            return Err(ConnError::Timeout { peer, what });
        }
        Ok(Ok(None)) => return Ok(None),
        Ok(Ok(Some(msg))) => msg,
        Ok(Err(source)) => {
            let message = format!("bad frame: {source}");
            let _ = send(conn.stream, peer, &Message::Error { message }, opts).await;
            let what = "reading a Fetch";
            return Err(ConnError::Wire { peer, what, source });
        }
    };
    match request(msg, opts) {
        Ok(r) => Ok(Some(r)),
        Err(message) => {
            let got = kind_name(message.0);
            let _ = send(
                conn.stream,
                peer,
                &Message::Error { message: message.1 },
                opts,
            )
            .await;
            Err(ConnError::Unexpected { peer, got })
        }
    }
}

/// The request a follower's message is; `Err((type, why))` for a message no follower sends
/// to a leader, or a `FetchAhead` that acknowledges more than it holds.
fn request(msg: Message, opts: &LeaderOptions) -> Result<Request, (u8, String)> {
    let (replica, view, acked, max_bytes, wait_ms) = match msg {
        Message::Snapshot {
            replica,
            current_epoch,
        } => {
            return Ok(Request::Snapshot {
                replica,
                current_epoch,
            })
        }
        Message::Forward { replica, id, batch } => {
            return Ok(Request::Forward { replica, id, batch })
        }
        Message::Durable { durable_lsn } => return Ok(Request::Durable(durable_lsn)),
        Message::Fetch {
            replica,
            current_epoch,
            fetch_lsn,
            last_epoch,
            max_bytes,
            wait_ms,
        } => {
            let view = FetchView {
                current_epoch,
                fetch_lsn,
                last_epoch,
            };
            (replica, view, fetch_lsn, max_bytes, wait_ms)
        }
        Message::FetchAhead {
            replica,
            current_epoch,
            fetch_lsn,
            durable_lsn,
            last_epoch,
            max_bytes,
            wait_ms,
        } => {
            if durable_lsn > fetch_lsn {
                let why =
                    format!("a FetchAhead at lsn {fetch_lsn} says lsn {durable_lsn} is durable");
                return Err((kind::FETCH_AHEAD, why));
            }
            let view = FetchView {
                current_epoch,
                fetch_lsn,
                last_epoch,
            };
            (replica, view, durable_lsn, max_bytes, wait_ms)
        }
        other => {
            let got = other.name();
            return Err((other.kind(), format!("expected a Fetch, got {got}")));
        }
    };
    Ok(Request::Fetch(Fetch {
        replica,
        view,
        acked,
        max_bytes: fetch_bytes(max_bytes, opts.frame_bytes_max),
        wait: Duration::from_millis(u64::from(wait_ms)).min(opts.wait_max),
    }))
}

/// One decoded fetch, with its limits already clamped to the leader's.
struct Fetch {
    replica: String,
    view: FetchView,
    /// What the fetch acknowledges: every record below it is durable on the follower
    /// (`fetch_lsn` for a `Fetch`, `durable_lsn` for a `FetchAhead`).
    acked: Lsn,
    max_bytes: usize,
    wait: Duration,
}

/// The record bytes one answer may carry: what the fetch asks, within one frame.
fn fetch_bytes(asked: u32, frame_bytes_max: u32) -> usize {
    let room = (frame_bytes_max as usize).saturating_sub(FRAME_HEADER_BYTES + RECORDS_HEADER_BYTES);
    (asked as usize).min(room)
}

/// The answer to one fetch; `None` when shutdown came during the long-poll (or the
/// follower closed the connection).
async fn answer_fetch<L: LeaderLog>(
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
            changed = changed(&mut durable) => {
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

/// The watch's next change; never, without a watch.
async fn changed(w: &mut Option<watch::Receiver<Lsn>>) -> Result<(), watch::error::RecvError> {
    match w {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

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
async fn send(
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

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
use tokio::time::timeout;
use tracing::{debug, warn};

use crate::admit::{Admission, Place};
use crate::decide::FetchView;
use crate::fetching::{answer_fetch, send, Conn, ConnError, Fetch};
use crate::log::{Epoch, LeaderLog, Lsn};
use crate::options::LeaderOptions;
use crate::task::{check_join, lead_call, shutdown_requested, wait_shutdown};
use crate::transport::{Accepted, Listen, Peer, Stream};
use crate::wire::{kind, kind_name, Message, FRAME_HEADER_BYTES, RECORDS_HEADER_BYTES};

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
                conn.on_durable(durable).await?;
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
        Err((kind, why)) => {
            let got = kind_name(kind);
            let message = why.clone();
            let _ = send(conn.stream, peer, &Message::Error { message }, opts).await;
            Err(ConnError::Refused { peer, got, why })
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

/// The record bytes one answer may carry: what the fetch asks, within one frame.
fn fetch_bytes(asked: u32, frame_bytes_max: u32) -> usize {
    let room = (frame_bytes_max as usize).saturating_sub(FRAME_HEADER_BYTES + RECORDS_HEADER_BYTES);
    (asked as usize).min(room)
}

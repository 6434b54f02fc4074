//! Forwarded batches (issue 27): a standby that a client handed a batch passes it to the
//! leader over an authenticated replication connection; the leader runs it as its own
//! (one planner: request keys dedupe across nodes) and answers with the result, which the
//! standby gives its client once its own log holds the leader's durable end at that answer.
//!
//! A connection that starts with `Forward` carries only forwards, many at once: each has an
//! `id`, and its `ForwardAnswer` or `ForwardRefused` carries it back, in any order. The
//! leader runs at most [`FORWARDS_PER_CONNECTION`] of one connection's at once (more wait
//! unread in the socket: back-pressure), each on the blocking pool.
//!
//! ```text
//!  standby                                leader
//!    Forward{replica, id, batch}  ----->  LeaderLog::forward (planned, claimed, answered)
//!    <-----  ForwardAnswer{id, leader_epoch, durable_lsn, answer}  (or ForwardRefused)
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::time::timeout;
use tracing::{debug, warn};

use crate::log::{Epoch, Forwarded, LeaderLog};
use crate::task::{lead_call, wait_shutdown};
use crate::transport::{Stream, Transport};
use crate::wire::{read_frame, write_encoded, FrameReader, Message};

/// The longest a member's write of one forward may take (a leader that stops reading).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Forwards of one connection the leader runs at once.
pub const FORWARDS_PER_CONNECTION: usize = 64;

/// The leader's side of a forwarding connection, from its first `Forward` (already read
/// and permitted) until the peer closes it, a frame is bad, or shutdown comes.
pub(crate) async fn serve_forwards<L: LeaderLog>(
    stream: Stream,
    peer: (SocketAddr, String),
    log: Arc<L>,
    (frame_bytes_max, write_timeout): (u32, Duration),
    mut shutdown: watch::Receiver<bool>,
    first: (u64, Vec<u8>),
) {
    let (mut reader, writer) = tokio::io::split(stream);
    let mut frames = FrameReader::default();
    let (tx, rx) = mpsc::channel::<Message>(FORWARDS_PER_CONNECTION);
    let writing = tokio::spawn(write_answers(writer, rx, frame_bytes_max, write_timeout));
    let slots = Arc::new(Semaphore::new(FORWARDS_PER_CONNECTION));
    let mut next = Some(first);
    loop {
        let one = match next.take() {
            Some(f) => f,
            None => {
                let read = (&mut reader, &mut frames);
                match next_forward(read, &peer, frame_bytes_max, &mut shutdown).await {
                    Some(f) => f,
                    None => break,
                }
            }
        };
        let Ok(mut slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let mut group = vec![one];
        let mut ended = false;
        // What else came with it, already read into the socket: one group, one run.
        while group.len() < FORWARDS_PER_CONNECTION {
            let Ok(more) = slots.clone().try_acquire_owned() else {
                break;
            };
            let read = (&mut reader, &mut frames);
            match ready_now(next_forward(read, &peer, frame_bytes_max, &mut shutdown)) {
                Some(Some(f)) => {
                    slot.merge(more);
                    group.push(f);
                }
                Some(None) => {
                    ended = true;
                    break;
                }
                None => break,
            }
        }
        let (log, tx, replica) = (log.clone(), tx.clone(), peer.1.clone());
        tokio::spawn(async move {
            for msg in run_group(&log, replica, group).await {
                let _ = tx.send(msg).await;
            }
            drop(slot); // one permit per forward of the group, however the task ends
        });
        if ended {
            break;
        }
    }
    drop(tx);
    let _ = writing.await;
}

/// `f`'s outcome if it is ready at the first poll (what is already in the socket), else
/// `None`. Only for a cancel-safe `f` (`FrameReader::next`): what it began stays begun.
fn ready_now<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// The next `Forward` on the connection; `None` at its end (closed, shutdown, a bad frame
/// or another message, logged).
async fn next_forward(
    (reader, frames): (&mut ReadHalf<Stream>, &mut FrameReader),
    (addr, replica): &(SocketAddr, String),
    frame_bytes_max: u32,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<(u64, Vec<u8>)> {
    let read = tokio::select! {
        _ = wait_shutdown(shutdown) => return None,
        r = frames.next(reader, frame_bytes_max) => r,
    };
    match read {
        Ok(Some(Message::Forward {
            replica: r,
            id,
            batch,
        })) if &r == replica => Some((id, batch)),
        Ok(None) => None,
        Ok(Some(other)) => {
            warn!(peer = %addr, replica, got = other.name(), "a forwarding connection sent something else (or spoke as another replica): closed");
            None
        }
        Err(e) => {
            warn!(peer = %addr, replica, error = %e, "a forwarding connection sent a bad frame: closed");
            None
        }
    }
}

/// Forwarded batches that came together, through the leader's log as one group
/// (`LeaderLog::forward_group`), as the messages that answer them, in order.
async fn run_group<L: LeaderLog>(
    log: &Arc<L>,
    replica: String,
    group: Vec<(u64, Vec<u8>)>,
) -> Vec<Message> {
    let (ids, batches): (Vec<u64>, Vec<Vec<u8>>) = group.into_iter().unzip();
    let (n, who) = (ids.len(), replica.clone());
    let r = lead_call(log, move |l| {
        (l.forward_group(&replica, &batches), l.leader_epoch())
    });
    let (outcomes, epoch) = match r.await {
        Ok((outcomes, epoch)) if outcomes.len() == n => (outcomes, epoch),
        Ok((outcomes, _)) => {
            let why = format!(
                "the leader gave {} outcomes for {n} batches",
                outcomes.len()
            );
            warn!(replica = %who, "{why}");
            (vec![Forwarded::Refused(why); n], None)
        }
        Err(_) => {
            let why = Forwarded::Refused("the leader is shutting down".into());
            (vec![why; n], None)
        }
    };
    let leader_epoch = epoch.unwrap_or(0);
    ids.into_iter()
        .zip(outcomes)
        .map(|(id, done)| match done {
            Forwarded::Answer {
                answer,
                durable_lsn,
            } => Message::ForwardAnswer {
                id,
                leader_epoch,
                durable_lsn,
                answer,
            },
            Forwarded::Refused(reason) => Message::ForwardRefused {
                id,
                leader_epoch,
                reason,
            },
        })
        .collect()
}

/// Writes answers as they come, each within `write_timeout`; stops at the first failure
/// (the reader then sees the connection end) or when every sender is gone.
async fn write_answers(
    mut writer: WriteHalf<Stream>,
    mut rx: mpsc::Receiver<Message>,
    frame_bytes_max: u32,
    write_timeout: Duration,
) {
    while let Some(msg) = rx.recv().await {
        let frame = match crate::wire::encode(&msg, frame_bytes_max) {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, "a forwarded batch's answer does not fit a frame");
                continue;
            }
        };
        match timeout(write_timeout, write_encoded(&mut writer, &frame)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return debug!(error = %e, "forwarding connection: write failed"),
            Err(_) => return debug!("forwarding connection: write timed out"),
        }
    }
}

/// Why a forward got no answer from the leader.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot reach the leader at {addr}: {detail}")]
    Unreachable { addr: String, detail: String },
    #[error("the connection to the leader at {addr} ended before it answered: {detail}")]
    Lost { addr: String, detail: String },
    #[error("the leader at {addr} did not answer within {after:?}")]
    Timeout { addr: String, after: Duration },
}

/// The leader's reply to one forward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardReply {
    pub leader_epoch: Epoch,
    pub outcome: Forwarded,
}

/// The forwards waiting for a reply on one connection; `None` once the connection ended
/// (nothing more may wait on it).
type Pending = Arc<Mutex<Option<HashMap<u64, Waiter>>>>;
type Waiter = oneshot::Sender<Result<ForwardReply, String>>;

/// One open forwarding connection: requests go to its writer; the reader completes them.
struct Conn {
    addr: String,
    requests: mpsc::Sender<(u64, Vec<u8>)>,
    pending: Pending,
}

impl Conn {
    fn alive(&self) -> bool {
        !self.requests.is_closed() && self.pending.lock().is_ok_and(|p| p.is_some())
    }
}

/// A standby's side: forwards batches to the leader over one connection per leader address
/// (made on first use, made again after it fails), many in flight at once.
pub struct Forwarder {
    transport: Transport,
    replica: String,
    frame_bytes_max: u32,
    conn: tokio::sync::Mutex<Option<Conn>>,
    next_id: AtomicU64,
}

impl Forwarder {
    pub fn new(transport: Transport, replica: impl Into<String>, frame_bytes_max: u32) -> Self {
        Forwarder {
            transport,
            replica: replica.into(),
            frame_bytes_max,
            conn: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
    }

    /// Forwards `batch` to the leader at `addr` and waits (at most `limit`) for its reply.
    /// An error means no reply came: the batch may or may not have been claimed there, and
    /// sending it again (same request key) gets the original answer if it was.
    pub async fn forward(
        &self,
        addr: &str,
        batch: Vec<u8>,
        limit: Duration,
    ) -> Result<ForwardReply, ForwardError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (done_tx, done_rx) = oneshot::channel();
        let requests = self.connection(addr, limit, id, done_tx).await?;
        let lost = |detail: &str| ForwardError::Lost {
            addr: addr.to_owned(),
            detail: detail.to_owned(),
        };
        // Bounded like the answer: a leader that stopped reading fills the channel.
        match timeout(limit, requests.send((id, batch))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(lost("the connection closed")),
            Err(_) => {
                let after = limit;
                return Err(ForwardError::Timeout {
                    addr: addr.to_owned(),
                    after,
                });
            }
        }
        match timeout(limit, done_rx).await {
            Ok(Ok(Ok(reply))) => Ok(reply),
            Ok(Ok(Err(detail))) => Err(lost(&detail)),
            Ok(Err(_)) => Err(lost("the connection closed")),
            Err(_) => Err(ForwardError::Timeout {
                addr: addr.to_owned(),
                after: limit,
            }),
        }
    }

    /// The open connection to `addr` (made now if there is none, or it is to another
    /// address, or it ended), with `id`'s reply registered on it.
    async fn connection(
        &self,
        addr: &str,
        limit: Duration,
        id: u64,
        done: oneshot::Sender<Result<ForwardReply, String>>,
    ) -> Result<mpsc::Sender<(u64, Vec<u8>)>, ForwardError> {
        let mut conn = self.conn.lock().await;
        let usable = conn.as_ref().is_some_and(|c| c.addr == addr && c.alive());
        if !usable {
            *conn = Some(self.open(addr, limit).await?);
        }
        let registered = conn.as_ref().and_then(|c| {
            let mut p = c.pending.lock().ok()?;
            p.as_mut()?.insert(id, done);
            Some(c.requests.clone())
        });
        registered.ok_or_else(|| ForwardError::Lost {
            addr: addr.to_owned(),
            detail: "the connection ended as it was opened".into(),
        })
    }

    async fn open(&self, addr: &str, limit: Duration) -> Result<Conn, ForwardError> {
        let stream =
            self.transport
                .connect(addr, limit)
                .await
                .map_err(|e| ForwardError::Unreachable {
                    addr: addr.to_owned(),
                    detail: e.to_string(),
                })?;
        let (reader, writer) = tokio::io::split(stream);
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let (tx, rx) = mpsc::channel(FORWARDS_PER_CONNECTION);
        let limits = (self.replica.clone(), self.frame_bytes_max);
        tokio::spawn(write_requests(writer, rx, limits, pending.clone()));
        tokio::spawn(read_replies(reader, self.frame_bytes_max, pending.clone()));
        Ok(Conn {
            addr: addr.to_owned(),
            requests: tx,
            pending,
        })
    }
}

/// Writes each request as a `Forward`; at the first failure every pending forward fails.
async fn write_requests(
    mut writer: WriteHalf<Stream>,
    mut rx: mpsc::Receiver<(u64, Vec<u8>)>,
    (replica, frame_bytes_max): (String, u32),
    pending: Pending,
) {
    while let Some((id, batch)) = rx.recv().await {
        let msg = Message::Forward {
            replica: replica.clone(),
            id,
            batch,
        };
        let sent = match crate::wire::encode(&msg, frame_bytes_max) {
            Ok(frame) => match timeout(WRITE_TIMEOUT, write_encoded(&mut writer, &frame)).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err(format!("writing a forward took over {WRITE_TIMEOUT:?}")),
            },
            Err(e) => Err(e.to_string()),
        };
        if let Err(detail) = sent {
            fail_all(&pending, &detail);
            return;
        }
    }
}

/// Completes pending forwards from the leader's replies; at the connection's end (or a
/// bad frame) every pending forward fails.
async fn read_replies(mut reader: ReadHalf<Stream>, frame_bytes_max: u32, pending: Pending) {
    let detail = loop {
        let (id, reply) = match read_frame(&mut reader, frame_bytes_max).await {
            Ok(Some(msg)) => match reply_of(msg) {
                Ok(r) => r,
                Err(detail) => break detail,
            },
            Ok(None) => break "the leader closed the connection".to_owned(),
            Err(e) => break e.to_string(),
        };
        let waiter = pending
            .lock()
            .ok()
            .and_then(|mut p| p.as_mut().and_then(|m| m.remove(&id)));
        if let Some(w) = waiter {
            let _ = w.send(Ok(reply));
        }
    };
    fail_all(&pending, &detail);
}

/// `(id, reply)` of a leader's answer to a forward; anything else ends the connection.
fn reply_of(msg: Message) -> Result<(u64, ForwardReply), String> {
    match msg {
        Message::ForwardAnswer {
            id,
            leader_epoch,
            durable_lsn,
            answer,
        } => Ok((
            id,
            ForwardReply {
                leader_epoch,
                outcome: Forwarded::Answer {
                    answer,
                    durable_lsn,
                },
            },
        )),
        Message::ForwardRefused {
            id,
            leader_epoch,
            reason,
        } => Ok((
            id,
            ForwardReply {
                leader_epoch,
                outcome: Forwarded::Refused(reason),
            },
        )),
        Message::Error { message } => Err(format!("the leader refused: {message}")),
        other => Err(format!("the leader sent a {} to a forward", other.name())),
    }
}

fn fail_all(pending: &Pending, detail: &str) {
    let waiters: Vec<Waiter> = match pending.lock() {
        Ok(mut p) => p.take().into_iter().flatten().map(|(_, w)| w).collect(),
        Err(_) => return,
    };
    for w in waiters {
        let _ = w.send(Err(detail.to_owned()));
    }
}

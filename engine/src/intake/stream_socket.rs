//! The streaming intake (docs/contract.md "Streaming intake"): a Unix socket, placed, made and
//! permissioned like the control socket, where a client sends batch JSON lines and reads one
//! answer line per request, in request order, each written only once its batch is as
//! durable as a published result file (the protocol itself is `intake::stream_protocol`). Per connection
//! a reader parses lines and starts batches on the blocking pool (the lines already
//! buffered, up to `GROUP_MAX`, together, and with other connections' lines that wait with
//! them, up to `GROUP_MAX` batches a group: `stream_gather.rs`; a group is one
//! `Engine::submit` with `Deliver::Early`, which hands each answer over where a spool file's
//! result would be published, before the group's durability tail), and a writer writes the
//! answers in order. A cluster standby forwards each connection's lines from a task on the
//! runtime instead (`forward`), ungathered: they only wait, for the leader and its own log.
//! A batch's place in its connection's window frees once its answer is written; its place
//! among the running batches once its group has handed its claims to the durability tail's
//! next round (`pipeline/settle.rs`), or once a standby's forward is answered.
//!
//! Bounds: a connection has at most `stream_in_flight_max` batches between its request line
//! and its written answer; at that many its reader stops reading the socket, so a client
//! that never reads its answers fills its own socket buffers and then blocks in its own
//! writes, and nothing else waits for it. All connections together run (or forward) at most
//! `stream_batches_running_max` batches at once. A request line is held up
//! to `stream_line_bytes_max` bytes; a longer one is skipped in chunks. At most
//! `stream_connections_max` connections. The graceful stop reads no more lines, lets the
//! batches started finish, gives the writers a bounded time for the last answers, and drops
//! the connections; this module never decides an answer itself beyond `invalid` lines and
//! `unavailable` (not taken now).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use super::stream_gather::{Gather, Lines};
use super::Shared;
use crate::batch::{Batch, BatchResult};
use crate::intake::stream_protocol::{next_line, parse_line, Answer, Line};
use crate::pipeline::intake_bytes::{IntakeBytes, IntakeHeld};
use crate::pipeline::Deliver;

/// The listener's state, as connections see it: reading, draining (no new line: the
/// daemon stops), closed (drop the connection now).
const OPEN: u8 = 0;
const DRAINING: u8 = 1;
const CLOSED: u8 = 2;

/// The reader's chunk: a line over the limit is skipped this much at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// After a failed `accept` (out of descriptors), wait this long before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What every connection shares.
struct Ctx {
    shared: Arc<Shared>,
    /// Streamed batches running (or forwarded), all connections together.
    running: Arc<Semaphore>,
    state: watch::Receiver<u8>,
    line_bytes_max: usize,
    in_flight_max: usize,
    /// `running`'s size: a group never asks for more.
    running_max: usize,
    /// What one connection may hold of `intake_bytes_max` (at least one line).
    share_bytes: u64,
    /// Batches from all connections gathered into groups (`stream_gather.rs`).
    gather: Arc<Gather>,
}

/// The listener and what the graceful stop needs to wind it down.
pub(crate) struct Stream {
    socket: PathBuf,
    accept: Option<JoinHandle<()>>,
    running: Arc<Semaphore>,
    running_max: u32,
    /// One permit per open connection.
    conns: Arc<Semaphore>,
    conns_max: u32,
    state: watch::Sender<u8>,
}

/// Semaphore sizes from the configuration (bounded so `acquire_many` can take them all).
fn permits(n: usize) -> u32 {
    u32::try_from(n.clamp(1, 1 << 20)).unwrap_or(1 << 20)
}

impl Stream {
    /// Binds the stream socket and starts accepting. A socket that cannot be bound is
    /// logged and the daemon serves on without it (like the control socket).
    pub fn start(shared: &Arc<Shared>) -> Stream {
        let cfg = shared.engine.config();
        let socket = crate::intake::stream_protocol::socket_path(cfg);
        let (running_max, conns_max) = (
            permits(cfg.stream_batches_running()),
            permits(cfg.stream_connections_max),
        );
        let running = Arc::new(Semaphore::new(running_max as usize));
        let conns = Arc::new(Semaphore::new(conns_max as usize));
        let (state, state_rx) = watch::channel(OPEN);
        let ctx = Arc::new(Ctx {
            shared: shared.clone(),
            running: running.clone(),
            state: state_rx,
            line_bytes_max: cfg.stream_line_bytes(),
            in_flight_max: permits(cfg.stream_in_flight_max) as usize,
            running_max: running_max as usize,
            share_bytes: cfg.intake_bytes() / u64::from(conns_max),
            gather: Arc::new(Gather::new(GROUP_MAX.min(running_max as usize))),
        });
        let accept = match crate::control::socket::bind_socket(&socket) {
            Ok(l) => {
                info!(socket = %socket.display(), "stream socket listening");
                Some(tokio::spawn(accept_loop(ctx, l, conns.clone())))
            }
            Err(e) => {
                warn!(socket = %socket.display(), error = %e, "stream socket unavailable; `roost submit --stream` will not work");
                None
            }
        };
        Stream {
            socket,
            accept,
            running,
            running_max,
            conns,
            conns_max,
            state,
        }
    }

    /// The graceful stop, step 1: no new connection, no new line.
    pub fn stop_reading(&self) {
        self.state.send_replace(DRAINING);
        if let Some(a) = &self.accept {
            a.abort();
        }
    }

    /// Streamed batches started (running on the blocking pool, queued for the next group:
    /// `stream_gather.rs`, or forwarded by a standby) right now.
    pub fn running(&self) -> usize {
        self.running_max as usize - self.running.available_permits()
    }

    /// Returns once no streamed batch runs; the permit keeps it so.
    pub async fn idle(&self) -> Option<OwnedSemaphorePermit> {
        self.running
            .clone()
            .acquire_many_owned(self.running_max)
            .await
            .ok()
    }

    /// Gives the connections `grace` to write their last answers (a client that does not
    /// read gets no more), then drops them and removes the socket.
    pub async fn close(self, grace: Duration) {
        let all = tokio::time::timeout(grace, self.conns.acquire_many(self.conns_max)).await;
        if all.is_err() {
            info!(
                grace_ms = grace.as_millis() as u64,
                "stream clients not reading their last answers: closing them"
            );
            self.state.send_replace(CLOSED);
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                self.conns.acquire_many(self.conns_max),
            )
            .await;
        }
        if self.accept.is_some() {
            let _ = roost_storage::Storage::remove(&roost_storage::RealStorage, &self.socket);
        }
    }
}

async fn accept_loop(ctx: Arc<Ctx>, listener: UnixListener, conns: Arc<Semaphore>) {
    let stats = &ctx.shared.engine.stats.stream;
    for conn in 1u64.. {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                warn!(error = %e, "stream socket: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        stats.connections_total.fetch_add(1, Ordering::Relaxed);
        match conns.clone().try_acquire_owned() {
            Ok(slot) => {
                tokio::spawn(connection(ctx.clone(), stream, conn, slot));
            }
            Err(_) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(refuse(stream));
            }
        }
    }
}

/// One answer line for a connection over `stream_connections_max`, then close.
async fn refuse(mut s: UnixStream) {
    warn!("stream connection refused: stream_connections_max connections are open");
    let a = Answer::unavailable(
        None,
        "too many stream connections (stream_connections_max): try again later",
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), s.write_all(&a.to_json_line())).await;
}

/// Counts a gauge up while alive.
struct Open<'a>(&'a AtomicU64);

impl<'a> Open<'a> {
    fn new(g: &'a AtomicU64) -> Open<'a> {
        g.fetch_add(1, Ordering::Relaxed);
        Open(g)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One connection: its reader and writer until the client is done (the writer then drains
/// what is left), the client goes away (the writer fails: the reader is dropped), or the
/// stop closes it.
async fn connection(ctx: Arc<Ctx>, stream: UnixStream, conn: u64, _slot: OwnedSemaphorePermit) {
    let _open = Open::new(&ctx.shared.engine.stats.stream.connections);
    debug!(conn, "stream connection");
    let mut state = ctx.state.clone();
    let (r, w) = stream.into_split();
    let window = Arc::new(Semaphore::new(ctx.in_flight_max));
    let (tx, rx) = mpsc::channel(ctx.in_flight_max);
    let work = async {
        let reader = read_batches(&ctx, r, tx, window, conn);
        let writer = write_answers(&ctx, w, rx, conn);
        tokio::pin!(reader, writer);
        tokio::select! {
            _ = &mut writer => {}
            _ = &mut reader => writer.await,
        }
    };
    tokio::select! {
        _ = work => debug!(conn, "stream connection done"),
        _ = state.wait_for(|s| *s >= CLOSED) => debug!(conn, "stream connection closed at stop"),
    }
}

/// A request in flight: its answer to come, and its place in the connection's window
/// (given back once the answer is written).
struct Pending {
    answer: oneshot::Receiver<Answer>,
    _place: Place,
}

/// Request lines the reader takes as one group when they are already buffered: their
/// batches run as one `Engine::submit` (one planner pass, one WAL sync, one flush per
/// shard). A client that waits for each answer sends groups of one, which
/// `stream_gather.rs` joins with other connections' into groups of at most this many.
const GROUP_MAX: usize = 64;

/// A request line's place: in its connection's window, and its bytes held against
/// `intake_bytes_max` (the connection's share and the stream's); given back once its answer
/// is written.
struct Place {
    _window: OwnedSemaphorePermit,
    _bytes: Option<(IntakeHeld, IntakeHeld)>,
}

/// A request line's bytes as the intake bound counts them (a line over the limit is not kept).
fn line_bytes(l: &Line) -> u64 {
    match l {
        Line::Bytes(b) => b.len() as u64,
        Line::TooLong { .. } => 0,
    }
}

/// Holds line `l`'s bytes: the connection's share first, then the stream's; waits for room.
async fn hold(ctx: &Ctx, own: &IntakeBytes, l: &Line) -> Option<(IntakeHeld, IntakeHeld)> {
    let n = line_bytes(l);
    let mine = own.take(n).await?;
    let all = ctx.shared.engine.intake.stream.take(n).await?;
    Some((mine, all))
}

/// [`hold`] if there is room now.
fn try_hold(ctx: &Ctx, own: &IntakeBytes, l: &Line) -> Option<(IntakeHeld, IntakeHeld)> {
    let n = line_bytes(l);
    let mine = own.try_take(n)?;
    let all = ctx.shared.engine.intake.stream.try_take(n)?;
    Some((mine, all))
}

/// Reads request lines while the window and the intake bound have room, starting their
/// batches (the lines already buffered as one group); ends at the end of the client's
/// input, a read error, or the stop. A line read whose bytes do not fit now waits, and the
/// connection is read no further meanwhile; at the stop it is started without them (and
/// answered `unavailable`).
async fn read_batches(
    ctx: &Ctx,
    r: OwnedReadHalf,
    tx: mpsc::Sender<Pending>,
    window: Arc<Semaphore>,
    conn: u64,
) {
    let mut state = ctx.state.clone();
    let mut r = BufReader::with_capacity(READ_CHUNK_BYTES, r);
    let group_max = GROUP_MAX.min(ctx.in_flight_max).min(ctx.running_max).max(1);
    let own = IntakeBytes::new(ctx.share_bytes);
    let mut carry: Option<(Line, OwnedSemaphorePermit)> = None;
    let mut n = 0u64;
    loop {
        let (first, permit) = match carry.take() {
            Some(c) => c,
            None => match next_in_window(ctx, &mut r, &window, conn).await {
                Some(c) => c,
                None => return,
            },
        };
        let bytes = tokio::select! {
            h = hold(ctx, &own, &first) => h,
            _ = state.wait_for(|s| *s >= DRAINING) => None,
        };
        let mut group = vec![(
            first,
            Place {
                _window: permit,
                _bytes: bytes,
            },
        )];
        let mut end = false;
        while group.len() < group_max && r.buffer().contains(&b'\n') {
            let Ok(p) = window.clone().try_acquire_owned() else {
                break;
            };
            match read_ok(next_line(&mut r, ctx.line_bytes_max).await, conn) {
                Some(l) => match try_hold(ctx, &own, &l) {
                    Some(h) => group.push((
                        l,
                        Place {
                            _window: p,
                            _bytes: Some(h),
                        },
                    )),
                    None => {
                        carry = Some((l, p));
                        break;
                    }
                },
                None => {
                    end = true;
                    break;
                }
            }
        }
        for pending in start_lines(ctx, group, conn, &mut n).await {
            if tx.send(pending).await.is_err() {
                return;
            }
        }
        if end {
            return;
        }
    }
}

/// The next request line once the window has room, with its place in it; `None` at the end
/// of the input, a read error or the stop.
async fn next_in_window(
    ctx: &Ctx,
    r: &mut BufReader<OwnedReadHalf>,
    window: &Arc<Semaphore>,
    conn: u64,
) -> Option<(Line, OwnedSemaphorePermit)> {
    let mut state = ctx.state.clone();
    let permit = tokio::select! {
        p = window.clone().acquire_owned() => p.ok()?,
        _ = state.wait_for(|s| *s >= DRAINING) => return None,
    };
    let line = tokio::select! {
        l = next_line(r, ctx.line_bytes_max) => l,
        _ = state.wait_for(|s| *s >= DRAINING) => return None,
    };
    read_ok(line, conn).map(|l| (l, permit))
}

/// A line read, or `None` at the end of the input or a read error (logged).
fn read_ok(line: std::io::Result<Option<Line>>, conn: u64) -> Option<Line> {
    match line {
        Ok(l) => l,
        Err(e) => {
            debug!(conn, error = %e, "stream connection: read failed");
            None
        }
    }
}

/// Parses the lines of a group (numbering them on from `n`) and starts their batches as one
/// group; an invalid line is answered at once. The answers to come, in line order.
async fn start_lines(ctx: &Ctx, lines: Vec<(Line, Place)>, conn: u64, n: &mut u64) -> Vec<Pending> {
    let (max, ops_max) = (ctx.line_bytes_max, ctx.shared.engine.config().batch_ops_max);
    let mut answers: Vec<Option<oneshot::Receiver<Answer>>> = Vec::with_capacity(lines.len());
    let mut batches = Vec::new();
    let mut permits = Vec::with_capacity(lines.len());
    for (line, permit) in lines {
        *n += 1;
        permits.push(permit);
        match parse_line(&line, *n, max, ops_max) {
            Ok(batch) => {
                batches.push((batch, format!("stream/{conn}/{n}")));
                answers.push(None);
            }
            Err(inv) => {
                ctx.shared
                    .engine
                    .stats
                    .invalid
                    .fetch_add(1, Ordering::Relaxed);
                answers.push(Some(ready(Answer::Result(BatchResult::invalid(&inv)))));
            }
        }
    }
    let mut started = start(ctx, batches).await.into_iter();
    answers
        .into_iter()
        .zip(permits)
        .map(|(a, permit)| Pending {
            answer: a.or_else(|| started.next()).unwrap_or_else(|| {
                ready(Answer::unavailable(
                    None,
                    "no answer was started for this line",
                ))
            }),
            _place: permit,
        })
        .collect()
}

fn ready(a: Answer) -> oneshot::Receiver<Answer> {
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(a);
    rx
}

/// Why streamed batches are not taken now, if they are not.
fn closed(sh: &Shared) -> Option<&'static str> {
    if sh.stopping() {
        Some("the daemon is stopping: send it again under the same key once it is back")
    } else if sh.engine.standby().deferred_claims() > 0 {
        Some("claims from before the start are being finished: send it again shortly")
    } else {
        None
    }
}

/// Starts `batches` (batch, source) once as many stream slots are free: on the blocking
/// pool in a group with whatever other connections sent meanwhile (`stream_gather.rs`), or
/// on a forwarding standby as a task of their own (`forward`); one answer to come per
/// batch, in order.
async fn start(ctx: &Ctx, batches: Vec<(Batch, String)>) -> Vec<oneshot::Receiver<Answer>> {
    let unavailable = |batches: &[(Batch, String)], why: &str| {
        let one = |b: &Batch| ready(Answer::unavailable(Some(&b.request_key), why));
        batches.iter().map(|(b, _)| one(b)).collect()
    };
    if batches.is_empty() {
        return Vec::new();
    }
    if let Some(why) = closed(&ctx.shared) {
        return unavailable(&batches, why);
    }
    let mut state = ctx.state.clone();
    let k = u32::try_from(batches.len()).unwrap_or(u32::MAX);
    let slots = tokio::select! {
        p = ctx.running.clone().acquire_many_owned(k) => p.ok(),
        _ = state.wait_for(|s| *s >= DRAINING) => None,
    };
    let Some(slots) = slots else {
        let why = closed(&ctx.shared).unwrap_or("the daemon is stopping");
        return unavailable(&batches, why);
    };
    let (txs, rxs): (Vec<_>, Vec<_>) = batches.iter().map(|_| oneshot::channel()).unzip();
    let lines = Lines {
        batches,
        txs,
        slots,
    };
    match ctx.shared.forwarding().cloned() {
        Some(cl) => drop(tokio::spawn(forward(ctx.shared.clone(), cl, lines))),
        None => ctx.gather.start(&ctx.shared, lines, run),
    }
    rxs
}

/// Streamed batches through the pipeline as one group, each answer sent on its `txs` as
/// soon as the engine hands it over (before the group's durability tail, as a spool file's
/// result is published). A failure that latches nothing is answered `unavailable` for each
/// batch not answered yet; any other is a pipeline failure and stops the daemon (as a spool
/// worker's does), its batches answered `unavailable` too (they may be claimed: recovery
/// finishes them and the same keys then get their answers).
fn run(sh: &Shared, batches: &[(Batch, String)], txs: Vec<oneshot::Sender<Answer>>) {
    let items: Vec<(&Batch, &str)> = batches.iter().map(|(b, s)| (b, s.as_str())).collect();
    let source = items.first().map_or("", |(_, s)| *s);
    let mut txs: Vec<Option<oneshot::Sender<Answer>>> = txs.into_iter().map(Some).collect();
    let mut send = |i: usize, a: Answer| {
        if let Some(tx) = txs.get_mut(i).and_then(Option::take) {
            let _ = tx.send(a);
        }
    };
    let mut early = |i: usize, r: &BatchResult| send(i, Answer::Result(r.clone()));
    let result = sh.engine.submit(&items, Deliver::Early(&mut early));
    let why = match result {
        Ok(rs) => {
            for (i, r) in rs.into_iter().enumerate() {
                send(i, Answer::Result(r));
            }
            return;
        }
        Err(e) if e.latches_nothing() => {
            debug!(source, batches = items.len(), error = %e, "streamed batches not taken now");
            e.to_string()
        }
        Err(e) => {
            error!(source, error = %e, "pipeline failure: stopping");
            let why = format!("pipeline failure, the daemon stops: {e}");
            sh.stop_on(e);
            why
        }
    };
    for (i, (b, _)) in items.iter().enumerate() {
        send(i, Answer::unavailable(Some(&b.request_key), why.clone()));
    }
}

/// A cluster standby's streamed batches (one connection's lines): forwarded to the leader
/// all at once, each answered once this node holds its claim (`cluster/forward.rs`), or
/// answered `unavailable`. A task on the runtime, not a group on the blocking pool: it only
/// waits, for the leader and then for this node's log (issue 42), and the forwarding
/// connection groups what many connections send (`replication/src/forward.rs`).
async fn forward(sh: Arc<Shared>, cl: Arc<crate::cluster::Cluster>, lines: Lines) {
    let Lines {
        batches,
        txs,
        slots,
    } = lines;
    let stream = &sh.engine.stats.stream;
    stream.groups.fetch_add(1, Ordering::Relaxed);
    (stream.batches_in_groups).fetch_add(batches.len() as u64, Ordering::Relaxed);
    let refs: Vec<&Batch> = batches.iter().map(|(b, _)| b).collect();
    let outcomes = crate::cluster::forward::forward(&cl, sh.here(), &refs).await;
    for (((b, _), tx), outcome) in batches.iter().zip(txs).zip(outcomes) {
        let a = match outcome {
            Ok(r) => Answer::Result(r),
            Err(e) => Answer::unavailable(Some(&b.request_key), e.to_string()),
        };
        let _ = tx.send(a);
    }
    drop(slots);
}

/// Writes the answers in request order, flushing whenever the next one is not ready yet.
async fn write_answers(ctx: &Ctx, w: OwnedWriteHalf, mut rx: mpsc::Receiver<Pending>, conn: u64) {
    let mut w = BufWriter::new(w);
    if let Err(e) = write_loop(ctx, &mut w, &mut rx).await {
        debug!(conn, error = %e, "stream client went away");
        return;
    }
    let _ = w.shutdown().await;
}

async fn write_loop(
    ctx: &Ctx,
    w: &mut BufWriter<OwnedWriteHalf>,
    rx: &mut mpsc::Receiver<Pending>,
) -> std::io::Result<()> {
    use tokio::sync::mpsc::error::TryRecvError;
    let stats = &ctx.shared.engine.stats.stream;
    loop {
        let p = match rx.try_recv() {
            Ok(p) => p,
            Err(TryRecvError::Disconnected) => return Ok(()),
            Err(TryRecvError::Empty) => {
                w.flush().await?;
                match rx.recv().await {
                    Some(p) => p,
                    None => return Ok(()),
                }
            }
        };
        let Pending { mut answer, _place } = p;
        let a = match answer.try_recv() {
            Ok(a) => a,
            Err(oneshot::error::TryRecvError::Closed) => return Ok(()),
            Err(oneshot::error::TryRecvError::Empty) => {
                w.flush().await?;
                match answer.await {
                    Ok(a) => a,
                    Err(_) => return Ok(()),
                }
            }
        };
        stats.answers.fetch_add(1, Ordering::Relaxed);
        if matches!(a, Answer::Unavailable { .. }) {
            stats.unavailable.fetch_add(1, Ordering::Relaxed);
        }
        w.write_all(&a.to_json_line()).await?;
    }
}

//! A cluster standby's intake (issue 27): a batch a client gave this node (a spool file, a
//! stream line) is forwarded to the leader, planned and claimed there (one planner: a
//! request key dedupes across nodes), and its answer is given here only once this node's
//! own log holds what the answer cites, durably: a failover after that point finds the claim
//! here too. Anything short of that is "not now": the spool file stays in `new/` (sent
//! again later, to whoever leads then, under the same key: the same answer), a stream line
//! is answered `unavailable`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::sync::Arc;

use roost_replication::{ForwardReply, Forwarded, Lsn};
use tokio::runtime::Handle;
use tokio::sync::watch;

use super::handle::Cluster;
use crate::batch::{Batch, BatchResult};
use crate::pipeline::{Engine, Role};

/// How long one forward may wait for the leader's answer, and then for this node's log.
pub const FORWARD_WAIT: Duration = Duration::from_secs(10);

/// How often a forward waiting for this node's log looks again whether it may still wait.
const LOOK_AGAIN: Duration = Duration::from_millis(100);

/// How often a forward waiting for the leader looks whether another node leads now.
const LEADER_LOOK: Duration = Duration::from_millis(50);

const STOPPING: &str = "this node is stopping (or rejoining)";

/// Why a batch was not answered now (nothing was given to the client).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotNow(pub String);

/// What a forward needs of this node: its engine, the end of this life (a stop or rejoin:
/// its log no longer moves, and a stop must not wait for the leader) and its log's durable
/// end as a watch (`None`: looked at every millisecond instead).
pub struct Here<'a> {
    pub engine: &'a Engine,
    pub ending: watch::Receiver<bool>,
    pub durable: Option<watch::Receiver<Lsn>>,
}

/// [`forward`] from the blocking pool (spool files, bulk lines): blocks on the runtime `rt`.
pub fn forward_all(
    cl: &Arc<Cluster>,
    here: Here<'_>,
    rt: &Handle,
    batches: &[&Batch],
) -> Vec<Result<BatchResult, NotNow>> {
    rt.block_on(forward(cl, here, batches))
}

/// Forwards `batches` all at once (pipelined on the one connection to the leader, issue 42:
/// a standby is as fast as the leader), then waits once for this node's log to hold what
/// the answers cite; one outcome per batch, in order. Gives up at once when `here.ending`
/// turns true.
pub async fn forward(
    cl: &Arc<Cluster>,
    mut here: Here<'_>,
    batches: &[&Batch],
) -> Vec<Result<BatchResult, NotNow>> {
    let every = |why: &str| {
        batches
            .iter()
            .map(|_| Err(NotNow(why.to_owned())))
            .collect()
    };
    if *here.ending.borrow() {
        return every(STOPPING);
    }
    let Some(addr) = cl.leader_addr() else {
        return every("no leader is known yet (cluster election in progress)");
    };
    let Some(replies) = send_all(cl, &addr, batches, here.ending.clone()).await else {
        return every(STOPPING);
    };
    let mut out: Vec<Result<(BatchResult, Lsn), NotNow>> = batches
        .iter()
        .zip(replies)
        .map(|(b, r)| answer_of(&addr, b, r))
        .collect();
    let need = out.iter().flatten().map(|(_, lsn)| *lsn).max().unwrap_or(0);
    if need > 0 {
        let key = &batches[0].request_key;
        if let Err(e) = hold(&mut here, need, key).await {
            return every(&e.0);
        }
    }
    out.drain(..)
        .map(|r| {
            r.map(|(result, _)| {
                here.engine
                    .stats
                    .forwarded_out
                    .fetch_add(1, Ordering::Relaxed);
                result
            })
        })
        .collect()
}

/// Sends every batch to the leader at `addr` at once and collects the replies in order
/// (`Err(text)` for one that got none); `None` once `ending` turns true.
async fn send_all(
    cl: &Arc<Cluster>,
    addr: &str,
    batches: &[&Batch],
    mut ending: watch::Receiver<bool>,
) -> Option<Vec<Result<ForwardReply, String>>> {
    let mut set = tokio::task::JoinSet::new();
    for (i, b) in batches.iter().enumerate() {
        let (cl, addr, json) = (cl.clone(), addr.to_owned(), b.to_json());
        set.spawn(async move {
            let r = cl.forwarder.forward(&addr, json, FORWARD_WAIT).await;
            (i, r.map_err(|e| e.to_string()))
        });
    }
    let mut out: Vec<Result<ForwardReply, String>> = batches
        .iter()
        .map(|_| Err("the forward's task failed".to_owned()))
        .collect();
    let mut look = tokio::time::interval(LEADER_LOOK);
    loop {
        tokio::select! {
            next = set.join_next() => match next {
                Some(Ok((i, r))) => out[i] = r,
                Some(Err(_)) => {}
                None => return Some(out),
            },
            _ = ending.wait_for(|e| *e) => {
                set.abort_all();
                return None;
            }
            // Another node leads now: the one these went to (frozen, cut off) may never
            // answer, and the client should not wait for it (issue 42). Sent again under
            // their keys, they get the same answers wherever they were claimed.
            _ = look.tick() => if cl.leader_addr().as_deref() != Some(addr) {
                set.abort_all();
                let why = format!("the leader changed while waiting for {addr}");
                return Some(out.into_iter().map(|r| r.and(Err(why.clone()))).collect());
            }
        }
    }
}

/// The result the leader gave `batch`, and the durable log end it cites.
fn answer_of(
    addr: &str,
    batch: &Batch,
    reply: Result<ForwardReply, String>,
) -> Result<(BatchResult, Lsn), NotNow> {
    let (answer, durable_lsn) = match reply.map_err(NotNow)?.outcome {
        Forwarded::Answer {
            answer,
            durable_lsn,
        } => (answer, durable_lsn),
        Forwarded::Refused(why) => return Err(NotNow(format!("the leader at {addr}: {why}"))),
    };
    let result: BatchResult = serde_json::from_slice(&answer).map_err(|e| {
        NotNow(format!(
            "the leader at {addr} answered request key {:?} with something that is not a result: {e}",
            batch.request_key
        ))
    })?;
    Ok((result, durable_lsn))
}

/// Waits until this node's log holds every record below `durable_lsn` durably (fetched
/// from the leader), at most [`FORWARD_WAIT`], while it is still a standby and not stopping
/// (a node that stops or rejoins has stopped following: its log will not move). Reads and
/// waits on the durable watch (the WAL sends it under its lock at every sync and cut), not
/// the WAL's lock and condition variable: many forwards wait at once on the runtime, which
/// must never block on that lock (a segment roll holds it through a sync), and each sync
/// would wake them all onto it (issue 42). Without the watch: the WAL looked at every
/// millisecond.
async fn hold(here: &mut Here<'_>, durable_lsn: u64, key: &str) -> Result<(), NotNow> {
    let need = durable_lsn.saturating_sub(1);
    let until = Instant::now() + FORWARD_WAIT;
    loop {
        let synced = match &here.durable {
            Some(end) => end.borrow().saturating_sub(1),
            None => here.engine.wal().synced_lsn(),
        };
        if synced >= need {
            return Ok(());
        }
        let standby = here.engine.role() == Role::Standby;
        if !standby || *here.ending.borrow() || Instant::now() >= until {
            return Err(NotNow(format!(
                "request key {key:?}: this node does not hold the leader's answer yet (its log is durable to lsn {synced}, the answer cites {need})"
            )));
        }
        let Some(durable) = here.durable.as_mut() else {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let mut ending = here.ending.clone();
        let ended = tokio::select! {
            moved = tokio::time::timeout(LOOK_AGAIN, durable.wait_for(|end| *end > need)) => {
                matches!(moved, Ok(Err(_)))
            }
            stop = ending.wait_for(|e| *e) => match stop {
                Ok(_) => false, // seen at the top of the loop
                Err(_) => return Err(NotNow(STOPPING.to_owned())), // this life is gone
            },
        };
        if ended {
            here.durable = None; // the log's watch ended: look at the WAL every millisecond
        }
    }
}

//! A cluster standby's intake (issue 27): a batch a client gave this node (a spool file, a
//! stream line) is forwarded to the leader, planned and claimed there (one planner: a
//! request key dedupes across nodes), and its answer is given here only once this node's
//! own log holds what the answer cites, durably: a failover after that point finds the claim
//! here too. Anything short of that is "not now": the spool file stays in `new/` (sent
//! again later, to whoever leads then, under the same key: the same answer), a stream line
//! is answered `unavailable`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use roost_replication::Forwarded;
use tokio::runtime::Handle;
use tokio::sync::watch;

use super::handle::Cluster;
use crate::batch::{Batch, BatchResult};
use crate::pipeline::{Engine, Role};

/// How long one forward may wait for the leader's answer, and then for this node's log.
pub const FORWARD_WAIT: Duration = Duration::from_secs(10);

const STOPPING: &str = "this node is stopping (or rejoining)";

/// Why a batch was not answered now (nothing was given to the client).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotNow(pub String);

/// Forwards `batch` and returns its result once this node holds what it cites. Called on
/// the blocking pool (it blocks on the runtime `rt`). Gives up at once when `ending` turns
/// true (this life stops or rejoins: its log no longer moves, and a stop must not wait for
/// the leader, issue 42).
pub fn forward(
    cl: &Cluster,
    (engine, ending): (&Engine, &watch::Receiver<bool>),
    rt: &Handle,
    batch: &Batch,
) -> Result<BatchResult, NotNow> {
    let stopping = || *ending.borrow();
    if stopping() {
        return Err(NotNow(STOPPING.into()));
    }
    let addr = cl
        .leader_addr()
        .ok_or_else(|| NotNow("no leader is known yet (cluster election in progress)".into()))?;
    let mut ends = ending.clone();
    let reply = rt
        .block_on(async {
            tokio::select! {
                r = cl.forwarder.forward(&addr, batch.to_json(), FORWARD_WAIT) => Some(r),
                _ = ends.wait_for(|e| *e) => None,
            }
        })
        .ok_or_else(|| NotNow(STOPPING.into()))?
        .map_err(|e| NotNow(e.to_string()))?;
    let (answer, durable_lsn) = match reply.outcome {
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
    hold((engine, &stopping), durable_lsn, &batch.request_key)?;
    engine.stats.forwarded_out.fetch_add(1, Ordering::Relaxed);
    Ok(result)
}

/// Waits until this node's log holds every record below `durable_lsn` durably (fetched
/// from the leader), at most [`FORWARD_WAIT`], while it is still a standby and not stopping
/// (a node that stops or rejoins has stopped following: its log will not move).
fn hold(
    (engine, stopping): (&Engine, &dyn Fn() -> bool),
    durable_lsn: u64,
    key: &str,
) -> Result<(), NotNow> {
    let need = durable_lsn.saturating_sub(1);
    let until = Instant::now() + FORWARD_WAIT;
    loop {
        let synced = engine
            .wal()
            .wait_synced_past(need.saturating_sub(1), Duration::from_millis(100));
        if synced >= need {
            return Ok(());
        }
        if engine.role() != Role::Standby || stopping() || Instant::now() >= until {
            return Err(NotNow(format!(
                "request key {key:?}: this node does not hold the leader's answer yet (its log is durable to lsn {synced}, the answer cites {need})"
            )));
        }
    }
}

//! Streamed batches from every connection gathered into groups (issue 47). A connection's
//! lines already run as one group when they come together; closed-loop clients send one
//! line each, so without this every batch was a group of its own: its own trip to the
//! blocking pool, its own turn at the planner's lock, its own wait for the claim sync and
//! its own message to each shard owner it touches. Here at most `GROUPS_RUNNING` groups run
//! at once; batches that come while they do wait in one queue, and the first group to end
//! takes what is queued (up to `group_max` batches, whole connections' lines) as its next
//! group on the same thread. A few clients seldom wait (fewer groups than that run); many
//! share one plan, one claim sync and one message per shard owner, as a pipelined
//! connection's lines do.
//!
//! Only where this node runs its groups itself: a standby that forwards sends each
//! connection's lines at once (`stream_socket.rs`, `forward`), and the forwarding
//! connection groups them for the leader instead.
//!
//! Each batch is still answered on its own channel as soon as the engine hands it over, and
//! a connection's answers are written in its order by its writer. What a group shares is
//! its fate when the engine stops a whole pass (intake paused by a full disk, the node no
//! longer primary, a pipeline failure): every batch of the group not answered yet gets
//! `unavailable`, now with other connections' batches beside it; the same key sent again
//! gets the original answer if it was claimed (docs/contract.md, "Streaming intake").

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roost_storage::lock;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::stream_protocol::Answer;
use super::Shared;
use crate::batch::Batch;

/// Groups of streamed batches running at once, all connections together: four, so that a
/// few closed-loop clients seldom wait for a place, and while one group plans and claims
/// others wait for their claim sync and their shard owners. Every other batch waits in the
/// queue and joins the next group. Measured on a journaled ext4 image (docs/benchmarks.md,
/// "Groups across connections"): two lost about 10 % at four clients and gained nothing
/// beyond the noise at 16 and 64; eight lost at 64.
pub(super) const GROUPS_RUNNING: usize = 4;

/// One connection's lines, started together: each batch with its source and its answer's
/// channel, and their places among the running batches (freed when the group ends).
pub(super) struct Lines {
    pub batches: Vec<(Batch, String)>,
    pub txs: Vec<oneshot::Sender<Answer>>,
    pub slots: OwnedSemaphorePermit,
}

/// Runs one group: its batches (batch, source) and their answers' channels.
pub(super) type RunGroup = fn(&Shared, &[(Batch, String)], Vec<oneshot::Sender<Answer>>);

/// How long the running groups may all go without one ending before the queue stops
/// waiting for them: its lines then run at once, each connection's as a group of its own.
/// A group waits for the standbys' acknowledgement under `ack = "standby"`; a frozen or cut
/// off standby would hold all four places, and every line behind them, until it is dropped
/// from the in-sync set, even a line answered from the key window at once (issue 42). Well
/// above a loaded leader's wait for its standbys (p99 10-25 ms).
const STALLED: Duration = Duration::from_millis(100);

struct Queue {
    waiting: std::collections::VecDeque<Lines>,
    running: usize,
    /// When a group last started or ended.
    moved: Instant,
    /// A check for a stall is due (one at a time).
    watched: bool,
}

impl Default for Queue {
    fn default() -> Queue {
        Queue {
            waiting: Default::default(),
            running: 0,
            moved: Instant::now(),
            watched: false,
        }
    }
}

/// The queue and the count of running groups; `group_max` bounds the batches a group takes
/// from the queue (a connection's lines are never split).
pub(super) struct Gather {
    queue: Mutex<Queue>,
    group_max: usize,
}

impl Gather {
    pub(super) fn new(group_max: usize) -> Gather {
        Gather {
            queue: Mutex::default(),
            group_max: group_max.max(1),
        }
    }

    /// Queues `lines`; if fewer than `GROUPS_RUNNING` groups run, starts one on the
    /// blocking pool with what is queued, which then runs what queues meanwhile until
    /// nothing is left. `run` runs one group (its batches, their answers' channels).
    pub(super) fn start(self: &Arc<Self>, sh: &Arc<Shared>, lines: Lines, run: RunGroup) {
        let sh = sh.clone();
        let first = {
            let mut q = lock(&self.queue);
            q.waiting.push_back(lines);
            if q.running >= GROUPS_RUNNING {
                drop(q);
                self.watch(&sh, run);
                return;
            }
            q.running += 1;
            q.moved = Instant::now();
            self.take(&mut q)
        };
        // Counted from here: a task dropped unrun (the runtime ending) or a spawn that
        // fails still gives the place back when the guard drops, so no queue is stranded.
        let running = Running {
            gather: self.clone(),
            counted: true,
        };
        tokio::task::spawn_blocking(move || running.drain(&sh, first, run));
    }

    /// Lines wait in the queue while every place is taken: once no group has started or
    /// ended for [`STALLED`], every line queued runs at once as a group of its own (on no
    /// place), and so does every line queued later while that lasts. Checked when a line is
    /// queued and by one timer while lines wait.
    fn watch(self: &Arc<Self>, sh: &Arc<Shared>, run: RunGroup) {
        let (stalled, wait) = {
            let mut q = lock(&self.queue);
            let since = q.moved.elapsed();
            if q.waiting.is_empty() || (since < STALLED && q.watched) {
                return;
            }
            let stalled = since >= STALLED;
            q.watched = !stalled;
            let lines: Vec<Lines> = match stalled {
                true => q.waiting.drain(..).collect(),
                false => Vec::new(),
            };
            (lines, STALLED - since.min(STALLED))
        };
        if stalled.is_empty() {
            let (me, sh) = (self.clone(), sh.clone());
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                lock(&me.queue).watched = false;
                me.watch(&sh, run);
            });
            return;
        }
        sh.engine
            .stats
            .stream
            .stalled
            .fetch_add(1, Ordering::Relaxed);
        for lines in stalled {
            let sh = sh.clone();
            tokio::task::spawn_blocking(move || run_group(&sh, vec![lines], run));
        }
    }

    /// The next group from the queue: whole connections' lines in arrival order, up to
    /// `group_max` batches (always the first).
    fn take(&self, q: &mut Queue) -> Vec<Lines> {
        let mut group = Vec::new();
        let mut batches = 0;
        while let Some(l) = q.waiting.front() {
            if !group.is_empty() && batches + l.batches.len() > self.group_max {
                break;
            }
            batches += l.batches.len();
            group.extend(q.waiting.pop_front());
        }
        group
    }
}

/// Runs `lines` as one group and frees their places among the running batches.
fn run_group(sh: &Shared, lines: Vec<Lines>, run: RunGroup) {
    let mut batches = Vec::new();
    let mut txs = Vec::new();
    let mut slots = Vec::with_capacity(lines.len());
    for l in lines {
        batches.extend(l.batches);
        txs.extend(l.txs);
        slots.push(l.slots);
    }
    let stream = &sh.engine.stats.stream;
    stream.groups.fetch_add(1, Ordering::Relaxed);
    (stream.batches_in_groups).fetch_add(batches.len() as u64, Ordering::Relaxed);
    run(sh, &batches, txs);
    drop(slots);
}

/// A running group's place in the count: given back when the queue is found empty, or when
/// the guard drops otherwise (its thread unwinds, or its task never ran), so that a count
/// left up can never leave the queue unserved.
struct Running {
    gather: Arc<Gather>,
    counted: bool,
}

impl Running {
    /// Runs `group`, then whatever queued meanwhile, until the queue is empty.
    fn drain(mut self, sh: &Shared, mut group: Vec<Lines>, run: RunGroup) {
        loop {
            run_group(sh, group, run);
            match self.next() {
                Some(next) => group = next,
                None => return,
            }
        }
    }

    /// The next group from the queue, or `None` (the place given back) when it is empty.
    fn next(&mut self) -> Option<Vec<Lines>> {
        let mut q = lock(&self.gather.queue);
        q.moved = Instant::now();
        if q.waiting.is_empty() {
            q.running -= 1;
            self.counted = false;
            return None;
        }
        Some(self.gather.take(&mut q))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.counted {
            lock(&self.gather.queue).running -= 1;
        }
    }
}

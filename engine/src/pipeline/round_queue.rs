//! The answered claims waiting for a durability round (`settle.rs`), what a group owes when
//! it hands them in, and the round's own lock: only the bookkeeping (it knows nothing of the
//! engine).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roost_storage::{lock, Clock};
use roost_wal::Lsn;

use super::owner::ShardSlot;
use super::shard_set::Touched;

/// One answered claim waiting for its round: what closing it needs, owned.
pub(super) struct Waiting {
    pub lsn: Lsn,
    pub source: String,
    /// The shards its transactions touched (name, owner).
    pub shards: Vec<(String, Arc<ShardSlot>)>,
    /// When its commit step ended: the finish phase's start, for its latency.
    pub committed: Instant,
}

/// The claims waiting for a round, and the lock a round holds while it runs.
pub(super) struct Rounds {
    queue: Mutex<Queue>,
    /// Held while a round runs: one at a time.
    pub running: Mutex<()>,
    /// The storage's clock: how long the oldest claim has waited.
    clock: Clock,
}

/// What waits: the claims in hand-in order, the last audit row any of them wrote, and when
/// the oldest was handed in.
#[derive(Default)]
struct Queue {
    claims: Vec<Waiting>,
    last_row: Option<Lsn>,
    since: Option<Instant>,
}

impl Rounds {
    pub fn new(clock: Clock) -> Rounds {
        Rounds {
            queue: Mutex::default(),
            running: Mutex::default(),
            clock,
        }
    }

    /// Adds answered claims (and the last audit row they wrote); returns how many wait now.
    pub fn hand_in(&self, claims: impl Iterator<Item = Waiting>, last_row: Option<Lsn>) -> usize {
        let mut q = lock(&self.queue);
        q.claims.extend(claims);
        q.last_row = q.last_row.max(last_row);
        q.since.get_or_insert_with(|| self.clock.now());
        q.claims.len()
    }

    /// Every claim waiting, and the last audit row they wrote; the queue is left empty.
    pub fn take(&self) -> (Vec<Waiting>, Option<Lsn>) {
        let mut q = lock(&self.queue);
        q.since = None;
        (std::mem::take(&mut q.claims), q.last_row.take())
    }

    /// How many claims wait.
    pub fn waiting(&self) -> usize {
        lock(&self.queue).claims.len()
    }

    /// Whether the oldest claim waiting has waited `at_least`, by the storage's clock.
    pub fn waited(&self, at_least: Duration) -> bool {
        lock(&self.queue)
            .since
            .is_some_and(|t| self.clock.since(t) >= at_least)
    }
}

/// What a group still owes once its answers are made: each claim's touched shards (to
/// flush, then to close the claim with) and the last audit row written (to sync).
pub(super) struct Tail<'c> {
    pub(super) touched: Vec<Vec<Touched<'c>>>,
    pub(super) last_row: Option<Lsn>,
    /// When the commit step ended: the finish phase's start, for its latency.
    pub(super) committed: Instant,
}

impl<'c> Tail<'c> {
    /// Each claim's touched shards, the last audit row, when the commit step ended.
    pub(super) fn into_parts(self) -> (Vec<Vec<Touched<'c>>>, Option<Lsn>, Instant) {
        (self.touched, self.last_row, self.committed)
    }
}

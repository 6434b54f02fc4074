//! The answered claims waiting for a durability round (`settle.rs`), and the round's own
//! lock: only the bookkeeping, a leaf (it knows nothing of the engine).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roost_storage::lock;
use roost_wal::Lsn;

use super::owner::ShardSlot;

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
#[derive(Default)]
pub(super) struct Rounds {
    queue: Mutex<Queue>,
    /// Held while a round runs: one at a time.
    pub running: Mutex<()>,
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
    /// Adds answered claims (and the last audit row they wrote); returns how many wait now.
    pub fn hand_in(&self, claims: impl Iterator<Item = Waiting>, last_row: Option<Lsn>) -> usize {
        let mut q = lock(&self.queue);
        q.claims.extend(claims);
        q.last_row = q.last_row.max(last_row);
        q.since.get_or_insert_with(Instant::now);
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

    /// Whether the oldest claim waiting has waited `at_least`.
    pub fn waited(&self, at_least: Duration) -> bool {
        lock(&self.queue)
            .since
            .is_some_and(|t| t.elapsed() >= at_least)
    }
}

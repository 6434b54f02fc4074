//! Counters and latency histograms the engine keeps for `roost status` and the metrics
//! (`control/metrics.rs` renders them; nothing here knows a text format). Lock-free (atomics
//! only): recording happens on the hot path of every batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters since start (for `roost status` and the bench).
#[derive(Debug, Default)]
pub struct Stats {
    pub committed: AtomicU64,
    pub rejected: AtomicU64,
    pub invalid: AtomicU64,
    pub conflict: AtomicU64,
    pub duplicate: AtomicU64,
    /// Keys answered through the key index on disk (a table record read).
    pub key_index_reads: AtomicU64,
    pub in_flight: AtomicU64,
    pub latency: PhaseLatency,
    /// Shard transactions applied, and the flushes that made them durable: owners flush once
    /// per round, so under load flushes < transactions.
    pub shard_txns: AtomicU64,
    pub shard_flushes: AtomicU64,
    /// Durability rounds run (`settle.rs`), the batches they settled, and the batches
    /// answered and waiting for one now (in a round under way included).
    pub tail_rounds: AtomicU64,
    pub tail_settled: AtomicU64,
    pub tail_waiting: AtomicU64,
    /// Shards whose `Shard` is open now (maps, file descriptors, directory lock held); the
    /// others that exist are closed: never opened since start, or closed after
    /// `shard_idle_close_ms` idle (`owner.rs`).
    pub shards_open: AtomicU64,
    /// Idle shards closed, and closed shards opened again by a message, since start.
    pub shard_idle_closes: AtomicU64,
    pub shard_reopens: AtomicU64,
    /// Milliseconds since the engine opened at which a batch last moved through a step; the
    /// watchdog stops pinging when batches are in flight and this stops advancing.
    pub last_progress_ms: AtomicU64,
    /// Times intake paused because a log had no room for its next segment.
    pub intake_pauses: AtomicU64,
    /// Batches other members forwarded to this leader and it answered, and batches this
    /// standby forwarded and answered (issue 27).
    pub forwarded_in: AtomicU64,
    pub forwarded_out: AtomicU64,
    /// The streaming intake's figures (kept by `intake/stream_socket.rs`).
    pub stream: StreamStats,
    /// Bulk files' figures (kept by `intake/bulk_files.rs`).
    pub bulk: BulkStats,
    /// Groups of spool files run together (`Engine::submit`, kept by
    /// `intake/worker.rs`), and the files they answered.
    pub file_groups: AtomicU64,
    pub files_in_groups: AtomicU64,
}

/// Bulk files (docs/contract.md "Bulk files"): worked on now, answered, left in `new/` for later.
#[derive(Debug, Default)]
pub struct BulkStats {
    /// Bulk files being worked on now.
    pub in_flight: AtomicU64,
    /// Bulk files whose result was published since start.
    pub files: AtomicU64,
    /// Their result lines.
    pub lines: AtomicU64,
    /// Bulk files left in `new/` for later (the engine could not take a line, or a stop).
    pub deferred: AtomicU64,
}

/// The streaming intake (docs/contract.md "Streaming intake"): connections and answer lines.
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Connections open now.
    pub connections: AtomicU64,
    /// Connections accepted since start (those refused over `stream_connections_max` too).
    pub connections_total: AtomicU64,
    /// Connections refused because `stream_connections_max` were open.
    pub refused: AtomicU64,
    /// Answer lines computed since start, whatever their status.
    pub answers: AtomicU64,
    /// Of those, `unavailable` answers (not taken now: retry under the same key).
    pub unavailable: AtomicU64,
    /// Groups the streamed batches ran in, all connections together
    /// (`intake/stream_gather.rs`), and the batches they ran.
    pub groups: AtomicU64,
    /// The streamed batches those groups ran.
    pub batches_in_groups: AtomicU64,
    /// Times the queue stopped waiting for running groups that had all stalled (a standby
    /// not acknowledging): its lines ran at once, each connection's on its own.
    pub stalled: AtomicU64,
}

/// Upper bounds of the latency buckets, in microseconds (the last bucket is +Inf).
pub const BUCKETS_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
];

#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS_US.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        if let Some(i) = BUCKETS_US.iter().position(|b| us <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Total recorded time, in microseconds (mean = sum / count).
    pub fn sum_us(&self) -> u64 {
        self.sum_us.load(Ordering::Relaxed)
    }

    /// The upper bound of the bucket holding the `q`-quantile, in microseconds (`u64::MAX`
    /// for the open last bucket); `None` when nothing was recorded.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((n as f64 * q.clamp(0.0, 1.0)).ceil() as u64).max(1);
        let mut cum = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cum += self.buckets[i].load(Ordering::Relaxed);
            if cum >= rank {
                return Some(*b);
            }
        }
        Some(u64::MAX)
    }

    /// The buckets as they stand: per bucket (not cumulative) its upper bound in seconds and
    /// its count, the last one `+Inf`; the count is their sum, so the two always agree even
    /// while another thread records.
    pub fn snapshot(&self) -> Snapshot {
        let mut buckets: Vec<(f64, u64)> = BUCKETS_US
            .iter()
            .zip(&self.buckets)
            .map(|(b, n)| (*b as f64 / 1e6, n.load(Ordering::Relaxed)))
            .collect();
        let bounded: u64 = buckets.iter().map(|(_, n)| n).sum();
        let past_last = self.count().saturating_sub(bounded);
        buckets.push((f64::INFINITY, past_last));
        Snapshot {
            buckets,
            count: bounded + past_last,
            sum_seconds: self.sum_us() as f64 / 1e6,
        }
    }
}

/// A histogram read once (for the metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// (upper bound in seconds, count in this bucket alone), `+Inf` last.
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

/// The pipeline's phases, as measured per batch.
#[derive(Debug, Default)]
pub struct PhaseLatency {
    /// Static checks, triggers and the state checks under the planner lock.
    pub plan: Histogram,
    /// Claim append and its group-committed sync.
    pub claim: Histogram,
    /// Every shard transaction handed to its owner and applied (written to the shard's
    /// segment, not yet flushed: the flushes belong to `finish`).
    pub commit: Histogram,
    /// Audit rows, result file, then the shards' flushes, the audit sync and the done record.
    pub finish: Histogram,
    /// Waiting for a standby to hold the claim (`ack = "standby"` only).
    pub replicate: Histogram,
    /// From the start of planning to the result file (what a client waits).
    pub batch: Histogram,
}

impl PhaseLatency {
    /// The phases in pipeline order, named as status and metrics name them; `batch` (planning
    /// to result file) last.
    pub fn phases(&self) -> [(&'static str, &Histogram); 6] {
        [
            ("plan", &self.plan),
            ("claim", &self.claim),
            ("commit", &self.commit),
            ("finish", &self.finish),
            ("replicate", &self.replicate),
            ("batch", &self.batch),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_snapshot_puts_each_value_in_its_bucket() {
        let h = Histogram::default();
        h.record(Duration::from_micros(50));
        h.record(Duration::from_millis(3));
        h.record(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.buckets.len(), BUCKETS_US.len() + 1);
        assert_eq!(s.buckets[0], (0.0001, 1), "{s:?}");
        assert_eq!(s.buckets[5], (0.005, 1), "{s:?}");
        assert_eq!(s.buckets[BUCKETS_US.len()], (f64::INFINITY, 1), "{s:?}");
        assert_eq!(s.buckets.iter().map(|(_, n)| n).sum::<u64>(), 3);
        assert_eq!(s.count, 3);
        assert!((s.sum_seconds - 60.00305).abs() < 1e-9, "{s:?}");
        assert_eq!(h.quantile_us(0.0), Some(100));
        assert_eq!(h.quantile_us(0.5), Some(5_000));
        assert_eq!(
            h.quantile_us(0.99),
            Some(u64::MAX),
            "60 s is past the last bound"
        );
        assert_eq!(Histogram::default().quantile_us(0.5), None);
    }
}

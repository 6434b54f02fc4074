//! What the hosts of one run share with the runner, outside turmoil: the configuration, the
//! etcd store, each node's log (kept across a node's crashes, as a disk would be), the stop
//! signal, and the record of the run: the event trace (hashed, its tail kept for a report),
//! the answers leaders gave, the violations found, and which nodes are running.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use roost_replication::{Entry, Epoch};
use roost_repmodel::election::{Flaw, Flaws};
use tokio::sync::watch;

use crate::etcd::{Aimed, SharedStore, Store};
use crate::log::SimLog;

/// One run's constants.
#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    /// The election model's flaws the agent's port is run with (none: the design).
    pub flaws: Flaws,
    /// Simulated time the faults and the workload run for (then every node is stopped).
    pub duration: Duration,
    /// The lease's TTL.
    pub ttl: Duration,
    /// A standby silent this long leaves the in-sync set.
    pub standby_timeout: Duration,
    /// How long a task told to stop may take (simulated time): "every stop stops".
    pub stop_bound: Duration,
}

impl Config {
    pub fn new(seed: u64, flaws: Flaws) -> Config {
        Config {
            seed,
            flaws,
            duration: Duration::from_secs(20),
            ttl: Duration::from_millis(1000),
            standby_timeout: Duration::from_millis(1000),
            stop_bound: Duration::from_secs(3),
        }
    }

    pub fn has(&self, flaw: Flaw) -> bool {
        self.flaws.has(flaw)
    }
}

/// An answer a leader gave: the batch's record, in the leader's epoch.
#[derive(Clone, Debug)]
pub struct Answered {
    pub by: usize,
    pub epoch: Epoch,
    pub entry: Entry,
    pub at: Duration,
}

/// The record of a run.
#[derive(Debug, Default)]
pub struct Record {
    /// FNV-1a of every event line, in order.
    pub hash: u64,
    pub events: u64,
    pub tail: VecDeque<String>,
    pub answers: Vec<Answered>,
    pub violations: Vec<String>,
    pub running: Vec<bool>,
    pub elections: u32,
}

/// Lines of the trace kept for a failure's report.
const TAIL_LINES: usize = 60;

/// Shared by the hosts and the runner.
pub struct World {
    pub cfg: Config,
    pub names: Vec<String>,
    pub store: SharedStore,
    /// Faults aimed at a protocol step (`etcd::Aimed`), armed by the runner.
    pub aimed: Arc<Aimed>,
    pub logs: Vec<Arc<SimLog>>,
    pub stop: watch::Sender<bool>,
    record: Mutex<Record>,
    /// The simulated time the runner last stepped to (nanoseconds): the time of what the
    /// runner records between steps, where no host's clock is current.
    runner_ns: AtomicU64,
}

impl World {
    pub fn new(cfg: Config, nodes: usize) -> World {
        let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
        let logs = names.iter().map(|n| Arc::new(SimLog::new(n))).collect();
        World {
            cfg,
            names,
            store: Arc::new(Mutex::new(Store::default())),
            aimed: Arc::new(Aimed::default()),
            logs,
            stop: watch::channel(false).0,
            record: Mutex::new(Record {
                hash: 0xcbf2_9ce4_8422_2325,
                running: vec![false; nodes],
                ..Record::default()
            }),
            runner_ns: AtomicU64::new(0),
        }
    }

    pub fn record(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a line to the trace (time first: the current host's, else the runner's).
    pub fn event(&self, what: impl AsRef<str>) {
        let at = turmoil::sim_elapsed()
            .unwrap_or_else(|| Duration::from_nanos(self.runner_ns.load(Ordering::Relaxed)));
        self.event_at(at, what.as_ref());
    }

    /// The runner stepped to `at`.
    pub fn runner_at(&self, at: Duration) {
        let ns = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
        self.runner_ns.store(ns, Ordering::Relaxed);
    }

    pub fn event_at(&self, at: Duration, what: &str) {
        let line = format!("{:>7}ms {what}", at.as_millis());
        let mut r = self.record();
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            r.hash = (r.hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        r.events += 1;
        if r.tail.len() == TAIL_LINES {
            r.tail.pop_front();
        }
        r.tail.push_back(line);
    }

    /// Records a broken invariant (the run stops at the next step).
    pub fn violation(&self, what: String) {
        self.event(format!("VIOLATION {what}"));
        self.record().violations.push(what);
    }

    pub fn set_running(&self, node: usize, running: bool) {
        self.record().running[node] = running;
    }
}

//! What the replication tests share: a leader served on 127.0.0.1 port 0, a follower task,
//! `TestFollower` (a `MemLog` that can follow the pre-KIP-101 high-watermark rule), raw
//! protocol exchanges, and bounded waits (every wait gives up after `LIMIT`).
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use roost_replication::testing::{MemError, MemLog};
use roost_replication::wire::{read_frame, write_frame, DEFAULT_FRAME_BYTES_MAX};
use roost_replication::{
    follow, reconcile, serve_followers, Entry, Epoch, EpochEnd, FollowEnd, FollowError,
    FollowerLog, FollowerOptions, FollowerStatus, LeaderOptions, Lsn, Message,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The bound on every wait in these tests.
pub const LIMIT: Duration = Duration::from_secs(10);

/// `fut`, or a panic naming `what` after `LIMIT`.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(LIMIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {LIMIT:?}: {what}"),
    }
}

/// Polls `cond` every 5 ms until it holds; panics naming `what` after `LIMIT`.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// A running `serve_followers`.
pub struct Leader {
    pub addr: String,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Leader {
    pub async fn start(log: Arc<MemLog>) -> Leader {
        Self::start_with(log, LeaderOptions::default()).await
    }

    /// A leader on `addr` again (a restart).
    pub async fn start_at(log: Arc<MemLog>, addr: &str) -> Leader {
        Self::bind(log, LeaderOptions::default(), addr).await
    }

    pub async fn start_with(log: Arc<MemLog>, opts: LeaderOptions) -> Leader {
        Self::bind(log, opts, "127.0.0.1:0").await
    }

    async fn bind(log: Arc<MemLog>, opts: LeaderOptions, addr: &str) -> Leader {
        let listener = TcpListener::bind(addr)
            .await
            .expect("bind the leader's address");
        let addr = listener.local_addr().expect("local addr").to_string();
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(serve_followers(listener, log, opts, rx));
        Leader {
            addr,
            shutdown,
            task,
        }
    }

    /// Asks the server to stop and waits for it (and its connections) to finish.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        within("leader stops", self.task)
            .await
            .expect("leader task");
    }
}

/// Short waits so that tests run fast: a 100 ms long-poll, 10 ms reconnects.
pub fn fast_opts(replica: &str) -> FollowerOptions {
    let mut opts = FollowerOptions::new(replica);
    opts.wait_ms = 100;
    opts.backoff_min = Duration::from_millis(10);
    opts.backoff_max = Duration::from_millis(100);
    opts.connect_timeout = Duration::from_secs(2);
    opts.read_timeout = Duration::from_secs(5);
    opts
}

pub type FollowResult = Result<FollowEnd, FollowError<MemError>>;

/// A running `follow` (or `reconcile`).
pub struct Follower {
    pub status: Arc<FollowerStatus>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<FollowResult>,
}

impl Follower {
    pub fn start<F: FollowerLog<Error = MemError>>(
        addr: &str,
        log: Arc<F>,
        opts: FollowerOptions,
    ) -> Follower {
        let status = Arc::new(FollowerStatus::new());
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(follow(addr.to_string(), log, opts, rx, Arc::clone(&status)));
        Follower {
            status,
            shutdown,
            task,
        }
    }

    pub fn start_reconcile(addr: &str, log: Arc<MemLog>, opts: FollowerOptions) -> Follower {
        let status = Arc::new(FollowerStatus::new());
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(reconcile(
            addr.to_string(),
            log,
            opts,
            rx,
            Arc::clone(&status),
        ));
        Follower {
            status,
            shutdown,
            task,
        }
    }

    /// Waits for the follower to end by itself (an error, or `Reconciled`).
    pub async fn finished(self) -> FollowResult {
        within("follower ends by itself", self.task)
            .await
            .expect("follower task")
    }

    /// Asks the follower to stop and checks that it stopped cleanly.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let end = within("follower stops", self.task)
            .await
            .expect("follower task");
        assert!(
            matches!(end, Ok(FollowEnd::Shutdown)),
            "follower ended with {end:?}"
        );
    }
}

/// A follower's log for the KIP-101 scenarios. With `hw_truncation` it follows the rule
/// before KIP-101: on restart it truncates to the last high watermark it saw, and its
/// fetches carry no epoch (`last_epoch` 0), as fetches did then. Without it, it is the
/// plain `MemLog` and roost's rule (truncate by epoch, never to the hw).
pub struct TestFollower {
    pub log: Arc<MemLog>,
    pub hw_truncation: bool,
    /// Appends wait until it is open (a sync that takes as long as the test wants).
    pub gate: Gate,
    /// Set (`durable_first`): an append makes its records durable and says so on this
    /// watch (`durable_watch`) before it waits at the gate, as a standby's WAL sync comes
    /// before the rest of its apply.
    pub durable: Option<watch::Sender<Lsn>>,
    /// Appends that returned.
    pub returned: AtomicU32,
    /// With `durable`: appends wait here before their records are durable (open unless
    /// made by `durable_first(_, true)`).
    pub before: Gate,
}

impl TestFollower {
    pub fn new(log: &Arc<MemLog>, hw_truncation: bool) -> Arc<Self> {
        Arc::new(TestFollower {
            log: Arc::clone(log),
            hw_truncation,
            gate: Gate::new(true),
            durable: None,
            returned: AtomicU32::new(0),
            before: Gate::new(true),
        })
    }

    /// Roost's rule, with appends held at a shut gate until the test opens it.
    pub fn gated(log: &Arc<MemLog>) -> Arc<Self> {
        Arc::new(TestFollower {
            log: Arc::clone(log),
            hw_truncation: false,
            gate: Gate::new(false),
            durable: None,
            returned: AtomicU32::new(0),
            before: Gate::new(true),
        })
    }

    /// As `gated`, with the records durable (and the durable watch sent) before the gate;
    /// `held`: appends also wait before their records are durable, until `before` opens.
    pub fn durable_first(log: &Arc<MemLog>, held: bool) -> Arc<Self> {
        Arc::new(TestFollower {
            log: Arc::clone(log),
            hw_truncation: false,
            gate: Gate::new(false),
            durable: Some(watch::channel(FollowerLog::log_end(&**log)).0),
            returned: AtomicU32::new(0),
            before: Gate::new(!held),
        })
    }

    /// What the node does to its log when it restarts as a follower.
    pub fn restart(&self) {
        if self.hw_truncation {
            let hw = self.log.hw();
            FollowerLog::truncate_to(&*self.log, hw).expect("truncate to hw");
        }
    }
}

impl FollowerLog for TestFollower {
    type Error = MemError;
    fn current_epoch(&self) -> Epoch {
        FollowerLog::current_epoch(&*self.log)
    }
    fn set_current_epoch(&self, epoch: Epoch) -> Result<(), MemError> {
        self.log.set_current_epoch(epoch)
    }
    fn log_end(&self) -> Lsn {
        FollowerLog::log_end(&*self.log)
    }
    fn last_epoch(&self) -> Epoch {
        if self.hw_truncation {
            0
        } else {
            self.log.last_epoch()
        }
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        FollowerLog::end_offset_for(&*self.log, epoch)
    }
    fn durable_watch(&self) -> Option<watch::Receiver<Lsn>> {
        self.durable.as_ref().map(|d| d.subscribe())
    }
    fn append(&self, entries: &[Entry], leader_hw: Lsn) -> Result<(), MemError> {
        match &self.durable {
            Some(durable) => {
                self.before.pass();
                self.log.append(entries, leader_hw)?;
                durable.send_replace(FollowerLog::log_end(&*self.log));
                self.gate.pass();
            }
            None => {
                self.gate.pass();
                self.log.append(entries, leader_hw)?;
            }
        }
        self.returned.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn truncate_to(&self, lsn: Lsn) -> Result<(), MemError> {
        FollowerLog::truncate_to(&*self.log, lsn)
    }
}

/// A gate blocking calls until it opens; counts the calls that reached it.
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    reached: AtomicU32,
}

impl Gate {
    pub fn new(open: bool) -> Gate {
        Gate {
            open: Mutex::new(open),
            opened: Condvar::new(),
            reached: AtomicU32::new(0),
        }
    }

    pub fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.opened.notify_all();
    }

    /// Calls that reached the gate so far.
    pub fn reached(&self) -> u32 {
        self.reached.load(Ordering::SeqCst)
    }

    /// Waits until the gate is open; bounded by `LIMIT` (a test that never opens it fails
    /// on its own waits, not here).
    fn pass(&self) {
        self.reached.fetch_add(1, Ordering::SeqCst);
        let open = self.open.lock().expect("gate");
        let _open = self
            .opened
            .wait_timeout_while(open, LIMIT, |open| !*open)
            .expect("gate");
    }
}

/// Sends `msg` on a fresh connection to `addr` and returns the answer (`None`: closed).
pub async fn raw_exchange(addr: &str, msg: &Message) -> Option<Message> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    within("raw exchange", async {
        write_frame(&mut s, msg, DEFAULT_FRAME_BYTES_MAX)
            .await
            .expect("write");
        read_frame(&mut s, DEFAULT_FRAME_BYTES_MAX)
            .await
            .expect("read an answer")
    })
    .await
}

/// A fetch as a follower named `replica` would send it.
pub fn fetch(replica: &str, current_epoch: Epoch, fetch_lsn: Lsn, last_epoch: Epoch) -> Message {
    Message::Fetch {
        replica: replica.to_string(),
        current_epoch,
        fetch_lsn,
        last_epoch,
        max_bytes: 1 << 20,
        wait_ms: 0,
    }
}

/// The records of `log` as `(lsn, epoch, payload)`.
pub fn records(log: &MemLog) -> Vec<(Lsn, Epoch, Vec<u8>)> {
    log.entries()
        .into_iter()
        .map(|e| (e.lsn, e.epoch, e.payload))
        .collect()
}

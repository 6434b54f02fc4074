//! What the protocol needs from a node's log, and what the log hands back: a base backup's
//! files ([`SnapshotSource`], streamed by `snapshot.rs`) and a forwarded batch's outcome
//! ([`Forwarded`], carried by `forward.rs`). The daemon implements these over its WAL, its
//! leader-epoch file and its engine; the tests implement them in memory. Every method is
//! blocking (the protocol calls them through `spawn_blocking`), unless the log says it never
//! blocks (`calls_inline`: a simulator's log, called on the runtime's thread).

/// A log sequence number: 1 for the first record, +1 per record.
pub type Lsn = u64;
/// A leader epoch: 0 means "no epoch" (an empty log), the first leader's is 1.
pub type Epoch = u32;

/// One replicated record: what the leader's WAL holds at `lsn`, carried byte for byte (the
/// follower writes the same lsn, epoch, type and payload; only the node-local synced mark of
/// the WAL header differs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub lsn: Lsn,
    pub epoch: Epoch,
    pub kind: u8,
    pub payload: Vec<u8>,
}

/// `(largest epoch <= asked, the lsn after that epoch's last record)`, Kafka's
/// `endOffsetForEpoch`: for the latest epoch the end is the log end; for an older one it is
/// the start of the next epoch. `None` when the log holds no epoch <= asked.
pub type EpochEnd = Option<(Epoch, Lsn)>;

/// One file of a base backup, as the leader announces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFile {
    /// Relative to the data directory, `/`-separated.
    pub path: String,
    /// The file's size on disk (a preallocated segment is larger than its content).
    pub size: u64,
    /// How many leading bytes are sent; the rest is zeros.
    pub len: u64,
}

/// The leader's side: a consistent set of files, read one after the other. Blocking; the
/// protocol calls it on the blocking pool. Dropping it ends the copy (and whatever the log
/// holds still for it).
pub trait SnapshotSource: Send {
    /// Where the follower's log starts once the files are in place.
    fn wal_from(&self) -> Lsn;
    /// The next file, `None` after the last.
    fn next_file(&mut self) -> Result<Option<SnapshotFile>, String>;
    /// Up to `buf.len()` bytes of the current file's first `len`, in order; 0 once all given.
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, String>;
}

/// What the leader's log made of a forwarded batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarded {
    /// The batch's result (a result file's JSON), as durable as the leader's own answers;
    /// `durable_lsn` is the leader's durable log end when it was given.
    Answer { answer: Vec<u8>, durable_lsn: Lsn },
    /// Not taken now (not the leader, stepping down, intake paused): nothing was decided.
    Refused(String),
}

/// The leader's side.
pub trait LeaderLog: Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;
    /// The leader's epoch, or `None` once it is not (or no longer) the leader.
    fn leader_epoch(&self) -> Option<Epoch>;
    /// The first lsn still held (below it the WAL was retired by a checkpoint).
    fn log_start(&self) -> Lsn;
    /// The lsn after the last record a follower may be sent: only records below it are
    /// served. The durable end, or (a leader that may ship records before its own sync, in
    /// an epoch no restart of it can resume: `docs/replication-model.md`, "shipped before
    /// the sync") the written end. The high watermark stays below the leader's own durable
    /// end either way (`acknowledged`).
    fn shippable_end(&self) -> Lsn;
    /// Resolves (or times out) once the durable end passes `after`: long-poll support for a
    /// log without a watch (it never ships before its sync).
    fn wait_durable(&self, after: Lsn, timeout: std::time::Duration) -> Lsn;
    /// The shippable end as a watch, if this log keeps one (it must send every new end): a
    /// caught-up follower's long-poll then waits on it in the runtime, woken by the write
    /// or sync itself, instead of in `wait_durable` on a blocking-pool thread that must wake
    /// the runtime in turn. `None`: `wait_durable`.
    fn shippable_watch(&self) -> Option<tokio::sync::watch::Receiver<Lsn>> {
        None
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd;
    /// Records `from..shippable_end()`, at least one if any, at most about `max_bytes`.
    fn read(&self, from: Lsn, max_bytes: usize) -> Result<Vec<Entry>, Self::Error>;
    /// Follower `replica` acknowledged `durable_lsn`: every record below it is durable there
    /// (a `Fetch`'s `fetch_lsn`, a `FetchAhead`'s or a `Durable` frame's `durable_lsn`; never
    /// more than its fetches established). Returns the high watermark to send back.
    fn acknowledged(&self, replica: &str, durable_lsn: Lsn) -> Lsn;
    /// A follower connection closed (the in-sync set may shrink).
    fn disconnected(&self, replica: &str);
    /// Follower `replica` was told its log diverges or is behind what this leader retains:
    /// it must cut or be re-seeded before it holds anything new, so no answer should wait
    /// for it now (a cluster leader takes it out of the in-sync set at once, issue 42).
    fn fell_behind(&self, replica: &str, why: &str) {
        let _ = (replica, why);
    }
    /// A peer knows a higher epoch than this leader's: step down at once.
    fn saw_higher_epoch(&self, epoch: Epoch);
    /// True: this log never blocks, and the protocol calls it on the runtime's own thread,
    /// not the blocking pool (a deterministic simulator's log: `roost-sim`). The daemon's
    /// log blocks (fsync, the engine) and keeps the default.
    fn calls_inline(&self) -> bool {
        false
    }
    /// A base backup for follower `replica` (`snapshot.rs`): a consistent copy of the state
    /// at the leader's last checkpoint, held still until the source is dropped. By default
    /// a leader serves none.
    fn snapshot(&self, replica: &str) -> Result<Box<dyn SnapshotSource>, String> {
        Err(format!(
            "this leader serves no base backup (asked by {replica})"
        ))
    }
    /// Member `replica` forwarded a client's batch (`forward.rs`): run it as this leader's
    /// own and answer once the answer is as durable as its own answers. By default a leader
    /// takes none.
    fn forward(&self, replica: &str, batch: &[u8]) -> Forwarded {
        let _ = batch;
        Forwarded::Refused(format!(
            "this leader takes no forwarded batches (from {replica})"
        ))
    }
    /// Several of `replica`'s forwarded batches that came together: one outcome each, in
    /// order. A leader that can run them as one group (one plan, one sync) does; by
    /// default each is `forward`ed alone.
    fn forward_group(&self, replica: &str, batches: &[Vec<u8>]) -> Vec<Forwarded> {
        batches.iter().map(|b| self.forward(replica, b)).collect()
    }
}

/// The follower's side.
pub trait FollowerLog: Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;
    /// The leader epoch this follower knows (sent as the fetch's `current_epoch`).
    fn current_epoch(&self) -> Epoch;
    /// Learn a (higher) leader epoch; durable before it returns.
    fn set_current_epoch(&self, epoch: Epoch) -> Result<(), Self::Error>;
    /// The lsn after the last record (the next fetch's `fetch_lsn`).
    fn log_end(&self) -> Lsn;
    /// The lsn after the last record known durable: what a follower fetching ahead
    /// acknowledges when a connection starts. By default the log end, for a log whose
    /// appends are durable when they return and that nobody reads while one runs.
    fn durable_end(&self) -> Lsn {
        self.log_end()
    }
    /// The epoch of the last record, 0 when the log is empty.
    fn last_epoch(&self) -> Epoch;
    /// The durable end (as `durable_end`) as a watch, if this log keeps one, sent whenever
    /// it moves, by the sync itself: a follower fetching ahead then acknowledges records
    /// (a `Durable` frame) as soon as they are durable, while the rest of their `append`
    /// (applying them) still runs. Only records this session appended or found are
    /// acknowledged, never past the running append's end. `None`: acknowledged when
    /// `append` returns.
    fn durable_watch(&self) -> Option<tokio::sync::watch::Receiver<Lsn>> {
        None
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd;
    /// Appends records that continue the log (`entries[0].lsn == log_end()`), durably, and
    /// applies them; `leader_hw` is the leader's high watermark. `entries` is empty when an
    /// answer only moved the hw (a long-poll that ended without records).
    fn append(&self, entries: &[Entry], leader_hw: Lsn) -> Result<(), Self::Error>;
    /// Removes every record at or above `lsn` (and all that was applied from them).
    fn truncate_to(&self, lsn: Lsn) -> Result<(), Self::Error>;
    /// As `LeaderLog::calls_inline`.
    fn calls_inline(&self) -> bool {
        false
    }
}

//! `MemLog`: an in-memory log that implements both `LeaderLog` and `FollowerLog`, for this
//! crate's tests and for the daemon's. It keeps the records, the epoch list (epoch -> first
//! lsn, as Kafka's leader-epoch cache), a durable end that lags the leader's appends until
//! `sync`, the in-sync set's acknowledgements and the high watermark. A "crash" drops what
//! was not synced, as a power cut would. Nothing here touches a disk or the network.

// Test support: a misuse here is a bug in the calling test, and a panic says so at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::decide::end_offset_in;
use crate::log::{Entry, Epoch, EpochEnd, FollowerLog, LeaderLog, Lsn};
use crate::log::{SnapshotFile, SnapshotSource};

/// Why a `MemLog` call failed.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    #[error("{log}: append at lsn {got} does not continue the log (end {expected})")]
    NotContiguous {
        log: String,
        expected: Lsn,
        got: Lsn,
    },
    #[error("{log}: truncate to lsn {lsn} below the log start {log_start}")]
    BelowStart {
        log: String,
        lsn: Lsn,
        log_start: Lsn,
    },
    #[error("{log}: injected failure in {op}")]
    Injected { log: String, op: &'static str },
}

#[derive(Default)]
struct State {
    /// The first lsn held; `entries[i].lsn == log_start + i`.
    log_start: Lsn,
    /// The epoch of the record just below `log_start` (0 if none): `last_epoch` of a log
    /// whose records were all retired.
    start_epoch: Epoch,
    /// Shared with readers that take the whole log (`entries_shared`, a simulator's checker
    /// every few steps): copied only when written while a reader holds it.
    entries: Arc<Vec<Entry>>,
    /// `(epoch, first lsn)`, increasing in both.
    epochs: Vec<(Epoch, Lsn)>,
    shippable_end: Lsn,
    current_epoch: Epoch,
    leader: Option<Epoch>,
    isr: Vec<String>,
    acks: HashMap<String, Lsn>,
    /// Leader: the high watermark. Follower: the last one seen, capped at its log end.
    hw: Lsn,
    higher_epoch_seen: Option<Epoch>,
    disconnects: Vec<String>,
    /// Followers told their log diverges or is out of range, in order.
    fell_behind: Vec<String>,
    fail_next: Option<&'static str>,
    /// What `snapshot` hands out: `(wal_from, [(path, content, size)])`.
    snapshot: Option<(Lsn, Vec<MemFile>)>,
    /// Base backups handed out.
    snapshots_taken: u32,
    forwarded: u64,
    /// The highest lsn `read` was asked to read from (where a follower's fetch stood).
    furthest_read: Lsn,
    /// The most forwarded batches run as one group.
    largest_forward_group: usize,
}

impl State {
    fn log_end(&self) -> Lsn {
        self.log_start + self.entries.len() as Lsn
    }

    fn push(&mut self, entry: Entry) {
        if self.epochs.last().is_none_or(|&(e, _)| entry.epoch > e) {
            self.epochs.push((entry.epoch, entry.lsn));
        }
        Arc::make_mut(&mut self.entries).push(entry);
    }

    fn truncate(&mut self, lsn: Lsn) {
        let keep = lsn.saturating_sub(self.log_start) as usize;
        Arc::make_mut(&mut self.entries).truncate(keep);
        self.epochs.retain(|&(_, start)| start < lsn);
        self.shippable_end = self.shippable_end.min(lsn);
        self.hw = self.hw.min(lsn);
    }
}

/// A `Fetch` as `replica` in `current_epoch` from `fetch_lsn`, claiming no records (last
/// epoch 0), up to 1 MiB, no long-poll: what the tests and drills of hostile peers send.
pub fn fetch(replica: &str, current_epoch: Epoch, fetch_lsn: Lsn) -> crate::wire::Message {
    crate::wire::Message::Fetch {
        replica: replica.into(),
        current_epoch,
        fetch_lsn,
        last_epoch: 0,
        max_bytes: 1 << 20,
        wait_ms: 0,
    }
}

/// Sends `msg` on `s` and reads one answer within `limit`. `None`: no answer (the leader
/// closed the connection, refused the frame, or stayed silent past `limit`).
pub async fn ask(
    s: &mut crate::transport::Stream,
    msg: &crate::wire::Message,
    limit: Duration,
) -> Option<crate::wire::Message> {
    use crate::wire::{read_frame, write_frame, DEFAULT_FRAME_BYTES_MAX};
    write_frame(s, msg, DEFAULT_FRAME_BYTES_MAX).await.ok()?;
    let read = tokio::time::timeout(limit, read_frame(s, DEFAULT_FRAME_BYTES_MAX));
    read.await.ok()?.ok()?
}

/// An in-memory replicated log (see the module doc).
pub struct MemLog {
    name: String,
    state: Mutex<State>,
    durable: Condvar,
    /// With [`MemLog::with_shippable_watch`]: the durable end as a watch (`shippable_watch`).
    watch: Option<tokio::sync::watch::Sender<Lsn>>,
    /// Calls of `wait_durable` (a log with a watch should see none).
    blocking_waits: std::sync::atomic::AtomicU64,
}

impl MemLog {
    /// An empty log named `name` (the name is its replica id in fetches and errors).
    pub fn new(name: &str) -> Self {
        MemLog {
            name: name.to_string(),
            state: Mutex::new(State {
                log_start: 1,
                shippable_end: 1,
                hw: 1,
                ..State::default()
            }),
            durable: Condvar::new(),
            watch: None,
            blocking_waits: Default::default(),
        }
    }

    /// [`MemLog::new`], offering its durable end as a watch (`LeaderLog::shippable_watch`), as
    /// the daemon's log does: a caught-up follower's long-poll waits on it in the runtime.
    pub fn with_shippable_watch(name: &str) -> Self {
        MemLog {
            watch: Some(tokio::sync::watch::channel(1).0),
            ..MemLog::new(name)
        }
    }

    /// How many times `wait_durable` was called.
    pub fn blocking_waits(&self) -> u64 {
        self.blocking_waits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells the waiters (condvar and watch) the durable end moved.
    fn durable_moved(&self, shippable_end: Lsn) {
        self.durable.notify_all();
        if let Some(tx) = &self.watch {
            tx.send_replace(shippable_end);
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The base backup `snapshot` hands out from now on: files `(path, content, size)` (the
    /// content is sent, zeros fill the rest of `size`), the follower's log to start at
    /// `wal_from`.
    pub fn set_snapshot(&self, wal_from: Lsn, files: Vec<MemFile>) {
        self.lock().snapshot = Some((wal_from, files));
    }

    /// How many forwarded batches this leader answered.
    pub fn forwarded(&self) -> u64 {
        self.lock().forwarded
    }

    /// The most forwarded batches run as one group (`forward_group`).
    pub fn largest_forward_group(&self) -> usize {
        self.lock().largest_forward_group
    }

    /// How many base backups were handed out.
    pub fn snapshots_taken(&self) -> u32 {
        self.lock().snapshots_taken
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leads `epoch` with in-sync set `isr` (replica names): records the epoch's start at
    /// the log end (Kafka's `makeLeader`) and forgets acknowledgements of older epochs.
    pub fn become_leader(&self, epoch: Epoch, isr: &[&str]) {
        let mut s = self.lock();
        let end = s.log_end();
        if s.epochs.last().is_none_or(|&(e, _)| epoch > e) {
            s.epochs.push((epoch, end));
        }
        s.leader = Some(epoch);
        s.current_epoch = epoch;
        s.isr = isr.iter().map(|r| r.to_string()).collect();
        s.acks.clear();
    }

    /// Replaces the in-sync set of a leader (replica names whose acknowledgements the hw
    /// waits for), keeping the acknowledgements already counted: a standby joining or
    /// leaving mid-epoch.
    pub fn set_isr(&self, isr: &[&str]) {
        self.lock().isr = isr.iter().map(|r| r.to_string()).collect();
    }

    /// Stops leading (a follower now, or down).
    pub fn resign(&self) {
        self.lock().leader = None;
    }

    /// Appends one record in the leader's epoch, not yet durable. Panics if not leader
    /// (a test bug).
    pub fn write(&self, kind: u8, payload: &[u8]) -> Lsn {
        let mut s = self.lock();
        let epoch = s
            .leader
            .expect("MemLog::write on a node that is not leader");
        let lsn = s.log_end();
        s.push(Entry {
            lsn,
            epoch,
            kind,
            payload: payload.to_vec(),
        });
        lsn
    }

    /// Makes every record durable (and visible to fetches).
    pub fn sync(&self) {
        let mut s = self.lock();
        s.shippable_end = s.log_end();
        let isr_empty = s.isr.is_empty();
        if isr_empty && s.leader.is_some() {
            s.hw = s.shippable_end;
        }
        self.durable_moved(s.shippable_end);
    }

    /// `write` then `sync`.
    pub fn write_durable(&self, kind: u8, payload: &[u8]) -> Lsn {
        let lsn = self.write(kind, payload);
        self.sync();
        lsn
    }

    /// A power cut: records that were not durable are gone; leadership is lost.
    pub fn crash(&self) {
        let mut s = self.lock();
        let durable = s.shippable_end;
        s.truncate(durable);
        s.leader = None;
        s.acks.clear();
        self.durable_moved(s.shippable_end);
    }

    /// Retires every record below `lsn` (a checkpoint removed them).
    pub fn retire_below(&self, lsn: Lsn) {
        let mut s = self.lock();
        let drop = lsn.saturating_sub(s.log_start).min(s.entries.len() as Lsn) as usize;
        if drop > 0 {
            s.start_epoch = s.entries[drop - 1].epoch;
            Arc::make_mut(&mut s.entries).drain(..drop);
            s.log_start += drop as Lsn;
        }
    }

    /// The next call to `op` ("append", "truncate_to", "set_current_epoch") fails.
    pub fn fail_next(&self, op: &'static str) {
        self.lock().fail_next = Some(op);
    }

    fn injected(&self, s: &mut State, op: &'static str) -> Result<(), MemError> {
        if s.fail_next == Some(op) {
            s.fail_next = None;
            return Err(MemError::Injected {
                log: self.name.clone(),
                op,
            });
        }
        Ok(())
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.lock().entries.to_vec()
    }
    /// The log's records without a copy (a later write copies them if this is still held).
    pub fn entries_shared(&self) -> Arc<Vec<Entry>> {
        Arc::clone(&self.lock().entries)
    }
    pub fn payloads(&self) -> Vec<Vec<u8>> {
        self.lock()
            .entries
            .iter()
            .map(|e| e.payload.clone())
            .collect()
    }
    /// What `replica` acknowledged last (leader side): every record below it is durable there.
    pub fn acked(&self, replica: &str) -> Option<Lsn> {
        self.lock().acks.get(replica).copied()
    }
    /// The highest lsn a follower's fetch was served records from (leader side).
    pub fn furthest_read(&self) -> Lsn {
        self.lock().furthest_read
    }
    pub fn hw(&self) -> Lsn {
        self.lock().hw
    }
    pub fn end(&self) -> Lsn {
        self.lock().log_end()
    }
    pub fn epoch(&self) -> Epoch {
        self.lock().current_epoch
    }
    pub fn is_leader(&self) -> bool {
        self.lock().leader.is_some()
    }
    pub fn epochs(&self) -> Vec<(Epoch, Lsn)> {
        self.lock().epochs.clone()
    }
    pub fn higher_epoch_seen(&self) -> Option<Epoch> {
        self.lock().higher_epoch_seen
    }
    pub fn disconnects(&self) -> Vec<String> {
        self.lock().disconnects.clone()
    }
    pub fn fell_behind(&self) -> Vec<String> {
        self.lock().fell_behind.clone()
    }

    /// Sets this node's known epoch without leading (a follower told of a new leader).
    pub fn learn_epoch(&self, epoch: Epoch) {
        let mut s = self.lock();
        s.current_epoch = s.current_epoch.max(epoch);
    }

    /// Writes records as if they had been replicated (test set-up: logs with a history).
    pub fn seed(&self, records: &[(Epoch, &[u8])]) {
        let mut s = self.lock();
        for &(epoch, payload) in records {
            let lsn = s.log_end();
            s.push(Entry {
                lsn,
                epoch,
                kind: 0,
                payload: payload.to_vec(),
            });
            s.current_epoch = s.current_epoch.max(epoch);
        }
        s.shippable_end = s.log_end();
        self.durable_moved(s.shippable_end);
    }
}

impl LeaderLog for MemLog {
    type Error = MemError;

    fn leader_epoch(&self) -> Option<Epoch> {
        self.lock().leader
    }
    fn log_start(&self) -> Lsn {
        self.lock().log_start
    }
    fn shippable_end(&self) -> Lsn {
        self.lock().shippable_end
    }
    fn wait_durable(&self, after: Lsn, timeout: Duration) -> Lsn {
        self.blocking_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while s.shippable_end <= after {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self
                .durable
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        s.shippable_end
    }
    fn shippable_watch(&self) -> Option<tokio::sync::watch::Receiver<Lsn>> {
        self.watch.as_ref().map(|tx| tx.subscribe())
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        let s = self.lock();
        end_offset_in(&s.epochs, s.log_end(), epoch)
    }
    fn read(&self, from: Lsn, max_bytes: usize) -> Result<Vec<Entry>, MemError> {
        let mut s = self.lock();
        s.furthest_read = s.furthest_read.max(from);
        let mut out = Vec::new();
        let mut bytes = 0;
        let first = from.saturating_sub(s.log_start) as usize;
        let last = s.shippable_end.saturating_sub(s.log_start) as usize;
        for e in s.entries.iter().take(last).skip(first) {
            if !out.is_empty() && bytes + e.payload.len() > max_bytes {
                break;
            }
            bytes += e.payload.len();
            out.push(e.clone());
        }
        Ok(out)
    }
    fn acknowledged(&self, replica: &str, fetch_lsn: Lsn) -> Lsn {
        let mut s = self.lock();
        s.acks.insert(replica.to_string(), fetch_lsn);
        let acked = s
            .isr
            .iter()
            .map(|r| s.acks.get(r).copied().unwrap_or(0))
            .min();
        let candidate = acked.unwrap_or(Lsn::MAX).min(s.shippable_end);
        s.hw = s.hw.max(candidate);
        s.hw
    }
    fn disconnected(&self, replica: &str) {
        self.lock().disconnects.push(replica.to_string());
    }
    fn fell_behind(&self, replica: &str, _why: &str) {
        self.lock().fell_behind.push(replica.to_string());
    }
    fn saw_higher_epoch(&self, epoch: Epoch) {
        let mut s = self.lock();
        s.leader = None;
        s.current_epoch = s.current_epoch.max(epoch);
        s.higher_epoch_seen = Some(epoch);
    }
    /// Answers `fwd:REPLICA:BATCH` while leading (counting it), else refuses.
    fn forward(&self, replica: &str, batch: &[u8]) -> crate::log::Forwarded {
        let mut s = self.lock();
        if s.leader.is_none() {
            return crate::log::Forwarded::Refused("not the leader".into());
        }
        s.forwarded += 1;
        let mut answer = format!("fwd:{replica}:").into_bytes();
        answer.extend_from_slice(batch);
        crate::log::Forwarded::Answer {
            answer,
            durable_lsn: s.shippable_end,
        }
    }

    fn forward_group(&self, replica: &str, batches: &[Vec<u8>]) -> Vec<crate::log::Forwarded> {
        {
            let mut s = self.lock();
            s.largest_forward_group = s.largest_forward_group.max(batches.len());
        }
        batches.iter().map(|b| self.forward(replica, b)).collect()
    }

    fn snapshot(&self, replica: &str) -> Result<Box<dyn SnapshotSource>, String> {
        let mut s = self.lock();
        let (wal_from, files) = s
            .snapshot
            .clone()
            .ok_or_else(|| format!("{}: no base backup set (asked by {replica})", self.name))?;
        s.snapshots_taken += 1;
        Ok(Box::new(MemSnapshot {
            wal_from,
            files: files.into_iter().rev().collect(),
            current: None,
        }))
    }
}

/// A file of a `MemLog` base backup: (path, content, size).
pub type MemFile = (String, Vec<u8>, u64);

/// `MemLog`'s base backup: files handed out from memory.
struct MemSnapshot {
    wal_from: Lsn,
    /// Still to hand out, last first.
    files: Vec<MemFile>,
    /// The current file's content and how much of it was read.
    current: Option<(Vec<u8>, usize)>,
}

impl SnapshotSource for MemSnapshot {
    fn wal_from(&self) -> Lsn {
        self.wal_from
    }
    fn next_file(&mut self) -> Result<Option<SnapshotFile>, String> {
        let Some((path, content, size)) = self.files.pop() else {
            return Ok(None);
        };
        let len = content.len() as u64;
        self.current = Some((content, 0));
        Ok(Some(SnapshotFile { path, size, len }))
    }
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        let Some((content, at)) = self.current.as_mut() else {
            return Err("read before next_file".into());
        };
        let n = buf.len().min(content.len() - *at);
        buf[..n].copy_from_slice(&content[*at..*at + n]);
        *at += n;
        Ok(n)
    }
}

impl FollowerLog for MemLog {
    type Error = MemError;

    fn current_epoch(&self) -> Epoch {
        self.lock().current_epoch
    }
    fn set_current_epoch(&self, epoch: Epoch) -> Result<(), MemError> {
        let mut s = self.lock();
        self.injected(&mut s, "set_current_epoch")?;
        s.current_epoch = s.current_epoch.max(epoch);
        Ok(())
    }
    fn log_end(&self) -> Lsn {
        self.lock().log_end()
    }
    fn last_epoch(&self) -> Epoch {
        let s = self.lock();
        s.entries.last().map_or(s.start_epoch, |e| e.epoch)
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        let s = self.lock();
        end_offset_in(&s.epochs, s.log_end(), epoch)
    }
    fn append(&self, entries: &[Entry], leader_hw: Lsn) -> Result<(), MemError> {
        let mut s = self.lock();
        self.injected(&mut s, "append")?;
        for e in entries {
            if e.lsn != s.log_end() {
                return Err(MemError::NotContiguous {
                    log: self.name.clone(),
                    expected: s.log_end(),
                    got: e.lsn,
                });
            }
            s.push(e.clone());
        }
        s.shippable_end = s.log_end();
        s.hw = s.hw.max(leader_hw.min(s.log_end()));
        self.durable_moved(s.shippable_end);
        Ok(())
    }
    fn truncate_to(&self, lsn: Lsn) -> Result<(), MemError> {
        let mut s = self.lock();
        self.injected(&mut s, "truncate_to")?;
        if lsn < s.log_start {
            return Err(MemError::BelowStart {
                log: self.name.clone(),
                lsn,
                log_start: s.log_start,
            });
        }
        s.truncate(lsn);
        self.durable_moved(s.shippable_end);
        Ok(())
    }
}

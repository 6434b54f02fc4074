//! The log: segment files, appends with group commit, syncs and retirement. Opening (the
//! scan and recovery at open) is in `open.rs`, replay in `replay.rs`, ranged reads for a
//! follower in `read.rs`, truncation of the end in `truncate.rs`.
//!
//! Concurrency: one mutex guards the write position; appends write into the page cache under
//! it (cheap, and it keeps lsn order equal to file order). Durability is separate: a caller
//! waits in [`Wal::sync_to`], where the first waiter becomes the syncer for everything written
//! so far and the rest wait on a condvar; one `fdatasync` covers every record written before
//! it started (group commit). A failed write or sync latches the log (`Poisoned`): fsync is
//! never retried, because after a failed fsync the kernel may have dropped the dirty pages.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tracing::warn;

use crate::cursor::Cursors;
use crate::format::{encode_frame, frame_len};
use crate::options::WalOptions;
use crate::{Lsn, WalError};
use roost_storage::{OpenMode, Spare, Storage, StorageFile};

/// Suffix of segment files; the stem is the first lsn, zero-padded to 20 digits.
pub const SEGMENT_SUFFIX: &str = ".wal";
pub const SEGMENT_NAME_DIGITS: usize = 20;

/// One record as replay yields it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub lsn: Lsn,
    pub epoch: u32,
    pub record_type: u8,
    pub payload: Vec<u8>,
    /// Where it is: segment path and byte offset (for error messages and `wal dump`).
    pub segment: PathBuf,
    pub offset: u64,
}

/// What open found and did, for logs and `roost status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: u64,
    pub records: u64,
    pub bytes_scanned: u64,
    /// Bytes cut from the newest segment's torn tail (0 when it ended cleanly).
    pub torn_bytes_truncated: u64,
    pub torn_reason: Option<&'static str>,
    pub first_lsn: Option<Lsn>,
    pub last_lsn: Option<Lsn>,
}

#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub(crate) first_lsn: Lsn,
    pub(crate) path: PathBuf,
    /// The file's length, preallocated (what it takes on disk).
    pub(crate) bytes: u64,
}

pub(crate) struct Active {
    pub(crate) file: Arc<dyn StorageFile>,
    pub(crate) first_lsn: Lsn,
    /// The segment's length: records are appended up to here, then the log rolls.
    pub(crate) len: u64,
    pub(crate) write_offset: u64,
    /// Zeros were written up to here ([`WalOptions::zero_ahead_bytes`]); only the space past
    /// the end is ever zeroed.
    pub(crate) zeroed_to: u64,
}

impl Active {
    pub(crate) fn new(
        file: Arc<dyn StorageFile>,
        first_lsn: Lsn,
        len: u64,
        write_offset: u64,
    ) -> Active {
        Active {
            file,
            first_lsn,
            len,
            write_offset,
            zeroed_to: write_offset,
        }
    }

    /// Whether `bytes` more fit after the end.
    pub(crate) fn fits(&self, bytes: u64) -> bool {
        self.write_offset + bytes <= self.len
    }
}

pub(crate) struct Inner {
    /// Oldest first; the last one is the active segment when `active` is set.
    pub(crate) segments: Vec<Segment>,
    pub(crate) active: Option<Active>,
    pub(crate) next_lsn: Lsn,
    /// Highest lsn written to the page cache.
    pub(crate) written_lsn: Lsn,
    /// Highest lsn known durable.
    pub(crate) synced_lsn: Lsn,
    pub(crate) syncing: bool,
    /// Set by the first failed write or sync; every later call returns `Poisoned`.
    pub(crate) poisoned: Option<String>,
    /// The next segment, preallocated ahead of need (writable logs only).
    pub(crate) spare: Option<Spare>,
    /// Epoch stamped on local appends ([`Wal::set_epoch`]); never goes down.
    pub(crate) epoch: u32,
    /// Epoch of the last record in the log (0 when it holds none): from the scan at open,
    /// then every append and truncation. An append below it is `EpochRegress`.
    pub(crate) last_epoch: u32,
}

/// The spare segment of a writable log (made now if missing), at the size of the segment
/// after `active`; none when read-only.
pub(crate) fn open_spare(
    storage: &dyn Storage,
    dir: &Path,
    opts: &WalOptions,
    active_len: Option<u64>,
) -> Result<Option<Spare>, WalError> {
    if opts.read_only {
        return Ok(None);
    }
    Spare::open(storage, dir, opts.next_segment_bytes(active_len, 0))
        .map(Some)
        .map_err(|source| WalError::Io {
            op: "make spare segment",
            path: dir.join(roost_storage::SPARE_FILE),
            source,
        })
}

/// Frames encoded by [`Wal::append_many_nowait`] and not yet written.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    frames: u64,
}

/// A segmented write-ahead log. `Send + Sync`; share it with an `Arc`.
pub struct Wal {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) dir: PathBuf,
    pub(crate) opts: WalOptions,
    pub(crate) inner: Mutex<Inner>,
    pub(crate) synced: Condvar,
    /// Where the last [`Wal::read_from`] stopped. Lock order: this before `inner`; taken by
    /// readers, truncation and retirement (which invalidate it), never by appends.
    pub(crate) cursor: Mutex<Cursors>,
    /// Record headers walked to find where a read starts (`read.rs`): reads that continue
    /// where a reader stopped walk none.
    pub(crate) walked: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) appends: AtomicU64,
    pub(crate) append_bytes: AtomicU64,
    pub(crate) report: RecoveryReport,
    /// The spare is missing (kept in step with `Inner::spare` under the lock): the daemon
    /// asks before every batch, and must not take the append lock to hear "no".
    pub(crate) spare_short: AtomicBool,
    /// Told every new synced lsn ([`Wal::on_synced`]).
    pub(crate) synced_hook: std::sync::OnceLock<SyncedHook>,
    /// Told every new written lsn ([`Wal::on_written`]).
    pub(crate) written_hook: std::sync::OnceLock<SyncedHook>,
}

/// What [`Wal::on_synced`] calls with each new synced lsn (and [`Wal::on_written`] with each
/// new written lsn).
pub type SyncedHook = Arc<dyn Fn(Lsn) + Send + Sync>;

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

pub(crate) fn segment_name(first_lsn: Lsn) -> String {
    format!(
        "{first_lsn:0width$}{SEGMENT_SUFFIX}",
        width = SEGMENT_NAME_DIGITS
    )
}

pub(crate) fn parse_segment_name(name: &str) -> Option<Lsn> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    if stem.len() != SEGMENT_NAME_DIGITS || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

impl Wal {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the log in an unknown state: treat it as an
        // I/O failure (latched) rather than carry on.
        self.inner.lock().unwrap_or_else(|p| {
            let mut g = p.into_inner();
            g.poisoned
                .get_or_insert_with(|| "a thread panicked inside the wal".into());
            g
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The lsn the next append will get.
    pub fn next_lsn(&self) -> Lsn {
        self.lock().next_lsn
    }

    /// Highest lsn known durable.
    pub fn synced_lsn(&self) -> Lsn {
        self.lock().synced_lsn
    }

    /// `fdatasync` calls made for group commit (rolls and repairs not counted).
    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    pub fn append_count(&self) -> u64 {
        self.appends.load(Ordering::Relaxed)
    }

    /// Bytes appended since open (whole records: header, payload, padding).
    pub fn append_bytes(&self) -> u64 {
        self.append_bytes.load(Ordering::Relaxed)
    }

    /// Appends a record and waits until it is durable. Returns its lsn.
    pub fn append(&self, record_type: u8, payload: &[u8]) -> Result<Lsn, WalError> {
        let lsn = self.append_nowait(record_type, payload)?;
        self.sync_to(lsn)?;
        Ok(lsn)
    }

    /// Writes a record into the page cache and returns its lsn. It is not durable until
    /// [`Wal::sync_to`] with this lsn (or a later one) returns.
    pub fn append_nowait(&self, record_type: u8, payload: &[u8]) -> Result<Lsn, WalError> {
        self.append_nowait_at(record_type, payload)
            .map(|(lsn, _)| lsn)
    }

    /// [`Wal::append_nowait`], also returning the record's byte offset in its segment, for
    /// [`Wal::read_record`].
    pub fn append_nowait_at(
        &self,
        record_type: u8,
        payload: &[u8],
    ) -> Result<(Lsn, u64), WalError> {
        self.append_frame(None, record_type, payload)
    }

    /// A follower's append of the leader's record `lsn` at `epoch`: like
    /// [`Wal::append_nowait`] (no sync; call [`Wal::sync_to`]), but `lsn` must be
    /// [`Wal::next_lsn`] (else `OutOfOrder`) and `epoch` at least [`Wal::last_record_epoch`]
    /// (else `EpochRegress`). The header's synced mark is this node's own, never the
    /// leader's: a mark vouches for what this disk synced, so callers pass fields, not frames.
    pub fn append_replicated(
        &self,
        lsn: Lsn,
        epoch: u32,
        record_type: u8,
        payload: &[u8],
    ) -> Result<Lsn, WalError> {
        self.append_replicated_at(lsn, epoch, record_type, payload)
            .map(|(lsn, _)| lsn)
    }

    /// [`Wal::append_replicated`], also returning the record's byte offset in its segment,
    /// for [`Wal::read_record`].
    pub fn append_replicated_at(
        &self,
        lsn: Lsn,
        epoch: u32,
        record_type: u8,
        payload: &[u8],
    ) -> Result<(Lsn, u64), WalError> {
        self.append_frame(Some((lsn, epoch)), record_type, payload)
    }

    /// Sets the epoch stamped on later local appends. It never goes down (`Config`).
    pub fn set_epoch(&self, epoch: u32) -> Result<(), WalError> {
        let mut g = self.lock();
        if epoch < g.epoch {
            return Err(WalError::Config(format!(
                "epoch {epoch} below the current epoch {}",
                g.epoch
            )));
        }
        g.epoch = epoch;
        Ok(())
    }

    /// The epoch local appends carry.
    pub fn epoch(&self) -> u32 {
        self.lock().epoch
    }

    /// The epoch of the last record in the log; 0 when it holds none.
    pub fn last_record_epoch(&self) -> u32 {
        self.lock().last_epoch
    }

    /// Appends `records` (type, payload) in order at the next lsns, as many
    /// [`Wal::append_nowait`] calls would, but under one lock and with one write per segment
    /// they land in (a batch's audit rows, a group's `done` records). Not durable until
    /// [`Wal::sync_to`]. Returns their lsns. A record over the size limit refuses the call
    /// before anything is written; a failure at a roll (`NoSpace`, I/O) leaves the records
    /// before it written.
    pub fn append_many_nowait(&self, records: &[(u8, &[u8])]) -> Result<Vec<Lsn>, WalError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        if self.opts.read_only {
            return Err(WalError::ReadOnly);
        }
        let max = self.opts.payload_bytes_max;
        if let Some((_, p)) = records.iter().find(|(_, p)| p.len() as u64 > max as u64) {
            let len = p.len() as u64;
            return Err(WalError::TooLarge { len, max });
        }
        let mut g = self.lock();
        if let Some(why) = &g.poisoned {
            return Err(WalError::Poisoned(why.clone()));
        }
        let epoch = g.epoch;
        if epoch < g.last_epoch {
            let (lsn, last) = (g.next_lsn, g.last_epoch);
            return Err(WalError::EpochRegress { lsn, epoch, last });
        }
        let mut lsns = Vec::with_capacity(records.len());
        let mut pending = Pending::default();
        for (record_type, payload) in records {
            let len = frame_len(payload.len()) as u64;
            let fits = g
                .active
                .as_ref()
                .is_some_and(|a| a.fits(pending.buf.len() as u64 + len));
            if !fits {
                self.write_pending(&mut g, &mut pending, epoch)?;
                let next = g.next_lsn;
                self.make_room(&mut g, next, len)?;
            }
            let lsn = g.next_lsn + pending.frames;
            let frame = encode_frame(*record_type, epoch, lsn, g.synced_lsn, payload);
            pending.buf.extend_from_slice(&frame);
            pending.frames += 1;
            lsns.push(lsn);
        }
        self.write_pending(&mut g, &mut pending, epoch)?;
        Ok(lsns)
    }

    /// Writes the frames gathered by [`Wal::append_many_nowait`] at the active segment's end
    /// in one write, and moves the log's end past them.
    fn write_pending(
        &self,
        g: &mut MutexGuard<'_, Inner>,
        pending: &mut Pending,
        epoch: u32,
    ) -> Result<(), WalError> {
        if pending.frames == 0 {
            return Ok(());
        }
        self.write_at_end(g, &pending.buf)?;
        g.next_lsn += pending.frames;
        g.written_lsn = g.next_lsn - 1;
        self.written_moved(g.written_lsn);
        g.last_epoch = epoch;
        self.appends.fetch_add(pending.frames, Ordering::Relaxed);
        self.append_bytes
            .fetch_add(pending.buf.len() as u64, Ordering::Relaxed);
        pending.buf.clear();
        pending.frames = 0;
        Ok(())
    }

    /// Writes one frame at the next lsn: the log's own epoch, or the `(lsn, epoch)` a
    /// replicated append was given (checked). Rolls when the record does not fit.
    fn append_frame(
        &self,
        given: Option<(Lsn, u32)>,
        record_type: u8,
        payload: &[u8],
    ) -> Result<(Lsn, u64), WalError> {
        if self.opts.read_only {
            return Err(WalError::ReadOnly);
        }
        if payload.len() > self.opts.payload_bytes_max as usize {
            return Err(WalError::TooLarge {
                len: payload.len() as u64,
                max: self.opts.payload_bytes_max,
            });
        }
        let mut g = self.lock();
        if let Some(why) = &g.poisoned {
            return Err(WalError::Poisoned(why.clone()));
        }
        let lsn = g.next_lsn;
        let epoch = match given {
            Some((got, _)) if got != lsn => {
                return Err(WalError::OutOfOrder { expected: lsn, got })
            }
            Some((_, epoch)) => epoch,
            None => g.epoch,
        };
        if epoch < g.last_epoch {
            let last = g.last_epoch;
            return Err(WalError::EpochRegress { lsn, epoch, last });
        }
        self.make_room(&mut g, lsn, frame_len(payload.len()) as u64)?;
        // The record's synced mark: what is durable now, before it is written (after a roll,
        // the whole sealed segment).
        let frame = encode_frame(record_type, epoch, lsn, g.synced_lsn, payload);
        let offset = self.write_at_end(&mut g, &frame)?;
        g.next_lsn = lsn + 1;
        g.written_lsn = lsn;
        self.written_moved(lsn);
        g.last_epoch = epoch;
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.append_bytes
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        Ok((lsn, offset))
    }

    /// Writes `bytes` (whole frames) at the active segment's end, and zeros ahead of them when
    /// due ([`WalOptions::zero_ahead_bytes`]), and moves the end past them; returns where
    /// they start. A failed write (of either) poisons the log, as any write failure.
    fn write_at_end(&self, g: &mut MutexGuard<'_, Inner>, bytes: &[u8]) -> Result<u64, WalError> {
        let Some(a) = g.active.as_ref() else {
            return Err(WalError::Poisoned("no active segment".into()));
        };
        let (file, offset) = (a.file.clone(), a.write_offset);
        let end = offset + bytes.len() as u64;
        let zeros = roost_storage::zeros_due(a.zeroed_to, end, self.opts.zero_ahead_bytes, a.len);
        let written = match zeros {
            Some((from, to)) => roost_storage::write_zeros(file.as_ref(), from, to)
                .map_err(|e| ("write zeros ahead", e)),
            None => Ok(()),
        }
        .and_then(|()| file.write_at(bytes, offset).map_err(|e| ("write", e)));
        if let Err((op, source)) = written {
            let path = self.dir.join(segment_name(a.first_lsn));
            let e = WalError::Io { op, path, source };
            g.poisoned = Some(e.to_string());
            return Err(e);
        }
        if let Some(a) = g.active.as_mut() {
            a.write_offset = end;
            if let Some((_, to)) = zeros {
                a.zeroed_to = to;
            }
        }
        Ok(offset)
    }

    /// The one record `lsn`, at byte `offset` of its segment (from [`Wal::append_nowait_at`]
    /// or a replayed [`Record`]): reads that frame only, checks its checksum and its lsn.
    pub fn read_record(&self, lsn: Lsn, offset: u64) -> Result<Record, WalError> {
        let seg = {
            let g = self.lock();
            let i = g.segments.partition_point(|s| s.first_lsn <= lsn);
            match i.checked_sub(1).and_then(|i| g.segments.get(i)) {
                Some(s) if lsn < g.next_lsn => s.clone(),
                _ => return Err(WalError::Missing { lsn }),
            }
        };
        let file = match self.storage.open(&seg.path, OpenMode::Read) {
            Ok(f) => f,
            // Retired between the look-up and the open: the record is gone, not unreadable.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && lsn < self.first_lsn() => {
                return Err(WalError::Missing { lsn });
            }
            Err(source) => {
                return Err(WalError::Io {
                    op: "open",
                    path: seg.path.clone(),
                    source,
                })
            }
        };
        read_frame(
            file.as_ref(),
            &seg.path,
            lsn,
            offset,
            self.opts.payload_bytes_max,
        )
    }

    /// The segments, oldest first: (first lsn, path).
    pub fn segments(&self) -> Vec<(Lsn, PathBuf)> {
        let g = self.lock();
        g.segments
            .iter()
            .map(|s| (s.first_lsn, s.path.clone()))
            .collect()
    }

    /// The log's segment files and how many leading bytes of each hold complete records
    /// now: a sealed segment all of them (`None`), the active one up to its write offset (taken under
    /// the append lock, and every append writes its whole frame under it). A copy of those
    /// bytes of every file, zeros after, is a log a crash could have left: complete records
    /// only, no hole, whatever is appended meanwhile (a base backup for a standby). The
    /// caller keeps segments from being retired while it copies.
    pub fn extent(&self) -> Vec<(PathBuf, Option<u64>)> {
        let g = self.lock();
        let active = g.active.as_ref().map(|a| (a.first_lsn, a.write_offset));
        g.segments
            .iter()
            .map(|s| match active {
                Some((first, offset)) if first == s.first_lsn => (s.path.clone(), Some(offset)),
                // Sealed: the whole file (its size may predate a change of segment size).
                _ => (s.path.clone(), None),
            })
            .collect()
    }

    /// The size segments are preallocated to once the log has grown (the first ones are
    /// smaller: [`WalOptions::first_segment_bytes`]).
    pub fn segment_bytes(&self) -> u64 {
        self.opts.segment_bytes
    }

    /// The lsn of the oldest record still in the log (segments below it were retired).
    pub fn first_lsn(&self) -> Lsn {
        let g = self.lock();
        g.segments.first().map_or(g.next_lsn, |s| s.first_lsn)
    }

    /// Returns once every record up to `lsn` is durable. The first caller to find no sync in
    /// progress runs one for everything written so far; the others wait for it. `Missing`
    /// for an lsn never written (or removed by [`Wal::truncate_from`] while waiting).
    pub fn sync_to(&self, lsn: Lsn) -> Result<(), WalError> {
        let mut g = self.lock();
        loop {
            if let Some(why) = &g.poisoned {
                return Err(WalError::Poisoned(why.clone()));
            }
            if g.synced_lsn >= lsn {
                return Ok(());
            }
            if lsn > g.written_lsn {
                // Never written, or removed by `truncate_from`: no sync will ever cover it.
                return Err(WalError::Missing { lsn });
            }
            if g.syncing {
                g = self.synced.wait(g).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let target = g.written_lsn;
            let Some(active) = g.active.as_ref() else {
                return Err(WalError::Poisoned(
                    "sync requested with no active segment".into(),
                ));
            };
            let file = active.file.clone();
            let path = self.dir.join(segment_name(active.first_lsn));
            g.syncing = true;
            drop(g);
            let r = file.sync_data();
            self.syncs.fetch_add(1, Ordering::Relaxed);
            g = self.lock();
            g.syncing = false;
            match r {
                Ok(()) => {
                    g.synced_lsn = g.synced_lsn.max(target);
                    self.synced_moved(g.synced_lsn);
                }
                Err(source) => {
                    let e = WalError::Io {
                        op: "sync",
                        path,
                        source,
                    };
                    warn!(error = %e, "wal: sync failed, log poisoned");
                    g.poisoned = Some(e.to_string());
                }
            }
            self.synced.notify_all();
        }
    }

    /// Calls `hook` with the synced lsn whenever it moves (a group commit, a roll, a cut),
    /// under the log's lock, so it must be quick and must not call back into the log (a
    /// replication leader's long-poll watch, woken by the sync itself). One hook per log:
    /// `false` if one was set already.
    pub fn on_synced(&self, hook: SyncedHook) -> bool {
        self.synced_hook.set(hook).is_ok()
    }

    /// Calls `hook` with the written lsn whenever it moves (an append, or a cut that takes
    /// records back), under the log's lock, as [`Wal::on_synced`] does: a leader that ships
    /// records before its own sync wakes its standbys' long-polls at the write. One hook per
    /// log: `false` if one was set already.
    pub fn on_written(&self, hook: SyncedHook) -> bool {
        self.written_hook.set(hook).is_ok()
    }

    pub(crate) fn written_moved(&self, written: Lsn) {
        if let Some(hook) = self.written_hook.get() {
            hook(written);
        }
    }

    pub(crate) fn synced_moved(&self, synced: Lsn) {
        if let Some(hook) = self.synced_hook.get() {
            hook(synced);
        }
    }

    /// Waits until a record after `lsn` is durable, or `timeout` passes (a long-polling
    /// reader, such as a standby's fetch); returns the highest durable lsn then. Never runs
    /// a sync itself.
    pub fn wait_synced_past(&self, lsn: Lsn, timeout: std::time::Duration) -> Lsn {
        let until = std::time::Instant::now() + timeout;
        let mut g = self.lock();
        loop {
            let now = std::time::Instant::now();
            if g.synced_lsn > lsn || g.poisoned.is_some() || now >= until {
                return g.synced_lsn;
            }
            g = self
                .synced
                .wait_timeout(g, until - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Makes the segments' names in the log's directory durable.
    pub(crate) fn sync_dir(&self) -> Result<(), WalError> {
        self.storage
            .sync_dir(&self.dir)
            .map_err(|source| WalError::Io {
                op: "sync dir",
                path: self.dir.clone(),
                source,
            })
    }

    /// Removes whole segments whose every record is below `lsn` (never the active one), then
    /// syncs the directory. Returns how many were removed.
    pub fn retire_below(&self, lsn: Lsn) -> Result<usize, WalError> {
        let mut cur = self.lock_cursor();
        let mut g = self.lock();
        let mut removed = 0;
        while g.segments.len() > 1 && g.segments[1].first_lsn <= lsn {
            let seg = g.segments.remove(0);
            self.storage
                .remove(&seg.path)
                .map_err(|source| WalError::Io {
                    op: "remove",
                    path: seg.path.clone(),
                    source,
                })?;
            removed += 1;
        }
        if removed > 0 {
            cur.clear();
            self.sync_dir()?;
        }
        Ok(removed)
    }
}

/// Reads and checks the frame of record `lsn` at `offset` of `file`.
pub(crate) fn read_frame(
    file: &dyn StorageFile,
    path: &Path,
    lsn: Lsn,
    offset: u64,
    payload_bytes_max: u32,
) -> Result<Record, WalError> {
    use crate::format::{probe, Probe, LEN_OFFSET, RECORD_HEADER_LEN};
    let io = |source| WalError::Io {
        op: "read",
        path: path.to_path_buf(),
        source,
    };
    let mut head = [0u8; RECORD_HEADER_LEN];
    file.read_at(&mut head, offset).map_err(io)?;
    let mut len = [0u8; 4];
    len.copy_from_slice(&head[LEN_OFFSET..LEN_OFFSET + 4]);
    let len = u32::from_le_bytes(len).min(payload_bytes_max) as usize;
    let mut buf = vec![0u8; RECORD_HEADER_LEN + len];
    file.read_at(&mut buf, offset).map_err(io)?;
    let corrupt = |reason: String| WalError::Corrupt {
        segment: path.to_path_buf(),
        offset,
        lsn,
        reason,
    };
    match probe(&buf, payload_bytes_max) {
        Probe::Valid(h) if h.lsn == lsn => Ok(Record {
            lsn,
            epoch: h.epoch,
            record_type: h.record_type,
            payload: buf.split_off(RECORD_HEADER_LEN),
            segment: path.to_path_buf(),
            offset,
        }),
        Probe::Valid(h) => Err(corrupt(format!("record at this offset is lsn {}", h.lsn))),
        Probe::Zero => Err(corrupt("no record at this offset".into())),
        Probe::Invalid(why) => Err(corrupt(why.into())),
    }
}

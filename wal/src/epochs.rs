//! The leader-epoch file ([`LeaderEpochs`]), Kafka's `leader-epoch-checkpoint`: for each
//! epoch this log has records of (or was assigned as leader), the lsn its first record got.
//! A follower asks the leader for the end of an epoch ([`LeaderEpochs::end_offset_for`]) and
//! truncates its own log there (KIP-320). This module owns the file's bytes (`docs/
//! wal-format.md`, "Leader epochs"), its crash-safe replacement (temporary file, fdatasync,
//! rename, directory fsync) and its reconciliation with the WAL at open; it never writes the
//! WAL. The WAL is the truth: a missing or damaged file is rebuilt from the records' epochs.
//!
//! ```text
//! offset     size  field
//!      0        1  version   EPOCHS_FORMAT_VERSION (1)
//!      1        4  count     number of entries, <= EPOCHS_ENTRIES_MAX
//!      5  12*count entries   epoch u32, start lsn u64; strictly increasing in both
//!    end-4      4  crc32     CRC-32 (IEEE) of every byte before it
//! ```
//! All integers little-endian.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roost_storage::{read_all, replace_file, OpenMode, Storage};
use tracing::warn;

use crate::{Lsn, Wal, WalError};

pub const EPOCHS_FORMAT_VERSION: u8 = 1;
/// Version byte and entry count.
pub const EPOCHS_HEADER_LEN: usize = 5;
/// One entry: epoch (u32) and start lsn (u64).
pub const EPOCH_ENTRY_LEN: usize = 12;
pub const EPOCHS_CRC_LEN: usize = 4;
/// Most entries a file may hold (checked before reading or allocating).
pub const EPOCHS_ENTRIES_MAX: u32 = 1 << 20;

const _: () = assert!(EPOCH_ENTRY_LEN == 4 + 8);

/// The leader-epoch list of one log, kept in memory and in its file.
#[derive(Debug)]
pub struct LeaderEpochs {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    /// `(epoch, start lsn)`, strictly increasing in both; the same as the file after every
    /// call that returned Ok.
    entries: Vec<(u32, Lsn)>,
}

/// What reading the file found.
enum Loaded {
    Entries(Vec<(u32, Lsn)>),
    Missing,
    Damaged(&'static str),
}

impl LeaderEpochs {
    /// Reads the file at `path`, rebuilding it from `wal` when it is missing or damaged
    /// (logged as a warning), then reconciles it with `wal`: entries starting at or past the
    /// log's end are dropped, and when the log's last record has another epoch than the
    /// latest entry (newer: a crash between an append and the file's write; older: entries
    /// no record confirms) the entries from the newest one at or below that epoch on are
    /// rebuilt from the records. Entries below `wal.first_lsn()` stay.
    pub fn open(
        storage: Arc<dyn Storage>,
        path: PathBuf,
        wal: &Wal,
    ) -> Result<LeaderEpochs, WalError> {
        let loaded = load(storage.as_ref(), &path)?;
        let mut me = LeaderEpochs {
            storage,
            path,
            entries: Vec::new(),
        };
        let mut dirty = true;
        match loaded {
            Loaded::Entries(e) => {
                me.entries = e;
                dirty = false;
            }
            Loaded::Missing => me.entries = scan_epochs(wal, wal.first_lsn())?,
            Loaded::Damaged(why) => {
                warn!(path = %me.path.display(), why, "leader epochs: damaged file, rebuilt from the wal");
                me.entries = scan_epochs(wal, wal.first_lsn())?;
            }
        }
        let next = wal.next_lsn();
        let before = me.entries.len();
        me.entries.retain(|(_, start)| *start < next);
        dirty |= me.entries.len() != before;
        let last = wal.last_record_epoch();
        if last != 0 && me.latest().is_none_or(|(e, _)| e != last) {
            if me.latest().is_some_and(|(e, _)| e > last) {
                warn!(path = %me.path.display(), last,
                    "leader epochs: entries newer than the wal's last record, rebuilt from it");
            }
            // Rebuild from the newest entry the records can confirm (epoch <= last).
            let from = me.entries.iter().rev().find(|(e, _)| *e <= last);
            let from = from.map_or(0, |(_, s)| *s).max(wal.first_lsn());
            me.entries = merge(&me.entries, scan_epochs(wal, from)?);
            dirty = true;
        }
        if dirty {
            write_file(me.storage.as_ref(), &me.path, &me.entries)?;
        }
        Ok(me)
    }

    /// Records that `epoch` starts at `start_lsn`, durably before returning. The latest epoch
    /// again is a no-op; otherwise `epoch` must be above the latest and `start_lsn` at or
    /// above its start (`Config`). An epoch starting where the latest did replaces it: that
    /// one has no records.
    pub fn assign(&mut self, epoch: u32, start_lsn: Lsn) -> Result<(), WalError> {
        let mut next = self.entries.clone();
        match self.latest() {
            Some((e, _)) if e == epoch => return Ok(()),
            Some((e, s)) if epoch < e || start_lsn < s => {
                return Err(WalError::Config(format!(
                "leader epoch {epoch} at lsn {start_lsn} does not follow epoch {e} at lsn {s} ({})",
                self.path.display()
            )))
            }
            Some((_, s)) if s == start_lsn => {
                next.pop();
            }
            _ => {}
        }
        next.push((epoch, start_lsn));
        write_file(self.storage.as_ref(), &self.path, &next)?;
        self.entries = next;
        Ok(())
    }

    /// Removes the entries starting at or after `lsn` (after the log was truncated there),
    /// durably when anything changed.
    pub fn truncate_from_end(&mut self, lsn: Lsn) -> Result<(), WalError> {
        let keep = self.entries.partition_point(|(_, s)| *s < lsn);
        if keep == self.entries.len() {
            return Ok(());
        }
        let next = self.entries[..keep].to_vec();
        write_file(self.storage.as_ref(), &self.path, &next)?;
        self.entries = next;
        Ok(())
    }

    /// The newest entry.
    pub fn latest(&self) -> Option<(u32, Lsn)> {
        self.entries.last().copied()
    }

    pub fn entries(&self) -> &[(u32, Lsn)] {
        &self.entries
    }

    /// Kafka's `endOffsetFor`: the largest epoch held at or below `epoch`, and where it ends:
    /// `log_end` for the latest epoch, else the start of the next entry. `None` when every
    /// epoch held is above `epoch`.
    pub fn end_offset_for(&self, epoch: u32, log_end: Lsn) -> Option<(u32, Lsn)> {
        let i = self.entries.partition_point(|(e, _)| *e <= epoch);
        let (held, _) = *self.entries.get(i.checked_sub(1)?)?;
        let end = self.entries.get(i).map_or(log_end, |(_, s)| *s);
        Some((held, end))
    }
}

/// Each epoch's first lsn among the records from `from` on. Epochs never go down in a log;
/// a record that does is corruption.
fn scan_epochs(wal: &Wal, from: Lsn) -> Result<Vec<(u32, Lsn)>, WalError> {
    let mut out: Vec<(u32, Lsn)> = Vec::new();
    for r in wal.replay(from) {
        let r = r?;
        match out.last() {
            Some((e, _)) if *e == r.epoch => {}
            Some((e, _)) if *e > r.epoch => {
                return Err(WalError::Corrupt {
                    segment: r.segment,
                    offset: r.offset,
                    lsn: r.lsn,
                    reason: format!("epoch {} after a record of epoch {e}", r.epoch),
                })
            }
            _ => out.push((r.epoch, r.lsn)),
        }
    }
    Ok(out)
}

/// `held` with the entries a scan found put in place of those of the same or later epochs;
/// an entry held for the scan's first epoch keeps its (earlier) start: its first records may
/// be retired, or below where the scan began.
fn merge(held: &[(u32, Lsn)], scanned: Vec<(u32, Lsn)>) -> Vec<(u32, Lsn)> {
    let Some(&(e0, s0)) = scanned.first() else {
        return held.to_vec();
    };
    let mut out: Vec<(u32, Lsn)> = held
        .iter()
        .copied()
        .filter(|(e, s)| *e < e0 && *s < s0)
        .collect();
    let start = held
        .iter()
        .find(|(e, s)| *e == e0 && *s <= s0)
        .map_or(s0, |(_, s)| *s);
    out.push((e0, start));
    out.extend(scanned.into_iter().skip(1));
    out
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> WalError {
    let path = path.to_path_buf();
    move |source| WalError::Io { op, path, source }
}

/// Reads and checks the file: a missing file and a damaged one are not errors (the caller
/// rebuilds), a failed read is.
fn load(storage: &dyn Storage, path: &Path) -> Result<Loaded, WalError> {
    let file = match storage.open(path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(io_err("open", path)(e)),
    };
    let len = file.len().map_err(io_err("stat", path))?;
    let len_max = (EPOCHS_HEADER_LEN + EPOCHS_CRC_LEN) as u64
        + EPOCH_ENTRY_LEN as u64 * u64::from(EPOCHS_ENTRIES_MAX);
    if len > len_max {
        return Ok(Loaded::Damaged(
            "file larger than EPOCHS_ENTRIES_MAX entries",
        ));
    }
    let bytes = read_all(file.as_ref()).map_err(io_err("read", path))?;
    Ok(match decode(&bytes) {
        Ok(e) => Loaded::Entries(e),
        Err(why) => Loaded::Damaged(why),
    })
}

/// The file's bytes for `entries`.
pub fn encode(entries: &[(u32, Lsn)]) -> Vec<u8> {
    let mut b =
        Vec::with_capacity(EPOCHS_HEADER_LEN + EPOCH_ENTRY_LEN * entries.len() + EPOCHS_CRC_LEN);
    b.push(EPOCHS_FORMAT_VERSION);
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (e, s) in entries {
        b.extend_from_slice(&e.to_le_bytes());
        b.extend_from_slice(&s.to_le_bytes());
    }
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The entries in a file's bytes, or why they are not to be trusted.
pub fn decode(b: &[u8]) -> Result<Vec<(u32, Lsn)>, &'static str> {
    let body_len = b
        .len()
        .checked_sub(EPOCHS_CRC_LEN)
        .filter(|n| *n >= EPOCHS_HEADER_LEN)
        .ok_or("file too short")?;
    let (body, crc) = b.split_at(body_len);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err("checksum mismatch");
    }
    if body[0] != EPOCHS_FORMAT_VERSION {
        return Err("unknown format version");
    }
    let count = u32::from_le_bytes([body[1], body[2], body[3], body[4]]);
    let entries = &body[EPOCHS_HEADER_LEN..];
    if count > EPOCHS_ENTRIES_MAX || entries.len() as u64 != u64::from(count) * 12 {
        return Err("entry count does not match the file's length");
    }
    let mut out: Vec<(u32, Lsn)> = Vec::with_capacity(count as usize);
    for c in entries.chunks_exact(EPOCH_ENTRY_LEN) {
        let mut e = [0u8; 4];
        e.copy_from_slice(&c[..4]);
        let mut s = [0u8; 8];
        s.copy_from_slice(&c[4..]);
        let (e, s) = (u32::from_le_bytes(e), u64::from_le_bytes(s));
        if out.last().is_some_and(|(pe, ps)| *pe >= e || *ps >= s) {
            return Err("entries not strictly increasing");
        }
        out.push((e, s));
    }
    Ok(out)
}

/// Replaces the file with `entries` ([`roost_storage::replace_file`]: a temporary beside it,
/// fdatasynced, renamed over it, the directory fsynced). A power loss at any point leaves the
/// old file or the new one.
fn write_file(storage: &dyn Storage, path: &Path, entries: &[(u32, Lsn)]) -> Result<(), WalError> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    replace_file(storage, &tmp, path, &encode(entries), OpenMode::CreateNew)?;
    Ok(())
}

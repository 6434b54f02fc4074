//! Opening a log (`Wal::open_with`): the segments listed, every record scanned and checked
//! with the recovery decision table (`recovery.rs`), a torn tail cut and synced, damage
//! below a vouched point refused as corruption.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};

use roost_storage::{preallocate, read_data, OpenMode, RealStorage, Storage, StorageFile};
use tracing::{info, warn};

use crate::cursor::Cursors;
use crate::format::{frame_len, PAYLOAD_BYTES_MAX_LIMIT};
use crate::log::{
    open_spare, parse_segment_name, segment_name, Active, Inner, RecoveryReport, Segment,
};
use crate::options::WalOptions;
use crate::recovery::{scan_segment, CorruptAt, Ending, SegmentScan};
use crate::{Lsn, Wal, WalError};

impl Wal {
    /// Makes `dir` (which must hold no segment) a log whose first record will be `first_lsn`:
    /// one empty, preallocated segment named for it, synced with its directory. For a
    /// standby re-seeded from a checkpoint: its WAL starts where the primary's checkpoint
    /// does.
    pub fn create_at(
        storage: &dyn Storage,
        dir: &Path,
        opts: &WalOptions,
        first_lsn: Lsn,
    ) -> Result<(), WalError> {
        let io = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| WalError::Io { op, path, source }
        };
        storage.create_dir_all(dir).map_err(io("create dir", dir))?;
        if !list_segments(storage, dir, false)?.is_empty() {
            return Err(WalError::Config(format!(
                "{} already holds segments: a log is created at lsn {first_lsn} only in an empty directory",
                dir.display()
            )));
        }
        let path = dir.join(segment_name(first_lsn.max(1)));
        preallocate(storage, &path, opts.next_segment_bytes(None, 0), false)
            .map_err(io("create segment", &path))?;
        storage.sync_dir(dir).map_err(io("sync dir", dir))
    }

    /// Opens (creating if needed) the log in `dir` on the real disk.
    pub fn open(dir: impl AsRef<Path>, opts: WalOptions) -> Result<Wal, WalError> {
        Wal::open_with(RealStorage::shared(), dir, opts)
    }

    /// Opens the log through a storage seam: scans and verifies every record, cuts a torn
    /// tail (and syncs the cut) before returning, refuses to open on corruption.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        dir: impl AsRef<Path>,
        opts: WalOptions,
    ) -> Result<Wal, WalError> {
        let dir = dir.as_ref().to_path_buf();
        check_options(&opts)?;
        if !opts.read_only {
            storage
                .create_dir_all(&dir)
                .map_err(|source| WalError::Io {
                    op: "create dir",
                    path: dir.clone(),
                    source,
                })?;
        }
        let mut segments = list_segments(storage.as_ref(), &dir, opts.read_only)?;
        if !opts.read_only {
            // The segments' names, like their bytes, may be in the cache only.
            storage.sync_dir(&dir).map_err(|source| WalError::Io {
                op: "sync dir at open",
                path: dir.clone(),
                source,
            })?;
        }
        let Recovered {
            report,
            next_lsn,
            active,
            last_epoch,
        } = recover_segments(storage.as_ref(), &mut segments, &opts)?;
        let spare = open_spare(
            storage.as_ref(),
            &dir,
            &opts,
            active.as_ref().map(|a| a.len),
        )?;
        let spare_short = spare.as_ref().is_some_and(|s| s.missing().is_some());
        let epoch = opts.epoch;
        info!(dir = %dir.display(), segments = report.segments, records = report.records,
            next_lsn, torn_bytes = report.torn_bytes_truncated, "wal: opened");
        Ok(Wal {
            storage,
            dir,
            opts,
            inner: Mutex::new(Inner {
                segments,
                active,
                next_lsn,
                written_lsn: next_lsn - 1,
                synced_lsn: next_lsn - 1,
                syncing: false,
                poisoned: None,
                spare,
                epoch,
                last_epoch,
            }),
            synced: Condvar::new(),
            cursor: Mutex::new(Cursors::default()),
            walked: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            appends: AtomicU64::new(0),
            append_bytes: AtomicU64::new(0),
            report,
            spare_short: AtomicBool::new(spare_short),
            synced_hook: std::sync::OnceLock::new(),
            written_hook: std::sync::OnceLock::new(),
        })
    }
}

/// Refuses options the format cannot honour, before anything is opened.
pub(crate) fn check_options(opts: &WalOptions) -> Result<(), WalError> {
    if opts.payload_bytes_max > PAYLOAD_BYTES_MAX_LIMIT {
        return Err(WalError::Config(format!(
            "payload_bytes_max {} over the format's limit {PAYLOAD_BYTES_MAX_LIMIT}",
            opts.payload_bytes_max
        )));
    }
    if opts.segment_bytes < frame_len(opts.payload_bytes_max as usize) as u64 {
        return Err(WalError::Config(format!(
            "segment_bytes {} cannot hold one payload of payload_bytes_max {}",
            opts.segment_bytes, opts.payload_bytes_max
        )));
    }
    Ok(())
}

/// The segment files in `dir`, oldest first (other names are ignored). A read-only open of a
/// missing directory finds none.
pub(crate) fn list_segments(
    storage: &dyn Storage,
    dir: &Path,
    read_only: bool,
) -> Result<Vec<Segment>, WalError> {
    let mut segments: Vec<Segment> = match storage.list(dir) {
        Ok(names) => names
            .iter()
            .filter_map(|n| {
                parse_segment_name(n).map(|first_lsn| Segment {
                    first_lsn,
                    path: dir.join(n),
                    bytes: 0, // known once recovery opens it
                })
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && read_only => Vec::new(),
        Err(source) => {
            return Err(WalError::Io {
                op: "list",
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    segments.sort_by_key(|s| s.first_lsn);
    Ok(segments)
}

/// What recovery of every segment found: the report, the lsn the next append gets, and the
/// newest segment open for appends (when writable).
pub(crate) struct Recovered {
    report: RecoveryReport,
    next_lsn: Lsn,
    active: Option<Active>,
    /// Epoch of the last record accepted (0 when none).
    last_epoch: u32,
}

/// Scans `segments` in order, checking that each starts where the previous one ended, and
/// notes each one's length.
pub(crate) fn recover_segments(
    storage: &dyn Storage,
    segments: &mut [Segment],
    opts: &WalOptions,
) -> Result<Recovered, WalError> {
    let mut report = RecoveryReport {
        segments: segments.len() as u64,
        ..RecoveryReport::default()
    };
    let mut next_lsn: Option<Lsn> = None;
    let mut active = None;
    let mut last_epoch = 0;
    let count = segments.len();
    for i in 0..count {
        let last = i + 1 == count;
        let next_first = segments.get(i + 1).map(|n| n.first_lsn);
        let seg = &mut segments[i];
        if let Some(expect) = next_lsn {
            if seg.first_lsn != expect {
                return Err(WalError::Corrupt {
                    segment: seg.path.clone(),
                    offset: 0,
                    lsn: expect,
                    reason: format!(
                        "segment starts at lsn {} but the previous one ended before lsn {expect}",
                        seg.first_lsn
                    ),
                });
            }
        }
        if !last && !opts.scan_sealed {
            // Sealed, and trusted whole: it ends where the next segment starts.
            report.first_lsn.get_or_insert(seg.first_lsn);
            next_lsn = next_first;
            seg.bytes = file_len(storage, &seg.path)?;
            continue;
        }
        let (file, scan, len) =
            recover_segment(storage, seg, last, opts, &mut report, &mut last_epoch)?;
        next_lsn = Some(scan.next_lsn);
        seg.bytes = len;
        if last && !opts.read_only {
            let file = Arc::from(file);
            active = Some(Active::new(file, seg.first_lsn, len, scan.valid_end));
        }
    }
    Ok(Recovered {
        report,
        next_lsn: next_lsn.unwrap_or(1),
        active,
        last_epoch,
    })
}

/// The length of the file at `path`.
pub(crate) fn file_len(storage: &dyn Storage, path: &Path) -> Result<u64, WalError> {
    let io = |op: &'static str| {
        let path = path.to_path_buf();
        move |source| WalError::Io { op, path, source }
    };
    let file = storage.open(path, OpenMode::Read).map_err(io("open"))?;
    file.len().map_err(io("length"))
}

/// Opens and scans one segment, adds what it holds to `report`, and (when writable) cuts its
/// torn tail. Returns the open file (read-write only for the newest segment of a writable
/// log), the scan and the segment's length.
pub(crate) fn recover_segment(
    storage: &dyn Storage,
    seg: &Segment,
    last: bool,
    opts: &WalOptions,
    report: &mut RecoveryReport,
    last_epoch: &mut u32,
) -> Result<(Box<dyn StorageFile>, SegmentScan, u64), WalError> {
    let io = |op: &'static str| {
        let path = seg.path.clone();
        move |source| WalError::Io { op, path, source }
    };
    let mode = if opts.read_only || !last {
        OpenMode::Read
    } else {
        OpenMode::ReadWrite
    };
    let file = storage.open(&seg.path, mode).map_err(io("open"))?;
    if !opts.read_only && last {
        // After a process crash the page cache still holds what was appended but never
        // synced: the scan below would read it as if it were on disk. Make it durable first,
        // so nothing is built on records a later power loss could take away. Only the newest
        // segment can hold such pages: a segment is sealed only once its sync succeeded (a
        // failed one poisons the log before the next segment exists).
        file.sync_data().map_err(io("sync at open"))?;
        // After a failed writeback (the process that saw it is gone) the cache may hold
        // pages the disk never got, marked clean: read what the disk holds instead.
        file.drop_cache().map_err(io("drop cache at open"))?;
    }
    // Only what the file system holds as data: a preallocated segment's unwritten rest reads
    // as zeros, so the scan ends there as it would at the first zeros of that rest.
    let len = file.len().map_err(io("length"))?;
    let bytes = read_data(file.as_ref()).map_err(io("read"))?;
    report.bytes_scanned += bytes.len() as u64;
    let scan = scan_segment(
        &bytes,
        seg.first_lsn,
        last,
        opts.payload_bytes_max,
        |_, h, _| {
            *last_epoch = h.epoch;
            Ok(())
        },
    )
    .map_err(|c| corrupt(&seg.path, c))?;
    if scan.records == 0 && !last {
        return Err(WalError::Corrupt {
            segment: seg.path.clone(),
            offset: 0,
            lsn: seg.first_lsn,
            reason: "sealed segment holds no records".into(),
        });
    }
    report.records += scan.records;
    if scan.records > 0 {
        report.first_lsn.get_or_insert(seg.first_lsn);
        report.last_lsn = Some(scan.next_lsn - 1);
    }
    if let Ending::TornTail { offset, reason } = scan.ending {
        report.torn_bytes_truncated = len - offset;
        report.torn_reason = Some(reason);
        if !opts.read_only {
            warn!(segment = %seg.path.display(), offset, reason, lsn = scan.next_lsn,
                "wal: cutting torn tail");
            cut_torn_tail(file.as_ref(), &seg.path, offset, len)?;
        }
    }
    Ok((file, scan, len))
}

/// Cuts `file` (a segment of `len` bytes) at `offset`, reserves the preallocated space again
/// as zeros (the segment keeps its length), and makes the cut durable before anything new is
/// appended after it.
pub(crate) fn cut_torn_tail(
    file: &dyn StorageFile,
    path: &Path,
    offset: u64,
    len: u64,
) -> Result<(), WalError> {
    let io = |op: &'static str| {
        let path = path.to_path_buf();
        move |source| WalError::Io { op, path, source }
    };
    file.set_len(offset).map_err(io("truncate"))?;
    file.allocate(len).map_err(io("allocate"))?;
    file.sync_data().map_err(io("sync"))
}

pub(crate) fn corrupt(path: &Path, c: CorruptAt) -> WalError {
    WalError::Corrupt {
        segment: path.to_path_buf(),
        offset: c.offset,
        lsn: c.lsn,
        reason: c.reason,
    }
}

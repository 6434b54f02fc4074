//! Reading ranges of records by lsn for a follower ([`Wal::read_from`]), and finding a
//! record's offset in its segment (shared with truncation). A follower streams: each call
//! starts where the previous one stopped, so the log keeps a [`Cursor`] (segment, offset,
//! lsn) per follower, at most [`crate::cursor::CURSORS_MAX`], and starts at the nearest one
//! that fits; otherwise it walks the segment's headers from its start (one header read per
//! record, no payloads). The records themselves are read in runs: one read of up to
//! [`READ_RUN_BYTES`], never past what was written, holds a follower's next records, so a
//! fetch costs one call to the disk, not two per record and a length lookup. This module only
//! reads; it never writes
//! a segment, and it reads only records below the log's next lsn, which are whole in the page
//! cache even while appends go on after them.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use roost_storage::{OpenMode, StorageFile};

use crate::cursor::{Cursor, Cursors};
use crate::format::{
    frame_len, probe, Probe, LEN_OFFSET, LSN_OFFSET, RECORD_HEADER_LEN, VERSION_OFFSET,
};
use crate::log::{read_frame, Segment, Wal};
use crate::{Lsn, Record, WalError};

/// A segment open for reading at a known position: record `lsn` starts at `offset`.
pub(crate) struct Position {
    pub(crate) file: Arc<dyn StorageFile>,
    pub(crate) path: PathBuf,
    pub(crate) offset: u64,
    pub(crate) lsn: Lsn,
}

impl Wal {
    pub(crate) fn lock_cursor(&self) -> MutexGuard<'_, Cursors> {
        // The cursors are hints: after a panic elsewhere, forget them.
        self.cursor.lock().unwrap_or_else(|p| {
            let mut g = p.into_inner();
            g.clear();
            g
        })
    }

    /// The records with lsn in `[from, until)`, oldest first: at least one when
    /// `from < until`, and no more once their payloads reach `max_bytes`. `until` beyond the
    /// log is the log's end. `Missing` when `from` was retired, is beyond the log's end, or
    /// is the log's end while `from < until`.
    pub fn read_from(
        &self,
        from: Lsn,
        until: Lsn,
        max_bytes: usize,
    ) -> Result<Vec<Record>, WalError> {
        let mut cur = self.lock_cursor();
        let (segs, end, active) = {
            let g = self.lock();
            let first = g.segments.first().map_or(g.next_lsn, |s| s.first_lsn);
            if from < first || from > g.next_lsn || (from < until && from == g.next_lsn) {
                return Err(WalError::Missing { lsn: from });
            }
            let i = g.segments.partition_point(|s| s.first_lsn <= from);
            let tail: Vec<Segment> = g.segments[i.saturating_sub(1)..].to_vec();
            let active = g.active.as_ref().map(|a| (a.first_lsn, a.write_offset));
            (tail, until.min(g.next_lsn), active)
        };
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut lsn = from;
        let mut last = None;
        for (i, seg) in segs.iter().enumerate() {
            if lsn >= end || (!out.is_empty() && bytes >= max_bytes) {
                break;
            }
            let seg_end = segs.get(i + 1).map_or(end, |s| s.first_lsn.min(end));
            // Where this segment's records are known to end: the write offset of the active
            // one (every record below `end` lies before it), else the file's length.
            let written = match active {
                Some((first, offset)) if first == seg.first_lsn => offset,
                _ => seg.bytes,
            };
            let mut pos = self.position(&mut cur, seg, lsn)?;
            let mut window = Window::default();
            while pos.lsn < seg_end && (out.is_empty() || bytes < max_bytes) {
                let r = self.next_record(&pos, &mut window, written)?;
                pos.offset += frame_len(r.payload.len()) as u64;
                pos.lsn += 1;
                bytes += r.payload.len();
                out.push(r);
            }
            lsn = pos.lsn;
            last = Some(Cursor {
                first_lsn: seg.first_lsn,
                path: pos.path,
                file: pos.file,
                offset: pos.offset,
                lsn: pos.lsn,
            });
        }
        // Only where this read stopped: a cursor at the end of a segment it read through
        // would take the place of another follower's.
        if let Some(c) = last {
            cur.put(c);
        }
        Ok(out)
    }

    /// The record at `pos`: from `window` when it holds the whole frame (read again, up to
    /// [`READ_RUN_BYTES`] and not past `written`, when it does not), else read on its own
    /// (`read_frame`: a frame larger than the window, or one that does not verify, which
    /// `read_frame` then names).
    fn next_record(
        &self,
        pos: &Position,
        window: &mut Window,
        written: u64,
    ) -> Result<Record, WalError> {
        let max = self.opts.payload_bytes_max;
        if let Some(r) = window.frame(pos, max) {
            return Ok(r);
        }
        // A window read here already, or a frame larger than any window, is read on its own.
        let larger = window.len_at(pos).is_some_and(|n| n > READ_RUN_BYTES);
        let read_here = window.at == pos.offset && !window.buf.is_empty();
        if !larger && !read_here {
            *window = Window::read(pos, written);
            if let Some(r) = window.frame(pos, max) {
                return Ok(r);
            }
        }
        read_frame(pos.file.as_ref(), &pos.path, pos.lsn, pos.offset, max)
    }

    /// Segment `seg` open at record `lsn` (which it holds, or which is its end): from the
    /// nearest cursor in this segment at or before `lsn`, else from the segment's start.
    pub(crate) fn position(
        &self,
        cur: &mut Cursors,
        seg: &Segment,
        lsn: Lsn,
    ) -> Result<Position, WalError> {
        let start = match cur.take_best(seg.first_lsn, lsn) {
            Some(c) => Position {
                file: c.file,
                path: c.path,
                offset: c.offset,
                lsn: c.lsn,
            },
            None => Position {
                file: self.open_segment(&seg.path)?,
                path: seg.path.clone(),
                offset: 0,
                lsn: seg.first_lsn,
            },
        };
        let from = start.lsn;
        let pos = skip_to(start, lsn, self.opts.payload_bytes_max)?;
        self.walked.fetch_add(pos.lsn - from, Ordering::Relaxed);
        Ok(pos)
    }

    /// Record headers walked so far to find where a read or a cut starts (none when each
    /// reader continues where it stopped).
    pub fn headers_walked(&self) -> u64 {
        self.walked.load(Ordering::Relaxed)
    }

    fn open_segment(&self, path: &Path) -> Result<Arc<dyn StorageFile>, WalError> {
        self.storage
            .open(path, OpenMode::Read)
            .map(Arc::from)
            .map_err(|source| WalError::Io {
                op: "open",
                path: path.to_path_buf(),
                source,
            })
    }
}

/// Bytes [`Wal::read_from`] reads at once: a follower's next records usually fit, so a read
/// takes one call where each record took two (its header, then its frame) and the walk to
/// it a length lookup (issue 42: six calls per batch on a leader with two standbys).
const READ_RUN_BYTES: usize = 64 << 10;

/// Bytes of one segment read in one call, from offset `at`.
#[derive(Default)]
struct Window {
    at: u64,
    buf: Vec<u8>,
}

impl Window {
    /// Up to [`READ_RUN_BYTES`] from `pos.offset`, not past `written`; empty if that is less
    /// than a header or the read fails (the record is then read on its own, and a failure
    /// reported there).
    fn read(pos: &Position, written: u64) -> Window {
        let want = (written.saturating_sub(pos.offset)).min(READ_RUN_BYTES as u64) as usize;
        let mut buf = vec![0u8; want];
        if want < RECORD_HEADER_LEN || pos.file.read_at(&mut buf, pos.offset).is_err() {
            buf.clear();
        }
        Window {
            at: pos.offset,
            buf,
        }
    }

    /// Where the frame at `pos` starts in the window, and its payload's length, if its header
    /// is here.
    fn header(&self, pos: &Position) -> Option<(usize, u32)> {
        let start = usize::try_from(pos.offset.checked_sub(self.at)?).ok()?;
        let head = self.buf.get(start..start.checked_add(RECORD_HEADER_LEN)?)?;
        let len = u32::from_le_bytes(head[LEN_OFFSET..LEN_OFFSET + 4].try_into().ok()?);
        Some((start, len))
    }

    /// The length of the frame at `pos` (header and payload), if its header is here.
    fn len_at(&self, pos: &Position) -> Option<usize> {
        self.header(pos)
            .map(|(_, len)| RECORD_HEADER_LEN.saturating_add(len as usize))
    }

    /// Record `pos.lsn` if its whole frame is here and verifies (checksum, version, lsn).
    fn frame(&self, pos: &Position, payload_bytes_max: u32) -> Option<Record> {
        let (start, len) = self.header(pos)?;
        if len > payload_bytes_max {
            return None;
        }
        let end = start + RECORD_HEADER_LEN + len as usize;
        let whole = self.buf.get(start..end)?;
        match probe(whole, payload_bytes_max) {
            Probe::Valid(h) if h.lsn == pos.lsn => Some(Record {
                lsn: pos.lsn,
                epoch: h.epoch,
                record_type: h.record_type,
                payload: whole[RECORD_HEADER_LEN..].to_vec(),
                segment: pos.path.clone(),
                offset: pos.offset,
            }),
            _ => None,
        }
    }
}

/// Bytes read at a time by the header walk: one read covers many small records' headers.
/// The first read is small (a walk from a cursor a few records back reads only what it
/// needs: a whole chunk there was 12 % of a loaded leader's samples, issue 42); each next
/// read doubles, up to the largest.
const WALK_FIRST_CHUNK_BYTES: usize = 8 << 10;
const WALK_CHUNK_BYTES: usize = 256 << 10;

/// Walks record headers from `pos` up to record `lsn`, reading the segment in chunks of
/// `WALK_FIRST_CHUNK_BYTES` doubling up to `WALK_CHUNK_BYTES`. Each header must carry the lsn expected there, a known version and a
/// length within the limit; the checksum is checked when the record itself is read.
fn skip_to(mut pos: Position, lsn: Lsn, payload_bytes_max: u32) -> Result<Position, WalError> {
    let io = |source| WalError::Io {
        op: "read",
        path: pos.path.clone(),
        source,
    };
    // Looked up only when a walk is needed (a reader that goes on from its cursor never
    // walks).
    let mut file_len = None;
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_at = 0u64;
    let mut chunk = WALK_FIRST_CHUNK_BYTES;
    while pos.lsn < lsn {
        let in_buf = pos.offset >= buf_at
            && pos.offset + RECORD_HEADER_LEN as u64 <= buf_at + buf.len() as u64;
        if !in_buf {
            let len = match file_len {
                Some(len) => len,
                None => *file_len.insert(pos.file.len().map_err(io)?),
            };
            let want = (len.saturating_sub(pos.offset) as usize).min(chunk);
            chunk = (chunk * 2).min(WALK_CHUNK_BYTES);
            buf.resize(want.max(RECORD_HEADER_LEN), 0);
            let io = |source| WalError::Io {
                op: "read",
                path: pos.path.clone(),
                source,
            };
            pos.file.read_at(&mut buf, pos.offset).map_err(io)?;
            buf_at = pos.offset;
        }
        let at = (pos.offset - buf_at) as usize;
        let head = &buf[at..at + RECORD_HEADER_LEN];
        let mut lsn_bytes = [0u8; 8];
        lsn_bytes.copy_from_slice(&head[LSN_OFFSET..LSN_OFFSET + 8]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&head[LEN_OFFSET..LEN_OFFSET + 4]);
        let len = u32::from_le_bytes(len);
        let reason = if u64::from_le_bytes(lsn_bytes) != pos.lsn || head[VERSION_OFFSET] == 0 {
            Some("no record with the expected lsn at this offset")
        } else if len > payload_bytes_max {
            Some("payload length over limit")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(WalError::Corrupt {
                segment: pos.path.clone(),
                offset: pos.offset,
                lsn: pos.lsn,
                reason: reason.into(),
            });
        }
        pos.offset += frame_len(len as usize) as u64;
        pos.lsn += 1;
    }
    Ok(pos)
}

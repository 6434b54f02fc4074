//! The shard's index file (`INDEX`, a "hint file" as Bitcask calls it): the index, the frame
//! list and the space accounting as they were when every frame up to a point was durable, so
//! an open reads this file and scans only the frames past that point. This module owns the
//! byte format (encode, decode and its checks), when the file is written (only when every
//! frame it covers is durable), and what an open checks before it trusts one. It never
//! writes a segment. A missing, old-version or damaged file is never an error: the open scans every
//! frame, as before the file existed. Format: docs/shard-format.md, "Index file".

use std::io;
use std::path::Path;

use roost_storage::{install, OpenMode, Storage};
use tracing::{debug, warn};

use crate::compact::{header_of, seq_of};
use crate::frame::COMPACT_HEADER_LEN;
use crate::{FrameMeta, Indexed, Loc, Shard, ShardError};

/// The file's name in the shard's directory, and its temporary while it is replaced.
pub const INDEX_FILE: &str = "INDEX";
pub const INDEX_TMP_FILE: &str = "INDEX.tmp";

pub const INDEX_MAGIC: [u8; 8] = *b"RSHIDX\0\0";
/// Bumped on any change of the layout below: a file of another version is rebuilt.
pub const INDEX_FORMAT_VERSION: u8 = 1;

pub const INDEX_HEADER_LEN: usize = 64;
pub const MAGIC_OFFSET: usize = 0;
pub const VERSION_OFFSET: usize = 8;
pub const SEGMENTS_OFFSET: usize = 12;
pub const FRAMES_OFFSET: usize = 16;
pub const ENTRIES_OFFSET: usize = 24;
pub const MAX_LSN_OFFSET: usize = 32;
pub const MAX_ID_OFFSET: usize = 40;
pub const COVER_OFFSET_OFFSET: usize = 48;
pub const BODY_CRC_OFFSET: usize = 56;
pub const HEADER_CRC_OFFSET: usize = 60;
/// One covered segment: seq u64, used u64, live u64, max_lsn u64, flags u64.
pub const SEG_ENTRY_LEN: usize = 40;
/// One frame: lsn u64, segment index u32, offset u32, len u32.
pub const FRAME_ENTRY_LEN: usize = 20;
/// One index entry: id u64, segment u32 (with `DEAD`, or `GONE`), offset u32, len u32.
pub const ID_ENTRY_LEN: usize = 20;
/// `flags` bit 0: the segment is a compacted one.
pub const SEG_FLAG_COMPACTED: u64 = 1;

const _: () = assert!(INDEX_HEADER_LEN == HEADER_CRC_OFFSET + 4);
const _: () = assert!(BODY_CRC_OFFSET + 4 == HEADER_CRC_OFFSET);

/// One covered segment as the file records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegEntry {
    pub(crate) seq: u64,
    pub(crate) used: u64,
    pub(crate) live: u64,
    pub(crate) max_lsn: u64,
    pub(crate) compacted: bool,
}

/// What an index file holds: segments `0..segs.len()` are covered, the last of them up to
/// `cover_offset` (its write offset then); every frame and index entry in them.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Covered {
    pub(crate) segs: Vec<SegEntry>,
    pub(crate) frames: Vec<FrameMeta>,
    pub(crate) ids: Vec<u64>,
    pub(crate) locs: Vec<Loc>,
    pub(crate) max_lsn: u64,
    pub(crate) max_id: u64,
    pub(crate) cover_offset: u64,
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Bytes of the body buffered before [`encode_into`] hands them on: the file is written in
/// pieces, never held whole in memory (at 100M records it is 2 GB).
const ENCODE_CHUNK_BYTES: usize = 1 << 20;

/// Hands the file's bytes for the state given (`ids` sorted, `locs` parallel to them) to
/// `emit` as (offset, bytes) pieces: the body in order, then the header at offset 0 (it
/// carries the body's crc). Returns the file's length.
pub(crate) fn encode_into(
    c: &CoveredRef<'_>,
    mut emit: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<u64> {
    let mut crc = crc32fast::Hasher::new();
    let mut at = INDEX_HEADER_LEN as u64;
    let mut buf = Vec::with_capacity(ENCODE_CHUNK_BYTES + SEG_ENTRY_LEN);
    let mut spill = |buf: &mut Vec<u8>, at: &mut u64, force: bool| -> io::Result<()> {
        if buf.len() >= ENCODE_CHUNK_BYTES || force && !buf.is_empty() {
            crc.update(buf);
            emit(*at, buf)?;
            *at += buf.len() as u64;
            buf.clear();
        }
        Ok(())
    };
    for s in c.segs {
        for v in [s.seq, s.used, s.live, s.max_lsn, u64::from(s.compacted)] {
            put_u64(&mut buf, v);
        }
        spill(&mut buf, &mut at, false)?;
    }
    for f in c.frames {
        put_u64(&mut buf, f.lsn);
        for v in [f.seg, f.offset, f.len] {
            put_u32(&mut buf, v);
        }
        spill(&mut buf, &mut at, false)?;
    }
    for (id, l) in c.ids.iter().zip(c.locs) {
        put_u64(&mut buf, *id);
        for v in [l.seg, l.offset, l.len] {
            put_u32(&mut buf, v);
        }
        spill(&mut buf, &mut at, false)?;
    }
    spill(&mut buf, &mut at, true)?;
    let header = header_bytes(c, crc.finalize());
    emit(0, &header)?;
    Ok(at)
}

fn header_bytes(c: &CoveredRef<'_>, body_crc: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(INDEX_HEADER_LEN);
    out.extend_from_slice(&INDEX_MAGIC);
    out.extend_from_slice(&[INDEX_FORMAT_VERSION, 0, 0, 0]);
    put_u32(&mut out, c.segs.len() as u32);
    put_u64(&mut out, c.frames.len() as u64);
    put_u64(&mut out, c.ids.len() as u64);
    put_u64(&mut out, c.max_lsn);
    put_u64(&mut out, c.max_id);
    put_u64(&mut out, c.cover_offset);
    put_u32(&mut out, body_crc);
    let header_crc = crc32fast::hash(&out);
    put_u32(&mut out, header_crc);
    out
}

/// The whole file in memory (tests).
#[cfg(test)]
fn encode(c: &CoveredRef<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let r = encode_into(c, |at, b| {
        let end = at as usize + b.len();
        if out.len() < end {
            out.resize(end, 0);
        }
        out[at as usize..end].copy_from_slice(b);
        Ok(())
    });
    assert!(r.is_ok(), "encoding into memory cannot fail");
    out
}

/// The state [`encode`] writes, borrowed from the shard.
pub(crate) struct CoveredRef<'a> {
    pub(crate) segs: &'a [SegEntry],
    pub(crate) frames: &'a [FrameMeta],
    pub(crate) ids: &'a [u64],
    pub(crate) locs: &'a [Loc],
    pub(crate) max_lsn: u64,
    pub(crate) max_id: u64,
    pub(crate) cover_offset: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Checks the header (`h`, the file's first bytes): magic, version, crc, and that the counts
/// add up to the file's length `len` (checked before anything is allocated for them).
/// Returns (segments, frames, entries).
fn check_header(h: &[u8], len: u64) -> Result<(usize, usize, usize), String> {
    if h.len() < INDEX_HEADER_LEN {
        return Err(format!("{len} bytes, shorter than its header"));
    }
    if h[MAGIC_OFFSET..MAGIC_OFFSET + 8] != INDEX_MAGIC {
        return Err("bad magic".into());
    }
    if h[VERSION_OFFSET] != INDEX_FORMAT_VERSION {
        return Err(format!(
            "format version {} (this binary writes {INDEX_FORMAT_VERSION})",
            h[VERSION_OFFSET]
        ));
    }
    if crc32fast::hash(&h[..HEADER_CRC_OFFSET]) != u32_at(h, HEADER_CRC_OFFSET) {
        return Err("header crc mismatch".into());
    }
    let segs = u32_at(h, SEGMENTS_OFFSET) as u64;
    let (frames, entries) = (u64_at(h, FRAMES_OFFSET), u64_at(h, ENTRIES_OFFSET));
    let want = (segs as u128) * SEG_ENTRY_LEN as u128
        + (frames as u128) * FRAME_ENTRY_LEN as u128
        + (entries as u128) * ID_ENTRY_LEN as u128
        + INDEX_HEADER_LEN as u128;
    if want != len as u128 {
        return Err(format!(
            "counts (segments {segs}, frames {frames}, entries {entries}) need {want} bytes, file has {len}"
        ));
    }
    Ok((segs as usize, frames as usize, entries as usize))
}

/// Reads the body in [`ENCODE_CHUNK_BYTES`] pieces, keeping its crc: the file is never
/// held whole in memory.
struct BodyReader<R> {
    read: R,
    /// File offset of `buf[0]`.
    at: u64,
    buf: Vec<u8>,
    pos: usize,
    end: u64,
    crc: crc32fast::Hasher,
}

impl<R: FnMut(u64, &mut [u8]) -> io::Result<()>> BodyReader<R> {
    /// The next `N` bytes (`N` divides every entry, and entries never straddle a refill
    /// because the refill keeps the unread rest).
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        if self.pos + N > self.buf.len() {
            self.refill(N)?;
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
    }

    fn refill(&mut self, need: usize) -> Result<(), String> {
        self.buf.drain(..self.pos);
        self.at += self.pos as u64;
        self.pos = 0;
        let have = self.at + self.buf.len() as u64;
        let n = (self.end - have).min(ENCODE_CHUNK_BYTES as u64) as usize;
        let old = self.buf.len();
        self.buf.resize(old + n, 0);
        (self.read)(have, &mut self.buf[old..]).map_err(|e| format!("read at {have}: {e}"))?;
        self.crc.update(&self.buf[old..]);
        if self.buf.len() < need {
            return Err(format!("ends at {} inside an entry", self.end));
        }
        Ok(())
    }

    /// The next whole entries of `len` bytes in the buffer (at least one, at most `max`),
    /// consumed.
    fn entries_ready(&mut self, len: usize, max: usize) -> Result<&[u8], String> {
        if self.pos + len > self.buf.len() {
            self.refill(len)?;
        }
        let n = ((self.buf.len() - self.pos) / len).min(max);
        let from = self.pos;
        self.pos += n * len;
        Ok(&self.buf[from..self.pos])
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.take::<4>().map(u32::from_le_bytes)
    }
}

/// Reads an index file of `len` bytes through `read` (offset, buffer), refusing anything
/// that does not check out: a wrong magic, version or crc, counts that do not match the
/// length, frames or ids out of order, a segment index past the covered segments. The
/// reason names what failed and where.
pub(crate) fn decode_from(
    len: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> Result<Covered, String> {
    let mut h = vec![0u8; (len as usize).min(INDEX_HEADER_LEN)];
    read(0, &mut h).map_err(|e| format!("read header: {e}"))?;
    let (nsegs, nframes, nentries) = check_header(&h, len)?;
    let mut c = Covered {
        max_lsn: u64_at(&h, MAX_LSN_OFFSET),
        max_id: u64_at(&h, MAX_ID_OFFSET),
        cover_offset: u64_at(&h, COVER_OFFSET_OFFSET),
        ..Covered::default()
    };
    let mut r = BodyReader {
        read,
        at: INDEX_HEADER_LEN as u64,
        buf: Vec::with_capacity(ENCODE_CHUNK_BYTES),
        pos: 0,
        end: len,
        crc: crc32fast::Hasher::new(),
    };
    for _ in 0..nsegs {
        let (seq, used, live, max_lsn, flags) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let compacted = flags & SEG_FLAG_COMPACTED != 0;
        c.segs.push(SegEntry {
            seq,
            used,
            live,
            max_lsn,
            compacted,
        });
    }
    decode_frames(&mut r, nframes, nsegs, &mut c)?;
    decode_entries(&mut r, nentries, nsegs, &mut c)?;
    if r.crc.finalize() != u32_at(&h, BODY_CRC_OFFSET) {
        return Err("body crc mismatch".into());
    }
    Ok(c)
}

fn decode_frames<R: FnMut(u64, &mut [u8]) -> io::Result<()>>(
    r: &mut BodyReader<R>,
    n: usize,
    nsegs: usize,
    c: &mut Covered,
) -> Result<(), String> {
    c.frames.reserve_exact(n);
    for i in 0..n {
        let f = FrameMeta {
            lsn: r.u64()?,
            seg: r.u32()?,
            offset: r.u32()?,
            len: r.u32()?,
        };
        let after_prev = c.frames.last().is_none_or(|p| p.lsn < f.lsn);
        if !after_prev || f.seg as usize >= nsegs || f.lsn > c.max_lsn {
            return Err(format!("frame {i} (lsn {}) out of order or range", f.lsn));
        }
        c.frames.push(f);
    }
    Ok(())
}

fn decode_entries<R: FnMut(u64, &mut [u8]) -> io::Result<()>>(
    r: &mut BodyReader<R>,
    n: usize,
    nsegs: usize,
    c: &mut Covered,
) -> Result<(), String> {
    c.ids.reserve_exact(n);
    c.locs.reserve_exact(n);
    let mut prev = None;
    let mut i = 0;
    while i < n {
        // A whole buffer of entries at a time (the open's hot loop: tens of millions).
        let here = r.entries_ready(ID_ENTRY_LEN, n - i)?;
        for e in here.chunks_exact(ID_ENTRY_LEN) {
            let id = u64_at(e, 0);
            let loc = Loc {
                seg: u32_at(e, 8),
                offset: u32_at(e, 12),
                len: u32_at(e, 16),
            };
            let after_prev = prev.is_none_or(|p| p < id);
            let seg_ok = loc.on_disk_seg().is_none_or(|s| s < nsegs);
            if !after_prev || !seg_ok || id > c.max_id {
                return Err(format!("entry {i} (id {id}) out of order or range"));
            }
            prev = Some(id);
            c.ids.push(id);
            c.locs.push(loc);
            i += 1;
        }
    }
    Ok(())
}

/// [`decode_from`] over bytes in memory (tests).
#[cfg(test)]
fn decode(b: &[u8]) -> Result<Covered, String> {
    decode_from(b.len() as u64, |at, buf| {
        let at = at as usize;
        buf.copy_from_slice(&b[at..at + buf.len()]);
        Ok(())
    })
}

/// Writes the file as `replace_file` does (a fresh temporary, written, fdatasynced, renamed
/// over `INDEX`, the directory fsynced), in pieces. Returns its length.
fn write_file(storage: &dyn Storage, dir: &Path, c: &CoveredRef<'_>) -> Result<u64, ShardError> {
    let (tmp, path) = (dir.join(INDEX_TMP_FILE), dir.join(INDEX_FILE));
    let at = |op: &'static str, p: &Path| {
        let path = p.to_path_buf();
        move |source| ShardError::Io { op, path, source }
    };
    match storage.remove(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(at("remove", &tmp)(e)),
        _ => {}
    }
    let file = storage
        .open(&tmp, OpenMode::CreateNew)
        .map_err(at("create index file", &tmp))?;
    let len =
        encode_into(c, |off, b| file.write_at(b, off)).map_err(at("write index file", &tmp))?;
    file.sync_data().map_err(at("sync index file", &tmp))?;
    drop(file);
    install(storage, &tmp, &path).map_err(|e| ShardError::Io {
        op: e.op,
        path: e.path,
        source: e.source,
    })?;
    Ok(len)
}

impl Shard {
    /// Whether a flush should rewrite the index file: frames and entries past it reach
    /// `index_tail_min` and half of what it covers.
    pub(crate) fn index_file_due(&self) -> bool {
        let (frames, entries) = self.indexed.map_or((0, 0), |i| (i.frames, i.entries));
        let tail =
            self.frames.len().saturating_sub(frames) + self.index.ids.len().saturating_sub(entries);
        let min = self.opts.index_tail_min.max((frames + entries) as u64 / 2);
        tail > 0 && tail as u64 >= min
    }

    /// Writes the index file for everything held, if anything is not covered yet: at a
    /// graceful close, or whenever the caller wants a reopen to scan nothing. Only when
    /// nothing is unflushed (every frame the file covers is durable); Ok(false) when it
    /// wrote nothing. A failure leaves the previous file or none (an atomic replace), never
    /// a damaged one that an open would trust; it does not poison the shard.
    pub fn write_index_file(&mut self) -> Result<bool, ShardError> {
        self.check_writable()?;
        let covered = self.indexed.is_some_and(|i| i.max_lsn == self.max_lsn);
        if !self.opts.index_file || self.unflushed() || self.segs.is_empty() || covered {
            return Ok(false);
        }
        let segs = self.seg_entries();
        let covered = CoveredRef {
            segs: &segs,
            frames: &self.frames,
            ids: &self.index.ids,
            locs: &self.index.locs,
            max_lsn: self.max_lsn,
            max_id: self.max_id,
            cover_offset: self.write_offset as u64,
        };
        let bytes = write_file(self.storage.as_ref(), &self.dir, &covered)?;
        self.indexed = Some(Indexed {
            frames: self.frames.len(),
            entries: self.index.ids.len(),
            max_lsn: self.max_lsn,
        });
        debug!(shard = %self.name, bytes, entries = self.index.ids.len(),
            max_lsn = self.max_lsn, "shard: index file written");
        Ok(true)
    }

    /// [`Shard::write_index_file`] where a failure only costs the next open a longer scan.
    pub(crate) fn write_index_file_logged(&mut self) {
        if let Err(e) = self.write_index_file() {
            warn!(shard = %self.name, error = %e, "shard: index file not written (the next open scans more)");
        }
    }

    fn seg_entries(&self) -> Vec<SegEntry> {
        let space = &self.compaction.space;
        (0..self.segs.len())
            .map(|si| {
                let (used, live, max_lsn) = space.figures(si);
                SegEntry {
                    seq: seq_of(&self.segs[si].path).unwrap_or(0),
                    used,
                    live,
                    max_lsn,
                    compacted: space.is_compacted(si),
                }
            })
            .collect()
    }

    /// Removes the index file, durably (before segments it names change places, or frames it
    /// covers are zeroed). A failure poisons the shard: the change must not go ahead.
    pub(crate) fn remove_index_file(&mut self) -> Result<(), ShardError> {
        self.indexed = None;
        let path = self.dir.join(INDEX_FILE);
        let r = match self.storage.remove(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            r => r.and_then(|()| self.storage.sync_dir(&self.dir)),
        };
        r.map_err(|source| {
            let e = ShardError::Io {
                op: "remove index file",
                path,
                source,
            };
            self.poisoned = Some(e.to_string());
            e
        })
    }

    /// Reads the index file and, if it checks out against the segments open, installs what it
    /// covers. Returns the segment to go on scanning from and the offset in it; `None` (the
    /// caller scans everything) when there is no file or it cannot be trusted, logged.
    pub(crate) fn load_index_file(&mut self) -> Option<(usize, usize)> {
        let path = self.dir.join(INDEX_FILE);
        let file = self.storage.open(&path, OpenMode::Read);
        let why = match file.and_then(|f| f.len().map(|len| (f, len))) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => format!("unreadable: {e}"),
            Ok((f, len)) => {
                let decoded = decode_from(len, |at, buf| f.read_at(buf, at));
                match decoded.and_then(|c| self.install(c)) {
                    Ok(at) => return Some(at),
                    Err(why) => why,
                }
            }
        };
        warn!(shard = %self.name, file = %path.display(), reason = %why,
            "shard: index file not used, scanning every frame");
        None
    }

    /// Checks a decoded file against the segments (same sequence numbers at the same
    /// positions, compacted exactly where it says, the cover inside the last one), then makes
    /// it the shard's index, frame list and space accounting.
    fn install(&mut self, c: Covered) -> Result<(usize, usize), String> {
        let n = c.segs.len();
        if n == 0 || n > self.segs.len() {
            return Err(format!("covers {n} segments, {} open", self.segs.len()));
        }
        let mut headers = Vec::with_capacity(n);
        for (si, e) in c.segs.iter().enumerate() {
            let seg = &self.segs[si];
            let h = header_of(seg).map_err(|e| e.to_string())?;
            let compacted_ok = match &h {
                Some(h) => {
                    e.compacted
                        && h.lsn_hi == e.max_lsn
                        && e.used == COMPACT_HEADER_LEN as u64 + h.content_len
                }
                None => !e.compacted,
            };
            if seq_of(&seg.path) != Some(e.seq) || !compacted_ok {
                return Err(format!(
                    "segment {} differs from the file's entry {si}",
                    seg.path.display()
                ));
            }
            headers.push(h);
        }
        let last = &self.segs[n - 1];
        if headers[n - 1].is_none() && c.cover_offset > last.len() as u64 {
            return Err(format!(
                "cover offset {} past the segment's end",
                c.cover_offset
            ));
        }
        for (si, (e, h)) in c.segs.iter().zip(headers).enumerate() {
            self.compaction
                .space
                .restore(si, (e.used, e.live, e.max_lsn), h);
        }
        self.indexed = Some(Indexed {
            frames: c.frames.len(),
            entries: c.ids.len(),
            max_lsn: c.max_lsn,
        });
        self.index.live = c.locs.iter().filter(|l| l.is_live()).count();
        self.index.gone = c.locs.iter().filter(|l| l.is_gone()).count();
        (self.index.ids, self.index.locs) = (c.ids, c.locs);
        self.frames = c.frames;
        (self.max_lsn, self.max_id) = (c.max_lsn, c.max_id);
        Ok((n - 1, c.cover_offset as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Covered {
        Covered {
            segs: vec![
                SegEntry {
                    seq: 1,
                    used: 4096,
                    live: 100,
                    max_lsn: 5,
                    compacted: true,
                },
                SegEntry {
                    seq: 3,
                    used: 64,
                    live: 48,
                    max_lsn: 9,
                    compacted: false,
                },
            ],
            frames: vec![FrameMeta {
                lsn: 9,
                seg: 1,
                offset: 0,
                len: 64,
            }],
            ids: vec![2, 7],
            locs: vec![
                Loc {
                    seg: 0,
                    offset: 112,
                    len: 10,
                },
                Loc {
                    seg: 1 | crate::DEAD,
                    offset: 1,
                    len: 12,
                },
            ],
            max_lsn: 9,
            max_id: 7,
            cover_offset: 64,
        }
    }

    fn bytes(c: &Covered) -> Vec<u8> {
        encode(&CoveredRef {
            segs: &c.segs,
            frames: &c.frames,
            ids: &c.ids,
            locs: &c.locs,
            max_lsn: c.max_lsn,
            max_id: c.max_id,
            cover_offset: c.cover_offset,
        })
    }

    #[test]
    fn round_trips_and_has_the_documented_length() {
        let c = sample();
        let b = bytes(&c);
        assert_eq!(b.len(), 64 + 2 * 40 + 20 + 2 * 20);
        assert_eq!(&b[..8], b"RSHIDX\0\0");
        assert_eq!(b[8], 1);
        assert_eq!(decode(&b), Ok(c));
    }

    /// Goal: any single damaged byte, a cut file or another version is refused, never read
    /// as an index. Method: flip each byte in turn, cut at each length, bump the version.
    #[test]
    fn refuses_every_damage() {
        let b = bytes(&sample());
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x20;
            assert!(decode(&d).is_err(), "byte {i} flipped was accepted");
        }
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "cut at {n} was accepted");
        }
        let mut v = b.clone();
        v[VERSION_OFFSET] = 2;
        let why = decode(&v).err().unwrap_or_default();
        assert!(why.contains("version 2"), "{why}");
    }

    #[test]
    fn refuses_ids_out_of_order_even_with_good_crcs() {
        let mut c = sample();
        c.ids = vec![7, 2];
        assert!(decode(&bytes(&c)).is_err());
        let mut c = sample();
        c.locs[0].seg = 2; // past the two covered segments
        assert!(decode(&bytes(&c)).is_err());
    }
}

//! A sealed segment's index file, `<seq>.idx` beside `<seq>.seg` (issue 44): what open would
//! otherwise rebuild by scanning the segment's frames, written once when the segment is sealed
//! (rolled past, flushed) and never changed. Its entries (id, offset, length) sorted by id and
//! its frames (lsn, offset, length) stay on disk in checksummed 4 KiB pages; memory holds only
//! each page's first id or lsn and checksum (a [`DiskRun`]), so a shard's memory and open time
//! no longer grow with the records it keeps. The segment stays the source of truth: an index
//! file that is missing, damaged, or does not match its segment (its length, its last frame)
//! is ignored and rebuilt from a scan. Format: docs/shard-format.md, "Index files".

pub(crate) mod dead;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use roost_storage::{replace_file, OpenMode, Storage, StorageFile};

use crate::frame::{u32_at, u64_at};
use crate::segment::Seg;

pub(crate) const INDEX_SUFFIX: &str = ".idx";
const MAGIC: [u8; 8] = *b"ROOSTIDX";
pub(crate) const INDEX_VERSION: u32 = 1;
pub(crate) const PAGE: usize = 4096;
const ENTRY: usize = 16;
pub(crate) const ENTRIES_PER_PAGE: usize = PAGE / ENTRY;
const DELETE: usize = 8;
const DELETES_PER_PAGE: usize = PAGE / DELETE;

/// An entry: where a create is in its segment. Dead-ness is not in the file (it changes): see
/// [`dead`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunEntry {
    pub(crate) id: u64,
    pub(crate) offset: u32,
    pub(crate) len: u32,
}

/// A transaction frame of the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunFrame {
    pub(crate) lsn: u64,
    pub(crate) offset: u32,
    pub(crate) len: u32,
}

/// What identifies the segment an index file describes, and its space figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RunHeader {
    /// 0: transaction frames; 1: a compacted segment.
    pub(crate) compacted: bool,
    pub(crate) seg_len: u64,
    /// The last transaction frame (offset, length, its stored checksum), or for a compacted
    /// segment (0, header length, checksum of the header's bytes).
    pub(crate) anchor_offset: u64,
    pub(crate) anchor_len: u32,
    pub(crate) anchor_crc: u32,
    pub(crate) entries: u64,
    pub(crate) frames: u64,
    pub(crate) deletes: u64,
    pub(crate) lsn_lo: u64,
    pub(crate) lsn_hi: u64,
    /// Largest create id in the segment's frames (deleted or not).
    pub(crate) max_id: u64,
    /// Bytes of frames (`SegSpace::used`).
    pub(crate) used: u64,
    /// Bytes a compaction keeps of the deletes whose create was in an earlier segment.
    pub(crate) far_delete_bytes: u64,
    /// The largest entry id (0 without entries).
    pub(crate) id_hi: u64,
    /// Bytes of all entries' ops, live or dead (`frame::op_bytes` each).
    pub(crate) entry_bytes: u64,
}

const H_FIELDS: usize = 14;

impl RunHeader {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(PAGE);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        b.extend_from_slice(&u32::from(self.compacted).to_le_bytes());
        for v in self.fields() {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.resize(PAGE - 4, 0);
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn fields(&self) -> [u64; H_FIELDS] {
        [
            self.seg_len,
            self.anchor_offset,
            u64::from(self.anchor_len) | u64::from(self.anchor_crc) << 32,
            self.entries,
            self.frames,
            self.deletes,
            self.lsn_lo,
            self.lsn_hi,
            self.max_id,
            self.used,
            self.far_delete_bytes,
            self.id_hi,
            self.entry_bytes,
            0,
        ]
    }

    fn decode(b: &[u8]) -> Result<RunHeader, &'static str> {
        if b.len() < PAGE || b[..8] != MAGIC {
            return Err("not an index file");
        }
        if u32_at(b, PAGE - 4) != crc32fast::hash(&b[..PAGE - 4]) {
            return Err("index header checksum mismatch");
        }
        if u32_at(b, 8) != INDEX_VERSION {
            return Err("unknown index file version");
        }
        let f = |i: usize| u64_at(b, 16 + 8 * i);
        Ok(RunHeader {
            compacted: u32_at(b, 12) == 1,
            seg_len: f(0),
            anchor_offset: f(1),
            anchor_len: f(2) as u32,
            anchor_crc: (f(2) >> 32) as u32,
            entries: f(3),
            frames: f(4),
            deletes: f(5),
            lsn_lo: f(6),
            lsn_hi: f(7),
            max_id: f(8),
            used: f(9),
            far_delete_bytes: f(10),
            id_hi: f(11),
            entry_bytes: f(12),
        })
    }
}

fn pages(n: u64, per: usize) -> u64 {
    n.div_ceil(per as u64)
}

/// Everything a sealed segment's index file holds, in memory (while writing it, or a segment
/// that could not be sealed).
pub(crate) struct RunContent<'a> {
    pub(crate) header: RunHeader,
    pub(crate) entries: &'a [RunEntry],
    pub(crate) frames: &'a [RunFrame],
    pub(crate) deletes: &'a [u64],
}

/// The index file's bytes: the header page, the entry pages, the frame pages, the delete
/// pages, then the directory (each entry page's first id and checksum, each frame page's
/// first lsn and checksum, each delete page's checksum) and the directory's checksum.
pub(crate) fn encode(c: &RunContent) -> Vec<u8> {
    let mut out = c.header.encode();
    let mut dir = Vec::new();
    put_pages(&mut out, &mut dir, c.entries, |e| (e.id, e.offset, e.len));
    put_pages(&mut out, &mut dir, c.frames, |f| (f.lsn, f.offset, f.len));
    for chunk in c.deletes.chunks(DELETES_PER_PAGE) {
        let page = page_of(chunk.iter().flat_map(|id| id.to_le_bytes()));
        dir.extend_from_slice(&crc32fast::hash(&page).to_le_bytes());
        out.extend_from_slice(&page);
    }
    let crc = crc32fast::hash(&dir);
    out.extend_from_slice(&dir);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Pages of 16-byte items (a u64 key, two u32s), each page's first key and checksum to `dir`.
fn put_pages<T>(
    out: &mut Vec<u8>,
    dir: &mut Vec<u8>,
    items: &[T],
    fields: impl Fn(&T) -> (u64, u32, u32),
) {
    for chunk in items.chunks(ENTRIES_PER_PAGE) {
        let page = page_of(chunk.iter().flat_map(|t| {
            let (key, a, b) = fields(t);
            let mut bytes = [0u8; ENTRY];
            bytes[..8].copy_from_slice(&key.to_le_bytes());
            bytes[8..12].copy_from_slice(&a.to_le_bytes());
            bytes[12..].copy_from_slice(&b.to_le_bytes());
            bytes
        }));
        dir.extend_from_slice(&fields(&chunk[0]).0.to_le_bytes());
        dir.extend_from_slice(&crc32fast::hash(&page).to_le_bytes());
        out.extend_from_slice(&page);
    }
}

fn page_of(bytes: impl Iterator<Item = u8>) -> Vec<u8> {
    let mut p: Vec<u8> = bytes.collect();
    p.resize(PAGE, 0);
    p
}

/// The index file of segment `seg_path`.
pub(crate) fn index_path(seg_path: &Path) -> PathBuf {
    seg_path.with_extension(&INDEX_SUFFIX[1..])
}

/// Writes the index file of `seg_path` (a temporary, fdatasync, rename, directory fsync).
pub(crate) fn write(storage: &dyn Storage, seg_path: &Path, c: &RunContent) -> io::Result<()> {
    let path = index_path(seg_path);
    let tmp = path.with_extension("idx.tmp");
    replace_file(storage, &tmp, &path, &encode(c), OpenMode::CreateNew).map_err(|e| e.source)
}

/// A sealed segment's index, on disk: in memory only each page's first key and checksum.
pub(crate) struct DiskRun {
    storage: Arc<dyn Storage>,
    pub(crate) path: PathBuf,
    pub(crate) header: RunHeader,
    /// The checksum of the header page: names this very file in the `dead` file.
    pub(crate) ident: u32,
    entry_fence: Vec<u64>,
    frame_fence: Vec<u64>,
    crcs: Vec<u32>,
    /// The last page read (page number, bytes): sequential lookups read each page once.
    last: Mutex<Option<(u64, Box<[u8]>)>>,
}

impl std::fmt::Debug for DiskRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskRun").field("path", &self.path).finish()
    }
}

/// Why an index file was not used.
pub(crate) type Refusal = String;

impl DiskRun {
    /// Opens the index file of `seg` and checks it against the segment. `Ok(None)` when there
    /// is none; `Err` (a reason) when it does not match: the caller scans instead.
    pub(crate) fn open(storage: &Arc<dyn Storage>, seg: &Seg) -> Result<Option<DiskRun>, Refusal> {
        let path = index_path(&seg.path);
        let file = match storage.open(&path, OpenMode::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("open: {e}")),
        };
        let mut head = vec![0u8; PAGE];
        file.read_at(&mut head, 0)
            .map_err(|e| format!("read header: {e}"))?;
        let header = RunHeader::decode(&head)?;
        check_anchor(storage.as_ref(), seg, &header)?;
        let mut run = DiskRun::with_directory(path, header, file.as_ref())?;
        run.ident = u32_at(&head, PAGE - 4);
        run.storage = storage.clone();
        Ok(Some(run))
    }

    fn with_directory(
        path: PathBuf,
        header: RunHeader,
        file: &dyn StorageFile,
    ) -> Result<DiskRun, Refusal> {
        let (ep, fp) = (
            pages(header.entries, ENTRIES_PER_PAGE),
            pages(header.frames, ENTRIES_PER_PAGE),
        );
        let dp = pages(header.deletes, DELETES_PER_PAGE);
        let len = file.len().map_err(|e| format!("stat: {e}"))?;
        // Counts from a damaged header may be anything: no product may wrap, and nothing is
        // allocated before the file's length agrees with them.
        let sizes = (|| {
            let dir_at = (1 + ep)
                .checked_add(fp)?
                .checked_add(dp)?
                .checked_mul(PAGE as u64)?;
            let dir_len = (ep + fp).checked_mul(12)?.checked_add(dp.checked_mul(4)?)?;
            Some((
                dir_at,
                dir_len,
                dir_at.checked_add(dir_len)?.checked_add(4)?,
            ))
        })();
        let (dir_at, dir_len) = match sizes {
            Some((at, dl, total)) if total == len => (at, dl as usize),
            _ => return Err(format!("length {len} differs from what its header counts")),
        };
        let mut dir = vec![0u8; dir_len + 4];
        file.read_at(&mut dir, dir_at)
            .map_err(|e| format!("read directory: {e}"))?;
        if u32_at(&dir, dir_len) != crc32fast::hash(&dir[..dir_len]) {
            return Err("directory checksum mismatch".to_owned());
        }
        let mut run = DiskRun {
            storage: roost_storage::RealStorage::shared(),
            path,
            header,
            ident: 0,
            entry_fence: Vec::with_capacity(ep as usize),
            frame_fence: Vec::with_capacity(fp as usize),
            crcs: Vec::with_capacity((ep + fp + dp) as usize),
            last: Mutex::new(None),
        };
        for (i, rec) in dir[..((ep + fp) * 12) as usize].chunks(12).enumerate() {
            let fence = if (i as u64) < ep {
                &mut run.entry_fence
            } else {
                &mut run.frame_fence
            };
            fence.push(u64_at(rec, 0));
            run.crcs.push(u32_at(rec, 8));
        }
        let tail = &dir[((ep + fp) * 12) as usize..dir_len];
        run.crcs.extend(tail.chunks(4).map(|c| u32_at(c, 0)));
        Ok(run)
    }

    /// Bytes this run keeps in memory.
    pub(crate) fn bytes(&self) -> usize {
        let cached = roost_storage::lock(&self.last).as_ref().map_or(0, |_| PAGE);
        (self.entry_fence.len() + self.frame_fence.len()) * 8 + self.crcs.len() * 4 + cached
    }

    fn read_page(&self, page: u64) -> io::Result<Box<[u8]>> {
        let mut last = roost_storage::lock(&self.last);
        if let Some((p, bytes)) = last.as_ref() {
            if *p == page {
                return Ok(bytes.clone());
            }
        }
        let at_path = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("index file {} page {page}: {e}", self.path.display()),
            )
        };
        let file = self
            .storage
            .open(&self.path, OpenMode::Read)
            .map_err(at_path)?;
        let mut buf = vec![0u8; PAGE].into_boxed_slice();
        file.read_at(&mut buf, (1 + page) * PAGE as u64)
            .map_err(at_path)?;
        if self.crcs.get(page as usize) != Some(&crc32fast::hash(&buf)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "index file {} page {page} checksum mismatch",
                    self.path.display()
                ),
            ));
        }
        *last = Some((page, buf.clone()));
        Ok(buf)
    }

    /// The entry of `id` and its rank (position in id order), if this run has it.
    pub(crate) fn find(&self, id: u64) -> io::Result<Option<(usize, RunEntry)>> {
        let p = match self.entry_fence.binary_search(&id) {
            Ok(p) => p,
            Err(0) => return Ok(None),
            Err(p) => p - 1,
        };
        let page = self.read_page(p as u64)?;
        let (mut lo, mut hi) = (0, entries_on(self.header.entries, p));
        while lo < hi {
            let mid = (lo + hi) / 2;
            match u64_at(&page, mid * ENTRY).cmp(&id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => {
                    return Ok(Some((p * ENTRIES_PER_PAGE + mid, entry_at(&page, mid))))
                }
            }
        }
        Ok(None)
    }

    /// Every entry in id order, `f` called with its rank.
    pub(crate) fn for_each_entry(
        &self,
        mut f: impl FnMut(usize, RunEntry) -> io::Result<()>,
    ) -> io::Result<()> {
        for p in 0..self.entry_fence.len() {
            let page = self.read_page(p as u64)?;
            for i in 0..entries_on(self.header.entries, p) {
                f(p * ENTRIES_PER_PAGE + i, entry_at(&page, i))?;
            }
        }
        Ok(())
    }

    /// The frame of `lsn`, if this run has it.
    pub(crate) fn frame(&self, lsn: u64) -> io::Result<Option<RunFrame>> {
        let p = match self.frame_fence.binary_search(&lsn) {
            Ok(p) => p,
            Err(0) => return Ok(None),
            Err(p) => p - 1,
        };
        let page = self.read_page((self.entry_fence.len() + p) as u64)?;
        let n = entries_on(self.header.frames, p);
        Ok((0..n).map(|i| frame_at(&page, i)).find(|f| f.lsn == lsn))
    }

    /// Every frame in lsn order.
    pub(crate) fn frames(&self) -> io::Result<Vec<RunFrame>> {
        let first = self.entry_fence.len();
        let mut out = Vec::with_capacity(self.header.frames as usize);
        for p in 0..self.frame_fence.len() {
            let page = self.read_page((first + p) as u64)?;
            out.extend((0..entries_on(self.header.frames, p)).map(|i| frame_at(&page, i)));
        }
        Ok(out)
    }

    /// Every delete op's id, in frame order.
    pub(crate) fn deletes(&self) -> io::Result<Vec<u64>> {
        let first = self.entry_fence.len() + self.frame_fence.len();
        let n = self.header.deletes as usize;
        let mut out = Vec::with_capacity(n);
        for p in 0..pages(self.header.deletes, DELETES_PER_PAGE) as usize {
            let page = self.read_page((first + p) as u64)?;
            let k = (n - p * DELETES_PER_PAGE).min(DELETES_PER_PAGE);
            out.extend((0..k).map(|i| u64_at(&page, i * DELETE)));
        }
        Ok(out)
    }

    /// The smallest and largest entry ids (`None` when it has no entries).
    pub(crate) fn id_range(&self) -> Option<(u64, u64)> {
        Some((*self.entry_fence.first()?, self.header.id_hi))
    }
}

fn entries_on(total: u64, page: usize) -> usize {
    (total as usize - page * ENTRIES_PER_PAGE).min(ENTRIES_PER_PAGE)
}

/// The `i`-th 16-byte item of a page: its key and two u32s.
fn item_at(page: &[u8], i: usize) -> (u64, u32, u32) {
    let at = i * ENTRY;
    (
        u64_at(page, at),
        u32_at(page, at + 8),
        u32_at(page, at + 12),
    )
}

fn entry_at(page: &[u8], i: usize) -> RunEntry {
    let (id, offset, len) = item_at(page, i);
    RunEntry { id, offset, len }
}

fn frame_at(page: &[u8], i: usize) -> RunFrame {
    let (lsn, offset, len) = item_at(page, i);
    RunFrame { lsn, offset, len }
}

/// The segment must be the one the index describes: the same length, and (for frames) the
/// frame at the anchor verifies with the stored checksum and the last lsn; (compacted) its
/// header's bytes hash to the anchor.
fn check_anchor(storage: &dyn Storage, seg: &Seg, h: &RunHeader) -> Result<(), Refusal> {
    if seg.len() as u64 != h.seg_len {
        return Err(format!(
            "its segment is {} bytes, the index says {}",
            seg.len(),
            h.seg_len
        ));
    }
    let bytes = seg
        .read_cold(storage, h.anchor_offset as usize, h.anchor_len as usize)
        .map_err(|e| format!("read anchor: {e}"))?;
    if h.compacted {
        return (crc32fast::hash(&bytes) == h.anchor_crc)
            .then_some(())
            .ok_or_else(|| "the compacted segment's header changed".to_owned());
    }
    match crate::frame::probe(&bytes).1 {
        Ok(v) if v.lsn == h.lsn_hi && u32_at(&bytes, 0) == h.anchor_crc => Ok(()),
        Ok(_) => Err("the segment's last frame differs".to_owned()),
        Err(why) => Err(format!("the segment's last frame does not verify: {why}")),
    }
}

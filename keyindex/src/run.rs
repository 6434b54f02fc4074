//! One sorted run: a file of `(hash, table lsn, offset)` entries sorted by hash, with its
//! filter and one fence per block of entries. Written once (a temporary, synced, renamed,
//! the directory synced) and never changed; merged into a new run or removed whole.
//!
//! ```text
//! offset 0          HEADER (HEADER_LEN bytes, CRC-32 in its last 4)
//! HEADER_LEN        entries, ENTRY_LEN each, in blocks of BLOCK_ENTRIES (the last may be short)
//! filter_off        filter: filter_blocks x FILTER_BLOCK_BYTES
//! fences_off        per entry block: first hash (u64), CRC-32 of the block (u32)
//! end - 4           CRC-32 of filter and fences
//! ```
//!
//! Open reads the header, the filter and the fences (memory: the filter, 12 bytes a block);
//! a lookup reads the one or two blocks its hash can be in and checks their CRC.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use roost_storage::{OpenMode, Storage, StorageFile};

use crate::filter::{Filter, FILTER_BLOCK_BYTES, PROBES_MAX};
use crate::{IndexError, RunMeta};

pub const MAGIC: [u8; 8] = *b"RKEYIDX\0";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 96;
pub const ENTRY_LEN: usize = 24;
pub const BLOCK_ENTRIES: usize = 128;
pub const BLOCK_BYTES: usize = BLOCK_ENTRIES * ENTRY_LEN;
pub const FENCE_LEN: usize = 12;
const _: () = assert!(HEADER_LEN == 96 && ENTRY_LEN == 24 && BLOCK_BYTES == 3072);

/// One entry: the key's hash, and where the key table holds its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub hash: u64,
    pub table_lsn: u64,
    pub offset: u64,
}

impl Entry {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.hash.to_le_bytes());
        out.extend_from_slice(&self.table_lsn.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Entry {
        Entry {
            hash: le64(b, 0),
            table_lsn: le64(b, 8),
            offset: le64(b, 16),
        }
    }
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// The header's fields (see the module's diagram).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub count: u64,
    pub filter_k: u32,
    pub filter_blocks: u64,
    pub seed_check: u64,
    pub meta: RunMeta,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = Vec::with_capacity(HEADER_LEN);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.filter_k.to_le_bytes());
        let m = &self.meta;
        for v in [
            self.count,
            m.first_table_lsn,
            m.last_table_lsn,
            m.min_at_ms,
            m.max_at_ms,
            m.max_batch_lsn,
            self.filter_blocks,
            self.seed_check,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.resize(HEADER_LEN - 4, 0);
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(&b);
        out
    }

    fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        if b[..8] != MAGIC {
            return Err("not a key index run (bad magic)".into());
        }
        if crc32fast::hash(&b[..HEADER_LEN - 4]) != le32(b, HEADER_LEN - 4) {
            return Err("header checksum mismatch".into());
        }
        let version = le32(b, 8);
        if version != VERSION {
            return Err(format!(
                "run format version {version}, this build reads {VERSION}"
            ));
        }
        let f = |i: usize| le64(b, 16 + 8 * i);
        let h = Header {
            count: f(0),
            filter_k: le32(b, 12),
            filter_blocks: f(6),
            seed_check: f(7),
            meta: RunMeta {
                first_table_lsn: f(1),
                last_table_lsn: f(2),
                min_at_ms: f(3),
                max_at_ms: f(4),
                max_batch_lsn: f(5),
            },
        };
        // The header's CRC holds, but its counts size what open reads and each lookup's
        // work, so they are checked before use: counts whose file length overflows (a
        // forged count wrapped it, and the tail read allocated for the wrapped size), and
        // a probe count no writer makes (a forged one made every lookup spin).
        if !(1..=PROBES_MAX).contains(&h.filter_k) {
            let k = h.filter_k;
            return Err(format!("filter probes {k}, outside 1..={PROBES_MAX}"));
        }
        if h.checked_file_len().is_none() {
            return Err(format!(
                "{} entries and {} filter blocks overflow a file length",
                h.count, h.filter_blocks
            ));
        }
        Ok(h)
    }

    fn blocks(&self) -> u64 {
        self.count.div_ceil(BLOCK_ENTRIES as u64)
    }

    fn filter_off(&self) -> u64 {
        HEADER_LEN as u64 + self.count * ENTRY_LEN as u64
    }

    /// The file length the counts give, `None` if it overflows.
    fn checked_file_len(&self) -> Option<u64> {
        let entries = self.count.checked_mul(ENTRY_LEN as u64)?;
        let filter = self.filter_blocks.checked_mul(FILTER_BLOCK_BYTES as u64)?;
        let fences = self.blocks().checked_mul(FENCE_LEN as u64)?;
        (HEADER_LEN as u64 + 4)
            .checked_add(entries)?
            .checked_add(filter)?
            .checked_add(fences)
    }

    /// The file length; counts that overflow it were refused at decode.
    fn file_len(&self) -> u64 {
        self.checked_file_len().unwrap_or(u64::MAX)
    }
}

/// An open run: its file, header, filter and fences.
#[derive(Debug)]
pub struct Run {
    pub path: PathBuf,
    pub header: Header,
    file: Box<dyn StorageFile>,
    filter: Filter,
    /// Per block: (first hash, CRC-32 of the block).
    fences: Vec<Fence>,
}

impl Run {
    /// Opens and checks a run: magic, version, header CRC, length, the CRC of filter and
    /// fences, and that it was sorted under this index's seed.
    pub fn open(storage: &dyn Storage, path: &Path, seed_check: u64) -> Result<Run, IndexError> {
        let file = storage
            .open(path, OpenMode::Read)
            .map_err(IndexError::io("open", path))?;
        let corrupt = |offset: u64, reason: String| IndexError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        let mut hb = [0u8; HEADER_LEN];
        file.read_at(&mut hb, 0).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => corrupt(0, format!("short header: {e}")),
            _ => IndexError::io("read", path)(e),
        })?;
        let header = Header::decode(&hb).map_err(|r| corrupt(0, r))?;
        let len = file.len().map_err(IndexError::io("stat", path))?;
        if len != header.file_len() {
            let want = header.file_len();
            return Err(corrupt(0, format!("{len} bytes, the header says {want}")));
        }
        if header.seed_check != seed_check {
            return Err(corrupt(0, "sorted under another index seed".into()));
        }
        let (filter, fences) = read_tail(file.as_ref(), &header).map_err(|(o, r)| corrupt(o, r))?;
        Ok(Run {
            path: path.to_path_buf(),
            header,
            file,
            filter,
            fences,
        })
    }

    pub fn filter_bytes(&self) -> u64 {
        self.filter.bytes()
    }

    pub fn fence_bytes(&self) -> u64 {
        (self.fences.len() * FENCE_LEN) as u64
    }

    /// The run file's length in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.header.file_len()
    }

    pub fn meta(&self) -> &RunMeta {
        &self.header.meta
    }

    pub fn count(&self) -> u64 {
        self.header.count
    }

    /// Whether the filter rules `hash` out (no disk read).
    pub fn may_contain(&self, hash: u64) -> bool {
        self.filter.may_contain(hash)
    }

    /// Every entry with this hash, in table lsn order: the blocks it can be in, read and
    /// checked. Equal hashes may straddle a block boundary, so the scan starts one block
    /// before the first whose fence reaches the hash.
    pub fn find(&self, hash: u64, out: &mut Vec<Entry>) -> Result<(), IndexError> {
        let first = self
            .fences
            .partition_point(|f| f.0 < hash)
            .saturating_sub(1);
        for b in first..self.fences.len() {
            if self.fences[b].0 > hash {
                break;
            }
            for e in self.block(b)? {
                if e.hash == hash {
                    out.push(e);
                }
            }
        }
        Ok(())
    }

    /// Block `b`'s entries, checked against its fence's CRC.
    pub fn block(&self, b: usize) -> Result<Vec<Entry>, IndexError> {
        let n = (self.header.count as usize - b * BLOCK_ENTRIES).min(BLOCK_ENTRIES);
        let off = HEADER_LEN as u64 + (b * BLOCK_BYTES) as u64;
        let mut buf = vec![0u8; n * ENTRY_LEN];
        self.file
            .read_at(&mut buf, off)
            .map_err(IndexError::io("read", &self.path))?;
        let (first, crc) = self.fences[b];
        if crc32fast::hash(&buf) != crc || le64(&buf, 0) != first {
            return Err(IndexError::Corrupt {
                path: self.path.clone(),
                offset: off,
                reason: format!("entry block {b} fails its checksum"),
            });
        }
        Ok(buf.chunks_exact(ENTRY_LEN).map(Entry::decode).collect())
    }

    pub fn blocks(&self) -> usize {
        self.fences.len()
    }
}

/// A block's first hash and the CRC-32 of its bytes.
type Fence = (u64, u32);

/// The filter and fences, checked against the trailing CRC. Errors carry (offset, reason).
fn read_tail(file: &dyn StorageFile, h: &Header) -> Result<(Filter, Vec<Fence>), (u64, String)> {
    let off = h.filter_off();
    let filter_len = (h.filter_blocks * FILTER_BLOCK_BYTES as u64) as usize;
    let tail_len = filter_len + h.blocks() as usize * FENCE_LEN;
    let mut buf = vec![0u8; tail_len + 4];
    file.read_at(&mut buf, off)
        .map_err(|e| (off, format!("short filter or fences: {e}")))?;
    if crc32fast::hash(&buf[..tail_len]) != le32(&buf, tail_len) {
        return Err((off, "filter or fences fail their checksum".into()));
    }
    let filter = Filter::from_bytes(&buf[..filter_len], h.filter_k);
    let fences = buf[filter_len..tail_len]
        .chunks_exact(FENCE_LEN)
        .map(|c| (le64(c, 0), le32(c, 8)))
        .collect();
    Ok((filter, fences))
}

/// Writes a run from entries given in sorted order, one block at a time: memory is the
/// filter, the fences and one block, whatever the run's size.
pub struct RunWriter {
    path: PathBuf,
    file: Box<dyn StorageFile>,
    header: Header,
    filter: Filter,
    fences: Vec<Fence>,
    block: Vec<u8>,
    written: u64,
    last: Option<Entry>,
}

impl RunWriter {
    /// A writer for a run of exactly `count` entries at `path` (created new).
    pub fn create(
        storage: &dyn Storage,
        path: &Path,
        header: Header,
    ) -> Result<RunWriter, IndexError> {
        let file = storage
            .open(path, OpenMode::CreateNew)
            .map_err(IndexError::io("create", path))?;
        let filter = Filter::new(header.filter_blocks, header.filter_k);
        Ok(RunWriter {
            path: path.to_path_buf(),
            file,
            header,
            filter,
            fences: Vec::new(),
            block: Vec::with_capacity(BLOCK_BYTES),
            written: 0,
            last: None,
        })
    }

    pub fn push(&mut self, e: Entry) -> Result<(), IndexError> {
        if self.last.is_some_and(|l| l > e) || self.written + self.pending() >= self.header.count {
            return Err(IndexError::Invalid(format!(
                "run {}: entries out of order or past its count",
                self.path.display()
            )));
        }
        self.last = Some(e);
        self.filter.insert(e.hash);
        e.encode(&mut self.block);
        if self.block.len() == BLOCK_BYTES {
            self.flush_block()?;
        }
        Ok(())
    }

    fn pending(&self) -> u64 {
        (self.block.len() / ENTRY_LEN) as u64
    }

    fn flush_block(&mut self) -> Result<(), IndexError> {
        if self.block.is_empty() {
            return Ok(());
        }
        let off = HEADER_LEN as u64 + self.written * ENTRY_LEN as u64;
        self.file
            .write_at(&self.block, off)
            .map_err(IndexError::io("write", &self.path))?;
        self.fences
            .push((le64(&self.block, 0), crc32fast::hash(&self.block)));
        self.written += self.pending();
        self.block.clear();
        Ok(())
    }

    /// Writes the filter, fences and header, then syncs the file. The caller renames it
    /// into place and syncs the directory.
    pub fn finish(mut self) -> Result<(), IndexError> {
        self.flush_block()?;
        if self.written != self.header.count {
            return Err(IndexError::Invalid(format!(
                "run {}: {} entries written, {} promised",
                self.path.display(),
                self.written,
                self.header.count
            )));
        }
        let mut tail = self.filter.to_bytes();
        for (h, c) in &self.fences {
            tail.extend_from_slice(&h.to_le_bytes());
            tail.extend_from_slice(&c.to_le_bytes());
        }
        let crc = crc32fast::hash(&tail);
        tail.extend_from_slice(&crc.to_le_bytes());
        let io = |op| IndexError::io(op, &self.path);
        self.file
            .write_at(&tail, self.header.filter_off())
            .map_err(io("write"))?;
        self.file
            .write_at(&self.header.encode(), 0)
            .map_err(io("write"))?;
        self.file.sync_data().map_err(io("fdatasync"))
    }
}

/// Reads every entry of a run in order, a block at a time (merges and `verify`).
pub fn entries(run: &Arc<Run>) -> impl Iterator<Item = Result<Entry, IndexError>> + '_ {
    (0..run.blocks()).flat_map(move |b| match run.block(b) {
        Ok(v) => v.into_iter().map(Ok).collect::<Vec<_>>(),
        Err(e) => vec![Err(e)],
    })
}

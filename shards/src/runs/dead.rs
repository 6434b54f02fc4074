//! The shard's `dead` file: which entries of its sealed segments' index files are deleted
//! (one bit an entry, by rank in id order), as of the end of sealed segment `covers_seq`.
//! Rewritten whole (`replace_file`) when a segment is sealed and after a compaction; a crash
//! leaves the old one, and open replays the deletes of the segments after what it covers
//! (`Index` in `index.rs`). Each run is named by its segment's sequence and identified by its
//! index file's header checksum and entry count: bits of a run that changed since (a compaction) are not used.

use std::io;
use std::path::Path;

use roost_storage::{read_all, replace_file, OpenMode, Storage};

const MAGIC: [u8; 8] = *b"ROOSTDED";
const VERSION: u32 = 1;
pub(crate) const DEAD_FILE: &str = "dead";

/// One run's deleted entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeadRun {
    pub(crate) seq: u64,
    /// The index file's header checksum (`DiskRun::ident`).
    pub(crate) ident: u64,
    pub(crate) entries: u64,
    pub(crate) bytes: u64,
    /// The sequence of the newest segment with a delete of one of these entries.
    pub(crate) by_seq: u64,
    pub(crate) bits: Vec<u64>,
}

impl DeadRun {
    pub(crate) fn count(&self) -> u64 {
        self.bits.iter().map(|w| u64::from(w.count_ones())).sum()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeadFile {
    pub(crate) covers_seq: u64,
    pub(crate) runs: Vec<DeadRun>,
}

impl DeadFile {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.covers_seq.to_le_bytes());
        b.extend_from_slice(&(self.runs.len() as u64).to_le_bytes());
        for r in &self.runs {
            for v in [r.seq, r.ident, r.entries, r.bytes, r.by_seq] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&(r.bits.len() as u64).to_le_bytes());
            for w in &r.bits {
                b.extend_from_slice(&w.to_le_bytes());
            }
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<DeadFile, &'static str> {
        if b.len() < 36 || b[..8] != MAGIC {
            return Err("not a dead file");
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32fast::hash(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
            return Err("dead file checksum mismatch");
        }
        let mut r = Reader { b: body, at: 8 };
        if r.u32()? != VERSION {
            return Err("unknown dead file version");
        }
        r.u32()?;
        let covers_seq = r.u64()?;
        let n = r.u64()?;
        let mut runs = Vec::new();
        for _ in 0..n {
            let (seq, ident, entries, bytes, by_seq) =
                (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let words = r.u64()?;
            if words > entries.div_ceil(64) {
                return Err("dead file run has more bits than entries");
            }
            let bits = (0..words).map(|_| r.u64()).collect::<Result<_, _>>()?;
            runs.push(DeadRun {
                seq,
                ident,
                entries,
                bytes,
                by_seq,
                bits,
            });
        }
        if r.at != body.len() {
            return Err("dead file has trailing bytes");
        }
        Ok(DeadFile { covers_seq, runs })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], &'static str> {
        let end = self.at.checked_add(n).ok_or("dead file too short")?;
        let s = self.b.get(self.at..end).ok_or("dead file too short")?;
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

/// Reads the shard's dead file: `Ok(None)` when there is none or it does not decode (open
/// then replays every delete, which is always correct).
pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> io::Result<Option<DeadFile>> {
    let path = dir.join(DEAD_FILE);
    let file = match storage.open(&path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bytes = read_all(file.as_ref())?;
    match DeadFile::decode(&bytes) {
        Ok(d) => Ok(Some(d)),
        Err(why) => {
            tracing::warn!(file = %path.display(), why, "shard: dead file not used, deletes replayed");
            Ok(None)
        }
    }
}

pub(crate) fn write(storage: &dyn Storage, dir: &Path, d: &DeadFile) -> io::Result<()> {
    let path = dir.join(DEAD_FILE);
    let tmp = dir.join(format!("{DEAD_FILE}.tmp"));
    replace_file(storage, &tmp, &path, &d.encode(), OpenMode::CreateNew).map_err(|e| e.source)
}

/// Removes the dead file (a cut reached into a sealed segment: its bits may count deletes
/// that are gone).
pub(crate) fn remove(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    match storage.remove(&dir.join(DEAD_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => storage.sync_dir(dir),
    }
}

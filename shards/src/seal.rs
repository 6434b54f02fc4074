//! Sealed segments' index files (`runs.rs`) on the shard's side: a sealed segment's run is
//! written to its file and leaves memory (`Shard::seal_runs`, after a roll, an open's scan and
//! a compaction), and open puts a matching file in place of a scan (`Shard::load_sealed`).
//! A failure to write one poisons the shard, as any write failure does (the daemon stops with
//! its I/O exit code): the segments are durable and a reopen rebuilds what is missing.

use super::*;
use crate::mmap::MappedSegment;
use crate::runs::dead;
use crate::runs::{DiskRun, RunHeader, INDEX_SUFFIX};

impl Shard {
    pub(crate) fn index_err(&self, op: &'static str) -> impl FnOnce(io::Error) -> ShardError + '_ {
        move |source| ShardError::Io {
            op,
            path: self.dir.clone(),
            source,
        }
    }

    /// The sequence in segment `si`'s name.
    pub(crate) fn seq_at(&self, si: usize) -> u64 {
        self.segs[si]
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_seg_name)
            .unwrap_or(0)
    }

    /// Open: puts sealed segment `si`'s index file in place of a scan when it matches the
    /// segment (false: scan it). Then applies the deletes of this segment that the `dead`
    /// file does not reflect yet.
    pub(crate) fn load_sealed(
        &mut self,
        si: usize,
        compacted: Option<frame::CompactHeader>,
        dead: Option<&dead::DeadFile>,
        report: &mut OpenReport,
    ) -> Result<bool, ShardError> {
        if !self.opts.index_files {
            return Ok(false);
        }
        let run = match DiskRun::open(&self.storage, &self.segs[si]) {
            Ok(Some(run)) => run,
            Ok(None) => return Ok(false),
            Err(why) => {
                warn!(shard = %self.name, segment = %self.segs[si].path.display(), why,
                    "shard: index file not used; scanning the segment");
                return Ok(false);
            }
        };
        let h = run.header;
        let in_order = h.lsn_lo > self.max_lsn || (h.frames == 0 && compacted.is_none());
        if h.compacted != compacted.is_some() || !in_order {
            warn!(shard = %self.name, segment = %self.segs[si].path.display(),
                "shard: index file does not fit its place; scanning the segment");
            return Ok(false);
        }
        let seq = self.seq_at(si);
        self.index.load(si, seq, run, dead);
        let live = (h.entry_bytes + h.far_delete_bytes).saturating_sub(self.index.dead_bytes(si));
        let max_lsn = h.lsn_hi.max(self.max_lsn);
        let space = &mut self.compaction.space;
        space.set_sealed(si, h.used, live, max_lsn, compacted);
        for (target, len) in self
            .index
            .replay_deletes(si)
            .map_err(self.index_err("read index"))?
        {
            let bytes = frame::op_bytes(len as usize) as u64;
            self.compaction.space.sub_live(target, bytes);
        }
        self.max_lsn = max_lsn;
        self.max_id = self.max_id.max(h.max_id);
        report.frames += h.frames;
        report.deletes += h.deletes;
        Ok(true)
    }

    /// Writes the index file of every sealed segment whose run is still in memory (all but
    /// the last segment; their frames are flushed), then the `dead` file when anything
    /// changed. A failure poisons the shard.
    pub(crate) fn seal_runs(&mut self) -> Result<(), ShardError> {
        if self.opts.read_only || self.segs.len() < 2 {
            return Ok(());
        }
        let mut sealed = false;
        for si in 0..self.segs.len() - 1 {
            if self.index.is_sealed(si) {
                continue;
            }
            let Some(header) = self.run_header(si) else {
                continue;
            };
            let storage = self.storage.clone();
            if let Err(source) = self.index.seal(&storage, si, &self.segs[si], header) {
                let path = runs::index_path(&self.segs[si].path);
                return Err(self.poison("write index file", path, source));
            }
            sealed = true;
        }
        if sealed || self.index.dead_dirty() {
            self.write_dead()?;
        }
        Ok(())
    }

    /// Whether the last segment's run in memory holds [`ShardOptions::index_entries_max`]
    /// entries or more: its next frame goes to a new segment.
    pub(crate) fn run_full(&self) -> bool {
        let max = self.opts.index_entries_max;
        max > 0
            && self.write_offset > 0
            && self.index.mem_entries(self.segs.len().saturating_sub(1)) >= max
    }

    /// Segment `si`, just rolled with its frames ending at `used` (flushed), gives back the
    /// preallocated space past them (its run filled first, or a frame did not fit): it is mapped
    /// again at `used` rounded up to a page, then its file is cut to that length. The map
    /// never passes the file's end (`mmap.rs`, point 2). Either length is a valid segment
    /// after a crash (zeros past the last frame read as its end), so the cut is not synced;
    /// a cut that fails leaves the file as long as it was, which wastes space and nothing
    /// else (logged).
    pub(crate) fn trim_rolled(&mut self, si: usize, used: usize) {
        let keep = (used as u64).next_multiple_of(4096);
        let seg = &self.segs[si];
        if self.opts.read_only || keep >= seg.len() as u64 || used == 0 {
            return;
        }
        let remapped = self
            .storage
            .open(&seg.path, OpenMode::ReadWrite)
            .and_then(|file| {
                let map = MappedSegment::map(file.as_ref(), keep)?;
                Ok((file, map))
            });
        let cut = remapped.and_then(|(file, map)| {
            self.segs[si].data = SegData::Mapped(map);
            file.set_len(keep)
        });
        if let Err(e) = cut {
            warn!(shard = %self.name, segment = %self.segs[si].path.display(), keep, error = %e,
                "shard: rolled segment not trimmed; its unused space stays allocated");
        }
    }

    fn poison(&mut self, op: &'static str, path: PathBuf, source: io::Error) -> ShardError {
        let e = ShardError::Io { op, path, source };
        warn!(shard = %self.name, error = %e, "shard: index file write failed, shard poisoned");
        self.poisoned = Some(e.to_string());
        e
    }

    /// The `dead` file, covering every sealed segment's deletes.
    fn write_dead(&mut self) -> Result<(), ShardError> {
        let covers = self.seq_at(self.segs.len() - 2);
        let file = self.index.dead_file(covers);
        match file.and_then(|f| dead::write(self.storage.as_ref(), &self.dir, &f)) {
            Ok(()) => {
                self.index.dead_written();
                Ok(())
            }
            Err(source) => {
                Err(self.poison("write dead file", self.dir.join(dead::DEAD_FILE), source))
            }
        }
    }

    /// What identifies sealed segment `si` and its space, for its index file (`None`: a
    /// segment without frames, nothing to seal).
    fn run_header(&self, si: usize) -> Option<RunHeader> {
        let seg = &self.segs[si];
        let (used, live) = self.compaction.space.used_live(si);
        let mut h = RunHeader {
            seg_len: seg.len() as u64,
            used,
            entry_bytes: self.index.entry_bytes(si),
            far_delete_bytes: live.saturating_sub(self.index.live_bytes(si)),
            ..RunHeader::default()
        };
        let storage = self.storage.as_ref();
        match compact::header_of(storage, seg).ok()? {
            Some(c) => {
                let head = seg.read_cold(storage, 0, frame::COMPACT_HEADER_LEN).ok()?;
                h.compacted = true;
                h.anchor_len = head.len() as u32;
                h.anchor_crc = crc32fast::hash(&head);
                (h.lsn_lo, h.lsn_hi, h.max_id) = (c.lsn_lo, c.lsn_hi, c.id_max);
            }
            None => {
                let f = self.index.last_frame(si)?;
                let head = seg.read_cold(storage, f.offset as usize, 4).ok()?;
                h.anchor_offset = u64::from(f.offset);
                h.anchor_len = f.len;
                h.anchor_crc = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
                h.max_id = self.index.max_entry_id(si);
            }
        }
        Some(h)
    }

    /// Open: removes index files whose segment is gone (a compaction retired it, a cut removed
    /// it) and temporaries left by a crash.
    pub(crate) fn remove_stale_indexes(&self) -> Result<(), ShardError> {
        if self.opts.read_only {
            return Ok(());
        }
        let names = self
            .storage
            .list(&self.dir)
            .map_err(self.index_err("list"))?;
        for name in names {
            let stale = match name.strip_suffix(INDEX_SUFFIX) {
                Some(stem) => !self
                    .segs
                    .iter()
                    .any(|s| s.path.file_stem() == Some(stem.as_ref())),
                None => name.ends_with(".idx.tmp") || name == "dead.tmp",
            };
            if stale {
                let path = self.dir.join(&name);
                self.storage
                    .remove(&path)
                    .map_err(|source| ShardError::Io {
                        op: "remove stale index file",
                        path,
                        source,
                    })?;
            }
        }
        Ok(())
    }

    /// Before segments `range` change (a cut, a compaction's swap): their index files go,
    /// and with `dead` also the `dead` file (its bits may count deletes that go too).
    pub(crate) fn unseal(
        &mut self,
        range: std::ops::Range<usize>,
        dead: bool,
    ) -> Result<(), ShardError> {
        for seg in &self.segs[range] {
            let path = runs::index_path(&seg.path);
            match self.storage.remove(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(ShardError::Io {
                        op: "remove index file",
                        path,
                        source: e,
                    })
                }
                _ => {}
            }
        }
        if dead {
            dead::remove(self.storage.as_ref(), &self.dir)
                .map_err(self.index_err("remove dead file"))?;
        }
        self.sync_dir()
    }
}

impl Shard {
    /// For `roost verify` (a shard opened with `index_files: false`, so every run was built by
    /// a scan): every sealed segment's index file that an open would use must say what the scan
    /// found, and the `dead` file must mark no live record dead. Returns what disagrees (each
    /// names the file; removing it makes the next writable open rebuild it).
    pub fn index_file_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let sealed = self.segs.len().saturating_sub(1);
        for si in 0..sealed {
            let Some(m) = self.index.mem_run(si) else {
                continue;
            };
            let run = match DiskRun::open(&self.storage, &self.segs[si]) {
                Ok(Some(run)) => run,
                Ok(None) | Err(_) => continue, // not used by an open: rebuilt by the next one
            };
            if let Err(why) = same_run(&run, m) {
                out.push(format!(
                    "{}: {why}; remove it to rebuild it",
                    run.path.display()
                ));
            }
        }
        if let Err(why) = self.dead_file_agrees() {
            out.push(format!(
                "{}: {why}",
                self.dir.join(dead::DEAD_FILE).display()
            ));
        }
        out
    }

    /// Every bit the `dead` file sets for a run whose index file matches is a dead entry here.
    fn dead_file_agrees(&self) -> Result<(), String> {
        let file = dead::read(self.storage.as_ref(), &self.dir).map_err(|e| e.to_string())?;
        let Some(file) = file else {
            return Ok(());
        };
        for si in 0..self.segs.len().saturating_sub(1) {
            let (Some(m), seq) = (self.index.mem_run(si), self.seq_at(si)) else {
                continue;
            };
            let Ok(Some(run)) = DiskRun::open(&self.storage, &self.segs[si]) else {
                continue;
            };
            let ident = u64::from(run.ident);
            let Some(d) = file.runs.iter().find(|r| r.seq == seq && r.ident == ident) else {
                continue;
            };
            for (rank, slot) in m.slots.iter().enumerate() {
                let bit = d
                    .bits
                    .get(rank / 64)
                    .is_some_and(|w| w & (1 << (rank % 64)) != 0);
                if bit && slot.dead_by().is_none() {
                    return Err(format!(
                        "marks live id {} of segment {seq} dead",
                        m.ids[rank]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether an index file holds exactly the run a scan built.
fn same_run(run: &DiskRun, m: &crate::index::MemRun) -> Result<(), String> {
    let io = |e: io::Error| e.to_string();
    let mut entries = Vec::new();
    run.for_each_entry(|_, e| {
        entries.push((e.id, e.offset, e.len));
        Ok(())
    })
    .map_err(io)?;
    let scanned: Vec<_> = m
        .ids
        .iter()
        .zip(&m.slots)
        .map(|(id, s)| (*id, s.offset, s.len))
        .collect();
    if entries != scanned {
        return Err(format!(
            "{} entries, the segment {}",
            entries.len(),
            scanned.len()
        ));
    }
    if run.frames().map_err(io)? != m.frames {
        return Err("its frames differ from the segment's".to_owned());
    }
    // A set: a compacted segment's file lists its kept deletes sorted, its frames hold them
    // in the order the copy met them.
    let (mut filed, mut scanned) = (run.deletes().map_err(io)?, m.deletes.clone());
    filed.sort_unstable();
    scanned.sort_unstable();
    if filed != scanned {
        return Err("its deletes differ from the segment's".to_owned());
    }
    Ok(())
}

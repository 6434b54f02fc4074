//! Opening a shard: its segments scanned frame by frame, the index rebuilt from them, a
//! torn tail zeroed (`Shard::open_with`); and `index_frame`, the one place open and apply
//! change the index.

use super::*;

/// Applies one verified frame (at `at` in segment `seg`) to the index: creates insert their
/// location, deletes mark dead. Counts the bytes compaction would keep (`Space`): a live
/// create, and a delete whose create is in an earlier segment. Returns (creates, deletes).
/// The one place open and apply share.
pub(crate) fn index_frame(
    index: &mut Index,
    max_id: &mut u64,
    space: &mut compact::Space,
    seg: usize,
    at: usize,
    view: &frame::FrameView,
) -> io::Result<(u64, u64)> {
    let (mut creates, mut deletes) = (0, 0);
    for op in &view.ops {
        if op.kind == OP_CREATE {
            let offset = (at + op.record_offset) as u32;
            index.insert(seg, op.id, offset, op.record_len as u32);
            space.add_live(seg, frame::op_bytes(op.record_len) as u64);
            *max_id = (*max_id).max(op.id);
            creates += 1;
        } else {
            if let Some(old) = index.remove(op.id, seg)? {
                let old_seg = (old.seg & !DEAD) as usize;
                space.sub_live(old_seg, frame::op_bytes(old.len as usize) as u64);
                if old_seg < seg {
                    space.add_live(seg, OP_HEADER_LEN as u64);
                }
            }
            deletes += 1;
        }
    }
    Ok((creates, deletes))
}

impl Shard {
    /// Opens (creating if needed) shard `dir` on the real disk.
    pub fn open(dir: impl AsRef<Path>, opts: ShardOptions) -> Result<Shard, ShardError> {
        Shard::open_with(RealStorage::shared(), dir, opts)
    }

    /// Opens through a storage seam. A writable shard maps its segments through the seam
    /// ([`roost_storage::MappedFile`]: writes, and `msync` of the flushed range), whatever the
    /// storage; a read-only one reads them with positioned I/O.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        dir: impl AsRef<Path>,
        opts: ShardOptions,
    ) -> Result<Shard, ShardError> {
        let dir = dir.as_ref().to_path_buf();
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_owned();
        let lock = if opts.read_only {
            None
        } else {
            create_and_lock(storage.as_ref(), &dir)?
        };
        let segs = open_segments(storage.as_ref(), &dir, opts.read_only)?;
        let segs = compact::recover(storage.as_ref(), &dir, segs, opts.read_only)?;
        let mut shard = Shard {
            name,
            dir,
            storage,
            opts,
            segs,
            write_offset: 0,
            index: Index::default(),
            max_lsn: 0,
            max_id: 0,
            dirty_from: None,
            zeroed_to: 0,
            poisoned: None,
            spare: None,
            _lock: lock,
            report: OpenReport::default(),
            reads_since_release: Default::default(),
            compaction: compact::Compaction::default(),
        };
        shard.rebuild()?;
        if !shard.opts.read_only {
            let bytes = shard.next_segment_bytes(0);
            let spare = Spare::open(shard.storage.as_ref(), &shard.dir, bytes);
            shard.spare = Some(spare.map_err(|source| ShardError::Io {
                op: "make spare segment",
                path: shard.dir.join(roost_storage::SPARE_FILE),
                source,
            })?);
        }
        info!(shard = %shard.name, segments = shard.report.segments, frames = shard.report.frames,
            records = shard.report.records, torn_bytes = shard.report.torn_bytes_dropped,
            max_lsn = shard.max_lsn, "shard: opened");
        Ok(shard)
    }

    /// Rebuilds the index: each sealed segment from its index file when one matches, every
    /// other segment by a scan that verifies every frame and drops (zeroes, when writable) a
    /// torn last frame; then writes the index files the scans make possible.
    pub(crate) fn rebuild(&mut self) -> Result<(), ShardError> {
        self.index.clear();
        self.max_lsn = 0;
        self.max_id = 0;
        self.write_offset = 0;
        self.dirty_from = None;
        self.zeroed_to = 0;
        self.compaction.reset();
        let mut report = OpenReport {
            segments: self.segs.len() as u64,
            ..OpenReport::default()
        };
        self.remove_stale_indexes()?;
        let dead = match self.opts.index_files {
            false => None,
            true => runs::dead::read(self.storage.as_ref(), &self.dir)
                .map_err(self.index_err("read dead file"))?,
        };
        let nsegs = self.segs.len();
        for si in 0..nsegs {
            let last = si + 1 == nsegs;
            let compacted = compact::header_of(self.storage.as_ref(), &self.segs[si])?;
            if !last && self.load_sealed(si, compacted, dead.as_ref(), &mut report)? {
                continue;
            }
            self.index.ensure(si, self.seq_at(si));
            match compacted {
                Some(h) => self.rebuild_compacted(si, h, last, &mut report)?,
                None => self.rebuild_segment(si, last, &mut report)?,
            }
        }
        self.seal_runs()?;
        self.index.shrink();
        // The scan read every segment through its map: none of it stays resident.
        self.release_pages();
        report.records = self.index.len() as u64;
        report.max_lsn = self.max_lsn;
        self.report = report;
        Ok(())
    }

    /// Adds segment `si`'s frames to the index, sets the write offset when it is the `last`
    /// segment, and drops a torn tail found there.
    pub(crate) fn rebuild_segment(
        &mut self,
        si: usize,
        last: bool,
        report: &mut OpenReport,
    ) -> Result<(), ShardError> {
        let seg = &self.segs[si];
        // Past its data end the segment reads as zeros: the scan stops there as it would at
        // the first of those zeros, without touching the unwritten rest.
        let data = seg.data(self.storage.as_ref());
        let data = data.map_err(self.io_err("read", si))?;
        let bytes = data.as_ref();
        let (index, max_id) = (&mut self.index, &mut self.max_id);
        let space = &mut self.compaction.space;
        let mut failed = None;
        let on_frame = |pos: usize, v: &frame::FrameView| {
            space.on_frame(si, v.len as u64, v.lsn);
            match index_frame(index, max_id, space, si, pos, v) {
                Ok((c, d)) => {
                    report.records += c;
                    report.deletes += d;
                }
                Err(e) => failed = failed.take().or(Some(e)),
            }
            let (offset, len) = (pos as u32, v.len as u32);
            index.push_frame(
                si,
                RunFrame {
                    lsn: v.lsn,
                    offset,
                    len,
                },
            );
            report.frames += 1;
        };
        let synced_through = self.opts.synced_through_lsn;
        let end =
            scan_frames(bytes, last, synced_through, &mut self.max_lsn, on_frame).map_err(|c| {
                ShardError::Corrupt {
                    segment: seg.path.clone(),
                    offset: c.offset as u64,
                    lsn: c.lsn,
                    reason: c.reason,
                }
            })?;
        if let Some(source) = failed {
            return Err(ShardError::Io {
                op: "read index",
                path: seg.path.clone(),
                source,
            });
        }
        if last {
            self.write_offset = end.pos;
        }
        if let Some((at, reason)) = end.torn {
            let torn_end = bytes.iter().rposition(|b| *b != 0).map_or(at, |p| p + 1);
            report.torn_bytes_dropped = (torn_end - at) as u64;
            drop(data);
            if !self.opts.read_only {
                self.zero_torn_tail(si, at, torn_end, reason)?;
            }
        }
        Ok(())
    }

    /// Zeroes `[at, end)` of segment `si` and flushes it, before any new frame goes there.
    /// Zero, never truncate: the file stays preallocated and mapped.
    pub(crate) fn zero_torn_tail(
        &mut self,
        si: usize,
        at: usize,
        end: usize,
        reason: &'static str,
    ) -> Result<(), ShardError> {
        warn!(shard = %self.name, segment = %self.segs[si].path.display(), offset = at,
            reason, bytes = end - at, "shard: dropping torn last frame");
        let zeros = vec![0u8; end - at];
        let seg = &mut self.segs[si];
        let path = seg.path.clone();
        seg.write(at, &zeros)
            .and_then(|()| seg.flush(at, end - at))
            .map_err(|source| ShardError::Io {
                op: "repair torn tail",
                path,
                source,
            })
    }
}

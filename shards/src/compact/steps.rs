//! The compaction state machine (`Shard::compact_step`): plan a run of sealed segments,
//! copy what is still needed in bounded slices, seal the output, swap it in, relocate the
//! index entries and retire the inputs; and reading compacted segments back at open
//! (`Shard::rebuild_compacted`). The accounting and recovery are `compact.rs`.

use super::*;

impl Shard {
    /// Does one bounded slice of compaction work: plans a compaction when none is under way
    /// (the first sealed segment at or below `horizon_lsn` whose dead fraction reaches the
    /// threshold, merged with neighbouring candidates and compacted segments while the live
    /// bytes fit one segment), then copies up to `budget_bytes`, or does one of the seal, swap
    /// and retire steps. The shard's owner calls it between rounds; nothing is durable until
    /// `Finished`, and a crash at any point opens as before or after (docs/shard-format.md).
    pub fn compact_step(&mut self, o: &CompactOptions) -> Result<CompactProgress, ShardError> {
        self.check_writable()?;
        if let Some(why) = &self.compaction.failed {
            return Err(ShardError::Io {
                op: "compact (off after an earlier failure)",
                path: self.dir.clone(),
                source: io::Error::other(why.clone()),
            });
        }
        let mut job = match self.compaction.job.take() {
            Some(job) => job,
            None => match self.plan(o)? {
                Some(job) => job,
                None => return Ok(CompactProgress::Idle),
            },
        };
        let phase = job.phase;
        let before = job.read_bytes;
        let r = match phase {
            Phase::Copy => self.copy_slice(&mut job, o.budget_bytes.max(1)),
            Phase::Seal => seal(&mut job),
            Phase::Swap => self.swap_in(&mut job),
            Phase::Retire => self.retire(&job),
        };
        let bytes = job.read_bytes - before;
        match r {
            Ok(()) if phase == Phase::Retire => {
                let progress = self.finished(&job, bytes);
                self.seal_runs().map(|()| progress)
            }
            Ok(()) => {
                self.compaction.job = Some(job);
                Ok(CompactProgress::Working { bytes })
            }
            Err(e) if matches!(phase, Phase::Copy | Phase::Seal) => Err(self.abandon(job, e)),
            Err(e) => {
                warn!(shard = %self.name, error = %e, "shard: compaction swap failed, shard poisoned");
                self.poisoned = Some(e.to_string());
                Err(e)
            }
        }
    }

    fn finished(&mut self, job: &Job, bytes: u64) -> CompactProgress {
        let reclaimed_bytes = job.old_bytes.saturating_sub(job.new_bytes);
        self.compaction.compactions += 1;
        self.compaction.reclaimed_bytes += reclaimed_bytes;
        info!(shard = %self.name, segment = %job.target.display(), lsn_lo = job.header.lsn_lo,
            lsn_hi = job.header.lsn_hi, old_bytes = job.old_bytes, new_bytes = job.new_bytes,
            "shard: compacted");
        CompactProgress::Finished {
            bytes,
            reclaimed_bytes,
        }
    }

    /// A copy or seal failed: the old segments were never touched. Drop the temporary file
    /// (best effort: open removes it too) and keep compaction off until reopen.
    fn abandon(&mut self, job: Job, e: ShardError) -> ShardError {
        warn!(shard = %self.name, error = %e, "shard: compaction abandoned");
        let tmp = job.tmp.clone();
        drop(job);
        let _ = self.storage.remove(&tmp);
        self.compaction.failed = Some(e.to_string());
        e
    }

    /// Figures for status reporting.
    pub fn compaction_stats(&self) -> CompactionStats {
        let c = &self.compaction;
        let sealed = self.segs.len().saturating_sub(1);
        let all = (0..self.segs.len()).map(|si| c.space.get(si));
        CompactionStats {
            compactions: c.compactions,
            reclaimed_bytes: c.reclaimed_bytes,
            dead_bytes: (0..sealed).map(|si| c.space.get(si).dead()).sum(),
            used_bytes: all.clone().map(|s| s.used).sum(),
            segments: self.segs.len() as u64,
            compacted_segments: all.filter(|s| s.compacted.is_some()).count() as u64,
            in_progress: c.job.is_some(),
        }
    }

    /// The lsn ranges held compacted (inclusive), oldest first.
    pub fn compacted_ranges(&self) -> Vec<(u64, u64)> {
        let sp = &self.compaction.space;
        sp.compacted().map(|h| (h.lsn_lo, h.lsn_hi)).collect()
    }

    /// The sequence number the next new segment gets: one past the newest.
    pub(crate) fn next_seq(&self) -> u64 {
        let newest = self.segs.iter().filter_map(|s| seq_of(&s.path)).max();
        newest.map_or(1, |q| q + 1)
    }

    /// `truncate_from` cannot reach into a compacted range (its frames are merged away), and
    /// abandons a compaction under way (its segment indices would no longer hold).
    pub(crate) fn before_truncate(&mut self, lsn: u64) -> Result<(), ShardError> {
        let through = self.compaction.space.compacted_lsn_max();
        if through > 0 && lsn <= through {
            return Err(ShardError::Io {
                op: "truncate",
                path: self.dir.clone(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("lsn {lsn} is inside a compacted range (compacted through {through})"),
                ),
            });
        }
        if let Some(job) = self.compaction.job.take() {
            let tmp = job.tmp.clone();
            drop(job);
            self.storage
                .remove(&tmp)
                .map_err(io_at("remove compaction temporary", &tmp))?;
        }
        Ok(())
    }

    /// The run to compact, if any: see [`Shard::compact_step`].
    fn pick_run(&self, o: &CompactOptions) -> Option<(usize, usize)> {
        let sp = &self.compaction.space;
        let sealed = self.segs.len().saturating_sub(1);
        let eligible = |si: usize| {
            let s = sp.get(si);
            si < sealed && s.used > 0 && s.max_lsn <= o.horizon_lsn
        };
        let worth = |si: usize| eligible(si) && sp.get(si).worth(o);
        let mergeable = |si: usize| eligible(si) && sp.get(si).compacted.is_some();
        let start = (0..sealed).find(|si| worth(*si))?;
        let cap = self.opts.segment_bytes;
        let mut live = COMPACT_HEADER_LEN as u64 + sp.get(start).live;
        let (mut first, mut last) = (start, start);
        while first > 0 && mergeable(first - 1) && live + sp.get(first - 1).live <= cap {
            first -= 1;
            live += sp.get(first).live;
        }
        while worth(last + 1) || mergeable(last + 1) {
            let more = sp.get(last + 1).live;
            if live + more > cap {
                break;
            }
            last += 1;
            live += more;
        }
        Some((first, last))
    }

    /// Starts a compaction: picks the run and creates its temporary file.
    fn plan(&mut self, o: &CompactOptions) -> Result<Option<Job>, ShardError> {
        let Some((first, last)) = self.pick_run(o) else {
            return Ok(None);
        };
        let target = self.segs[last].path.clone();
        let seq = seq_of(&target)
            .ok_or_else(|| corrupt(&self.segs[last], 0, 0, "segment name".into()))?;
        let tmp = self.dir.join(format!("{seq:010}{COMPACT_TMP_SUFFIX}"));
        match self.storage.remove(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at("remove", &tmp)(e)),
            _ => {}
        }
        let file = self
            .storage
            .open(&tmp, OpenMode::CreateNew)
            .map_err(io_at("create", &tmp))?;
        let first_seq = match header_of(self.storage.as_ref(), &self.segs[first])? {
            Some(h) => h.first_seq,
            None => seq_of(&self.segs[first].path).unwrap_or(seq),
        };
        let mut old_bytes = 0;
        for seg in &self.segs[first..=last] {
            old_bytes += file_len(seg).map_err(io_at("stat", &seg.path))?;
        }
        let deleted = self.index.deletes_of(first, last);
        let deleted_in_run = deleted
            .map_err(self.index_err("read index"))?
            .into_iter()
            .collect();
        let retire = self.segs[first..last]
            .iter()
            .map(|s| s.path.clone())
            .collect();
        Ok(Some(Job {
            first,
            last,
            phase: Phase::Copy,
            tmp,
            target,
            file,
            header: CompactHeader {
                first_seq,
                lsn_lo: u64::MAX,
                lsn_hi: 0,
                id_max: 0,
                live_frames: 0,
                content_len: 0,
            },
            cursor: (first, 0),
            horizon_lsn: o.horizon_lsn,
            out: LiveFrame::default(),
            written: 0,
            placed: HashMap::new(),
            kept_deletes: HashSet::new(),
            deleted_in_run,
            retire,
            old_bytes,
            new_bytes: 0,
            read_bytes: 0,
        }))
    }

    /// Reads old frames from the cursor until `budget` bytes are read or the run ends, and
    /// writes what is still needed. At the end of the run, moves on to `Seal`.
    fn copy_slice(&self, job: &mut Job, budget: u64) -> Result<(), ShardError> {
        let mut done = 0u64;
        loop {
            if job.cursor.0 > job.last {
                write_out(job)?;
                job.phase = Phase::Seal;
                return Ok(());
            }
            let (read, spent) = self.copy_segment(job, budget.saturating_sub(done), done == 0)?;
            done += read;
            if spent {
                break;
            }
        }
        if job.out.len() >= LIVE_FRAME_BYTES_MAX {
            write_out(job)?;
        }
        // Write back what this slice wrote now, so the seal's sync has little left: one
        // long fdatasync there would hold the owner (and a batch waiting on it).
        job.file
            .sync_data()
            .map_err(io_at("sync compacted segment", &job.tmp))?;
        Ok(())
    }

    /// Copies frames of the cursor's segment, up to `budget` bytes (one frame more only when
    /// `first` and the first frame alone is larger); moves the cursor to the next segment at
    /// its end. Returns the bytes read and whether the budget stopped it.
    fn copy_segment(
        &self,
        job: &mut Job,
        budget: u64,
        first: bool,
    ) -> Result<(u64, bool), ShardError> {
        let (si, mut pos) = job.cursor;
        let seg = &self.segs[si];
        let space = self.compaction.space.get(si);
        let bytes = seg.bytes().map_err(io_at("read", &seg.path))?;
        let end = match &space.compacted {
            Some(h) => {
                if pos == 0 {
                    fold_range(&mut job.header, h.lsn_lo, h.lsn_hi, h.id_max);
                    pos = COMPACT_HEADER_LEN;
                }
                COMPACT_HEADER_LEN + h.content_len as usize
            }
            None => space.used as usize,
        };
        let (mut read, mut spent) = (0u64, false);
        while pos < end {
            let slice = bytes.get(pos..end).unwrap_or(&[]);
            let (_, view) = match space.compacted {
                Some(_) => frame::probe_live(slice),
                None => frame::probe(slice),
            };
            let view = view.map_err(|why| {
                corrupt(
                    seg,
                    pos,
                    job.header.lsn_hi,
                    format!("frame changed since open: {why}"),
                )
            })?;
            if read + view.len as u64 > budget && !(first && read == 0) {
                spent = true;
                break;
            }
            if space.compacted.is_none() {
                fold_range(&mut job.header, view.lsn, view.lsn, 0);
            }
            self.keep_ops(job, si, pos, &bytes[pos..pos + view.len], &view)?;
            if job.out.len() >= LIVE_FRAME_BYTES_MAX {
                write_out(job)?;
            }
            pos += view.len;
            read += view.len as u64;
        }
        job.cursor = if pos >= end { (si + 1, 0) } else { (si, pos) };
        job.read_bytes += read;
        Ok((read, spent))
    }

    /// Adds a frame's still-needed ops to the output: creates [`Shard::keeps_create`] keeps,
    /// and a delete whose create is on disk in a segment before the run.
    fn keep_ops(
        &self,
        job: &mut Job,
        si: usize,
        at: usize,
        bytes: &[u8],
        view: &FrameView,
    ) -> Result<(), ShardError> {
        for op in &view.ops {
            if op.kind == OP_CREATE {
                job.header.id_max = job.header.id_max.max(op.id);
                let here = Loc {
                    seg: si as u32,
                    offset: (at + op.record_offset) as u32,
                    len: op.record_len as u32,
                };
                if self.keeps_create(job, op.id, here)? {
                    let rec = &bytes[op.record_offset..op.record_offset + op.record_len];
                    let in_frame = job.out.push_create(op.id, rec);
                    let offset = COMPACT_HEADER_LEN as u64 + job.written + in_frame as u64;
                    job.placed.insert(op.id, offset as u32);
                }
                continue;
            }
            let entry = self
                .index
                .entry(op.id)
                .map_err(self.index_err("read index"))?;
            let before_run = entry
                .and_then(|l| l.on_disk_seg())
                .is_some_and(|s| s < job.first);
            if before_run && job.kept_deletes.insert(op.id) {
                job.out.push_delete(op.id);
            }
        }
        Ok(())
    }

    /// A create at `here` is kept when it is the record's create and the record is live, or
    /// deleted by a frame not yet vouched for: a power loss may take that delete, and the record
    /// must then still be on disk.
    fn keeps_create(&self, job: &Job, id: u64, here: Loc) -> Result<bool, ShardError> {
        let entry = self.index.entry(id).map_err(self.index_err("read index"))?;
        Ok(match entry {
            Some(l) if l.is_live() => l == here,
            Some(l) => {
                l.on_disk_seg() == Some(here.seg as usize)
                    && !job.deleted_in_run.contains(&id)
                    && !self.vouched(l.offset as usize, job)
            }
            None => false,
        })
    }

    /// Whether every frame of segment `si` is at or below the job's horizon (the caller vouches
    /// those are flushed and finished).
    fn vouched(&self, si: usize, job: &Job) -> bool {
        si < self.segs.len() && self.compaction.space.get(si).max_lsn <= job.horizon_lsn
    }

    /// Unmaps the old segments and puts the new one in their place (memory first: the same
    /// records either way), then renames the temporary file over the last old segment, fsyncs
    /// the directory and opens the new file under its name.
    fn swap_in(&mut self, job: &mut Job) -> Result<(), ShardError> {
        let run = self.compacted_run(job)?;
        // The old segments' index files go before any of them changes.
        self.unseal(job.first..job.last + 1, false)?;
        let ro = self.opts.read_only;
        let new = open_seg(self.storage.as_ref(), &job.tmp, ro)?;
        job.new_bytes = file_len(&new).map_err(io_at("stat", &job.tmp))?;
        let old: Vec<Seg> = self.segs.splice(job.first..=job.last, [new]).collect();
        drop(old); // unmapped before any of them loses its name
        self.relocate(job, run);
        self.storage
            .rename(&job.tmp, &job.target)
            .map_err(io_at("rename compacted segment", &job.target))?;
        self.sync_dir()?;
        self.segs[job.first] = open_seg(self.storage.as_ref(), &job.target, ro)?;
        job.phase = Phase::Retire;
        Ok(())
    }

    /// The index run of the compacted segment: every record live in the run must have been
    /// copied (a delete after its copy is fine: the delete is in a later segment and hides the
    /// copy on replay; anything else is a bug: stop before the swap rather than lose a record);
    /// a dead record copied stays dead; what was not copied is gone. Returns the run, the
    /// bytes of its live creates, and whether a dead one was kept.
    fn compacted_run(&self, job: &Job) -> Result<(MemRun, u64, bool), ShardError> {
        let (mut run, mut live, mut kept_dead) = (MemRun::default(), 0u64, false);
        let mut missed = None;
        let walk = self.index.entries_of(job.first, job.last, |id, loc| {
            let Some(at) = job.placed.get(&id) else {
                if loc.is_live() {
                    missed = missed.or(Some(id));
                }
                return;
            };
            let dead_by = (!loc.is_live()).then(|| self.index.seq(loc.offset as usize));
            if loc.is_live() {
                live += frame::op_bytes(loc.len as usize) as u64;
            } else {
                kept_dead = true;
            }
            let dead_by = dead_by.map(|s| s.unwrap_or(u64::MAX));
            run.push(id, Slot::new(*at, loc.len, dead_by));
        });
        walk.map_err(self.index_err("read index"))?;
        if let Some(id) = missed {
            let seg = &self.segs[job.first];
            return Err(corrupt(
                seg,
                0,
                0,
                format!("compaction missed live id {id}"),
            ));
        }
        let mut deletes: Vec<u64> = job.kept_deletes.iter().copied().collect();
        deletes.sort_unstable();
        run.deletes = deletes;
        Ok((run, live, kept_dead))
    }

    /// Puts the compacted segment's run and space in place of the old segments'.
    fn relocate(&mut self, job: &Job, (run, live, kept_dead): (MemRun, u64, bool)) {
        self.index.splice(job.first, job.last, run);
        let sp = &mut self.compaction.space;
        sp.at(job.last);
        let new = SegSpace {
            used: job.new_bytes,
            live: live + job.kept_deletes.len() as u64 * OP_HEADER_LEN as u64,
            max_lsn: job.header.lsn_hi,
            compacted: Some(job.header),
            blocked_until_lsn: if kept_dead { self.max_lsn } else { 0 },
        };
        sp.segs.splice(job.first..=job.last, [new]);
    }

    /// Removes the old segments other than the one renamed over (all unmapped since the swap)
    /// and fsyncs the directory.
    fn retire(&self, job: &Job) -> Result<(), ShardError> {
        for p in &job.retire {
            self.storage
                .remove(p)
                .map_err(io_at("remove compacted segment", p))?;
        }
        self.sync_dir()
    }

    /// Reads a compacted segment at open: the header's lsn range must follow the frames before
    /// it, and every `FRAME_TYPE_LIVE` frame must verify and be exactly where the header says
    /// (it was synced before it got its name, so any damage is corruption, never a torn tail).
    pub(crate) fn rebuild_compacted(
        &mut self,
        si: usize,
        h: CompactHeader,
        last: bool,
        report: &mut OpenReport,
    ) -> Result<(), ShardError> {
        let seg = &self.segs[si];
        let bytes = seg.bytes().map_err(io_at("read", &seg.path))?;
        let end = COMPACT_HEADER_LEN as u64 + h.content_len;
        let bad = |at: usize, why: &str| corrupt(seg, at, self.max_lsn, why.to_owned());
        if bytes.len() as u64 != end {
            return Err(bad(0, "compacted segment length differs from its header"));
        }
        if h.lsn_lo <= self.max_lsn {
            return Err(bad(0, "compacted lsn range out of sequence"));
        }
        let (index, max_id, space) = (
            &mut self.index,
            &mut self.max_id,
            &mut self.compaction.space,
        );
        let (mut pos, mut frames) = (COMPACT_HEADER_LEN, 0u64);
        while pos < bytes.len() {
            let (_, view) = frame::probe_live(&bytes[pos..]);
            let view = view.map_err(|why| bad(pos, why))?;
            let indexed = index_frame(index, max_id, space, si, pos, &view);
            let (c, d) = indexed.map_err(|source| ShardError::Io {
                op: "read index",
                path: seg.path.clone(),
                source,
            })?;
            report.records += c;
            report.deletes += d;
            pos += view.len;
            frames += 1;
        }
        if frames != h.live_frames {
            return Err(bad(
                pos,
                "compacted segment frame count differs from its header",
            ));
        }
        *space.at(si) = SegSpace {
            used: end,
            max_lsn: h.lsn_hi,
            compacted: Some(h),
            ..space.get(si)
        };
        self.max_lsn = h.lsn_hi;
        self.max_id = self.max_id.max(h.id_max);
        if last {
            // Never append to a compacted segment: the next frame rolls to a new one.
            self.write_offset = self.opts.segment_bytes as usize;
        }
        Ok(())
    }
}

fn fold_range(h: &mut CompactHeader, lo: u64, hi: u64, id_max: u64) {
    h.lsn_lo = h.lsn_lo.min(lo);
    h.lsn_hi = h.lsn_hi.max(hi);
    h.id_max = h.id_max.max(id_max);
}

/// Writes the pending `FRAME_TYPE_LIVE` frame, if any, after what is written.
fn write_out(job: &mut Job) -> Result<(), ShardError> {
    if job.out.is_empty() {
        return Ok(());
    }
    let bytes = job.out.finish();
    let at = COMPACT_HEADER_LEN as u64 + job.written;
    job.file
        .write_at(&bytes, at)
        .map_err(io_at("write", &job.tmp))?;
    job.written += bytes.len() as u64;
    job.header.live_frames += 1;
    Ok(())
}

/// Writes the header (now that counts and ranges are known) and makes the whole file durable:
/// only then may it get a segment's name.
fn seal(job: &mut Job) -> Result<(), ShardError> {
    job.header.content_len = job.written;
    job.file
        .write_at(&job.header.encode(), 0)
        .and_then(|()| job.file.sync_data())
        .map_err(io_at("seal compacted segment", &job.tmp))?;
    job.phase = Phase::Swap;
    Ok(())
}

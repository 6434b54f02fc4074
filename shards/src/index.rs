//! A shard's index (`Index`): for each segment, a run of its creates sorted by id (where each
//! is on disk, live or dead) and of its transaction frames by lsn. The segment being written
//! (and any segment not sealed yet) has its run in memory (`MemRun`); a sealed segment's run
//! is an index file on disk (`runs.rs`) with its dead bits in memory, persisted in the `dead`
//! file (`runs/dead.rs`). `docs/shard-format.md`, "Index files".

use std::io;

use roost_storage::Storage;

use crate::frame;
use crate::runs::dead::{DeadFile, DeadRun};
use crate::runs::{self, DiskRun, RunContent, RunEntry, RunFrame, RunHeader};
use crate::segment::Seg;

/// Where a record's create is on disk. `seg` is the segment index, with `DEAD` set when the
/// record is deleted (its create still on disk there: compaction must keep the delete that
/// hides it). A dead record is never read, so its `offset` holds the index of the newest
/// segment that may hold its delete instead: compaction may drop the create only once that
/// segment is vouched for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) seg: u32,
    pub(crate) offset: u32,
    pub(crate) len: u32,
}

pub(crate) const DEAD: u32 = 1 << 31;

impl Loc {
    pub(crate) fn is_live(&self) -> bool {
        self.seg & DEAD == 0
    }
    /// The segment holding the create, live or dead.
    pub(crate) fn on_disk_seg(&self) -> Option<usize> {
        Some((self.seg & !DEAD) as usize)
    }
}

/// An entry of a run in memory (12 bytes): where its create is in the run's segment, and,
/// when dead, the sequence of the segment whose frame deleted it (`dead`: 0 while live;
/// sequences start at 1, and one past `u32::MAX` is kept as `u32::MAX`, later: safe, see
/// `Loc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) offset: u32,
    pub(crate) len: u32,
    dead: u32,
}

impl Slot {
    pub(crate) fn new(offset: u32, len: u32, dead_by: Option<u64>) -> Slot {
        let dead = dead_by.map_or(0, |by| u32::try_from(by.max(1)).unwrap_or(u32::MAX));
        Slot { offset, len, dead }
    }

    /// The sequence of the segment that deleted it (`None` while live).
    pub(crate) fn dead_by(&self) -> Option<u64> {
        match self.dead {
            0 => None,
            u32::MAX => Some(u64::MAX),
            by => Some(u64::from(by)),
        }
    }

    fn kill(&mut self, by: u64) {
        *self = Slot::new(self.offset, self.len, Some(by));
    }
}

/// A run in memory: ids sorted with their slots (ids are minted increasing and a shard
/// applies in lsn order, so inserts are appends), the frames, the delete ops' ids (for the
/// index file, which open replays when the `dead` file does not cover them).
#[derive(Debug, Default)]
pub(crate) struct MemRun {
    pub(crate) ids: Vec<u64>,
    pub(crate) slots: Vec<Slot>,
    pub(crate) frames: Vec<RunFrame>,
    pub(crate) deletes: Vec<u64>,
    live: usize,
}

impl MemRun {
    pub(crate) fn push(&mut self, id: u64, slot: Slot) {
        match self.ids.last() {
            Some(last) if *last >= id => match self.ids.binary_search(&id) {
                Ok(i) => {
                    self.live -= usize::from(self.slots[i].dead_by().is_none());
                    self.slots[i] = slot;
                }
                Err(i) => {
                    self.ids.insert(i, id);
                    self.slots.insert(i, slot);
                }
            },
            _ => {
                self.ids.push(id);
                self.slots.push(slot);
            }
        }
        self.live += usize::from(slot.dead_by().is_none());
    }
}

/// A sealed segment's run: its index file, and which of its entries are dead.
#[derive(Debug)]
struct DiskBody {
    run: DiskRun,
    dead: Vec<u64>,
    dead_count: u64,
    dead_bytes: u64,
    dead_by: u64,
    /// Deletes in segments up to this sequence are in `dead` (open replays later ones).
    known_through: u64,
}

impl DiskBody {
    /// A run without dead entries whose deletes are known through segment `known_through`.
    fn new(run: DiskRun, known_through: u64) -> DiskBody {
        DiskBody {
            run,
            dead: Vec::new(),
            dead_count: 0,
            dead_bytes: 0,
            dead_by: 0,
            known_through,
        }
    }

    fn is_dead(&self, rank: usize) -> bool {
        self.dead
            .get(rank / 64)
            .is_some_and(|w| w & (1 << (rank % 64)) != 0)
    }

    fn set_dead(&mut self, rank: usize, len: u32, by: u64) {
        if self.dead.len() <= rank / 64 {
            self.dead.resize(rank / 64 + 1, 0);
        }
        self.dead[rank / 64] |= 1 << (rank % 64);
        self.dead_count += 1;
        self.dead_bytes += frame::op_bytes(len as usize) as u64;
        self.dead_by = self.dead_by.max(by);
    }
}

#[derive(Debug)]
enum Body {
    Mem(MemRun),
    Disk(Box<DiskBody>),
}

#[derive(Debug)]
struct Run {
    seq: u64,
    body: Body,
}

impl Run {
    fn id_range(&self) -> Option<(u64, u64)> {
        match &self.body {
            Body::Mem(m) => Some((*m.ids.first()?, *m.ids.last()?)),
            Body::Disk(d) => d.run.id_range(),
        }
    }

    fn live(&self) -> usize {
        match &self.body {
            Body::Mem(m) => m.live,
            Body::Disk(d) => (d.run.header.entries - d.dead_count) as usize,
        }
    }

    fn lsn_range(&self) -> Option<(u64, u64)> {
        match &self.body {
            Body::Mem(m) => Some((m.frames.first()?.lsn, m.frames.last()?.lsn)),
            Body::Disk(d) => {
                (d.run.header.frames > 0).then_some((d.run.header.lsn_lo, d.run.header.lsn_hi))
            }
        }
    }
}

/// Where an id was found.
enum Hit {
    Mem(usize),
    Disk(usize, RunEntry),
}

/// Every segment's run, by segment index.
#[derive(Debug, Default)]
pub(crate) struct Index {
    runs: Vec<Run>,
    /// A sealed run's dead bits changed since the `dead` file was last written.
    dead_dirty: bool,
    /// Dead bits of sealed runs set by deletes in segments not sealed yet: their frames may
    /// not be durable, so the `dead` file leaves them out until their segment is sealed.
    pending: Vec<Pending>,
    /// At least every run's largest id: a create of a new id (above it) looks at no run.
    max_hi: u64,
}

/// A delete the `dead` file may not reflect yet: the id, and the sequence of the segment
/// holding the delete.
#[derive(Clone, Copy, Debug)]
struct Pending {
    id: u64,
    by: u64,
}

impl Index {
    pub(crate) fn clear(&mut self) {
        self.runs.clear();
        self.pending.clear();
        self.dead_dirty = false;
        self.max_hi = 0;
    }

    /// Makes sure segment `si` (sequence `seq`) has a run: an empty one in memory.
    pub(crate) fn ensure(&mut self, si: usize, seq: u64) {
        while self.runs.len() <= si {
            self.runs.push(Run {
                seq,
                body: Body::Mem(MemRun::default()),
            });
        }
    }

    fn mem(&mut self, si: usize) -> Option<&mut MemRun> {
        match &mut self.runs.get_mut(si)?.body {
            Body::Mem(m) => Some(m),
            Body::Disk(_) => None,
        }
    }

    /// The segment index of the segment with sequence `seq`, or of the compacted one that
    /// took its place (named after the last of the segments it replaced).
    fn index_of_seq(&self, seq: u64) -> usize {
        self.runs.partition_point(|r| r.seq < seq)
    }

    fn find(&self, id: u64) -> io::Result<Option<(usize, Hit)>> {
        if id > self.max_hi {
            return Ok(None);
        }
        for (si, run) in self.runs.iter().enumerate().rev() {
            match run.id_range() {
                Some((lo, hi)) if lo <= id && id <= hi => {}
                _ => continue,
            }
            let hit = match &run.body {
                Body::Mem(m) => m.ids.binary_search(&id).ok().map(Hit::Mem),
                Body::Disk(d) => d.run.find(id)?.map(|(r, e)| Hit::Disk(r, e)),
            };
            if let Some(hit) = hit {
                return Ok(Some((si, hit)));
            }
        }
        Ok(None)
    }

    fn loc_of(&self, si: usize, hit: &Hit) -> Loc {
        let (offset, len, dead_by) = match (&self.runs[si].body, hit) {
            (Body::Mem(m), Hit::Mem(i)) => {
                (m.slots[*i].offset, m.slots[*i].len, m.slots[*i].dead_by())
            }
            (Body::Disk(d), Hit::Disk(r, e)) => {
                (e.offset, e.len, d.is_dead(*r).then_some(d.dead_by))
            }
            _ => (0, 0, None),
        };
        match dead_by {
            None => Loc {
                seg: si as u32,
                offset,
                len,
            },
            Some(by) => Loc {
                seg: si as u32 | DEAD,
                offset: self.index_of_seq(by) as u32,
                len,
            },
        }
    }

    /// A create at `offset` of segment `si`.
    pub(crate) fn insert(&mut self, si: usize, id: u64, offset: u32, len: u32) {
        self.max_hi = self.max_hi.max(id);
        if let Some(m) = self.mem(si) {
            let slot = Slot::new(offset, len, None);
            m.push(id, slot);
        }
    }

    /// Marks a live record dead by a delete in segment `by_seg`; returns where it was.
    pub(crate) fn remove(&mut self, id: u64, by_seg: usize) -> io::Result<Option<Loc>> {
        // A segment without a run (never so) counts as not vouched for: u64::MAX.
        let by = self.runs.get(by_seg).map_or(u64::MAX, |r| r.seq);
        if let Some(m) = self.mem(by_seg) {
            m.deletes.push(id);
        }
        self.remove_as(id, by)
    }

    /// The entry for `id`, live or dead.
    pub(crate) fn entry(&self, id: u64) -> io::Result<Option<Loc>> {
        Ok(self.find(id)?.map(|(si, hit)| self.loc_of(si, &hit)))
    }

    pub(crate) fn get(&self, id: u64) -> io::Result<Option<Loc>> {
        Ok(self.entry(id)?.filter(Loc::is_live))
    }

    pub(crate) fn len(&self) -> usize {
        self.runs.iter().map(Run::live).sum()
    }

    /// Every live record in id order within each run, runs in segment order.
    pub(crate) fn for_each_live(
        &self,
        mut f: impl FnMut(u64, Loc) -> io::Result<()>,
    ) -> io::Result<()> {
        for (si, run) in self.runs.iter().enumerate() {
            match &run.body {
                Body::Mem(m) => {
                    for (id, s) in m.ids.iter().zip(&m.slots) {
                        if s.dead_by().is_none() {
                            f(
                                *id,
                                Loc {
                                    seg: si as u32,
                                    offset: s.offset,
                                    len: s.len,
                                },
                            )?;
                        }
                    }
                }
                Body::Disk(d) => d.run.for_each_entry(|rank, e| {
                    if d.is_dead(rank) {
                        return Ok(());
                    }
                    f(
                        e.id,
                        Loc {
                            seg: si as u32,
                            offset: e.offset,
                            len: e.len,
                        },
                    )
                })?,
            }
        }
        Ok(())
    }

    /// A transaction frame of segment `si`.
    pub(crate) fn push_frame(&mut self, si: usize, f: RunFrame) {
        if let Some(m) = self.mem(si) {
            m.frames.push(f);
        }
    }

    /// The segment index and place of the frame of `lsn`.
    pub(crate) fn frame(&self, lsn: u64) -> io::Result<Option<(usize, RunFrame)>> {
        for (si, run) in self.runs.iter().enumerate().rev() {
            match run.lsn_range() {
                Some((lo, hi)) if lo <= lsn && lsn <= hi => {}
                _ => continue,
            }
            let f = match &run.body {
                Body::Mem(m) => m
                    .frames
                    .binary_search_by_key(&lsn, |f| f.lsn)
                    .ok()
                    .map(|i| m.frames[i]),
                Body::Disk(d) => d.run.frame(lsn)?,
            };
            return Ok(f.map(|f| (si, f)));
        }
        Ok(None)
    }

    /// Every frame held, in lsn order, with its segment index.
    pub(crate) fn frames(&self) -> io::Result<Vec<(usize, RunFrame)>> {
        let mut out = Vec::new();
        for (si, run) in self.runs.iter().enumerate() {
            match &run.body {
                Body::Mem(m) => out.extend(m.frames.iter().map(|f| (si, *f))),
                Body::Disk(d) => out.extend(d.run.frames()?.into_iter().map(|f| (si, f))),
            }
        }
        Ok(out)
    }

    /// Drops spare capacity of the runs in memory (after a rebuild).
    pub(crate) fn shrink(&mut self) {
        for r in &mut self.runs {
            if let Body::Mem(m) = &mut r.body {
                m.ids.shrink_to_fit();
                m.slots.shrink_to_fit();
                m.frames.shrink_to_fit();
                m.deletes.shrink_to_fit();
            }
        }
    }

    /// Entries the runs in memory have room for.
    pub(crate) fn capacity(&self) -> usize {
        self.runs
            .iter()
            .map(|r| match &r.body {
                Body::Mem(m) => m.ids.capacity(),
                Body::Disk(_) => 0,
            })
            .sum()
    }

    /// Bytes the index holds in memory: the runs in memory (20 B an entry, 16 B a frame, 8 B
    /// a delete), and for each sealed run its page directory and dead bits.
    pub(crate) fn bytes(&self) -> usize {
        self.runs
            .iter()
            .map(|r| match &r.body {
                Body::Mem(m) => {
                    m.ids.len() * 8
                        + m.slots.len() * std::mem::size_of::<Slot>()
                        + m.frames.len() * std::mem::size_of::<RunFrame>()
                        + m.deletes.len() * 8
                }
                Body::Disk(d) => d.run.bytes() + d.dead.len() * 8,
            })
            .sum()
    }

    /// Segment `si`'s run, when it is in memory.
    pub(crate) fn mem_run(&self, si: usize) -> Option<&MemRun> {
        match &self.runs.get(si)?.body {
            Body::Mem(m) => Some(m),
            Body::Disk(_) => None,
        }
    }

    /// Entries (creates, frames and deletes) of segment `si`'s run in memory (0 when sealed).
    pub(crate) fn mem_entries(&self, si: usize) -> usize {
        self.mem_run(si)
            .map_or(0, |m| m.ids.len() + m.frames.len() + m.deletes.len())
    }

    /// Whether segment `si`'s run is on disk.
    pub(crate) fn is_sealed(&self, si: usize) -> bool {
        matches!(self.runs.get(si).map(|r| &r.body), Some(Body::Disk(_)))
    }

    /// Puts the index file of segment `si` (sequence `seq`) in place, its dead bits from the
    /// `dead` file when that names this very run.
    pub(crate) fn load(&mut self, si: usize, seq: u64, run: DiskRun, dead: Option<&DeadFile>) {
        let (h, ident) = (run.header, run.ident);
        self.max_hi = self.max_hi.max(h.id_hi);
        let known = dead.and_then(|d| {
            let r = d
                .runs
                .iter()
                .find(|r| r.seq == seq && r.ident == u64::from(ident) && r.entries == h.entries)?;
            Some((d.covers_seq, r))
        });
        let mut body = DiskBody::new(run, seq.saturating_sub(1));
        if let Some((covers, r)) = known.filter(|(c, _)| *c >= seq) {
            body.dead = r.bits.clone();
            body.dead_count = r.count();
            body.dead_bytes = r.bytes;
            body.dead_by = r.by_seq;
            body.known_through = covers;
        }
        self.runs.truncate(si);
        self.runs.push(Run {
            seq,
            body: Body::Disk(Box::new(body)),
        });
    }

    /// Open: the deletes of sealed run `si` that its targets' dead bits do not reflect yet
    /// are applied. Returns each target's segment and the create's length, for the space
    /// accounting.
    pub(crate) fn replay_deletes(&mut self, si: usize) -> io::Result<Vec<(usize, u32)>> {
        let seq = self.runs[si].seq;
        let behind = self.runs[..=si].iter().any(|r| match &r.body {
            Body::Disk(d) => d.known_through < seq,
            Body::Mem(_) => r.seq < seq,
        });
        let Body::Disk(d) = &self.runs[si].body else {
            return Ok(Vec::new());
        };
        if !behind || d.run.header.deletes == 0 {
            return Ok(Vec::new());
        }
        let mut changed = Vec::new();
        for id in d.run.deletes()? {
            let Some((ti, _)) = self.find(id)? else {
                continue;
            };
            let covered = match &self.runs[ti].body {
                Body::Disk(t) => t.known_through >= seq,
                Body::Mem(_) => self.runs[ti].seq >= seq,
            };
            if !covered {
                if let Some(old) = self.remove_as(id, seq)? {
                    changed.push((old.seg as usize, old.len));
                }
            }
        }
        Ok(changed)
    }

    /// [`Index::remove`] by a delete in the segment of sequence `by` (open's replay: nothing
    /// is added to a run's delete list).
    fn remove_as(&mut self, id: u64, by: u64) -> io::Result<Option<Loc>> {
        let Some((si, hit)) = self.find(id)? else {
            return Ok(None);
        };
        let loc = self.loc_of(si, &hit);
        if !loc.is_live() {
            return Ok(None);
        }
        match (&mut self.runs[si].body, hit) {
            (Body::Mem(m), Hit::Mem(i)) => {
                m.slots[i].kill(by);
                m.live -= 1;
            }
            (Body::Disk(d), Hit::Disk(r, e)) => {
                d.set_dead(r, e.len, by);
                self.dead_dirty = true;
            }
            _ => {}
        }
        self.pending.push(Pending { id, by });
        Ok(Some(loc))
    }

    /// Writes the index file of segment `si` from its run in memory and puts the file in its
    /// place (the run leaves memory). `header` carries the segment's identity and space.
    pub(crate) fn seal(
        &mut self,
        storage: &std::sync::Arc<dyn Storage>,
        si: usize,
        seg: &Seg,
        mut header: RunHeader,
    ) -> io::Result<()> {
        let Some(m) = self.mem(si) else {
            return Ok(());
        };
        let entries: Vec<RunEntry> = m
            .ids
            .iter()
            .zip(&m.slots)
            .map(|(id, s)| RunEntry {
                id: *id,
                offset: s.offset,
                len: s.len,
            })
            .collect();
        header.entries = entries.len() as u64;
        header.frames = m.frames.len() as u64;
        header.deletes = m.deletes.len() as u64;
        header.id_hi = m.ids.last().copied().unwrap_or(0);
        if let (false, Some(f)) = (header.compacted, m.frames.last()) {
            header.lsn_lo = m.frames[0].lsn;
            header.lsn_hi = f.lsn;
        }
        let content = RunContent {
            header,
            entries: &entries,
            frames: &m.frames,
            deletes: &m.deletes,
        };
        runs::write(storage.as_ref(), &seg.path, &content)?;
        let opened = DiskRun::open(storage, seg).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("index file just written: {why}"),
            )
        })?;
        let Some(run) = opened else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "index file just written",
            ));
        };
        let seq = self.runs[si].seq;
        let Body::Mem(m) = std::mem::replace(&mut self.runs[si].body, Body::Mem(MemRun::default()))
        else {
            return Ok(());
        };
        let mut body = DiskBody::new(run, u64::MAX);
        for (rank, s) in m.slots.iter().enumerate() {
            if let Some(by) = s.dead_by() {
                body.set_dead(rank, s.len, by);
            }
        }
        self.runs[si] = Run {
            seq,
            body: Body::Disk(Box::new(body)),
        };
        Ok(())
    }

    /// Whether the `dead` file is behind the dead bits in memory.
    pub(crate) fn dead_dirty(&self) -> bool {
        self.dead_dirty
    }

    /// The `dead` file was written (or a cut removed it and a rebuild follows).
    pub(crate) fn dead_written(&mut self) {
        self.dead_dirty = false;
    }

    /// What the `dead` file may hold now: every sealed run's dead bits set by deletes in
    /// segments up to `covers_seq` (sealed, so durable). Forgets what it then holds.
    pub(crate) fn dead_file(&mut self, covers_seq: u64) -> io::Result<DeadFile> {
        let mut runs: Vec<DeadRun> = self
            .runs
            .iter()
            .filter_map(|r| match &r.body {
                Body::Disk(d) => Some(DeadRun {
                    seq: r.seq,
                    ident: u64::from(d.run.ident),
                    entries: d.run.header.entries,
                    bytes: d.dead_bytes,
                    by_seq: d.dead_by,
                    bits: d.dead.clone(),
                }),
                Body::Mem(_) => None,
            })
            .collect();
        self.pending.retain(|p| p.by > covers_seq);
        for p in &self.pending {
            let Some((si, Hit::Disk(rank, e))) = self.find(p.id)? else {
                continue;
            };
            let seq = self.runs[si].seq;
            if let Some(r) = runs.iter_mut().find(|r| r.seq == seq) {
                if let Some(w) = r.bits.get_mut(rank / 64) {
                    *w &= !(1 << (rank % 64));
                    r.bytes = r
                        .bytes
                        .saturating_sub(frame::op_bytes(e.len as usize) as u64);
                }
            }
        }
        Ok(DeadFile { covers_seq, runs })
    }

    /// The sequence of segment `si`.
    pub(crate) fn seq(&self, si: usize) -> Option<u64> {
        self.runs.get(si).map(|r| r.seq)
    }

    /// Bytes of the live creates of run `si` (`frame::op_bytes` each).
    pub(crate) fn live_bytes(&self, si: usize) -> u64 {
        match self.runs.get(si).map(|r| &r.body) {
            Some(Body::Mem(m)) => m
                .slots
                .iter()
                .filter(|s| s.dead_by().is_none())
                .map(|s| frame::op_bytes(s.len as usize) as u64)
                .sum(),
            _ => 0,
        }
    }

    /// The ids of the delete ops in the segments of runs `first..=last`.
    pub(crate) fn deletes_of(&self, first: usize, last: usize) -> io::Result<Vec<u64>> {
        let mut out = Vec::new();
        for run in self.runs.get(first..=last).unwrap_or(&[]) {
            match &run.body {
                Body::Mem(m) => out.extend_from_slice(&m.deletes),
                Body::Disk(d) => out.extend(d.run.deletes()?),
            }
        }
        Ok(out)
    }

    /// Every entry of runs `first..=last` (live or dead), in run order, for a compaction.
    pub(crate) fn entries_of(
        &self,
        first: usize,
        last: usize,
        mut f: impl FnMut(u64, Loc),
    ) -> io::Result<()> {
        for si in first..=last.min(self.runs.len().saturating_sub(1)) {
            match &self.runs[si].body {
                Body::Mem(m) => {
                    for (i, id) in m.ids.iter().enumerate() {
                        f(*id, self.loc_of(si, &Hit::Mem(i)));
                    }
                }
                Body::Disk(d) => d.run.for_each_entry(|rank, e| {
                    f(e.id, self.loc_of(si, &Hit::Disk(rank, e)));
                    Ok(())
                })?,
            }
        }
        Ok(())
    }

    /// Replaces the runs of segments `first..=last` with `run`, the run of the compacted
    /// segment that took their place (named after the last of them).
    pub(crate) fn splice(&mut self, first: usize, last: usize, run: MemRun) {
        let seq = self.runs.get(last).map_or(0, |r| r.seq);
        let new = Run {
            seq,
            body: Body::Mem(run),
        };
        let end = last.min(self.runs.len().saturating_sub(1));
        if first <= end {
            self.runs.splice(first..=end, [new]);
        }
    }

    /// The last transaction frame of segment `si`'s run in memory.
    pub(crate) fn last_frame(&self, si: usize) -> Option<RunFrame> {
        match &self.runs.get(si)?.body {
            Body::Mem(m) => m.frames.last().copied(),
            Body::Disk(_) => None,
        }
    }

    /// The largest id of run `si` in memory (0 when empty).
    pub(crate) fn max_entry_id(&self, si: usize) -> u64 {
        match self.runs.get(si).map(|r| &r.body) {
            Some(Body::Mem(m)) => m.ids.last().copied().unwrap_or(0),
            _ => 0,
        }
    }

    /// Bytes of the ops of every entry of run `si` in memory, live or dead.
    pub(crate) fn entry_bytes(&self, si: usize) -> u64 {
        match self.runs.get(si).map(|r| &r.body) {
            Some(Body::Mem(m)) => m
                .slots
                .iter()
                .map(|s| frame::op_bytes(s.len as usize) as u64)
                .sum(),
            _ => 0,
        }
    }

    /// Bytes of the dead entries' ops of sealed run `si`.
    pub(crate) fn dead_bytes(&self, si: usize) -> u64 {
        match self.runs.get(si).map(|r| &r.body) {
            Some(Body::Disk(d)) => d.dead_bytes,
            _ => 0,
        }
    }

    /// The first frame with an lsn at or past `lsn`: its segment index and place, the end of
    /// that segment's last frame, and how many frames there are from it on.
    pub(crate) fn first_frame_from(
        &self,
        lsn: u64,
    ) -> io::Result<Option<(usize, RunFrame, u32, u64)>> {
        let Some(si) = self
            .runs
            .iter()
            .position(|r| r.lsn_range().is_some_and(|(_, hi)| hi >= lsn))
        else {
            return Ok(None);
        };
        let frames = match &self.runs[si].body {
            Body::Mem(m) => m.frames.clone(),
            Body::Disk(d) => d.run.frames()?,
        };
        let Some(k) = frames.iter().position(|f| f.lsn >= lsn) else {
            return Ok(None);
        };
        let end = frames.iter().map(|f| f.offset + f.len).max().unwrap_or(0);
        let later: u64 = self.runs[si + 1..]
            .iter()
            .map(|r| match &r.body {
                Body::Mem(m) => m.frames.len() as u64,
                Body::Disk(d) => d.run.header.frames,
            })
            .sum();
        Ok(Some((
            si,
            frames[k],
            end,
            (frames.len() - k) as u64 + later,
        )))
    }
}

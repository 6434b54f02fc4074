//! A shard's in-memory index (`Index`): its ids sorted, each with where its create is on
//! disk (`Loc`), live, dead (deleted, its create still on disk) or gone. `docs/shard-format.md`.

/// Where a record's create is on disk. 12 bytes; with the u64 id, 20 bytes per record.
/// `seg` carries the state: a segment index (live), the index with `DEAD` set (deleted, but
/// its create is still on disk there: compaction must keep the delete that hides it), or
/// `GONE` (nothing on disk any more; the entry can be dropped). A dead record is never read,
/// so its `offset` holds the index of the segment whose frame deleted it instead: compaction
/// may drop the create only once that delete is vouched for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) seg: u32,
    pub(crate) offset: u32,
    pub(crate) len: u32,
}

pub(crate) const GONE: u32 = u32::MAX;
pub(crate) const DEAD: u32 = 1 << 31;

impl Loc {
    pub(crate) fn is_live(&self) -> bool {
        self.seg & DEAD == 0
    }
    pub(crate) fn is_gone(&self) -> bool {
        self.seg == GONE
    }
    /// The segment holding the create, live or dead; `None` when gone.
    pub(crate) fn on_disk_seg(&self) -> Option<usize> {
        (!self.is_gone()).then_some((self.seg & !DEAD) as usize)
    }
}

/// The in-memory index: ids sorted, with their locations in a parallel vector (8 + 12 = 20
/// bytes per record, no hash table overhead). Ids are minted in increasing order and a shard
/// applies transactions in lsn order, so inserts are appends. A delete marks the entry dead
/// and keeps where its create is: until compaction drops that create, the delete must stay
/// on disk too (`compact.rs`). Entries whose create is gone are dropped once they are half.
#[derive(Debug, Default)]
pub(crate) struct Index {
    ids: Vec<u64>,
    locs: Vec<Loc>,
    live: usize,
    gone: usize,
}

impl Index {
    pub(crate) fn clear(&mut self) {
        self.ids.clear();
        self.locs.clear();
        self.live = 0;
        self.gone = 0;
    }

    pub(crate) fn find(&self, id: u64) -> Result<usize, usize> {
        // Fast path: the newest id.
        match self.ids.last() {
            Some(last) if *last < id => Err(self.ids.len()),
            _ => self.ids.binary_search(&id),
        }
    }

    pub(crate) fn insert(&mut self, id: u64, loc: Loc) {
        match self.find(id) {
            Ok(i) => {
                if !self.locs[i].is_live() {
                    self.live += 1;
                }
                if self.locs[i].is_gone() {
                    self.gone -= 1;
                }
                self.locs[i] = loc;
            }
            Err(i) => {
                self.ids.insert(i, id);
                self.locs.insert(i, loc);
                self.live += 1;
            }
        }
    }

    /// Marks a live record dead by a delete in segment `by_seg`; returns where it was.
    pub(crate) fn remove(&mut self, id: u64, by_seg: usize) -> Option<Loc> {
        let i = self.find(id).ok()?;
        let loc = self.locs[i];
        if !loc.is_live() {
            return None;
        }
        self.locs[i].seg |= DEAD;
        self.locs[i].offset = by_seg as u32;
        self.live -= 1;
        Some(loc)
    }

    /// The entry for `id`, live or dead (`None` when absent or gone).
    pub(crate) fn entry(&self, id: u64) -> Option<Loc> {
        self.find(id)
            .ok()
            .map(|i| self.locs[i])
            .filter(|l| !l.is_gone())
    }

    /// Rewrites every entry's location (compaction moving and dropping creates); `f` returns
    /// the new location, or `GONE` in `seg`. Drops gone entries once they are half.
    pub(crate) fn relocate(&mut self, mut f: impl FnMut(u64, Loc) -> Loc) {
        for i in 0..self.ids.len() {
            let loc = self.locs[i];
            if loc.is_gone() {
                continue;
            }
            let new = f(self.ids[i], loc);
            if new.is_gone() {
                self.gone += 1;
                if loc.is_live() {
                    self.live -= 1;
                }
            }
            self.locs[i] = new;
        }
        if self.gone > 1024 && self.gone * 2 > self.ids.len() {
            self.compact();
        }
    }

    pub(crate) fn compact(&mut self) {
        let mut w = 0;
        for r in 0..self.ids.len() {
            if !self.locs[r].is_gone() {
                self.ids[w] = self.ids[r];
                self.locs[w] = self.locs[r];
                w += 1;
            }
        }
        self.ids.truncate(w);
        self.locs.truncate(w);
        self.gone = 0;
    }

    pub(crate) fn get(&self, id: u64) -> Option<Loc> {
        self.find(id)
            .ok()
            .map(|i| self.locs[i])
            .filter(Loc::is_live)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Live ids in increasing order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.ids
            .iter()
            .zip(&self.locs)
            .filter(|(_, l)| l.is_live())
            .map(|(id, _)| *id)
    }

    /// Drops gone entries and spare capacity (after a rebuild).
    pub(crate) fn shrink(&mut self) {
        self.compact();
        self.ids.shrink_to_fit();
        self.locs.shrink_to_fit();
    }

    pub(crate) fn capacity(&self) -> usize {
        self.ids.capacity()
    }

    /// Bytes of the entries held: what is resident. The room a table keeps for growth is
    /// never touched until used, so it is address space, not memory.
    pub(crate) fn bytes(&self) -> usize {
        self.ids.len() * std::mem::size_of::<u64>() + self.locs.len() * std::mem::size_of::<Loc>()
    }
}

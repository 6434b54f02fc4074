//! The planner's state, guarded by the engine's planner lock: the request keys the WAL still
//! answers, the id counter, the overlays of ids planned but not yet applied, the claims
//! whose `done` is not known durable (by spool name, and open for the next checkpoint), and
//! what each shard's `done` records vouch for. Planning, claims and recovery change it
//! under that lock (`claim_lock.rs`); it never writes a file.

use std::collections::{BTreeMap, HashMap, HashSet};

use roost_wal::Lsn;

use super::keys::{KeyAt, KeyState, KeyWindow};
use super::records::{Checkpoint, ClaimLedger, ClaimRecord, PlannedOp, WalEntry};
use super::round_queue::Waiting;
use super::shard_set::ShardSet;
use super::tails::Tails;
use crate::batch::{Batch, BatchOp};
use crate::error::EngineError;

/// Ids planned but not yet committed, per shard: planning sees committed state plus these.
#[derive(Default)]
struct Overlay {
    created: HashSet<u64>,
    deleted: HashSet<u64>,
}

impl Overlay {
    /// The shard applied a create (`created`) or a delete of `id`: the shard says from now
    /// on. A delete also takes the id out of `created`, where an earlier create's batch may
    /// still have left it (waiting on another of its shards): otherwise a later delete of
    /// the same id would plan as if it still existed. Ids are never reused.
    fn applied(&mut self, id: u64, created: bool) {
        if !created {
            self.deleted.remove(&id);
        }
        self.created.remove(&id);
    }
}

/// What the planner lock guards: the request keys, the id counter, the overlays.
pub(super) struct Planner {
    pub(super) keys: HashMap<String, KeyState>,
    pub(super) next_id: u64,
    overlay: HashMap<String, Overlay>,
    /// Claims whose `done` is not known durable, by spool name (`names.rs`).
    pub(super) tails: Tails,
    /// Claims without a `done` record yet, each with the audit log's next lsn when it was
    /// made (its rows come after): the next checkpoint stops below the first.
    pub(super) open: BTreeMap<Lsn, Lsn>,
    /// Per shard, the largest claim lsn with a `done` record: every frame up to it flushed.
    pub(super) vouched: HashMap<String, Lsn>,
    /// The last claim this planner made: its lsn and the id after its ids (checked by
    /// `invariants::claim_follows`).
    pub(super) last_claim: (Lsn, u64),
}

impl Planner {
    pub(super) fn new() -> Planner {
        Planner {
            keys: HashMap::new(),
            next_id: 1,
            overlay: HashMap::new(),
            tails: Tails::default(),
            open: BTreeMap::new(),
            vouched: HashMap::new(),
            last_claim: (0, 0),
        }
    }

    /// What the planner knows of `key`: the map (keys the WAL still answers), else the
    /// index on disk (`keys`). A checkpoint adds a key's run before it takes the key out of
    /// the map, so a key is always in one or the other.
    pub(super) fn key(&self, keys: &KeyWindow, key: &str) -> Result<Option<KeyState>, EngineError> {
        match self.keys.get(key) {
            Some(k) => Ok(Some(*k)),
            None => keys.indexed(key),
        }
    }

    /// Whether `id` exists on `shard` by the planned overlays (`None`: they do not say, the
    /// shard's committed state does).
    fn planned(&self, shard: &str, id: u64) -> Option<bool> {
        let o = self.overlay.get(shard)?;
        if o.deleted.contains(&id) {
            return Some(false);
        }
        o.created.contains(&id).then_some(true)
    }

    /// Walks the deletes of `batch` up to `limit` in order against committed state
    /// (`shards`) plus the planned overlays: the first that names an id that does not
    /// exist, and why.
    pub(super) fn missing_delete(
        &self,
        shards: &ShardSet,
        batch: &Batch,
        limit: usize,
    ) -> Result<Option<(usize, String)>, EngineError> {
        let mut deleted_here: HashSet<(&str, u64)> = HashSet::new();
        for (i, op) in batch.ops[..limit].iter().enumerate() {
            if let BatchOp::Delete { shard, id } = op {
                let exists = match self.planned(shard, *id) {
                    Some(planned) => planned,
                    None => shards.holds(shard, *id)?,
                } && !deleted_here.contains(&(shard.as_str(), *id));
                if !exists {
                    return Ok(Some((
                        i,
                        format!("id {id} does not exist on shard {shard}"),
                    )));
                }
                deleted_here.insert((shard, *id));
            }
        }
        Ok(None)
    }

    /// The claim appended at `lsn` (WAL `offset`), registered: the overlays of the ids it
    /// creates and deletes, its key, its name's claim and where the audit log stood
    /// (`audit_mark`: its rows come after).
    pub(super) fn register(&mut self, lsn: Lsn, offset: u64, claim: &ClaimRecord, audit_mark: Lsn) {
        for op in &claim.ops {
            // Looked up before an entry is made: no name copied per op once the shard has one.
            if !self.overlay.contains_key(op.shard()) {
                self.overlay
                    .insert(op.shard().to_owned(), Overlay::default());
            }
            let Some(o) = self.overlay.get_mut(op.shard()) else {
                continue;
            };
            match op {
                PlannedOp::Create { id, .. } => o.created.insert(*id),
                PlannedOp::Delete { id, .. } => o.deleted.insert(*id),
            };
        }
        let key = KeyState {
            lsn,
            fingerprint: claim.fingerprint,
            done: false,
            rejected: false,
            at: KeyAt::Wal { offset },
        };
        self.keys.insert(claim.request_key.clone(), key);
        self.tails.claimed(&claim.source, lsn);
        self.open.insert(lsn, audit_mark);
    }

    /// The claims' keys answer duplicates from now on: their answers are given, and every
    /// one of them is rebuilt from its durable claim (`committed_result`).
    pub(super) fn mark_answered(&mut self, claims: &[(Lsn, &ClaimRecord)]) {
        for (_, c) in claims {
            if let Some(k) = self.keys.get_mut(&c.request_key) {
                k.done = true;
            }
        }
    }

    /// The shards hold these batches' ops now (each touched shard's name and the ids its
    /// transaction creates or deletes): planning no longer needs their overlays.
    pub(super) fn applied<'t>(
        &mut self,
        touched: impl Iterator<Item = (&'t str, &'t [(u64, bool)])>,
    ) {
        for (name, ids) in touched {
            let Some(o) = self.overlay.get_mut(name) else {
                continue;
            };
            for &(id, created) in ids {
                o.applied(id, created);
            }
        }
    }

    /// The claim `c` is settled and its `done` record appended at `done`: a checkpoint may
    /// pass it, a later batch under its spool name may be answered once the `done` is
    /// durable, and every frame of its shards up to its lsn is flushed (they apply in lsn
    /// order). The caller wakes the waiters once the lock is released.
    pub(super) fn close(&mut self, c: &Waiting, done: Lsn) {
        self.tails.done(&c.source, c.lsn, done);
        for (name, _) in &c.shards {
            match self.vouched.get_mut(name) {
                Some(v) => *v = (*v).max(c.lsn),
                None => {
                    self.vouched.insert(name.clone(), c.lsn);
                }
            }
        }
        self.open.remove(&c.lsn);
    }

    /// One replayed (or, on a standby, fetched) WAL record into the planner: keys, the id
    /// counter, open claims (with `audit_mark`, the audit lsn their rows come after) and the
    /// ledger of claims without a `done`.
    pub(super) fn absorb(
        &mut self,
        ledger: &mut ClaimLedger,
        lsn: Lsn,
        at: KeyAt,
        entry: WalEntry,
        audit_mark: Lsn,
    ) -> Result<(), EngineError> {
        match entry {
            WalEntry::Claim(c) => {
                for op in &c.ops {
                    if let PlannedOp::Create { id, .. } = op {
                        self.next_id = self.next_id.max(id + 1);
                    }
                }
                let key = KeyState {
                    lsn,
                    fingerprint: c.fingerprint,
                    done: false,
                    rejected: false,
                    at,
                };
                self.keys.insert(c.request_key.clone(), key);
                self.open.insert(lsn, audit_mark);
                ledger.claim(lsn, c);
            }
            WalEntry::Done(d) => {
                self.open.remove(&d.claim_lsn);
                if let Some(c) = ledger.done_after(lsn, &d)? {
                    if let Some(k) = self.keys.get_mut(&c.request_key) {
                        k.done = true;
                    }
                }
            }
            WalEntry::Rejected(r) => {
                let key = KeyState {
                    lsn,
                    fingerprint: r.fingerprint,
                    done: true,
                    rejected: true,
                    at,
                };
                self.keys.insert(r.request_key, key);
            }
        }
        Ok(())
    }

    /// At open, from the last checkpoint: the id counter and each shard's flushed mark.
    pub(super) fn resume_from(&mut self, c: &Checkpoint) {
        self.next_id = self.next_id.max(c.next_id);
        self.vouched = c.shards.iter().cloned().collect();
    }

    /// A checkpoint's step 3 (`checkpoint.rs`): keys whose batch is below `wal_from` leave
    /// the map (a key a newer batch took stays): the index answers them from now on. Every
    /// batch below `wal_from` is finished and its key is in the table and its index: the
    /// keys this checkpoint moved, and those an earlier checkpoint copied and indexed before
    /// a crash kept its `CHECKPOINT` from being written (the replay put them back in the
    /// map; their WAL goes next).
    pub(super) fn forget_below(&mut self, wal_from: Lsn) {
        self.keys.retain(|_, k| k.lsn >= wal_from);
        if self.keys.capacity() > 4 * self.keys.len().max(1024) {
            self.keys.shrink_to_fit(); // give back what a burst between checkpoints took
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Overlay;

    #[test]
    fn an_applied_delete_takes_the_id_out_of_a_create_still_in_the_overlay() {
        // Batch 1 created 100 (applied on this shard, its overlay kept while it waits on
        // another shard); batch 2 deleted 100 and was applied here: 100 exists no more.
        let mut o = Overlay::default();
        o.created.insert(100);
        o.deleted.insert(100);
        o.applied(100, false);
        assert!(!o.created.contains(&100) && !o.deleted.contains(&100));
        // Batch 1's own clearing afterwards changes nothing.
        o.applied(100, true);
        assert!(o.created.is_empty() && o.deleted.is_empty());
        // A delete planned but not applied yet still hides a create already applied.
        o.created.insert(7);
        o.deleted.insert(7);
        o.applied(7, true);
        assert!(o.deleted.contains(&7) && !o.created.contains(&7));
    }
}

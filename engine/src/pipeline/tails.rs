//! The claims under each spool name whose `done` record is not known durable yet: what a
//! reused name waits for before its answer goes out (`names.rs` says why). Only the
//! bookkeeping; it knows nothing of the engine.

use std::collections::{BTreeMap, VecDeque};

use roost_wal::Lsn;

/// Claims whose `done` record is not known durable, by spool name.
#[derive(Debug, Default)]
pub(super) struct Tails {
    /// Per name: claim lsn -> its `done` record's lsn once appended.
    by_name: BTreeMap<String, BTreeMap<Lsn, Option<Lsn>>>,
    /// (done lsn, name, claim lsn) in append order, to forget entries once synced.
    appended: VecDeque<(Lsn, String, Lsn)>,
}

impl Tails {
    pub(super) fn claimed(&mut self, name: &str, claim: Lsn) {
        self.by_name
            .entry(name.to_owned())
            .or_default()
            .insert(claim, None);
    }

    pub(super) fn done(&mut self, name: &str, claim: Lsn, done: Lsn) {
        if let Some(e) = self.by_name.get_mut(name).and_then(|m| m.get_mut(&claim)) {
            *e = Some(done);
            self.appended.push_back((done, name.to_owned(), claim));
        }
    }

    /// Forgets every claim whose `done` is at or below `synced`.
    pub(super) fn forget_synced(&mut self, synced: Lsn) {
        while let Some((done, _, _)) = self.appended.front() {
            if *done > synced {
                break;
            }
            let Some((_, name, claim)) = self.appended.pop_front() else {
                break;
            };
            if let Some(m) = self.by_name.get_mut(&name) {
                m.remove(&claim);
                if m.is_empty() {
                    self.by_name.remove(&name);
                }
            }
        }
    }

    /// Claims under `name` earlier than `own` (all of them without one): `Ok(largest done
    /// lsn)` when all have one (0 when none is left), `Err(())` while some has not appended
    /// its `done` yet. Only earlier claims: two batches under one name never wait for each
    /// other.
    pub(super) fn others(&self, name: &str, own: Option<Lsn>) -> Result<Lsn, ()> {
        let mut max = 0;
        let before = own.unwrap_or(Lsn::MAX);
        for (claim, done) in self.by_name.get(name).into_iter().flatten() {
            if *claim >= before {
                break;
            }
            max = max.max(done.ok_or(())?);
        }
        Ok(max)
    }
}

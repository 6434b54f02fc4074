//! `shards_max` (issue 25, item 3): a client that can write to the spool may name any valid
//! shard, and every new shard costs a directory, segment files and the owner's time, so the
//! planner refuses a batch that would create a shard past the limit. This module keeps the
//! set of shards that exist (on disk, or opened since) and answers, under the planner lock,
//! which op of a batch would create one too many. It never creates or opens a shard.
//!
//! A shard counts once its directory exists or an owner opened it: a claim opens every shard
//! it touches under the planner lock (`ShardSet::slot`, which calls [`KnownShards::note`]), so
//! a shard planned by an earlier batch, even in the same group, is counted before the next
//! batch is planned. A rejected batch opens nothing.

use std::collections::HashSet;
use std::path::Path;

use roost_storage::Storage;

use crate::batch::{Batch, BatchOp};

/// The shards that exist, as far as the limit is concerned. `None` until the engine has
/// recovered ([`KnownShards::fill`]); [`KnownShards::note`] keeps it current afterwards.
#[derive(Default)]
pub(super) struct KnownShards {
    names: Option<HashSet<String>>,
}

impl KnownShards {
    /// Starts the set from what exists after recovery: the directories under `shards/` (on
    /// a real disk), the shards recovery knows flushed frames of, and the shards open now.
    pub fn fill(&mut self, listed: impl IntoIterator<Item = String>) {
        let names = self.names.get_or_insert_with(HashSet::new);
        names.extend(listed);
    }

    /// How many shards exist (0 before recovery filled the set).
    pub fn count(&self) -> usize {
        self.names.as_ref().map_or(0, HashSet::len)
    }

    /// The shards that exist (none before recovery filled the set).
    pub fn names(&self) -> Vec<String> {
        self.names
            .as_ref()
            .map_or_else(Vec::new, |n| n.iter().cloned().collect())
    }

    /// A shard was opened (created, if it was new).
    pub fn note(&mut self, name: &str) {
        if let Some(names) = &mut self.names {
            if !names.contains(name) {
                names.insert(name.to_owned());
            }
        }
    }

    /// The first op before `limit` that names a shard which does not exist yet when the
    /// shards that exist plus those this batch would create before it already number
    /// `shards_max`, and why (the reason names the limit).
    pub fn first_over(
        &self,
        batch: &Batch,
        limit: usize,
        shards_max: usize,
    ) -> Option<(usize, String)> {
        let names = self.names.as_ref()?;
        let mut new_here: Vec<&str> = Vec::new();
        for (i, op) in batch.ops[..limit].iter().enumerate() {
            let shard = match op {
                BatchOp::Create { shard, .. } | BatchOp::Delete { shard, .. } => shard.as_str(),
            };
            if names.contains(shard) || new_here.contains(&shard) {
                continue;
            }
            let nth = names.len() + new_here.len() + 1;
            if nth > shards_max {
                let reason =
                    format!("shard {shard:?} would be shard {nth}, past shards_max = {shards_max}");
                return Some((i, reason));
            }
            new_here.push(shard);
        }
        None
    }
}

/// The directories under `shards` (the simulated disk's included); an unreadable or missing
/// directory lists nothing (the engine created it at open, and the shards opened since are
/// noted anyway).
pub(super) fn listed_shard_dirs(storage: &dyn Storage, shards: &Path) -> Vec<String> {
    let Ok(names) = storage.list_dirs(shards) else {
        return Vec::new();
    };
    names
        .into_iter()
        .filter(|n| crate::batch::valid_shard_name(n))
        .collect()
}

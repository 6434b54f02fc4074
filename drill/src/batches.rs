//! The drills' batches (`roost drill` and `roost drill --replicated` share them): creates over
//! four shards, deletes of ids believed live, now and then a delete of an id that never
//! existed (the batch must be rejected), and one file in ten a retry of an earlier batch (same
//! key, same content, new file name). Every draw comes from one seeded `SplitMix`, so the same
//! seed gives the same batches. The one-node drill's streamed batches and bulk-file lines
//! (`stream`, `bulk`) and the cluster drill's probe batches (creates only) are built here too.

use std::collections::BTreeMap;

use roost_storage::SplitMix;
use serde_json::{json, Value};

use super::setup::SHARDS;
use crate::spool::SpoolPaths;

/// One submitted batch (a file, a streamed batch or a bulk-file line) and what the drill
/// expects of it.
#[derive(Clone, Debug)]
pub(super) struct Sent {
    pub name: String,
    pub key: String,
    /// Another batch with the same key and content (by `name`), whose result this one must
    /// equal.
    pub retry_of: Option<String>,
    pub expect_rejected: bool,
}

/// The batches sent so far, and the random source of the whole drill.
pub(super) struct Batches {
    pub rng: SplitMix,
    pub sent: Vec<Sent>,
    /// Key and body of every original batch, for retries.
    pub bodies: Vec<(String, Vec<u8>)>,
    /// Ids the drill believes live (from committed results it has read), for deletes.
    pub live: BTreeMap<u64, &'static str>,
    seed: u64,
}

impl Batches {
    pub fn new(seed: u64) -> Batches {
        Batches {
            rng: SplitMix(seed),
            sent: Vec::new(),
            bodies: Vec::new(),
            live: BTreeMap::new(),
            seed,
        }
    }

    /// The content of the batch sent under `key` (a retry's is its original's).
    pub fn body_of(&self, key: &str) -> Option<&[u8]> {
        self.bodies
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, b)| b.as_slice())
    }

    /// Drops batch `i` as `bNNNNNN.json` into `sp`: one time in ten a retry of an earlier
    /// batch (same key, same content, new file), otherwise a new one.
    pub fn send(&mut self, sp: &SpoolPaths, i: usize) -> anyhow::Result<()> {
        let name = format!("b{i:06}.json");
        if self.rng.below(10) == 0 {
            if let Some((key, body, orig)) = self.pick_retry() {
                crate::spool::deliver(sp, &name, &body)?;
                self.sent.push(Sent {
                    name,
                    key,
                    retry_of: orig,
                    expect_rejected: false,
                });
                return Ok(());
            }
        }
        let key = format!("drill-{}-{i}", self.seed);
        let (ops, expect_rejected) = self.new_ops(&key);
        let body = serde_json::to_vec(&json!({"request_key": key, "ops": ops}))?;
        crate::spool::deliver(sp, &name, &body)?;
        self.bodies.push((key.clone(), body));
        self.sent.push(Sent {
            name,
            key,
            retry_of: None,
            expect_rejected,
        });
        Ok(())
    }

    /// An earlier file's batch to send again: its key, its content, and the name of the
    /// file that first sent it. `None` before any batch file was sent.
    pub fn pick_retry(&mut self) -> Option<(String, Vec<u8>, Option<String>)> {
        if self.bodies.is_empty() {
            return None;
        }
        let k = self.rng.below(self.bodies.len() as u64) as usize;
        let (key, body) = self.bodies.get(k)?.clone();
        let orig = self
            .sent
            .iter()
            .find(|s| s.key == key && s.retry_of.is_none())
            .map(|s| s.name.clone());
        Some((key, body, orig))
    }

    /// A new batch for the stream (`stream.rs`) or a bulk-file line (`bulk.rs`), never sent
    /// again as a batch file's retry: its key, its JSON, and whether it is meant to be
    /// rejected.
    pub fn fresh(&mut self, tag: &str) -> anyhow::Result<(String, Vec<u8>, bool)> {
        let key = format!("drill-{}-{tag}", self.seed);
        let (ops, expect_rejected) = self.new_ops(&key);
        let body = serde_json::to_vec(&json!({"request_key": key, "ops": ops}))?;
        Ok((key, body, expect_rejected))
    }

    /// One to three ops: creates over the shards, deletes of ids believed live, and now and
    /// then a delete of an id that never existed, which rejects the batch.
    fn new_ops(&mut self, key: &str) -> (Vec<Value>, bool) {
        let nops = 1 + self.rng.below(3) as usize;
        let mut ops = Vec::new();
        let mut expect_rejected = false;
        for k in 0..nops {
            let r = self.rng.below(10);
            if r < 2 && !self.live.is_empty() {
                let pick = self.rng.below(self.live.len() as u64) as usize;
                if let Some((&id, &shard)) = self.live.iter().nth(pick) {
                    self.live.remove(&id);
                    ops.push(json!({"op": "delete", "shard": shard, "id": id}));
                    continue;
                }
            }
            if r == 2 {
                expect_rejected = true;
                ops.push(json!({"op": "delete", "shard": SHARDS[0], "id": 1u64 << 60}));
                continue;
            }
            ops.push(self.create_op(key, k));
        }
        (ops, expect_rejected)
    }

    /// A new batch of one to three creates, nothing that could be rejected (the cluster
    /// drill's probe, `probe.rs`, whose every answer from a serving leader is `committed`):
    /// its key and its JSON.
    pub fn fresh_creates(&mut self, tag: &str) -> anyhow::Result<(String, Vec<u8>)> {
        let key = format!("drill-{}-{tag}", self.seed);
        let nops = 1 + self.rng.below(3) as usize;
        let ops: Vec<Value> = (0..nops).map(|k| self.create_op(&key, k)).collect();
        let body = serde_json::to_vec(&json!({"request_key": key, "ops": ops}))?;
        Ok((key, body))
    }

    /// Op `k` of batch `key`: a create on a random shard, its record naming the batch.
    fn create_op(&mut self, key: &str, k: usize) -> Value {
        let shard = SHARDS[self.rng.below(SHARDS.len() as u64) as usize];
        json!({"op": "create", "shard": shard, "record": {"drill": key, "op": k}})
    }
}

//! The power-cut harness's client: streams batches into the spool with
//! [`roost::spool::deliver`] (creates with a unique tag, deletes of ids it got back, repeats
//! of earlier batches under new names) and records every result it has read from `out/`:
//! what it read is what was acknowledged. It never writes anything but spool files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use roost::spool::{deliver, SpoolPaths};
use roost_storage::SplitMix;
use serde_json::{json, Value};

pub const SHARDS: [&str; 2] = ["a", "b"];
/// Files delivered and not yet answered, at most.
const PENDING_MAX: usize = 8;

/// One delivered file.
#[derive(Clone)]
pub struct Sent {
    pub key: String,
    pub body: Vec<u8>,
    /// The file this one repeats (same key, same content), if any.
    pub repeat_of: Option<String>,
}

/// Everything the client did, across all cuts: kept by the test, lent to each run.
#[derive(Default)]
pub struct Ledger {
    /// Every file whose delivery returned, by spool name.
    pub sent: BTreeMap<String, Sent>,
    /// Every result read from `out/`, by spool name: the acknowledged answers.
    pub acked: BTreeMap<String, Value>,
    /// Ids of committed creates that no batch sent so far deletes: (shard, id).
    pub live: Vec<(String, u64)>,
    /// Names sent and not yet answered.
    pub pending: Vec<String>,
    /// Acknowledged names already resubmitted after a cut (each is resubmitted once).
    pub resubmitted: BTreeSet<String>,
    pub seq: u64,
}

pub struct Client {
    pub spool: SpoolPaths,
    pub rng: SplitMix,
}

impl Client {
    /// Streams until `stop` is set or `limit` passes. Returns the results read in this run.
    pub fn run(&mut self, ledger: &mut Ledger, stop: &AtomicBool, limit: Duration) -> usize {
        let until = Instant::now() + limit;
        let mut read = 0;
        while !stop.load(Ordering::Acquire) && Instant::now() < until {
            if ledger.pending.len() < PENDING_MAX {
                self.send_one(ledger);
            }
            let got = poll(&self.spool.out, ledger);
            read += got;
            if got == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        read
    }

    fn send_one(&mut self, ledger: &mut Ledger) {
        ledger.seq += 1;
        let name = format!("b{:06}.json", ledger.seq);
        let originals: Vec<&String> = ledger
            .sent
            .iter()
            .filter(|(_, s)| s.repeat_of.is_none())
            .map(|(n, _)| n)
            .collect();
        let sent = if !originals.is_empty() && self.rng.below(10) == 0 {
            let of = originals[self.rng.below(originals.len() as u64) as usize].clone();
            let o = &ledger.sent[&of];
            Sent {
                key: o.key.clone(),
                body: o.body.clone(),
                repeat_of: Some(of),
            }
        } else {
            self.new_batch(ledger)
        };
        deliver(&self.spool, &name, &sent.body)
            .unwrap_or_else(|e| panic!("delivering {name}: {e}"));
        ledger.sent.insert(name.clone(), sent);
        ledger.pending.push(name);
    }

    /// 1 to 3 ops: a delete of a live id (1 in 5, when there is one) or a create with a tag
    /// no other create carries.
    fn new_batch(&mut self, ledger: &mut Ledger) -> Sent {
        let key = format!("k{}", ledger.seq);
        let n = 1 + self.rng.below(3);
        let mut ops = Vec::new();
        for k in 0..n {
            if !ledger.live.is_empty() && self.rng.below(5) == 0 {
                let i = self.rng.below(ledger.live.len() as u64) as usize;
                let (shard, id) = ledger.live.swap_remove(i);
                ops.push(json!({"op": "delete", "shard": shard, "id": id}));
            } else {
                let shard = SHARDS[self.rng.below(2) as usize];
                let tag = format!("{key}.{k}");
                ops.push(json!({"op": "create", "shard": shard, "record": {"tag": tag}}));
            }
        }
        let body = serde_json::to_vec(&json!({"request_key": key, "ops": ops}))
            .expect("a batch serializes");
        Sent {
            key,
            body,
            repeat_of: None,
        }
    }
}

/// Reads the results of pending files that have one; returns how many.
fn poll(out: &Path, ledger: &mut Ledger) -> usize {
    let mut got = 0;
    let pending = std::mem::take(&mut ledger.pending);
    for name in pending {
        match std::fs::read(out.join(&name)) {
            Ok(bytes) => {
                let v: Value = serde_json::from_slice(&bytes)
                    .unwrap_or_else(|e| panic!("result {name} is not JSON: {e}"));
                learn(ledger, &name, &v);
                ledger.acked.insert(name, v);
                got += 1;
            }
            Err(_) => ledger.pending.push(name),
        }
    }
    got
}

/// A committed original create's id becomes a candidate for a later delete.
pub fn learn(ledger: &mut Ledger, name: &str, result: &Value) {
    let original = ledger.sent.get(name).is_some_and(|s| s.repeat_of.is_none());
    if !original || result["status"] != "committed" || ledger.acked.contains_key(name) {
        return;
    }
    for op in result["ops"].as_array().into_iter().flatten() {
        if let (Some("create"), Some(shard), Some(id)) =
            (op["op"].as_str(), op["shard"].as_str(), op["id"].as_u64())
        {
            ledger.live.push((shard.to_string(), id));
        }
    }
}

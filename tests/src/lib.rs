//! Harness for the pipeline proofs: runs the real engine over the simulated disk, crashes it
//! at named points, recovers, and checks the invariants of `RoostApplyBatch.tla` on the files
//! (through `roost verify`'s checks plus a model of the expected shard contents).
#![forbid(unsafe_code)]
// A test harness: a panic is how a proof fails (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roost::batch::{self, Batch, BatchResult, Status};
use roost::config::Config;
use roost::error::EngineError;
use roost::layout::{AUDIT_DIR, SHARDS_DIR, WAL_DIR};
use roost::ops::verify::offline_wal_options;
use roost::pipeline::crash::{CrashHook, NoCrash, NthCrash};
use roost::pipeline::records::{read_audit, read_wal, AuditRecord, WalEntry};
pub use roost::pipeline::Deliver;
use roost::pipeline::{one_answer, Engine, EngineOptions};
use roost_shards::{Shard, ShardOptions};
use roost_storage::{SimStorage, Storage};
use roost_wal::{Lsn, Wal};

pub const DATA: &str = "/sim/data";

/// One batch alone through the one way in (`Engine::submit`, a group of one): most tests
/// drive a batch at a time.
pub trait SubmitOne {
    /// As spool file `new/NAME`: its result published as `out/NAME`, the input removed.
    fn one_file(&self, batch: &Batch, name: &str) -> Result<BatchResult, EngineError>;
    /// As a detached batch (`bulk/NAME/LINE`, `stream/CONN/N`): the answer only returned.
    fn one_detached(&self, batch: &Batch, source: &str) -> Result<BatchResult, EngineError>;
}

impl SubmitOne for Engine {
    fn one_file(&self, batch: &Batch, name: &str) -> Result<BatchResult, EngineError> {
        one_answer(self.submit(&[(batch, name)], Deliver::Files)?)
    }

    fn one_detached(&self, batch: &Batch, source: &str) -> Result<BatchResult, EngineError> {
        one_answer(self.submit(&[(batch, source)], Deliver::Returned)?)
    }
}

pub fn data_dir() -> PathBuf {
    PathBuf::from(DATA)
}

pub fn open_engine(disk: &SimStorage, crash: Arc<dyn CrashHook>) -> Result<Engine, EngineError> {
    open_engine_on(Arc::new(disk.clone()), crash)
}

/// The configuration of [`open_engine`]: small segments and limits.
pub fn test_config() -> Config {
    Config {
        data_dir: data_dir(),
        wal_segment_bytes: 64 << 10,
        shard_segment_bytes: 16 << 10,
        spool_file_bytes_max: 16 << 10,
        batch_ops_max: 16,
        ..Config::default()
    }
}

/// `c` made node "a" of a cluster of `members` (an etcd that is never reached: the engine
/// alone does not talk to it), replicating on a port never listened on.
pub fn cluster_node_a(c: &mut Config, members: &[&str]) {
    c.replication.name = Some("a".into());
    c.replication.listen = Some("127.0.0.1:9".into());
    c.replication.members = members.iter().map(|m| m.to_string()).collect();
    c.cluster = Some(roost::config::ClusterConfig {
        etcd: vec!["http://127.0.0.1:9".into()],
        name: Some("a".into()),
        advertise: "127.0.0.1:9".into(),
        lease_ms: 3000,
        prefix: "/roost/test".into(),
        etcd_ca: None,
        etcd_cert: None,
        etcd_key: None,
    });
}

/// [`open_engine`] with `tune` applied to the test configuration.
pub fn open_engine_with(
    disk: &SimStorage,
    crash: Arc<dyn CrashHook>,
    tune: impl FnOnce(&mut Config),
) -> Result<Engine, EngineError> {
    let mut cfg = test_config();
    tune(&mut cfg);
    Engine::open(EngineOptions {
        storage: Arc::new(disk.clone()),
        config: Arc::new(cfg),
        crash,
        log_role: Arc::new(roost::replica::Opener::default()),
    })
}

/// [`open_engine`] over any storage (a simulated disk wrapped to add faults or latency).
pub fn open_engine_on(
    storage: Arc<dyn Storage>,
    crash: Arc<dyn CrashHook>,
) -> Result<Engine, EngineError> {
    Engine::open(EngineOptions {
        storage,
        config: Arc::new(test_config()),
        crash,
        log_role: Arc::new(roost::replica::Opener::default()),
    })
}

/// The result a client can see on `disk` for spool file `name`, if any: what roost has
/// acknowledged. A visible result file that is not whole JSON is an error.
pub fn visible_result(disk: &SimStorage, name: &str) -> Result<Option<BatchResult>, String> {
    let path = data_dir().join("spool").join("out").join(name);
    match disk.file_bytes(&path) {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("out/{name} is visible but not a whole result ({e}): {bytes:?}")),
    }
}

/// Opens, submits `batch` as spool file `name`, runs the durability round, drops the engine.
pub fn run_batch(
    disk: &SimStorage,
    crash: Arc<dyn CrashHook>,
    batch: &Batch,
    name: &str,
) -> Result<BatchResult, EngineError> {
    let e = open_engine(disk, crash)?;
    let r = e.one_file(batch, name)?;
    // The durability round the serve loop would run once the batch waited for it
    // (`tail_round_ms`): its shards flushed, the audit log synced, its `done` record.
    e.settle()?;
    Ok(r)
}

/// A batch under `key` that creates one record on each of `shards`, `{"key":..,"shard":..}`.
pub fn create_on(key: &str, shards: &[&str]) -> serde_json::Value {
    let ops: Vec<serde_json::Value> = shards
        .iter()
        .map(
            |s| serde_json::json!({"op": "create", "shard": s, "record": {"key": key, "shard": s}}),
        )
        .collect();
    serde_json::json!({"request_key": key, "ops": ops})
}

pub fn parse(v: &serde_json::Value) -> Batch {
    batch::parse(&serde_json::to_vec(v).expect("json"), 100).expect("valid batch")
}

/// Every live record of every shard: shard -> id -> record bytes.
pub type Contents = BTreeMap<String, BTreeMap<u64, Vec<u8>>>;

pub fn contents(disk: &SimStorage, shards: &[&str]) -> Contents {
    let storage: Arc<dyn Storage> = Arc::new(disk.clone());
    shards
        .iter()
        .map(|s| {
            let dir = data_dir().join(SHARDS_DIR).join(s);
            let sh = Shard::open_with(
                storage.clone(),
                &dir,
                ShardOptions {
                    read_only: true,
                    ..ShardOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("shard {s}: {e}"));
            (
                s.to_string(),
                sh.scan().expect("scan").into_iter().collect(),
            )
        })
        .collect()
}

/// Every record of the batch WAL under `data`, decoded, read-only; panics on damage.
pub fn wal_entries(storage: Arc<dyn Storage>, data: &Path) -> Vec<(Lsn, WalEntry)> {
    let wal = Wal::open_with(storage, data.join(WAL_DIR), offline_wal_options()).expect("open wal");
    read_wal(&wal, 1).map(|e| e.expect("wal record")).collect()
}

/// Every row of the audit log under `data`, with its lsn there, read-only; panics on damage.
pub fn audit_rows(storage: Arc<dyn Storage>, data: &Path) -> Vec<(Lsn, AuditRecord)> {
    let log =
        Wal::open_with(storage, data.join(AUDIT_DIR), offline_wal_options()).expect("open audit");
    read_audit(&log, 1).map(|e| e.expect("audit row")).collect()
}

/// The invariants after a recovery, for one batch `b` run on top of `base`.
/// `done` is the batch's committed result when the batch has completed.
pub fn check_invariants(
    disk: &SimStorage,
    shards: &[&str],
    base: &Contents,
    b: &Batch,
    done: Option<&BatchResult>,
) -> Result<(), String> {
    let now = contents(disk, shards);
    // AtMostOnePerCreate: each create op's record (unique by content) exists at most once.
    for (k, op) in b.ops.iter().enumerate() {
        if let batch::BatchOp::Create { record, .. } = op {
            let n: usize = now
                .values()
                .map(|m| m.values().filter(|r| *r == record).count())
                .sum();
            if n > 1 {
                return Err(format!(
                    "AtMostOnePerCreate: op {k} of {:?} produced {n} records",
                    b.request_key
                ));
            }
        }
    }
    // NoPartialShard: each shard is its base, or its base with all of b's ops for it.
    for s in shards {
        let base_s = base.get(*s).cloned().unwrap_or_default();
        let now_s = now.get(*s).cloned().unwrap_or_default();
        let mine: Vec<&batch::BatchOp> = b.ops.iter().filter(|o| o.shard() == *s).collect();
        let deletes: BTreeSet<u64> = mine
            .iter()
            .filter_map(|o| match o {
                batch::BatchOp::Delete { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        let creates: Vec<&Vec<u8>> = mine
            .iter()
            .filter_map(|o| match o {
                batch::BatchOp::Create { record, .. } => Some(record),
                _ => None,
            })
            .collect();
        let untouched = now_s == base_s;
        let kept: BTreeMap<u64, Vec<u8>> = base_s
            .iter()
            .filter(|(id, _)| !deletes.contains(id))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let new: BTreeMap<u64, Vec<u8>> = now_s
            .iter()
            .filter(|(id, _)| !base_s.contains_key(id))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let whole = now_s
            .iter()
            .filter(|(id, _)| base_s.contains_key(id))
            .map(|(k, v)| (*k, v.clone()))
            .collect::<BTreeMap<_, _>>()
            == kept
            && new.len() == creates.len()
            && creates.iter().all(|c| new.values().any(|v| v == *c));
        if !(untouched || whole) {
            return Err(format!(
                "NoPartialShard: shard {s} holds part of {:?}: base {base_s:?} now {now_s:?}",
                b.request_key
            ));
        }
    }
    // What `roost verify` reads off the files (checksums, claims, audit rows, frames).
    let report = roost::ops::verify::verify(Arc::new(disk.clone()), Path::new(DATA));
    if !report.ok() {
        return Err(format!("verify: {:?}", report.violations));
    }
    if let Some(r) = done {
        match r.status() {
            Status::Rejected => {
                // RejectedBatchWritesNothing.
                if &now != base {
                    return Err(format!(
                        "RejectedBatchWritesNothing: {:?} changed the shards",
                        b.request_key
                    ));
                }
            }
            Status::Committed => {
                // RetryConverges: base minus deletes plus one record per create, under the
                // claimed ids of the result.
                let mut want = base.clone();
                apply_committed(&mut want, b, r)?;
                for s in shards {
                    let w = want.get(*s).cloned().unwrap_or_default();
                    let n = now.get(*s).cloned().unwrap_or_default();
                    if w != n {
                        return Err(format!(
                            "RetryConverges: shard {s} is {n:?}, expected {w:?}"
                        ));
                    }
                }
            }
            other => return Err(format!("unexpected status {other:?}")),
        }
    }
    Ok(())
}

/// The effect of `b`'s committed answer `r` on shard contents: each create's record under
/// the id the answer gives it, each delete's id removed. The model of `RetryConverges`,
/// shared by the crash schedules and the engine fuzz target (`fuzz/src/engine.rs`). A
/// committed delete of an id `want` does not hold, or a create over a held id, is an error.
pub fn apply_committed(want: &mut Contents, b: &Batch, r: &BatchResult) -> Result<(), String> {
    if r.ops().len() != b.ops.len() {
        return Err(format!(
            "the answer to {:?} has {} ops, the batch {}",
            b.request_key,
            r.ops().len(),
            b.ops.len()
        ));
    }
    for (k, (op, res)) in b.ops.iter().zip(r.ops()).enumerate() {
        let m = want.entry(op.shard().to_owned()).or_default();
        let clash = match op {
            batch::BatchOp::Create { record, .. } => m.insert(res.id, record.clone()).is_some(),
            batch::BatchOp::Delete { id, .. } => m.remove(id).is_none(),
        };
        if clash {
            return Err(format!(
                "op {k} of {:?} ({} id {} on {}) was committed over shards that hold {m:?}",
                b.request_key,
                res.op,
                res.id,
                op.shard()
            ));
        }
    }
    Ok(())
}

/// The crash points a clean run of `b` on `disk` reaches (on a copy; `disk` is unchanged).
pub fn points(disk: &SimStorage, b: &Batch) -> Vec<String> {
    let copy = disk.crash(roost_storage::CrashMode::Process);
    let hook = Arc::new(NthCrash::new(None));
    run_batch(&copy, hook.clone(), b, "b.json").expect("clean run");
    hook.reached()
}

/// Fails unless every one of `steps` is among the crash `points` a clean run reached: a
/// schedule that silently lost a step (a round that never ran) checks less than it says.
pub fn assert_reached(points: &[String], steps: &[&str]) {
    for step in steps {
        assert!(
            points.iter().any(|p| p == step),
            "crash point {step} never reached: {points:?}"
        );
    }
}

pub fn no_crash() -> Arc<dyn CrashHook> {
    Arc::new(NoCrash)
}

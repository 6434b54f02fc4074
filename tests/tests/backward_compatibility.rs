//! Format fixtures (after redb's `tests/backward_compatibility.rs`): a whole data directory
//! written by the v1 formats (batch WAL, audit log, shard segments, result files), committed
//! under `tests/fixtures/v1/data`, that every later version must still open and read the
//! same. A format change adds the next version beside it (`v2`: the WAL frame's synced
//! mark); an older fixture is never rewritten.
//!
//! The fixture: three batches over shards `a` and `b`, each with creates and a delete of a
//! record an earlier batch created, run one after another by the real engine on the real
//! file system.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roost::batch::{self, Batch, Status};
use roost::config::Config;
use roost::layout::SHARDS_DIR;
use roost::pipeline::records::{
    AuditRecord, ClaimRecord, DoneRecord, OpKind, PlannedOp, RejectedRecord, WalEntry,
};
use roost::pipeline::{Engine, EngineOptions};
use roost_shards::{Shard, ShardOptions};
use roost_storage::RealStorage;
use roost_tests::{audit_rows, no_crash, wal_entries};
use serde_json::json;

/// Every committed fixture: v1 (WAL frames without the synced mark), v2 (with it) and v3
/// (v2's frames; the payloads may hold a recorded rejection). The three committed batches'
/// payloads, shards and results are the same in all; v3 adds a fourth batch, rejected, whose
/// rejection is in the WAL.
const VERSIONS: [u8; 3] = [1, 2, 3];

/// The first version whose fixture has the rejected fourth batch.
const REJECTION_RECORDED: u8 = 3;

/// The fourth batch (v3 on): its delete names an id that never existed.
fn rejected_batch() -> Batch {
    batch::parse(
        br#"{"request_key":"fixture-4","ops":[{"op":"delete","shard":"a","id":999}]}"#,
        100,
    )
    .unwrap()
}

fn fixture(version: u8) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/v{version}/data"))
}

/// Small segments and limits (a WAL segment holds at least two of the largest claims), so
/// the committed files stay small.
fn open(data: &Path) -> Engine {
    let cfg = Config {
        data_dir: data.to_path_buf(),
        wal_segment_bytes: 4 << 10,
        shard_segment_bytes: 4 << 10,
        spool_file_bytes_max: 1 << 10,
        batch_ops_max: 4,
        ..Config::default()
    };
    Engine::open(EngineOptions {
        storage: RealStorage::shared(),
        config: Arc::new(cfg),
        crash: no_crash(),
    })
    .unwrap_or_else(|e| panic!("open {}: {e}", data.display()))
}

/// The fixture's three batches; the deletes name ids 1 and 2, which the first batch creates
/// (ids are minted from 1, in op order).
fn batches() -> Vec<Batch> {
    let b = |v: serde_json::Value| batch::parse(&serde_json::to_vec(&v).unwrap(), 100).unwrap();
    vec![
        b(json!({"request_key": "fixture-1", "ops": [
            {"op": "create", "shard": "a", "record": {"n": 1}},
            {"op": "create", "shard": "b", "record": {"n": 2}}]})),
        b(json!({"request_key": "fixture-2", "ops": [
            {"op": "create", "shard": "a", "record": {"n": 3}},
            {"op": "delete", "shard": "a", "id": 1}]})),
        b(json!({"request_key": "fixture-3", "ops": [
            {"op": "create", "shard": "b", "record": {"n": 4, "s": "x"}},
            {"op": "delete", "shard": "b", "id": 2},
            {"op": "create", "shard": "a", "record": {"n": 5}}]})),
    ]
}

/// Writes the fixture's data directory at `data` (which must not exist).
fn write_fixture(data: &Path) {
    let engine = open(data);
    for (i, b) in batches().iter().enumerate() {
        let r = engine.submit(b, &format!("b{}.json", i + 1)).unwrap();
        assert_eq!(r.status(), Status::Committed, "{r:?}");
    }
    let r = engine.submit(&rejected_batch(), "b4.json").unwrap();
    assert_eq!(r.status(), Status::Rejected, "{r:?}");
}

/// Every regular file under `dir`, by relative path, with its bytes. The key index
/// (`keyindex/`) is left out: it is derived from the key table, which open catches it up
/// from, and its seed is random.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() && p.file_name().is_some_and(|n| n == roost::layout::KEY_INDEX_DIR) {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn copy_tree(from: &Path, to: &Path) {
    for (rel, bytes) in tree(from) {
        let p = to.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
}

/// Writes `tests/fixtures/vN/data` for the current WAL format version N from today's daemon.
/// Run by hand when a format version is new (never over an older version's fixture):
/// `cargo test -p roost-tests --test backward_compatibility -- --ignored regenerate_current`.
#[test]
#[ignore = "rewrites the committed fixture of the current format; run by hand only"]
fn regenerate_current_fixture() {
    let current = roost_wal::format::WAL_FORMAT_VERSION;
    assert_eq!(
        Some(&current),
        VERSIONS.last(),
        "add the new version to VERSIONS first; older fixtures are never rewritten"
    );
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    write_fixture(&data);
    let dest = fixture(current);
    let _ = std::fs::remove_dir_all(&dest);
    copy_tree(&data, &dest);
    // Spare segments are preallocated space, not part of the format.
    for (rel, _) in tree(&dest) {
        if rel
            .file_name()
            .is_some_and(|n| n == roost_storage::SPARE_FILE)
        {
            std::fs::remove_file(dest.join(rel)).unwrap();
        }
    }
}

/// Goal: the fixture's bytes depend on nothing but the batches (no time, no pid, no random
/// value), so regenerating it changes nothing unless the format did. Method: write it twice
/// and compare every file.
#[test]
fn fixture_writer_is_deterministic() {
    let t = tempfile::tempdir().unwrap();
    write_fixture(&t.path().join("one"));
    write_fixture(&t.path().join("two"));
    let (one, two) = (tree(&t.path().join("one")), tree(&t.path().join("two")));
    assert_eq!(
        one.keys().collect::<Vec<_>>(),
        two.keys().collect::<Vec<_>>()
    );
    for (rel, bytes) in &one {
        assert!(
            two[rel] == *bytes,
            "{} differs between two runs",
            rel.display()
        );
    }
}

/// The claim the fixture's batch `k` (0-based) wrote at `lsn`, with its minted ids in op
/// order (a delete keeps the id it names).
fn expected_claim(k: usize, ids: &[u64]) -> ClaimRecord {
    let b = &batches()[k];
    let ops = b
        .ops
        .iter()
        .zip(ids)
        .map(|(op, id)| match op {
            batch::BatchOp::Create { shard, record, .. } => PlannedOp::Create {
                shard: shard.clone(),
                id: *id,
                record: record.clone(),
            },
            batch::BatchOp::Delete { shard, .. } => PlannedOp::Delete {
                shard: shard.clone(),
                id: *id,
            },
        })
        .collect();
    ClaimRecord {
        request_key: b.request_key.clone(),
        source: format!("b{}.json", k + 1),
        fingerprint: batch::fingerprint(b),
        ops,
    }
}

/// A copy of the committed fixture in a temporary directory (the committed one is never
/// opened for writing).
fn fixture_copy(version: u8) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    copy_tree(&fixture(version), &data);
    (t, data)
}

/// Goal: today's code reads the v1 batch WAL and audit log exactly as v1 wrote them: every
/// lsn, request key, source, fingerprint, planned op and id, every audit row. Method: decode
/// the fixture's logs with the daemon's readers and compare with the values the three
/// batches must have produced (ids minted from 1 in op order, one claim and one `done` per
/// batch).
#[test]
fn logs_read_the_same_in_every_version() {
    for v in VERSIONS {
        logs_read_the_same(v);
    }
}

fn logs_read_the_same(version: u8) {
    let (_t, data) = fixture_copy(version);
    let done = |claim_lsn| WalEntry::Done(DoneRecord { claim_lsn });
    let mut want = vec![
        (1, WalEntry::Claim(expected_claim(0, &[1, 2]))),
        (2, done(1)),
        (3, WalEntry::Claim(expected_claim(1, &[3, 1]))),
        (4, done(3)),
        (5, WalEntry::Claim(expected_claim(2, &[4, 2, 5]))),
        (6, done(5)),
    ];
    if version >= REJECTION_RECORDED {
        let rejected = RejectedRecord {
            request_key: "fixture-4".into(),
            source: "b4.json".into(),
            fingerprint: batch::fingerprint(&rejected_batch()),
            op_index: 0,
            reason: "id 999 does not exist on shard a".into(),
        };
        want.push((7, WalEntry::Rejected(rejected)));
    }
    assert_eq!(wal_entries(RealStorage::shared(), &data), want);
    let row = |claim_lsn, key: &str, op_index, op, shard: &str, id| AuditRecord {
        claim_lsn,
        request_key: key.to_owned(),
        op_index,
        op,
        shard: shard.to_owned(),
        id,
    };
    let (c, d) = (OpKind::Create, OpKind::Delete);
    let rows = vec![
        row(1, "fixture-1", 0, c, "a", 1),
        row(1, "fixture-1", 1, c, "b", 2),
        row(3, "fixture-2", 0, c, "a", 3),
        row(3, "fixture-2", 1, d, "a", 1),
        row(5, "fixture-3", 0, c, "b", 4),
        row(5, "fixture-3", 1, d, "b", 2),
        row(5, "fixture-3", 2, c, "a", 5),
    ];
    let got: Vec<(u64, AuditRecord)> = audit_rows(RealStorage::shared(), &data);
    assert_eq!(got, (1..).zip(rows).collect::<Vec<_>>());
}

/// A shard's name, frames (lsn, ids created, ids deleted) and live records.
type ShardWant = (
    &'static str,
    Vec<(u64, Vec<u64>, Vec<u64>)>,
    Vec<(u64, &'static [u8])>,
);

/// Goal: today's code reads the v1 shard segments and result files as v1 wrote them, and
/// `verify` finds every invariant holding. Method: open each shard read-only and compare its
/// frames (lsn, ids created and deleted) and live records; parse the result files.
#[test]
fn shards_and_results_read_the_same_in_every_version() {
    for v in VERSIONS {
        shards_and_results_read_the_same(v);
    }
}

fn shards_and_results_read_the_same(version: u8) {
    let (_t, data) = fixture_copy(version);
    let report = roost::ops::verify::verify(RealStorage::shared(), &data);
    assert!(report.ok(), "{:?}", report.violations);
    let records = 6 + usize::from(version >= REJECTION_RECORDED);
    assert_eq!(
        report.checked[..3],
        [
            format!("wal: {records} records checksummed (3 claims, 3 done), torn tail 0 bytes"),
            "audit: 7 rows checksummed".to_string(),
            "shards: 2 shards, 5 transaction frames checksummed".to_string(),
        ]
    );
    let frames = |lsn, creates: &[u64], deletes: &[u64]| (lsn, creates.to_vec(), deletes.to_vec());
    let want: [ShardWant; 2] = [
        (
            "a",
            vec![
                frames(1, &[1], &[]),
                frames(3, &[3], &[1]),
                frames(5, &[5], &[]),
            ],
            vec![(3, br#"{"n":3}"#), (5, br#"{"n":5}"#)],
        ),
        (
            "b",
            vec![frames(1, &[2], &[]), frames(5, &[4], &[2])],
            vec![(4, br#"{"n":4,"s":"x"}"#)],
        ),
    ];
    for (name, want_frames, want_records) in want {
        let opts = ShardOptions {
            read_only: true,
            ..ShardOptions::default()
        };
        let s = Shard::open(data.join(SHARDS_DIR).join(name), opts).unwrap();
        let got: Vec<_> = s
            .frame_summaries()
            .unwrap()
            .into_iter()
            .map(|f| (f.lsn, f.creates, f.deletes))
            .collect();
        assert_eq!(got, want_frames, "shard {name} frames");
        let records: Vec<(u64, Vec<u8>)> = s.scan().unwrap().into_iter().collect();
        let want_records: Vec<(u64, Vec<u8>)> = want_records
            .iter()
            .map(|(id, r)| (*id, r.to_vec()))
            .collect();
        assert_eq!(records, want_records, "shard {name} records");
    }
    let result = |k: usize| -> serde_json::Value {
        let p = data.join(format!("spool/out/b{k}.json"));
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let op = |op: &str, shard: &str, id: u64| json!({"op": op, "shard": shard, "id": id});
    let committed = |key: &str, lsn: u64, ops: Vec<serde_json::Value>| json!({"request_key": key, "status": "committed", "lsn": lsn, "ops": ops});
    assert_eq!(
        result(1),
        committed(
            "fixture-1",
            1,
            vec![op("create", "a", 1), op("create", "b", 2)]
        )
    );
    assert_eq!(
        result(2),
        committed(
            "fixture-2",
            3,
            vec![op("create", "a", 3), op("delete", "a", 1)]
        )
    );
    assert_eq!(
        result(3),
        committed(
            "fixture-3",
            5,
            vec![
                op("create", "b", 4),
                op("delete", "b", 2),
                op("create", "a", 5)
            ]
        )
    );
    if version >= REJECTION_RECORDED {
        assert_eq!(
            result(4),
            json!({"request_key": "fixture-4", "status": "rejected", "op_index": 0,
                "reason": "id 999 does not exist on shard a"})
        );
    }
}

/// Goal: the daemon opens a v1 data directory and carries on: nothing to recover, a retried
/// request key gets its original answer with the original ids, a new batch gets an id never
/// used before, and `verify` still holds afterwards. Method: `Engine::open` on a copy, on the
/// real file system.
#[test]
fn data_dir_opens_and_carries_on_in_every_version() {
    for v in VERSIONS {
        data_dir_opens_and_carries_on(v);
    }
}

fn data_dir_opens_and_carries_on(version: u8) {
    let (_t, data) = fixture_copy(version);
    let engine = open(&data);
    let rec = engine.recovery_report();
    let records = 6 + u64::from(version >= REJECTION_RECORDED);
    assert_eq!((rec.wal_records, rec.batches_finished), (records, 0));
    if version >= REJECTION_RECORDED {
        let r = engine.submit(&rejected_batch(), "again4.json").unwrap();
        assert_eq!(
            r.status(),
            Status::Rejected,
            "the recorded answer again: {r:?}"
        );
    }
    let again = engine.submit(&batches()[1], "again.json").unwrap();
    let ids: Vec<u64> = again.ops().iter().map(|o| o.id).collect();
    assert_eq!(
        (again.status(), again.lsn(), ids),
        (Status::Committed, Some(3), vec![3, 1])
    );
    let b = batch::parse(
        br#"{"request_key":"after-v1","ops":[{"op":"create","shard":"b","record":{"n":6}}]}"#,
        100,
    )
    .unwrap();
    let r = engine.submit(&b, "new.json").unwrap();
    assert_eq!((r.status(), r.ops()[0].id), (Status::Committed, 6));
    drop(engine);
    let report = roost::ops::verify::verify(RealStorage::shared(), &data);
    assert!(report.ok(), "{:?}", report.violations);
}

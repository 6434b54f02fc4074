//! The pipeline under concurrency, on the real engine over the simulated disk.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use roost::batch::Status;
use roost::pipeline::records::WalEntry;
use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_tests::*;
use serde_json::json;

/// Goal: many workers submitting at once on two shards all commit with distinct ids; the
/// shard owners apply in lsn order (a shard refuses an out-of-order lsn, so any reordering
/// would fail a batch) and group their flushes (fewer flushes than transactions); the WAL
/// groups its syncs (at most one sync per two claims: every batch waits for its claim to be
/// durable, and `done` records are never synced on their own, so claims are what group commit
/// must beat); and after a power loss everything acknowledged is there. Every sync takes a
/// millisecond, as on a disk: where syncs cost nothing, workers rarely overlap, and one sync
/// per claim could pass for grouping.
#[test]
fn concurrent_batches_share_flushes_and_stay_ordered() {
    let disk = SimStorage::new();
    disk.set_faults(SimFaults {
        sync_latency: Some(Duration::from_millis(1)),
        ..SimFaults::default()
    });
    let engine = Arc::new(open_engine(&disk, no_crash()).unwrap());
    let threads = 16;
    let per = 25;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                (0..per)
                    .map(|i| {
                        let b = parse(&json!({"request_key": format!("t{t}-{i}"), "ops": [
                            {"op": "create", "shard": "s1", "record": {"t": t, "i": i}},
                            {"op": "create", "shard": "s2", "record": {"t": t, "i": i}}]}));
                        engine.one_file(&b, &format!("t{t}-{i}.json")).unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(results.iter().all(|r| r.status() == Status::Committed));
    let mut ids: Vec<u64> = results
        .iter()
        .flat_map(|r| r.ops().iter().map(|o| o.id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), threads * per * 2, "ids unique");
    let txns = engine.stats.shard_txns.load(Ordering::Relaxed);
    let flushes = engine.stats.shard_flushes.load(Ordering::Relaxed);
    let f = engine.figures();
    let (appends, syncs) = (f.wal_appends, f.wal_syncs);
    println!("{} batches: {txns} shard txns in {flushes} flushes; {appends} wal appends in {syncs} syncs", threads * per);
    assert_eq!(txns, (threads * per * 2) as u64);
    assert!(
        flushes < txns,
        "no group flush: {flushes} flushes for {txns} transactions"
    );
    // A graceful stop's durability round: every batch's shards flushed.
    engine.settle().unwrap();
    drop(engine);
    let claims = wal_entries(Arc::new(disk.clone()), &data_dir())
        .iter()
        .filter(|(_, e)| matches!(e, WalEntry::Claim(_)))
        .count() as u64;
    assert_eq!(claims, (threads * per) as u64, "one claim per batch");
    assert!(
        2 * syncs <= claims,
        "no group commit: {syncs} wal syncs for {claims} claims"
    );
    let after = disk.crash(CrashMode::PowerDrop);
    let c = contents(&after, &["s1", "s2"]);
    assert_eq!(c["s1"].len(), threads * per);
    assert_eq!(c["s2"].len(), threads * per);
}

//! Shard benchmark (not a test): transactions/s and MB/s applied (apply and flush, i.e. msync
//! and fdatasync per transaction) for 1, 10 and 100 ops per transaction, next to the raw limit
//! measured in the same run (pwrite + fdatasync of the same frame size on a preallocated
//! file); then open time and index memory per record at 1M records (anonymous RSS measured
//! from /proc/self/status, so mapped file pages do not count).
//!
//! `cargo bench -p roost-shards` (ROOST_BENCH_DIR, ROOST_BENCH_SECS as for the WAL bench;
//! ROOST_BENCH_RECORDS to change the 1M).
#![forbid(unsafe_code)]
// A benchmark, not production code: a failed step ends the run with its panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use roost_benchkit::{bench_tempdir, cell_duration as secs, raw_fdatasync, rss_anon_kib, SyncFile};
use roost_shards::frame::encoded_len;
use roost_shards::{Shard, ShardOptions, Txn, TxnOp};

fn record(i: u64) -> Vec<u8> {
    format!("{{\"name\":\"user-{i:08}\",\"email\":\"user{i}@example.org\",\"plan\":\"basic\",\"n\":{i}}}").into_bytes()
}

fn main() {
    let root = bench_tempdir("target/bench-tmp").expect("bench dir");
    println!(
        "roost-shards benchmark in {} ({} s per cell)",
        root.display(),
        secs().as_secs_f64()
    );
    println!();
    println!(
        "{:>7} | {:>9} {:>10} {:>9} | {:>12} {:>9} | {:>6}",
        "ops/txn", "txn/s", "records/s", "MB/s", "raw sync/s", "raw MB/s", "ratio"
    );
    for ops in [1usize, 10, 100] {
        let dir = root.join(format!("apply-{ops}"));
        let mut s = Shard::open(
            &dir,
            ShardOptions {
                segment_bytes: 64 << 20,
                ..ShardOptions::default()
            },
        )
        .expect("open");
        let mut id = 1u64;
        let mut lsn = 0u64;
        let mut bytes = 0u64;
        let start = Instant::now();
        let mut frame = 0;
        while start.elapsed() < secs() {
            lsn += 1;
            let txn = Txn {
                lsn,
                ops: (0..ops)
                    .map(|_| {
                        id += 1;
                        TxnOp::Create {
                            id,
                            record: record(id),
                        }
                    })
                    .collect(),
            };
            frame = encoded_len(&txn);
            bytes += frame as u64;
            s.apply(&txn).expect("apply");
            s.flush().expect("flush");
        }
        let el = start.elapsed().as_secs_f64();
        // The raw limit: the same bytes per transaction, pwrite + fdatasync.
        let file = SyncFile::Preallocated {
            file_bytes: 64 << 20,
            wrap_bytes: 60 << 20,
        };
        let raw = raw_fdatasync(&dir.join("raw"), frame, secs(), file).expect("raw fdatasync");
        let tps = lsn as f64 / el;
        println!(
            "{ops:>7} | {tps:>9.0} {:>10.0} {:>9.2} | {:>12.0} {:>9.2} | {:>5.2}x",
            tps * ops as f64,
            bytes as f64 / el / 1e6,
            raw.ops_per_sec,
            raw.mb_per_sec,
            tps / raw.ops_per_sec
        );
    }

    let n: u64 = std::env::var("ROOST_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let dir = root.join("big");
    {
        let mut s = Shard::open(
            &dir,
            ShardOptions {
                segment_bytes: 64 << 20,
                ..ShardOptions::default()
            },
        )
        .expect("open");
        let mut id = 0u64;
        let mut lsn = 0;
        while id < n {
            lsn += 1;
            let ops = (0..100)
                .map(|_| {
                    id += 1;
                    TxnOp::Create {
                        id,
                        record: record(id),
                    }
                })
                .collect();
            s.apply(&Txn { lsn, ops }).expect("apply");
        }
        s.flush().expect("flush");
    }
    let before = rss_anon_kib();
    let start = Instant::now();
    let s = Shard::open(
        &dir,
        ShardOptions {
            segment_bytes: 64 << 20,
            ..ShardOptions::default()
        },
    )
    .expect("open");
    let open = start.elapsed();
    let after = rss_anon_kib();
    let per = (after.saturating_sub(before)) as f64 * 1024.0 / s.len() as f64;
    println!();
    println!("open of {} records in {} segments: {:.0} ms; index memory {:.1} bytes/record (anonymous RSS delta {} KiB; table capacity {})",
        s.len(), s.open_report().segments, open.as_secs_f64() * 1e3, per, after.saturating_sub(before), s.index_capacity());
    drop(s);
    let _ = std::fs::remove_dir_all(&root);
}

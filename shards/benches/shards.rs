//! Shard benchmark (not a test): transactions/s and MB/s applied (apply and flush, i.e. msync
//! and fdatasync per transaction) for 1, 10 and 100 ops per transaction, next to the raw limit
//! measured in the same run (pwrite + fdatasync of the same frame size on a preallocated
//! file); then open time and index memory per record at 1M records (anonymous RSS measured
//! from /proc/self/status, so mapped file pages do not count).
//!
//! `cargo bench -p roost-shards` (ROOST_BENCH_DIR, ROOST_BENCH_SECS as for the WAL bench;
//! ROOST_BENCH_RECORDS to change the 1M).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use roost_shards::frame::encoded_len;
use roost_shards::{Shard, ShardOptions, Txn, TxnOp};

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("ROOST_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/bench-tmp"));
    std::fs::create_dir_all(&base).expect("bench dir");
    tempfile::tempdir_in(base).expect("tempdir").keep()
}

fn secs() -> Duration {
    Duration::from_secs_f64(
        std::env::var("ROOST_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    )
}

fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn record(i: u64) -> Vec<u8> {
    format!("{{\"name\":\"user-{i:08}\",\"email\":\"user{i}@example.org\",\"plan\":\"basic\",\"n\":{i}}}").into_bytes()
}

fn main() {
    let root = bench_dir();
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
        let f = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(true)
            .open(dir.join("raw"))
            .expect("raw");
        f.set_len(64 << 20).expect("len");
        let buf = vec![0x5au8; frame];
        let rstart = Instant::now();
        let (mut n, mut off) = (0u64, 0u64);
        while rstart.elapsed() < secs() {
            f.write_all_at(&buf, off % (60 << 20)).expect("write");
            f.sync_data().expect("sync");
            off += frame as u64;
            n += 1;
        }
        let rel = rstart.elapsed().as_secs_f64();
        let (tps, raw) = (lsn as f64 / el, n as f64 / rel);
        println!(
            "{ops:>7} | {tps:>9.0} {:>10.0} {:>9.2} | {raw:>12.0} {:>9.2} | {:>5.2}x",
            tps * ops as f64,
            bytes as f64 / el / 1e6,
            n as f64 * frame as f64 / rel / 1e6,
            tps / raw
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

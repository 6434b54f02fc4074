//! WAL benchmark (not a test): durable appends per second and MB/s for 100-byte and 4 KiB
//! records at 1, 4, 16 and 64 concurrent writers, side by side with the raw limits measured
//! in the same run on the same directory: a loop of write + fdatasync of the same size (what
//! one writer without group commit could do) and sequential write bandwidth; then replay MB/s
//! next to plain reads of the same files.
//!
//! `cargo bench -p roost-wal` (set ROOST_BENCH_DIR to put the files on another disk;
//! ROOST_BENCH_SECS to change the time per cell, default 2).
#![forbid(unsafe_code)]
// A benchmark, not production code: a failed step ends the run with its panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use roost_benchkit::{
    bench_tempdir, cell_duration as secs, raw_bandwidth, raw_fdatasync, SyncFile,
};
use roost_wal::{Wal, WalOptions};

/// (records/s, MB/s, records per sync)
fn wal_cell(dir: &Path, size: usize, writers: usize) -> (f64, f64, f64) {
    let wal = Arc::new(
        Wal::open(
            dir,
            WalOptions {
                segment_bytes: 64 << 20,
                ..WalOptions::default()
            },
        )
        .expect("open"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let syncs0 = wal.sync_count();
    let handles: Vec<_> = (0..writers)
        .map(|_| {
            let (wal, stop, count) = (wal.clone(), stop.clone(), count.clone());
            std::thread::spawn(move || {
                let payload = vec![0x5au8; size];
                while !stop.load(Ordering::Relaxed) {
                    wal.append(1, &payload).expect("append");
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(secs());
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("writer");
    }
    let el = start.elapsed().as_secs_f64();
    let n = count.load(Ordering::Relaxed) as f64;
    let syncs = (wal.sync_count() - syncs0).max(1) as f64;
    (n / el, n * size as f64 / el / 1e6, n / syncs)
}

fn drop_caches_hint() {
    // Best effort: replay and plain reads are compared on the same (warm) page cache.
}

fn main() {
    // `cargo bench` passes --bench; ignore arguments.
    let root = bench_tempdir("target/bench-tmp").expect("bench dir");
    println!(
        "roost-wal benchmark in {} ({} s per cell)",
        root.display(),
        secs().as_secs_f64()
    );
    println!();
    println!(
        "{:>7} {:>7} | {:>12} {:>9} {:>10} | {:>14} {:>9} | {:>8}",
        "record",
        "writers",
        "appends/s",
        "MB/s",
        "recs/sync",
        "raw sync ops/s",
        "raw MB/s",
        "ratio"
    );
    let mut cell = 0;
    for size in [100usize, 4096] {
        let raw = raw_fdatasync(&root.join("raw-sync"), size, secs(), SyncFile::Append)
            .expect("raw fdatasync");
        let (raw_ops, raw_mb) = (raw.ops_per_sec, raw.mb_per_sec);
        for writers in [1usize, 4, 16, 64] {
            cell += 1;
            let dir = root.join(format!("wal-{cell}"));
            let (ops, mb, per_sync) = wal_cell(&dir, size, writers);
            println!("{size:>7} {writers:>7} | {ops:>12.0} {mb:>9.2} {per_sync:>10.1} | {raw_ops:>14.0} {raw_mb:>9.2} | {:>7.1}x", ops / raw_ops);
        }
    }
    let bw = raw_bandwidth(&root.join("raw-bw"), 256 << 20).expect("raw bandwidth");
    println!();
    println!("sequential write bandwidth (1 MiB writes + one fdatasync): {bw:.0} MB/s");

    // Replay: a log of ~200 MB of 4 KiB records, then replay vs plain reads of its files.
    let dir = root.join("replay");
    {
        let wal = Wal::open(
            &dir,
            WalOptions {
                segment_bytes: 64 << 20,
                ..WalOptions::default()
            },
        )
        .expect("open");
        let payload = vec![0x11u8; 4096];
        let mut last = 0;
        for _ in 0..50_000 {
            last = wal.append_nowait(1, &payload).expect("append");
        }
        wal.sync_to(last).expect("sync");
    }
    drop_caches_hint();
    let start = Instant::now();
    let mut bytes = 0u64;
    for entry in std::fs::read_dir(&dir).expect("dir").flatten() {
        let mut buf = Vec::new();
        File::open(entry.path())
            .expect("open")
            .read_to_end(&mut buf)
            .expect("read");
        bytes += buf.len() as u64;
    }
    let plain = bytes as f64 / start.elapsed().as_secs_f64() / 1e6;
    let start = Instant::now();
    let wal = Wal::open(
        &dir,
        WalOptions {
            read_only: true,
            segment_bytes: 64 << 20,
            ..WalOptions::default()
        },
    )
    .expect("open");
    let mut payload_bytes = 0u64;
    let mut records = 0u64;
    for r in wal.replay(1) {
        let r = r.expect("record");
        payload_bytes += r.payload.len() as u64;
        records += 1;
    }
    let el = start.elapsed().as_secs_f64();
    let replay = bytes as f64 / el / 1e6;
    println!("replay (open + verify + replay {records} records, {:.0} MB payload): {replay:.0} MB/s of segment files; plain read of the same files: {plain:.0} MB/s; ratio {:.2}", payload_bytes as f64 / 1e6, replay / plain);
    let _ = std::fs::remove_dir_all(&root);
}

//! `roost-bench --shard-gets DIR [N]` (issue 44): what a `get` of a random id costs in a shard
//! that keeps many records, cold. The page cache is dropped first (root only; otherwise the
//! figures are marked warm), the shard directory `DIR` is opened read-only as `roost get`
//! opens it (its sealed segments through their index files; nothing written), then `N`
//! (default 2,000) gets of ids drawn uniformly from `1..=max_id` are timed one by one. Prints
//! the open's time (`ROOST_GETS_WRITABLE=1`: opened writable, as the daemon opens it), the
//! process's VmRSS after the open and after the gets, how many ids were
//! present, and the gets' p50 / p99 / max. No figure is asserted; every record found must be a
//! JSON object.

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context};
use roost_shards::{Shard, ShardOptions};

fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn drop_caches() -> bool {
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// `--shard-gets DIR [N]`.
pub fn main(args: &[String]) -> anyhow::Result<()> {
    let dir = Path::new(args.first().context("--shard-gets DIR [N]")?);
    let n = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2_000);
    run(dir, n)
}

fn run(dir: &Path, n: usize) -> anyhow::Result<()> {
    let cold = drop_caches();
    let t0 = Instant::now();
    // `ROOST_GETS_WRITABLE=1`: open as the daemon does (writable, lock taken), for its time.
    let writable = std::env::var_os("ROOST_GETS_WRITABLE").is_some_and(|v| v == "1");
    let opts = ShardOptions {
        read_only: !writable,
        ..ShardOptions::default()
    };
    let shard = Shard::open(dir, opts).with_context(|| format!("opening {}", dir.display()))?;
    let open_ms = t0.elapsed().as_secs_f64() * 1e3;
    let rss_open = vm_rss_kib();
    let max_id = shard.max_id();
    ensure!(max_id > 0, "{} holds no records", dir.display());
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let (mut times, mut present) = (Vec::with_capacity(n), 0usize);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let id = 1 + x % max_id;
        let t = Instant::now();
        let got = shard.get(id).with_context(|| format!("get {id}"))?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        if let Some(rec) = got {
            ensure!(
                rec.first() == Some(&b'{'),
                "record {id} is not a JSON object"
            );
            present += 1;
        }
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    println!(
        "shard {} ({}): {} records, max id {max_id}; open {open_ms:.0} ms, VmRSS {} MiB after \
         the open, {} MiB after {n} gets; {present} of {n} ids present; get p50 {:.0} us, p99 \
         {:.0} us, max {:.0} us",
        dir.display(),
        if cold {
            "cold: page cache dropped"
        } else {
            "warm: caches not dropped"
        },
        shard.len(),
        rss_open / 1024,
        vm_rss_kib() / 1024,
        at(0.5),
        at(0.99),
        at(1.0),
    );
    Ok(())
}

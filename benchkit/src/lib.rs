//! `roost-benchkit`: the helpers every roost benchmark shares, so that the raw limits the WAL,
//! shard and end-to-end benchmarks print beside their own numbers are measured the same way:
//! the directory to run in (`ROOST_BENCH_DIR`), the time per cell (`ROOST_BENCH_SECS`), a
//! write + fdatasync loop, sequential write bandwidth, and anonymous RSS. It measures the
//! plain file system only; it never touches roost's own code and asserts no timing.
#![forbid(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `ROOST_BENCH_DIR`, or `default` when it is not set.
pub fn bench_base(default: &str) -> PathBuf {
    std::env::var_os("ROOST_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// A fresh directory inside [`bench_base`] (created if needed), kept after the run: the
/// benchmark removes it itself when it is done.
pub fn bench_tempdir(default: &str) -> io::Result<PathBuf> {
    let base = bench_base(default);
    std::fs::create_dir_all(&base)?;
    Ok(tempfile::tempdir_in(base)?.keep())
}

/// Time per benchmark cell: `ROOST_BENCH_SECS` (seconds, fractions allowed), default 2.
pub fn cell_duration() -> Duration {
    Duration::from_secs_f64(
        std::env::var("ROOST_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2.0),
    )
}

/// Where [`raw_fdatasync`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncFile {
    /// A new, empty file, appended to (every sync also commits the file's growth).
    Append,
    /// A file set to `file_bytes` first, overwritten from offset 0 and wrapped at
    /// `wrap_bytes` (what a preallocated segment costs).
    Preallocated { file_bytes: u64, wrap_bytes: u64 },
}

/// What a write + fdatasync loop achieved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RawSync {
    pub ops_per_sec: f64,
    pub mb_per_sec: f64,
}

/// Writes `size` bytes and fdatasyncs, in a loop for `dur`, at `path`: the rate one writer
/// without group commit gets from this disk.
pub fn raw_fdatasync(
    path: &Path,
    size: usize,
    dur: Duration,
    file: SyncFile,
) -> io::Result<RawSync> {
    let f = OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(path)?;
    let wrap = match file {
        SyncFile::Append => u64::MAX,
        SyncFile::Preallocated {
            file_bytes,
            wrap_bytes,
        } => {
            f.set_len(file_bytes)?;
            wrap_bytes
        }
    };
    let buf = vec![0x5au8; size];
    let start = Instant::now();
    let (mut n, mut off) = (0u64, 0u64);
    while start.elapsed() < dur {
        f.write_all_at(&buf, off % wrap)?;
        f.sync_data()?;
        off += size as u64;
        n += 1;
    }
    let el = start.elapsed().as_secs_f64();
    Ok(RawSync {
        ops_per_sec: n as f64 / el,
        mb_per_sec: n as f64 * size as f64 / el / 1e6,
    })
}

/// Sequential write bandwidth at `path`: `total` bytes in 1 MiB writes, one fdatasync at the
/// end. MB/s.
pub fn raw_bandwidth(path: &Path, total: usize) -> io::Result<f64> {
    let mut f = File::create(path)?;
    let buf = vec![0xa5u8; 1 << 20];
    let start = Instant::now();
    for _ in 0..total / buf.len() {
        f.write_all(&buf)?;
    }
    f.sync_data()?;
    Ok(total as f64 / start.elapsed().as_secs_f64() / 1e6)
}

/// This process's anonymous resident memory in KiB (`RssAnon` in `/proc/self/status`, so
/// mapped file pages do not count); 0 where it cannot be read.
pub fn rss_anon_kib() -> u64 {
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

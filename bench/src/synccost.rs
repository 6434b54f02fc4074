//! What one sync costs on a file system, by the kind of write it makes durable: the raw
//! figures `--ceiling` prints beside its table for each file system it runs on, so that the
//! per-batch syncs of roost's profile can be priced. Each loop runs alone, one thread, for
//! `dur`:
//!
//! - `append`: 1.2 KB appended to a new file, fdatasync (the file's size grows each time);
//! - `fallocated`: 1.2 KB written over a `posix_fallocate`d file, fdatasync (how roost's WAL,
//!   audit and shard segments are made: each sync also converts unwritten extents, a metadata
//!   change);
//! - `zero-filled`: the same over a file whose blocks were written with zeros and synced first
//!   (a pure data overwrite);
//! - `new file`: a new 300 B file created, written, fdatasynced, closed (a result file's own
//!   sync);
//! - `new file + rename + dir fsync`: the same, then renamed and its directory fsynced (a
//!   whole result published on its own, without rounds).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use roost_storage::{OpenMode, RealStorage};

/// Bytes per WAL-like write, as the raw figure of the end-to-end bench.
const WRITE_BYTES: usize = 1200;
/// Bytes of a result file.
const RESULT_BYTES: usize = 300;
/// Size of the preallocated and zero-filled files (the loop wraps inside it).
const FILE_BYTES: u64 = 64 << 20;

/// Runs `step` (given its iteration) in a loop for `dur`; returns iterations per second.
fn rate(dur: Duration, mut step: impl FnMut(u64) -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        step(n)?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// (what, syncs per second) for each loop of the module comment, in `dir` (created).
pub fn sync_costs(dir: &Path, dur: Duration) -> anyhow::Result<Vec<(&'static str, f64)>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let buf = vec![0x5au8; WRITE_BYTES];
    let wrap = FILE_BYTES / WRITE_BYTES as u64;
    let mut out = Vec::new();

    let p = dir.join("append");
    let f = File::create(&p).with_context(|| format!("create {}", p.display()))?;
    out.push((
        "append",
        rate(dur, |i| {
            f.write_all_at(&buf, i * WRITE_BYTES as u64)?;
            Ok(f.sync_data()?)
        })?,
    ));

    let p = dir.join("fallocated");
    let f = RealStorage::shared()
        .open(&p, OpenMode::CreateNew)
        .with_context(|| format!("create {}", p.display()))?;
    f.allocate(FILE_BYTES)
        .with_context(|| format!("fallocate {}", p.display()))?;
    f.sync_data()?;
    out.push((
        "fallocated",
        rate(dur, |i| {
            f.write_at(&buf, (i % wrap) * WRITE_BYTES as u64)?;
            Ok(f.sync_data()?)
        })?,
    ));

    let p = dir.join("zero-filled");
    let mut f = File::create(&p).with_context(|| format!("create {}", p.display()))?;
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..FILE_BYTES / zeros.len() as u64 {
        f.write_all(&zeros)?;
    }
    f.sync_all()?;
    out.push((
        "zero-filled",
        rate(dur, |i| {
            f.write_all_at(&buf, (i % wrap) * WRITE_BYTES as u64)?;
            Ok(f.sync_data()?)
        })?,
    ));
    out.push(("new file", new_files(dir, dur, false)?));
    out.push(("new file + rename + dir fsync", new_files(dir, dur, true)?));
    Ok(out)
}

/// New result-sized files, each fdatasynced (and, with `publish`, renamed and the directory
/// fsynced), then removed in the next iteration's place: per second.
fn new_files(dir: &Path, dur: Duration, publish: bool) -> anyhow::Result<f64> {
    let sub = dir.join(if publish { "published" } else { "files" });
    std::fs::create_dir_all(&sub).with_context(|| format!("create {}", sub.display()))?;
    let body = vec![b'r'; RESULT_BYTES];
    rate(dur, |i| {
        let tmp = sub.join(format!(".{i}.tmp"));
        let mut f = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        f.write_all(&body)?;
        f.sync_data()?;
        drop(f);
        if publish {
            std::fs::rename(&tmp, sub.join(format!("{i}")))?;
            File::open(&sub)?.sync_all()?;
        }
        Ok(())
    })
}

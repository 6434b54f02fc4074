//! Disk on first run (issue 43): a fresh node with the default configuration that has taken
//! one batch holds at most 16 MiB on disk, counted as `du` does (allocated blocks, not
//! apparent sizes), and still keeps every log's next segment preallocated.
//!
//! Method: the real `roost serve` on a fresh data directory, no configuration file (the
//! embedded default), `examples/order-17.json` (two creates on two new shards) delivered to
//! its spool; once the result is committed, the allocated size of every file and directory
//! under the data directory is summed, and each log's active segment and `SPARE` are checked
//! to be allocated (`st_blocks` covers the length), the spare at least the active segment's
//! length (it becomes the next one).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{drop_in, serve_ready, stop_code, wait_for};

/// What an empty node may take.
const EMPTY_NODE_BYTES_MAX: u64 = 16 << 20;

/// Every file and directory under `dir` (itself included) with its allocated bytes.
fn allocated(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let meta = std::fs::symlink_metadata(dir).expect("stat");
    out.push((dir.to_path_buf(), meta.blocks() * 512));
    for e in std::fs::read_dir(dir).expect("read dir") {
        let p = e.expect("dir entry").path();
        let meta = std::fs::symlink_metadata(&p).expect("stat");
        if meta.is_dir() {
            allocated(&p, out);
        } else {
            out.push((p, meta.blocks() * 512));
        }
    }
}

/// The newest segment of the log in `dir` (names sort by their first lsn or sequence).
fn newest_segment(dir: &Path, suffix: &str) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read log dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    segs.sort();
    segs.pop()
        .unwrap_or_else(|| panic!("no {suffix} segment in {}", dir.display()))
}

/// Length and allocated bytes of `path`.
fn len_and_blocks(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.len(), m.blocks() * 512)
}

/// The log in `dir` keeps its preallocation: its newest segment and its spare are allocated
/// over their whole length, and the spare can hold at least what the newest segment holds.
fn check_preallocated(dir: &Path, suffix: &str) {
    let seg = newest_segment(dir, suffix);
    let spare = dir.join("SPARE");
    let (seg_len, seg_blocks) = len_and_blocks(&seg);
    let (spare_len, spare_blocks) = len_and_blocks(&spare);
    assert!(seg_len > 0, "{} is empty", seg.display());
    assert!(
        seg_blocks >= seg_len,
        "{} not preallocated: {seg_blocks} of {seg_len} bytes allocated",
        seg.display()
    );
    assert!(
        spare_blocks >= spare_len && spare_len >= seg_len,
        "{}: {spare_blocks} of {spare_len} bytes allocated, the active segment is {seg_len}",
        spare.display()
    );
}

/// Goal: an empty node takes at most 16 MiB after its first batch, logs and shards still
/// preallocated ahead (issue 43, "disk on first run"; it took 321 MiB).
#[test]
fn a_fresh_node_with_one_batch_takes_at_most_16_mib() {
    let t = tempfile::tempdir().expect("tempdir");
    let data = t.path().join("roost-data");
    let mut d = serve_ready(&data, &t.path().join("serve.log"), &[]);
    let order = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/order-17.json");
    let body = std::fs::read(&order).expect("examples/order-17.json");
    let spool = data.join("spool");
    drop_in(&spool, "order-17.json", &body);
    let out = spool.join("out").join("order-17.json");
    wait_for(
        "the result of order-17.json",
        Duration::from_secs(30),
        || out.exists(),
    );
    let result = std::fs::read_to_string(&out).expect("result");
    assert!(result.contains(r#""status":"committed""#), "{result}");

    let mut files = Vec::new();
    allocated(&data, &mut files);
    let total: u64 = files.iter().map(|(_, b)| b).sum();
    files.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    let listing: Vec<String> = files
        .iter()
        .take(12)
        .map(|(p, b)| format!("{:>10} {}", b, p.display()))
        .collect();
    println!("{total} bytes allocated:\n{}", listing.join("\n"));
    assert!(
        total <= EMPTY_NODE_BYTES_MAX,
        "a fresh node with one batch takes {total} bytes ({} MiB), over {EMPTY_NODE_BYTES_MAX}:\n{}",
        total >> 20,
        listing.join("\n")
    );
    check_preallocated(&data.join("wal"), ".wal");
    check_preallocated(&data.join("audit"), ".wal");
    check_preallocated(&data.join("shards/users"), ".seg");
    check_preallocated(&data.join("shards/orders"), ".seg");
    assert!(
        len_and_blocks(&data.join("keys/SPARE")).1 > 0,
        "the key table keeps its spare"
    );
    assert_eq!(stop_code(&mut d), Some(0), "a graceful stop");
}

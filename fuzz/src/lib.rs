//! What every fuzz target shares (issue 45, docs/faults.md "Fuzzing"): the memory bound,
//! a poll loop for async readers over bytes, the choice byte, checksum fix-ups that let
//! the fuzzer past a CRC, and the segment targets' open-twice check (`reopened_same`). Targets are test code: a panic or an abort is how they report a
//! finding.
#![forbid(unsafe_code)]

pub mod engine;
pub mod repl;

use std::fmt::Debug;
use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// The address space a target may use, as `tests/tests/fuzz_decoders.rs` bounds its
/// proptests: an allocation of what a forged length says (4 GiB, `u64::MAX`) fails, and the
/// allocation failure aborts the run, which libFuzzer reports as a crash with its input.
/// (libFuzzer's own `-malloc_limit_mb` needs a sanitizer's malloc hooks, absent in a
/// `-s none` build; `-rss_limit_mb` misses a large zeroed allocation never touched.)
pub const ADDRESS_SPACE_BYTES_MAX: u64 = 1 << 30;

/// Sets the address-space limit; every target calls it from its `init`.
pub fn limit_memory() {
    let lim = rustix::process::Rlimit {
        current: Some(ADDRESS_SPACE_BYTES_MAX),
        maximum: None,
    };
    if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::As, lim) {
        panic!("cannot limit the address space to {ADDRESS_SPACE_BYTES_MAX} bytes: {e}");
    }
}

/// Runs a future whose every read is ready (an `AsyncRead` over a byte slice): polled until
/// done. A future that would wait on anything else is a harness bug, reported as a panic.
pub fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000_000 {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("a future over in-memory bytes never became ready");
}

/// A byte of the input as a small choice (0 when the input is empty).
pub fn choice(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((c, rest)) => (*c, rest),
        None => (0, data),
    }
}

/// Writes the CRC-32 of `buf[from..to]` little-endian at `at`, when all three are in bounds:
/// so a mutated header or body still passes its checksum and the decoder behind it runs.
pub fn fix_crc(buf: &mut [u8], at: usize, from: usize, to: usize) {
    if at + 4 <= buf.len() && from <= to && to <= buf.len() {
        let crc = crc32fast::hash(&buf[from..to]);
        buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Where a log's frame header keeps its checksum and body length (`wal_segment`,
/// `shard_segment`): the CRC-32 at `crc_offset` covers the header from `version_offset` and
/// the body; the body's length is a little-endian `u32` at `len_offset`; frames start 8-aligned.
pub struct FrameLayout {
    pub header_len: usize,
    pub len_offset: usize,
    pub crc_offset: usize,
    pub version_offset: usize,
    /// A longer body stops the walk (the log's own limit).
    pub body_len_max: usize,
}

/// Recomputes the CRC of every frame of `seg` from the first while each one's length fits:
/// so a mutated header or body still passes its checksum and the rules behind it run.
pub fn fix_frame_crcs(seg: &mut [u8], l: &FrameLayout) {
    let mut at = 0;
    while at + l.header_len <= seg.len() {
        let b = &seg[at + l.len_offset..at + l.len_offset + 4];
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let end = at + l.header_len + len;
        if len > l.body_len_max || end > seg.len() {
            return;
        }
        fix_crc(seg, at + l.crc_offset, at + l.version_offset, end);
        at = end.next_multiple_of(8);
    }
}

/// A log segment's bytes put at `path` on a fresh simulated disk, then opened as the segment
/// targets (`wal_segment`, `shard_segment`) open theirs with `open(disk, read_only)`: read-only
/// (any outcome but a panic), then read-write; if that accepted it (a torn tail may be cut),
/// a read-only open again must give the same `T`. `what` names the log in a failure.
pub fn reopened_same<T: PartialEq + Debug>(
    path: &str,
    segment: Vec<u8>,
    what: &str,
    open: impl Fn(&roost_storage::SimStorage, bool) -> Result<T, String>,
) {
    let disk = roost_storage::SimStorage::new();
    disk.put_file_bytes(Path::new(path), segment);
    let _ = open(&disk, true);
    if let Ok(first) = open(&disk, false) {
        let again = open(&disk, true).unwrap_or_else(|e| {
            panic!("a {what} a read-write open accepted does not open again: {e}")
        });
        assert_eq!(
            again, first,
            "a second open of the {what} reads other records"
        );
    }
}

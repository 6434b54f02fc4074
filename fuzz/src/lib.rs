//! What every fuzz target shares (issue 45, docs/faults.md "Fuzzing"): the memory bound,
//! a poll loop for async readers over bytes, the choice byte, and checksum fix-ups that let
//! the fuzzer past a CRC. Targets are test code: a panic or an abort is how they report a
//! finding.
#![forbid(unsafe_code)]

pub mod engine;

use std::future::Future;
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

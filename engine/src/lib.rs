//! `roost-engine`: the batch-apply daemon's engine and everything it runs on; the `roost`
//! crate (`daemon/`) adds the command line and the drills on top and re-exports these
//! modules. The folders are the parts, each depending only on those listed before it (no
//! module cycles):
//!
//! - `error` (the error type and the class -> exit code mapping) and `layout` (the data
//!   directory's names), `logging` (the `ROOST_LOG` filter, stderr or the journal): leaves.
//! - `config`, `batch` (parsing, fingerprint, result JSON).
//! - `spool`: the spool directory (reading a dropped file, result publishing, `failed/`).
//! - `pipeline`: the engine (Plan -> Claim -> Commit -> Finish, recovery), synchronous and
//!   testable over a simulated disk.
//! - `replica`: the engine joined to the replication protocol; `cluster`: leadership and
//!   epochs from etcd, a standby's forwarding (issue 27).
//! - `control`: the control socket (`roost status`), the status JSON, the metrics and their
//!   HTTP endpoint, the systemd notify protocol.
//! - `ops`: what operators use besides the pipeline: the offline `verify`, the test
//!   cluster's certificates.
//! - `intake`: every way a batch arrives (spool files, bulk files, the stream), each through
//!   `Engine::submit`.
//! - `serve`: the async shell around the engine (the loop, dispatch, sidecars, signals).
#![forbid(unsafe_code)]

pub mod batch;
pub mod cluster;
pub mod config;
pub mod control;
pub mod error;
pub mod intake;
pub mod layout;
pub mod logging;
pub mod ops;
pub mod pipeline;
pub mod replica;
pub mod serve;
pub mod spool;

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`, inherited
/// by children, applied at every later fault). With them, mimalloc's fresh pages were
/// faulted in 2 MiB at a time and zeroed whole, again after every purge: `clear_page` was 20-45%
/// of the daemon's samples on 20 bulk files of 1,000 lines, and turning them off cut its CPU
/// per batch from 75-88 to 65-69 µs (4 alternating pairs; docs/benchmarks.md, "Huge pages").
/// mimalloc's `no_thp` feature stops it asking for them on a `madvise` system; this also
/// covers one set to `always`. A kernel that refuses is only logged: it costs speed, not
/// safety.
pub fn no_transparent_huge_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(error = %e, "prctl(PR_SET_THP_DISABLE) refused; transparent huge pages stay enabled");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn huge_pages_are_off_after_the_call() {
        super::no_transparent_huge_pages();
        assert_eq!(
            rustix::thread::transparent_huge_pages_are_disabled().ok(),
            Some(true),
            "PR_GET_THP_DISABLE after PR_SET_THP_DISABLE"
        );
    }
}

//! `roost`: the batch-apply daemon. The folders are the parts, each depending only on those
//! listed before it (no module cycles):
//!
//! - `error` (the error type and the class -> exit code mapping) and `layout` (the data
//!   directory's names): leaves.
//! - `config`, `batch` (parsing, fingerprint, result JSON).
//! - `spool`: the spool directory (intake, result publishing, quarantine).
//! - `pipeline`: the engine (Plan -> Claim -> Commit -> Finish, recovery), synchronous and
//!   testable over a simulated disk.
//! - `ops`: what operators use besides the pipeline: the control socket and metrics, the
//!   systemd notify protocol, the offline `verify`, the crash `drill`.
//! - `serve`: the async shell around the engine (spool watching, workers, signals).
//! - `cli`: the command line. `main.rs` only sets up logging and calls `cli::run`.
#![forbid(unsafe_code)]

pub mod batch;
pub mod cli;
pub mod config;
pub mod error;
pub mod layout;
pub mod ops;
pub mod pipeline;
pub mod replica;
pub mod serve;
pub mod spool;

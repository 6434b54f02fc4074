//! `roost`: the batch-apply daemon. `engine` is the pipeline (synchronous, testable over a
//! simulated disk); `serve` is the async shell around it (spool watching, workers, signals);
//! `cli` is the command line. `main.rs` only parses flags and calls into here.
#![forbid(unsafe_code)]

pub mod batch;
pub mod cli;
pub mod config;
pub mod control;
pub mod crash;
pub mod drill;
pub mod engine;
pub mod metrics;
pub mod notify;
pub mod owner;
pub mod serve;
pub mod spool;
pub mod trigger;
pub mod verify;

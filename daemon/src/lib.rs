//! `roost`: the command line (`cli`) and the drills (`drill`) of the batch-apply daemon,
//! over the engine crate `roost-engine` (`engine/`), whose modules it re-exports so that
//! `roost::pipeline` and the rest name the same things as before the split (issue 46).
//!
//! - `drill`: `roost drill`, the crash and failover drills, which run `roost serve` as child
//!   processes (`drill::child`, public so black-box tests start the daemon the same way).
//! - `cli`: the command line. `main.rs` only sets up logging and calls `cli::run`.
#![forbid(unsafe_code)]

pub use roost_engine::{
    batch, cluster, config, control, error, intake, layout, logging, no_transparent_huge_pages,
    ops, pipeline, replica, serve, spool,
};

pub mod cli;
pub mod drill;

//! `roost`: the command line of the batch-apply daemon (`cli`; `main.rs` only sets up logging
//! and calls `cli::run`), over the engine crate `roost-engine` (`engine/`) and the drills'
//! crate `roost-drill` (`drill/`: `roost drill`, which runs `roost serve` as child processes;
//! `drill::child` is public so black-box tests start the daemon the same way). It re-exports
//! both, so `roost::pipeline`, `roost::drill` and the rest name what they named before the
//! split (issue 46).
#![forbid(unsafe_code)]

pub use roost_engine::{
    batch, cluster, config, control, error, intake, layout, logging, no_transparent_huge_pages,
    ops, pipeline, replica, serve, spool,
};

pub mod cli;

/// `roost drill`, a crate of its own (`drill/`).
pub use roost_drill as drill;

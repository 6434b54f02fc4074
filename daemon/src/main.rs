//! The `roost` binary: parse flags, set up logging, call the library, exit with its code.

#![forbid(unsafe_code)]

use clap::Parser;
use std::io::Write;
use tracing::level_filters::LevelFilter;

/// mimalloc instead of glibc's malloc: allocation and freeing were a quarter of the bulk
/// path's samples (many small, short-lived buffers per batch across threads), and 20 bulk
/// files of 1,000 lines took 14% less time with it (medians of 9 alternating pairs;
/// docs/benchmarks.md, "Intake").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    stop_on_any_panic();
    let cli = roost::cli::Cli::parse();
    // The daemon logs at info; one-shot commands only say something when it matters.
    // ROOST_LOG, ROOST_LOG_FORMAT and the journal: engine/src/logging.rs.
    let default = match cli.command {
        roost::cli::Command::Serve { .. } => LevelFilter::INFO,
        _ => LevelFilter::WARN,
    };
    roost::logging::init(default);
    roost::no_transparent_huge_pages();
    let code = match roost::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // A failed write to stderr is no reason to exit with another class; a reader of
            // stdout that went away is no failure at all.
            if !roost::cli::is_broken_pipe(&e) {
                let _ = writeln!(std::io::stderr(), "roost: {}", roost::cli::failure_text(&e));
            }
            roost::cli::exit_code(&e)
        }
    };
    std::process::exit(code);
}

/// A panic anywhere (a shard pool thread, a worker on tokio's blocking pool, the serve loop)
/// is a bug: the whole process stops with `EXIT_SOFTWARE` (70) at once, instead of tokio
/// swallowing the task's panic and the daemon running on without that part. Recovery on
/// restart finishes whatever was claimed, as after any crash. Writing the message may fail;
/// that changes nothing.
fn stop_on_any_panic() {
    std::panic::set_hook(Box::new(|info| {
        let _ = writeln!(std::io::stderr(), "roost: internal error (panic): {info}");
        std::process::exit(roost::error::EXIT_SOFTWARE);
    }));
}

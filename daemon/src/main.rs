//! The `roost` binary: parse flags, set up logging, call the library, exit with its code.

use clap::Parser;
use std::io::{IsTerminal, Write};

fn main() {
    let cli = roost::cli::Cli::parse();
    // Plain, colourless lines when not on a terminal (systemd's journal captures stderr).
    // The daemon logs at info; one-shot commands only say something when it matters.
    let default = match cli.command {
        roost::cli::Command::Serve => tracing::Level::INFO,
        _ => tracing::Level::WARN,
    };
    let level = std::env::var("ROOST_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(default);
    // ROOST_LOG_FORMAT=json: one JSON object per line. Under systemd (JOURNAL_STREAM set) the
    // journal adds timestamps, so plain lines carry none; never colour unless on a terminal.
    let json = std::env::var("ROOST_LOG_FORMAT").is_ok_and(|f| f == "json");
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !journal)
        .with_max_level(level);
    if json {
        builder.json().init();
    } else if journal {
        builder.without_time().init();
    } else {
        builder.init();
    }
    let code = match roost::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // A failed write to stderr is no reason to exit with another class.
            let _ = writeln!(std::io::stderr(), "roost: {e:#}");
            roost::cli::exit_code(&e)
        }
    };
    std::process::exit(code);
}

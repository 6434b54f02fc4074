//! The `roost` binary: parse flags, set up logging, call the library, exit with its code.

use clap::Parser;
use std::io::IsTerminal;

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
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_max_level(level)
        .init();
    let code = match roost::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("roost: {e:#}");
            roost::cli::exit_code(&e)
        }
    };
    std::process::exit(code);
}

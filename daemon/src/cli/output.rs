//! What a command prints: its answer on stdout, flushed (a closed pipe is an error the
//! caller sees, `is_broken_pipe`).

/// Writes a command's answer to stdout. A reader that went away (`roost scan | head`) is not
/// a failure of roost: that error is `BrokenPipe`, which `cli::exit_code` maps to 0 (and `main`
/// does not report); a print that panicked on it would have exited 70.
pub(super) fn out(text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())?;
    o.flush()
}

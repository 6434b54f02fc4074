//! `roost submit [--wait] FILE...`: deliver each file into the spool (through
//! [`crate::spool::deliver`], the one client-side delivery), then optionally wait for each
//! result, print it (a bulk file's: every line) and remove it from `out/`. Exit 0 when all committed, 1 when any
//! was rejected or conflicted, 2 when any was invalid, timed out, or could not be delivered at all (a missing or
//! unwritable spool, an unreadable file: README's contract, whatever the cause's class).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::batch::{BatchResult, Status};
use crate::config::Config;
use crate::error::{CommandError, EXIT_FAILED, EXIT_INVALID, EXIT_OK};
use crate::spool::SpoolPaths;

pub(super) fn submit(
    cfg: &Config,
    wait: bool,
    timeout: Duration,
    files: &[PathBuf],
) -> anyhow::Result<i32> {
    let sp = SpoolPaths::new(&cfg.spool_dir());
    let deadline = Instant::now() + timeout;
    if wait {
        wait_for_spool(&sp, deadline);
    }
    let names = deliver_all(&sp, files).context(CommandError::usage("submit failed"))?;
    if !wait {
        return Ok(EXIT_OK);
    }
    let mut code = EXIT_OK;
    for name in names {
        let Some(text) = wait_for_result(&sp, &name, deadline) else {
            let _ = writeln!(
                std::io::stderr(),
                "roost: no result for {name} within {} s",
                timeout.as_secs()
            );
            code = EXIT_INVALID;
            continue;
        };
        super::output::out(&text)?;
        code = code.max(exit_for(&text));
        remove_result(&sp, &name);
    }
    Ok(code)
}

/// Removes `out/NAME` once its result is printed (README: the client deletes it once read),
/// so the next submit of the same file gets its own name again. A result that cannot be
/// removed changes no answer and no exit code: the batch is answered; the message says what
/// the next submit of NAME will be called and why.
fn remove_result(sp: &SpoolPaths, name: &str) {
    let path = sp.out.join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "roost: warning: cannot remove the result {} once read: {e} (the next submit of {name} gets another name until it is removed; clients need write access to {})",
                path.display(),
                sp.out.display()
            );
        }
    }
}

/// The exit code a result file calls for: its worst line's (a bulk file's result has one
/// line per batch).
fn exit_for(text: &str) -> i32 {
    let line_code = |line: &str| match serde_json::from_str::<BatchResult>(line).map(|r| r.status())
    {
        Ok(Status::Committed) => EXIT_OK,
        Ok(Status::Rejected | Status::Conflict) => EXIT_FAILED,
        Ok(Status::Invalid) | Err(_) => EXIT_INVALID,
    };
    let lines = text.lines().filter(|l| !l.trim().is_empty());
    lines.map(line_code).max().unwrap_or(EXIT_INVALID)
}

/// With `--wait`, a spool that does not exist yet is waited for until the deadline: `roost
/// serve &` followed at once by `roost submit --wait` (README's quickstart) finds a daemon
/// still making its data directory. Says once on stderr what it waits for; at the deadline
/// delivery fails as without `--wait` (exit 2, naming the directory).
fn wait_for_spool(sp: &SpoolPaths, deadline: Instant) {
    let ready = || sp.tmp.is_dir() && sp.new.is_dir();
    if ready() {
        return;
    }
    let _ = writeln!(
        std::io::stderr(),
        "roost: waiting for the spool {} (is `roost serve` starting?)",
        sp.new.display()
    );
    while !ready() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Delivers every file under a free spool name, in order; returns the names used.
fn deliver_all(sp: &SpoolPaths, files: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    for d in [&sp.tmp, &sp.new] {
        if !d.is_dir() {
            anyhow::bail!("spool directory {} does not exist (is `roost serve` set up with this --data-dir/--spool-dir?)", d.display());
        }
    }
    let mut names = Vec::new();
    for f in files {
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let base = f
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| crate::spool::valid_spool_name(n))
            .with_context(|| format!("{}: not a usable spool file name", f.display()))?;
        let name = free_name(sp, base);
        crate::spool::deliver(sp, &name, &bytes)
            .with_context(|| format!("delivering {} as {name}", f.display()))?;
        let _ = writeln!(std::io::stderr(), "submitted {} as {}", f.display(), name);
        names.push(name);
    }
    Ok(names)
}

/// The result file for `name` once it appears, or `None` at the deadline.
fn wait_for_result(sp: &SpoolPaths, name: &str, deadline: Instant) -> Option<String> {
    let out = sp.out.join(name);
    loop {
        match std::fs::read_to_string(&out) {
            Ok(t) => return Some(t),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => return None,
        }
    }
}

/// The file's own name unless new/, out/ or failed/ already has it; then NAME-1, NAME-2, ...
fn free_name(sp: &SpoolPaths, base: &str) -> String {
    let taken = |n: &str| {
        [&sp.new, &sp.out, &sp.failed]
            .iter()
            .any(|d| d.join(n).symlink_metadata().is_ok())
    };
    if !taken(base) {
        return base.to_owned();
    }
    let (stem, ext) = match base.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => (s, format!(".{e}")),
        _ => (base, String::new()),
    };
    (1u64..)
        .map(|n| format!("{stem}-{n}{ext}"))
        .find(|n| !taken(n))
        .unwrap_or_else(|| base.to_owned())
}

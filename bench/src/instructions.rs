//! `roost-bench --instructions` (issue 47): the CPU each intake costs per batch, as
//! instructions counted by valgrind's callgrind, which gives the same count on a busy machine
//! as on a quiet one (time does not: these machines are shared, and `perf stat` has no
//! hardware counters on their VMs). For each intake (one closed-loop client dropping spool
//! files, one closed-loop stream client, 16 closed-loop stream clients at once, one bulk
//! file) a fresh `roost serve` runs under
//! `valgrind --tool=callgrind` with the default configuration; after a warm-up the counters
//! are zeroed (`callgrind_control --zero`), the intake's batches run, and the counters are
//! dumped (`callgrind_control --dump`): every instruction of every thread of the daemon
//! between the two, divided by the batches answered. Batches of 10 creates of ~100 B, as the
//! other benchmarks. Under valgrind the daemon runs some 50 times slower, so a cell is a few
//! hundred batches; the count per batch varies by a few percent between runs (group sizes
//! change with timing), which is what it can show: a change that costs more. Callgrind counts
//! the daemon's own instructions (user space): the kernel's work in its system calls (fsync,
//! rename, the socket) is not in the count.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use roost::drill::child::ServeChild;

use crate::cluster::clients::{bulk_file, stream_closed_loop_count};
use crate::replication::roost_bin;
use crate::spool::{closed_loop, Workload};

/// The batches: the other benchmarks'.
const W: Workload = Workload {
    ops: 10,
    record_bytes: 100,
};
/// Start-up under valgrind is slow; an answer too.
const READY_LIMIT: Duration = Duration::from_secs(300);

/// The warm-up, each closed-loop cell and the bulk file's lines (`ROOST_BENCH_QUICK`: the CI
/// smoke's).
fn sizes() -> (Duration, Duration, usize) {
    if std::env::var_os("ROOST_BENCH_QUICK").is_some() {
        (Duration::from_secs(1), Duration::from_secs(1), 20)
    } else {
        (Duration::from_secs(3), Duration::from_secs(10), 500)
    }
}

#[derive(Clone, Copy, Debug)]
enum Intake {
    Files,
    Stream,
    /// 16 closed-loop stream clients at once: what groups across connections share
    /// (`intake/stream_gather.rs`, issue 47).
    Streams,
    Bulk,
}

impl Intake {
    fn name(self) -> &'static str {
        match self {
            Intake::Files => "spool files, 1 closed-loop client",
            Intake::Stream => "stream socket, 1 closed-loop client",
            Intake::Streams => "stream socket, 16 closed-loop clients",
            Intake::Bulk => "bulk file",
        }
    }
}

pub fn run() -> anyhow::Result<()> {
    need_tools()?;
    let bin = roost_bin()?;
    let base = crate::bench_dir().join("instructions");
    let _ = std::fs::remove_dir_all(&base);
    println!(
        "roost instructions per batch ({}; callgrind, valgrind {}): batches of {} creates of ~{} B, default configuration",
        bin.display(),
        tool_version()?,
        W.ops,
        W.record_bytes
    );
    for intake in [Intake::Files, Intake::Stream, Intake::Streams, Intake::Bulk] {
        let (batches, instructions) =
            measure(&bin, &base, intake).with_context(|| format!("measuring {}", intake.name()))?;
        println!(
            "{:<38} {:>12.0} instructions per batch ({batches} batches, {instructions} instructions)",
            intake.name(),
            instructions as f64 / batches as f64
        );
    }
    Ok(())
}

fn need_tools() -> anyhow::Result<()> {
    for tool in ["valgrind", "callgrind_control"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .with_context(|| format!("looking for {tool}"))?;
        ensure!(
            found.status.success(),
            "{tool} is missing: apt-get install valgrind (roost-bench --instructions counts with callgrind)"
        );
    }
    Ok(())
}

fn tool_version() -> anyhow::Result<String> {
    let out = Command::new("valgrind").arg("--version").output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// One intake on a fresh daemon under callgrind: (batches answered, instructions).
fn measure(bin: &Path, base: &Path, intake: Intake) -> anyhow::Result<(u64, u64)> {
    let dir = base.join(format!("{intake:?}").to_lowercase());
    std::fs::create_dir_all(&dir)?;
    let dump = dir.join("callgrind.out");
    let wrapper = dir.join("roost-under-callgrind");
    let script = format!(
        "#!/bin/sh\nexec valgrind -q --tool=callgrind --callgrind-out-file={} {} \"$@\"\n",
        dump.display(),
        bin.display()
    );
    std::fs::write(&wrapper, script)?;
    set_executable(&wrapper)?;
    let data = dir.join("data");
    let mut child = ServeChild::spawn(&wrapper, &data, &dir.join("roost.log"), |c| {
        c.env_remove("RUNTIME_DIRECTORY");
    })?;
    child.ready(READY_LIMIT)?;
    let spool = data.join("spool");
    let socket = data.join("stream.sock");
    let (warm_up, cell, bulk_lines) = sizes();
    drive(intake, &spool, &socket, warm_up, 20)?;
    control(child.id(), "--zero")?;
    let batches = drive(intake, &spool, &socket, cell, bulk_lines)?;
    control(child.id(), "--dump")?;
    child.stop(READY_LIMIT)?;
    let instructions = dumped_instructions(&dir, "callgrind.out")?;
    ensure!(batches > 0, "no batch was answered in the measured cell");
    Ok((batches as u64, instructions))
}

/// Runs `intake` for `dur` (a bulk file: one of `lines` lines); the batches answered.
fn drive(
    intake: Intake,
    spool: &Path,
    socket: &Path,
    dur: Duration,
    lines: usize,
) -> anyhow::Result<usize> {
    match intake {
        Intake::Files => Ok(closed_loop(spool, 1, dur, &W)?.1.len()),
        Intake::Stream => stream_closed_loop_count(socket, 1, dur, &W),
        Intake::Streams => stream_closed_loop_count(socket, 16, dur, &W),
        Intake::Bulk => {
            bulk_file(spool, lines, &W)?;
            Ok(lines)
        }
    }
}

fn set_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", path.display()))
}

/// `callgrind_control ARG PID`, which valgrind takes up at its next scheduling point (the
/// daemon's threads wake every 200 ms at the latest).
fn control(pid: u32, arg: &str) -> anyhow::Result<()> {
    let out = Command::new("callgrind_control")
        .arg(arg)
        .arg(pid.to_string())
        .output()
        .context("callgrind_control")?;
    if !out.status.success() {
        bail!(
            "callgrind_control {arg} {pid}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The instructions of the first dump (`callgrind.out.1`: the one `--dump` asked for, after
/// `--zero`), from its `summary:` or `totals:` line.
fn dumped_instructions(dir: &Path, stem: &str) -> anyhow::Result<u64> {
    let path: PathBuf = dir.join(format!("{stem}.1"));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("the callgrind dump {}", path.display()))?;
    let line = text
        .lines()
        .find(|l| l.starts_with("summary:") || l.starts_with("totals:"))
        .with_context(|| format!("no summary line in {}", path.display()))?;
    let n = line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("an empty summary in {}", path.display()))?;
    n.parse()
        .with_context(|| format!("summary {n:?} in {}", path.display()))
}

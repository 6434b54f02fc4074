//! `roost serve` under `strace -f`, for the fault walk (`faults.rs`): start it with a syscall
//! set traced and, optionally, one fault injected (`--inject=SET:error=ERRNO:when=N`), stop or
//! kill it within a bound, and read the trace back (which calls were made, by which thread,
//! which ones got the fault).
//!
//! strace 6.1 counts `when=N` per syscall and per tracee: with `-f` every thread is a tracee,
//! so `when=N` fails the N-th call of that syscall in each thread that makes N of them.
//! Killing strace does not kill its tracee (no `PTRACE_O_EXITKILL` before `--kill-on-exit`,
//! which 6.1 lacks), so [`TracedServe`] kills the daemon first, by its pid.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::BIN;

/// What to trace and what to inject.
pub struct Trace<'a> {
    /// The `-e trace=` set, e.g. `fdatasync` or `rename,renameat,renameat2`.
    pub set: &'a str,
    /// `(errno, N)`: fail the N-th call of each syscall in the set, per thread.
    pub inject: Option<(&'a str, u32)>,
    /// `-P PATH`: only calls on these paths are traced and counted (and injected).
    pub paths: Vec<PathBuf>,
    /// Extra environment for the daemon.
    pub env: Vec<(&'a str, &'a str)>,
}

/// A `roost serve` started under strace; killed (daemon first, then strace) when dropped.
pub struct TracedServe {
    strace: Child,
    pub log: PathBuf,
    pub trace: PathBuf,
}

impl TracedServe {
    /// `strace -f --seccomp-bpf -qq -y -o TRACE -e trace=SET [-e inject=..] [-P ..] --
    /// roost serve --data-dir DATA --config CONFIG`, the daemon's stderr (its log) on `log`.
    pub fn spawn(
        data: &Path,
        config: &Path,
        log: &Path,
        trace: &Path,
        t: &Trace,
    ) -> std::io::Result<Self> {
        let mut cmd = Command::new("strace");
        cmd.args(["-f", "--seccomp-bpf", "-qq", "-y", "-o"])
            .arg(trace)
            .arg("-e")
            .arg(format!("trace={}", t.set));
        if let Some((errno, n)) = t.inject {
            cmd.arg("-e")
                .arg(format!("inject={}:error={errno}:when={n}", t.set));
        }
        for p in &t.paths {
            cmd.arg("-P").arg(p);
        }
        cmd.arg("--")
            .arg(BIN)
            .args(["serve", "--data-dir"])
            .arg(data)
            .arg("--config")
            .arg(config)
            .env("ROOST_LOG", "info")
            .env_remove("ROOST_CRASH_AT");
        for (k, v) in &t.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?);
        Ok(TracedServe {
            strace: cmd.spawn()?,
            log: log.to_path_buf(),
            trace: trace.to_path_buf(),
        })
    }

    /// The daemon's pid: strace's only child (None once it has exited or before the fork).
    fn daemon_pid(&self) -> Option<rustix::process::Pid> {
        let me = self.strace.id();
        let children = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).ok()?;
        let first = children.split_whitespace().next()?;
        rustix::process::Pid::from_raw(first.parse().ok()?)
    }

    /// The exit status (strace exits with its tracee's status), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.strace.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for the daemon (and strace) to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM to the daemon (a graceful stop) and its exit status within `limit`; None if
    /// it did not stop in time (the caller kills it and fails).
    pub fn stop(&mut self, limit: Duration) -> Option<ExitStatus> {
        if let Some(st) = self.exited() {
            return Some(st);
        }
        if let Some(pid) = self.daemon_pid() {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        self.wait_exit(limit)
    }

    /// SIGKILL the daemon, then strace, and reap.
    pub fn kill(&mut self) {
        if let Some(pid) = self.daemon_pid() {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let _ = self.wait_exit(Duration::from_secs(5));
        let _ = self.strace.kill();
        let _ = self.strace.wait();
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The trace so far, parsed.
    pub fn calls(&self) -> Vec<Call> {
        parse_trace(&std::fs::read_to_string(&self.trace).unwrap_or_default())
    }
}

impl Drop for TracedServe {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One syscall as strace printed it (a call split by another thread's is counted once, at
/// its `<unfinished ...>` line).
#[derive(Clone, Debug)]
pub struct Call {
    pub tid: u32,
    pub name: String,
    /// The line, for reports (`-y` puts each fd's path in it).
    pub line: String,
    /// strace marked it `(INJECTED)`.
    pub injected: bool,
}

/// Parses `strace -f -o` output: `TID name(args) = ret [(INJECTED)]`; signal and exit lines
/// and `<... resumed>` halves are skipped.
pub fn parse_trace(text: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    for line in text.lines() {
        let Some((tid, rest)) = line.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        let (Ok(tid), Some((name, _))) = (tid.parse::<u32>(), rest.split_once('(')) else {
            continue;
        };
        if rest.starts_with('<') || rest.starts_with("---") || rest.starts_with("+++") {
            continue;
        }
        calls.push(Call {
            tid,
            name: name.to_string(),
            line: line.to_string(),
            injected: line.ends_with("(INJECTED)"),
        });
    }
    // The result of a call split by another thread's is on its `resumed` line.
    mark_resumed_injections(text, &mut calls);
    calls
}

/// Marks the `<unfinished ...>` half of each call whose `resumed` half says `(INJECTED)`.
fn mark_resumed_injections(text: &str, calls: &mut [Call]) {
    for l in text.lines() {
        if !(l.contains("resumed>") && l.ends_with("(INJECTED)")) {
            continue;
        }
        let tid = l
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<u32>().ok());
        let open = calls
            .iter_mut()
            .rev()
            .find(|c| Some(c.tid) == tid && c.line.ends_with("<unfinished ...>"));
        if let Some(c) = open {
            c.injected = true;
            c.line = format!("{} / {}", c.line, l);
        }
    }
}

/// Per syscall name, the largest number of calls any one thread made (what `when=N` counts).
pub fn max_calls_per_thread(calls: &[Call]) -> BTreeMap<String, usize> {
    let mut per: BTreeMap<(String, u32), usize> = BTreeMap::new();
    for c in calls {
        *per.entry((c.name.clone(), c.tid)).or_default() += 1;
    }
    let mut max: BTreeMap<String, usize> = BTreeMap::new();
    for ((name, _), n) in per {
        let m = max.entry(name).or_default();
        *m = (*m).max(n);
    }
    max
}

/// Whether `what` may run here: true when strace can inject; else, with
/// `ROOST_ALLOW_NO_STRACE=1`, false after a printed "NOT RUN" line with the reason (never a
/// silent skip); else the test fails and says why.
pub fn required(what: &str) -> bool {
    let Err(reason) = can_inject() else {
        return true;
    };
    if std::env::var("ROOST_ALLOW_NO_STRACE").as_deref() == Ok("1") {
        eprintln!("{what} NOT RUN (ROOST_ALLOW_NO_STRACE=1): {reason}");
        return false;
    }
    panic!("{what} needs strace with --inject: {reason} (install strace, allow ptrace, or set ROOST_ALLOW_NO_STRACE=1)");
}

/// Whether strace can trace and inject here: runs `echo` with its write failed by EIO and
/// looks for echo's own error. Err names the reason (no strace, ptrace refused, no fault).
pub fn can_inject() -> Result<(), String> {
    let out = Command::new("strace")
        .args(["-qq", "-o", "/dev/null", "-e", "trace=write"])
        .args(["-e", "inject=write:error=EIO:when=1", "--", "echo", "probe"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run strace: {e}"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Input/output error") {
        Ok(())
    } else {
        Err(format!(
            "strace ran but injected nothing (ptrace restricted?): exit {:?}, stderr: {}",
            out.status.code(),
            err.trim()
        ))
    }
}

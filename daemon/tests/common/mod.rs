//! Helpers shared by the black-box tests of the `roost` binary.
#![allow(dead_code)] // each test file uses its own subset

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_roost");

/// Polls `f` until it holds; fails the test naming `what` after `limit`.
pub fn wait_for<F: FnMut() -> bool>(what: &str, limit: Duration, mut f: F) {
    let until = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills a child process when the test ends, passing or not (a leaked daemon would hold the
/// test harness's pipes open and keep running).
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Drops a batch into a spool the client's way ([`roost::spool::deliver`]: `tmp/`, fsync,
/// rename into `new/`, fsync `new/`).
pub fn drop_in(spool: &Path, name: &str, body: &[u8]) {
    roost::spool::deliver(&roost::spool::SpoolPaths::new(spool), name, body)
        .unwrap_or_else(|e| panic!("delivering {name}: {e}"));
}

/// `kill -SIG PID` (SIGSTOP freezes a daemon for a power cut or a partition, SIGCONT thaws it).
pub fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
}

/// `roost ARGS... --data-dir DATA`, its output.
pub fn roost_at(data: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .expect("run roost")
}

/// Drops `KEY.json`, one create on shard `s` under request key `KEY`, and waits up to
/// `limit` for its result in `out/`.
pub fn drop_and_wait(spool: &Path, key: &str, limit: Duration) {
    let name = format!("{key}.json");
    let body =
        format!(r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"s","record":{{}}}}]}}"#);
    drop_in(spool, &name, body.as_bytes());
    wait_for(&format!("the result of {name}"), limit, || {
        spool.join("out").join(&name).exists()
    });
}

/// Starts `roost serve --data-dir DATA ARGS...` logging to `log`, and returns once it logs
/// "serving" (recovery done); the daemon is killed when the returned child is dropped.
pub fn serve_ready(data: &Path, log: &Path, args: &[&str]) -> roost::drill::child::ServeChild {
    let mut d = roost::drill::child::ServeChild::spawn(Path::new(BIN), data, log, |c| {
        c.args(args);
    })
    .unwrap_or_else(|e| panic!("spawning roost serve: {e:#}"));
    d.ready(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("roost serve never served: {e:#}"));
    d
}

/// SIGTERM to a daemon under test and its exit code (bounded wait).
pub fn stop_code(d: &mut roost::drill::child::ServeChild) -> Option<i32> {
    d.stop(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e:#}"))
        .code()
}

/// `promtool check metrics` on `text`: its verdict, or a failure naming the package.
pub fn promtool(text: &str) -> Result<(), String> {
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => panic!(
            "promtool not found ({e}): install prometheus for promtool \
             (apt-get install prometheus; .ci/run does)"
        ),
    };
    let mut stdin = child.stdin.take().expect("promtool's stdin");
    std::io::Write::write_all(&mut stdin, text.as_bytes()).expect("feed promtool");
    drop(stdin);
    let out = child.wait_with_output().expect("promtool's verdict");
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "promtool check metrics: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// `roost serve` under `strace -f`, for the fault walk.
pub mod strace;

/// Stream clients (`roost submit --stream`, raw sockets) and the daemon's memory.
pub mod stream;

//! Failures stop the daemon with their class, never hang it or leave it running without a
//! part (issue 13, item 4): a panic in a shard owner thread or in a worker on tokio's
//! blocking pool stops the whole process with 70 (EX_SOFTWARE), and recovery then finishes
//! the batch; a log line that cannot be written changes nothing.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{drop_in, wait_for, BIN};
use roost::drill::child::ServeChild;
use serde_json::{json, Value};

const BATCH: &[u8] = br#"{"request_key":"k1","ops":[{"op":"create","shard":"users","record":{"n":1}},{"op":"create","shard":"orders","record":{"n":2}}]}"#;

fn result(spool: &Path, name: &str) -> Option<Value> {
    let bytes = std::fs::read(spool.join("out").join(name)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Starts the daemon with `ROOST_CRASH_AT=point ROOST_CRASH_MODE=panic`, drops one batch,
/// and returns the exit code once it has stopped by itself.
fn panic_at(data: &Path, point: &str) -> Option<i32> {
    let log = data.with_extension("log");
    let mut d = ServeChild::spawn(Path::new(BIN), data, &log, |c| {
        c.env("ROOST_CRASH_AT", point)
            .env("ROOST_CRASH_MODE", "panic");
    })
    .expect("spawn");
    d.ready(Duration::from_secs(20)).expect("serving");
    drop_in(&data.join("spool"), "b.json", BATCH);
    assert!(
        d.died_within(Duration::from_secs(20)),
        "the daemon kept running after a panic at {point}:\n{}",
        d.log_text()
    );
    let code = d.exited().expect("status").and_then(|s| s.code());
    assert!(
        d.log_text().contains("internal error (panic)"),
        "{}",
        d.log_text()
    );
    code
}

/// Goal: a panic in a shard owner thread (at `after_commit.0`) or in a worker task (at
/// `after_result`, on tokio's blocking pool, whose panics tokio would swallow) stops the
/// daemon with exit 70, and a restart finishes the batch with one committed result.
/// Method: the real binary with a crash point in panic mode; exit code; restart; result.
#[test]
fn a_panic_in_any_thread_stops_the_daemon_with_70_and_recovery_finishes() {
    for point in ["after_commit.0", "after_result"] {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("data");
        assert_eq!(
            panic_at(&data, point),
            Some(70),
            "exit code after a panic at {point}"
        );
        let log = t.path().join("again.log");
        let mut d = ServeChild::spawn(Path::new(BIN), &data, &log, |_| {}).expect("spawn");
        d.ready(Duration::from_secs(20))
            .expect("serving after restart");
        let spool = data.join("spool");
        wait_for("the result after recovery", Duration::from_secs(20), || {
            result(&spool, "b.json").is_some()
        });
        let r = result(&spool, "b.json").expect("result");
        assert_eq!(r["status"], json!("committed"), "{point}: {r}");
        assert_eq!(r["ops"].as_array().map(Vec::len), Some(2), "{r}");
        let st = d.stop(Duration::from_secs(20)).expect("stop");
        assert_eq!(st.code(), Some(0));
    }
}

/// Goal: log lines that cannot be written (stderr on a full device) never panic the daemon
/// or change its exit code: it serves, commits, and stops cleanly with 0.
/// Method: `roost serve` with stderr on `/dev/full` (every write fails with ENOSPC) at
/// `ROOST_LOG=debug`; one batch; SIGTERM.
#[test]
fn a_log_that_cannot_be_written_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--data-dir"])
        .arg(&data)
        .env("ROOST_LOG", "debug")
        .stdout(std::process::Stdio::null())
        .stderr(full)
        .spawn()
        .expect("spawn");
    let spool = data.join("spool");
    wait_for("the spool", Duration::from_secs(20), || {
        spool.join("new").is_dir()
    });
    drop_in(&spool, "b.json", BATCH);
    wait_for("the result", Duration::from_secs(20), || {
        result(&spool, "b.json").is_some()
    });
    let pid = child.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(std::time::Instant::now() < until, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "exit with stderr on /dev/full");
    assert_eq!(
        result(&spool, "b.json").expect("result")["status"],
        json!("committed")
    );
}

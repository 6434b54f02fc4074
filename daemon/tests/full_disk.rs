//! A full disk is not a crash (issue 13, item 7), on a real file system: the real `roost
//! serve` on a small loop-mounted ext4 image that a ballast file fills. When a log has no room
//! for its next (spare) segment, intake pauses: the batch file waits in `new/`, reads and
//! `status` go on and say why, a log line names the file and the bytes it needs; once the
//! ballast is gone intake resumes by itself, the waiting batch commits, and nothing
//! acknowledged is lost (`roost verify`).
//!
//! Needs root (loop devices, mount); without it the test prints "SKIPPED: ..." and fails,
//! unless `ROOST_ALLOW_NO_ROOT=1`.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[allow(dead_code)] // the power-cut harness uses the rest
#[path = "powercut/loopfs.rs"]
mod loopfs;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{drop_in, serve_ready, stop_code, BIN};
use loopfs::{Mount, MountError};
use serde_json::Value;

const IMAGE_BYTES: u64 = 64 << 20;
const SHARD_SEGMENT: u64 = 1 << 20;
const WAL_SEGMENT: u64 = 4 << 20;
const CONFIG: &str = r#"
wal_segment_bytes = 4194304
shard_segment_bytes = 1048576
rescan_interval_ms = 100
batch_ops_max = 4
[shards.a]
"#;
/// Room left beside the ballast: less than a shard segment, enough for results.
const LEFT_BYTES: u64 = 600 << 10;
const STEP: Duration = Duration::from_secs(20);

/// A batch of one create whose record is about 60 KB (a shard segment holds ~17).
fn body(key: &str) -> Vec<u8> {
    let pad = "x".repeat(60_000);
    format!(r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"a","record":{{"pad":"{pad}"}}}}]}}"#)
        .into_bytes()
}

fn roost(cfg: &Path, data: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(cfg)
        .arg("--data-dir")
        .arg(data)
        .output()
        .expect("run roost")
}

fn status(cfg: &Path, data: &Path) -> Value {
    let out = roost(cfg, data, &["status", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn result(data: &Path, name: &str) -> Option<Value> {
    let text = std::fs::read(data.join("spool/out").join(name)).ok()?;
    serde_json::from_slice(&text).ok()
}

fn await_result(data: &Path, name: &str, limit: Duration) -> Option<Value> {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = result(data, name) {
            return Some(v);
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes free on the file system holding `dir` (`df`, so no `unsafe` statvfs here).
fn free_bytes(dir: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()
        .expect("df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .next()
        .expect("df prints the free bytes")
}

/// Fills the file system holding `dir` with a preallocated ballast file, leaving `left`.
fn fill(dir: &Path, left: u64) -> PathBuf {
    let ballast = dir.join("ballast");
    let len = free_bytes(dir).saturating_sub(left);
    let ok = Command::new("fallocate")
        .arg("-l")
        .arg(len.to_string())
        .arg(&ballast)
        .status()
        .expect("fallocate");
    assert!(ok.success(), "fallocate -l {len}");
    ballast
}

fn mounted(tmp: &Path) -> Option<Mount> {
    let img = tmp.join("disk.img");
    loopfs::make_image(&img, IMAGE_BYTES).expect("mkfs");
    // No blocks reserved for root: the test (root) and the daemon see the same free space.
    let tuned = Command::new("tune2fs").args(["-m", "0"]).arg(&img).output();
    assert!(tuned.is_ok_and(|o| o.status.success()), "tune2fs -m 0");
    match Mount::attach(&img, &tmp.join("mnt")) {
        Ok(m) => Some(m),
        Err(MountError::NotPermitted(why)) => {
            loopfs::skip_or_fail("full-disk test", &why);
            None
        }
        Err(MountError::Other(e)) => panic!("loop mount: {e}"),
    }
}

/// Goal: a full disk pauses intake instead of stopping the daemon, says why, and resumes by
/// itself once there is room; nothing acknowledged is lost.
/// Method: batches of ~60 KB until one gets no result because the shard's roll found no room
/// for the next spare segment (the ballast leaves 600 KiB, a shard segment is 1 MiB); check
/// status, metrics, the log, reads and `new/`; remove the ballast; the batch commits.
#[test]
fn a_full_disk_pauses_intake_and_it_resumes_when_space_returns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let Some(mnt) = mounted(tmp.path()) else {
        return;
    };
    let data = mnt.dir.join("data");
    let cfg = tmp.path().join("roost.toml");
    std::fs::write(&cfg, CONFIG).expect("config");
    let log = tmp.path().join("serve.log");
    let mut d = serve_ready(&data, &log, &["--config", cfg.to_str().expect("utf-8")]);
    let spool = data.join("spool");
    drop_in(&spool, "b0.json", &body("k0"));
    let first = await_result(&data, "b0.json", STEP).unwrap_or_else(|| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("no first result; log:\n{text}")
    });
    assert_eq!(first["status"], "committed", "{first}");
    let ballast = fill(&mnt.dir, LEFT_BYTES);
    let mut waiting = None;
    for i in 1..=60 {
        let name = format!("b{i}.json");
        drop_in(&spool, &name, &body(&format!("k{i}")));
        match await_result(&data, &name, Duration::from_secs(3)) {
            Some(v) => assert_eq!(v["status"], "committed", "{name}: {v}"),
            None => {
                waiting = Some(name);
                break;
            }
        }
    }
    let waiting = waiting.expect("the disk never filled: no batch waited");
    assert_eq!(
        d.exited().expect("wait"),
        None,
        "the daemon stopped on a full disk"
    );
    let st = status(&cfg, &data);
    let intake = &st["intake"];
    assert_eq!(intake["state"], "paused", "{st}");
    // Usually shard a's roll (its segments grow from 64 KiB to 1 MiB: the next one's size,
    // at most 1 MiB); a checkpoint by time can get there first with the key table's (4 MiB).
    let needed = intake["needed_bytes"].as_u64().unwrap_or(0);
    match intake["part"].as_str() {
        Some("shard a") => assert!(
            needed.is_power_of_two() && (64 << 10..=SHARD_SEGMENT).contains(&needed),
            "{st}"
        ),
        Some("keys" | "wal" | "audit") => assert_eq!(needed, WAL_SEGMENT, "{st}"),
        _ => panic!("an unknown part paused intake: {st}"),
    }
    assert!(
        intake["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("/SPARE")),
        "{st}"
    );
    assert!(
        spool.join("new").join(&waiting).exists(),
        "the batch waits in new/"
    );
    let metrics =
        String::from_utf8_lossy(&roost(&cfg, &data, &["status", "--metrics"]).stdout).into_owned();
    assert!(metrics.contains("roost_intake_paused 1"), "{metrics}");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("intake paused") && text.contains("needed_bytes"),
        "no log line says why and how much: {text}"
    );
    let scan = roost(&cfg, &data, &["scan", "a"]);
    assert!(scan.status.success(), "reads go on while paused");
    std::fs::remove_file(&ballast).expect("remove ballast");
    let v = await_result(&data, &waiting, STEP).expect("intake never resumed");
    assert_eq!(v["status"], "committed", "{v}");
    assert_eq!(status(&cfg, &data)["intake"]["state"], "open");
    assert!(std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("intake resumed"));
    assert_eq!(stop_code(&mut d), Some(0));
    let verify = roost(&cfg, &data, &["verify"]);
    assert!(
        verify.status.success(),
        "verify: {}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

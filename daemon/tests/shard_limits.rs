//! Shards a client cannot multiply without limit (issue 25, item 3), black-box on the real
//! binary: 10,000 batches each naming a new shard leave the daemon serving, within a bounded
//! number of threads and a bounded disk (the default configuration); shards left idle give
//! their file descriptors back (`shard_idle_close_ms`).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// File descriptors of process `pid` now.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Memory maps of process `pid` now of files under `dir`.
fn maps_under(pid: u32, dir: &Path) -> usize {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let dir = dir.to_string_lossy();
    text.lines().filter(|l| l.contains(dir.as_ref())).count()
}

/// Threads of process `pid` now.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// Bytes allocated (`st_blocks` × 512) under `dir`, every file and directory.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                return 0;
            };
            m.blocks() * 512 + if m.is_dir() { allocated(&e.path()) } else { 0 }
        })
        .sum()
}

/// A bulk file of `n` lines from `first`, each a batch creating a record on a shard of its
/// own (`new-N`).
fn new_shard_lines(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| {
            format!(
                "{{\"request_key\":\"k{i}\",\"ops\":[{{\"op\":\"create\",\"shard\":\"new-{i}\",\"record\":{{}}}}]}}\n"
            )
        })
        .collect()
}

/// The result lines of `out/NAME`, once it is there.
fn result_lines(spool: &Path, name: &str) -> Option<Vec<Value>> {
    let text = std::fs::read_to_string(spool.join("out").join(name)).ok()?;
    text.lines().map(|l| serde_json::from_str(l).ok()).collect()
}

/// Goal: the issue's "done when". Method: `roost serve` on the default configuration; one
/// batch makes shard `s`; then 10 bulk files of 1,000 lines, each line a batch creating on a
/// new shard, are dropped at once. While they run, the daemon's threads are sampled; once
/// every line is answered: at most 64 threads more than at start, at most 2 GiB allocated
/// in the data directory, every line committed (the first `shards_max` shards) or rejected
/// naming `shards_max`, and a normal batch on shard `s` still commits.
#[test]
fn ten_thousand_new_shard_names_leave_the_daemon_serving_within_its_bounds() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let mut d = serve_ready(&data, &tmp.path().join("log"), &[]);
    let spool = data.join("spool");
    let pid = d.id();
    drop_and_wait(&spool, "first", Duration::from_secs(20));
    let at_start = threads(pid);
    let t0 = Instant::now();
    for f in 0..10 {
        let body = new_shard_lines(f * 1000, 1000);
        drop_in(&spool, &format!("b{f}.jsonl"), body.as_bytes());
    }
    let mut most = at_start;
    let mut answers = Vec::new();
    for f in 0..10 {
        let name = format!("b{f}.jsonl");
        let until = Instant::now() + Duration::from_secs(120);
        let lines = loop {
            most = most.max(threads(pid));
            if let Some(l) = result_lines(&spool, &name) {
                break l;
            }
            assert!(Instant::now() < until, "no result for {name}");
            std::thread::sleep(Duration::from_millis(20));
        };
        answers.extend(lines);
    }
    let took = t0.elapsed();
    let bytes = allocated(&data);
    let committed = answers
        .iter()
        .filter(|r| r["status"] == "committed")
        .count();
    let limited = answers
        .iter()
        .filter(|r| r["status"] == "rejected")
        .filter(|r| {
            r["reason"]
                .as_str()
                .is_some_and(|s| s.contains("shards_max = 1024"))
        })
        .count();
    println!(
        "10,000 new shard names: {took:?}, threads {at_start} at start, {most} at most, \
         {bytes} bytes allocated, {committed} committed, {limited} rejected by shards_max"
    );
    assert_eq!(answers.len(), 10_000);
    assert_eq!(
        (committed, limited),
        (1023, 10_000 - 1023),
        "shard s and 1023 new ones"
    );
    assert!(most <= at_start + 64, "{most} threads, {at_start} at start");
    assert!(bytes <= 2 << 30, "{bytes} bytes allocated");
    drop_and_wait(&spool, "after", Duration::from_secs(20));
    let after = std::fs::read_to_string(spool.join("out/after.json")).expect("result");
    assert!(after.contains("\"committed\""), "{after}");
    assert_eq!(stop_code(&mut d), Some(0));
}

/// `roost status` through the control socket, once it answers.
fn status(data: &Path) -> Option<Value> {
    let text = roost::control::socket::request(&data.join("roost.sock"), "status").ok()?;
    serde_json::from_str(&text).ok()
}

/// Goal: shards left idle give back their file descriptors, and are used again as before.
/// Method: `roost serve` with `shard_idle_close_ms = 200`; one batch makes shard `s` and the
/// daemon's descriptors are counted; a bulk file of 300 lines, each creating on a new shard,
/// opens 300 shards (a segment and a lock each); once it is answered, within 20 s the count
/// falls back to at most 8 above the start and status says no more than one shard is open
/// of the 301 that exist. A batch deleting a record of one of the new shards then commits
/// (its shard reopened), and the count falls back again.
#[test]
fn idle_shards_give_their_file_descriptors_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = tmp.path().join("roost.toml");
    std::fs::write(&cfg, "shard_idle_close_ms = 200\n").expect("config");
    let data = tmp.path().join("data");
    let cfg_arg = cfg.to_str().expect("utf-8 path");
    let mut d = serve_ready(&data, &tmp.path().join("log"), &["--config", cfg_arg]);
    let spool = data.join("spool");
    let pid = d.id();
    drop_and_wait(&spool, "first", Duration::from_secs(20));
    let at_start = fds(pid);
    drop_in(&spool, "many.jsonl", new_shard_lines(0, 300).as_bytes());
    let (mut most, until) = (at_start, Instant::now() + Duration::from_secs(120));
    let mut most_maps = 0;
    let lines = loop {
        most = most.max(fds(pid));
        most_maps = most_maps.max(maps_under(pid, &data.join("shards")));
        if let Some(l) = result_lines(&spool, "many.jsonl") {
            break l;
        }
        assert!(Instant::now() < until, "no result for many.jsonl");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        lines.iter().all(|r| r["status"] == "committed"),
        "{lines:?}"
    );
    let settled = |what: &str| {
        wait_for(what, Duration::from_secs(20), || {
            fds(pid) <= at_start + 8
                && status(&data).is_some_and(|v| v["shard_limit"]["open"].as_u64() <= Some(1))
        });
    };
    settled("descriptors back after 300 new shards");
    let after = fds(pid);
    let maps = maps_under(pid, &data.join("shards"));
    let v = status(&data).expect("status");
    println!(
        "300 new shards: {at_start} descriptors at start, {most} at most, {after} once idle; \
         segment maps {most_maps} at most, {maps} once idle; shard_limit {}",
        v["shard_limit"]
    );
    assert!(maps <= 2, "{maps} segment maps left of {most_maps}");
    assert!(
        most >= at_start + 300,
        "the shards were open: {most} at most"
    );
    assert_eq!(v["shard_limit"]["shards"], 301);
    let id = lines[7]["ops"][0]["id"].as_u64().expect("an id");
    let del =
        format!(r#"{{"request_key":"del","ops":[{{"op":"delete","shard":"new-7","id":{id}}}]}}"#);
    drop_in(&spool, "del.json", del.as_bytes());
    let out = spool.join("out/del.json");
    wait_for("the delete's result", Duration::from_secs(20), || {
        out.exists()
    });
    let r = std::fs::read_to_string(&out).expect("result");
    assert!(r.contains("\"committed\""), "{r}");
    settled("descriptors back after the reopen");
    assert!(status(&data).is_some_and(|v| v["shard_limit"]["reopens"].as_u64() >= Some(1)));
    assert_eq!(stop_code(&mut d), Some(0));
}

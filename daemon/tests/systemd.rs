//! The service contract: systemd's notify protocol over a real Unix datagram socket, graceful
//! SIGTERM in the middle of a stream, exit codes, and `roost status`.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

fn batch(i: usize) -> Vec<u8> {
    format!(r#"{{"request_key":"k{i}","ops":[{{"op":"create","shard":"a","record":{{"i":{i}}}}},{{"op":"create","shard":"b","record":{{"i":{i}}}}}]}}"#).into_bytes()
}

/// Collects every datagram sent to a socket, as systemd would receive them.
fn listen(path: &Path) -> Arc<Mutex<Vec<String>>> {
    let sock = UnixDatagram::bind(path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match sock.recv(&mut buf) {
                Ok(n) => g
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    if Arc::strong_count(&g) == 1 {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    got
}

/// Goal: READY=1 only after recovery (the batch a crash left claimed is finished, its
/// result written, before READY), STATUS= during recovery and while serving, WATCHDOG=1
/// pings when WATCHDOG_USEC is set, STOPPING=1 on SIGTERM, then exit 0.
#[test]
fn notify_protocol() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let spool = data.join("spool");
    // Leave a claimed, unfinished batch: the daemon kills itself after the claim's sync.
    let mut c = Guard(
        Command::new(BIN)
            .args(["serve", "--data-dir"])
            .arg(&data)
            .env("ROOST_CRASH_AT", "after_claim_sync")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("spool", Duration::from_secs(20), || {
        spool.join("new").is_dir()
    });
    drop_in(&spool, "pending.json", &batch(1));
    let st = c.0.wait().unwrap();
    assert!(!st.success(), "the crash point must have killed it");
    assert!(!spool.join("out/pending.json").exists());

    let sock = t.path().join("notify.sock");
    let got = listen(&sock);
    // systemd sets WATCHDOG_PID to the service's pid; `exec` keeps the shell's.
    let d = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "WATCHDOG_PID=$$ exec {BIN} serve --data-dir {}",
            data.display()
        ))
        .env("NOTIFY_SOCKET", &sock)
        .env("WATCHDOG_USEC", "200000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut d = Guard(d);
    wait_for("READY=1", Duration::from_secs(20), || {
        got.lock().unwrap().iter().any(|m| m.contains("READY=1"))
    });
    // Recovery finished the pending batch before READY.
    assert!(
        spool.join("out/pending.json").exists(),
        "READY before recovery finished"
    );
    wait_for("watchdog pings", Duration::from_secs(10), || {
        got.lock()
            .unwrap()
            .iter()
            .filter(|m| m.contains("WATCHDOG=1"))
            .count()
            >= 3
    });
    wait_for("serving status", Duration::from_secs(10), || {
        got.lock()
            .unwrap()
            .iter()
            .any(|m| m.contains("STATUS=serving, 0 batches in flight"))
    });
    Command::new("kill")
        .args(["-TERM", &d.0.id().to_string()])
        .status()
        .unwrap();
    let st = d.0.wait().unwrap();
    assert_eq!(st.code(), Some(0));
    std::thread::sleep(Duration::from_millis(150));
    let msgs = got.lock().unwrap().clone();
    let pos = |needle: &str| msgs.iter().position(|m| m.contains(needle));
    let recovering = pos("STATUS=recovering").expect("STATUS during recovery");
    let ready = pos("READY=1").unwrap();
    let stopping = pos("STOPPING=1").expect("STOPPING=1 on SIGTERM");
    assert!(recovering < ready && ready < stopping, "{msgs:?}");
    assert!(
        msgs[..ready].iter().all(|m| !m.contains("WATCHDOG")),
        "watchdog before READY: {msgs:?}"
    );
}

/// Goal: SIGTERM in the middle of a stream: the daemon stops taking files, finishes what is
/// in flight, exits 0; nothing that got a result is lost, and a restart finishes the rest
/// with no duplicate.
#[test]
fn sigterm_mid_stream_loses_nothing() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let spool = data.join("spool");
    let log = t.path().join("serve.log");
    let mut d = serve_ready(&data, &log, &[]);
    let n = 400;
    for i in 0..n {
        drop_in(&spool, &format!("f{i:04}.json"), &batch(i));
    }
    wait_for("some results", Duration::from_secs(30), || {
        std::fs::read_dir(spool.join("out")).unwrap().count() >= 30
    });
    let st = d.stop(Duration::from_secs(20)).expect("stops on SIGTERM");
    assert_eq!(
        st.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let done: Vec<String> = std::fs::read_dir(spool.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    let before: Vec<(String, Value)> = done
        .iter()
        .map(|n| {
            (
                n.clone(),
                serde_json::from_slice(&std::fs::read(spool.join("out").join(n)).unwrap()).unwrap(),
            )
        })
        .collect();
    // Every batch that got a result is committed; nothing is left half-done.
    let v = Command::new(BIN)
        .args(["verify", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));
    for (name, r) in &before {
        assert_eq!(r["status"], "committed", "{name}");
    }
    let d = Guard(
        Command::new(BIN)
            .args(["serve", "--data-dir"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("all results", Duration::from_secs(60), || {
        std::fs::read_dir(spool.join("out"))
            .unwrap()
            .filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count()
            >= n
    });
    drop(d);
    for (name, r) in &before {
        let now: Value =
            serde_json::from_slice(&std::fs::read(spool.join("out").join(name)).unwrap()).unwrap();
        assert_eq!(&now, r, "{name} changed");
    }
    let scan = Command::new(BIN)
        .args(["scan", "a", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&scan.stdout).lines().count(),
        n,
        "one record per batch"
    );
    println!("{} of {n} done before SIGTERM", before.len());
}

/// Goal: a bad configuration exits 78 (RestartPreventExitStatus), naming the problem.
#[test]
fn bad_config_exit_code() {
    let t = tempfile::tempdir().unwrap();
    let cfg = t.path().join("bad.toml");
    std::fs::write(&cfg, "batch_ops_max = \"lots\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(t.path().join("d"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("batch_ops_max"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&cfg, "[shards.\"Bad/Name\"]\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(t.path().join("d"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    // A second daemon on a locked data directory: 75.
    let data = t.path().join("d2");
    let log = t.path().join("s.log");
    let first = serve_ready(&data, &log, &[]);
    let second = Command::new(BIN)
        .args(["serve", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(
        second.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    // `roost status` talks to the first one.
    let st = Command::new(BIN)
        .args(["status", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["epoch"], 1);
    assert_eq!(v["healthy"], true);
    drop(first);
    let st = Command::new(BIN)
        .args(["status", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_ne!(st.status.code(), Some(0), "status with no daemon must fail");
}

/// Goal: `roost status` counts what happened (batches, WAL group commits, result rounds,
/// shard flushes) and `--metrics` exposes the same in Prometheus text, every sample with its
/// HELP and TYPE.
#[test]
fn status_and_metrics_count_the_pipeline() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let _d = serve_ready(&data, &t.path().join("serve.log"), &[]);
    let spool = data.join("spool");
    let n = 12;
    for i in 0..n {
        drop_in(&spool, &format!("m{i}.json"), &batch(i));
    }
    wait_for("results", Duration::from_secs(30), || {
        (0..n).all(|i| spool.join(format!("out/m{i}.json")).exists())
    });
    let status = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("status")
            .args(args)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // A batch counts as committed once answered; its durability round runs a moment later
    // (`tail_round_ms`): poll (bounded) until both have caught up, then check them exactly.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let v: Value = loop {
        let v: Value = serde_json::from_str(&status(&["--json"])).unwrap();
        // Answered, and their durability round run (from the serve loop, `tail_round_ms`).
        let settled = v["tail_rounds"]["settled"] == n as u64;
        if (v["committed"] == n as u64 && settled) || std::time::Instant::now() > until {
            break v;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(v["committed"], n as u64, "{v}");
    let published = v["results_published"].as_u64().unwrap();
    let rounds = v["result_rounds"].as_u64().unwrap();
    assert_eq!(published, n as u64, "{v}");
    assert!((1..=published).contains(&rounds), "{v}");
    let syncs = v["wal_syncs"].as_u64().unwrap();
    assert!(syncs >= 1, "{v}");
    let per_sync = v["wal_batches_per_sync"].as_f64().unwrap();
    assert!((per_sync - n as f64 / syncs as f64).abs() < 1e-9, "{v}");
    // Two shards per batch: a transaction each, flushed at least once per shard.
    assert_eq!(v["shard_txns"], 2 * n as u64, "{v}");
    assert!(v["shard_flushes"].as_u64().unwrap() >= 2, "{v}");
    // Their tails settled in rounds: none waits, and no more rounds than batches.
    assert_eq!(v["tail_rounds"]["waiting"], 0, "{v}");
    let tail_rounds = v["tail_rounds"]["rounds"].as_u64().unwrap();
    assert!((1..=n as u64).contains(&tail_rounds), "{v}");
    // Retention and room (issues 13, 14): no checkpoint yet (the first comes by size, time
    // or at the stop), every key live, each part's disk bytes, intake open.
    assert_eq!(v["checkpoint"], Value::Null, "{v}");
    assert_eq!(v["live_keys"], n as u64, "{v}");
    for part in ["wal", "audit", "keys", "shards"] {
        assert!(v["disk_bytes"][part].as_u64().unwrap() > 0, "{part}: {v}");
    }
    assert_eq!(v["intake"]["state"], "open", "{v}");

    let text = status(&["--metrics"]);
    assert!(text.contains("roost_intake_paused 0"), "{text}");
    assert!(
        text.contains(&format!("roost_live_request_keys {n}")),
        "{text}"
    );
    assert!(text.contains("roost_disk_bytes{part=\"wal\"}"), "{text}");
    assert!(
        text.contains(&format!("roost_batches_total{{status=\"committed\"}} {n}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("roost_results_published_total {n}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("roost_shard_txns_total {}", 2 * n)),
        "{text}"
    );
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line
            .split(['{', ' '])
            .next()
            .unwrap()
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count");
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no HELP for {line}"
        );
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "no TYPE for {line}"
        );
    }
    for phase in ["plan", "claim", "commit", "finish", "batch"] {
        let p50 = v["latency_ms"][phase]["p50"].as_f64();
        let p99 = v["latency_ms"][phase]["p99"].as_f64();
        assert!(
            matches!((p50, p99), (Some(a), Some(b)) if a > 0.0 && a <= b),
            "{phase}: {v}"
        );
    }
    let human = status(&[]);
    assert!(human.contains("results: 12 published in"), "{human}");
    let latency = human
        .lines()
        .find(|l| l.contains("latency since start"))
        .unwrap_or("");
    assert!(
        latency.contains("finish") && latency.contains("(<=") && !latency.contains("no samples"),
        "{human}"
    );
}

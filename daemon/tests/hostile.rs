//! A hostile spool and hostile triggers against the real binary: limits, quarantine bounds,
//! permissions, and ten thousand files at once.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn serve(dir: &Path, args: &[&str]) -> roost::drill::child::ServeChild {
    serve_ready(&dir.join("data"), &dir.join("serve.log"), args)
}

fn result(spool: &Path, name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(spool.join("out").join(name)).unwrap()).unwrap()
}

/// Goal: before-triggers that hang are killed at the time limit, that crash or do not exist
/// reject the op with a reason, and megabytes of stderr are captured bounded; the daemon
/// keeps serving throughout.
#[test]
fn hostile_triggers_reject_and_never_block() {
    let t = tempfile::tempdir().unwrap();
    let cfg = t.path().join("roost.toml");
    std::fs::write(
        &cfg,
        r#"
[shards.hang]
before_trigger = ["/bin/sleep", "30"]
trigger_timeout_ms = 300
[shards.crash]
before_trigger = ["/bin/sh", "-c", "kill -SEGV $$"]
[shards.chatty]
before_trigger = ["/bin/sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x >&2; exit 1"]
[shards.missing]
before_trigger = ["/nonexistent/trigger"]
[shards.ok]
before_trigger = ["/bin/cat"]
"#,
    )
    .unwrap();
    let _s = serve(t.path(), &["--config", cfg.to_str().unwrap()]);
    let spool = t.path().join("data/spool");
    for shard in ["hang", "crash", "chatty", "missing", "ok"] {
        drop_in(&spool, &format!("{shard}.json"), format!(r#"{{"request_key":"{shard}","ops":[{{"op":"create","shard":"{shard}","record":{{}}}}]}}"#).as_bytes());
    }
    let started = Instant::now();
    wait_for("trigger results", Duration::from_secs(30), || {
        ["hang", "crash", "chatty", "missing", "ok"]
            .iter()
            .all(|s| spool.join("out").join(format!("{s}.json")).exists())
    });
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a hanging trigger blocked the daemon"
    );
    let hang = result(&spool, "hang.json");
    assert_eq!(hang["status"], "rejected");
    assert!(
        hang["reason"]
            .as_str()
            .unwrap()
            .contains("killed after 300 ms"),
        "{hang}"
    );
    let crash = result(&spool, "crash.json");
    assert_eq!(crash["status"], "rejected");
    assert!(
        crash["reason"].as_str().unwrap().contains("signal"),
        "{crash}"
    );
    let chatty = result(&spool, "chatty.json");
    assert_eq!(chatty["status"], "rejected");
    let reason = chatty["reason"].as_str().unwrap();
    assert!(
        reason.len() <= 4096 && reason.starts_with("xxxx"),
        "{} bytes",
        reason.len()
    );
    let missing = result(&spool, "missing.json");
    assert!(
        missing["reason"]
            .as_str()
            .unwrap()
            .contains("could not start"),
        "{missing}"
    );
    assert_eq!(result(&spool, "ok.json")["status"], "committed");
}

/// Goal: failed/ stays within failed_files_max, removing the oldest first with a log line,
/// and the `invalid` results in out/ go with them (issue 14: out/ bounded like failed/).
#[test]
fn failed_dir_is_bounded_oldest_first() {
    let t = tempfile::tempdir().unwrap();
    let cfg = t.path().join("roost.toml");
    std::fs::write(&cfg, "failed_files_max = 5\n").unwrap();
    let _s = serve(t.path(), &["--config", cfg.to_str().unwrap()]);
    let spool = t.path().join("data/spool");
    for i in 0..12 {
        drop_in(&spool, &format!("bad-{i:02}.json"), b"not json");
        wait_for("quarantine", Duration::from_secs(10), || {
            spool.join("out").join(format!("bad-{i:02}.json")).exists()
        });
        std::thread::sleep(Duration::from_millis(15)); // distinct mtimes
    }
    let mut left: Vec<String> = std::fs::read_dir(spool.join("failed"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        (7..12)
            .map(|i| format!("bad-{i:02}.json"))
            .collect::<Vec<_>>()
    );
    let log = std::fs::read_to_string(t.path().join("serve.log")).unwrap();
    assert_eq!(
        log.matches("removed the oldest quarantined file").count(),
        7,
        "{log}"
    );
    // The kept ones still have their invalid result; the removed ones' results went too.
    for i in 0..12 {
        let name = format!("bad-{i:02}.json");
        if i >= 7 {
            assert_eq!(result(&spool, &name)["status"], "invalid");
        } else {
            assert!(
                !spool.join("out").join(&name).exists(),
                "{name}'s result kept"
            );
        }
    }
}

/// Goal: the daemon refuses a data directory other users can write, says why, with the
/// configuration exit code; and what it creates is not world-readable.
#[test]
fn permissions_are_checked_and_files_not_world_readable() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    {
        let s = serve(t.path(), &[]);
        drop_and_wait(&data.join("spool"), "a", Duration::from_secs(10));
        drop(s);
    }
    for sub in ["wal", "audit", "shards/s"] {
        for e in std::fs::read_dir(data.join(sub)).unwrap() {
            let p = e.unwrap().path();
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o007, 0, "{} is mode {mode:o}", p.display());
        }
    }
    let mode = std::fs::metadata(data.join("wal"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o007, 0, "wal/ is mode {mode:o}");
    std::fs::set_permissions(data.join("wal"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("writable by other users") && err.contains("chmod go-w"),
        "{err}"
    );
}

/// Goal: ten thousand files dropped at once are all processed with bounded work in flight
/// (no file-descriptor exhaustion under a low fd limit), valid and invalid alike.
#[test]
fn ten_thousand_files_at_once() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let spool = data.join("spool");
    for d in ["tmp", "new", "out", "failed"] {
        std::fs::create_dir_all(spool.join(d)).unwrap();
    }
    let n = 10_000;
    for i in 0..n {
        let body = if i % 10 == 9 {
            b"{broken".to_vec()
        } else {
            format!(r#"{{"request_key":"k{i}","ops":[{{"op":"create","shard":"s{}","record":{{"i":{i}}}}}]}}"#, i % 4).into_bytes()
        };
        std::fs::write(spool.join("new").join(format!("f{i:05}.json")), body).unwrap();
    }
    // A low descriptor limit: a daemon that opened every file at once would fail.
    let log = t.path().join("serve.log");
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 256 && exec {BIN} serve --data-dir {}",
            data.display()
        ))
        .env("ROOST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _s = Guard(child);
    let started = Instant::now();
    // Hidden names in out/ are the daemon's temporaries, not results.
    wait_for("ten thousand results", Duration::from_secs(240), || {
        std::fs::read_dir(spool.join("out"))
            .map(|d| {
                d.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0)
            >= n
    });
    let secs = started.elapsed().as_secs_f64();
    let mut committed = 0;
    let mut invalid = 0;
    for i in 0..n {
        match result(&spool, &format!("f{i:05}.json"))["status"].as_str() {
            Some("committed") => committed += 1,
            Some("invalid") => invalid += 1,
            other => panic!("f{i:05}: {other:?}"),
        }
    }
    assert_eq!((committed, invalid), (9_000, 1_000));
    assert_eq!(std::fs::read_dir(spool.join("new")).unwrap().count(), 0);
    println!("10000 files processed in {secs:.1} s");
}

/// Goal: a file dropped under a name that already has a result gets its own result under
/// that name (results are per name, latest wins; names should be unique, as in Maildir),
/// and the earlier batch is untouched: its key still gives its original result. The second
/// file is dropped the moment the first result shows, while the first batch may still be
/// syncing, and rescans are off (an hour apart): it must be taken on its event alone.
#[test]
fn name_collision_with_an_existing_result() {
    let t = tempfile::tempdir().unwrap();
    let cfg = t.path().join("roost.toml");
    std::fs::write(&cfg, "rescan_interval_ms = 3600000\n").unwrap();
    let _s = serve(t.path(), &["--config", cfg.to_str().unwrap()]);
    let spool = t.path().join("data/spool");
    let first = br#"{"request_key":"one","ops":[{"op":"create","shard":"s","record":{"n":1}}]}"#;
    drop_in(&spool, "same.json", first);
    wait_for("first result", Duration::from_secs(10), || {
        spool.join("out/same.json").exists()
    });
    let r1 = result(&spool, "same.json");
    drop_in(
        &spool,
        "same.json",
        br#"{"request_key":"two","ops":[{"op":"create","shard":"s","record":{"n":2}}]}"#,
    );
    wait_for("second result", Duration::from_secs(10), || {
        result(&spool, "same.json")["request_key"] == "two"
    });
    assert_eq!(result(&spool, "same.json")["status"], "committed");
    drop_in(&spool, "again.json", first);
    wait_for("replayed result", Duration::from_secs(10), || {
        spool.join("out/again.json").exists()
    });
    assert_eq!(
        result(&spool, "again.json"),
        r1,
        "the first batch's result is still its own"
    );
}

/// Goal: a stream request line that never ends (200 MB without a newline) costs the daemon
/// no more memory than the line limit: it is skipped in chunks, answered `invalid` once its
/// newline comes, and the connection goes on (an invalid UTF-8 line after it, then a valid
/// batch). Method: the daemon's VmRSS sampled while the line streams in.
#[test]
fn stream_never_ending_line_keeps_memory_bounded() {
    use common::stream::*;
    use std::io::Write as _;
    let t = tempfile::tempdir().unwrap();
    let d = serve(t.path(), &[]);
    let data = t.path().join("data");
    let before = rss_kib(d.id());
    let s = connect(&data, Duration::from_secs(60));
    let mut w = s.try_clone().unwrap();
    let chunk = vec![b'x'; 1 << 20];
    let mut peak = before;
    for _ in 0..200 {
        w.write_all(&chunk).unwrap();
        peak = peak.max(rss_kib(d.id()));
    }
    w.write_all(b"\n\xff\xfe{}\n").unwrap();
    w.write_all(batch_line("after-long", "s", 1).as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    peak = peak.max(rss_kib(d.id()));
    println!("never-ending line: VmRSS {before} KiB before, {peak} KiB at most");
    assert!(
        peak < before + 100 * 1024,
        "the daemon grew from {before} KiB to {peak} KiB on one line"
    );
    let mut r = std::io::BufReader::new(s);
    let long = read_answer(&mut r);
    assert_eq!(long["status"], "invalid", "{long}");
    assert_eq!(
        long["error"],
        "stream line 1: line is 209715200 bytes, over stream_line_bytes_max 16777216"
    );
    let utf8 = read_answer(&mut r);
    assert!(
        utf8["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("stream line 2: not UTF-8"),
        "{utf8}"
    );
    let ok = read_answer(&mut r);
    assert_eq!(ok["status"], "committed", "{ok}");
}

/// Goal: a stream client that sends 10,000 batches and never reads its answers stalls only
/// itself: the daemon stops reading it once its answers back up (fewer than the 10,000 are
/// ever taken), while the spool and another stream connection are served in bounded time,
/// the daemon's memory stays bounded, and a graceful stop still ends in bounded time.
#[test]
fn stream_client_that_never_reads_stalls_only_itself() {
    use common::stream::*;
    use std::io::Write as _;
    let t = tempfile::tempdir().unwrap();
    let mut d = serve(t.path(), &[]);
    let data = t.path().join("data");
    let before = rss_kib(d.id());
    let hog = connect(&data, Duration::from_secs(5));
    let mut w = hog.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..10_000 {
            if w.write_all(batch_line(&format!("hog{i}"), "h", 1).as_bytes())
                .is_err()
            {
                return i;
            }
        }
        10_000
    });
    // Wait until the hog's batches stop being taken (its answers fill the socket).
    let mut taken = 0;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = scan(&data, "h").len();
        if now > 0 && now == taken {
            break;
        }
        taken = now;
        assert!(Instant::now() < until, "the hog's batches never stalled");
    }
    assert!(
        taken < 10_000,
        "all 10,000 taken: nothing held the hog back"
    );
    let started = Instant::now();
    drop_and_wait(&data.join("spool"), "beside", Duration::from_secs(20));
    let input: String = (0..100)
        .map(|i| batch_line(&format!("other{i}"), "o", 1))
        .collect();
    let out = submit_stream(&data, &[], input.into_bytes());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "served slowly beside the hog"
    );
    assert_eq!(
        scan(&data, "h").len(),
        taken,
        "the hog moved on without reading"
    );
    let rss = rss_kib(d.id());
    println!("hog: {taken} of 10000 taken; VmRSS {before} KiB before, {rss} KiB with the hog");
    assert!(rss < before + 100 * 1024, "VmRSS {before} -> {rss} KiB");
    let stopping = Instant::now();
    assert_eq!(stop_code(&mut d), Some(0));
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "the stop waited on the hog"
    );
    drop(hog);
    assert!(writer.join().unwrap() < 10_000);
}

/// `status --json`'s `memory` object.
fn memory(data: &Path) -> Value {
    let o = Command::new(BIN)
        .args(["status", "--json", "--data-dir"])
        .arg(data)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    v["memory"].clone()
}

/// Goal (issue 44): however many lines stream clients send without reading their answers
/// and however many bulk files wait in `new/`, no intake holds more than `intake_bytes_max`
/// bytes of unanswered input: the peak the daemon accounts per intake stays within it, and
/// is not zero (the bytes are counted); the bulk files are all answered beside the hogs, and
/// once the hogs go their bytes are given back. Without the bound each hog would hold 128
/// lines of 16 KiB (2 MiB) and four bulk files of 200 KiB would be read at once.
#[test]
fn intakes_hold_at_most_intake_bytes_max() {
    use common::stream::*;
    use std::io::Write as _;
    const MAX: u64 = 256 << 10;
    let t = tempfile::tempdir().unwrap();
    let cfg = t.path().join("roost.toml");
    let toml = format!(
        "intake_bytes_max = {MAX}\nbulk_file_bytes_max = {MAX}\nstream_line_bytes_max = 32768\nstream_connections_max = 4\n"
    );
    std::fs::write(&cfg, toml).unwrap();
    let d = serve(t.path(), &["--config", cfg.to_str().unwrap()]);
    let data = t.path().join("data");
    let before = rss_kib(d.id());
    let pad = "x".repeat(16_000);
    let hogs: Vec<_> = (0..4)
        .map(|h| {
            let s = connect(&data, Duration::from_secs(5));
            let mut w = s.try_clone().unwrap();
            let pad = pad.clone();
            std::thread::spawn(move || {
                for i in 0..300 {
                    let line = format!(
                        "{{\"request_key\":\"hog{h}-{i}\",\"ops\":[{{\"op\":\"create\",\"shard\":\"h\",\"record\":{{\"pad\":\"{pad}\"}}}}]}}\n"
                    );
                    if w.write_all(line.as_bytes()).is_err() {
                        return;
                    }
                }
            });
            s
        })
        .collect();
    let spool = data.join("spool");
    let line_pad = "y".repeat(1000);
    for f in 0..6 {
        let body: String = (0..200)
            .map(|i| format!("{{\"request_key\":\"bulk{f}-{i}\",\"ops\":[{{\"op\":\"create\",\"shard\":\"b\",\"record\":{{\"pad\":\"{line_pad}\"}}}}]}}\n"))
            .collect();
        assert!(body.len() as u64 > MAX * 3 / 4 && (body.len() as u64) < MAX);
        drop_in(&spool, &format!("bulk{f}.jsonl"), body.as_bytes());
    }
    let (mut stream_seen, mut bulk_seen, mut peak_rss) = (0u64, 0u64, 0u64);
    wait_for(
        "the bulk results beside the hogs",
        Duration::from_secs(120),
        || {
            let m = memory(&data);
            stream_seen = stream_seen.max(m["intake_stream_bytes"].as_u64().unwrap_or(0));
            bulk_seen = bulk_seen.max(m["intake_bulk_bytes"].as_u64().unwrap_or(0));
            peak_rss = peak_rss.max(rss_kib(d.id()));
            std::thread::sleep(Duration::from_millis(50));
            (0..6).all(|f| spool.join("out").join(format!("bulk{f}.jsonl")).exists())
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    let m = memory(&data);
    println!(
        "intake bytes: stream peak {}, bulk peak {}, max {MAX}; seen by status: stream {stream_seen}, bulk {bulk_seen}; VmRSS {before} KiB before, {peak_rss} KiB at most; memory {m}",
        m["intake_stream_bytes_peak"], m["intake_bulk_bytes_peak"]
    );
    assert_eq!(m["intake_bytes_max"], MAX, "{m}");
    for part in ["intake_stream_bytes_peak", "intake_bulk_bytes_peak"] {
        let peak = m[part].as_u64().unwrap_or(u64::MAX);
        assert!(peak > 0 && peak <= MAX, "{part} {peak} over {MAX}: {m}");
    }
    assert!(stream_seen > 0 && stream_seen <= MAX, "{m}");
    assert!(bulk_seen > 0 && bulk_seen <= MAX, "{m}");
    assert!(
        m["intake_waits"].as_u64().unwrap_or(0) > 0,
        "no intake waited: {m}"
    );
    for s in hogs {
        s.shutdown(std::net::Shutdown::Both).unwrap();
    }
    wait_for(
        "the hogs' bytes given back",
        Duration::from_secs(30),
        || memory(&data)["intake_stream_bytes"] == 0,
    );
}

//! The exit codes of README's public contract, one black-box test per command and code it
//! can produce, on the real binary: 0 ok; 1 failure (`verify` violation, `get` not found,
//! `submit --wait` rejected/conflict, `status` with no daemon); 2 usage or invalid input;
//! 65 corruption on disk; 74 I/O failure; 75 locked; 78 bad configuration. Each assertion
//! names an exact code, so a failure that changes class fails the test.
//! (75 for a second `serve` and 78 for a bad config file are asserted in `systemd.rs`,
//! `bad_config_exit_code`.)
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// `roost ARGS... --data-dir DATA`.
fn roost(data: &Path, args: &[&str]) -> Output {
    roost_at(data, args)
}

/// The exit code, with stdout and stderr in the panic message when it is not `want`.
fn assert_code(out: &Output, want: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(want),
        "{what}: stdout {}\nstderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn create(key: &str, shard: &str) -> Vec<u8> {
    format!(r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"{shard}","record":{{"k":"{key}"}}}}]}}"#)
        .into_bytes()
}

/// A data directory after three committed batches on shard `s` (three WAL claims and dones,
/// three audit rows, three shard frames), the daemon stopped with SIGTERM.
fn populated(t: &Path) -> PathBuf {
    let data = t.join("data");
    let mut d = serve_ready(&data, &t.join("serve.log"), &[]);
    let spool = data.join("spool");
    for i in 0..3 {
        drop_in(
            &spool,
            &format!("b{i}.json"),
            &create(&format!("k{i}"), "s"),
        );
    }
    wait_for("three results", Duration::from_secs(20), || {
        (0..3).all(|i| spool.join(format!("out/b{i}.json")).exists())
    });
    assert_eq!(stop_code(&mut d), Some(0), "serve exits 0 on SIGTERM");
    data
}

/// The only segment file in `dir` (the tests write far less than one segment).
fn only_segment(dir: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal" || e == "seg"))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs.remove(0)
}

/// Offsets of the WAL frames in a segment (24-byte header, `len` at byte 8, 8-byte
/// alignment; see `wal/src/format.rs`), up to the preallocated zeros.
fn wal_frames(bytes: &[u8]) -> Vec<usize> {
    let mut at = Vec::new();
    let mut pos = 0;
    while pos + 24 <= bytes.len() && bytes[pos..pos + 24].iter().any(|b| *b != 0) {
        at.push(pos);
        let len = u32::from_le_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
        pos += (24 + len).next_multiple_of(8);
    }
    at
}

/// Flips one payload byte of the `index`-th WAL frame of the segment in `dir`.
fn flip_wal_frame(dir: &Path, index: usize) {
    let seg = only_segment(dir);
    let mut bytes = std::fs::read(&seg).unwrap();
    let frames = wal_frames(&bytes);
    let at = frames[index] + 24 + 2;
    bytes[at] ^= 0x40;
    std::fs::write(&seg, bytes).unwrap();
}

/// Goal: `verify` exits 0 when every invariant holds and 1 on a violation (a flipped byte in
/// a shard segment). Method: a populated directory, verify, flip, verify again.
#[test]
fn verify_exits_0_then_1_on_a_violation() {
    let t = tempfile::tempdir().unwrap();
    let data = populated(t.path());
    assert_code(&roost(&data, &["verify"]), 0, "verify on a clean directory");
    let seg = only_segment(&data.join("shards/s"));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[40] ^= 0x20;
    std::fs::write(&seg, bytes).unwrap();
    assert_code(&roost(&data, &["verify"]), 1, "verify on a flipped byte");
}

/// Goal: `get` exits 0 with the record, 1 for an absent id, and 1 (not found, not an error)
/// on a declared shard that has no records yet; an undeclared shard is a usage error (2)
/// that says so. Method: a config declaring `s` and `empty`, get on each.
#[test]
fn get_exits_0_found_1_absent_2_undeclared() {
    let t = tempfile::tempdir().unwrap();
    let data = populated(t.path());
    let cfg = t.path().join("roost.toml");
    std::fs::write(&cfg, "[shards.s]\n[shards.empty]\n").unwrap();
    let c = cfg.to_str().unwrap();
    let out = roost(&data, &["get", "s", "1", "--config", c]);
    assert_code(&out, 0, "get of a committed id");
    assert!(String::from_utf8_lossy(&out.stdout).contains(r#""shard":"s","id":1"#));
    assert_code(
        &roost(&data, &["get", "s", "999", "--config", c]),
        1,
        "absent id",
    );
    assert_code(
        &roost(&data, &["get", "empty", "1", "--config", c]),
        1,
        "declared shard without records",
    );
    let out = roost(&data, &["get", "nope", "1", "--config", c]);
    assert_code(&out, 2, "undeclared shard");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("shard nope is not declared"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Goal: `scan` of a declared shard with no directory yet exits 0 with no lines (declared
/// means empty, not missing), also under the default config where every valid name is
/// declared; an undeclared shard or an invalid name exits 2. Method: a fresh data directory
/// that no daemon has touched.
#[test]
fn scan_declared_empty_is_0_undeclared_is_2() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let cfg = t.path().join("roost.toml");
    std::fs::write(&cfg, "[shards.users]\n").unwrap();
    let c = cfg.to_str().unwrap();
    let out = roost(&data, &["scan", "users", "--config", c]);
    assert_code(&out, 0, "declared, empty shard");
    assert!(out.stdout.is_empty());
    let out = roost(&data, &["scan", "anything"]);
    assert_code(&out, 0, "default config: shards are created on first use");
    assert!(out.stdout.is_empty());
    let out = roost(&data, &["scan", "orders", "--config", c]);
    assert_code(&out, 2, "undeclared shard");
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("shard orders is not declared in the configuration"));
    assert_code(
        &roost(&data, &["scan", "Bad/Name"]),
        2,
        "invalid shard name",
    );
}

/// Goal: `submit --wait` exits 0 when committed, 1 when rejected, 2 for an invalid file,
/// and 2 when it cannot deliver at all (a file that does not exist; no spool directory).
/// Method: a running daemon for the first three, a data directory without a spool for the
/// last.
#[test]
fn submit_exits_0_committed_1_rejected_2_invalid_or_undeliverable() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let _d = serve_ready(&data, &t.path().join("serve.log"), &[]);
    let file = |name: &str, body: &[u8]| {
        let p = t.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let ok = file("ok.json", &create("ok", "s"));
    let rejected = file(
        "rej.json",
        br#"{"request_key":"rej","ops":[{"op":"delete","shard":"s","id":4242}]}"#,
    );
    let invalid = file("bad.json", b"{\"request_key\": ");
    let wait = |f: &str| roost(&data, &["submit", "--wait", "--timeout", "30", f]);
    assert_code(&wait(&ok), 0, "committed");
    assert_code(&wait(&rejected), 1, "rejected");
    assert_code(&wait(&invalid), 2, "invalid");
    let missing = t.path().join("missing.json");
    let out = wait(missing.to_str().unwrap());
    assert_code(&out, 2, "a file that does not exist");
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.json"));
    let out = roost(&t.path().join("no-spool"), &["submit", &ok]);
    assert_code(&out, 2, "no spool directory");
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

/// Goal: `roost serve &` followed at once by `roost submit --wait` (README's quickstart)
/// commits, the submit waiting for the spool the starting daemon makes; and a spool that
/// never appears still ends `submit --wait` with exit 2 at its timeout, naming it.
/// Method: start the submit first, the daemon 300 ms later.
#[test]
fn submit_wait_waits_for_a_starting_daemons_spool() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let f = t.path().join("early.json");
    std::fs::write(&f, create("early", "s")).unwrap();
    let f = f.to_str().unwrap().to_owned();
    let submit = {
        let data = data.clone();
        let f = f.clone();
        std::thread::spawn(move || roost(&data, &["submit", "--wait", "--timeout", "60", &f]))
    };
    std::thread::sleep(Duration::from_millis(300));
    let _d = serve_ready(&data, &t.path().join("serve.log"), &[]);
    let out = submit.join().unwrap();
    assert_code(&out, 0, "submit --wait started before serve");
    assert!(String::from_utf8_lossy(&out.stdout).contains(r#""status":"committed""#));
    assert!(String::from_utf8_lossy(&out.stderr).contains("waiting for the spool"));
    let out = roost(
        &t.path().join("never"),
        &["submit", "--wait", "--timeout", "1", &f],
    );
    assert_code(&out, 2, "no spool within the timeout");
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

/// Goal: a WAL record damaged in the middle of the log (valid records follow) is corruption
/// for every reader: `wal dump` and `serve` exit 65 (systemd must not restart into it),
/// naming the segment. Method: flip a payload byte of the first of six frames.
#[test]
fn damaged_wal_exits_65_for_wal_dump_and_serve() {
    let t = tempfile::tempdir().unwrap();
    let data = populated(t.path());
    assert_code(
        &roost(&data, &["wal", "dump"]),
        0,
        "wal dump on a clean log",
    );
    flip_wal_frame(&data.join("wal"), 0);
    let out = roost(&data, &["wal", "dump"]);
    assert_code(&out, 65, "wal dump on a damaged record");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(".wal"),
        "names the segment: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_code(&roost(&data, &["wal", "dump", "--json"]), 65, "--json too");
    assert_code(&roost(&data, &["serve"]), 65, "serve on a damaged wal");
}

/// Goal: a damaged last WAL record is a torn tail, not corruption: `wal dump` leaves it out
/// and exits 0 (the guard against calling every bad checksum corruption). Method: flip a
/// payload byte of the last frame.
#[test]
fn torn_wal_tail_is_not_corruption() {
    let t = tempfile::tempdir().unwrap();
    let data = populated(t.path());
    let whole = roost(&data, &["wal", "dump"]);
    let n = String::from_utf8_lossy(&whole.stdout).lines().count();
    let last = wal_frames(&std::fs::read(only_segment(&data.join("wal"))).unwrap()).len() - 1;
    flip_wal_frame(&data.join("wal"), last);
    let out = roost(&data, &["wal", "dump"]);
    assert_code(&out, 0, "wal dump on a torn tail");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), n - 1);
}

/// Goal: a damaged audit row followed by valid rows makes `audit` exit 65 (it used to exit
/// 1). Method: a fourth batch after a restart (its row vouches that a sync covered the first
/// three: docs/wal-format.md, "the synced mark"), then flip a payload byte of the first audit
/// frame. Damage no later row vouches for would be a hole from a power loss, cut instead.
#[test]
fn damaged_audit_exits_65() {
    let t = tempfile::tempdir().unwrap();
    let data = populated(t.path());
    let mut d = serve_ready(&data, &t.path().join("serve-again.log"), &[]);
    let spool = data.join("spool");
    drop_in(&spool, "b3.json", &create("k3", "s"));
    wait_for("a fourth result", Duration::from_secs(20), || {
        spool.join("out/b3.json").exists()
    });
    assert_eq!(stop_code(&mut d), Some(0));
    let out = roost(&data, &["audit"]);
    assert_code(&out, 0, "audit on a clean log");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 4);
    flip_wal_frame(&data.join("audit"), 0);
    assert_code(&roost(&data, &["audit"]), 65, "audit on a damaged row");
}

/// Goal: a damaged shard frame followed by valid frames makes `get` and `scan` exit 65 (they
/// used to exit 1). Method: flip a byte inside the first frame of the shard's segment.
#[test]
fn damaged_shard_exits_65_for_get_and_scan() {
    let t = tempfile::tempdir().unwrap();
    let data = populated(t.path());
    assert_code(&roost(&data, &["scan", "s"]), 0, "scan on a clean shard");
    let seg = only_segment(&data.join("shards/s"));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[40] ^= 0x20;
    std::fs::write(&seg, bytes).unwrap();
    let out = roost(&data, &["scan", "s"]);
    assert_code(&out, 65, "scan on a damaged shard");
    assert!(String::from_utf8_lossy(&out.stderr).contains("0000000001.seg"));
    assert_code(
        &roost(&data, &["get", "s", "3"]),
        65,
        "get on a damaged shard",
    );
}

/// Goal: bad flags and arguments are usage errors (2), a bad config file is 78 for a read
/// command as for `serve`, and `status` with no daemon answering is 1 (the answer "not
/// running", not an I/O failure), and an unclean election without `[cluster]` is 78.
/// Method: the binary with no daemon anywhere.
#[test]
fn usage_2_config_78_status_without_daemon_1() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    assert_code(&roost(&data, &["serve", "--no-such-flag"]), 2, "bad flag");
    assert_code(&roost(&data, &["get", "s", "not-a-number"]), 2, "bad id");
    assert_code(&roost(&data, &["frobnicate"]), 2, "unknown command");
    let cfg = t.path().join("bad.toml");
    std::fs::write(&cfg, "batch_ops_max = \"lots\"\n").unwrap();
    let c = cfg.to_str().unwrap();
    assert_code(
        &roost(&data, &["scan", "s", "--config", c]),
        78,
        "bad config",
    );
    let out = roost(&data, &["status"]);
    assert_code(&out, 1, "status with no daemon");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"));
    let out = roost(
        &data,
        &["cluster", "unclean-election", "b", "--accept-loss"],
    );
    assert_code(&out, 78, "an unclean election without [cluster]");
    assert!(String::from_utf8_lossy(&out.stderr).contains("[cluster] section"));
}

/// Goal: a reader of stdout that went away (`roost scan s | head -0`) is not a failure of
/// roost: every command that prints exits 0 quietly, never 70 (a print that panicked) or 74.
/// Method: the read commands on a populated data directory with stdout a pipe whose reading
/// end is already closed (every write fails with EPIPE).
#[test]
fn a_closed_stdout_exits_0_quietly() {
    let t = tempfile::tempdir().unwrap();
    let data = populated(t.path());
    for args in [
        &["scan", "s"][..],
        &["get", "s", "1"],
        &["audit"],
        &["wal", "dump"],
        &["verify"],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = Command::new(BIN)
            .args(args)
            .arg("--data-dir")
            .arg(&data)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run roost");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

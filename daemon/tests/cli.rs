//! Black-box tests of the real `roost` binary: a daemon on a temporary data directory, batch
//! files through the spool, and the read commands on the files it leaves.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::BIN;
use roost::drill::child::ServeChild;

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// `roost serve` on `DIR/data` ([`ServeChild`]: killed when dropped).
struct Daemon(ServeChild);

impl Daemon {
    /// Starts `roost serve` and waits until it logs that it serves (recovery done).
    fn start(dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_env(dir, extra, &[])
    }

    fn start_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let log = dir.join(format!("serve-{}.log", rand_u64()));
        let mut d = ServeChild::spawn(Path::new(BIN), &dir.join("data"), &log, |c| {
            c.args(extra).envs(env.iter().copied());
        })
        .expect("spawn roost serve");
        d.ready(Duration::from_secs(20)).expect("serving");
        Daemon(d)
    }

    fn kill9(mut self) {
        self.0.kill();
    }

    /// SIGTERM and the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        self.0
            .stop(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("daemon did not stop on SIGTERM: {e:#}"))
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

fn roost(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .output()
        .expect("run roost")
}

fn write_batch(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
    p
}

/// `roost submit --wait` on files; returns (exit code, result objects).
fn submit_wait(dir: &Path, files: &[PathBuf]) -> (i32, Vec<Value>) {
    let mut cmd = Command::new(BIN);
    cmd.args(["submit", "--wait", "--timeout", "30", "--data-dir"])
        .arg(dir.join("data"));
    cmd.args(files);
    let out = cmd.output().unwrap();
    let results = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("result line {l:?}: {e}")))
        .collect();
    (out.status.code().unwrap_or(-1), results)
}

fn scan(dir: &Path, shard: &str) -> Vec<Value> {
    let out = roost(dir, &["scan", shard]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn create(shard: &str, record: Value) -> Value {
    json!({"op": "create", "shard": shard, "record": record})
}

fn delete(shard: &str, id: u64) -> Value {
    json!({"op": "delete", "shard": shard, "id": id})
}

fn verify_ok(dir: &Path) {
    let out = roost(dir, &["verify"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "verify failed:\n{text}");
    assert!(text.contains("all invariants hold"), "{text}");
}

/// Goal: creates and deletes across two shards commit together, ids are minted by the
/// server and unique across shards, `get`/`scan`/`audit` show them, and `verify` agrees.
#[test]
fn create_and_delete_across_shards() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(t.path(), &[]);
    let b1 = write_batch(
        t.path(),
        "b1.json",
        &json!({"request_key": "k1", "ops": [
        create("users", json!({"name": "ada"})), create("users", json!({"name": "bob"})), create("orders", json!({"item": "tea"}))]}),
    );
    let (code, r) = submit_wait(t.path(), &[b1]);
    assert_eq!(code, 0, "{r:?}");
    assert_eq!(r[0]["status"], "committed");
    let ids: Vec<u64> = r[0]["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        3,
        "ids unique across shards: {ids:?}"
    );
    let b2 = write_batch(
        t.path(),
        "b2.json",
        &json!({"request_key": "k2", "ops": [
        delete("users", ids[0]), delete("orders", ids[2]), create("orders", json!({"item": "cake"}))]}),
    );
    let (code, r2) = submit_wait(t.path(), &[b2]);
    assert_eq!(code, 0, "{r2:?}");
    let users = scan(t.path(), "users");
    assert_eq!(users.len(), 1);
    assert_eq!(users[0]["id"], ids[1]);
    assert_eq!(users[0]["record"], json!({"name": "bob"}));
    let orders = scan(t.path(), "orders");
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0]["record"]["item"], "cake");
    let got = roost(t.path(), &["get", "users", &ids[1].to_string()]);
    assert!(got.status.success());
    let v: Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(
        v,
        json!({"shard": "users", "id": ids[1], "record": {"name": "bob"}})
    );
    assert_eq!(
        roost(t.path(), &["get", "users", &ids[0].to_string()])
            .status
            .code(),
        Some(1)
    );
    let audit = roost(t.path(), &["audit"]);
    assert_eq!(
        String::from_utf8_lossy(&audit.stdout).lines().count(),
        6,
        "one row per committed op"
    );
    // `--from LSN`: the rows of the second batch only (its claim lsn is in its result).
    let lsn2 = r2[0]["lsn"].as_u64().expect("lsn").to_string();
    let from = roost(t.path(), &["audit", "--from", &lsn2]);
    let rows: Vec<Value> = String::from_utf8_lossy(&from.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json row"))
        .collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows.iter().all(|r| r["request_key"] == "k2"), "{rows:?}");
    verify_ok(t.path());
    assert!(d.stop().success());
}

/// Goal: a batch whose second op is rejected writes nothing at all, and the result names the
/// op and the reason.
#[test]
fn rejected_batch_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let _d = Daemon::start(t.path(), &[]);
    let b = write_batch(
        t.path(),
        "b.json",
        &json!({"request_key": "r1", "ops": [
        create("users", json!({"name": "ada"})), delete("users", 424242)]}),
    );
    let (code, r) = submit_wait(t.path(), &[b]);
    assert_eq!(code, 1);
    assert_eq!(r[0]["status"], "rejected");
    assert_eq!(r[0]["op_index"], 1);
    assert!(r[0]["reason"].as_str().unwrap().contains("424242"));
    assert!(scan(t.path(), "users").is_empty());
    let audit = roost(t.path(), &["audit"]);
    assert!(audit.stdout.is_empty());
    // No claim: only the recorded rejection (issue 13, item 6).
    let dump = roost(t.path(), &["wal", "dump", "--json"]);
    let lines: Vec<Value> = String::from_utf8_lossy(&dump.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["type"], "rejected");
    assert_eq!(
        (
            lines[0]["request_key"].clone(),
            lines[0]["op_index"].clone()
        ),
        (json!("r1"), json!(1))
    );
}

/// Goal: required_fields and before_trigger reject ops (the trigger's stderr is the reason);
/// an undeclared shard is rejected once shards are declared.
#[test]
fn required_fields_and_before_trigger_reject() {
    let t = tempfile::tempdir().unwrap();
    let cfg = t.path().join("roost.toml");
    std::fs::write(&cfg, r#"
[shards.users]
required_fields = ["name"]
before_trigger = ["/bin/sh", "-c", "if grep -q forbidden; then echo 'forbidden name' >&2; exit 3; fi"]
trigger_timeout_ms = 5000
"#).unwrap();
    let cfgs = cfg.to_str().unwrap();
    let _d = Daemon::start(t.path(), &["--config", cfgs]);
    let a = write_batch(
        t.path(),
        "a.json",
        &json!({"request_key": "a", "ops": [create("users", json!({"nick": "x"}))]}),
    );
    let b = write_batch(
        t.path(),
        "b.json",
        &json!({"request_key": "b", "ops": [create("users", json!({"name": "ok"})), create("users", json!({"name": "forbidden"}))]}),
    );
    let c = write_batch(
        t.path(),
        "c.json",
        &json!({"request_key": "c", "ops": [create("other", json!({"name": "x"}))]}),
    );
    let e = write_batch(
        t.path(),
        "e.json",
        &json!({"request_key": "e", "ops": [create("users", json!({"name": "fine"}))]}),
    );
    let mut cmd = Command::new(BIN);
    cmd.args(["submit", "--wait", "--config", cfgs, "--data-dir"])
        .arg(t.path().join("data"))
        .args([&a, &b, &c, &e]);
    let out = cmd.output().unwrap();
    let r: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(r[0]["status"], "rejected");
    assert!(
        r[0]["reason"]
            .as_str()
            .unwrap()
            .contains("required field \"name\""),
        "{}",
        r[0]
    );
    assert_eq!(r[1]["status"], "rejected");
    assert_eq!(r[1]["op_index"], 1);
    assert_eq!(r[1]["reason"], "forbidden name");
    assert_eq!(r[2]["status"], "rejected");
    assert!(r[2]["reason"].as_str().unwrap().contains("not declared"));
    assert_eq!(r[3]["status"], "committed");
    assert_eq!(scan(t.path(), "users").len(), 1);
}

/// Goal: the same key with the same content (any formatting) returns the original result
/// with the same ids and changes nothing; with other content it is a conflict.
#[test]
fn same_key_same_ids_and_conflict() {
    let t = tempfile::tempdir().unwrap();
    let _d = Daemon::start(t.path(), &[]);
    let b = write_batch(
        t.path(),
        "b.json",
        &json!({"request_key": "order-17", "ops": [create("users", json!({"name": "ada", "age": 36}))]}),
    );
    let (_, r1) = submit_wait(t.path(), std::slice::from_ref(&b));
    let same = t.path().join("same.json");
    std::fs::write(&same, br#"{ "ops": [ { "record": {"age": 36, "name": "ada"}, "shard": "users", "op": "create" } ], "request_key": "order-17" }"#).unwrap();
    let (code, r2) = submit_wait(t.path(), &[b, same]);
    assert_eq!(code, 0);
    assert_eq!(r2[0], r1[0]);
    assert_eq!(r2[1], r1[0]);
    assert_eq!(scan(t.path(), "users").len(), 1, "no second record");
    let other = write_batch(
        t.path(),
        "o.json",
        &json!({"request_key": "order-17", "ops": [create("users", json!({"name": "eve"}))]}),
    );
    let (code, r3) = submit_wait(t.path(), &[other]);
    assert_eq!(code, 1);
    assert_eq!(r3[0]["status"], "conflict");
    assert_eq!(r3[0]["lsn"], r1[0]["lsn"]);
    assert_eq!(scan(t.path(), "users").len(), 1);
}

/// Goal: each answer removes its input in the order README's spool contract gives: a batch
/// committed by this file has its input gone by the time its result appears (a client may
/// reuse the name at once); a duplicate of it under another name (the original's committed
/// answer, but no claim of its own that recovery could answer the name from after a power
/// loss) and a rejection have theirs removed after the result is durable. Method: `roost
/// serve` under `strace -f` tracing removals and renames; per file, where the removal of
/// `new/NAME` falls against the rename that makes `out/NAME` (the one thread that answers a
/// file makes both).
#[test]
fn each_answer_removes_its_input_in_the_contracts_order() {
    use common::strace::{Trace, TracedServe};
    common::strace::can_inject().unwrap_or_else(|e| panic!("this test needs strace: {e}"));
    let t = tempfile::tempdir().unwrap();
    let (data, config) = (t.path().join("data"), t.path().join("roost.toml"));
    std::fs::write(&config, "").unwrap();
    let set = "unlink,unlinkat,rename,renameat,renameat2";
    let trace = Trace {
        set,
        inject: None,
        paths: vec![],
        env: vec![],
    };
    let (log, calls) = (t.path().join("serve.log"), t.path().join("trace"));
    let mut d = TracedServe::spawn(&data, &config, &log, &calls, &trace).unwrap();
    let spool = data.join("spool");
    common::wait_for("the spool", Duration::from_secs(20), || {
        spool.join("new").is_dir()
    });
    let create = r#"{"request_key":"k1","ops":[{"op":"create","shard":"s","record":{}}]}"#;
    let reject = r#"{"request_key":"k2","ops":[{"op":"delete","shard":"s","id":424242}]}"#;
    let files = [
        ("first.json", create),
        ("again.json", create),
        ("bad.json", reject),
    ];
    for (name, body) in files {
        common::drop_in(&spool, name, body.as_bytes());
        let out = spool.join("out").join(name);
        common::wait_for(name, Duration::from_secs(20), || out.exists());
    }
    let status = |n: &str| {
        let bytes = std::fs::read(spool.join("out").join(n)).unwrap();
        serde_json::from_slice::<Value>(&bytes).unwrap()["status"].clone()
    };
    assert_eq!(
        (status("first.json"), status("again.json")),
        (json!("committed"), json!("committed"))
    );
    assert_eq!(status("bad.json"), json!("rejected"));
    assert!(
        d.stop(Duration::from_secs(20)).is_some(),
        "roost serve did not stop"
    );
    let calls = d.calls();
    let at = |what: &str, path: PathBuf| {
        let quoted = format!("\"{}\"", path.display());
        calls
            .iter()
            .position(|c| c.name.starts_with(what) && c.line.contains(&quoted))
            .unwrap_or_else(|| panic!("no {what} of {quoted} in the trace"))
    };
    for (name, _) in files {
        let removed = at("unlink", spool.join("new").join(name));
        let shown = at("rename", spool.join("out").join(name));
        let own_claim = name == "first.json";
        assert_eq!(
            removed < shown,
            own_claim,
            "{name}: removal at call {removed}, rename at {shown}"
        );
    }
}

/// Goal: results survive a restart, a repeat after the restart gets the same ids, and files
/// dropped while the daemon is down are processed at start-up.
#[test]
fn results_survive_restart_and_dropped_files_are_picked_up() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(t.path(), &[]);
    let b = write_batch(
        t.path(),
        "b.json",
        &json!({"request_key": "x", "ops": [create("s", json!({"n": 1}))]}),
    );
    let (_, r1) = submit_wait(t.path(), std::slice::from_ref(&b));
    assert!(d.stop().success());
    // Daemon down: submit without waiting, straight into the spool.
    let late = write_batch(
        t.path(),
        "late.json",
        &json!({"request_key": "late", "ops": [create("s", json!({"n": 2}))]}),
    );
    let out = Command::new(BIN)
        .args(["submit", "--data-dir"])
        .arg(t.path().join("data"))
        .arg(&late)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _d = Daemon::start(t.path(), &[]);
    let out_late = t.path().join("data/spool/out/late.json");
    let until = Instant::now() + Duration::from_secs(20);
    while !out_late.exists() {
        assert!(Instant::now() < until, "dropped file never processed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r: Value = serde_json::from_slice(&std::fs::read(&out_late).unwrap()).unwrap();
    assert_eq!(r["status"], "committed");
    let (_, r2) = submit_wait(t.path(), &[b]);
    assert_eq!(r2[0], r1[0], "same ids after restart");
    assert_eq!(scan(t.path(), "s").len(), 2);
    verify_ok(t.path());
}

/// Goal: SIGKILL in the middle of a stream of batches, then a restart, loses no batch that
/// had a result and duplicates nothing; every dropped file gets a result in the end.
#[test]
fn sigkill_mid_stream_loses_nothing_and_duplicates_nothing() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(t.path(), &[]);
    let spool = t.path().join("data/spool");
    let n = 300;
    for i in 0..n {
        let v = json!({"request_key": format!("k{i}"), "ops": [create("a", json!({"i": i})), create("b", json!({"i": i}))]});
        let tmp = spool.join(format!("tmp/f{i}.json"));
        std::fs::File::create(&tmp)
            .unwrap()
            .write_all(&serde_json::to_vec(&v).unwrap())
            .unwrap();
        std::fs::rename(&tmp, spool.join(format!("new/f{i}.json"))).unwrap();
    }
    // Kill once some, but not all, results are out.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let done = std::fs::read_dir(spool.join("out")).unwrap().count();
        if done >= 20 {
            break;
        }
        assert!(Instant::now() < until, "no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    d.kill9();
    let mut acked: BTreeMap<String, Value> = BTreeMap::new();
    for e in std::fs::read_dir(spool.join("out")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        acked.insert(
            name,
            serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap(),
        );
    }
    assert!(acked.len() < n, "the kill came too late to mean anything");
    let _d = Daemon::start(t.path(), &[]);
    let until = Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir(spool.join("out"))
        .unwrap()
        .filter(|e| {
            !e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count()
        < n
    {
        assert!(Instant::now() < until, "not every file got a result");
        std::thread::sleep(Duration::from_millis(20));
    }
    let a = scan(t.path(), "a");
    let b = scan(t.path(), "b");
    assert_eq!(a.len(), n, "one record per batch on a");
    assert_eq!(b.len(), n, "one record per batch on b");
    let a_ids: HashSet<u64> = a.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    for (name, r) in &acked {
        assert_eq!(r["status"], "committed", "{name}");
        let id = r["ops"][0]["id"].as_u64().unwrap();
        assert!(a_ids.contains(&id), "acknowledged {name} lost");
        let now: Value =
            serde_json::from_slice(&std::fs::read(spool.join("out").join(name)).unwrap()).unwrap();
        assert_eq!(&now, r, "result of {name} changed");
    }
    let is: HashSet<i64> = a
        .iter()
        .map(|r| r["record"]["i"].as_i64().unwrap())
        .collect();
    assert_eq!(is.len(), n, "no batch applied twice");
    verify_ok(t.path());
}

/// Goal: `roost verify` fails, naming the place, on a data directory with one flipped byte,
/// and the daemon stops with exit 65 (corruption), naming the file, when it opens that shard.
#[test]
fn verify_fails_on_a_flipped_byte() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(t.path(), &[]);
    for i in 0..3 {
        let b = write_batch(
            t.path(),
            &format!("b{i}.json"),
            &json!({"request_key": format!("k{i}"), "ops": [create("s", json!({"i": i}))]}),
        );
        submit_wait(t.path(), &[b]);
    }
    assert!(d.stop().success());
    verify_ok(t.path());
    let seg = t.path().join("data/shards/s/0000000001.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[40] ^= 0x20;
    std::fs::write(&seg, bytes).unwrap();
    let out = roost(t.path(), &["verify"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("VIOLATION shard s") && text.contains("0000000001.seg"),
        "{text}"
    );
    // And the daemon stops with the corruption exit code once it opens the shard: a start
    // opens a shard on first use (issue 44), so the first batch naming it finds the damage.
    let mut d = Daemon::start(t.path(), &[]);
    let b = write_batch(
        t.path(),
        "after.json",
        &json!({"request_key": "after", "ops": [create("s", json!({"i": 9}))]}),
    );
    let out = roost(t.path(), &["submit", b.to_str().unwrap()]);
    assert!(out.status.success(), "submit: {out:?}");
    assert!(
        d.0.died_within(Duration::from_secs(30)),
        "still serving on a damaged shard"
    );
    let st = d.0.exited().unwrap().expect("exited");
    assert_eq!(st.code(), Some(65), "{}", d.0.log_text());
    assert!(
        d.0.log_text().contains("0000000001.seg"),
        "{}",
        d.0.log_text()
    );
}

/// Goal: an unparseable file is quarantined in failed/ with an `invalid` result carrying line
/// and column, and the daemon keeps serving.
#[test]
fn invalid_file_is_quarantined_and_daemon_keeps_serving() {
    let t = tempfile::tempdir().unwrap();
    let _d = Daemon::start(t.path(), &[]);
    let bad = t.path().join("bad.json");
    std::fs::write(&bad, b"{\"request_key\": \"k\",\n \"ops\": [}").unwrap();
    let (code, r) = submit_wait(t.path(), &[bad]);
    assert_eq!(code, 2);
    assert_eq!(r[0]["status"], "invalid");
    assert!(
        r[0]["error"].as_str().unwrap().contains("line 2 column"),
        "{}",
        r[0]
    );
    assert!(t.path().join("data/spool/failed/bad.json").exists());
    let ok = write_batch(
        t.path(),
        "ok.json",
        &json!({"request_key": "ok", "ops": [create("s", json!({}))]}),
    );
    assert_eq!(submit_wait(t.path(), &[ok]).0, 0);
}

/// Goal: `roost drill` runs a real daemon through SIGKILLs at random moments and at named
/// crash points, finds no violation on a correct build, and reports what it did: batch
/// files, streamed batches and bulk files (lines judged, some committed), and answers
/// compared with the claims in the WAL.
#[test]
fn drill_finds_no_violation() {
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "drill",
            "--batches",
            "80",
            "--kills",
            "4",
            "--seed",
            "3",
            "--data-dir",
        ])
        .arg(t.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drill failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("violations: none"), "{text}");
    assert!(text.contains("kills: 4"), "{text}");
    assert!(text.contains("streamed: "), "{text}");
    assert!(
        text.contains("died at crash point") || text.contains("crash point"),
        "{text}"
    );
    // Bulk files went through the kills too, and their lines were judged.
    let count_before = |line: &str, marker: &str| -> usize {
        let head = line.split(marker).next().unwrap_or("");
        head.rsplit(' ')
            .find(|w| !w.is_empty())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let bulk = text
        .lines()
        .find(|l| l.trim_start().starts_with("bulk: "))
        .unwrap_or_else(|| panic!("no bulk line:\n{text}"));
    let judged = count_before(bulk, " lines judged");
    assert!(judged > 0, "no bulk line judged: {bulk}");
    assert!(count_before(bulk, " committed;") > 0, "{bulk}");
    let wal = text
        .lines()
        .find(|l| l.trim_start().starts_with("wal: "))
        .unwrap_or_else(|| panic!("no wal line:\n{text}"));
    assert!(count_before(wal, " claims compared") > 0, "{wal}");
}

/// Goal (issue 14): a graceful stop takes a checkpoint, so the next start replays nothing
/// and the WAL below it is gone; a request key from before still gets its original answer
/// (now from the key table). Method: three batches, SIGTERM, look at `CHECKPOINT` and the
/// status of the restarted daemon, send the first batch again.
#[test]
fn a_graceful_stop_checkpoints_and_the_next_start_replays_nothing() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(t.path(), &[]);
    let mut files = Vec::new();
    for i in 0..3 {
        let b = json!({"request_key": format!("g{i}"), "ops": [create("users", json!({"i": i}))]});
        files.push(write_batch(t.path(), &format!("g{i}.json"), &b));
    }
    let (code, first) = submit_wait(t.path(), &files);
    assert_eq!(code, 0, "{first:?}");
    assert!(d.stop().success());
    assert!(
        t.path().join("data/CHECKPOINT").exists(),
        "no checkpoint at the stop"
    );
    let _d = Daemon::start(t.path(), &[]);
    // The control socket comes up beside the serve loop: ask until it answers (10 s at most).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let v: Value = loop {
        let status = roost(t.path(), &["status", "--json"]);
        if let Ok(v) = serde_json::from_slice(&status.stdout) {
            break v;
        }
        assert!(
            std::time::Instant::now() < until,
            "no status answer: {status:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(v["recovery"]["records_replayed"], 0, "{v}");
    assert!(v["checkpoint"]["wal_from"].as_u64().unwrap() > 3, "{v}");
    assert_eq!(v["live_keys"], 3, "{v}");
    let again = write_batch(
        t.path(),
        "again.json",
        &json!({"request_key": "g0", "ops": [create("users", json!({"i": 0}))]}),
    );
    let (code, r) = submit_wait(t.path(), &[again]);
    assert_eq!(code, 0, "{r:?}");
    assert_eq!(r[0], first[0], "the original answer, from the key table");
    verify_ok(t.path());
}

/// `roost status --json` once the control socket answers (it comes up beside the serve
/// loop), within 10 s.
fn status_json(dir: &Path) -> Value {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let status = roost(dir, &["status", "--json"]);
        if let Ok(v) = serde_json::from_slice(&status.stdout) {
            return v;
        }
        assert!(Instant::now() < until, "no status answer: {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Goal (issue 43): `roost submit --wait` deletes `out/NAME` once it has printed it, as
/// README says the client does, so the same file submitted again keeps its own name (it
/// became `NAME-1.json`) and `out/` does not grow. Method: submit one file twice with
/// --wait; after each, the spool name on stderr is the file's own and `out/` is empty.
#[test]
fn submit_wait_deletes_its_result_so_the_name_is_free_again() {
    let t = tempfile::tempdir().unwrap();
    let _d = Daemon::start(t.path(), &[]);
    let f = write_batch(
        t.path(),
        "again.json",
        &json!({"request_key": "again", "ops": [create("users", json!({"n": 1}))]}),
    );
    let out_dir = t.path().join("data/spool/out");
    let mut answers = Vec::new();
    for round in 0..2 {
        let out = Command::new(BIN)
            .args(["submit", "--wait", "--timeout", "30", "--data-dir"])
            .arg(t.path().join("data"))
            .arg(&f)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "round {round}: {stderr}");
        assert!(
            stderr.contains(&format!("submitted {} as again.json", f.display())),
            "round {round}: the file's own name, not again-1.json: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(&out_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "round {round}: out/ still holds {left:?}");
        answers.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    assert_eq!(answers[0], answers[1], "a duplicate gets the same answer");
}

/// Goal (issue 43): the status of a single node (no replication, no cluster) says it is a
/// single node instead of "following : disconnected, leader epoch 0, leader hw 0"; the
/// serve log's epoch is the one status and `wal dump` show (the log said epoch=0 while they
/// said 1); an idle phase shows no bucket bound as if it were a measurement. Method: a
/// fresh daemon, its status before and after one batch, its log, `wal dump` once stopped.
#[test]
fn a_single_node_status_says_so_and_agrees_with_the_log_on_the_epoch() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(t.path(), &[]);
    let idle = roost(t.path(), &["status"]);
    let text = String::from_utf8_lossy(&idle.stdout);
    assert!(idle.status.success(), "{idle:?}");
    assert!(text.contains("single node"), "{text}");
    assert!(!text.contains("following"), "{text}");
    let latency = text.lines().find(|l| l.contains("latency")).unwrap();
    assert!(latency.contains("finish no samples"), "{latency}");
    assert!(
        !latency.contains("<="),
        "no bound shown without a sample: {latency}"
    );
    let b = write_batch(
        t.path(),
        "one.json",
        &json!({"request_key": "one", "ops": [create("users", json!({"n": 1}))]}),
    );
    assert_eq!(submit_wait(t.path(), &[b]).0, 0);
    let v = status_json(t.path());
    let epoch = v["epoch"].as_u64().unwrap();
    assert_eq!(v["replication"]["epoch"].as_u64(), Some(epoch), "{v}");
    assert!(v["replication"]["follow"].is_null(), "{v}");
    let plan = &v["latency_ms"]["plan"];
    assert_eq!(plan["count"], 1, "{v}");
    assert!(plan["mean_ms"].as_f64().unwrap() > 0.0, "{v}");
    let busy = String::from_utf8_lossy(&roost(t.path(), &["status"]).stdout).into_owned();
    let latency = busy.lines().find(|l| l.contains("latency")).unwrap();
    assert!(latency.contains("1 batches"), "{latency}");
    assert!(latency.contains("(<="), "bounds shown as bounds: {latency}");
    let log = d.0.log_text();
    let serving = log.lines().find(|l| l.contains("serving")).unwrap();
    assert!(
        serving.contains(&format!("epoch={epoch}")),
        "{serving} (status: {epoch})"
    );
    assert!(d.stop().success());
    let dump = roost(t.path(), &["wal", "dump", "--json"]);
    let first: Value = serde_json::from_str(
        String::from_utf8_lossy(&dump.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["epoch"].as_u64(), Some(epoch), "{first}");
}

/// Goal (issue 43): `roost status` with no daemon says so, naming the control socket and
/// the data directory it tried (it printed "roost: roost is not running"); a failure's
/// cause is printed once (a data directory that cannot be made printed "Permission denied
/// (os error 13): Permission denied (os error 13)"). Method: status on a data directory
/// nothing serves, before and after a daemon ran there; serve on a data directory whose
/// parent is a file (root may write anywhere, so not a permission).
#[test]
fn a_stopped_node_and_a_failure_say_what_was_tried_once() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let check = |when: &str| {
        let out = roost(t.path(), &["status"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{when}: {stderr}");
        assert!(!stderr.contains("roost: roost"), "{when}: {stderr}");
        assert!(stderr.starts_with("roost: not running"), "{when}: {stderr}");
        let socket = data.join("roost.sock");
        assert!(
            stderr.contains(&socket.display().to_string()),
            "{when}: {stderr}"
        );
        assert!(
            stderr.contains(&data.display().to_string()),
            "{when}: {stderr}"
        );
    };
    check("never started");
    let d = Daemon::start(t.path(), &[]);
    assert!(d.stop().success());
    check("stopped");
    std::fs::write(t.path().join("file"), b"").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--data-dir"])
        .arg(t.path().join("file/data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("roost: ")).unwrap();
    let cause = std::io::Error::from_raw_os_error(20).to_string(); // ENOTDIR
    assert_eq!(line.matches(&cause).count(), 1, "the cause once: {line}");
}

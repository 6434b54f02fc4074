//! The streaming intake (README "Streaming intake") against the real binary: batches
//! through `roost submit --stream`, answers in order and durable, duplicates, rejections
//! and invalid lines mid-stream, the socket's mode, and kill -9 mid-stream.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::stream::*;
use common::*;

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

fn serve(dir: &Path, args: &[&str]) -> roost::drill::child::ServeChild {
    serve_ready(
        &dir.join("data"),
        &dir.join(format!("serve-{}.log", std::process::id())),
        args,
    )
}

/// The ids of a committed answer.
fn ids(a: &Value) -> Vec<u64> {
    a["ops"]
        .as_array()
        .map(|ops| ops.iter().filter_map(|o| o["id"].as_u64()).collect())
        .unwrap_or_default()
}

/// Goal: 1,000 batches streamed through `roost submit --stream` all commit, the answers
/// come in request order (each names its request's key), every id is distinct, and the
/// shards hold exactly the records created; then the stream's batches/s with 1 and 4
/// connections, for the note (not asserted).
#[test]
fn a_thousand_batches_stream_in_order() {
    let t = tempfile::tempdir().expect("tempdir");
    let _d = serve(t.path(), &[]);
    let data = t.path().join("data");
    let n = 1000;
    let mut input = String::new();
    for i in 0..n {
        input.push_str(&batch_line(
            &format!("b{i}"),
            &format!("s{}", i % 4),
            1 + i % 3,
        ));
    }
    let started = Instant::now();
    let out = submit_stream(&data, &[], input.into_bytes());
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let answers = answers(&out);
    assert_eq!(answers.len(), n);
    let mut seen = HashSet::new();
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(
            a["request_key"],
            format!("b{i}"),
            "answer {i} out of order: {a}"
        );
        assert_eq!(a["status"], "committed", "{a}");
        assert_eq!(ids(a).len(), 1 + i % 3, "{a}");
        for id in ids(a) {
            assert!(seen.insert(id), "id {id} minted twice");
        }
    }
    let on_shards: usize = (0..4).map(|s| scan(&data, &format!("s{s}")).len()).sum();
    assert_eq!(on_shards, seen.len());
    println!(
        "stream, 1 connection: {n} batches in {secs:.2} s, {:.0} batches/s",
        n as f64 / secs
    );
    // Four connections at once, for the note.
    let started = Instant::now();
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let data = data.clone();
            std::thread::spawn(move || {
                let input: String = (0..n)
                    .map(|i| batch_line(&format!("c{c}-{i}"), &format!("s{}", i % 4), 1))
                    .collect();
                submit_stream(&data, &[], input.into_bytes())
            })
        })
        .collect();
    for c in clients {
        let out = c.join().expect("client thread");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "stream, 4 connections: {} batches in {secs:.2} s, {:.0} batches/s",
        4 * n,
        (4 * n) as f64 / secs
    );
}

/// One closed-loop client of `many_closed_loop_clients_share_groups`: `n` batches on its
/// own connection, one at a time, each answer read before the next line; then, once every
/// client is there (`together`), the shared key `both`. Returns the answers, in order.
fn closed_loop_client(
    data: &Path,
    (c, n): (usize, usize),
    both: &str,
    together: &std::sync::Barrier,
) -> Vec<Value> {
    let s = connect(data, Duration::from_secs(60));
    let mut w = s.try_clone().expect("clone");
    let mut r = std::io::BufReader::new(s);
    let mut out = Vec::with_capacity(n + 1);
    for i in 0..n {
        let key = format!("cl{c}-{i}");
        w.write_all(batch_line(&key, &format!("s{}", i % 4), 2).as_bytes())
            .expect("write a line");
        out.push(read_answer(&mut r));
    }
    together.wait();
    w.write_all(batch_line(both, "s0", 3).as_bytes())
        .expect("write the shared key");
    out.push(read_answer(&mut r));
    out
}

/// Goal (issue 47): 24 closed-loop clients, each with one batch outstanding on its own
/// connection, are served in groups shared across connections (`stream_gather.rs`): every
/// answer is committed under its own key with ids of its own, the key all of them send
/// last, at once, gets one answer (the same ids for every client), the shards hold each record once,
/// and `status` shows fewer groups than batches (it showed one group per batch before).
#[test]
fn many_closed_loop_clients_share_groups() {
    let t = tempfile::tempdir().expect("tempdir");
    let _d = serve(t.path(), &[]);
    let data = t.path().join("data");
    let (clients, n) = (24, 25);
    let together = std::sync::Barrier::new(clients);
    let all: Vec<Vec<Value>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|c| {
                let (data, together) = (&data, &together);
                s.spawn(move || closed_loop_client(data, (c, n), "shared", together))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("client")).collect()
    });
    let mut seen = HashSet::new();
    let mut shared_ids = None;
    for (c, answers) in all.iter().enumerate() {
        for (i, a) in answers[..n].iter().enumerate() {
            assert_eq!(a["request_key"], format!("cl{c}-{i}"), "{a}");
            assert_eq!(a["status"], "committed", "{a}");
            assert_eq!(ids(a).len(), 2, "{a}");
            for id in ids(a) {
                assert!(seen.insert(id), "id {id} minted twice");
            }
        }
        let last = &answers[n];
        assert_eq!(last["status"], "committed", "{last}");
        let got = ids(last);
        assert_eq!(
            *shared_ids.get_or_insert_with(|| got.clone()),
            got,
            "{last}"
        );
    }
    let shared = shared_ids.expect("the shared key's ids");
    assert!(shared.iter().all(|id| !seen.contains(id)), "{shared:?}");
    let on_shards: usize = (0..4).map(|s| scan(&data, &format!("s{s}")).len()).sum();
    assert_eq!(on_shards, seen.len() + shared.len(), "each record once");
    let status = roost_at(&data, &["status", "--json"]);
    let v: Value = serde_json::from_slice(&status.stdout).expect("status json");
    let (groups, batches) = (&v["stream"]["groups"], &v["stream"]["batches_in_groups"]);
    let total = (clients * (n + 1)) as u64;
    assert_eq!(batches.as_u64(), Some(total), "{v}");
    let groups = groups.as_u64().expect("groups");
    assert!(groups < total, "{groups} groups for {total} batches: {v}");
    println!("{total} batches from {clients} closed-loop clients in {groups} groups");
}

/// Goal: on one connection, a duplicate (same key, same content) gets the original answer
/// with the same ids, the same key with other content a conflict, a delete of a missing id
/// a rejection, and an invalid line (bad JSON, invalid UTF-8, over the line limit) an
/// `invalid` answer naming its line; every line after them is served as usual, and the exit
/// code is 2 (an invalid line beats a rejection). The socket is where `stream_socket` says,
/// mode 0660 like the control socket, with the daemon's group.
#[test]
fn duplicates_rejections_and_invalid_lines_mid_stream() {
    let t = tempfile::tempdir().expect("tempdir");
    let cfg = t.path().join("roost.toml");
    let sock = t.path().join("elsewhere.sock");
    std::fs::write(
        &cfg,
        format!(
            "stream_line_bytes_max = 2000\nstream_socket = {:?}\n",
            sock.display().to_string()
        ),
    )
    .expect("config");
    let d = serve(t.path(), &["--config", cfg.to_str().expect("utf-8")]);
    let data = t.path().join("data");
    assert_made_like_the_control_socket(&sock, &data, d.id());
    let mut input = Vec::new();
    input.extend(batch_line("a", "s", 2).bytes());
    input.extend(batch_line("b", "s", 1).bytes());
    input.extend(batch_line("a", "s", 2).bytes()); // duplicate
    input.extend(batch_line("a", "s", 3).bytes()); // conflict
    input.extend(br#"{"request_key":"gone","ops":[{"op":"delete","shard":"s","id":999}]}"#);
    input.extend(b"\n{\"request_key\": oops\n");
    input.extend(b"\xff\xfe{}\n");
    input.extend(batch_line("long", "s", 100).bytes()); // over 2000 bytes
    for i in 0..20 {
        input.extend(batch_line(&format!("after{i}"), "t", 1).bytes());
    }
    let out = submit_stream(&data, &["--socket", sock.to_str().expect("utf-8")], input);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let a = answers(&out);
    assert_eq!(a.len(), 28, "{a:?}");
    assert_eq!(a[0]["status"], "committed");
    assert_eq!(a[2], a[0], "a duplicate gets the original answer");
    assert_eq!(a[3]["status"], "conflict", "{}", a[3]);
    assert_eq!(a[4]["status"], "rejected", "{}", a[4]);
    assert_eq!(a[4]["op_index"], 0);
    for (i, want) in [
        (5, "stream line 6: invalid JSON"),
        (6, "stream line 7: not UTF-8"),
        (7, "stream line 8: line is"),
    ] {
        assert_eq!(a[i]["status"], "invalid", "{}", a[i]);
        let e = a[i]["error"].as_str().unwrap_or_default();
        assert!(e.starts_with(want), "{e}");
    }
    assert!(
        a[5]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("column"),
        "{}",
        a[5]
    );
    for (i, x) in a[8..].iter().enumerate() {
        assert_eq!(x["request_key"], format!("after{i}"));
        assert_eq!(x["status"], "committed", "{x}");
    }
    assert_eq!(scan(&data, "t").len(), 20);
    assert_eq!(scan(&data, "s").len(), 3, "a, b: nothing from the conflict");
    // A rejection alone exits 1; all committed 0.
    let out = submit_stream(
        &data,
        &["--socket", sock.to_str().expect("utf-8")],
        batch_line("a", "s", 3).into_bytes(),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_stream_figures(&data);
}

/// The stream socket `sock` is made like the control socket: mode 0660, the daemon's group.
fn assert_made_like_the_control_socket(sock: &Path, data: &Path, pid: u32) {
    let gid = std::fs::metadata(format!("/proc/{pid}"))
        .expect("proc")
        .gid();
    for s in [sock, &data.join("roost.sock")] {
        // The control socket is bound by a task beside the serve loop, maybe a moment late,
        // and its mode is set right after the bind: wait for both.
        wait_for("the socket and its mode", Duration::from_secs(10), || {
            std::fs::metadata(s).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o660)
        });
        let m = std::fs::metadata(s).expect("socket");
        assert_eq!(m.permissions().mode() & 0o777, 0o660, "{}", s.display());
        assert_eq!(m.gid(), gid, "{} has not the daemon's group", s.display());
    }
}

/// `status --json`, `--metrics` and the plain `status` show the stream's figures after
/// two connections and 29 answers.
fn assert_stream_figures(data: &Path) {
    let text = |args: &[&str]| {
        let o = Command::new(BIN)
            .args(args)
            .arg("--data-dir")
            .arg(data)
            .output()
            .expect("status");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let v: Value = serde_json::from_str(&text(&["status", "--json"])).expect("status json");
    assert_eq!(v["stream"]["answers"], 29, "{v}");
    assert_eq!(v["stream"]["connections_total"], 2, "{v}");
    let metrics = text(&["status", "--metrics"]);
    assert!(
        metrics.contains("roost_stream_answers_total 29\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("roost_stream_connections_total 2\n"),
        "{metrics}"
    );
    let human = text(&["status"]);
    let want = "connections open (2 since start, 0 refused), 29 answers (0 unavailable)";
    assert!(human.contains(want), "{human}");
}

/// Goal: a client with no daemon to talk to exits 2 and says why.
#[test]
fn no_daemon_exits_2() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = submit_stream(
        &t.path().join("data"),
        &[],
        batch_line("a", "s", 1).into_bytes(),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stream socket"),
        "{out:?}"
    );
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Goal: kill -9 mid-stream loses no answered batch and creates nothing twice.
/// Method: per round, stream 2,000 batches (1-3 creates over two shards) through `roost
/// submit --stream` and kill the daemon mid-stream: SIGKILL at a random moment (three
/// seeds: once the daemon has answered a random number of them), or at a named crash point
/// the N-th time a streamed batch reaches it (`ROOST_CRASH_AT`: after the claim's sync,
/// after a shard commit, after the answer, after the audit sync, after the `done`
/// record); keep the answers the client printed, restart,
/// and stream every batch again under its key: each batch answered before the kill gets the
/// identical answer (same lsn, same ids), every batch commits, and the shards hold exactly
/// one record per create (no record twice).
#[test]
fn kill_9_mid_stream_keeps_every_answer() {
    let mut cut_short = 0;
    for seed in [3u64, 17, 101] {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let kill = Kill::After(1 + rng.below(1900));
        cut_short += usize::from(stream_kill_round(&format!("seed {seed}"), seed, kill));
    }
    assert!(cut_short > 0, "no random kill landed mid-stream");
    for (i, point) in [
        "after_claim_sync#300",
        "after_commit.0#500",
        "after_result#700",
        "after_audit_sync#900",
        "after_done#1100",
    ]
    .into_iter()
    .enumerate()
    {
        let mid = stream_kill_round(point, 1000 + i as u64, Kill::At(point));
        assert!(
            mid,
            "{point}: the crash point did not stop the stream midway"
        );
    }
}

/// Goal: SIGTERM mid-stream is a graceful stop: the daemon reads no more lines, answers the
/// batches it started (a line read as the stop began is answered `unavailable`), exits 0 in
/// bounded time; the client printed its answers in order and exits 75 for the rest; every
/// batch answered gets the identical answer after a restart, and nothing is created twice.
#[test]
fn sigterm_mid_stream_stops_gracefully() {
    let term = Kill::Term(100);
    assert!(
        stream_kill_round("sigterm", 7, term),
        "the stop did not land mid-stream"
    );
}

/// How a round's daemon dies.
#[derive(Clone, Copy)]
enum Kill {
    /// SIGKILL once the daemon has answered this many streamed batches (its status), a
    /// random moment that is surely mid-stream.
    After(u64),
    /// At this crash point (`ROOST_CRASH_AT`), by itself.
    At(&'static str),
    /// SIGTERM once the daemon has answered this many streamed batches: a graceful stop,
    /// which must exit 0 in bounded time.
    Term(u64),
}

/// One round of [`kill_9_mid_stream_keeps_every_answer`]; true if the kill cut the stream
/// short (some but not all batches answered).
fn stream_kill_round(label: &str, seed: u64, kill: Kill) -> bool {
    let t = tempfile::tempdir().expect("tempdir");
    let data = t.path().join("data");
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // A graceful stop's round is longer: the status poll must see it mid-stream.
    let n = if matches!(kill, Kill::Term(_)) {
        8000
    } else {
        2000
    };
    let mut input = String::new();
    let mut creates = 0;
    for i in 0..n {
        let k = 1 + rng.below(3) as usize;
        creates += k;
        input.push_str(&batch_line(
            &format!("s{seed}-{i}"),
            &format!("p{}", i % 2),
            k,
        ));
    }
    let env: &[(&str, &str)] = match kill {
        Kill::At(point) => &[("ROOST_CRASH_AT", point)],
        Kill::After(_) | Kill::Term(_) => &[],
    };
    let mut d = roost::drill::child::ServeChild::spawn(
        Path::new(BIN),
        &data,
        &t.path().join("killed.log"),
        |c| {
            c.envs(env.iter().copied());
        },
    )
    .expect("spawn roost serve");
    d.ready(Duration::from_secs(20)).expect("serving");
    let before = kill_mid_stream(d, &data, input.clone().into_bytes(), kill);
    let _d = serve(t.path(), &[]);
    let out = submit_stream(&data, &[], input.into_bytes());
    assert_eq!(out.status.code(), Some(0), "{label}: {out:?}");
    let after = answers(&out);
    assert_eq!(after.len(), n);
    // An `unavailable` answer (a line read as the stop began) decided nothing.
    for (key, a) in before.iter().filter(|(_, a)| a["status"] != "unavailable") {
        let again = after.iter().find(|x| x["request_key"] == *key.as_str());
        assert_eq!(
            again,
            Some(a),
            "{label}: {key} answered differently after the kill"
        );
    }
    let records: Vec<Value> = ["p0", "p1"].iter().flat_map(|s| scan(&data, s)).collect();
    let distinct: HashSet<String> = records.iter().map(|r| r["record"].to_string()).collect();
    assert_eq!(records.len(), creates, "{label}: records on the shards");
    assert_eq!(distinct.len(), creates, "{label}: a create applied twice");
    println!(
        "{label}: {} of {n} batches answered before the kill",
        before.len()
    );
    !before.is_empty() && before.len() < n
}

/// Streams `input` through `roost submit --stream`, kills the daemon as `kill` says, and
/// returns the answers the client printed by then, by key (it exits 75: the connection
/// closed; 0 if everything was answered first).
fn kill_mid_stream(
    mut d: roost::drill::child::ServeChild,
    data: &Path,
    input: Vec<u8>,
    kill: Kill,
) -> BTreeMap<String, Value> {
    let rx = start_submit_stream(data, &[], input);
    let answered = |n: u64| {
        wait_for("answers before the kill", Duration::from_secs(60), || {
            let status = roost::control::socket::request(&data.join("roost.sock"), "status");
            status
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|v| v["stream"]["answers"].as_u64().unwrap_or(0) >= n)
        })
    };
    match kill {
        Kill::After(n) => answered(n),
        Kill::At(point) => assert!(
            d.died_within(Duration::from_secs(60)),
            "{point} was not reached"
        ),
        Kill::Term(n) => {
            answered(n);
            let stopping = Instant::now();
            assert_eq!(stop_code(&mut d), Some(0), "a graceful stop mid-stream");
            assert!(stopping.elapsed() < Duration::from_secs(15), "a slow stop");
        }
    }
    d.kill();
    let out = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the client did not end after the kill");
    let got = answers(&out);
    assert!(matches!(out.status.code(), Some(0) | Some(75)), "{out:?}");
    got.into_iter()
        .map(|a| (a["request_key"].as_str().unwrap_or_default().to_owned(), a))
        .collect()
}

/// Goal: batches a node does not take now are answered `unavailable` and the client exits
/// 75: on a standby (its primary unreachable here), and on a connection over
/// `stream_connections_max` (one line naming the limit, then the connection closes).
#[test]
fn a_standby_and_a_connection_over_the_limit_answer_unavailable() {
    let t = tempfile::tempdir().expect("tempdir");
    let cfg = t.path().join("roost.toml");
    std::fs::write(&cfg, "stream_connections_max = 1\n").expect("config");
    let cfg = cfg.to_str().expect("utf-8");
    let data = t.path().join("data");
    {
        let _standby = serve(t.path(), &["--config", cfg, "--follow", "127.0.0.1:1"]);
        // "serving what this node holds" comes before the serve loop binds its sockets.
        wait_for(
            "the standby's stream socket",
            Duration::from_secs(30),
            || data.join("stream.sock").exists(),
        );
        let out = submit_stream(&data, &[], batch_line("k", "s", 1).into_bytes());
        assert_eq!(out.status.code(), Some(75), "{out:?}");
        let a = answers(&out);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0]["status"], "unavailable", "{}", a[0]);
        assert_eq!(a[0]["request_key"], "k");
        let e = a[0]["error"].as_str().unwrap_or_default();
        assert!(e.contains("not the primary"), "{e}");
    }
    let _d = serve(t.path(), &["--config", cfg]);
    let first = connect(&data, Duration::from_secs(10));
    // The first connection is accepted before the second is made.
    wait_for("the first connection", Duration::from_secs(10), || {
        let s = Command::new(BIN)
            .args(["status", "--json", "--data-dir"])
            .arg(&data)
            .output()
            .expect("status");
        serde_json::from_slice::<Value>(&s.stdout).is_ok_and(|v| v["stream"]["connections"] == 1)
    });
    let out = submit_stream(&data, &[], batch_line("k2", "s", 1).into_bytes());
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("too many stream connections"), "{err}");
    drop(first);
}

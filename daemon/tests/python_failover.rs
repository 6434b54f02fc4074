//! The Python client (`clients/python`) against the three-node cluster while its leader is
//! killed: with the client's default settings every batch is answered with its ids, no
//! error is raised, none is applied twice; the longest wait the client saw is measured.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod repl;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use repl::cluster::{cluster, isr_names_all, one_leader, start_all};
use repl::{Node, LIMIT};
use roost_etcd::testing::EtcdServer;
use serde_json::Value;

/// The first `python3` that is 3.9 or later: the one on the PATH, else Debian's.
fn python() -> &'static str {
    ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|py| {
            Command::new(py)
                .args(["-c", "import sys; sys.exit(sys.version_info < (3, 9))"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("no python3 of version 3.9 or later: install python3 (apt-get install python3)")
}

/// A node of {a, b, c} led through `etcd` with the default lease (`lease_ms` unset: 3000),
/// the one the client's default resend horizon is measured against.
fn default_lease_node(root: &Path, name: &'static str, etcd: &str) -> Node {
    let n = Node::new(root, name, "ack = \"standby\"");
    let text = std::fs::read_to_string(&n.config).expect("config");
    let cluster = format!(
        "\n[cluster]\netcd = [{etcd:?}]\nadvertise = \"{}\"\n",
        n.addr()
    );
    std::fs::write(&n.config, format!("{text}{cluster}")).expect("config");
    n
}

/// The client script, its stdin (a line `stop` ends it) and its stdout's lines.
struct Client {
    child: common::Guard,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// The last `progress ONE MANY` it printed.
    progress: (u64, u64),
}

impl Client {
    fn start(one: &Path, many: &Path) -> Client {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut child = Command::new(python())
            .arg(root.join("clients/python/tests/failover_client.py"))
            .arg(one)
            .arg(many)
            .env("PYTHONPATH", root.join("clients/python"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the Python client");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Client {
            child: common::Guard(child),
            stdin,
            lines,
            progress: (0, 0),
        }
    }

    /// Reads lines until both clients have at least `one` and `many` answers, within `limit`.
    fn wait_progress(&mut self, one: u64, many: u64, limit: Duration) {
        let until = Instant::now() + limit;
        while self.progress.0 < one || self.progress.1 < many {
            let left = until.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "the client did not reach {one}/{many} answers within {limit:?} (at {:?})",
                    self.progress
                )
            });
            let nums: Vec<u64> = line
                .strip_prefix("progress ")
                .map(|rest| rest.split(' ').filter_map(|n| n.parse().ok()).collect())
                .unwrap_or_default();
            assert_eq!(nums.len(), 2, "not a progress line: {line}");
            self.progress = (nums[0], nums[1]);
        }
    }

    /// Tells it to stop and returns its summary line, parsed; it must exit 0.
    fn finish(mut self) -> Value {
        writeln!(self.stdin, "stop").expect("tell the client to stop");
        let until = Instant::now() + Duration::from_secs(150);
        let summary = loop {
            let left = until.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("the client's summary within 150 s of stop");
            if line.starts_with('{') {
                break serde_json::from_str::<Value>(&line).expect("the summary is JSON");
            }
        };
        let status = self.child.0.wait().expect("wait for the client");
        assert!(status.success(), "the client exited {status}");
        summary
    }
}

/// Checks the client's summary: no error; every answer committed with its two ids, each key
/// answered once, no id twice. Returns the number of batches and each client's longest wait.
fn check_summary(summary: &Value) -> (usize, f64, f64) {
    assert_eq!(
        summary["errors"],
        serde_json::json!([]),
        "the client raised"
    );
    let mut keys = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for who in ["one", "many"] {
        for a in summary["answers"][who].as_array().expect("answers") {
            assert_eq!(a["status"], "committed", "{who}: {a}");
            let these: Vec<u64> = a["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            assert_eq!(these.len(), 2, "{who}: {a}");
            assert!(
                keys.insert(a["key"].to_string()),
                "{who}: answered twice: {a}"
            );
            for id in these {
                assert!(ids.insert(id), "id {id} minted twice: {a}");
            }
        }
    }
    let longest = |who: &str| summary["longest"][who].as_f64().expect("longest");
    (keys.len(), longest("one"), longest("many"))
}

/// Goal (issue 43): the Python client, with its default settings, rides out a cluster
/// failover. Method: etcd and three real `roost serve` nodes, default lease (3000 ms),
/// `ack = "standby"`; the client script (`clients/python/tests/failover_client.py`) sends
/// batches to both standbys (one at a time on a kept connection to one, `iter_many` 50 at
/// a time to the other) while the leader is killed with SIGKILL, and goes on until both
/// have had answers after the new leader was elected. Every batch must be answered
/// `committed` with its ids, no error raised, no key answered twice, no id minted twice, and
/// the new leader's shard must hold exactly the answered batches' records (none lost, none
/// applied twice); `roost verify` holds on the survivors.
#[test]
fn python_client_rides_out_a_leader_killed_with_sigkill() {
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes: Vec<Node> = ["a", "b", "c"]
        .into_iter()
        .map(|name| default_lease_node(t.path(), name, etcd.client_url()))
        .collect();
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    isr_names_all(&nodes, l);
    let (s1, s2) = ((l + 1) % 3, (l + 2) % 3);
    let lease = cluster(&nodes[l])["lease_ms"].as_u64();
    assert_eq!(lease, Some(3000), "not the default lease");
    let socket = |i: usize| nodes[i].data.join("stream.sock");
    let mut client = Client::start(&socket(s1), &socket(s2));
    client.wait_progress(20, 100, LIMIT);
    let before = client.progress;
    nodes[l].kill();
    let t0 = Instant::now();
    let l2 = one_leader(&nodes, LIMIT);
    let election = t0.elapsed();
    assert_ne!(l2, l);
    client.wait_progress(before.0 + 20, before.1 + 100, Duration::from_secs(60));
    let summary = client.finish();
    let (batches, one, many) = check_summary(&summary);
    eprintln!(
        "python client over a SIGKILL of the leader (lease 3000 ms): new leader after \
         {election:?}; {batches} batches, all committed once; longest wait: {one:.3} s for \
         one batch on a kept connection, {many:.3} s between two iter_many answers"
    );
    for i in [s1, s2] {
        nodes[i].stop();
    }
    let records = nodes[l2].scan("py").lines().count();
    assert_eq!(records, 2 * batches, "records on the new leader's shard");
    for i in [s1, s2] {
        nodes[i].verify();
    }
}

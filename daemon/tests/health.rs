//! The health checks on `metrics_listen` (issue 42, docs/cluster.md "Health checks for a load
//! balancer") and `roost cluster list`, on real `roost serve` processes over loopback: a
//! single node, and three cluster nodes led through a real etcd (Debian's etcd-server,
//! started here). The checks are asked the way a load balancer asks them: a plain HTTP/1.0
//! request over a std `TcpStream`. Every wait is bounded.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod repl;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{serve_ready, stop_code, wait_for};
use repl::*;
use roost_etcd::testing::{EtcdServer, ReservedPort};
use serde_json::Value;

/// The lease of the test cluster (as `cluster.rs`'s).
const LEASE_MS: u64 = 1000;
/// A new leader answers `/leader` within this after the old one is killed.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);

/// A loopback port kept from the kernel's own picks while the reservation lives (the daemon
/// binds it; once the daemon is gone the port refuses connections again).
fn free_addr() -> (ReservedPort, SocketAddr) {
    let r = ReservedPort::new().expect("reserve a port");
    let addr = SocketAddr::from(([127, 0, 0, 1], r.port()));
    (r, addr)
}

/// An answer: status code, content type, body.
#[derive(Debug)]
struct Answer {
    code: u16,
    content_type: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// `METHOD PATH HTTP/1.0` to `addr`, the whole answer (the server closes after one); `Err`
/// when nothing listens there.
fn http(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<Answer> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(15)))?;
    s.write_all(format!("{method} {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw).expect("a UTF-8 answer");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {text:?}"));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .unwrap_or_default()
        .to_owned();
    Ok(Answer {
        code,
        content_type,
        body: body.to_owned(),
    })
}

/// `GET PATH`'s status code, `None` when the port refuses.
fn code(addr: SocketAddr, path: &str) -> Option<u16> {
    http(addr, "GET", path).ok().map(|a| a.code)
}

/// Goal: a single node (no replication, no cluster) with `metrics_listen` is healthy and the
/// leader, and not a replica, and says so in JSON; HEAD answers the same status with no
/// body; other methods are refused; the metrics are still served beside the checks.
/// Method: `roost serve` with `metrics_listen` on a reserved loopback port; plain HTTP/1.0.
#[test]
fn a_single_node_is_healthy_and_the_leader_and_not_a_replica() {
    let t = tempfile::tempdir().expect("tempdir");
    let (_port, addr) = free_addr();
    let cfg = t.path().join("roost.toml");
    std::fs::write(&cfg, format!("metrics_listen = \"{addr}\"\n")).expect("write config");
    let args = ["--config", cfg.to_str().expect("utf-8 path")];
    let mut d = serve_ready(&t.path().join("data"), &t.path().join("serve.log"), &args);
    let mut answers = Vec::new();
    wait_for("/health answers 200", LIMIT, || {
        code(addr, "/health") == Some(200)
    });
    for (path, want) in [("/health", 200), ("/leader", 200), ("/replica", 503)] {
        let a = http(addr, "GET", path).expect("GET");
        assert_eq!(a.code, want, "{path}: {a:?}");
        assert_eq!(a.content_type, "application/json", "{path}: {a:?}");
        let v = a.json();
        assert_eq!(v["role"], "primary", "{path}: {v}");
        assert_eq!(v["ok"], want == 200, "{path}: {v}");
        answers.push(v);
    }
    assert_eq!(answers[1]["leading"], true, "{}", answers[1]);
    assert_eq!(answers[1]["intake"], "open", "{}", answers[1]);
    let head = http(addr, "HEAD", "/leader").expect("HEAD");
    assert_eq!((head.code, head.body.as_str()), (200, ""), "{head:?}");
    let head = http(addr, "HEAD", "/replica").expect("HEAD");
    assert_eq!((head.code, head.body.as_str()), (503, ""), "{head:?}");
    let post = http(addr, "POST", "/health").expect("POST");
    assert_eq!(post.code, 405, "{post:?}");
    let metrics = http(addr, "GET", "/metrics").expect("GET /metrics");
    assert_eq!(metrics.code, 200, "{metrics:?}");
    assert!(metrics.body.contains("roost_batches"), "{}", metrics.body);
    assert_eq!(stop_code(&mut d), Some(0));
}

/// A node of the cluster {a, b, c} led through `etcd`, with `metrics_listen` at its
/// reserved address (top-level, before its `[replication]` table).
fn cluster_node(root: &Path, name: &'static str, etcd: &str, metrics: SocketAddr) -> Node {
    let mut n = Node::new(root, name, "ack = \"standby\"");
    let text = std::fs::read_to_string(&n.config).expect("config");
    let cluster = format!(
        "\n[cluster]\netcd = [{etcd:?}]\nadvertise = \"{}\"\nlease_ms = {LEASE_MS}\n",
        n.addr()
    );
    let text = format!("metrics_listen = \"{metrics}\"\n{text}{cluster}");
    std::fs::write(&n.config, text).expect("config");
    n.child = None;
    n
}

/// The three nodes and their metrics addresses (reservations held for the test's life).
fn three(root: &Path, etcd: &str) -> (Vec<Node>, Vec<(ReservedPort, SocketAddr)>) {
    let ports: Vec<_> = (0..3).map(|_| free_addr()).collect();
    let nodes = ["a", "b", "c"]
        .into_iter()
        .zip(&ports)
        .map(|(name, (_, addr))| cluster_node(root, name, etcd, *addr))
        .collect();
    (nodes, ports)
}

fn cluster(n: &Node) -> Value {
    n.status()["cluster"].clone()
}

/// The index of the one node whose `/leader` answers 200, once exactly one does (the
/// others answering 503, or refusing when not running), within `limit`.
fn one_leader(addrs: &[SocketAddr], limit: Duration) -> usize {
    let mut found = None;
    wait_for("exactly one node to answer /leader 200", limit, || {
        let leaders: Vec<usize> = (0..addrs.len())
            .filter(|i| code(addrs[*i], "/leader") == Some(200))
            .collect();
        found = match leaders[..] {
            [l] => Some(l),
            _ => None,
        };
        found.is_some()
    });
    found.expect("a leader")
}

/// `roost cluster list --json` on `n`'s configuration (exit 0 asserted).
fn list_json(n: &Node) -> Value {
    let out = n.roost(&["cluster", "list", "--json"]);
    assert!(
        out.status.success(),
        "cluster list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cluster list --json")
}

/// The list names the three members, `leader` alone as leader (with its lease left), each
/// member running and in the in-sync set.
fn assert_listed(v: &Value, leader: &str) {
    let members = v["members"].as_array().expect("members");
    let names: Vec<&str> = members.iter().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(names, ["a", "b", "c"], "{v}");
    assert_eq!(v["leader"], leader, "{v}");
    assert_eq!(v["isr"].as_array().map(Vec::len), Some(3), "{v}");
    for m in members {
        let is_leader = m["name"] == leader;
        let role = if is_leader { "leader" } else { "standby" };
        assert_eq!(m["role"], role, "{m}");
        assert_eq!(
            (&m["running"], &m["in_sync"]),
            (&true.into(), &true.into()),
            "{m}"
        );
        assert!(m["advertise"].is_string(), "{m}");
        assert_eq!(m["lease_left_secs"].is_i64(), is_leader, "{m}");
        assert_eq!(
            m["epoch"].is_u64(),
            is_leader || m["name"] == v["lag_from"],
            "{m}"
        );
    }
}

/// Goal: in a cluster of three exactly one node answers `/leader` 200 (the one etcd names),
/// the two others `/replica` 200 once etcd's in-sync set names them; `roost cluster list`
/// names the three members, the one leader and the set, with the leader's view of every
/// standby's lag; after the leader is killed (SIGKILL) another node answers `/leader` 200
/// within 30 s and the old one's port refuses; with etcd gone the list exits 1.
/// Method: etcd and three `roost serve` nodes over mutual TLS, each with `metrics_listen`;
/// plain HTTP/1.0 requests; `roost cluster list` on the nodes' configurations.
#[test]
fn one_cluster_node_answers_leader_and_the_in_sync_others_replica() {
    let t = tempfile::tempdir().expect("tempdir");
    let mut etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let (mut nodes, ports) = three(t.path(), etcd.client_url());
    let addrs: Vec<SocketAddr> = ports.iter().map(|(_, a)| *a).collect();
    for n in nodes.iter_mut() {
        n.start(None);
    }
    let l = one_leader(&addrs, LIMIT);
    let standbys: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    wait_for("etcd's in-sync set to name every node", LIMIT, || {
        cluster(&nodes[l])["isr"].as_array().map(Vec::len) == Some(3)
    });
    for &s in &standbys {
        wait_for(
            &format!("{} to answer /replica 200", nodes[s].name),
            LIMIT,
            || code(addrs[s], "/replica") == Some(200),
        );
        let a = http(addrs[s], "GET", "/replica").expect("GET /replica");
        let v = a.json();
        eprintln!("GET /replica at {}: {v}", nodes[s].name);
        assert_eq!(
            (v["role"].as_str(), v["in_sync"].as_bool()),
            (Some("standby"), Some(true)),
            "{v}"
        );
        assert_eq!(v["leader"], nodes[l].name, "{v}");
        assert_eq!(code(addrs[s], "/leader"), Some(503));
        assert_eq!(code(addrs[s], "/health"), Some(200));
    }
    assert_eq!(code(addrs[l], "/replica"), Some(503));
    assert_eq!(code(addrs[l], "/health"), Some(200));
    assert_eq!(cluster(&nodes[l])["leading"], true);
    check_lists(&nodes, l);
    let old_epoch = http(addrs[l], "GET", "/leader").expect("GET").json()["epoch"].clone();
    nodes[l].kill();
    let t0 = Instant::now();
    let l2 = one_leader(&addrs, FAILOVER_LIMIT);
    eprintln!("a new leader answered /leader after {:?}", t0.elapsed());
    assert_ne!(l2, l, "the killed leader answered");
    let new_epoch = http(addrs[l2], "GET", "/leader").expect("GET").json()["epoch"].clone();
    assert!(
        new_epoch.as_u64() > old_epoch.as_u64(),
        "epoch {new_epoch} after {old_epoch}"
    );
    let refused = TcpStream::connect_timeout(&addrs[l], Duration::from_secs(5));
    assert!(refused.is_err(), "the killed leader's port still answers");
    let v = list_json(&nodes[l2]);
    assert_eq!(v["leader"], nodes[l2].name, "{v}");
    for n in nodes.iter_mut() {
        n.stop();
    }
    etcd.kill().expect("kill etcd");
    let out = nodes[l2].roost(&["cluster", "list"]);
    assert_eq!(out.status.code(), Some(1), "list without etcd: {out:?}");
}

/// `roost cluster list` (JSON and text) on the leader's and a standby's configuration.
fn check_lists(nodes: &[Node], l: usize) {
    let leader = nodes[l].name;
    let v = list_json(&nodes[l]);
    assert_listed(&v, leader);
    assert_eq!(v["lag_from"], leader, "{v}");
    for m in v["members"].as_array().expect("members") {
        assert!(m["lag_lsns"].is_u64(), "the leader knows every lag: {m}");
    }
    let s = (l + 1) % 3;
    let v = list_json(&nodes[s]);
    assert_listed(&v, leader);
    assert_eq!(v["lag_from"], nodes[s].name, "{v}");
    let out = nodes[s].roost(&["cluster", "list"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("roost cluster list at {}:\n{text}", nodes[s].name);
    // MEMBER ADVERTISE ROLE RUNNING IN_SYNC ...: one row per member.
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|r| r.first().is_some_and(|n| ["a", "b", "c"].contains(n)))
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    let leaders: Vec<&str> = rows
        .iter()
        .filter(|r| r[2] == "leader")
        .map(|r| r[0])
        .collect();
    assert_eq!(leaders, [leader], "{text}");
    assert!(rows.iter().all(|r| r[3..5] == ["yes", "yes"]), "{text}");
}

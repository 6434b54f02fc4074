//! `roost cluster switchover NAME` (issue 42) on real etcd and three real `roost serve`
//! nodes: leadership moves to the named in-sync standby while a file client on every node
//! keeps sending batches; every batch is answered committed, keeps its ids when sent again,
//! and the longest stretch with no committed answer anywhere is printed (goal: at most 2 s).
//! Refusals: a name outside the in-sync set; the leader itself is "leads already".
//! `ROOST_SWITCHOVERS=10 cargo test -p roost --test cluster_switchover -- --nocapture` runs
//! ten in a row and prints each one's longest stretch.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod repl;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::drop_in;
use repl::cluster::*;
use repl::*;
use roost_etcd::testing::EtcdServer;
use serde_json::Value;

/// One answer a client saw: its key, when, and the result.
struct Seen {
    key: String,
    at: Instant,
    result: Value,
}

/// A closed-loop file client on a spool: one batch at a time until `stop`, each waited for
/// (at most [`LIMIT`]).
fn client(spool: PathBuf, prefix: String, stop: Arc<AtomicBool>) -> JoinHandle<Vec<Seen>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for i in 0..100_000 {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let key = format!("{prefix}-{i}");
            let name = format!("{key}.json");
            drop_in(&spool, &name, &batch(&key, "s", 2));
            let out = spool.join("out").join(&name);
            let t0 = Instant::now();
            let result = loop {
                if let Some(v) = std::fs::read(&out)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                {
                    break v;
                }
                assert!(t0.elapsed() < LIMIT, "{key}: no answer within {LIMIT:?}");
                std::thread::sleep(Duration::from_millis(2));
            };
            seen.push(Seen {
                key,
                at: Instant::now(),
                result,
            });
        }
        seen
    })
}

/// Switchovers in a row: 2, or `ROOST_SWITCHOVERS` (the 10, run by hand).
fn rounds() -> usize {
    std::env::var("ROOST_SWITCHOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// Runs `roost cluster switchover` with `node`'s configuration: exit code and output.
fn switchover(node: &Node, to: &str) -> (i32, String) {
    let out = node.roost(&["cluster", "switchover", to]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The longest stretch between `from` and `to` with no committed answer.
fn longest_gap(seen: &[&Seen], from: Instant, to: Instant) -> Duration {
    let mut times: Vec<Instant> = seen
        .iter()
        .filter(|s| s.result["status"] == "committed")
        .map(|s| s.at)
        .filter(|t| *t >= from && *t <= to)
        .collect();
    times.sort();
    let mut prev = from;
    let mut gap = Duration::ZERO;
    for t in times.into_iter().chain([to]) {
        gap = gap.max(t.saturating_duration_since(prev));
        prev = t;
    }
    gap
}

/// Goal: `roost cluster switchover NAME` moves leadership to NAME under load, twice in a
/// row, with every batch answered committed and kept, and no stretch over 2 s without a
/// committed answer (printed; asserted under a loose bound: a switchover must never wait
/// for a lease to run out).
#[test]
fn a_switchover_hands_leadership_to_the_named_standby_under_load() {
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes = three(t.path(), etcd.client_url(), "ack = \"standby\"");
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    isr_names_all(&nodes, l);
    let (code, text) = switchover(&nodes[l], "zz");
    assert_eq!(code, 1, "a name outside the in-sync set: {text}");
    assert!(text.contains("not in the in-sync set"), "{text}");
    let (code, text) = switchover(&nodes[l], nodes[l].name);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("leads already"), "{text}");
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = nodes
        .iter()
        .map(|n| client(n.spool(), format!("c-{}", n.name), stop.clone()))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let mut leader = l;
    let mut windows = Vec::new();
    for round in 0..rounds() {
        let to = (leader + 1) % nodes.len();
        isr_names_all(&nodes, leader);
        let t0 = Instant::now();
        let (code, text) = switchover(&nodes[(leader + 2) % nodes.len()], nodes[to].name);
        eprintln!("switchover {round}: {text}");
        assert_eq!(code, 0, "switchover to {}: {text}", nodes[to].name);
        assert!(
            text.contains(&format!("switchover done: {} leads", nodes[to].name)),
            "{text}"
        );
        assert_eq!(one_leader(&nodes, LIMIT), to, "etcd names another leader");
        std::thread::sleep(Duration::from_secs(2));
        windows.push((t0, Instant::now()));
        leader = to;
    }
    stop.store(true, Ordering::SeqCst);
    let seen: Vec<Seen> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("client"))
        .collect();
    let all: Vec<&Seen> = seen.iter().collect();
    for (k, (from, to)) in windows.iter().enumerate() {
        let gap = longest_gap(&all, *from, *to);
        eprintln!("switchover {k}: longest stretch without a committed answer {gap:?}");
        assert!(
            gap < Duration::from_millis(LEASE_MS * 3),
            "switchover {k}: {gap:?}"
        );
    }
    assert!(seen.len() > 20, "only {} batches answered", seen.len());
    for s in &seen {
        assert_eq!(s.result["status"], "committed", "{}: {}", s.key, s.result);
    }
    for s in seen.iter().step_by(7) {
        let name = format!("again-{}.json", s.key);
        drop_in(&nodes[leader].spool(), &name, &batch(&s.key, "s", 2));
        common::wait_for(&format!("{name} answered"), LIMIT, || {
            nodes[leader].result(&name).is_some()
        });
        let again = nodes[leader].result(&name).expect("result");
        assert_eq!(ids(&again), ids(&s.result), "{} lost or duplicated", s.key);
    }
    for k in 0..nodes.len() {
        if k != leader {
            caught_up(&nodes[leader], &nodes[k]);
        }
    }
    for n in nodes.iter_mut() {
        n.stop();
    }
    for k in 0..nodes.len() {
        if k != leader {
            same_logs(&nodes[leader], &nodes[k]);
        }
    }
    for n in &nodes {
        n.verify();
    }
}

//! The cluster (issue 42, "Real network faults") on real links: etcd and the nodes {a, b, c}
//! each in a network namespace of its own, on one bridge (`repl/netns.rs`), mutual TLS, a
//! 1 s lease, `ack = "standby"`. A partition is a node's port on the bridge taken down, so
//! its packets are dropped silently both ways, from etcd as from its peers (the proxies of
//! `cluster.rs` refuse connections instead, and cut a node off from etcd only). Needs root
//! and `ip netns`; fails, never skips, without them. Every wait is bounded.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod repl;

use std::time::{Duration, Instant};

use common::{drop_in, wait_for};
use repl::cluster::*;
use repl::netns::NetLab;
use repl::*;
use serde_json::Value;

/// Every answer a client was given so far: the request key and the ids it cites.
type Acked = Vec<(String, Vec<u64>)>;

/// The shortest cut, from the moment the link goes down: three leases in which the cut-off
/// node could answer on its own, and must not.
const CUT_MIN: Duration = Duration::from_millis(3 * LEASE_MS);

/// Goal (issue 42): the cluster keeps its promises over real link faults. Method: (a) one
/// leader is elected and every node's spool takes batches (standbys forward); (b) the
/// leader's link goes down: it fences itself before another node leads (never both), the
/// survivors commit, and a batch dropped at the cut-off leader is not answered there while it
/// is alone; healed, it follows the new leader and that batch gets the new leader's ids;
/// (c) a standby's link goes down: the leader keeps leading and commits with the other
/// standby, the cut-off standby answers nothing until healed, then catches up; (d) every
/// answer given, sent again to the leader, gets the same ids; all stop with exit 0, pass
/// `verify` and hold equal logs. The time from each cut to the first committed answer at a
/// surviving node is printed.
#[test]
fn a_cluster_on_real_links_survives_a_cut_leader_and_a_cut_standby() {
    let t = tempfile::tempdir().expect("tempdir");
    let mut lab = NetLab::new(t.path(), "ack = \"standby\"", LEASE_MS);
    lab.start_all();
    let mut acked = Acked::new();
    let l = elect_and_take_batches(&lab, &mut acked);
    let l2 = cut_the_leader(&lab, l, &mut acked);
    cut_a_standby(&lab, l2, &mut acked);
    every_answer_holds(&mut lab, l2, &acked);
}

/// (a) One leader, named by the others; three batches at each node commit. The leader.
fn elect_and_take_batches(lab: &NetLab, acked: &mut Acked) -> usize {
    let l = one_leader(&lab.nodes, LIMIT);
    // `roost status` from the host (a unix socket) names the leader at its namespace's
    // address.
    let st = cluster(&lab.nodes[(l + 1) % 3]);
    assert_eq!(st["leader"], lab.nodes[l].name, "{st}");
    assert_eq!(st["leader_advertise"], lab.addr(l), "{st}");
    for n in &lab.nodes {
        for i in 0..3 {
            let key = format!("start-{}-{i}", n.name);
            acked.push((key.clone(), ids(&submit_at(n, &key))));
        }
    }
    let st = cluster(&lab.nodes[l]);
    assert!(st["forwarded_in"].as_u64() >= Some(6), "{st}");
    l
}

/// (b) Cuts the leader `l` off; returns the node that leads after it.
fn cut_the_leader(lab: &NetLab, l: usize, acked: &mut Acked) -> usize {
    let nodes = &lab.nodes;
    isr_names_all(nodes, l);
    let old_epoch = cluster(&nodes[l])["epoch"].as_u64().expect("epoch");
    let survivors: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    let first = |i: usize| format!("leader-cut-at-{}", nodes[i].name);
    let at = Instant::now();
    lab.cut(l);
    let clock = answer_clock(nodes, &survivors, first, at);
    for &s in &survivors {
        drop_batch(&nodes[s], &first(s));
    }
    drop_batch(&nodes[l], "alone");
    let l2 = fenced_and_replaced(nodes, l, "alone.json");
    let led = at.elapsed();
    let epoch = cluster(&nodes[l2])["epoch"].as_u64().expect("epoch");
    assert!(epoch > old_epoch, "epoch {epoch} after {old_epoch}");
    eprintln!(
        "leader {} cut: {} leads {led:?} after the cut",
        nodes[l].name, nodes[l2].name
    );
    first_answers(nodes, &survivors, first, clock, acked);
    for &s in &survivors {
        let key = format!("leader-cut-more-{}", nodes[s].name);
        acked.push((key.clone(), ids(&submit_at(&nodes[s], &key))));
    }
    not_answered_until(&nodes[l], "alone.json", at + CUT_MIN);
    lab.heal(l);
    follows(nodes, l, l2);
    let at_old = committed(&nodes[l], "alone");
    let at_new = submit_at(&nodes[l2], "alone");
    assert_eq!(
        ids(&at_old),
        ids(&at_new),
        "the healed old leader answered `alone` on its own"
    );
    acked.push(("alone".to_owned(), ids(&at_new)));
    l2
}

/// Waits until the cut-off leader `l` says it no longer leads and another node does; on
/// every poll (the others read first, so a new leader seen while `l` still says it leads is
/// an overlap) the two never overlap and `l` has not answered `alone`. The new leader.
fn fenced_and_replaced(nodes: &[Node], l: usize, alone: &str) -> usize {
    let (mut l2, mut fenced) = (None, false);
    wait_for(
        "the cut-off leader fences itself and another leads",
        LIMIT,
        || {
            let now = (0..3)
                .filter(|i| *i != l)
                .find(|i| cluster(&nodes[*i])["leading"] == true);
            let st = nodes[l].status();
            let still = st["cluster"]["leading"] == true;
            assert!(
                !(still && now.is_some()),
                "{} leads while the cut-off {} still does: {st}",
                now.map_or("?", |i| nodes[i].name),
                nodes[l].name
            );
            fenced |= !still && !st.is_null() && st["replication"]["role"] != "primary";
            not_answered(&nodes[l], alone);
            l2 = now;
            fenced && l2.is_some()
        },
    );
    l2.expect("a new leader")
}

/// (c) Cuts the standby after the leader `l` off and heals it.
fn cut_a_standby(lab: &NetLab, l: usize, acked: &mut Acked) {
    let nodes = &lab.nodes;
    isr_names_all(nodes, l);
    let (s, other) = ((l + 1) % 3, (l + 2) % 3);
    let first = |i: usize| format!("standby-cut-at-{}", nodes[i].name);
    let at = Instant::now();
    lab.cut(s);
    let clock = answer_clock(nodes, &[l, other], first, at);
    eprintln!("standby {} cut:", nodes[s].name);
    for i in [l, other] {
        drop_batch(&nodes[i], &first(i));
    }
    drop_batch(&nodes[s], "behind-the-cut");
    first_answers(nodes, &[l, other], first, clock, acked);
    for i in [l, other] {
        let key = format!("standby-cut-more-{}", nodes[i].name);
        acked.push((key.clone(), ids(&submit_at(&nodes[i], &key))));
    }
    not_answered_until(&nodes[s], "behind-the-cut.json", at + CUT_MIN);
    let (lead, cut_off) = (cluster(&nodes[l]), cluster(&nodes[s]));
    assert_eq!(
        lead["leading"], true,
        "a standby's cut moved the lead: {lead}"
    );
    assert_ne!(
        cut_off["leading"], true,
        "the cut-off standby leads: {cut_off}"
    );
    lab.heal(s);
    follows(nodes, s, l);
    let behind = committed(&nodes[s], "behind-the-cut");
    let at_leader = submit_at(&nodes[l], "behind-the-cut");
    assert_eq!(ids(&behind), ids(&at_leader), "behind-the-cut: two batches");
    acked.push(("behind-the-cut".to_owned(), ids(&at_leader)));
    isr_names_all(nodes, l);
    caught_up(&nodes[l], &nodes[s]);
}

/// (d) Every answer given holds at the leader `l`; all stop cleanly (standbys first, so
/// none wins an election meanwhile), pass `verify` and hold the leader's log.
fn every_answer_holds(lab: &mut NetLab, l: usize, acked: &Acked) {
    for (key, want) in acked {
        let again = resubmit(&lab.nodes[l], key);
        assert_eq!(&ids(&again), want, "{key} was answered with other ids");
    }
    let standbys: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    for &s in &standbys {
        caught_up(&lab.nodes[l], &lab.nodes[s]);
    }
    for &s in &standbys {
        lab.nodes[s].stop();
    }
    lab.nodes[l].stop();
    for &s in &standbys {
        same_logs(&lab.nodes[l], &lab.nodes[s]);
    }
    for n in &lab.nodes {
        n.verify();
    }
}

/// Watches, from `at` on, for the answers to the batches `key(i)` dropped at each node of
/// `at_nodes` just after a cut (the result files' own times are too coarse: a clock tick of
/// the file system); the returned thread ends once all are there or after [`LIMIT`].
fn answer_clock(
    nodes: &[Node],
    at_nodes: &[usize],
    key: impl Fn(usize) -> String,
    at: Instant,
) -> std::thread::JoinHandle<Vec<Option<Duration>>> {
    let paths: Vec<_> = at_nodes
        .iter()
        .map(|&i| {
            nodes[i]
                .spool()
                .join("out")
                .join(format!("{}.json", key(i)))
        })
        .collect();
    std::thread::spawn(move || {
        let mut seen = vec![None; paths.len()];
        while seen.iter().any(Option::is_none) && at.elapsed() < LIMIT {
            for (path, seen) in paths.iter().zip(&mut seen) {
                if seen.is_none() && path.exists() {
                    *seen = Some(at.elapsed());
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        seen
    })
}

/// Waits for the batches `key(i)` dropped at each of `at_nodes` just after a cut, asserts
/// each committed, records them, and prints how long after the cut each was answered (as
/// `clock` saw it) and the first of them.
fn first_answers(
    nodes: &[Node],
    at_nodes: &[usize],
    key: impl Fn(usize) -> String,
    clock: std::thread::JoinHandle<Vec<Option<Duration>>>,
    acked: &mut Acked,
) {
    for &i in at_nodes {
        let r = committed(&nodes[i], &key(i));
        acked.push((key(i), ids(&r)));
    }
    let times = clock.join().expect("the answer clock");
    for (&i, took) in at_nodes.iter().zip(&times) {
        let took = took.expect("answered, so seen");
        eprintln!("  committed at {} {took:?} after the cut", nodes[i].name);
    }
    let first = times.iter().flatten().min().expect("an answer");
    eprintln!("  first committed answer at a surviving node: {first:?} after the cut");
}

/// Drops `KEY.json` (two creates on shard `s` under request key `KEY`) into `node`'s spool.
fn drop_batch(node: &Node, key: &str) {
    drop_in(&node.spool(), &format!("{key}.json"), &batch(key, "s", 2));
}

/// Waits for the result of `KEY.json` at `node` and asserts it committed.
fn committed(node: &Node, key: &str) -> Value {
    let name = format!("{key}.json");
    wait_for(&format!("{key} answered at {}", node.name), LIMIT, || {
        node.result(&name).is_some()
    });
    let r = node.result(&name).expect("result");
    assert_eq!(r["status"], "committed", "{key} at {}: {r}", node.name);
    r
}

/// Sends `key` again to `node` under a new file name (the first answer may be in its
/// `out/` already) and returns the answer.
fn resubmit(node: &Node, key: &str) -> Value {
    let name = format!("{key}.again");
    drop_in(&node.spool(), &format!("{name}.json"), &batch(key, "s", 2));
    committed(node, &name)
}

/// `node` (cut off) has not answered `name`.
fn not_answered(node: &Node, name: &str) {
    if let Some(r) = node.result(name) {
        panic!("{} answered {name} while cut off: {r}", node.name);
    }
}

/// [`not_answered`] on every poll until `until`.
fn not_answered_until(node: &Node, name: &str, until: Instant) {
    loop {
        not_answered(node, name);
        if Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until node `i` says it follows `l` (and does not lead).
fn follows(nodes: &[Node], i: usize, l: usize) {
    let what = format!("{} to follow {}", nodes[i].name, nodes[l].name);
    wait_for(&what, LIMIT, || {
        let c = cluster(&nodes[i]);
        c["leading"] == false && c["leader"] == nodes[l].name
    });
}

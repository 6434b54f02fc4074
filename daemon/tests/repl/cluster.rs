//! The cluster tests' nodes (`cluster.rs`, `cluster_stop.rs`): three `roost serve` nodes
//! {a, b, c} led through etcd, and what those tests read of them. Every wait is bounded.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use super::{batch, Node, LIMIT};
use crate::common::{drop_in, wait_for};
use serde_json::Value;

/// The lease of the test clusters.
pub const LEASE_MS: u64 = 1000;

/// A node of the cluster {a, b, c} led through the etcd at `etcd` (`extra`: more
/// `[replication]` lines).
pub fn cluster_node(root: &Path, name: &'static str, etcd: &str, extra: &str) -> Node {
    cluster_node_with(root, name, &[etcd.to_owned()], extra, "")
}

/// [`cluster_node`] with every etcd endpoint and more `[cluster]` lines.
pub fn cluster_node_with(
    root: &Path,
    name: &'static str,
    etcd: &[String],
    extra: &str,
    cluster_extra: &str,
) -> Node {
    let mut n = Node::new(root, name, extra);
    let text = std::fs::read_to_string(&n.config).expect("config");
    let cluster = format!(
        "\n[cluster]\netcd = {etcd:?}\nadvertise = \"{}\"\nlease_ms = {LEASE_MS}\n{cluster_extra}\n",
        n.addr()
    );
    std::fs::write(&n.config, format!("{text}{cluster}")).expect("config");
    n.child = None;
    n
}

pub fn three(root: &Path, etcd: &str, extra: &str) -> Vec<Node> {
    ["a", "b", "c"]
        .into_iter()
        .map(|name| cluster_node(root, name, etcd, extra))
        .collect()
}

/// The `cluster` object of a node's status (null when the daemon does not answer).
pub fn cluster(n: &Node) -> Value {
    n.status()["cluster"].clone()
}

/// Waits until etcd's in-sync set, as the leader `l` last wrote it, names every node. Only a
/// node in it may campaign (docs/cluster.md, "Who may win"), and a standby joins the
/// engine's set before etcd's: a strike on the leader between the two leaves no node that
/// may win (a run of `a_leader_cut_off_from_etcd_fences_itself` was cut there, and no
/// other node led for the whole limit).
pub fn isr_names_all(nodes: &[Node], l: usize) {
    wait_for("etcd's in-sync set to name every node", LIMIT, || {
        cluster(&nodes[l])["isr"].as_array().map(Vec::len) == Some(nodes.len())
    });
}

/// The index of the one node that says it leads, once exactly one does (and the others
/// name it), within `limit`.
pub fn one_leader(nodes: &[Node], limit: Duration) -> usize {
    let mut found = None;
    wait_for("exactly one leader, named by the others", limit, || {
        let views: Vec<Value> = nodes
            .iter()
            .map(|n| {
                if n.child.is_some() {
                    cluster(n)
                } else {
                    Value::Null
                }
            })
            .collect();
        let leading: Vec<usize> = (0..nodes.len())
            .filter(|i| views[*i]["leading"] == true)
            .collect();
        let [l] = leading[..] else { return false };
        let named = views
            .iter()
            .enumerate()
            .filter(|(i, v)| *i != l && !v.is_null())
            .all(|(_, v)| v["leader"] == nodes[l].name);
        found = Some(l);
        named
    });
    found.expect("a leader")
}

pub fn start_all(nodes: &mut [Node]) {
    for n in nodes.iter_mut() {
        n.start(None);
    }
}

/// Drops `key` into `node`'s spool and waits for its committed result there.
pub fn submit_at(node: &Node, key: &str) -> Value {
    let name = format!("{key}.json");
    drop_in(&node.spool(), &name, &batch(key, "s", 2));
    wait_for(&format!("{key} answered at {}", node.name), LIMIT, || {
        node.result(&name).is_some()
    });
    let r = node.result(&name).expect("result");
    assert_eq!(r["status"], "committed", "{key} at {}: {r}", node.name);
    r
}

pub fn ids(r: &Value) -> Vec<u64> {
    r["ops"]
        .as_array()
        .map(|ops| ops.iter().filter_map(|o| o["id"].as_u64()).collect())
        .unwrap_or_default()
}

/// Another node than `l` that says it leads, once one does (`l` paused or dead).
pub fn another_leader(nodes: &[Node], l: usize) -> usize {
    let mut found = None;
    wait_for("another leader", LIMIT, || {
        found = (0..nodes.len())
            .filter(|i| *i != l && nodes[*i].child.is_some())
            .find(|i| cluster(&nodes[*i])["leading"] == true);
        found.is_some()
    });
    found.expect("a new leader")
}

//! `roost-bench --cluster` (issue 27): what a three-node cluster's `ack = "standby"` costs
//! against `ack = "local"` in the same cluster. Each round starts etcd (Debian's
//! etcd-server, on loopback) and three real `roost serve` nodes (mutual TLS, `[cluster]`
//! with the default lease) on fresh directories, once per mode (the order reversed every
//! other round), waits for a leader and for all three nodes in its in-sync set (so every
//! `standby` answer waits for both standbys), then runs the same batches as the replication
//! benchmark (10 creates of ~100 B): a burst of N files and closed-loop cells at the
//! leader's spool, and a closed-loop cell at a standby's spool (each batch forwarded to the
//! leader and answered there once the standby holds it). The raw disk's fdatasync rate is
//! printed beside them. `ROOST_BENCH_QUICK=1` makes it tiny (the CI smoke),
//! `ROOST_BENCH_ROUNDS=N` sets the rounds. No figure is asserted.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost::drill::child::ServeChild;
use roost_benchkit::{bench_base, raw_fdatasync, SyncFile};
use roost_etcd::testing::EtcdServer;
use serde_json::Value;

use crate::replication::roost_bin;
use crate::spool::{burst_timed, clear_out, closed_loop, Workload};

const LIMIT: Duration = Duration::from_secs(120);
const NAMES: [&str; 3] = ["a", "b", "c"];
const MODES: [&str; 2] = ["local", "standby"];

struct Sizes {
    burst: usize,
    clients: Vec<usize>,
    cell: Duration,
    rounds: usize,
}

fn sizes() -> Sizes {
    let rounds = std::env::var("ROOST_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok());
    match std::env::var_os("ROOST_BENCH_QUICK") {
        Some(_) => Sizes {
            burst: 100,
            clients: vec![4],
            cell: Duration::from_millis(300),
            rounds: rounds.unwrap_or(1),
        },
        None => Sizes {
            burst: 3_000,
            clients: vec![4, 32],
            cell: Duration::from_secs(3),
            rounds: rounds.unwrap_or(3),
        },
    }
}

/// One running node.
struct Node {
    child: ServeChild,
    spool: PathBuf,
    socket: PathBuf,
}

impl Node {
    fn status(&self) -> Option<Value> {
        let text = roost::control::socket::request(&self.socket, "status").ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// etcd and three nodes of one mode, the leader known and all three in sync.
struct Cluster {
    _etcd: EtcdServer,
    nodes: Vec<Node>,
    leader: usize,
}

impl Cluster {
    fn start(bin: &Path, root: &Path, ack: &str) -> anyhow::Result<Cluster> {
        let etcd = EtcdServer::start(&root.join("etcd")).context("starting etcd")?;
        let mut nodes = Vec::new();
        for name in NAMES {
            // Kept from the kernel's own picks until the node listens on it.
            let reserved = roost_etcd::testing::ReservedPort::new()?;
            let port = reserved.port();
            let dir = root.join(name);
            std::fs::create_dir_all(&dir)?;
            let socket = dir.join("roost.sock");
            let tls = roost::ops::tls_certs::member_config(&root.join("certs"), name, &NAMES)?;
            let text = format!(
                "control_socket = {:?}\n[replication]\nlisten = \"127.0.0.1:{port}\"\nname = \"{name}\"\nack = \"{ack}\"\n{tls}\n[cluster]\netcd = [\"{}\"]\nadvertise = \"127.0.0.1:{port}\"\n",
                socket.display().to_string(),
                etcd.client_url()
            );
            let config = dir.with_extension("toml");
            std::fs::write(&config, text)?;
            let mut child = ServeChild::spawn(bin, &dir, &dir.with_extension("log"), |c| {
                c.arg("--config")
                    .arg(&config)
                    .env_remove("RUNTIME_DIRECTORY");
            })?;
            child.ready(LIMIT)?;
            nodes.push(Node {
                child,
                spool: dir.join("spool"),
                socket,
            });
        }
        let leader = wait_in_sync(&nodes)?;
        Ok(Cluster {
            _etcd: etcd,
            nodes,
            leader,
        })
    }

    fn stop(self) -> anyhow::Result<()> {
        for mut n in self.nodes {
            let st = n.child.stop(LIMIT)?;
            if !st.success() {
                bail!(
                    "roost serve stopped with {st}; log {}",
                    n.child.log_path().display()
                );
            }
        }
        Ok(())
    }
}

/// The leader's index once one leads with all three nodes in its in-sync set.
fn wait_in_sync(nodes: &[Node]) -> anyhow::Result<usize> {
    let until = Instant::now() + LIMIT;
    while Instant::now() < until {
        for (i, n) in nodes.iter().enumerate() {
            let c = n
                .status()
                .map(|s| s["cluster"].clone())
                .unwrap_or(Value::Null);
            let isr = c["isr"].as_array().map_or(0, Vec::len);
            if c["leading"] == true && isr == 3 {
                return Ok(i);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("no leader with three nodes in sync within {LIMIT:?}")
}

/// One mode's figures: burst rate, the leader's cells, the standby's (forwarded) cell.
struct Round {
    burst: f64,
    leader: Vec<f64>,
    forwarded: f64,
    /// The leader's wait for its standbys, p50/p99 (ms, bucket bounds), and its batches per
    /// WAL sync, over the whole round.
    replicate: Value,
    per_sync: f64,
}

fn run_round(bin: &Path, root: &Path, ack: &str, sz: &Sizes) -> anyhow::Result<Round> {
    let c = Cluster::start(bin, root, ack)?;
    let w = Workload {
        ops: 10,
        record_bytes: 100,
    };
    let lead = &c.nodes[c.leader].spool;
    let burst = burst_timed(lead, sz.burst, &w)?.rate;
    clear_out(lead);
    let mut leader = Vec::new();
    for clients in &sz.clients {
        leader.push(closed_loop(lead, *clients, sz.cell, &w)?.0);
        clear_out(lead);
    }
    let standby = &c.nodes[(c.leader + 1) % 3].spool;
    let most = sz.clients.last().copied().unwrap_or(4);
    let forwarded = closed_loop(standby, most, sz.cell, &w)?.0;
    let st = c.nodes[c.leader].status().unwrap_or(Value::Null);
    let replicate = st["latency_ms"]["replicate"].clone();
    let per_sync = st["wal_batches_per_sync"].as_f64().unwrap_or(f64::NAN);
    c.stop()?;
    Ok(Round {
        replicate,
        per_sync,
        burst,
        leader,
        forwarded,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `--cluster`: the rounds, then the table.
pub fn run() -> anyhow::Result<()> {
    let sz = sizes();
    let bin = roost_bin()?;
    let root = bench_base("target/bench-cluster");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
    println!(
        "roost cluster benchmark in {} with {}: {} rounds; 3 nodes + etcd on loopback, mutual TLS, lease_ms 3000; burst of {} files, closed-loop clients {:?} for {:?} each; batches of 10 creates of ~100 B",
        root.display(), bin.display(), sz.rounds, sz.burst, sz.clients, sz.cell
    );
    let sync = raw_fdatasync(
        &root.join("raw-sync"),
        1200,
        Duration::from_secs(1),
        SyncFile::Append,
    )?;
    println!(
        "raw disk: {:.0} fdatasync/s (1.2 KB writes)",
        sync.ops_per_sec
    );
    let mut all: Vec<(&str, Round)> = Vec::new();
    for r in 0..sz.rounds {
        let mut order = MODES.to_vec();
        if r % 2 == 1 {
            order.reverse();
        }
        for ack in order {
            let x = run_round(&bin, &root.join(format!("r{r}-{ack}")), ack, &sz)?;
            println!(
                "round {r} ack={ack:<7}: burst {:.0}/s; leader {:?} clients {:?}/s; standby (forwarded) {}/s; the leader's wait for standbys (ms) {}, {:.1} batches per WAL sync",
                x.burst, sz.clients, x.leader.iter().map(|v| v.round()).collect::<Vec<_>>(), x.forwarded.round(), x.replicate, x.per_sync
            );
            all.push((ack, x));
        }
    }
    print_table(&all, &sz, sync.ops_per_sec);
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

fn print_table(all: &[(&str, Round)], sz: &Sizes, sync: f64) {
    let med = |ack: &str, f: &dyn Fn(&Round) -> f64| {
        median(
            all.iter()
                .filter(|(a, _)| *a == ack)
                .map(|(_, x)| f(x))
                .collect(),
        )
    };
    println!();
    println!(
        "| figure (median of rounds) | ack=local | ack=standby | standby/local | raw fdatasync/s |"
    );
    println!("|---|---|---|---|---|");
    let row = |label: String, f: &dyn Fn(&Round) -> f64| {
        let (l, s) = (med("local", f), med("standby", f));
        println!("| {label} | {l:.0} | {s:.0} | {:.2} | {sync:.0} |", s / l);
    };
    row(
        format!("burst of {} files at the leader, batches/s", sz.burst),
        &|x| x.burst,
    );
    for (i, c) in sz.clients.iter().enumerate() {
        row(format!("{c} clients at the leader, batches/s"), &|x| {
            x.leader.get(i).copied().unwrap_or(f64::NAN)
        });
    }
    let most = sz.clients.last().copied().unwrap_or(4);
    row(
        format!("{most} clients at a standby (forwarded), batches/s"),
        &|x| x.forwarded,
    );
}

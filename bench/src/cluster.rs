//! `roost-bench --cluster` (issues 27 and 42): what a three-node cluster's `ack = "standby"`
//! costs against `ack = "local"` in the same cluster, and what a standby's intake (each
//! batch forwarded to the leader) carries against the leader's. Each round starts etcd
//! (Debian's etcd-server, on loopback) and three real `roost serve` nodes (mutual TLS,
//! `[cluster]` with the default lease) on fresh directories, once per mode (the order
//! reversed every other round), waits for a leader and for all three nodes in its in-sync set
//! (so every `standby` answer waits for both standbys), then runs the same batches as the
//! replication benchmark (10 creates of ~100 B): a burst of N files at the leader's spool;
//! closed-loop clients (one batch outstanding each) at 1, 4 and 32 clients, of files and of
//! the stream socket, at the leader and at a standby, the two places in turn for each cell;
//! and one bulk file at the leader, then one at the standby. The raw disk's fdatasync rate is
//! printed beside them. A standby's figures include the forward to the leader: the answer
//! waits until the standby holds the claim. `ROOST_BENCH_QUICK=1` makes it tiny (the CI
//! smoke), `ROOST_BENCH_ROUNDS=N` sets the rounds, `ROOST_BENCH_CLIENTS=1,4` the client
//! counts. Each round's line ends with the leader's whole `latency_ms` (where an answer's
//! time went: plan, claim, commit, replicate, batch). Every answer is checked; no figure is
//! asserted. Beside roost, each round measures the replicated durable null (`null_pair.rs`:
//! a leader and two followers that only log, sync and acknowledge) at the same client
//! counts in both modes, the physical `standby / local` ratio of this machine;
//! `roost-bench --null-pair` runs only that. Under each round's line, one line per stream
//! cell says where its disk work went (`flushes.rs`): device flushes, each node's WAL
//! syncs, shard flushes and durability rounds per batch, and the leader's wait for its
//! standbys by bucket.

pub(crate) mod clients;
mod flushes;
pub(crate) mod null_pair;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost::drill::child::ServeChild;
use roost_benchkit::{bench_base, raw_fdatasync, SyncFile};
use roost_etcd::testing::EtcdServer;
use serde_json::Value;

use crate::replication::roost_bin;
use crate::spool::{burst_timed, clear_out, closed_loop, Workload};
use clients::{bulk_file, stream_closed_loop};

const LIMIT: Duration = Duration::from_secs(120);
const NAMES: [&str; 3] = ["a", "b", "c"];
const MODES: [&str; 2] = ["local", "standby"];
/// Every batch of the run: the replication benchmark's.
const W: Workload = Workload {
    ops: 10,
    record_bytes: 100,
};

struct Sizes {
    burst: usize,
    /// Lines of the one bulk file dropped at each place.
    bulk: usize,
    clients: Vec<usize>,
    cell: Duration,
    rounds: usize,
}

fn sizes() -> Sizes {
    let rounds = std::env::var("ROOST_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok());
    let clients: Option<Vec<usize>> = std::env::var("ROOST_BENCH_CLIENTS")
        .ok()
        .and_then(|v| v.split(',').map(|n| n.trim().parse().ok()).collect());
    let mut sz = default_sizes(rounds);
    if let Some(c) = clients.filter(|c| !c.is_empty() && !c.contains(&0)) {
        sz.clients = c;
    }
    sz
}

fn default_sizes(rounds: Option<usize>) -> Sizes {
    match std::env::var_os("ROOST_BENCH_QUICK") {
        Some(_) => Sizes {
            burst: 100,
            bulk: 100,
            clients: vec![1, 4],
            cell: Duration::from_millis(300),
            rounds: rounds.unwrap_or(1),
        },
        None => Sizes {
            burst: 3_000,
            bulk: 2_000,
            clients: vec![1, 4, 32],
            cell: Duration::from_secs(3),
            rounds: rounds.unwrap_or(3),
        },
    }
}

/// One running node.
struct Node {
    child: ServeChild,
    spool: PathBuf,
    /// Its stream socket (`<data>/stream.sock`).
    stream: PathBuf,
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
                stream: dir.join("stream.sock"),
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

    /// The leader, then the standby whose intake is measured.
    fn places(&self) -> [&Node; 2] {
        [
            &self.nodes[self.leader],
            &self.nodes[(self.leader + 1) % NAMES.len()],
        ]
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

/// The intakes measured at both places.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Intake {
    Files,
    Stream,
    Bulk,
}

/// What one place (the leader, or a standby) carried in one round: batches/s per client
/// count (in [`Sizes::clients`]' order) for files and the stream, and the bulk file's
/// lines/s.
#[derive(Default)]
struct Place {
    files: Vec<f64>,
    stream: Vec<f64>,
    bulk: f64,
}

impl Place {
    /// The figure of `intake` at the `i`-th client count (bulk has one figure).
    fn get(&self, intake: Intake, i: usize) -> f64 {
        let at = |v: &[f64]| v.get(i).copied().unwrap_or(f64::NAN);
        match intake {
            Intake::Files => at(&self.files),
            Intake::Stream => at(&self.stream),
            Intake::Bulk => self.bulk,
        }
    }
}

/// One mode's figures: the burst at the leader, then the leader's and the standby's cells.
struct Round {
    burst: f64,
    /// `[leader, standby]`.
    at: [Place; 2],
    /// The leader's wait for its standbys, p50/p99 (ms, bucket bounds), and its batches per
    /// WAL sync, over the whole round.
    replicate: Value,
    /// The leader's whole `latency_ms` at the round's end.
    latency: Value,
    per_sync: f64,
    /// Batches the measured standby forwarded to the leader and answered, over the round.
    forwarded_out: u64,
    /// Each stream cell's disk work (`flushes.rs`), one line per cell.
    flushes: Vec<String>,
}

fn run_round(bin: &Path, root: &Path, ack: &str, sz: &Sizes) -> anyhow::Result<Round> {
    let c = Cluster::start(bin, root, ack)?;
    let nodes = c.places();
    let lead = &nodes[0].spool;
    let burst = burst_timed(lead, sz.burst, &W)?.rate;
    clear_out(lead);
    let mut flushes = Vec::new();
    let at = measure(&c, root, sz, &mut flushes).with_context(|| {
        let logs: Vec<String> = nodes
            .iter()
            .map(|n| n.child.log_path().display().to_string())
            .collect();
        format!("ack={ack}; the leader's and the standby's logs: {logs:?}")
    })?;
    let st = nodes[0].status().unwrap_or(Value::Null);
    let replicate = st["latency_ms"]["replicate"].clone();
    let latency = st["latency_ms"].clone();
    let per_sync = st["wal_batches_per_sync"].as_f64().unwrap_or(f64::NAN);
    let standby = nodes[1].status().unwrap_or(Value::Null);
    let forwarded_out = standby["cluster"]["forwarded_out"].as_u64().unwrap_or(0);
    c.stop()?;
    Ok(Round {
        replicate,
        latency,
        per_sync,
        burst,
        at,
        forwarded_out,
        flushes,
    })
}

/// Every cell at `[leader, standby]`: for each client count files at one then the other,
/// then the same for the stream (each stream cell's disk work added to `flushes`), then one
/// bulk file at each.
fn measure(
    c: &Cluster,
    root: &Path,
    sz: &Sizes,
    flushes: &mut Vec<String>,
) -> anyhow::Result<[Place; 2]> {
    let nodes = c.places();
    let snapshot = || {
        let statuses: Vec<Option<Value>> = c.nodes.iter().map(Node::status).collect();
        let metrics = roost::control::socket::request(&c.nodes[c.leader].socket, "metrics");
        flushes::Snapshot::take(&statuses, &metrics.unwrap_or_default(), root)
    };
    let mut at = [Place::default(), Place::default()];
    let role = |p: usize| ["the leader", "a standby"][p];
    for &n in &sz.clients {
        for (p, node) in nodes.iter().enumerate() {
            let cell = closed_loop(&node.spool, n, sz.cell, &W)
                .with_context(|| format!("{n} file clients at {}", role(p)))?;
            at[p].files.push(cell.0);
            clear_out(&node.spool);
        }
    }
    for &n in &sz.clients {
        for (p, node) in nodes.iter().enumerate() {
            let before = snapshot();
            let rate = stream_closed_loop(&node.stream, n, sz.cell, &W)
                .with_context(|| format!("{n} stream clients at {}", role(p)))?;
            let work = before.per_batch(&snapshot(), c.leader, &NAMES);
            flushes.push(format!("{n} stream clients at {}: {work}", role(p)));
            at[p].stream.push(rate);
        }
    }
    for (p, node) in nodes.iter().enumerate() {
        at[p].bulk = bulk_file(&node.spool, sz.bulk, &W)
            .with_context(|| format!("a bulk file of {} lines at {}", sz.bulk, role(p)))?;
    }
    Ok(at)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn rounded(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| x.round()).collect()
}

/// `--cluster`: the rounds, then the tables.
pub fn run() -> anyhow::Result<()> {
    let sz = sizes();
    let bin = roost_bin()?;
    let root = bench_base("target/bench-cluster");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
    println!(
        "roost cluster benchmark in {} with {}: {} rounds; 3 nodes + etcd on loopback, mutual TLS, lease_ms 3000; burst of {} files, closed-loop clients {:?} for {:?} each; batches of 10 creates of ~100 B; file and stream clients (one batch outstanding each) and a bulk file of {} lines, at the leader and at a standby",
        root.display(), bin.display(), sz.rounds, sz.burst, sz.clients, sz.cell, sz.bulk
    );
    let sync = raw_sync(&root)?;
    let mut all: Vec<(&str, Round)> = Vec::new();
    let mut nulls: Vec<NullRound> = Vec::new();
    for r in 0..sz.rounds {
        let mut order = MODES.to_vec();
        if r % 2 == 1 {
            order.reverse();
        }
        let null = null_round(&root.join(format!("r{r}-null")), &sz, r)?;
        print_null_round(&format!("round {r} replicated durable null"), &null, &sz);
        nulls.push(null);
        for ack in order {
            let x = run_round(&bin, &root.join(format!("r{r}-{ack}")), ack, &sz)?;
            print_round(r, ack, &x, &sz);
            all.push((ack, x));
        }
    }
    print_table(&all, &sz, sync);
    print_places(&all, &sz);
    print_null(&all, &nulls, &sz);
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// The replicated durable null's rates in one round, per client count.
struct NullRound {
    local: Vec<f64>,
    standby: Vec<f64>,
}

/// Every client count of `sz`, in both modes, the two modes in turn for each count (which
/// goes first alternates with the round, as roost's modes do).
fn null_round(dir: &Path, sz: &Sizes, round: usize) -> anyhow::Result<NullRound> {
    let mut r = NullRound {
        local: Vec::new(),
        standby: Vec::new(),
    };
    for &n in &sz.clients {
        let odd = !round.is_multiple_of(2);
        for standby in [odd, !odd] {
            let rate = null_pair::closed_loop(&dir.join("pair"), n, sz.cell, standby)?;
            match standby {
                true => r.standby.push(rate),
                false => r.local.push(rate),
            }
        }
    }
    Ok(r)
}

/// `--null-pair`: the replicated durable null alone, the raw rate beside it.
pub fn run_null_pair() -> anyhow::Result<()> {
    let sz = sizes();
    let root = bench_base("target/bench-null-pair");
    std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
    raw_sync(&root)?;
    let mut nulls = Vec::new();
    for r in 0..sz.rounds {
        let null = null_round(&root.join(format!("r{r}")), &sz, r)?;
        print_null_round(&format!("round {r}"), &null, &sz);
        nulls.push(null);
    }
    print_null(&[], &nulls, &sz);
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// The raw disk's fdatasync rate in `root` (1.2 KB appends for a second), printed.
fn raw_sync(root: &Path) -> anyhow::Result<f64> {
    let one = Duration::from_secs(1);
    let sync = raw_fdatasync(&root.join("raw-sync"), 1200, one, SyncFile::Append)?;
    println!(
        "raw disk: {:.0} fdatasync/s (1.2 KB writes)",
        sync.ops_per_sec
    );
    Ok(sync.ops_per_sec)
}

fn print_null_round(label: &str, null: &NullRound, sz: &Sizes) {
    println!(
        "{label}: clients {:?}: local {:?}/s, standby {:?}/s",
        sz.clients,
        rounded(&null.local),
        rounded(&null.standby)
    );
}

/// The null's `standby / local` beside roost's stream and files at the leader, and the
/// ratio roost's stream would have if `ack = "standby"` cost it only what it costs the null
/// (the null's added wait per request, `n / standby - n / local`, on top of roost's own
/// `ack = "local"` wait): roost's ratio read against what this machine allows.
fn print_null(all: &[(&str, Round)], nulls: &[NullRound], sz: &Sizes) {
    println!();
    println!("| clients (medians of rounds) | null local/s | null standby/s | null standby/local | null's added wait, ms | roost stream standby/local | roost stream if it added only the null's wait | roost files standby/local |");
    println!("|---|---|---|---|---|---|---|---|");
    for (i, &n) in sz.clients.iter().enumerate() {
        let l = median(nulls.iter().map(|r| r.local[i]).collect());
        let s = median(nulls.iter().map(|r| r.standby[i]).collect());
        let stream = |x: &Round| x.at[0].get(Intake::Stream, i);
        let files = |x: &Round| x.at[0].get(Intake::Files, i);
        let local_stream = med(all, "local", &stream);
        let added = n as f64 / s - n as f64 / l;
        let wait = n as f64 / local_stream;
        // `-` where roost did not run (`--null-pair`).
        let r = |x: f64| match x.is_nan() {
            true => "-".to_owned(),
            false => format!("{x:.2}"),
        };
        println!(
            "| {n} | {l:.0} | {s:.0} | {:.2} | {:.3} | {} | {} | {} |",
            s / l,
            added * 1e3,
            r(med(all, "standby", &stream) / local_stream),
            r(wait / (wait + added)),
            r(med(all, "standby", &files) / med(all, "local", &files)),
        );
    }
}

/// One round's line: issue 27's figures first, as they always were, then issue 42's.
fn print_round(r: usize, ack: &str, x: &Round, sz: &Sizes) {
    let [lead, standby] = &x.at;
    let most = sz.clients.len().saturating_sub(1);
    println!(
        "round {r} ack={ack:<7}: burst {:.0}/s; leader {:?} clients {:?}/s; standby (forwarded) {}/s; the leader's wait for standbys (ms) {}, {:.1} batches per WAL sync; files at a standby {:?}/s; stream clients {:?}: leader {:?}/s, standby {:?}/s; bulk {} lines: leader {:.0}/s, standby {:.0}/s; the standby forwarded {}; the leader's latency_ms {}",
        x.burst, sz.clients, rounded(&lead.files), standby.get(Intake::Files, most).round(), x.replicate, x.per_sync,
        rounded(&standby.files), sz.clients, rounded(&lead.stream), rounded(&standby.stream),
        sz.bulk, lead.bulk, standby.bulk, x.forwarded_out, x.latency
    );
    for line in &x.flushes {
        println!("  round {r} ack={ack:<7} disk work, {line}");
    }
}

/// The median over the rounds of `ack` of `f`.
fn med(all: &[(&str, Round)], ack: &str, f: &dyn Fn(&Round) -> f64) -> f64 {
    median(
        all.iter()
            .filter(|(a, _)| *a == ack)
            .map(|(_, x)| f(x))
            .collect(),
    )
}

/// The rows' labels: issue 27's rows keep their words ("4 clients at the leader", "32
/// clients at a standby (forwarded)"); the rows are ordered by intake, clients, place.
fn label(intake: Intake, clients: usize, place: usize, sz: &Sizes) -> String {
    let at = ["at the leader", "at a standby (forwarded)"][place];
    let s = if clients == 1 { "" } else { "s" };
    match intake {
        Intake::Files => format!("{clients} client{s} {at}, batches/s"),
        Intake::Stream => format!("{clients} stream client{s} {at}, batches/s"),
        Intake::Bulk => format!("bulk file of {} lines {at}, lines/s", sz.bulk),
    }
}

/// ack=standby against ack=local, one row per (intake, clients, place).
fn print_table(all: &[(&str, Round)], sz: &Sizes, sync: f64) {
    println!();
    println!(
        "| figure (median of rounds) | ack=local | ack=standby | standby/local | raw fdatasync/s |"
    );
    println!("|---|---|---|---|---|");
    let row = |label: String, f: &dyn Fn(&Round) -> f64| {
        let (l, s) = (med(all, "local", f), med(all, "standby", f));
        println!("| {label} | {l:.0} | {s:.0} | {:.2} | {sync:.0} |", s / l);
    };
    row(
        format!("burst of {} files at the leader, batches/s", sz.burst),
        &|x| x.burst,
    );
    for intake in [Intake::Files, Intake::Stream] {
        for (i, &n) in sz.clients.iter().enumerate() {
            for place in 0..2 {
                row(label(intake, n, place, sz), &|x| x.at[place].get(intake, i));
            }
        }
    }
    for place in 0..2 {
        row(label(Intake::Bulk, 1, place, sz), &|x| x.at[place].bulk);
    }
}

/// A standby's intake against the leader's, per intake at the most clients, in each mode.
fn print_places(all: &[(&str, Round)], sz: &Sizes) {
    let most = sz.clients.len().saturating_sub(1);
    let n = sz.clients.last().copied().unwrap_or(0);
    println!();
    println!("| a standby's intake / the leader's (medians of rounds) | ack=local | ack=standby |");
    println!("|---|---|---|");
    let rows = [
        (Intake::Files, format!("files, {n} clients")),
        (Intake::Stream, format!("stream, {n} clients")),
        (Intake::Bulk, format!("bulk file of {} lines", sz.bulk)),
    ];
    for (intake, name) in rows {
        let ratio = |ack: &str| {
            let standby = med(all, ack, &|x| x.at[1].get(intake, most));
            standby / med(all, ack, &|x| x.at[0].get(intake, most))
        };
        println!(
            "| {name} | {:.2} | {:.2} |",
            ratio("local"),
            ratio("standby")
        );
    }
}

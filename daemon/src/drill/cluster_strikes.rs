//! `roost drill --cluster`: the cluster's failover drill (issue 27, docs/cluster.md). etcd and
//! three nodes (`<root>/a`, `b`, `c`) on loopback, mutual TLS, `ack = "standby"`; every
//! node reaches etcd through a proxy of its own, and the others reach its replication port
//! through another (`proxy.rs`). Each round sends batch files into all three spools and
//! batches into all three stream sockets, and at a random moment strikes the leader in turn:
//! SIGKILL (restarted once another leads), SIGSTOP past its lease (SIGCONT once another
//! leads), or a cut of both its proxies (healed once another leads); with `--etcd-members 3`
//! a fourth strike kills one etcd member (every node has a proxy to each), started again two
//! leases later, and no node is struck (`Etcd`). It measures the time
//! from the strike to another node leading, watches every node's status for two nodes
//! leading one epoch, and waits until every file of the round is answered (a standby's files
//! are forwarded again by the node itself; a stream's `unavailable` is sent again).
//!
//! What a client waits (issue 42): at each strike a probe client (`probe.rs`) streams one
//! batch at a time to the two other nodes in turn, from the strike until the struck node is
//! back and a second more; the drill reports, per strike kind, the time to a new leader in
//! `status`, the time to the probe's first `committed` answer and its longest stretch
//! without one. A strike after which the probe got no committed answer within
//! `ELECTION_LIMIT` is a violation. The probe's batches join the others: answered, they are
//! acknowledged; unanswered, they are sent again until they are.
//!
//! Two more modes share the rounds and the checks. `--rolling` (issue 42) restarts the
//! nodes as an upgrade does: each strike (`Term`) is a SIGTERM to the next node in turn (a,
//! b, c, a, ...), which must exit 0 within `TERM_LIMIT`, then the node is started again;
//! the probe runs from the SIGTERM as above; only a stopped leader is waited out (another
//! must lead); and the round ends once the leader's in-sync set names every node again (a
//! node outside it may not campaign, so stopping the leader sooner could leave no node
//! electable). It reports the longest stretch without a committed answer over the whole
//! restart. `--quiet-secs N` strikes nothing: rounds of load (files while `--batches`
//! allows, fresh streamed batches in their place after) until N seconds have passed, then
//! the final checks; every leader change it sees (epochs led beyond the first, or the
//! nodes' `elections_won` beyond one and `fenced` above zero) is a violation.
//! `--switchovers` (issue 42) runs `roost cluster switchover` from the leader to the next
//! node each round (`Switch`); anything but exit 0 with that node leading is a violation;
//! the probe runs from the command's start, and the round ends once the in-sync set names
//! every node again.
//!
//! At the end every node stops gracefully and the drill checks: every acknowledged batch,
//! sent again, gets its original answer; every committed create is in every node's shards,
//! none twice; the WALs agree at every lsn and end at the same one; the shards are equal;
//! `verify` holds on every node. The verdicts are `verdict.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost_etcd::testing::EtcdCluster;
use roost_storage::RealStorage;
use rustix::process::Signal;
use serde_json::Value;

use super::batches::Batches;
use super::node::Node;
use super::probe::{self, Probe};
use super::proxy::Proxy;
use super::setup::DrillOptions;
use super::verdict;
use crate::batch::BatchResult;

const NAMES: [&str; 3] = ["a", "b", "c"];
/// How long the files of a round may take to be answered, plus this per file.
const ANSWER_LIMIT: Duration = Duration::from_secs(60);
const ANSWER_PER_FILE: Duration = Duration::from_millis(50);
/// The longest a new leader may take before the drill gives up on the round.
const ELECTION_LIMIT: Duration = Duration::from_secs(60);
/// Streamed batches per node per round.
const STREAMED: usize = 3;
/// A rolling restart's stop: the node must exit 0 within this long of its SIGTERM.
const TERM_LIMIT: Duration = Duration::from_secs(10);
/// A quiet round's batches (files while `--batches` allows, then streamed in their place),
/// and the pause between rounds, which also bounds their count.
const QUIET_ROUND_BATCHES: usize = 30;
const QUIET_PAUSE: Duration = Duration::from_millis(100);

/// What the cluster drill does between the start and the final checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterMode {
    /// `--kills` strikes on the leader: SIGKILL, SIGSTOP or a cut.
    Strikes,
    /// `--rolling`: `--kills` graceful stops, a node at a time in turn, each started again.
    Rolling,
    /// `--quiet-secs N`: load without a fault for `secs`; any leader change is a violation.
    Quiet { secs: u64 },
    /// `--switchovers`: `--kills` planned switchovers, each to the next node in turn.
    Switchovers,
}

/// How the cluster drill runs: the nodes' lease, the mode, and the etcd members (1, or 3
/// and more for the `Etcd` strike among the strikes on the leader).
#[derive(Clone, Copy, Debug)]
pub struct ClusterRun {
    pub lease_ms: u64,
    pub mode: ClusterMode,
    pub etcd_members: usize,
    /// Every proxy (to etcd, to a node's replication port) holds each byte this long each
    /// way (`--delay-ms`).
    pub delay_ms: u64,
}

/// Runs the cluster drill in `opts.data_dir` with `lease_ms`; prints the summary; returns
/// the number of violations.
pub fn run_cluster(opts: &DrillOptions, run: &ClusterRun) -> anyhow::Result<usize> {
    std::fs::create_dir_all(&opts.data_dir)?;
    let mode = run.mode;
    let mut d = Cluster::new(opts, run)?;
    d.start_all()?;
    match mode {
        ClusterMode::Strikes => {
            for round in 0..opts.kills {
                d.round(round)?;
            }
            d.last_round()?;
        }
        ClusterMode::Rolling => {
            for round in 0..opts.kills {
                d.rolling_round(round)?;
            }
            d.last_round()?;
        }
        ClusterMode::Quiet { secs } => d.quiet(Duration::from_secs(secs))?,
        ClusterMode::Switchovers => {
            for round in 0..opts.kills {
                d.switchover_round(round)?;
            }
            d.last_round()?;
        }
    }
    d.finish()?;
    d.judge_quiet();
    d.report();
    Ok(d.violations.len())
}

/// How a round strikes a node: the leader (`Kill`, `Pause`, `Cut`), or with `--rolling`
/// each node in turn (`Term`, a graceful stop).
#[derive(Clone, Copy, Debug)]
enum Strike {
    Kill,
    Pause,
    Cut,
    Term,
    /// `roost cluster switchover` to another node (`--switchovers`).
    Switch,
    /// SIGKILL of one etcd member (`--etcd-members 3`), started again two leases later.
    Etcd,
}

impl Strike {
    const KINDS: [&'static str; 6] = ["Kill", "Pause", "Cut", "Term", "Switch", "Etcd"];

    fn kind(self) -> &'static str {
        match self {
            Strike::Kill => Strike::KINDS[0],
            Strike::Pause => Strike::KINDS[1],
            Strike::Cut => Strike::KINDS[2],
            Strike::Term => Strike::KINDS[3],
            Strike::Switch => Strike::KINDS[4],
            Strike::Etcd => Strike::KINDS[5],
        }
    }
}

/// A node's name and its (`cluster.elections_won`, `cluster.fenced`) from status at a quiet
/// run's end (`None`: it did not answer).
type NodeCounters = (&'static str, Option<(u64, u64)>);

/// What the status watcher saw: each epoch's leader, and the violations.
#[derive(Default)]
struct Seen {
    leaders: BTreeMap<u64, String>,
    two_in_one_epoch: Vec<String>,
}

struct Cluster<'a> {
    opts: &'a DrillOptions,
    lease_ms: u64,
    delay_ms: u64,
    mode: ClusterMode,
    /// A quiet run's end: each node's `cluster.elections_won` and `cluster.fenced` from
    /// status (`None`: it did not answer), read before the final stop.
    quiet_counters: Option<Vec<NodeCounters>>,
    /// A quiet run's report line (`quiet_verdict`), once judged.
    quiet_line: Option<String>,
    bin: PathBuf,
    etcd: EtcdCluster,
    nodes: Vec<Node>,
    /// Per node: its proxies to the etcd members, and the proxy in front of its replication
    /// port.
    proxies: Vec<(Vec<Proxy>, Proxy)>,
    b: Batches,
    /// The strikes' kinds, from a generator of their own: the batches' generator is also
    /// drawn from as often as timing makes files and streams be sent again, so the same
    /// seed gives the same schedule only from this one.
    strike_rng: roost_storage::SplitMix,
    /// Where each sent file (by index in `b.sent`) was delivered.
    node_of: Vec<usize>,
    /// Every answer a client got, by file name (or `stream/KEY`): the acknowledged batches.
    answers: BTreeMap<String, BatchResult>,
    /// Streamed batches (key, body) not answered yet.
    stream_pending: Vec<(String, Vec<u8>)>,
    stream_bodies: BTreeMap<String, Vec<u8>>,
    seen: Arc<Mutex<Seen>>,
    watching: Arc<AtomicBool>,
    failovers: Vec<(Strike, Duration)>,
    /// Per strike, what the probe client waited (`probe.rs`).
    waits: Vec<probe::Waited>,
    /// The probes' tries over all strikes.
    probe_counts: probe::Counts,
    violations: Vec<String>,
    log: Vec<String>,
    per_round: usize,
    next: usize,
    /// Streamed batches made so far (each one's key is unique).
    streamed: usize,
    unavailable: usize,
}

impl<'a> Cluster<'a> {
    fn new(opts: &'a DrillOptions, run: &ClusterRun) -> anyhow::Result<Cluster<'a>> {
        let (lease_ms, mode) = (run.lease_ms, run.mode);
        let delay = Duration::from_millis(run.delay_ms);
        let root = &opts.data_dir;
        let etcd =
            EtcdCluster::start(&root.join("etcd"), run.etcd_members).context("starting etcd")?;
        let mut nodes = Vec::new();
        let mut proxies = Vec::new();
        for name in NAMES {
            let n = Node::member(root, name, &NAMES)?;
            let to_etcd = etcd
                .client_urls()
                .iter()
                .map(|u| Proxy::start_delayed(u.trim_start_matches("http://").into(), delay))
                .collect::<std::io::Result<Vec<Proxy>>>()?;
            let urls: Vec<String> = to_etcd
                .iter()
                .map(|p| format!("\"http://{}\"", p.addr()))
                .collect();
            let to_node = Proxy::start_delayed(n.addr(), delay)?;
            n.append_config(&format!(
                "\n[cluster]\netcd = [{}]\nadvertise = \"{}\"\nlease_ms = {lease_ms}\n",
                urls.join(", "),
                to_node.addr()
            ))?;
            nodes.push(n);
            proxies.push((to_etcd, to_node));
        }
        Ok(Cluster {
            opts,
            lease_ms,
            delay_ms: run.delay_ms,
            mode,
            quiet_counters: None,
            quiet_line: None,
            bin: std::env::current_exe().context("locating the roost binary")?,
            etcd,
            nodes,
            proxies,
            b: Batches::new(opts.seed),
            strike_rng: roost_storage::SplitMix(opts.seed ^ 0x5354_5249_4b45),
            node_of: Vec::new(),
            answers: BTreeMap::new(),
            stream_pending: Vec::new(),
            stream_bodies: BTreeMap::new(),
            seen: Arc::default(),
            watching: Arc::new(AtomicBool::new(true)),
            failovers: Vec::new(),
            waits: Vec::new(),
            probe_counts: probe::Counts::default(),
            violations: Vec::new(),
            log: Vec::new(),
            per_round: opts.batches.div_ceil(opts.kills + 1),
            next: 0,
            streamed: 0,
            unavailable: 0,
        })
    }

    fn start_all(&mut self) -> anyhow::Result<()> {
        for n in 0..3 {
            self.nodes[n].spawn(&self.bin, None, None)?;
        }
        for n in 0..3 {
            self.nodes[n].ready()?;
        }
        self.leader(None, ELECTION_LIMIT)?;
        self.watch();
        Ok(())
    }

    /// A thread that reads every node's status every 50 ms until the drill ends: an epoch
    /// led by two nodes is a violation.
    fn watch(&self) {
        let sockets: Vec<PathBuf> = self
            .nodes
            .iter()
            .map(|n| n.data.join("roost.sock"))
            .collect();
        let (seen, on) = (self.seen.clone(), self.watching.clone());
        std::thread::spawn(move || {
            while on.load(Ordering::SeqCst) {
                for (i, s) in sockets.iter().enumerate() {
                    note_leader(&seen, NAMES[i], s);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }

    /// The node that leads (not `not`), once one says so, within `limit`.
    fn leader(&self, not: Option<usize>, limit: Duration) -> anyhow::Result<usize> {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            for (i, n) in self.nodes.iter().enumerate() {
                let leads = Some(i) != not
                    && n.child.is_some()
                    && n.status().is_some_and(|s| s["cluster"]["leading"] == true);
                if leads {
                    return Ok(i);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("no leader (other than {not:?}) within {limit:?}")
    }

    /// One round: half the files and the streams, a strike on the leader with the probe
    /// client started at it, the other half, the struck node back, the probe's end, every
    /// answer.
    fn round(&mut self, round: usize) -> anyhow::Result<()> {
        let kinds = if self.etcd.len() >= 3 { 4 } else { 3 };
        let strike = match self.strike_rng.below(kinds) {
            0 => Strike::Kill,
            1 => Strike::Pause,
            2 => Strike::Cut,
            _ => return self.etcd_round(round),
        };
        let from = self.b.sent.len();
        let l = self.leader(None, ELECTION_LIMIT)?;
        self.send_files(self.per_round / 2)?;
        self.stream_all();
        std::thread::sleep(Duration::from_millis(self.b.rng.below(300)));
        let t0 = Instant::now();
        self.strike(l, strike);
        let probe = self.start_probe(round, l, t0)?;
        let l2 = self.leader(Some(l), ELECTION_LIMIT)?;
        let took = t0.elapsed();
        self.failovers.push((strike, took));
        self.log.push(format!(
            "round {round}: {:?} {} (leader), {} leads after {} ms",
            strike,
            self.nodes[l].name,
            self.nodes[l2].name,
            took.as_millis()
        ));
        self.send_files(self.per_round - self.per_round / 2)?;
        self.recover(l, strike)?;
        probe.struck_node_back();
        self.stream_all();
        self.take_probe(round, (strike, Some(took)), probe.finish()?);
        self.wait_answers(from)
    }

    /// One round whose strike is a SIGKILL of etcd member `round % members` (with three or
    /// more): no node is struck, the probe streams to every node, and the member starts
    /// again two leases later (every renewal of the leader's lease in between goes to the
    /// others). A leader change is logged, not a violation: the strike is a fault.
    fn etcd_round(&mut self, round: usize) -> anyhow::Result<()> {
        let from = self.b.sent.len();
        let m = round % self.etcd.len();
        let l = self.leader(None, ELECTION_LIMIT)?;
        self.send_files(self.per_round / 2)?;
        self.stream_all();
        std::thread::sleep(Duration::from_millis(self.b.rng.below(300)));
        let t0 = Instant::now();
        self.etcd
            .member(m)
            .kill()
            .context("killing an etcd member")?;
        let probe = self.start_probe(round, usize::MAX, t0)?;
        self.send_files(self.per_round - self.per_round / 2)?;
        std::thread::sleep(Duration::from_millis(2 * self.lease_ms));
        self.etcd
            .member(m)
            .restart()
            .context("starting an etcd member again")?;
        probe.struck_node_back();
        self.stream_all();
        let now = self.leader(None, ELECTION_LIMIT)?;
        self.log.push(format!(
            "round {round}: Etcd member {m} killed, started again after {} ms; {} leads ({})",
            t0.elapsed().as_millis(),
            NAMES[now],
            if now == l {
                "no leader change"
            } else {
                "the leader changed"
            }
        ));
        self.take_probe(round, (Strike::Etcd, None), probe.finish()?);
        self.wait_answers(from)
    }

    /// One round of the rolling restart: half the files and the streams, a graceful stop of
    /// node `round % 3` (leader or not) with the probe started at its SIGTERM, the other
    /// half, the node started again, the probe's end, every answer, and the node back in
    /// the leader's in-sync set before the next stop.
    fn rolling_round(&mut self, round: usize) -> anyhow::Result<()> {
        let from = self.b.sent.len();
        let n = round % NAMES.len();
        let l = self.leader(None, ELECTION_LIMIT)?;
        self.send_files(self.per_round / 2)?;
        self.stream_all();
        std::thread::sleep(Duration::from_millis(self.b.rng.below(300)));
        let t0 = Instant::now();
        self.strike(n, Strike::Term);
        let probe = self.start_probe(round, n, t0)?;
        let new_leader = self.stopped(round, n, n == l, t0)?;
        self.send_files(self.per_round - self.per_round / 2)?;
        self.recover(n, Strike::Term)?;
        probe.struck_node_back();
        self.stream_all();
        self.take_probe(round, (Strike::Term, new_leader), probe.finish()?);
        self.wait_answers(from)?;
        self.wait_in_sync(round, n, t0)
    }

    /// One round of `--switchovers`: half the files and the streams, `roost cluster
    /// switchover` from the leader to the next node with the probe started at it, the other
    /// half, the probe's end, every answer, and every node back in the in-sync set.
    fn switchover_round(&mut self, round: usize) -> anyhow::Result<()> {
        let from = self.b.sent.len();
        let l = self.leader(None, ELECTION_LIMIT)?;
        let to = (l + 1) % NAMES.len();
        self.send_files(self.per_round / 2)?;
        self.stream_all();
        std::thread::sleep(Duration::from_millis(self.b.rng.below(300)));
        let t0 = Instant::now();
        let probe = self.start_probe(round, l, t0)?;
        let took = self.switch_over(round, l, to, t0)?;
        self.send_files(self.per_round - self.per_round / 2)?;
        probe.struck_node_back();
        self.stream_all();
        self.take_probe(round, (Strike::Switch, took), probe.finish()?);
        self.wait_answers(from)?;
        self.wait_in_sync(round, to, t0)
    }

    /// Runs `roost cluster switchover NAMES[to]` on `l`'s configuration: anything but exit 0
    /// with `to` leading is a violation. Returns the time to `to` leading.
    fn switch_over(
        &mut self,
        round: usize,
        l: usize,
        to: usize,
        t0: Instant,
    ) -> anyhow::Result<Option<Duration>> {
        let out = std::process::Command::new(&self.bin)
            .arg("--config")
            .arg(&self.nodes[l].config)
            .args(["cluster", "switchover", NAMES[to]])
            .output()
            .context("running roost cluster switchover")?;
        let text = String::from_utf8_lossy(&out.stdout)
            .trim()
            .replace('\n', "; ");
        let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        let now = self.leader(None, ELECTION_LIMIT)?;
        if !out.status.success() || now != to {
            self.violations.push(format!(
                "round {round}: switchover {} -> {}: {} ({text}{err}; {} leads)",
                NAMES[l], NAMES[to], out.status, NAMES[now]
            ));
            return Ok(None);
        }
        let took = t0.elapsed();
        self.failovers.push((Strike::Switch, took));
        self.log.push(format!(
            "round {round}: Switch {} -> {}: {text}",
            NAMES[l], NAMES[to]
        ));
        Ok(Some(took))
    }

    /// Waits for node `n`, sent SIGTERM at `t0`, to exit: anything but exit 0 within
    /// `TERM_LIMIT` is a violation (a node still running is killed). If it `led`, waits for
    /// another node to lead and returns that time (a failover of the report).
    fn stopped(
        &mut self,
        round: usize,
        n: usize,
        led: bool,
        t0: Instant,
    ) -> anyhow::Result<Option<Duration>> {
        let name = self.nodes[n].name;
        let log = self.nodes[n].log_path(self.nodes[n].starts.saturating_sub(1));
        let exit = self.nodes[n].wait_exit(TERM_LIMIT);
        let mut line = format!(
            "round {round}: Term {name} ({}), exited after {} ms",
            if led { "leader" } else { "standby" },
            t0.elapsed().as_millis()
        );
        let bad = match exit {
            Ok(Some(st)) if st.success() => None,
            Ok(Some(st)) => Some(format!("exited with {st}")),
            Ok(None) => Some(format!(
                "still ran {} s after SIGTERM",
                TERM_LIMIT.as_secs()
            )),
            Err(e) => Some(format!("{e:#}")),
        };
        if let Some(why) = bad {
            self.nodes[n].kill();
            line = format!("round {round}: Term {name}: {why}");
            self.violations.push(format!(
                "round {round}: graceful stop of {name}: {why} (log {})",
                log.display()
            ));
        }
        let took = match led {
            true => {
                let l2 = self.leader(Some(n), ELECTION_LIMIT)?;
                let took = t0.elapsed();
                self.failovers.push((Strike::Term, took));
                line += &format!(", {} leads after {} ms", NAMES[l2], took.as_millis());
                Some(took)
            }
            false => None,
        };
        self.log.push(line);
        Ok(took)
    }

    /// Waits (bounded) until the leader's in-sync set names every node again, as an upgrade
    /// waits before it stops the next node: only nodes in the set may campaign, so stopping
    /// the leader while the others are out of it would leave no node electable. Not in time
    /// is a violation.
    fn wait_in_sync(&mut self, round: usize, n: usize, t0: Instant) -> anyhow::Result<()> {
        let until = Instant::now() + ELECTION_LIMIT;
        while Instant::now() < until {
            let l = self.leader(None, ELECTION_LIMIT)?;
            let isr = self.nodes[l].status().map(|s| s["cluster"]["isr"].clone());
            if isr.is_some_and(|v| names_every_node(&v)) {
                self.log.push(format!(
                    "round {round}: {} in the in-sync set again {} ms after the strike",
                    NAMES[n],
                    t0.elapsed().as_millis()
                ));
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.violations.push(format!(
            "round {round}: {} not in the leader's in-sync set within {} s of its start",
            NAMES[n],
            ELECTION_LIMIT.as_secs()
        ));
        Ok(())
    }

    /// The quiet run (`--quiet-secs`): rounds of load without a fault until `secs` have
    /// passed, each waiting for every answer; then every acknowledged batch sent again, and
    /// the nodes' cluster counters read (they count since each process started: before the
    /// final stop ends them).
    fn quiet(&mut self, secs: Duration) -> anyhow::Result<()> {
        let t0 = Instant::now();
        let rounds_max = secs.as_millis() / QUIET_PAUSE.as_millis() + 1;
        let mut rounds = 0;
        while t0.elapsed() < secs && rounds < rounds_max {
            let from = self.b.sent.len();
            // Files while `--batches` allows; then fresh streamed batches in their place, so
            // the load lasts the whole run whatever `--batches` says.
            let files = self.send_files(QUIET_ROUND_BATCHES)?;
            let instead = (QUIET_ROUND_BATCHES - files).div_ceil(NAMES.len());
            self.stream_new(STREAMED + instead);
            self.wait_answers(from)?;
            rounds += 1;
            std::thread::sleep(QUIET_PAUSE.min(secs.saturating_sub(t0.elapsed())));
        }
        self.log.push(format!(
            "quiet: {rounds} rounds of load over {} ms, no strike",
            t0.elapsed().as_millis()
        ));
        self.retry_acknowledged()?;
        self.quiet_counters = Some(self.cluster_counters());
        Ok(())
    }

    /// Each node's `cluster.elections_won` and `cluster.fenced` (a few tries each).
    fn cluster_counters(&self) -> Vec<NodeCounters> {
        let read = |n: &Node| {
            let s = n.status()?;
            let c = &s["cluster"];
            Some((c["elections_won"].as_u64()?, c["fenced"].as_u64()?))
        };
        let mut out = Vec::new();
        for n in &self.nodes {
            let got = (0..5).find_map(|_| {
                read(n).or_else(|| {
                    std::thread::sleep(Duration::from_millis(100));
                    None
                })
            });
            out.push((n.name, got));
        }
        out
    }

    /// A quiet run's verdict, once the watcher has stopped: its line and its violations.
    fn judge_quiet(&mut self) {
        let Some(counters) = self.quiet_counters.take() else {
            return;
        };
        let epochs = self.seen.lock().map(|s| s.leaders.len()).unwrap_or(0);
        let (line, violations) = quiet_verdict(epochs, &counters);
        self.quiet_line = Some(line);
        self.violations.extend(violations);
    }

    /// Starts the probe client at the strike on `struck` (at `t0`), with batches of its own
    /// (a random source drawn from the drill's, so the same seed gives the same batches).
    fn start_probe(&mut self, round: usize, struck: usize, t0: Instant) -> anyhow::Result<Probe> {
        let to = (0..NAMES.len())
            .filter(|i| *i != struck)
            .map(|i| (NAMES[i], self.nodes[i].data.join("stream.sock")))
            .collect();
        let mut batches = Batches::new(self.opts.seed);
        batches.rng = roost_storage::SplitMix(self.b.rng.next_u64());
        Probe::start(probe::Plan {
            t0,
            round,
            to,
            batches,
            first_limit: ELECTION_LIMIT,
        })
    }

    /// Takes what the probe of `round`'s strike saw: its figures, its answered batches into
    /// the acknowledged set (checked at the end like every answer), the others into the
    /// streamed batches to send again until answered.
    fn take_probe(
        &mut self,
        round: usize,
        (strike, new_leader): (Strike, Option<Duration>),
        o: probe::Outcome,
    ) {
        self.log.push(o.describe(round));
        if o.first_commit.is_none() {
            self.violations.push(format!(
                "round {round}: {strike:?}: the probe client got no committed answer within {} s",
                ELECTION_LIMIT.as_secs()
            ));
        }
        self.waits.push(probe::Waited {
            kind: strike.kind(),
            new_leader,
            first_commit: o.first_commit.map(|(d, _)| d),
            longest_gap: o.longest_gap,
        });
        self.probe_counts.add(&o.counts);
        self.unavailable += o.counts.unavailable;
        for (key, body, r) in o.answered {
            self.stream_bodies.insert(key.clone(), body);
            self.answers.insert(format!("stream/{key}"), r);
        }
        for (key, body) in o.unanswered {
            self.stream_bodies.insert(key.clone(), body.clone());
            self.stream_pending.push((key, body));
        }
    }

    fn strike(&mut self, l: usize, s: Strike) {
        match s {
            // Run by `switchover_round`, which waits for the command.
            Strike::Switch => {}
            Strike::Kill => self.nodes[l].kill(),
            Strike::Term => self.nodes[l].signal(Signal::TERM),
            Strike::Pause => self.nodes[l].signal(Signal::STOP),
            Strike::Cut => {
                self.proxies[l].0.iter().for_each(Proxy::cut);
                self.proxies[l].1.cut();
            }
            // Run by `etcd_round`.
            Strike::Etcd => {}
        }
    }

    /// Brings the struck node back (once another leads, if it led).
    fn recover(&mut self, l: usize, s: Strike) -> anyhow::Result<()> {
        match s {
            Strike::Switch => {}
            Strike::Kill | Strike::Term => {
                self.nodes[l].spawn(&self.bin, None, None)?;
                self.nodes[l].ready()?;
            }
            Strike::Pause => {
                // Past its own lease for sure (it may still think it leads when it wakes).
                std::thread::sleep(Duration::from_millis(self.lease_ms / 2));
                self.nodes[l].signal(Signal::CONT);
            }
            Strike::Cut => {
                self.proxies[l].0.iter().for_each(Proxy::heal);
                self.proxies[l].1.heal();
            }
            Strike::Etcd => {}
        }
        Ok(())
    }

    /// `n` more batch files (fewer once `--batches` are sent), each into a node picked at
    /// random (a retry goes anywhere too); how many were sent.
    fn send_files(&mut self, n: usize) -> anyhow::Result<usize> {
        let quota = self.opts.batches.saturating_sub(self.next).min(n);
        for _ in 0..quota {
            let to = self.b.rng.below(3) as usize;
            self.b.send(&self.nodes[to].spool(), self.next)?;
            self.node_of.push(to);
            self.next += 1;
        }
        Ok(quota)
    }

    /// `STREAMED` new streamed batches to every node (`stream_new`).
    fn stream_all(&mut self) {
        self.stream_new(STREAMED);
    }

    /// `per_node` new streamed batches to every running node, and the ones still
    /// unanswered again; each answered one is acknowledged, an `unavailable` one kept for
    /// the next time.
    fn stream_new(&mut self, per_node: usize) {
        for (i, n) in NAMES.iter().enumerate() {
            for _ in 0..per_node {
                // A tag of its own for every streamed batch: a key sent again with other
                // content would be a conflict, not a retry.
                self.streamed += 1;
                if let Ok((key, body, _)) = self.b.fresh(&format!("s{}-{n}", self.streamed)) {
                    self.stream_bodies.insert(key.clone(), body.clone());
                    self.stream_pending.push((key, body));
                }
            }
            let batch = std::mem::take(&mut self.stream_pending);
            let sock = self.nodes[i].data.join("stream.sock");
            let left = match stream_to(&sock, &batch) {
                Ok(answers) => self.take_stream_answers(batch, answers),
                Err(_) => batch,
            };
            self.stream_pending = left;
        }
    }

    /// Keeps the answered streamed batches; returns the ones to send again.
    fn take_stream_answers(
        &mut self,
        sent: Vec<(String, Vec<u8>)>,
        answers: Vec<Value>,
    ) -> Vec<(String, Vec<u8>)> {
        let mut left = Vec::new();
        for (k, (key, body)) in sent.into_iter().enumerate() {
            let a = answers.get(k);
            match a.and_then(|v| serde_json::from_value::<BatchResult>(v.clone()).ok()) {
                Some(r) => {
                    self.answers.insert(format!("stream/{key}"), r);
                }
                None => {
                    self.unavailable += usize::from(a.is_some());
                    left.push((key, body));
                }
            }
        }
        left
    }

    /// Waits until every file from `from` on is answered where it was dropped, and every
    /// streamed batch is answered (sent again until it is).
    fn wait_answers(&mut self, from: usize) -> anyhow::Result<()> {
        let n = self.b.sent.len() - from;
        let until = Instant::now() + ANSWER_LIMIT + ANSWER_PER_FILE * n as u32;
        let mut pending: Vec<usize> = (from..self.b.sent.len()).collect();
        while !(pending.is_empty() && self.stream_pending.is_empty()) {
            if Instant::now() > until {
                let names: Vec<&str> = pending
                    .iter()
                    .map(|i| self.b.sent[*i].name.as_str())
                    .collect();
                let streamed: Vec<&String> = self.stream_pending.iter().map(|(k, _)| k).collect();
                let nodes: Vec<String> = self.nodes.iter_mut().map(|n| n.state()).collect();
                bail!(
                    "unanswered after the limit: files {names:?}, streamed {streamed:?}; nodes: {}",
                    nodes.join("; ")
                );
            }
            pending.retain(|i| !self.collect(*i));
            if !self.stream_pending.is_empty() {
                let i = self.b.rng.below(3) as usize;
                let batch = std::mem::take(&mut self.stream_pending);
                let sock = self.nodes[i].data.join("stream.sock");
                self.stream_pending = match stream_to(&sock, &batch) {
                    Ok(a) => self.take_stream_answers(batch, a),
                    Err(_) => batch,
                };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Reads file `i`'s result where it was dropped; true once answered.
    fn collect(&mut self, i: usize) -> bool {
        let (name, node) = (self.b.sent[i].name.clone(), self.node_of[i]);
        let Some(r) = self.nodes[node].result(&name) else {
            return false;
        };
        if let BatchResult::Committed { ops, .. } = &r {
            for o in ops.iter().filter(|o| o.op == "create") {
                if let Some(s) = super::setup::SHARDS.iter().find(|s| **s == o.shard) {
                    self.b.live.insert(o.id, s);
                }
            }
        }
        self.answers.insert(name, r);
        true
    }

    /// The rest of the batches without a strike, then every acknowledged batch sent again
    /// (files into a random node's spool): each must get its original answer.
    fn last_round(&mut self) -> anyhow::Result<()> {
        let from = self.b.sent.len();
        let rest = self.opts.batches.saturating_sub(self.next);
        self.send_files(rest)?;
        self.stream_all();
        self.wait_answers(from)?;
        self.retry_acknowledged()
    }

    fn retry_acknowledged(&mut self) -> anyhow::Result<()> {
        let mut retried: BTreeMap<String, Option<BatchResult>> = BTreeMap::new();
        let mut waiting = Vec::new();
        let files = self.file_bodies();
        for (k, name) in self.answers.keys().enumerate() {
            let Some(body) = self.body_of(&files, name) else {
                retried.insert(name.clone(), None);
                continue;
            };
            let to = k % 3;
            let file = format!("retry-{k:06}.json");
            crate::spool::deliver(&self.nodes[to].spool(), &file, body)?;
            waiting.push((name.clone(), to, file));
        }
        let until = Instant::now() + ANSWER_LIMIT + ANSWER_PER_FILE * waiting.len() as u32;
        while !waiting.is_empty() && Instant::now() < until {
            waiting.retain(|(name, to, file)| match self.nodes[*to].result(file) {
                Some(r) => {
                    retried.insert(name.clone(), Some(r));
                    false
                }
                None => true,
            });
            std::thread::sleep(Duration::from_millis(50));
        }
        for (name, _, _) in waiting {
            retried.insert(name, None);
        }
        let lost = verdict::lost_acknowledged(&self.answers, &retried);
        self.log.push(format!(
            "retried {} acknowledged batches; lost: {}",
            retried.len(),
            lost.len()
        ));
        self.violations.extend(lost);
        Ok(())
    }

    /// The content sent under answer `name` (a file's, from `files`, or a streamed batch's).
    fn body_of<'b>(&'b self, files: &HashMap<&str, &'b [u8]>, name: &str) -> Option<&'b [u8]> {
        match name.strip_prefix("stream/") {
            Some(key) => self.stream_bodies.get(key).map(Vec::as_slice),
            None => files.get(name).copied(),
        }
    }

    /// Every file sent, by name, to its content (a retry's is its original's): one index,
    /// as a search per answer would be quadratic in a long quiet run's tens of thousands.
    fn file_bodies(&self) -> HashMap<&str, &[u8]> {
        let by_key: HashMap<&str, &[u8]> = self
            .b
            .bodies
            .iter()
            .map(|(k, b)| (k.as_str(), b.as_slice()))
            .collect();
        let body = |s: &'_ super::batches::Sent| by_key.get(s.key.as_str()).copied();
        self.b
            .sent
            .iter()
            .filter_map(|s| Some((s.name.as_str(), body(s)?)))
            .collect()
    }

    /// Stops every node gracefully and checks their files.
    fn finish(&mut self) -> anyhow::Result<()> {
        self.settle();
        self.watching.store(false, Ordering::SeqCst);
        let l = self.leader(None, ELECTION_LIMIT).ok();
        let order: Vec<usize> = (0..3).filter(|i| Some(*i) != l).chain(l).collect();
        for n in order {
            if let Err(e) = self.nodes[n].stop() {
                self.violations.push(format!("graceful stop: {e:#}"));
                self.nodes[n].kill();
            }
        }
        self.compare_logs()?;
        let records: Vec<verdict::Records> = self
            .nodes
            .iter()
            .map(Node::records)
            .collect::<anyhow::Result<_>>()?;
        let live = verdict::live_creates(&self.answers);
        for (i, r) in records.iter().enumerate() {
            let name = self.nodes[i].name;
            self.violations
                .extend(verdict::missing_creates(name, &live, r));
            self.violations.extend(verdict::doubled_creates(name, r));
            let diff = verdict::shard_divergences(&records[0], r, 5);
            self.violations
                .extend(diff.into_iter().map(|d| format!("shards a/{name}: {d}")));
            let v = crate::ops::verify::verify(RealStorage::shared(), &self.nodes[i].data);
            self.violations
                .extend(v.violations.iter().map(|v| format!("verify {name}: {v}")));
        }
        let seen = self
            .seen
            .lock()
            .map(|s| s.two_in_one_epoch.clone())
            .unwrap_or_default();
        self.violations.extend(seen);
        self.violations
            .extend(verdict::unexpected_answers(&self.b.sent, &self.answers));
        Ok(())
    }

    /// Waits (bounded) until the leader is quiet and every node holds its whole log.
    fn settle(&mut self) {
        let until = Instant::now() + ANSWER_LIMIT;
        while Instant::now() < until {
            let Ok(l) = self.leader(None, Duration::from_secs(5)) else {
                continue;
            };
            let (a, b) = (self.nodes[l].quiet_end(), self.nodes[l].quiet_end());
            let end = a.filter(|_| a == b);
            let all = end.is_some_and(|e| {
                self.nodes
                    .iter()
                    .all(|n| n.last_lsn().is_some_and(|x| x >= e))
            });
            if all {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.log
            .push("the nodes did not settle before the stop".into());
    }

    /// Every pair of WALs agrees at every lsn both hold, and all end at the same lsn.
    fn compare_logs(&mut self) -> anyhow::Result<()> {
        let wals: Vec<BTreeMap<u64, Value>> = self
            .nodes
            .iter()
            .map(|n| n.wal(&self.bin))
            .collect::<anyhow::Result<_>>()?;
        let ends: Vec<Option<u64>> = wals.iter().map(|w| w.keys().next_back().copied()).collect();
        if ends.windows(2).any(|w| w[0] != w[1]) {
            self.violations
                .push(format!("stopped, the logs end at different lsns: {ends:?}"));
        }
        for j in 1..3 {
            let (common, diff) = verdict::wal_divergences(&wals[0], &wals[j]);
            self.log.push(format!(
                "wal a/{}: {common} lsns in common, {} differ",
                NAMES[j],
                diff.len()
            ));
            self.violations
                .extend(diff.into_iter().map(|d| format!("wal a/{}: {d}", NAMES[j])));
        }
        Ok(())
    }

    fn report(&self) {
        let mut text = format!(
            "roost drill --cluster: seed {}, lease_ms {}, etcd members {}, delay {} ms each way, {} files and {} streamed batches, {} failovers\n",
            self.opts.seed,
            self.lease_ms,
            self.etcd.len(),
            self.delay_ms,
            self.b.sent.len(),
            self.stream_bodies.len(),
            self.failovers.len()
        );
        for l in &self.log {
            text += &format!("  {l}\n");
        }
        let mut ms: Vec<u128> = self.failovers.iter().map(|(_, d)| d.as_millis()).collect();
        ms.sort_unstable();
        let q = |p: f64| {
            ms.get(((ms.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0)
        };
        text += &format!(
            "  time to a new leader (ms): p50 {} p99 {} max {} (lease {} ms)\n",
            q(0.5),
            q(0.99),
            ms.last().copied().unwrap_or(0),
            self.lease_ms
        );
        text += &probe::summary(&self.waits, &Strike::KINDS, &self.probe_counts);
        match self.mode {
            ClusterMode::Rolling => {
                text +=
                    &probe::rolling_line(&self.waits, Strike::Term.kind(), "the rolling restart")
            }
            ClusterMode::Switchovers => {
                text += &probe::rolling_line(&self.waits, Strike::Switch.kind(), "the switchovers")
            }
            _ => {}
        }
        if let Some(l) = &self.quiet_line {
            text += l;
        }
        let epochs = self.seen.lock().map(|s| s.leaders.len()).unwrap_or(0);
        text += &format!(
            "  acknowledged: {} ({} stream answers unavailable, sent again); epochs seen led: {epochs}\n",
            self.answers.len(),
            self.unavailable
        );
        match self.violations.len() {
            0 => text += "  violations: none\n",
            n => {
                text += &format!("  violations: {n}\n");
                for v in self.violations.iter().take(50) {
                    text += &format!("    {v}\n");
                }
            }
        }
        let _ = std::io::stdout().write_all(text.as_bytes());
    }
}

/// Records the epoch `socket`'s node says it leads; two names for one epoch is a violation.
fn note_leader(seen: &Mutex<Seen>, name: &str, socket: &std::path::Path) {
    let Ok(text) = crate::control::socket::request(socket, "status") else {
        return;
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return;
    };
    let c = &v["cluster"];
    let (Some(epoch), true) = (c["epoch"].as_u64(), c["leading"] == true) else {
        return;
    };
    if let Ok(mut s) = seen.lock() {
        s.saw(epoch, name);
    }
}

impl Seen {
    /// `name` said it leads `epoch`.
    fn saw(&mut self, epoch: u64, name: &str) {
        match self.leaders.get(&epoch) {
            Some(other) if other != name => {
                let msg = format!("epoch {epoch} led by {other} and by {name}");
                self.two_in_one_epoch.push(msg);
            }
            Some(_) => {}
            None => {
                self.leaders.insert(epoch, name.to_owned());
            }
        }
    }
}

/// Whether `isr` (a status's `cluster.isr`) names every node.
fn names_every_node(isr: &Value) -> bool {
    isr.as_array()
        .is_some_and(|m| NAMES.iter().all(|n| m.iter().any(|v| v == n)))
}

/// A quiet run's verdict from the epochs the watcher saw led and each node's
/// (`elections_won`, `fenced`) at the end: its report line, `leader changes without a
/// fault: K` with K the epochs led beyond the first, and its violations. Any change is one;
/// so are counters that say the watcher missed one (more than one election won over the
/// nodes, or a fence: each node runs one process the whole run), and a node that did not
/// tell them.
fn quiet_verdict(epochs: usize, counters: &[NodeCounters]) -> (String, Vec<String>) {
    let k = epochs.saturating_sub(1);
    let won: u64 = counters.iter().filter_map(|(_, c)| c.map(|c| c.0)).sum();
    let fenced: u64 = counters.iter().filter_map(|(_, c)| c.map(|c| c.1)).sum();
    let silent: Vec<&str> = counters
        .iter()
        .filter(|(_, c)| c.is_none())
        .map(|(n, _)| *n)
        .collect();
    let mut line = format!(
        "  leader changes without a fault: {k} (epochs seen led: {epochs}; over the nodes: {won} elections won, {fenced} fenced"
    );
    if !silent.is_empty() {
        line += &format!("; no status from {}", silent.join(", "));
    }
    line += ")\n";
    let mut violations = Vec::new();
    if k > 0 {
        violations.push(format!(
            "leader changed without a fault: {k} times ({epochs} epochs led)"
        ));
    }
    if won > 1 || fenced > 0 {
        violations.push(format!(
            "leader changed without a fault: {won} elections won and {fenced} fences over the nodes"
        ));
    }
    violations.extend(
        silent
            .iter()
            .map(|n| format!("{n}: no status at the end of the quiet run")),
    );
    (line, violations)
}

/// Sends `batches` on one stream connection and reads one answer line each (bounded).
fn stream_to(sock: &std::path::Path, batches: &[(String, Vec<u8>)]) -> anyhow::Result<Vec<Value>> {
    let mut s = std::os::unix::net::UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    for (_, body) in batches {
        s.write_all(body)?;
        s.write_all(b"\n")?;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let mut out = Vec::new();
    for line in BufReader::new(s).lines().take(batches.len()) {
        out.push(serde_json::from_str(&line?)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{names_every_node, quiet_verdict, Seen};

    /// Goal: a quiet run with one epoch and one election is clean, and each sign of a
    /// leader change (a second epoch seen, a second election or a fence the watcher missed,
    /// a node that does not tell) is a violation the exit code carries.
    #[test]
    fn a_leader_change_without_a_fault_is_a_violation() {
        let clean = [
            ("a", Some((1, 0))),
            ("b", Some((0, 0))),
            ("c", Some((0, 0))),
        ];
        let (line, v) = quiet_verdict(1, &clean);
        assert_eq!(
            line,
            "  leader changes without a fault: 0 (epochs seen led: 1; over the nodes: 1 elections won, 0 fenced)\n"
        );
        assert!(v.is_empty(), "{v:?}");
        let (line, v) = quiet_verdict(3, &clean);
        assert!(
            line.starts_with("  leader changes without a fault: 2 ("),
            "{line}"
        );
        assert_eq!(
            v,
            ["leader changed without a fault: 2 times (3 epochs led)"]
        );
        let missed = [("a", Some((1, 1))), ("b", Some((1, 0))), ("c", None)];
        let (line, v) = quiet_verdict(1, &missed);
        assert!(line.contains("0 (epochs seen led: 1; over the nodes: 2 elections won, 1 fenced; no status from c)"), "{line}");
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[1].starts_with("c: no status"), "{v:?}");
    }

    #[test]
    fn the_in_sync_set_names_every_node_or_not() {
        assert!(names_every_node(&serde_json::json!(["c", "a", "b"])));
        assert!(!names_every_node(&serde_json::json!(["a", "b"])));
        assert!(!names_every_node(&serde_json::Value::Null));
    }

    #[test]
    fn two_nodes_leading_one_epoch_is_a_violation() {
        let mut s = Seen::default();
        s.saw(3, "a");
        s.saw(3, "a");
        s.saw(4, "b");
        assert!(s.two_in_one_epoch.is_empty());
        s.saw(4, "c");
        assert_eq!(
            s.two_in_one_epoch,
            vec!["epoch 4 led by b and by c".to_string()]
        );
    }
}

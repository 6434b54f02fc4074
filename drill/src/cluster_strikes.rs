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
//! are forwarded again by the node itself; a stream's `unavailable` is sent again) and until
//! the leader's in-sync set names every node again, so that each strike is a single fault: a
//! leader struck while both others are out of the set leaves no node electable until it is
//! back (clean election, docs/cluster.md), which a drill that waits for another leader
//! before it restores the struck one would see as no leader at all.
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
//! `verify` holds on every node. The verdicts are `verdict.rs`'s. The other modes' rounds are
//! in `cluster_modes.rs`, the end of a run in `cluster_final.rs`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost_etcd::testing::EtcdCluster;
use rustix::process::Signal;
use serde_json::Value;

use super::batches::Batches;
use super::node::Node;
use super::probe::{self, Probe};
use super::proxy::Proxy;
use super::setup::DrillOptions;
use crate::batch::BatchResult;

pub(super) const NAMES: [&str; 3] = ["a", "b", "c"];
/// How long the files of a round may take to be answered, plus this per file.
pub(super) const ANSWER_LIMIT: Duration = Duration::from_secs(60);
pub(super) const ANSWER_PER_FILE: Duration = Duration::from_millis(50);
/// The longest a new leader may take before the drill gives up on the round.
pub(super) const ELECTION_LIMIT: Duration = Duration::from_secs(60);
/// Streamed batches per node per round.
pub(super) const STREAMED: usize = 3;
/// A rolling restart's stop: the node must exit 0 within this long of its SIGTERM.
pub(super) const TERM_LIMIT: Duration = Duration::from_secs(10);
/// A quiet round's batches (files while `--batches` allows, then streamed in their place),
/// and the pause between rounds, which also bounds their count.
pub(super) const QUIET_ROUND_BATCHES: usize = 30;
pub(super) const QUIET_PAUSE: Duration = Duration::from_millis(100);

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
pub(super) enum Strike {
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
    pub(super) const KINDS: [&'static str; 6] = ["Kill", "Pause", "Cut", "Term", "Switch", "Etcd"];

    pub(super) fn kind(self) -> &'static str {
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
pub(super) type NodeCounters = (&'static str, Option<(u64, u64)>);

/// What the status watcher saw: each epoch's leader, and the violations.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) leaders: BTreeMap<u64, String>,
    pub(super) two_in_one_epoch: Vec<String>,
}

pub(super) struct Cluster<'a> {
    pub(super) opts: &'a DrillOptions,
    pub(super) lease_ms: u64,
    pub(super) delay_ms: u64,
    pub(super) mode: ClusterMode,
    /// A quiet run's end: each node's `cluster.elections_won` and `cluster.fenced` from
    /// status (`None`: it did not answer), read before the final stop.
    pub(super) quiet_counters: Option<Vec<NodeCounters>>,
    /// A quiet run's report line (`quiet_verdict`), once judged.
    pub(super) quiet_line: Option<String>,
    pub(super) bin: PathBuf,
    pub(super) etcd: EtcdCluster,
    pub(super) nodes: Vec<Node>,
    /// Per node: its proxies to the etcd members, and the proxy in front of its replication
    /// port.
    pub(super) proxies: Vec<(Vec<Proxy>, Proxy)>,
    pub(super) b: Batches,
    /// The strikes' kinds, from a generator of their own: the batches' generator is also
    /// drawn from as often as timing makes files and streams be sent again, so the same
    /// seed gives the same schedule only from this one.
    pub(super) strike_rng: roost_storage::SplitMix,
    /// Where each sent file (by index in `b.sent`) was delivered.
    pub(super) node_of: Vec<usize>,
    /// Every answer a client got, by file name (or `stream/KEY`): the acknowledged batches.
    pub(super) answers: BTreeMap<String, BatchResult>,
    /// Streamed batches (key, body) not answered yet.
    pub(super) stream_pending: Vec<(String, Vec<u8>)>,
    pub(super) stream_bodies: BTreeMap<String, Vec<u8>>,
    pub(super) seen: Arc<Mutex<Seen>>,
    pub(super) watching: Arc<AtomicBool>,
    pub(super) failovers: Vec<(Strike, Duration)>,
    /// Per strike, what the probe client waited (`probe.rs`).
    pub(super) waits: Vec<probe::Waited>,
    /// The probes' tries over all strikes.
    pub(super) probe_counts: probe::Counts,
    pub(super) violations: Vec<String>,
    pub(super) log: Vec<String>,
    pub(super) per_round: usize,
    pub(super) next: usize,
    /// Streamed batches made so far (each one's key is unique).
    pub(super) streamed: usize,
    pub(super) unavailable: usize,
}

impl<'a> Cluster<'a> {
    pub(super) fn new(opts: &'a DrillOptions, run: &ClusterRun) -> anyhow::Result<Cluster<'a>> {
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

    pub(super) fn start_all(&mut self) -> anyhow::Result<()> {
        for n in 0..3 {
            self.nodes[n].spawn(&self.bin, None, None)?;
        }
        for n in 0..3 {
            self.nodes[n].ready()?;
        }
        let t0 = Instant::now();
        self.leader(None, ELECTION_LIMIT)?;
        self.watch();
        self.wait_in_sync_at_start(t0)
    }

    /// A thread that reads every node's status every 50 ms until the drill ends: an epoch
    /// led by two nodes is a violation.
    pub(super) fn watch(&self) {
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
    pub(super) fn leader(&self, not: Option<usize>, limit: Duration) -> anyhow::Result<usize> {
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
    pub(super) fn round(&mut self, round: usize) -> anyhow::Result<()> {
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
        self.wait_answers(from)?;
        // Each strike is one fault: the next strikes only a cluster whose every node may
        // take over again (a leader struck while the others are out of the in-sync set
        // leaves no node electable until it returns, by design: docs/cluster.md).
        self.wait_in_sync(round, l, t0)
    }

    /// One round whose strike is a SIGKILL of etcd member `round % members` (with three or
    /// more): no node is struck, the probe streams to every node, and the member starts
    /// again two leases later (every renewal of the leader's lease in between goes to the
    /// others). A leader change is logged, not a violation: the strike is a fault.
    pub(super) fn etcd_round(&mut self, round: usize) -> anyhow::Result<()> {
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

    /// Starts the probe client at the strike on `struck` (at `t0`), with batches of its own
    /// (a random source drawn from the drill's, so the same seed gives the same batches).
    pub(super) fn start_probe(
        &mut self,
        round: usize,
        struck: usize,
        t0: Instant,
    ) -> anyhow::Result<Probe> {
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
    pub(super) fn take_probe(
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

    pub(super) fn strike(&mut self, l: usize, s: Strike) {
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
    pub(super) fn recover(&mut self, l: usize, s: Strike) -> anyhow::Result<()> {
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
    pub(super) fn send_files(&mut self, n: usize) -> anyhow::Result<usize> {
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
    pub(super) fn stream_all(&mut self) {
        self.stream_new(STREAMED);
    }

    /// `per_node` new streamed batches to every running node, and the ones still
    /// unanswered again; each answered one is acknowledged, an `unavailable` one kept for
    /// the next time.
    pub(super) fn stream_new(&mut self, per_node: usize) {
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
    pub(super) fn take_stream_answers(
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
    pub(super) fn wait_answers(&mut self, from: usize) -> anyhow::Result<()> {
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
    pub(super) fn collect(&mut self, i: usize) -> bool {
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
}

/// Records the epoch `socket`'s node says it leads; two names for one epoch is a violation.
pub(super) fn note_leader(seen: &Mutex<Seen>, name: &str, socket: &std::path::Path) {
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
    pub(super) fn saw(&mut self, epoch: u64, name: &str) {
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
pub(super) fn names_every_node(isr: &Value) -> bool {
    isr.as_array()
        .is_some_and(|m| NAMES.iter().all(|n| m.iter().any(|v| v == n)))
}

/// A quiet run's verdict from the epochs the watcher saw led and each node's
/// (`elections_won`, `fenced`) at the end: its report line, `leader changes without a
/// fault: K` with K the epochs led beyond the first, and its violations. Any change is one;
/// so are counters that say the watcher missed one (more than one election won over the
/// nodes, or a fence: each node runs one process the whole run), and a node that did not
/// tell them.
pub(super) fn quiet_verdict(epochs: usize, counters: &[NodeCounters]) -> (String, Vec<String>) {
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
pub(super) fn stream_to(
    sock: &std::path::Path,
    batches: &[(String, Vec<u8>)],
) -> anyhow::Result<Vec<Value>> {
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
    pub(super) fn a_leader_change_without_a_fault_is_a_violation() {
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
    pub(super) fn the_in_sync_set_names_every_node_or_not() {
        assert!(names_every_node(&serde_json::json!(["c", "a", "b"])));
        assert!(!names_every_node(&serde_json::json!(["a", "b"])));
        assert!(!names_every_node(&serde_json::Value::Null));
    }

    #[test]
    pub(super) fn two_nodes_leading_one_epoch_is_a_violation() {
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

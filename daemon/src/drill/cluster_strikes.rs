//! `roost drill --cluster`: the cluster's failover drill (issue 27, docs/cluster.md). etcd and
//! three nodes (`<root>/a`, `b`, `c`) on loopback, mutual TLS, `ack = "standby"`; every
//! node reaches etcd through a proxy of its own, and the others reach its replication port
//! through another (`proxy.rs`). Each round sends batch files into all three spools and
//! batches into all three stream sockets, and at a random moment strikes the leader in turn:
//! SIGKILL (restarted once another leads), SIGSTOP past its lease (SIGCONT once another
//! leads), or a cut of both its proxies (healed once another leads). It measures the time
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
//! At the end every node stops gracefully and the drill checks: every acknowledged batch,
//! sent again, gets its original answer; every committed create is in every node's shards,
//! none twice; the WALs agree at every lsn and end at the same one; the shards are equal;
//! `verify` holds on every node. The verdicts are `verdict.rs`'s.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost_etcd::testing::EtcdServer;
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

/// Runs the cluster drill in `opts.data_dir` with `lease_ms`; prints the summary; returns
/// the number of violations.
pub fn run_cluster(opts: &DrillOptions, lease_ms: u64) -> anyhow::Result<usize> {
    std::fs::create_dir_all(&opts.data_dir)?;
    let mut d = Cluster::new(opts, lease_ms)?;
    d.start_all()?;
    for round in 0..opts.kills {
        d.round(round)?;
    }
    d.last_round()?;
    d.finish()?;
    d.report();
    Ok(d.violations.len())
}

/// How a round strikes the leader.
#[derive(Clone, Copy, Debug)]
enum Strike {
    Kill,
    Pause,
    Cut,
}

impl Strike {
    const KINDS: [&'static str; 3] = ["Kill", "Pause", "Cut"];

    fn kind(self) -> &'static str {
        match self {
            Strike::Kill => Strike::KINDS[0],
            Strike::Pause => Strike::KINDS[1],
            Strike::Cut => Strike::KINDS[2],
        }
    }
}

/// What the status watcher saw: each epoch's leader, and the violations.
#[derive(Default)]
struct Seen {
    leaders: BTreeMap<u64, String>,
    two_in_one_epoch: Vec<String>,
}

struct Cluster<'a> {
    opts: &'a DrillOptions,
    lease_ms: u64,
    bin: PathBuf,
    _etcd: EtcdServer,
    nodes: Vec<Node>,
    /// Per node: its proxy to etcd, and the proxy in front of its replication port.
    proxies: Vec<(Proxy, Proxy)>,
    b: Batches,
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
    fn new(opts: &'a DrillOptions, lease_ms: u64) -> anyhow::Result<Cluster<'a>> {
        let root = &opts.data_dir;
        let etcd = EtcdServer::start(&root.join("etcd")).context("starting etcd")?;
        let mut nodes = Vec::new();
        let mut proxies = Vec::new();
        for name in NAMES {
            let n = Node::member(root, name, &NAMES)?;
            let to_etcd = Proxy::start(etcd.client_url().trim_start_matches("http://").into())?;
            let to_node = Proxy::start(n.addr())?;
            n.append_config(&format!(
                "\n[cluster]\netcd = [\"http://{}\"]\nadvertise = \"{}\"\nlease_ms = {lease_ms}\n",
                to_etcd.addr(),
                to_node.addr()
            ))?;
            nodes.push(n);
            proxies.push((to_etcd, to_node));
        }
        Ok(Cluster {
            opts,
            lease_ms,
            bin: std::env::current_exe().context("locating the roost binary")?,
            _etcd: etcd,
            nodes,
            proxies,
            b: Batches::new(opts.seed),
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
        let from = self.b.sent.len();
        let strike = match self.b.rng.below(3) {
            0 => Strike::Kill,
            1 => Strike::Pause,
            _ => Strike::Cut,
        };
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
        self.take_probe(round, (strike, took), probe.finish()?);
        self.wait_answers(from)
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
        (strike, new_leader): (Strike, Duration),
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
            Strike::Kill => self.nodes[l].kill(),
            Strike::Pause => self.nodes[l].signal(Signal::STOP),
            Strike::Cut => {
                self.proxies[l].0.cut();
                self.proxies[l].1.cut();
            }
        }
    }

    /// Brings the struck node back, once another leads.
    fn recover(&mut self, l: usize, s: Strike) -> anyhow::Result<()> {
        match s {
            Strike::Kill => {
                self.nodes[l].spawn(&self.bin, None, None)?;
                self.nodes[l].ready()?;
            }
            Strike::Pause => {
                // Past its own lease for sure (it may still think it leads when it wakes).
                std::thread::sleep(Duration::from_millis(self.lease_ms / 2));
                self.nodes[l].signal(Signal::CONT);
            }
            Strike::Cut => {
                self.proxies[l].0.heal();
                self.proxies[l].1.heal();
            }
        }
        Ok(())
    }

    /// `n` more batch files, each into a node picked at random (a retry goes anywhere too).
    fn send_files(&mut self, n: usize) -> anyhow::Result<()> {
        let quota = self.opts.batches.saturating_sub(self.next).min(n);
        for _ in 0..quota {
            let to = self.b.rng.below(3) as usize;
            self.b.send(&self.nodes[to].spool(), self.next)?;
            self.node_of.push(to);
            self.next += 1;
        }
        Ok(())
    }

    /// New streamed batches to every running node, and the ones still unanswered again;
    /// each answered one is acknowledged, an `unavailable` one kept for the next time.
    fn stream_all(&mut self) {
        for (i, n) in NAMES.iter().enumerate() {
            for _ in 0..STREAMED {
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
        for (k, name) in self.answers.keys().enumerate() {
            let Some(body) = self.body_of(name) else {
                retried.insert(name.clone(), None);
                continue;
            };
            let to = k % 3;
            let file = format!("retry-{k:06}.json");
            crate::spool::deliver(&self.nodes[to].spool(), &file, &body)?;
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

    /// The content sent under answer `name` (a file's or a streamed batch's).
    fn body_of(&self, name: &str) -> Option<Vec<u8>> {
        if let Some(key) = name.strip_prefix("stream/") {
            return self.stream_bodies.get(key).cloned();
        }
        let sent = self.b.sent.iter().find(|s| s.name == name)?;
        self.b.body_of(&sent.key).map(<[u8]>::to_vec)
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
            "roost drill --cluster: seed {}, lease_ms {}, {} files and {} streamed batches, {} failovers\n",
            self.opts.seed,
            self.lease_ms,
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
    use super::Seen;

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

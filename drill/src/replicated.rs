//! `roost drill --replicated`: the failover drill for long runs (issue 15). Two nodes on
//! loopback, `<root>/a` and `<root>/b`, under `ack = "standby"`. Each round streams the drill's
//! batches into the primary's spool, kills the primary with SIGKILL (even rounds at a random
//! moment; odd rounds at a named crash point, `ROOST_CRASH_AT`, after a graceful restart that
//! arms it), reads the results it published (acknowledged), promotes the standby, sends the
//! files left unanswered to the new primary (a client resending), restarts the old primary as
//! the new one's standby, and checks: every acknowledged batch's retry (same key, same content)
//! gets its original answer from the new primary; once the standby caught up, both nodes'
//! shards scan identically and hold every committed create. Roles swap every round. After the
//! last round (no kill), both nodes stop gracefully; their WAL records must be equal at every
//! lsn both hold and `verify` must hold on both. The verdicts are in `verdict`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use roost_storage::RealStorage;

use super::batches::Batches;
use super::node::Node;
use super::setup::{pick_crash, DrillOptions, SHARDS};
use super::verdict;
use crate::batch::BatchResult;
use crate::pipeline::crash::CrashTarget;

/// How long the files a round waits for may take to be answered, plus this per file.
const ANSWER_LIMIT: Duration = Duration::from_secs(60);
const ANSWER_PER_FILE: Duration = Duration::from_millis(50);
/// How long a standby may take to catch up, and two nodes' shards to scan the same.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(60);
/// How long a crash round waits for its crash point before SIGKILL.
const CRASH_WAIT: Duration = Duration::from_secs(10);

/// Runs the replicated drill in `opts.data_dir`; prints the summary; returns the number of
/// violations.
pub fn run_replicated(opts: &DrillOptions) -> anyhow::Result<usize> {
    std::fs::create_dir_all(&opts.data_dir)?;
    let mut d = Replicated::new(opts)?;
    d.start_pair()?;
    let rounds = opts.kills + 1;
    for round in 0..rounds {
        if round + 1 == rounds {
            d.last_round(round)?;
        } else {
            d.failover_round(round)?;
        }
    }
    d.finish()?;
    d.report(rounds);
    Ok(d.violations.len())
}

/// The counts the summary prints.
#[derive(Default)]
struct Counts {
    /// Answers read from a primary right after it was killed.
    at_kill: usize,
    /// Files sent again to the new primary because the killed one had not answered them.
    resent: usize,
    /// Retries of acknowledged batches sent to a new primary.
    retried: usize,
    lost: usize,
    divergences: usize,
    /// Lsns both nodes' WALs held at the end.
    common_lsns: usize,
    cut: u64,
}

struct Replicated<'a> {
    opts: &'a DrillOptions,
    bin: PathBuf,
    nodes: [Node; 2],
    primary: usize,
    b: Batches,
    /// Where each sent file (by index in `b.sent`) was last delivered.
    node_of: Vec<usize>,
    /// Every answer a client got, by file name: the acknowledged batches.
    answers: BTreeMap<String, BatchResult>,
    counts: Counts,
    violations: Vec<String>,
    log: Vec<String>,
    recoveries: Vec<Duration>,
    next_batch: usize,
    per_round: usize,
}

impl<'a> Replicated<'a> {
    fn new(opts: &'a DrillOptions) -> anyhow::Result<Replicated<'a>> {
        let root = &opts.data_dir;
        Ok(Replicated {
            opts,
            bin: std::env::current_exe().context("locating the roost binary")?,
            nodes: [Node::new(root, "a")?, Node::new(root, "b")?],
            primary: 0,
            b: Batches::new(opts.seed),
            node_of: Vec::new(),
            answers: BTreeMap::new(),
            counts: Counts::default(),
            violations: Vec::new(),
            log: Vec::new(),
            recoveries: Vec::new(),
            next_batch: 0,
            per_round: opts.batches.div_ceil(opts.kills + 1),
        })
    }

    /// `a` as the primary, `b` as its standby.
    fn start_pair(&mut self) -> anyhow::Result<()> {
        self.start(0, None, None)?;
        let addr = self.nodes[0].addr();
        self.start(1, Some(&addr), None)
    }

    /// Starts node `n` and waits for it to serve.
    fn start(
        &mut self,
        n: usize,
        follow: Option<&str>,
        crash: Option<CrashTarget>,
    ) -> anyhow::Result<()> {
        self.nodes[n].spawn(&self.bin, follow, crash)?;
        let d = self.nodes[n].ready()?;
        self.recoveries.push(d);
        Ok(())
    }

    /// One failover: stream, kill the primary, read what it acknowledged, promote the
    /// standby, resend what was not answered, restart the old primary as a standby, check.
    fn failover_round(&mut self, round: usize) -> anyhow::Result<()> {
        let (p, s) = (self.primary, 1 - self.primary);
        let crash = match round % 2 {
            1 => self.arm_crash(round)?,
            _ => None,
        };
        let from = self.b.sent.len();
        let how = self.stream(crash)?;
        self.nodes[p].kill();
        let at_kill = self.collect(p, from);
        let epoch = self.nodes[s].promote()?;
        self.log.push(format!(
            "round {round}: {} primary, {how}; {at_kill} answers read; {} promoted (epoch {epoch})",
            self.nodes[p].name, self.nodes[s].name
        ));
        let pending = self.take_back(p, s, from)?;
        let addr = self.nodes[s].addr();
        self.start(p, Some(&addr), None)?;
        self.primary = s;
        self.check(round, &pending)
    }

    /// The last round: stream without a kill, wait for every answer, check.
    fn last_round(&mut self, round: usize) -> anyhow::Result<()> {
        let from = self.b.sent.len();
        let quota = self.opts.batches.saturating_sub(self.next_batch);
        for _ in 0..quota {
            self.send_next(self.primary)?;
        }
        self.log.push(format!(
            "round {round}: {} primary, no kill",
            self.nodes[self.primary].name
        ));
        let pending: Vec<usize> = (from..self.b.sent.len()).collect();
        self.check(round, &pending)
    }

    /// An odd round dies at a named crash point: the primary stops gracefully and restarts
    /// (still the primary, a new epoch) with `ROOST_CRASH_AT` set. `None` if the point fired
    /// while it started (the round then kills a clean daemon at a random moment).
    fn arm_crash(&mut self, round: usize) -> anyhow::Result<Option<CrashTarget>> {
        let p = self.primary;
        let t = pick_crash(&mut self.b.rng);
        self.nodes[p].stop()?;
        self.nodes[p].spawn(&self.bin, None, Some(t))?;
        match self.nodes[p].ready() {
            Ok(d) => {
                self.recoveries.push(d);
                self.wait_standby_epoch(round)?;
                Ok(Some(t))
            }
            Err(_) if self.nodes[p].died() => {
                self.log.push(format!(
                    "round {round}: died at crash point {t} while restarting as the primary"
                ));
                self.nodes[p].kill();
                self.start(p, None, None)?;
                self.wait_standby_epoch(round)?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Waits (bounded) until the standby follows the restarted primary in its epoch (a
    /// restarted primary resumes the epoch it led), so the armed round starts from a healthy
    /// pair, as the random-moment rounds do. The case without the wait (a primary that
    /// restarts and dies before its standby fetched) is
    /// `a_restarted_primary_and_a_promoted_standby_never_share_an_epoch`.
    fn wait_standby_epoch(&mut self, round: usize) -> anyhow::Result<()> {
        let (p, s) = (&self.nodes[self.primary], &self.nodes[1 - self.primary]);
        let epoch = |n: &Node| n.status().and_then(|v| v["replication"]["epoch"].as_u64());
        let until = Instant::now() + CATCH_UP_LIMIT;
        loop {
            let (want, have) = (epoch(p), epoch(s));
            if matches!((want, have), (Some(w), Some(h)) if h >= w) {
                return Ok(());
            }
            if Instant::now() > until {
                anyhow::bail!(
                    "round {round}: {} (epoch {have:?}) did not follow {} (epoch {want:?}) within {CATCH_UP_LIMIT:?}",
                    s.name,
                    p.name
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Drops batch `next_batch` into node `n`'s spool.
    fn send_next(&mut self, n: usize) -> anyhow::Result<()> {
        let i = self.next_batch;
        self.next_batch += 1;
        self.b.send(&self.nodes[n].spool(), i)?;
        self.node_of.push(n);
        Ok(())
    }

    /// Streams the round's batches into the primary. Unarmed, it dies a random delay after a
    /// random batch, while the stream goes on (the files sent after it wait in the dead node's
    /// spool); armed, it dies at its crash point (SIGKILL if not reached). Says how it died.
    fn stream(&mut self, crash: Option<CrashTarget>) -> anyhow::Result<String> {
        let p = self.primary;
        let kill_at = self.b.rng.below(self.per_round as u64) as usize;
        let delay = Duration::from_millis(self.b.rng.below(100));
        let mut deadline = None;
        let mut first = 0;
        for j in 0..self.per_round {
            if self.next_batch >= self.opts.batches {
                break;
            }
            self.send_next(p)?;
            if crash.is_none() && j == kill_at {
                deadline = Some(Instant::now() + delay);
                first = self.next_batch - 1;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        if let Some(d) = deadline {
            std::thread::sleep(d.saturating_duration_since(Instant::now()));
            self.nodes[p].kill();
            return Ok(format!(
                "SIGKILL at a random moment ({} ms after batch {first}, {} batches sent after it)",
                delay.as_millis(),
                self.next_batch - 1 - first
            ));
        }
        let Some(t) = crash else {
            return Ok("SIGKILL after the round's batches".into());
        };
        let died = self.nodes[p]
            .child
            .as_mut()
            .is_some_and(|c| c.died_within(CRASH_WAIT));
        Ok(if died {
            format!("died at crash point {t}")
        } else {
            format!("crash point {t} not reached in {CRASH_WAIT:?}; SIGKILL")
        })
    }

    /// Reads the answers the killed node `p` published for the files sent to it from `from`
    /// on; how many.
    fn collect(&mut self, p: usize, from: usize) -> usize {
        let mut n = 0;
        for k in from..self.b.sent.len() {
            let name = &self.b.sent[k].name;
            if self.node_of[k] != p || self.answers.contains_key(name) {
                continue;
            }
            if let Some(r) = self.nodes[p].result(name) {
                self.answers.insert(name.clone(), r);
                n += 1;
            }
        }
        self.counts.at_kill += n;
        n
    }

    /// The client's side of a failover: every file from `from` on without an answer is taken
    /// out of the dead node's `new/` (if still there) and delivered to the new primary under
    /// the same name. Returns their indices.
    fn take_back(&mut self, p: usize, s: usize, from: usize) -> anyhow::Result<Vec<usize>> {
        let mut pending = Vec::new();
        for k in from..self.b.sent.len() {
            let sent = &self.b.sent[k];
            if self.answers.contains_key(&sent.name) {
                continue;
            }
            let stale = self.nodes[p].spool().new.join(&sent.name);
            match std::fs::remove_file(&stale) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", stale.display())),
            }
            let body = self
                .b
                .body_of(&sent.key)
                .with_context(|| format!("no body for {}", sent.key))?;
            crate::spool::deliver(&self.nodes[s].spool(), &sent.name, body)?;
            self.node_of[k] = s;
            pending.push(k);
        }
        self.counts.resent += pending.len();
        Ok(pending)
    }

    /// After a round: the pending files answered by the primary, every acknowledged batch's
    /// retry answered as before, the standby caught up with equal shards.
    fn check(&mut self, round: usize, pending: &[usize]) -> anyhow::Result<()> {
        let p = self.primary;
        let names: Vec<String> = pending
            .iter()
            .map(|&k| self.b.sent[k].name.clone())
            .collect();
        let got = self.wait_answers(p, &names);
        for (name, r) in got {
            match r {
                Some(r) => {
                    self.answers.insert(name, r);
                }
                None => self.violations.push(format!(
                    "round {round}: {name}: no answer from {} within the limit",
                    self.nodes[p].name
                )),
            }
        }
        self.retry_acknowledged(round)?;
        self.check_replicas(round);
        self.b.live = verdict::live_creates(&self.answers)
            .into_iter()
            .filter_map(|(id, (shard, _))| SHARDS.iter().find(|s| **s == shard).map(|s| (id, *s)))
            .collect();
        for n in &mut self.nodes {
            if n.died() {
                anyhow::bail!(
                    "round {round}: {} exited; logs in {}",
                    n.name,
                    n.data.display()
                );
            }
        }
        Ok(())
    }

    /// Waits (bounded) for node `n` to answer each file; the answers, `None` for the missing.
    fn wait_answers(&self, n: usize, names: &[String]) -> BTreeMap<String, Option<BatchResult>> {
        let until = Instant::now() + ANSWER_LIMIT + ANSWER_PER_FILE * names.len() as u32;
        let mut got: BTreeMap<String, Option<BatchResult>> =
            names.iter().map(|x| (x.clone(), None)).collect();
        loop {
            for (name, r) in got.iter_mut().filter(|(_, r)| r.is_none()) {
                *r = self.nodes[n].result(name);
            }
            if got.values().all(Option::is_some) || Instant::now() > until {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends every acknowledged batch again to the primary (same key, same content, file
    /// `rRR-NAME`) and compares the answers with the originals.
    fn retry_acknowledged(&mut self, round: usize) -> anyhow::Result<()> {
        let p = self.primary;
        let keys: BTreeMap<&str, &str> = self
            .b
            .sent
            .iter()
            .map(|s| (s.name.as_str(), s.key.as_str()))
            .collect();
        let mut retries = Vec::new();
        for name in self.answers.keys() {
            let key = keys.get(name.as_str()).copied().unwrap_or_default();
            let body = self
                .b
                .body_of(key)
                .with_context(|| format!("no body for {name}"))?;
            let retry = format!("r{round:02}-{name}");
            crate::spool::deliver(&self.nodes[p].spool(), &retry, body)?;
            retries.push((name.clone(), retry));
        }
        let names: Vec<String> = retries.iter().map(|(_, r)| r.clone()).collect();
        let mut got = self.wait_answers(p, &names);
        let retried: BTreeMap<String, Option<BatchResult>> = retries
            .into_iter()
            .map(|(name, retry)| (name, got.remove(&retry).flatten()))
            .collect();
        let lost = verdict::lost_acknowledged(&self.answers, &retried);
        self.counts.retried += retried.len();
        self.counts.lost += lost.len();
        let who = self.nodes[p].name;
        self.violations.extend(
            lost.into_iter()
                .map(|l| format!("round {round}: LOST on {who}: {l}")),
        );
        Ok(())
    }

    /// Waits for the standby to hold what the primary holds durably, then for both nodes'
    /// shards to scan the same; checks the primary holds every committed create once.
    fn check_replicas(&mut self, round: usize) {
        let (p, s) = (self.primary, 1 - self.primary);
        let until = Instant::now() + CATCH_UP_LIMIT;
        loop {
            let want = self.nodes[p].durable_lsn();
            let have = self.nodes[s].last_lsn();
            if matches!((want, have), (Some(w), Some(h)) if h >= w) {
                break;
            }
            if Instant::now() > until {
                self.violations.push(format!(
                    "round {round}: {} (last lsn {have:?}) did not reach lsn {want:?} in {CATCH_UP_LIMIT:?}",
                    self.nodes[s].name
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let diff = self.scans_converge(until);
        if !diff.is_empty() {
            self.counts.divergences += 1;
            let names = (self.nodes[p].name, self.nodes[s].name);
            self.violations.push(format!(
                "round {round}: shards differ between {} and {}: {diff:?}",
                names.0, names.1
            ));
        }
        self.check_contents(round, p);
    }

    /// Polls both nodes' shards until they scan the same or `until`; the differences left.
    fn scans_converge(&self, until: Instant) -> Vec<String> {
        loop {
            let diff = match (self.nodes[0].records(), self.nodes[1].records()) {
                (Ok(a), Ok(b)) => verdict::shard_divergences(&a, &b, 5),
                (Err(e), _) | (_, Err(e)) => vec![format!("reading the shards: {e:#}")],
            };
            if diff.is_empty() || Instant::now() > until {
                return diff;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every committed create (not deleted since) on node `n`, none twice.
    fn check_contents(&mut self, round: usize, n: usize) {
        let name = self.nodes[n].name;
        match self.nodes[n].records() {
            Ok(records) => {
                let live = verdict::live_creates(&self.answers);
                let mut found = verdict::missing_creates(name, &live, &records);
                found.extend(verdict::doubled_creates(name, &records));
                self.violations
                    .extend(found.into_iter().map(|v| format!("round {round}: {v}")));
            }
            Err(e) => self
                .violations
                .push(format!("round {round}: {name}: reading the shards: {e:#}")),
        }
    }

    /// Waits until the primary is quiet (`Node::quiet_end`, the same end twice) and the
    /// standby holds that end: then both logs end at the same lsn whichever stops first.
    /// `false` (a violation recorded) if that does not come within `CATCH_UP_LIMIT`.
    fn settle(&mut self) -> bool {
        let (p, s) = (self.primary, 1 - self.primary);
        let until = Instant::now() + CATCH_UP_LIMIT;
        let mut last = None;
        while Instant::now() < until {
            let end = self.nodes[p].quiet_end();
            if end.is_some() && end == last && self.nodes[s].last_lsn() >= end {
                return true;
            }
            last = end;
            std::thread::sleep(Duration::from_millis(20));
        }
        self.violations.push(format!(
            "the standby did not reach the quiet primary's end ({last:?}) in {CATCH_UP_LIMIT:?}"
        ));
        false
    }

    /// Both nodes stopped gracefully once settled; their WAL records equal at every lsn both
    /// hold and ending at the same lsn, their shards equal, `verify` clean on both, every
    /// answer as expected.
    fn finish(&mut self) -> anyhow::Result<()> {
        let settled = self.settle();
        let s = 1 - self.primary;
        for n in [s, self.primary] {
            if let Err(e) = self.nodes[n].stop() {
                self.violations.push(format!("graceful stop: {e:#}"));
                self.nodes[n].kill();
            }
        }
        let wa = self.nodes[0].wal(&self.bin)?;
        let wb = self.nodes[1].wal(&self.bin)?;
        let (common, diff) = verdict::wal_divergences(&wa, &wb);
        self.counts.common_lsns = common;
        let ends = (wa.keys().next_back(), wb.keys().next_back());
        if settled && ends.0 != ends.1 {
            self.counts.divergences += 1;
            self.violations
                .push(format!("stopped, the logs end at different lsns: {ends:?}"));
        }
        self.counts.divergences += diff.len();
        self.violations
            .extend(diff.into_iter().map(|d| format!("wal: {d}")));
        let (ra, rb) = (self.nodes[0].records()?, self.nodes[1].records()?);
        let diff = verdict::shard_divergences(&ra, &rb, 5);
        if !diff.is_empty() {
            self.counts.divergences += 1;
            self.violations
                .push(format!("stopped, shards differ: {diff:?}"));
        }
        for n in &self.nodes {
            let r = crate::ops::verify::verify(RealStorage::shared(), &n.data);
            self.violations.extend(
                r.violations
                    .iter()
                    .map(|v| format!("verify {}: {v}", n.name)),
            );
        }
        let unexpected = verdict::unexpected_answers(&self.b.sent, &self.answers);
        self.violations.extend(unexpected);
        self.counts.cut = self.nodes.iter().map(Node::cut_records).sum();
        Ok(())
    }

    fn report(&self, rounds: usize) {
        let c = &self.counts;
        let starts: usize = self.nodes.iter().map(|n| n.starts).sum();
        let mut text = format!(
            "roost drill --replicated: seed {}, {} batches ({} files), {} rounds, failovers: {}, {} process starts\n",
            self.opts.seed,
            self.b.bodies.len(),
            self.b.sent.len(),
            rounds,
            self.opts.kills,
            starts
        );
        for l in &self.log {
            text += &format!("  {l}\n");
        }
        let ms: Vec<u128> = self.recoveries.iter().map(Duration::as_millis).collect();
        text += &format!("  recovery times (spawn to serving, ms): {ms:?}\n");
        text += &format!(
            "  acknowledged: {} of {} files ({} read from a killed primary, {} resent to the new one)\n",
            self.answers.len(),
            self.b.sent.len(),
            c.at_kill,
            c.resent
        );
        text += &format!(
            "  retried: {} (acknowledged batches sent again to a new primary); lost: {}\n",
            c.retried, c.lost
        );
        text += &format!(
            "  divergences: {} (shard scans each round and at the end; WAL records at the {} lsns both nodes hold)\n",
            c.divergences, c.common_lsns
        );
        text += &format!(
            "  cut records: {} (old primaries' records the new primary never had)\n",
            c.cut
        );
        if self.violations.is_empty() {
            text += "  violations: none\n";
        } else {
            text += &format!("  violations: {}\n", self.violations.len());
            for v in &self.violations {
                text += &format!("    {v}\n");
            }
        }
        let _ = std::io::stdout().write_all(text.as_bytes());
    }
}

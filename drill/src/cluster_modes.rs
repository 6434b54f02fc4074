//! The cluster drill's other modes (`cluster_strikes.rs`): `--rolling` (each node stopped
//! by SIGTERM and started again in turn), `--switchovers` (`roost cluster switchover` to
//! the next node each round), `--quiet-secs` (load without strikes; any leader change is a
//! violation), and the in-sync wait they share.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::cluster_strikes::*;
use super::node::Node;

impl Cluster<'_> {
    /// One round of the rolling restart: half the files and the streams, a graceful stop of
    /// node `round % 3` (leader or not) with the probe started at its SIGTERM, the other
    /// half, the node started again, the probe's end, every answer, and the node back in
    /// the leader's in-sync set before the next stop.
    pub(super) fn rolling_round(&mut self, round: usize) -> anyhow::Result<()> {
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
    pub(super) fn switchover_round(&mut self, round: usize) -> anyhow::Result<()> {
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
    pub(super) fn switch_over(
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
    pub(super) fn stopped(
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
    pub(super) fn wait_in_sync(
        &mut self,
        round: usize,
        n: usize,
        t0: Instant,
    ) -> anyhow::Result<()> {
        if self.until_in_sync()? {
            self.log.push(format!(
                "round {round}: {} in the in-sync set again {} ms after the strike",
                NAMES[n],
                t0.elapsed().as_millis()
            ));
        } else {
            self.violations.push(format!(
                "round {round}: {} not in the leader's in-sync set within {} s of its start",
                NAMES[n],
                ELECTION_LIMIT.as_secs()
            ));
        }
        Ok(())
    }

    /// At the start, before the first strike: the standbys join the in-sync set as they
    /// catch up. Not in time is a violation.
    pub(super) fn wait_in_sync_at_start(&mut self, t0: Instant) -> anyhow::Result<()> {
        if self.until_in_sync()? {
            self.log.push(format!(
                "start: every node in the in-sync set after {} ms",
                t0.elapsed().as_millis()
            ));
        } else {
            self.violations.push(format!(
                "start: the in-sync set did not name every node within {} s",
                ELECTION_LIMIT.as_secs()
            ));
        }
        Ok(())
    }

    /// Whether the leader's in-sync set names every node within `ELECTION_LIMIT`.
    fn until_in_sync(&mut self) -> anyhow::Result<bool> {
        let until = Instant::now() + ELECTION_LIMIT;
        while Instant::now() < until {
            let l = self.leader(None, ELECTION_LIMIT)?;
            let isr = self.nodes[l].status().map(|s| s["cluster"]["isr"].clone());
            if isr.is_some_and(|v| names_every_node(&v)) {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(false)
    }

    /// The quiet run (`--quiet-secs`): rounds of load without a fault until `secs` have
    /// passed, each waiting for every answer; then every acknowledged batch sent again, and
    /// the nodes' cluster counters read (they count since each process started: before the
    /// final stop ends them).
    pub(super) fn quiet(&mut self, secs: Duration) -> anyhow::Result<()> {
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
    pub(super) fn cluster_counters(&self) -> Vec<NodeCounters> {
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
    pub(super) fn judge_quiet(&mut self) {
        let Some(counters) = self.quiet_counters.take() else {
            return;
        };
        let epochs = self.seen.lock().map(|s| s.leaders.len()).unwrap_or(0);
        let (line, violations) = quiet_verdict(epochs, &counters);
        self.quiet_line = Some(line);
        self.violations.extend(violations);
    }
}

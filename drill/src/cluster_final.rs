//! The cluster drill's end (`cluster_strikes.rs`): the last round, every acknowledged batch
//! sent again for its original answer, the graceful stop, the nodes' logs and shards
//! compared, and the report.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use roost_storage::RealStorage;

use super::cluster_strikes::*;
use super::node::Node;
use super::probe;
use super::verdict;
use crate::batch::BatchResult;
use serde_json::Value;

impl Cluster<'_> {
    /// The rest of the batches without a strike, then every acknowledged batch sent again
    /// (files into a random node's spool): each must get its original answer.
    pub(super) fn last_round(&mut self) -> anyhow::Result<()> {
        let from = self.b.sent.len();
        let rest = self.opts.batches.saturating_sub(self.next);
        self.send_files(rest)?;
        self.stream_all();
        self.wait_answers(from)?;
        self.retry_acknowledged()
    }

    pub(super) fn retry_acknowledged(&mut self) -> anyhow::Result<()> {
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
    pub(super) fn body_of<'b>(
        &'b self,
        files: &HashMap<&str, &'b [u8]>,
        name: &str,
    ) -> Option<&'b [u8]> {
        match name.strip_prefix("stream/") {
            Some(key) => self.stream_bodies.get(key).map(Vec::as_slice),
            None => files.get(name).copied(),
        }
    }

    /// Every file sent, by name, to its content (a retry's is its original's): one index,
    /// as a search per answer would be quadratic in a long quiet run's tens of thousands.
    pub(super) fn file_bodies(&self) -> HashMap<&str, &[u8]> {
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
    pub(super) fn finish(&mut self) -> anyhow::Result<()> {
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
    pub(super) fn settle(&mut self) {
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
    pub(super) fn compare_logs(&mut self) -> anyhow::Result<()> {
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

    pub(super) fn report(&self) {
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

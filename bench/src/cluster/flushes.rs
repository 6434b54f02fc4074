//! Where a cluster cell's disk work went (issues 42 and 47): each node's WAL syncs, shard
//! flushes and durability rounds, and the device's completed flush requests
//! (`/proc/diskstats`, the device holding the benchmark's directory), per batch the leader
//! committed over the cell; and the leader's wait for its standbys over the cell, by
//! bucket. All three nodes share this machine's one device, so a standby's sync waits
//! behind the other nodes' flushes; these figures say how many there were.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::Value;

/// One node's counters from `roost status --json`.
#[derive(Clone, Copy, Default)]
struct NodeCounts {
    committed: u64,
    wal_syncs: u64,
    shard_flushes: u64,
    tail_rounds: u64,
}

impl NodeCounts {
    fn of(status: &Value) -> NodeCounts {
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        NodeCounts {
            committed: n(&status["committed"]),
            wal_syncs: n(&status["wal_syncs"]),
            shard_flushes: n(&status["shard_flushes"]),
            tail_rounds: n(&status["tail_rounds"]["rounds"]),
        }
    }
}

/// The counters of every node (in the cluster's order) and of the device at one moment.
pub struct Snapshot {
    nodes: Vec<NodeCounts>,
    /// Flush requests the device completed; `None` where `/proc/diskstats` does not say.
    device: Option<u64>,
    /// The leader's wait for its standbys (`roost_phase_seconds{phase="replicate"}`).
    replicate: Waits,
}

/// A histogram's cumulative buckets (upper bound in seconds, count), sum and count.
#[derive(Default)]
struct Waits {
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

impl Waits {
    /// The `replicate` phase from the leader's metrics text.
    fn of(metrics: &str) -> Waits {
        let mut w = Waits::default();
        for line in metrics
            .lines()
            .filter(|l| l.contains("phase=\"replicate\""))
        {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let value: f64 = value.parse().unwrap_or(0.0);
            if name.starts_with("roost_phase_seconds_bucket") {
                let le = name.split("le=\"").nth(1).and_then(|r| r.split('"').next());
                let le = le
                    .and_then(|l| l.parse::<f64>().ok())
                    .unwrap_or(f64::INFINITY);
                w.buckets.push((le, value as u64));
            } else if name.starts_with("roost_phase_seconds_sum") {
                w.sum = value;
            } else if name.starts_with("roost_phase_seconds_count") {
                w.count = value as u64;
            }
        }
        w
    }

    /// Between `self` and `later`: the mean wait and the share of waits in each bucket.
    fn between(&self, later: &Waits) -> String {
        let n = later.count.saturating_sub(self.count);
        if n == 0 {
            return "no waits for standbys".into();
        }
        let mean_ms = (later.sum - self.sum) * 1e3 / n as f64;
        let mut below = 0;
        let mut shares = Vec::new();
        for (i, (le, c)) in later.buckets.iter().enumerate() {
            let before = self.buckets.get(i).map_or(0, |b| b.1);
            let upto = c.saturating_sub(before);
            let share = upto.saturating_sub(below) as f64 / n as f64;
            below = upto;
            if share >= 0.005 && le.is_finite() {
                shares.push(format!("<={}ms {:.0}%", le * 1e3, share * 100.0));
            } else if share >= 0.005 {
                shares.push(format!("beyond {:.0}%", share * 100.0));
            }
        }
        format!(
            "the leader's wait for standbys: mean {mean_ms:.2} ms over {n}, {}",
            shares.join(" ")
        )
    }
}

impl Snapshot {
    /// `statuses` in the cluster's order (a node that did not answer counts zeros); `dir`
    /// names the device.
    pub fn take(statuses: &[Option<Value>], leader_metrics: &str, dir: &Path) -> Snapshot {
        Snapshot {
            replicate: Waits::of(leader_metrics),
            nodes: statuses
                .iter()
                .map(|s| s.as_ref().map(NodeCounts::of).unwrap_or_default())
                .collect(),
            device: device_flushes(dir),
        }
    }

    /// What happened between `self` and `later`, per batch the node `leader` committed.
    pub fn per_batch(&self, later: &Snapshot, leader: usize, names: &[&str]) -> String {
        let d = |f: fn(&NodeCounts) -> u64, i: usize| {
            f(&later.nodes[i]).saturating_sub(f(&self.nodes[i])) as f64
        };
        let batches = d(|c| c.committed, leader).max(1.0);
        let device = match (self.device, later.device) {
            (Some(a), Some(b)) => format!("{:.2}", b.saturating_sub(a) as f64 / batches),
            _ => "?".into(),
        };
        let node = |i: usize| {
            format!(
                "{} wal {:.2} shard {:.2} tail {:.2}",
                names.get(i).copied().unwrap_or("?"),
                d(|c| c.wal_syncs, i) / batches,
                d(|c| c.shard_flushes, i) / batches,
                d(|c| c.tail_rounds, i) / batches,
            )
        };
        let nodes: Vec<String> = (0..self.nodes.len().min(later.nodes.len()))
            .map(node)
            .collect();
        format!(
            "{batches:.0} batches; per batch: device flushes {device}; {}; {}",
            nodes.join("; "),
            self.replicate.between(&later.replicate)
        )
    }
}

/// The device's completed flush requests (field 16 after the name in `/proc/diskstats`,
/// Linux 5.5 and later) for the device that holds `dir`.
fn device_flushes(dir: &Path) -> Option<u64> {
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = whole_disk(rustix::fs::major(dev).into(), rustix::fs::minor(dev).into());
    let text = std::fs::read_to_string("/proc/diskstats").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let ours =
            f.first()?.parse::<u64>().ok()? == major && f.get(1)?.parse::<u64>().ok()? == minor;
        if ours {
            f.get(2 + 16)?.parse().ok()
        } else {
            None
        }
    })
}

/// The disk a partition `major:minor` is on (the kernel counts flushes on the whole disk
/// only); itself when it is not a partition or `/sys` does not say.
fn whole_disk(major: u64, minor: u64) -> (u64, u64) {
    let sys = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.join("partition").exists() {
        return (major, minor);
    }
    let parent = std::fs::read_to_string(sys.join("../dev")).unwrap_or_default();
    match parent.trim().split_once(':') {
        Some((a, b)) => match (a.parse(), b.parse()) {
            (Ok(a), Ok(b)) => (a, b),
            _ => (major, minor),
        },
        None => (major, minor),
    }
}

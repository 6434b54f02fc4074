//! What every drill shares: its options, the shards it writes, the drilled daemon's
//! configuration and time limit, the crash points it aims at, and the readers of a result
//! file and of the shards' records.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use roost_shards::{Shard, ShardOptions};
use serde_json::Value;

use crate::batch::BatchResult;
use crate::layout::SHARDS_DIR;
use crate::pipeline::crash::{CrashPoint, CrashTarget, Step};
use crate::spool::SpoolPaths;

pub struct DrillOptions {
    pub data_dir: PathBuf,
    pub batches: usize,
    pub kills: usize,
    pub seed: u64,
}

pub const SHARDS: &[&str] = &["d0", "d1", "d2", "d3"];
/// Where the odd rounds die (the N-th time the point is reached, N in 1..=4).
pub const CRASH_POINTS: [CrashPoint; 15] = [
    Step::AfterPlan.at(),
    Step::AfterClaimAppend.at(),
    Step::AfterResultsPrepared.at(),
    Step::AfterClaimSync.at(),
    Step::AfterCommit.nth(0),
    Step::AfterCommit.nth(1),
    Step::AfterAudit.nth(0),
    Step::AfterResult.at(),
    Step::AfterFlush.nth(0),
    Step::AfterAuditSync.at(),
    Step::AfterDone.at(),
    Step::AfterKeysSync.at(),
    Step::AfterKeyIndex.at(),
    Step::AfterCheckpoint.at(),
    Step::AfterWalRetired.at(),
];

/// The drilled daemon's configuration: small WAL segments and checkpoints every 64 KiB of WAL
/// or 200 ms, so kills also land in checkpoints and WAL retirement.
pub const DRILL_CONFIG: &str = "wal_segment_bytes = 1048576
spool_file_bytes_max = 65536
batch_ops_max = 64
checkpoint_wal_bytes = 65536
checkpoint_interval_ms = 200
";
/// How long a daemon may take to recover, and the spool to drain, before the drill fails.
pub const READY_LIMIT: Duration = Duration::from_secs(120);

pub fn read_result(sp: &SpoolPaths, name: &str) -> Option<BatchResult> {
    std::fs::read(sp.out.join(name))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// A crash point from [`CRASH_POINTS`] and the N-th time to die there.
pub fn pick_crash(rng: &mut roost_storage::SplitMix) -> CrashTarget {
    let point = CRASH_POINTS[rng.below(CRASH_POINTS.len() as u64) as usize];
    let nth = 1 + rng.below(4);
    // A round sees few checkpoints: die at its first.
    let checkpoint = matches!(
        point.step,
        Step::AfterKeysSync | Step::AfterKeyIndex | Step::AfterCheckpoint | Step::AfterWalRetired
    );
    CrashTarget {
        point,
        nth: if checkpoint { 1 } else { nth },
    }
}

/// Every record of every drill shard by id, and how many records hold each content (every
/// create's record is unique, so a count above one is a create applied twice).
pub type ShardRecords = (HashMap<u64, (&'static str, Value)>, HashMap<String, usize>);

pub fn read_shards(data: &Path) -> anyhow::Result<ShardRecords> {
    let mut records = HashMap::new();
    let mut tags: HashMap<String, usize> = HashMap::new();
    for s in SHARDS {
        let sdir = data.join(SHARDS_DIR).join(s);
        if !sdir.is_dir() {
            continue;
        }
        let opts = ShardOptions {
            read_only: true,
            ..ShardOptions::default()
        };
        for (id, rec) in Shard::open(&sdir, opts)?.scan()? {
            let v: Value = serde_json::from_slice(&rec)?;
            *tags.entry(v.to_string()).or_default() += 1;
            records.insert(id, (*s, v));
        }
    }
    Ok((records, tags))
}

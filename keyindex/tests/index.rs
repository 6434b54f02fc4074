//! The key index against a plain map (property test), across reopen, and after a crash at
//! every sync of its writes (process crash, power loss dropped and torn).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use roost_keyindex::{Entry, IndexOptions, KeyIndex, RunMeta};
use roost_storage::{CrashMode, SimFaults, SimStorage, Storage};

const DIR: &str = "/data/keyindex";

fn opts(filter_bytes_max: u64, run_entries_max: u64) -> IndexOptions {
    IndexOptions {
        filter_bytes_max,
        run_entries_max,
    }
}

/// The model: every key ever added with its (table lsn, stamp), in table order.
#[derive(Default)]
struct Model {
    by_key: HashMap<String, Vec<(u64, u64)>>,
    next_lsn: u64,
}

impl Model {
    /// One checkpoint's run: `keys` at stamp `at`, table lsns from the next one on.
    fn run(&mut self, idx: &KeyIndex, keys: &[String], at: u64) -> (Vec<Entry>, RunMeta) {
        let first = self.next_lsn + 1;
        let mut entries = Vec::new();
        for k in keys {
            self.next_lsn += 1;
            let lsn = self.next_lsn;
            self.by_key.entry(k.clone()).or_default().push((lsn, at));
            entries.push(Entry {
                hash: idx.hash(k.as_bytes()),
                table_lsn: lsn,
                offset: lsn * 100,
            });
        }
        let meta = RunMeta {
            first_table_lsn: first,
            last_table_lsn: self.next_lsn,
            min_at_ms: at,
            max_at_ms: at,
            max_batch_lsn: self.next_lsn * 2,
        };
        (entries, meta)
    }

    /// Every key's live lsns are among its candidates, newest first, and no candidate
    /// belongs to another key.
    fn check(&self, idx: &KeyIndex, cutoff: u64) {
        for (k, recs) in &self.by_key {
            let got: Vec<u64> = idx
                .candidates(k.as_bytes())
                .expect("lookup")
                .iter()
                .map(|c| c.0)
                .collect();
            let mut sorted = got.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!(got, sorted, "key {k}: candidates not newest first");
            for (lsn, at) in recs {
                if *at >= cutoff {
                    assert!(
                        got.contains(lsn),
                        "key {k}: live lsn {lsn} not found: {got:?}"
                    );
                }
            }
            for lsn in &got {
                assert!(
                    recs.iter().any(|r| r.0 == *lsn),
                    "key {k}: lsn {lsn} is another key's"
                );
                assert_eq!(
                    idx.candidates(k.as_bytes()).expect("lookup").len(),
                    got.len()
                );
            }
        }
    }
}

fn keys(round: usize, n: usize, reuse: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            if i < reuse {
                format!("key-{i}")
            } else {
                format!("key-{round}-{i}")
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn the_index_agrees_with_a_map(
        rounds in proptest::collection::vec((1usize..300, 0usize..5, 0u64..3), 1..14),
        filter_bytes in prop_oneof![Just(0u64), Just(256u64), Just(1u64 << 20)],
        run_max in prop_oneof![Just(50u64), Just(1000u64), Just(1u64 << 40)],
    ) {
        let disk = SimStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(disk.clone());
        let idx = KeyIndex::open(storage.clone(), Path::new(DIR), opts(filter_bytes, run_max)).unwrap();
        let mut model = Model::default();
        let (mut at, mut cutoff) = (1000u64, 0u64);
        for (r, (n, reuse, expire_steps)) in rounds.iter().enumerate() {
            let (e, m) = model.run(&idx, &keys(r, *n, *reuse), at);
            idx.add_run(e, m).unwrap();
            at += 10;
            if *expire_steps > 0 {
                cutoff = cutoff.max(at - 10 * expire_steps - 5);
                idx.expire(cutoff).unwrap();
            }
            model.check(&idx, cutoff);
        }
        let runs = idx.runs();
        for w in runs.windows(2) {
            prop_assert!(w[0].meta().last_table_lsn < w[1].meta().first_table_lsn);
        }
        prop_assert!(idx.stats().filter_bytes <= filter_bytes);
        drop(idx);
        let again = KeyIndex::open(Arc::new(disk.crash(CrashMode::PowerDrop)), Path::new(DIR), opts(filter_bytes, run_max)).unwrap();
        model.check(&again, cutoff);
    }
}

#[test]
fn merges_keep_few_runs_and_respect_the_cap() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new());
    let idx = KeyIndex::open(storage, Path::new(DIR), opts(1 << 20, 400)).unwrap();
    let mut model = Model::default();
    for r in 0..64 {
        let (e, m) = model.run(&idx, &keys(r, 10, 0), 1000 + r as u64);
        idx.add_run(e, m).unwrap();
    }
    let runs = idx.runs();
    assert!(runs.iter().all(|r| r.count() <= 400));
    // 640 keys in capped runs of 400 at most plus a geometric tail: a handful of runs.
    assert!(runs.len() <= 8, "{} runs", runs.len());
    assert!(idx.stats().merges > 0);
    model.check(&idx, 0);
}

#[test]
fn a_crash_at_every_sync_keeps_every_run_that_was_added() {
    let plan: Vec<usize> = vec![30, 30, 60, 5, 120, 7, 7, 300];
    // Syncs of the whole plan without a crash, to walk every freeze point.
    let total = {
        let disk = SimStorage::new();
        run_plan(&disk, &plan, &mut Model::default(), None);
        disk.sync_count()
    };
    assert!(total > 20, "only {total} syncs");
    for k in 0..=total {
        for mode in [
            CrashMode::Process,
            CrashMode::PowerDrop,
            CrashMode::PowerTear { seed: k },
        ] {
            let disk = SimStorage::new();
            disk.set_faults(SimFaults {
                freeze_after_syncs: Some(k),
                ..SimFaults::default()
            });
            let mut model = Model::default();
            let durable = run_plan(&disk, &plan, &mut model, Some(k));
            let after = disk.crash(mode);
            let idx = KeyIndex::open(Arc::new(after), Path::new(DIR), opts(1 << 16, 200))
                .unwrap_or_else(|e| panic!("open after crash at sync {k} ({mode:?}): {e}"));
            // Every key of a run whose add returned before the power went is found.
            let keep: HashMap<String, Vec<(u64, u64)>> = model
                .by_key
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.iter().filter(|r| r.0 <= durable).copied().collect(),
                    )
                })
                .collect();
            let m = Model {
                by_key: keep,
                next_lsn: 0,
            };
            for (key, recs) in &m.by_key {
                let got: Vec<u64> = idx
                    .candidates(key.as_bytes())
                    .unwrap()
                    .iter()
                    .map(|c| c.0)
                    .collect();
                for (lsn, _) in recs {
                    assert!(
                        got.contains(lsn),
                        "sync {k} {mode:?}: key {key} lost lsn {lsn}"
                    );
                }
            }
        }
    }
}

/// Adds one run per plan item; returns the last table lsn whose run was durable (all its
/// syncs done before the freeze).
fn run_plan(disk: &SimStorage, plan: &[usize], model: &mut Model, freeze: Option<u64>) -> u64 {
    let storage: Arc<dyn Storage> = Arc::new(disk.clone());
    let limit = {
        let st = disk.clone();
        move || st.sync_count()
    };
    let idx = match KeyIndex::open(storage, Path::new(DIR), opts(1 << 16, 200)) {
        Ok(i) => i,
        Err(_) => return 0,
    };
    let mut durable = 0;
    for (r, n) in plan.iter().enumerate() {
        let (e, m) = model.run(&idx, &keys(r, *n, 2), 1000 + r as u64);
        let last = m.last_table_lsn;
        idx.add_run(e, m).unwrap();
        if freeze.is_none_or(|f| limit() <= f) {
            durable = last;
        }
    }
    durable
}

/// Goal: expiry removes only the oldest runs that left the window, stopping at the first
/// run still inside it, even if stamps went back later (a clock stepped back across a
/// crash). Method: runs stamped 5, 100, 3; expire at 50.
#[test]
fn expiry_stops_at_the_first_run_inside_the_window() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new());
    let idx = KeyIndex::open(storage, Path::new(DIR), opts(1 << 20, 1)).unwrap();
    let mut model = Model::default();
    for (r, at) in [5u64, 100, 3].into_iter().enumerate() {
        let (e, m) = model.run(&idx, &keys(r, 3, 0), at);
        idx.add_run(e, m).unwrap();
    }
    assert_eq!(idx.runs().len(), 3, "run_entries_max = 1: no merges");
    assert_eq!(idx.expire(50).unwrap(), (1, 3));
    let left: Vec<u64> = idx.runs().iter().map(|r| r.meta().max_at_ms).collect();
    assert_eq!(left, vec![100, 3]);
}

/// Goal: a run that overlaps another without being inside it (not the trace of a merge) is
/// corruption at open, never silently removed. Method: a run file copied under a name that
/// straddles the next run's range.
#[test]
fn a_run_overlapping_another_is_corruption() {
    let disk = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(disk.clone());
    let idx = KeyIndex::open(storage.clone(), Path::new(DIR), opts(1 << 20, 1)).unwrap();
    let mut model = Model::default();
    for r in 0..2 {
        let (e, m) = model.run(&idx, &keys(r, 3, 0), 10);
        idx.add_run(e, m).unwrap();
    }
    let first = idx.runs()[0].path.clone();
    drop(idx);
    let bytes = disk.file_bytes(&first).unwrap();
    disk.put_file_bytes(
        &Path::new(DIR).join(format!("{:020}-{:020}.run", 2, 5)),
        bytes,
    );
    let err = KeyIndex::open(storage, Path::new(DIR), opts(1 << 20, 1)).unwrap_err();
    assert!(err.is_corruption(), "{err}");
}

/// Goal (found by the `keyindex_run` fuzz target, issue 45): a run whose header checksum
/// holds but whose counts are forged is corruption at open, named, never an overflow, an
/// allocation sized by the wrapped length, or lookups that spin. Method: a real run's header
/// rewritten with an entry count whose file length overflows, then with 2^32-1 filter
/// probes, its CRC recomputed each time.
#[test]
fn a_run_header_with_forged_counts_is_corruption() {
    let disk = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(disk.clone());
    let idx = KeyIndex::open(storage.clone(), Path::new(DIR), opts(1 << 20, 1)).unwrap();
    let mut model = Model::default();
    let (e, m) = model.run(&idx, &keys(0, 3, 0), 10);
    idx.add_run(e, m).unwrap();
    let path = idx.runs()[0].path.clone();
    drop(idx);
    let good = disk.file_bytes(&path).unwrap();
    let forged = |at: usize, field: &[u8]| {
        let mut b = good.clone();
        b[at..at + field.len()].copy_from_slice(field);
        let crc = crc32fast::hash(&b[..92]);
        b[92..96].copy_from_slice(&crc.to_le_bytes());
        b
    };
    for (what, bytes, reason) in [
        (
            "count",
            forged(16, &(1u64 << 62).to_le_bytes()),
            "overflow a file length",
        ),
        (
            "probes",
            forged(12, &u32::MAX.to_le_bytes()),
            "filter probes 4294967295",
        ),
    ] {
        disk.put_file_bytes(&path, bytes);
        let err = KeyIndex::open(storage.clone(), Path::new(DIR), opts(1 << 20, 1)).unwrap_err();
        assert!(err.is_corruption(), "{what}: {err}");
        assert!(err.to_string().contains(reason), "{what}: {err}");
    }
}
